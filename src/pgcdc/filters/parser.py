"""Parser for SQL value expressions (PostgreSQL's ``a_expr``), producing ``pgcdc.filters.ast``.

Operator precedence and associativity are those of src/backend/parser/gram.y, from loosest to
tightest: OR; AND; NOT; IS, ISNULL, NOTNULL; comparison (< > = <= >= <>, non-associative);
BETWEEN, IN, LIKE, ILIKE, SIMILAR; ESCAPE; other operators (||, ~~, ...); + -; * / %; ^;
AT; COLLATE; unary minus; subscripts; ::. A unary minus directly applied to a numeric literal
makes a negative literal (gram.y's doNegate), so ``-2147483648`` is an integer like on the
server. Special syntax: CASE, CAST, COALESCE, NULLIF, GREATEST, LEAST, EXTRACT, SUBSTRING,
TRIM, POSITION, typed literals (``DATE '2024-01-01'``), ``x op ANY|ALL (ARRAY[...])``.

Anything else valid in PostgreSQL but outside what row filters can evaluate client-side is
refused with ``UnsupportedFilterError``; sub-SELECTs are parsed as opaque ``Subquery`` nodes so
the binder can refuse them with PostgreSQL's own error.
"""

from __future__ import annotations

from typing import Literal, NoReturn

from pgcdc.filters import ast
from pgcdc.filters.errors import FilterSyntaxError, InvalidFilterError, UnsupportedFilterError
from pgcdc.filters.lexer import Token, tokenize

__all__ = ["parse_expression", "parse_type_name"]

# gram.y precedence levels (higher binds tighter)
_OR, _AND, _NOT, _IS, _CMP, _LIKE, _ESCAPE, _OP, _ADD, _MUL, _EXP = range(1, 12)
_AT, _COLLATE, _UMINUS, _SUBSCRIPT, _TYPECAST = 12, 13, 14, 15, 17

_COMPARISON = frozenset({"<", ">", "=", "<=", ">=", "<>"})
_ARITH = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL, "%": _MUL, "^": _EXP}

#: Reserved and type/function-name keywords: never a bare column name.
RESERVED = frozenset(
    [
        "all",
        "analyse",
        "analyze",
        "and",
        "any",
        "array",
        "as",
        "asc",
        "asymmetric",
        "both",
        "case",
        "cast",
        "check",
        "collate",
        "column",
        "constraint",
        "create",
        "current_catalog",
        "current_date",
        "current_role",
        "current_time",
        "current_timestamp",
        "current_user",
        "default",
        "deferrable",
        "desc",
        "distinct",
        "do",
        "else",
        "end",
        "except",
        "false",
        "fetch",
        "for",
        "foreign",
        "from",
        "grant",
        "group",
        "having",
        "in",
        "initially",
        "intersect",
        "into",
        "lateral",
        "leading",
        "limit",
        "localtime",
        "localtimestamp",
        "not",
        "null",
        "offset",
        "on",
        "only",
        "or",
        "order",
        "placing",
        "primary",
        "references",
        "returning",
        "select",
        "session_user",
        "some",
        "symmetric",
        "system_user",
        "table",
        "then",
        "to",
        "trailing",
        "true",
        "union",
        "unique",
        "user",
        "using",
        "variadic",
        "when",
        "where",
        "window",
        "with",
        "authorization",
        "binary",
        "collation",
        "concurrently",
        "cross",
        "current_schema",
        "freeze",
        "full",
        "ilike",
        "inner",
        "is",
        "isnull",
        "join",
        "left",
        "like",
        "natural",
        "notnull",
        "outer",
        "overlaps",
        "right",
        "similar",
        "tablesample",
        "verbose",
    ]
)

_SQL_VALUE_FUNCTIONS = frozenset(
    [
        "current_date",
        "current_time",
        "current_timestamp",
        "localtime",
        "localtimestamp",
        "current_role",
        "current_user",
        "session_user",
        "user",
        "current_catalog",
        "current_schema",
        "system_user",
    ]
)
_UNSUPPORTED_SYNTAX = {
    "overlay": "OVERLAY(...)",
    "treat": "TREAT(...)",
    "normalize": "NORMALIZE(...)",
    "row": "row constructors",
    "grouping": "GROUPING(...)",
    "merge_action": "MERGE_ACTION()",
    "xmlconcat": "XML functions",
    "xmlelement": "XML functions",
    "xmlexists": "XML functions",
    "xmlforest": "XML functions",
    "xmlparse": "XML functions",
    "xmlpi": "XML functions",
    "xmlroot": "XML functions",
    "xmlserialize": "XML functions",
    "json_object": "SQL/JSON functions",
    "json_array": "SQL/JSON functions",
    "json_objectagg": "SQL/JSON functions",
    "json_arrayagg": "SQL/JSON functions",
    "json_query": "SQL/JSON functions",
    "json_value": "SQL/JSON functions",
    "json_exists": "SQL/JSON functions",
    "json_scalar": "SQL/JSON functions",
    "json_serialize": "SQL/JSON functions",
    "json": "SQL/JSON functions",
    "json_table": "SQL/JSON functions",
    "collation": "COLLATION FOR (...)",
}
_TYPE_KEYWORDS = frozenset(
    [
        "int",
        "integer",
        "smallint",
        "bigint",
        "real",
        "float",
        "double",
        "decimal",
        "dec",
        "numeric",
        "boolean",
        "char",
        "character",
        "nchar",
        "national",
        "varchar",
        "bit",
        "timestamp",
        "time",
        "interval",
        "json",
    ]
)


def parse_expression(text: str) -> ast.Expr:
    """The expression ``text`` (one ``a_expr``) as an unbound AST."""
    if not isinstance(text, str):
        raise TypeError(f"a row filter is SQL text (str), not {type(text).__name__}")
    try:
        parser = _Parser(text)
        expr = parser.expr(0)
        parser.expect_eof()
        return expr
    except (FilterSyntaxError, InvalidFilterError, UnsupportedFilterError) as exc:
        raise exc.with_expression(text) from None


def parse_type_name(text: str) -> ast.TypeName:
    """A type name on its own (``numeric(10,2)``, ``timestamp with time zone``)."""
    try:
        parser = _Parser(text)
        typ = parser.type_name()
        parser.expect_eof()
        return typ
    except (FilterSyntaxError, UnsupportedFilterError) as exc:
        raise exc.with_expression(text) from None


class _Parser:
    __slots__ = ("i", "text", "tokens")

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0

    # -- token helpers --------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def at_punct(self, value: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.kind == "punct" and tok.value == value

    def at_keyword(self, *words: str, ahead: int = 0) -> bool:
        return self.peek(ahead).is_keyword(*words)

    def expect_punct(self, value: str) -> Token:
        if not self.at_punct(value):
            self.error_at(self.peek())
        return self.advance()

    def expect_keyword(self, word: str) -> Token:
        if not self.at_keyword(word):
            self.error_at(self.peek())
        return self.advance()

    def expect_eof(self) -> None:
        if self.peek().kind != "eof":
            self.error_at(self.peek())

    def error_at(self, tok: Token) -> NoReturn:
        if tok.kind == "eof":
            raise FilterSyntaxError(
                "syntax error at end of input", sqlstate="42601", position=tok.pos + 1
            )
        raise FilterSyntaxError(
            f'syntax error at or near "{self.text[tok.pos : tok.end]}"',
            sqlstate="42601",
            position=tok.pos + 1,
        )

    def unsupported(self, what: str, tok: Token) -> NoReturn:
        raise UnsupportedFilterError(
            f"{what} not supported in client-side row filters",
            sqlstate="0A000",
            position=tok.pos + 1,
        )

    # -- expressions ------------------------------------------------------------------------
    def expr(self, min_prec: int) -> ast.Expr:
        left = self.prefix()
        nonassoc_level = -1
        while True:
            tok = self.peek()
            prec = self.infix_precedence()
            if prec <= min_prec:
                return left
            if prec == nonassoc_level:
                self.error_at(tok)
            left, nonassoc = self.infix(left, prec)
            nonassoc_level = prec if nonassoc else -1

    def infix_precedence(self) -> int:
        tok = self.peek()
        if tok.kind == "ident":
            word = tok.value
            if word == "or":
                return _OR
            if word == "and":
                return _AND
            if word in ("is", "isnull", "notnull"):
                return _IS
            if word == "not" and self.peek(1).is_keyword(
                "between", "in", "like", "ilike", "similar"
            ):
                return _LIKE
            if word in ("between", "in", "like", "ilike", "similar"):
                return _LIKE
            if word == "escape":
                return _ESCAPE
            if word == "operator" and self.at_punct("(", 1):
                return _OP
            if word == "at":
                return _AT
            if word == "collate":
                return _COLLATE
            return 0
        if tok.kind == "punct":
            if tok.value in _COMPARISON:
                return _CMP
            if tok.value in _ARITH:
                return _ARITH[tok.value]
            if tok.value == "::":
                return _TYPECAST
            if tok.value == "[":
                return _SUBSCRIPT
            return 0
        if tok.kind == "op":
            return _CMP if tok.value in _COMPARISON else _OP
        return 0

    def infix(self, left: ast.Expr, prec: int) -> tuple[ast.Expr, bool]:
        """Parse the operator at the cursor applied to ``left``: (node, non-associative)."""
        tok = self.advance()
        if tok.kind == "ident":
            word = tok.value
            if word in ("or", "and"):
                right = self.expr(prec)
                kind: Literal["and", "or"] = "or" if word == "or" else "and"
                if isinstance(left, ast.BoolOp) and left.kind == kind and left.pos == -1:
                    pass  # never: flattening happens below, positions are kept
                return ast.BoolOp(kind, (left, right), tok.pos), False
            if word == "isnull":
                return ast.NullTest(left, False, tok.pos), True
            if word == "notnull":
                return ast.NullTest(left, True, tok.pos), True
            if word == "is":
                return self.is_clause(left, tok), True
            if word == "not":
                nxt = self.advance()
                return self.like_level(left, nxt, negated=True, not_tok=tok), True
            if word in ("between", "in", "like", "ilike", "similar"):
                return self.like_level(left, tok, negated=False, not_tok=None), True
            if word == "escape":
                self.error_at(tok)
            if word == "operator":
                schema, op = self.qualified_operator()
                return self.binary_operator(left, op, tok, prec, schema), False
            if word == "at":
                self.unsupported("AT TIME ZONE / AT LOCAL is", tok)
            if word == "collate":
                return ast.Collate(left, self.any_name(), tok.pos), False
        if tok.kind == "punct" and tok.value == "::":
            return ast.TypeCast(left, self.type_name(), tok.pos), False
        if tok.kind == "punct" and tok.value == "[":
            self.unsupported("array subscripts are", tok)
        nonassoc = tok.value in _COMPARISON
        return self.binary_operator(left, tok.value, tok, prec, None), nonassoc

    def binary_operator(
        self, left: ast.Expr, op: str, tok: Token, prec: int, schema: str | None
    ) -> ast.Expr:
        if self.at_keyword("any", "some", "all") and self.at_punct("(", 1):
            quant_tok = self.advance()
            quantifier: Literal["any", "all"] = "all" if quant_tok.value == "all" else "any"
            open_tok = self.advance()
            if self.starts_subquery():
                sub = self.subquery_text(open_tok)
                return ast.Subquery("in", left, False, tok.pos, sub)
            array = self.expr(0)
            self.expect_punct(")")
            return ast.QuantifiedOp(op, left, quantifier, array, tok.pos, schema)
        right = self.expr(prec)
        return ast.OpExpr(op, left, right, tok.pos, schema)

    def qualified_operator(self) -> tuple[str | None, str]:
        """``OPERATOR(schema.op)`` after the OPERATOR keyword."""
        self.expect_punct("(")
        names: list[str] = []
        while self.peek().kind in ("ident", "qident") and self.at_punct(".", 1):
            names.append(self.advance().value)
            self.advance()
        tok = self.advance()
        if tok.kind not in ("op", "punct") or tok.value in ("(", ")", ",", "::", "[", "]", ";"):
            self.error_at(tok)
        self.expect_punct(")")
        if len(names) > 1:
            self.error_at(tok)
        return (names[0] if names else None), tok.value

    def is_clause(self, left: ast.Expr, is_tok: Token) -> ast.Expr:
        negated = False
        if self.at_keyword("not"):
            self.advance()
            negated = True
        tok = self.advance()
        if tok.is_keyword("null"):
            return ast.NullTest(left, negated, is_tok.pos)
        if tok.is_keyword("true", "false", "unknown"):
            value: Literal["true", "false", "unknown"] = tok.value  # type: ignore[assignment]
            return ast.BooleanTest(left, value, negated, is_tok.pos)
        if tok.is_keyword("distinct"):
            self.expect_keyword("from")
            right = self.expr(_IS)
            return ast.Distinct(left, right, negated, is_tok.pos)
        if tok.is_keyword("document", "normalized", "json", "of", "nfc", "nfd", "nfkc", "nfkd"):
            self.unsupported(f"IS {tok.value.upper()} is", tok)
        self.error_at(tok)

    def like_level(
        self, left: ast.Expr, tok: Token, *, negated: bool, not_tok: Token | None
    ) -> ast.Expr:
        pos = (not_tok or tok).pos
        word = tok.value
        if word == "between":
            symmetric = False
            if self.at_keyword("symmetric", "asymmetric"):
                symmetric = self.advance().value == "symmetric"
            low = self.expr(_LIKE)
            self.expect_keyword("and")
            high = self.expr(_LIKE)
            return ast.Between(left, low, high, negated, symmetric, pos)
        if word == "in":
            open_tok = self.expect_punct("(")
            if self.starts_subquery():
                sub = self.subquery_text(open_tok)
                return ast.Subquery("in", left, negated, tok.pos, sub)
            items = [self.expr(0)]
            while self.at_punct(","):
                self.advance()
                items.append(self.expr(0))
            self.expect_punct(")")
            return ast.InList(left, tuple(items), negated, tok.pos)
        if word in ("like", "ilike"):
            pattern = self.expr(_ESCAPE)
            escape = None
            if self.at_keyword("escape"):
                self.advance()
                escape = self.expr(_LIKE)
            return ast.Like(left, pattern, escape, negated, word == "ilike", pos)
        if word == "similar":
            self.unsupported("SIMILAR TO is", tok)
        self.error_at(tok)

    # -- prefix forms -----------------------------------------------------------------------
    def prefix(self) -> ast.Expr:
        tok = self.peek()
        if tok.kind == "punct" and tok.value == "-":
            self.advance()
            operand = self.expr(_UMINUS)
            if isinstance(operand, ast.NumberLiteral):
                text = operand.text[1:] if operand.text.startswith("-") else "-" + operand.text
                return ast.NumberLiteral(text, tok.pos)
            return ast.OpExpr("-", None, operand, tok.pos)
        if tok.kind == "punct" and tok.value == "+":
            self.advance()
            return ast.OpExpr("+", None, self.expr(_UMINUS), tok.pos)
        if tok.kind == "op" and tok.value not in _COMPARISON and tok.value != "=>":
            self.advance()
            return ast.OpExpr(tok.value, None, self.expr(_OP), tok.pos)
        if tok.is_keyword("not"):
            self.advance()
            return ast.Not(self.expr(_NOT), tok.pos)
        if tok.is_keyword("operator") and self.at_punct("(", 1):
            self.advance()
            schema, op = self.qualified_operator()
            return ast.OpExpr(op, None, self.expr(_OP), tok.pos, schema)
        return self.primary()

    def primary(self) -> ast.Expr:
        tok = self.peek()
        if tok.kind in ("integer", "number"):
            self.advance()
            return ast.NumberLiteral(tok.value, tok.pos)
        if tok.kind == "string":
            self.advance()
            return ast.StringLiteral(tok.value, tok.pos)
        if tok.kind == "param":
            raise InvalidFilterError(
                f"there is no parameter {tok.value}", sqlstate="42P02", position=tok.pos + 1
            )
        if tok.kind == "punct" and tok.value == "(":
            return self.parenthesized()
        if tok.kind == "qident":
            return self.name_expression()
        if tok.kind == "ident":
            special = self.keyword_expression(tok)
            if special is not None:
                return special
            return self.name_expression()
        self.error_at(tok)

    def parenthesized(self) -> ast.Expr:
        open_tok = self.advance()
        if self.starts_subquery():
            return ast.Subquery("expr", None, False, open_tok.pos, self.subquery_text(open_tok))
        inner = self.expr(0)
        if self.at_punct(","):
            self.unsupported("row constructors are", open_tok)
        self.expect_punct(")")
        self.no_indirection()
        return inner

    def no_indirection(self) -> None:
        if self.at_punct("["):
            self.unsupported("array subscripts are", self.peek())
        if self.at_punct("."):
            self.unsupported("field selection is", self.peek())

    def starts_subquery(self) -> bool:
        """At the first token inside '(' of a sub-SELECT."""
        if self.at_keyword("select", "values", "with", "table"):
            return True
        depth = 0
        while self.at_punct("(", depth):
            depth += 1
        return depth > 0 and self.at_keyword("select", "values", "with", "table", ahead=depth)

    def subquery_text(self, open_tok: Token) -> str:
        """Skip a sub-SELECT up to the ')' matching ``open_tok``; its text."""
        depth = 1
        while True:
            tok = self.advance()
            if tok.kind == "eof":
                self.error_at(tok)
            if tok.kind == "punct" and tok.value == "(":
                depth += 1
            elif tok.kind == "punct" and tok.value == ")":
                depth -= 1
                if depth == 0:
                    return self.text[open_tok.pos : tok.end]

    def keyword_expression(self, tok: Token) -> ast.Expr | None:
        """The special forms introduced by an unquoted keyword, or None for a plain name."""
        word = tok.value
        nxt = self.peek(1)
        is_call = nxt.kind == "punct" and nxt.value == "("
        if word == "null":
            self.advance()
            return ast.NullLiteral(tok.pos)
        if word in ("true", "false"):
            self.advance()
            return ast.BoolLiteral(word == "true", tok.pos)
        if word == "case":
            return self.case_expression()
        if word == "cast" and is_call:
            self.advance()
            self.advance()
            arg = self.expr(0)
            self.expect_keyword("as")
            typ = self.type_name()
            self.expect_punct(")")
            return ast.TypeCast(arg, typ, tok.pos)
        if word in ("coalesce", "greatest", "least", "nullif") and is_call:
            self.advance()
            self.advance()
            args = self.expression_list()
            self.expect_punct(")")
            if word == "coalesce":
                return ast.Coalesce(tuple(args), tok.pos)
            if word == "nullif":
                if len(args) != 2:
                    self.error_at(self.tokens[self.i - 1])
                return ast.NullIf(args[0], args[1], tok.pos)
            kind: Literal["greatest", "least"] = "greatest" if word == "greatest" else "least"
            return ast.MinMax(kind, tuple(args), tok.pos)
        if word == "extract" and is_call:
            return self.extract_expression()
        if word == "substring" and is_call:
            return self.substring_expression()
        if word == "trim" and is_call:
            return self.trim_expression()
        if word == "position" and is_call:
            self.advance()
            self.advance()
            needle = self.expr(_LIKE)
            self.expect_keyword("in")
            haystack = self.expr(_LIKE)
            self.expect_punct(")")
            return ast.FuncCall(("position",), (haystack, needle), tok.pos, syntax="position")
        if word in _UNSUPPORTED_SYNTAX and is_call:
            self.unsupported(_UNSUPPORTED_SYNTAX[word] + " are", tok)
        if word == "exists" and is_call:
            self.advance()
            open_tok = self.advance()
            if not self.starts_subquery():
                self.error_at(self.peek())
            return ast.Subquery("exists", None, False, tok.pos, self.subquery_text(open_tok))
        if word == "array":
            self.advance()
            if self.at_punct("["):
                return self.array_literal(tok)
            if self.at_punct("("):
                open_tok = self.advance()
                if self.starts_subquery():
                    return ast.Subquery("expr", None, False, tok.pos, self.subquery_text(open_tok))
            self.error_at(self.peek())
        if word in _SQL_VALUE_FUNCTIONS and not (is_call and word == "current_schema"):
            self.advance()
            timed = ("current_time", "current_timestamp", "localtime", "localtimestamp")
            if word in timed and self.at_punct("("):
                self.advance()
                if self.peek().kind != "integer":
                    self.error_at(self.peek())
                self.advance()
                self.expect_punct(")")
            return ast.SpecialValue(word, tok.pos)
        if word in _TYPE_KEYWORDS and self.typed_literal_ahead():
            typ = self.type_name()
            value = self.advance()
            return ast.TypedLiteral(typ, value.value, tok.pos)
        if word == "interval" and nxt.kind == "string":
            self.unsupported("interval literals are", tok)
        return None

    def typed_literal_ahead(self) -> bool:
        """At a keyword type name followed by a string constant (``DOUBLE PRECISION '1'``)."""
        save = self.i
        try:
            self.type_name()
            return self.peek().kind == "string"
        except (FilterSyntaxError, UnsupportedFilterError):
            return False
        finally:
            self.i = save

    def array_literal(self, tok: Token) -> ast.Expr:
        self.expect_punct("[")
        items: list[ast.Expr] = []
        if not self.at_punct("]"):
            if self.at_punct("["):
                self.unsupported("multidimensional arrays are", self.peek())
            items = self.expression_list()
        self.expect_punct("]")
        self.no_indirection()
        return ast.ArrayLiteral(tuple(items), tok.pos)

    def expression_list(self) -> list[ast.Expr]:
        items = [self.expr(0)]
        while self.at_punct(","):
            self.advance()
            items.append(self.expr(0))
        return items

    def case_expression(self) -> ast.Expr:
        case_tok = self.advance()
        operand = None if self.at_keyword("when") else self.expr(0)
        whens: list[tuple[ast.Expr, ast.Expr]] = []
        while self.at_keyword("when"):
            self.advance()
            cond = self.expr(0)
            self.expect_keyword("then")
            whens.append((cond, self.expr(0)))
        if not whens:
            self.error_at(self.peek())
        default = None
        if self.at_keyword("else"):
            self.advance()
            default = self.expr(0)
        self.expect_keyword("end")
        return ast.Case(operand, tuple(whens), default, case_tok.pos)

    def extract_expression(self) -> ast.Expr:
        tok = self.advance()
        self.advance()
        field_tok = self.advance()
        if field_tok.kind not in ("string", "ident"):
            self.error_at(field_tok)
        field = field_tok.value
        self.expect_keyword("from")
        arg = self.expr(0)
        self.expect_punct(")")
        field_lit = ast.StringLiteral(field, field_tok.pos)
        return ast.FuncCall(("extract",), (field_lit, arg), tok.pos, syntax="extract")

    def substring_expression(self) -> ast.Expr:
        tok = self.advance()
        self.advance()
        if self.at_punct(")"):
            self.advance()
            return ast.FuncCall(("substring",), (), tok.pos)
        first = self.expr(0)
        if self.at_keyword("from", "for"):
            start: ast.Expr | None = None
            count: ast.Expr | None = None
            while self.at_keyword("from", "for"):
                kw = self.advance().value
                value = self.expr(0)
                if kw == "from" and start is None:
                    start = value
                elif kw == "for" and count is None:
                    count = value
                else:
                    self.error_at(self.tokens[self.i - 1])
            self.expect_punct(")")
            if start is None:
                start = ast.NumberLiteral("1", tok.pos)
            args = (first, start) if count is None else (first, start, count)
            return ast.FuncCall(("substring",), args, tok.pos, syntax="substring")
        if self.at_keyword("similar"):
            self.unsupported("SUBSTRING ... SIMILAR is", self.peek())
        args_list = [first]
        while self.at_punct(","):
            self.advance()
            args_list.append(self.expr(0))
        self.expect_punct(")")
        return ast.FuncCall(("substring",), tuple(args_list), tok.pos)

    def trim_expression(self) -> ast.Expr:
        tok = self.advance()
        self.advance()
        func = "btrim"
        if self.at_keyword("both", "leading", "trailing"):
            word = self.advance().value
            func = {"both": "btrim", "leading": "ltrim", "trailing": "rtrim"}[word]
        chars: ast.Expr | None = None
        if self.at_keyword("from"):
            self.advance()
            args = self.expression_list()
        else:
            first = self.expression_list()
            if self.at_keyword("from"):
                self.advance()
                if len(first) != 1:
                    self.error_at(self.tokens[self.i - 1])
                chars = first[0]
                args = self.expression_list()
            else:
                args = first
        self.expect_punct(")")
        if chars is not None:
            args = [*args, chars]
        return ast.FuncCall((func,), tuple(args), tok.pos, syntax="trim")

    def name_expression(self) -> ast.Expr:
        """A column reference, a function call or a generic typed literal."""
        first = self.advance()
        names = [first.value]
        quoted = [first.kind == "qident"]
        while self.at_punct(".") and self.peek(1).kind in ("ident", "qident"):
            self.advance()
            part = self.advance()
            names.append(part.value)
            quoted.append(part.kind == "qident")
        if self.at_punct(".") and self.at_punct("*", 1):
            self.unsupported("whole-row references are", self.peek())
        if self.at_punct("("):
            return self.function_call(first, tuple(names))
        if self.peek().kind == "string" and len(names) <= 2:
            value = self.advance()
            typ = ast.TypeName(tuple(names), (), first.pos)
            return ast.TypedLiteral(typ, value.value, first.pos)
        if len(names) == 1 and not quoted[0] and names[0] in RESERVED:
            self.error_at(first)
        if len(names) > 3:
            raise InvalidFilterError(
                f"improper qualified name (too many dotted names): {'.'.join(names)}",
                sqlstate="42601",
                position=first.pos + 1,
            )
        self.no_indirection()
        return ast.ColumnRef(tuple(names), first.pos)

    def function_call(self, first: Token, names: tuple[str, ...]) -> ast.Expr:
        self.expect_punct("(")
        agg: str | None = None
        star = False
        args: list[ast.Expr] = []
        if self.at_punct("*"):
            self.advance()
            star = True
        elif not self.at_punct(")"):
            if self.at_keyword("distinct", "all"):
                agg = self.advance().value.upper()
            if self.at_keyword("variadic"):
                self.unsupported("VARIADIC arguments are", self.peek())
            args = self.expression_list_named()
            if self.at_keyword("order"):
                agg = "ORDER BY"
                self.skip_until_close()
        self.expect_punct(")")
        while self.at_keyword("within", "filter", "over"):
            kw = self.advance()
            agg = kw.value.upper()
            if kw.value == "within":
                self.expect_keyword("group")
            if self.at_punct("("):
                self.advance()
                self.skip_until_close()
                self.expect_punct(")")
            elif kw.value == "over" and self.peek().kind in ("ident", "qident"):
                self.advance()
            else:
                self.error_at(self.peek())
        if len(names) > 2:
            raise InvalidFilterError(
                f"improper qualified name (too many dotted names): {'.'.join(names)}",
                sqlstate="42601",
                position=first.pos + 1,
            )
        return ast.FuncCall(names, tuple(args), first.pos, star=star, agg_clause=agg)

    def expression_list_named(self) -> list[ast.Expr]:
        items: list[ast.Expr] = []
        while True:
            tok = self.peek()
            if tok.kind in ("ident", "qident") and self.peek(1).value in ("=>", ":="):
                self.unsupported("named function arguments are", tok)
            items.append(self.expr(0))
            if not self.at_punct(","):
                return items
            self.advance()

    def skip_until_close(self) -> None:
        """Skip tokens up to (not including) the ')' closing the current parenthesis."""
        depth = 0
        while True:
            tok = self.peek()
            if tok.kind == "eof":
                self.error_at(tok)
            if tok.kind == "punct" and tok.value == "(":
                depth += 1
            elif tok.kind == "punct" and tok.value == ")":
                if depth == 0:
                    return
                depth -= 1
            self.advance()

    # -- names ------------------------------------------------------------------------------
    def any_name(self) -> tuple[str, ...]:
        tok = self.advance()
        if tok.kind not in ("ident", "qident"):
            self.error_at(tok)
        names = [tok.value]
        while self.at_punct(".") and self.peek(1).kind in ("ident", "qident"):
            self.advance()
            names.append(self.advance().value)
        return tuple(names)

    def type_name(self) -> ast.TypeName:
        tok = self.peek()
        if tok.is_keyword("setof"):
            self.unsupported("SETOF types are", tok)
        typ = self.keyword_type() if tok.kind == "ident" else None
        if typ is None:
            if tok.kind not in ("ident", "qident") or (
                tok.kind == "ident" and tok.value in RESERVED
            ):
                self.error_at(tok)
            names = self.any_name()
            typmods = self.typmods() if self.at_punct("(") else ()
            typ = ast.TypeName(names, typmods, tok.pos)
        if self.at_punct("[") or self.at_keyword("array"):
            self.unsupported("array types are", self.peek())
        return typ

    def typmods(self) -> tuple[int, ...]:
        self.expect_punct("(")
        values: list[int] = []
        while True:
            sign = 1
            if self.at_punct("-"):
                self.advance()
                sign = -1
            tok = self.advance()
            if tok.kind != "integer":
                if tok.kind in ("number", "string", "ident", "qident"):
                    raise InvalidFilterError(
                        "type modifiers must be simple constants or identifiers",
                        sqlstate="22023",
                        position=tok.pos + 1,
                    )
                self.error_at(tok)
            values.append(sign * int(tok.value))
            if self.at_punct(")"):
                self.advance()
                return tuple(values)
            self.expect_punct(",")

    def keyword_type(self) -> ast.TypeName | None:
        """The SQL-standard type names that are keywords (gram.y's SimpleTypename)."""
        tok = self.peek()
        word = tok.value
        simple = {
            "int": ("int4", "integer"),
            "integer": ("int4", "integer"),
            "smallint": ("int2", "smallint"),
            "bigint": ("int8", "bigint"),
            "real": ("float4", "real"),
            "boolean": ("bool", "boolean"),
            "json": ("json", "json"),
        }
        if word in simple:
            self.advance()
            name, sql = simple[word]
            return ast.TypeName(("pg_catalog", name), (), tok.pos, sql)
        if word == "double" and self.at_keyword("precision", ahead=1):
            self.advance()
            self.advance()
            return ast.TypeName(("pg_catalog", "float8"), (), tok.pos, "double precision")
        if word == "float":
            self.advance()
            if not self.at_punct("("):
                return ast.TypeName(("pg_catalog", "float8"), (), tok.pos, "double precision")
            (precision,) = self._float_precision(tok)
            if precision < 1:
                raise InvalidFilterError(
                    "precision for type float must be at least 1 bit",
                    sqlstate="22023",
                    position=tok.pos + 1,
                )
            if precision <= 24:
                return ast.TypeName(("pg_catalog", "float4"), (), tok.pos, "real")
            if precision <= 53:
                return ast.TypeName(("pg_catalog", "float8"), (), tok.pos, "double precision")
            raise InvalidFilterError(
                "precision for type float must be less than 54 bits",
                sqlstate="22023",
                position=tok.pos + 1,
            )
        if word in ("decimal", "dec", "numeric"):
            self.advance()
            typmods = self.typmods() if self.at_punct("(") else ()
            return ast.TypeName(("pg_catalog", "numeric"), typmods, tok.pos, "numeric")
        if word in ("char", "character", "nchar", "national", "varchar"):
            return self.character_type()
        if word == "bit":
            self.advance()
            if self.at_keyword("varying"):
                self.advance()
                typmods = self.typmods() if self.at_punct("(") else ()
                return ast.TypeName(("pg_catalog", "varbit"), typmods, tok.pos, "bit varying")
            typmods = self.typmods() if self.at_punct("(") else (1,)
            return ast.TypeName(("pg_catalog", "bit"), typmods, tok.pos, "bit")
        if word in ("timestamp", "time"):
            self.advance()
            typmods = self.typmods() if self.at_punct("(") else ()
            with_zone = False
            if self.at_keyword("with", "without") and self.at_keyword("time", ahead=1):
                with_zone = self.advance().value == "with"
                self.advance()
                self.expect_keyword("zone")
            name = word + ("tz" if with_zone else "")
            sql = f"{word} with{'' if with_zone else 'out'} time zone"
            return ast.TypeName(("pg_catalog", name), typmods, tok.pos, sql)
        if word == "interval":
            self.unsupported("the interval type is", tok)
        return None

    def _float_precision(self, tok: Token) -> tuple[int]:
        mods = self.typmods()
        if len(mods) != 1:
            self.error_at(tok)
        return (mods[0],)

    def character_type(self) -> ast.TypeName:
        tok = self.advance()
        word = tok.value
        if word == "national":
            if not self.at_keyword("char", "character"):
                self.error_at(self.peek())
            self.advance()
        varying = word == "varchar"
        if not varying and self.at_keyword("varying"):
            self.advance()
            varying = True
        typmods = self.typmods() if self.at_punct("(") else ()
        if varying:
            return ast.TypeName(("pg_catalog", "varchar"), typmods, tok.pos, "character varying")
        return ast.TypeName(("pg_catalog", "bpchar"), typmods or (1,), tok.pos, "character")
