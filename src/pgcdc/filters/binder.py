"""Binding: the unbound AST of a filter becomes a typed ``pgcdc.filters.bound`` tree for one
relation, following PostgreSQL's parse analysis (parse_expr.c, parse_oper.c, parse_func.c,
parse_coerce.c) rule for rule: column references resolve against the pgoutput Relation
message's columns, constants get their types (integer literals int4/int8/numeric, strings
``unknown`` until context decides), operators and functions are chosen from the built-in
catalog with the server's resolution heuristics, implicit casts are inserted, BETWEEN, IN,
IS DISTINCT FROM NULL and LIKE ... ESCAPE are rewritten as the server rewrites them.

Errors are PostgreSQL's analysis errors (``InvalidFilterError`` with the same SQLSTATE and
message), pointing at the same token.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from pgcdc.filters import ast, datums, numeric, pg_builtins, pg_builtins_data
from pgcdc.filters.bound import (
    ArrayCoerceExpr,
    ArrayExpr,
    BooleanTest,
    BoolExpr,
    Bound,
    Call,
    CaseExpr,
    CaseTestExpr,
    CoalesceExpr,
    CoerceViaIO,
    CollateExpr,
    Const,
    DistinctExpr,
    MinMaxExpr,
    NullIfExpr,
    NullTest,
    RelabelType,
    ScalarArrayOpExpr,
    SQLValueFunction,
    SubLink,
    Var,
)
from pgcdc.filters.errors import FilterEvaluationError, InvalidFilterError, UnsupportedFilterError
from pgcdc.filters.pg_builtins import (
    BOOL,
    TEXT,
    UNKNOWN,
    CastEntry,
    CoercionContext,
    CoercionPath,
    FunctionEntry,
    OperatorEntry,
    format_type,
)
from pgcdc.filters.resolution import (
    resolve_function,
    resolve_operator,
    select_common_type,
    try_common_type,
)
from pgcdc.filters.visitor import Visitor, visits
from pgcdc.protocol.messages import Relation

__all__ = [
    "INVALID_EXPRESSION",
    "Binder",
    "bind_expression",
    "children",
    "contains_var",
    "leftmost",
]

INVALID_EXPRESSION = "invalid publication WHERE expression"
MUTABLE_DETAIL = "User-defined or built-in mutable functions are not allowed."
TYPE_DETAIL = "User-defined types are not allowed."

#: System columns: name -> (type oid, attnum).
SYSTEM_COLUMNS = {
    "ctid": (27, -1),
    "xmin": (28, -3),
    "cmin": (29, -4),
    "xmax": (28, -5),
    "cmax": (29, -6),
    "tableoid": (26, -7),
}
_SQL_VALUE_TYPES = {
    "current_date": pg_builtins.DATE,
    "current_time": 1266,
    "current_timestamp": pg_builtins.TIMESTAMPTZ,
    "localtime": 1083,
    "localtimestamp": pg_builtins.TIMESTAMP,
    "current_catalog": pg_builtins.NAME,
    "current_schema": pg_builtins.NAME,
    "current_role": pg_builtins.NAME,
    "current_user": pg_builtins.NAME,
    "session_user": pg_builtins.NAME,
    "user": pg_builtins.NAME,
    "system_user": TEXT,
}
_BTREE_COMPARE = {
    pg_builtins.INT2: "int",
    pg_builtins.INT4: "int",
    pg_builtins.INT8: "int",
    pg_builtins.FLOAT4: "float",
    pg_builtins.FLOAT8: "float",
    pg_builtins.NUMERIC: "numeric",
    pg_builtins.TEXT: "text",
    pg_builtins.VARCHAR: "text",
    pg_builtins.NAME: "text",
    pg_builtins.BPCHAR: "bpchar",
    pg_builtins.BOOL: "bool",
    pg_builtins.DATE: "date",
    pg_builtins.TIMESTAMP: "timestamp",
    pg_builtins.TIMESTAMPTZ: "timestamp",
}
_INTEGER_RE = re.compile(r"-?[0-9]+\Z")
_TYPMOD_TYPES = {"numeric", "varchar", "bpchar", "timestamp", "timestamptz", "time", "timetz"}


def leftmost(*locations: int) -> int:
    """PostgreSQL's leftmostLoc over several locations (-1 is unknown)."""
    known = [loc for loc in locations if loc >= 0]
    return min(known) if known else -1


def _pos(location: int) -> int | None:
    return location + 1 if location >= 0 else None


def _walker_error(detail: str, location: int) -> InvalidFilterError:
    return InvalidFilterError(
        INVALID_EXPRESSION, sqlstate="0A000", detail=detail, position=_pos(location)
    )


def contains_var(node: Bound) -> bool:
    """contain_vars_of_level(node, 0)."""
    if isinstance(node, Var):
        return True
    return any(contains_var(child) for child in children(node))


def children(node: Bound) -> list[Bound]:
    """The sub-expressions of a node, in PostgreSQL's expression_tree_walker order."""
    if isinstance(node, Call):
        return list(node.args)
    if isinstance(node, BoolExpr):
        return list(node.args)
    if isinstance(
        node, NullTest | BooleanTest | RelabelType | CoerceViaIO | ArrayCoerceExpr | CollateExpr
    ):
        return [node.arg]
    if isinstance(node, DistinctExpr):
        return list(node.eq.args)
    if isinstance(node, NullIfExpr):
        return list(node.eq.args)
    if isinstance(node, ScalarArrayOpExpr):
        return [node.left, node.array]
    if isinstance(node, ArrayExpr):
        return list(node.elements)
    if isinstance(node, CaseExpr):
        out: list[Bound] = [] if node.arg is None else [node.arg]
        for cond, result in node.whens:
            out += [cond, result]
        out.append(node.default)
        return out
    if isinstance(node, CoalesceExpr | MinMaxExpr):
        return list(node.args)
    return []


class Binder(Visitor[ast.Expr, Bound]):
    """Binds expressions to one relation (its pgoutput Relation message)."""

    def __init__(self, relation: Relation) -> None:
        self.relation = relation
        self.columns = {c.name: (i, c) for i, c in enumerate(relation.columns)}

    # -- entry point --------------------------------------------------------------------------
    def bind(self, expr: ast.Expr) -> Bound:
        node = self.visit(expr)
        return self.coerce_to_boolean(node, "PUBLICATION WHERE")

    # -- dispatch -----------------------------------------------------------------------------
    def generic_visit(self, node: ast.Expr) -> Bound:
        raise TypeError(f"no binding for a {type(node).__name__} node")  # a parser bug

    @visits
    def _ColumnRef(self, node: ast.ColumnRef) -> Bound:
        names = node.names
        rel = self.relation
        if len(names) == 3 and (names[0] != rel.namespace or names[1] != rel.name):
            raise InvalidFilterError(
                f'missing FROM-clause entry for table "{names[1]}"',
                sqlstate="42P01",
                position=_pos(node.pos),
            )
        if len(names) == 2 and names[0] != rel.name:
            raise InvalidFilterError(
                f'missing FROM-clause entry for table "{names[0]}"',
                sqlstate="42P01",
                position=_pos(node.pos),
            )
        name = names[-1]
        found = self.columns.get(name)
        if found is not None:
            index, column = found
            if pg_builtins.type_entry(column.type_id) is None:
                # user-defined (or unknown) type: the server's check reports it at the column
                raise _walker_error(TYPE_DETAIL, node.pos)
            return Var(index, name, column.type_id, column.type_modifier, node.pos)
        if name in SYSTEM_COLUMNS:
            oid, attnum = SYSTEM_COLUMNS[name]
            return Var(-1, name, oid, -1, node.pos, attnum)
        raise InvalidFilterError(
            f'column "{name}" does not exist', sqlstate="42703", position=_pos(node.pos)
        )

    @visits
    def _NumberLiteral(self, node: ast.NumberLiteral) -> Bound:
        text = node.text
        if _INTEGER_RE.match(text):
            value = int(text)
            if -(2**31) <= value < 2**31:
                return Const(value, pg_builtins.INT4, -1, node.pos)
            if -(2**63) <= value < 2**63:
                return Const(value, pg_builtins.INT8, -1, node.pos)
        return Const(numeric.parse(text), pg_builtins.NUMERIC, -1, node.pos)

    @visits
    def _StringLiteral(self, node: ast.StringLiteral) -> Bound:
        return Const(node.value, UNKNOWN, -1, node.pos)

    @visits
    def _NullLiteral(self, node: ast.NullLiteral) -> Bound:
        return Const(None, UNKNOWN, -1, node.pos)

    @visits
    def _BoolLiteral(self, node: ast.BoolLiteral) -> Bound:
        return Const(node.value, BOOL, -1, node.pos)

    @visits
    def _TypedLiteral(self, node: ast.TypedLiteral) -> Bound:
        target, typmod = self.resolve_type(node.type)
        const = Const(node.value, UNKNOWN, -1, node.pos)
        return self.coerce(const, target, typmod, CoercionContext.EXPLICIT, node.pos)

    @visits
    def _TypeCast(self, node: ast.TypeCast) -> Bound:
        arg = self.visit(node.arg)
        location = leftmost(node.pos, arg.location)
        target, typmod = self.resolve_type(node.type, location)
        if isinstance(arg, Const) and arg.type == UNKNOWN:
            return self.coerce(arg, target, typmod, CoercionContext.EXPLICIT, location)
        return self.coerce(arg, target, typmod, CoercionContext.EXPLICIT, location, explicit=True)

    @visits
    def _Collate(self, node: ast.Collate) -> Bound:
        arg = self.visit(node.arg)
        entry = pg_builtins.type_entry(arg.type)
        if arg.type != UNKNOWN and (entry is None or not entry.collatable):
            raise InvalidFilterError(
                f"collations are not supported by type {format_type(arg.type)}",
                sqlstate="42804",
                position=_pos(node.pos),
            )
        name = node.collation[-1]
        schema = node.collation[0] if len(node.collation) > 1 else None
        if len(node.collation) > 2:
            raise InvalidFilterError(
                f"improper qualified name (too many dotted names): {'.'.join(node.collation)}",
                sqlstate="42601",
                position=_pos(node.pos),
            )
        return CollateExpr(arg, name, schema, arg.type, arg.typmod, arg.location, node.pos)

    @visits
    def _OpExpr(self, node: ast.OpExpr) -> Bound:
        right = self.visit(node.right)
        left = None if node.left is None else self.visit(node.left)
        return self.make_op(node.op, left, right, node.pos, node.schema)

    @visits
    def _BoolOp(self, node: ast.BoolOp) -> Bound:
        name = node.kind.upper()
        args: list[Bound] = []
        for arg in self._flatten(node):
            args.append(self.coerce_to_boolean(self.visit(arg), name))
        return BoolExpr(node.kind, tuple(args), leftmost(node.pos, *(a.location for a in args)))

    def _flatten(self, node: ast.BoolOp) -> list[ast.Expr]:
        out: list[ast.Expr] = []
        for arg in node.args:
            if isinstance(arg, ast.BoolOp) and arg.kind == node.kind:
                out.extend(self._flatten(arg))
            else:
                out.append(arg)
        return out

    @visits
    def _Not(self, node: ast.Not) -> Bound:
        arg = self.coerce_to_boolean(self.visit(node.arg), "NOT")
        return BoolExpr("not", (arg,), leftmost(node.pos, arg.location))

    @visits
    def _NullTest(self, node: ast.NullTest) -> Bound:
        arg = self.visit(node.arg)
        return NullTest(arg, node.negated, leftmost(node.pos, arg.location))

    @visits
    def _BooleanTest(self, node: ast.BooleanTest) -> Bound:
        what = f"IS {'NOT ' if node.negated else ''}{node.value.upper()}"
        arg = self.coerce_to_boolean(self.visit(node.arg), what)
        kind = f"is_{'not_' if node.negated else ''}{node.value}"
        return BooleanTest(arg, kind, leftmost(node.pos, arg.location))

    @visits
    def _Distinct(self, node: ast.Distinct) -> Bound:
        for null_side, other in ((node.right, node.left), (node.left, node.right)):
            if isinstance(null_side, ast.NullLiteral):
                arg = self.visit(other)
                return NullTest(arg, not node.negated, node.pos)
        left = self.visit(node.left)
        right = self.visit(node.right)
        eq = self.make_op("=", left, right, node.pos)
        assert isinstance(eq, Call)
        if eq.type != BOOL:
            raise InvalidFilterError(
                "IS DISTINCT FROM requires = operator to yield boolean",
                sqlstate="42804",
                position=_pos(node.pos),
            )
        distinct = DistinctExpr(eq, eq.location)
        if node.negated:
            return BoolExpr("not", (distinct,), leftmost(node.pos, distinct.location))
        return distinct

    @visits
    def _Between(self, node: ast.Between) -> Bound:
        a, b, c, pos = node.arg, node.low, node.high, node.pos

        def op(name: str, x: ast.Expr, y: ast.Expr) -> ast.Expr:
            return ast.OpExpr(name, x, y, pos)

        if not node.symmetric:
            if not node.negated:
                rewritten: ast.Expr = ast.BoolOp("and", (op(">=", a, b), op("<=", a, c)), pos)
            else:
                rewritten = ast.BoolOp("or", (op("<", a, b), op(">", a, c)), pos)
        elif not node.negated:
            sub1 = ast.BoolOp("and", (op(">=", a, b), op("<=", a, c)), pos)
            sub2 = ast.BoolOp("and", (op(">=", a, c), op("<=", a, b)), pos)
            rewritten = ast.BoolOp("or", (sub1, sub2), pos)
        else:
            sub1 = ast.BoolOp("or", (op("<", a, b), op(">", a, c)), pos)
            sub2 = ast.BoolOp("or", (op("<", a, c), op(">", a, b)), pos)
            rewritten = ast.BoolOp("and", (sub1, sub2), pos)
        return self.visit(rewritten)

    @visits
    def _InList(self, node: ast.InList) -> Bound:
        use_or = not node.negated
        opname = "<>" if node.negated else "="
        lexpr = self.visit(node.arg)
        rexprs = [self.visit(item) for item in node.items]
        rvars = [r for r in rexprs if contains_var(r)]
        rnonvars = [r for r in rexprs if not contains_var(r)]
        result: Bound | None = None
        rest = rexprs
        if len(rnonvars) > 1:
            all_types = [lexpr.type] + [r.type for r in rnonvars]
            common = try_common_type(all_types)
            if common is not None and not all(
                pg_builtins.can_coerce([t], [common], CoercionContext.IMPLICIT) for t in all_types
            ):
                common = None
            entry = pg_builtins.type_entry(common) if common is not None else None
            if common is not None and entry is not None and entry.array and common != 2249:
                elements = tuple(self.coerce_to_common(r, common, "IN") for r in rnonvars)
                array = ArrayExpr(elements, common, -1, entry.array)
                result = self.make_scalar_array_op(opname, use_or, lexpr, array, node.pos)
                rest = rvars
        for rexpr in rest:
            cmp = self.coerce_to_boolean(self.make_op(opname, lexpr, rexpr, node.pos), "IN")
            if result is None:
                result = cmp
            else:
                result = BoolExpr(
                    "or" if use_or else "and",
                    (result, cmp),
                    leftmost(node.pos, result.location, cmp.location),
                )
        assert result is not None
        return result

    @visits
    def _QuantifiedOp(self, node: ast.QuantifiedOp) -> Bound:
        if node.schema not in (None, "pg_catalog"):
            raise _walker_error("User-defined operators are not allowed.", node.pos)
        left = self.visit(node.left)
        if not isinstance(node.array, ast.ArrayLiteral):
            raise UnsupportedFilterError(
                f"{node.op} {node.quantifier.upper()} (...) is supported in client-side row "
                "filters only with an ARRAY[...] list",
                sqlstate="0A000",
                position=_pos(node.pos),
            )
        array = self._array(node.array)
        return self.make_scalar_array_op(node.op, node.quantifier == "any", left, array, node.pos)

    def _array(self, node: ast.ArrayLiteral) -> ArrayExpr:
        elements = [self.visit(e) for e in node.items]
        if not elements:
            raise InvalidFilterError(
                "cannot determine type of empty array",
                sqlstate="42P18",
                position=_pos(node.pos),
                hint="Explicitly cast to the desired type, for example ARRAY[]::integer[].",
            )
        common = select_common_type(
            [e.type for e in elements], [e.location for e in elements], "ARRAY"
        )
        entry = pg_builtins.type_entry(common)
        if entry is None or not entry.array:
            raise UnsupportedFilterError(
                f"arrays of {format_type(common)} are not supported",
                sqlstate="0A000",
                position=_pos(node.pos),
            )
        coerced = tuple(self.coerce_to_common(e, common, "ARRAY") for e in elements)
        return ArrayExpr(coerced, common, node.pos, entry.array)

    @visits
    def _ArrayLiteral(self, node: ast.ArrayLiteral) -> Bound:
        raise UnsupportedFilterError(
            "array values are not supported in client-side row filters (only as "
            "x = ANY (ARRAY[...]))",
            sqlstate="0A000",
            position=_pos(node.pos),
        )

    @visits
    def _Like(self, node: ast.Like) -> Bound:
        opname = ("!" if node.negated else "") + ("~~*" if node.case_insensitive else "~~")
        pattern = node.pattern
        if node.escape is not None:
            pattern = ast.FuncCall(
                ("pg_catalog", "like_escape"), (node.pattern, node.escape), node.pos
            )
        return self.visit(ast.OpExpr(opname, node.arg, pattern, node.pos))

    @visits
    def _Case(self, node: ast.Case) -> Bound:
        arg: Bound | None = None
        placeholder: CaseTestExpr | None = None
        if node.operand is not None:
            arg = self.visit(node.operand)
            if arg.type == UNKNOWN:
                arg = self.coerce_to_common(arg, TEXT, "CASE")
            placeholder = CaseTestExpr(arg.type, arg.typmod)
        whens: list[tuple[Bound, Bound]] = []
        for cond_ast, result_ast in node.whens:
            if placeholder is not None:
                value = self.visit(cond_ast)
                cond = self.make_op("=", placeholder, value, cond_ast_pos(cond_ast))
            else:
                cond = self.visit(cond_ast)
            cond = self.coerce_to_boolean(cond, "CASE/WHEN")
            whens.append((cond, self.visit(result_ast)))
        default = (
            self.visit(node.default) if node.default is not None else Const(None, UNKNOWN, -1, -1)
        )
        results = [default] + [r for _, r in whens]
        ptype = select_common_type([r.type for r in results], [r.location for r in results], "CASE")
        default = self.coerce_to_common(default, ptype, "CASE")
        whens = [(c, self.coerce_to_common(r, ptype, "CASE")) for c, r in whens]
        typmod = _common_typmod([default] + [r for _, r in whens])
        return CaseExpr(arg, tuple(whens), default, ptype, typmod, node.pos)

    @visits
    def _Coalesce(self, node: ast.Coalesce) -> Bound:
        args = [self.visit(a) for a in node.args]
        ptype = select_common_type([a.type for a in args], [a.location for a in args], "COALESCE")
        coerced = tuple(self.coerce_to_common(a, ptype, "COALESCE") for a in args)
        return CoalesceExpr(coerced, ptype, _common_typmod(coerced), node.pos)

    @visits
    def _MinMax(self, node: ast.MinMax) -> Bound:
        what = node.kind.upper()
        args = [self.visit(a) for a in node.args]
        ptype = select_common_type([a.type for a in args], [a.location for a in args], what)
        coerced = tuple(self.coerce_to_common(a, ptype, what) for a in args)
        family = _BTREE_COMPARE.get(ptype)
        impl = f"cmp:{family}" if family else f"cmp:{format_type(ptype)}"
        compare = Call("func", f"btree comparison of {format_type(ptype)}", impl, (), BOOL, -1,
                       "i", True, -1)  # fmt: skip
        return MinMaxExpr(node.kind, coerced, compare, ptype, _common_typmod(coerced), node.pos)

    @visits
    def _NullIf(self, node: ast.NullIf) -> Bound:
        left = self.visit(node.left)
        right = self.visit(node.right)
        eq = self.make_op("=", left, right, node.pos)
        assert isinstance(eq, Call)
        if eq.type != BOOL:
            raise InvalidFilterError(
                "NULLIF requires = operator to yield boolean",
                sqlstate="42804",
                position=_pos(node.pos),
            )
        first = eq.args[0]
        return NullIfExpr(eq, first.type, first.typmod, leftmost(node.pos, eq.location))

    @visits
    def _SpecialValue(self, node: ast.SpecialValue) -> Bound:
        return SQLValueFunction(node.name, _SQL_VALUE_TYPES.get(node.name, TEXT), node.pos)

    @visits
    def _Subquery(self, node: ast.Subquery) -> Bound:
        location = node.pos
        if node.arg is not None:
            arg = self.visit(node.arg)
            location = leftmost(location, arg.location)
        # a scalar sub-SELECT's type is not known here: typed by its context (it is refused
        # by the row filter rules anyway)
        return SubLink(location, UNKNOWN if node.kind == "expr" else BOOL)

    @visits
    def _FuncCall(self, node: ast.FuncCall) -> Bound:
        name = node.names[-1]
        schema = node.names[0] if len(node.names) > 1 else None
        self._check_aggregate_syntax(node, name)
        args = [self.visit(a) for a in node.args]
        location = leftmost(node.pos, *(a.location for a in args))
        if schema not in (None, "pg_catalog"):
            raise _walker_error(MUTABLE_DETAIL, location)
        if (
            name in pg_builtins_data.AGGREGATE_FUNCTIONS
            and pg_builtins.functions_named(name) is None
        ):
            raise InvalidFilterError(
                "aggregate functions are not allowed in WHERE",
                sqlstate="42803",
                position=_pos(node.pos),
            )
        if name in pg_builtins_data.WINDOW_FUNCTIONS:
            raise InvalidFilterError(
                f"window function {name} requires an OVER clause",
                sqlstate="42809",
                position=_pos(node.pos),
            )
        if name in pg_builtins_data.SET_RETURNING_FUNCTIONS:
            raise InvalidFilterError(
                "set-returning functions are not allowed in WHERE",
                sqlstate="0A000",
                position=_pos(node.pos),
            )
        types = [a.type for a in args]
        entries = pg_builtins.functions_named(name)
        if entries is not None:
            candidates = [e for e in entries if len(e.args) == len(args) and e.args == tuple(types)]
            if not candidates:
                cast = self._function_style_cast(name, args, location)
                if cast is not None:
                    return cast
            entry, ambiguous = resolve_function(entries, types)
            if entry is None:
                signature = f"{name}({', '.join(format_type(t) for t in types)})"
                if ambiguous:
                    raise InvalidFilterError(
                        f"function {signature} is not unique",
                        sqlstate="42725",
                        hint="Could not choose a best candidate function. You might need to add "
                        "explicit type casts.",
                        position=_pos(node.pos),
                    )
                raise InvalidFilterError(
                    f"function {signature} does not exist",
                    sqlstate="42883",
                    hint="No function matches the given name and argument types. You might "
                    "need to add explicit type casts.",
                    position=_pos(node.pos),
                )
            return self._make_func(entry, args, node.pos, location)
        if name in pg_builtins_data.MUTABLE_FUNCTIONS:
            raise _walker_error(MUTABLE_DETAIL, location)
        cast = self._function_style_cast(name, args, location)
        if cast is not None:
            return cast
        if name in pg_builtins_data.BUILTIN_FUNCTIONS:
            raise UnsupportedFilterError(
                f"function {name}() is not supported by client-side row filters",
                sqlstate="0A000",
                position=_pos(node.pos),
            )
        raise InvalidFilterError(
            INVALID_EXPRESSION,
            sqlstate="0A000",
            detail=MUTABLE_DETAIL,
            hint=f"{name}() is not a built-in function of PostgreSQL.",
            position=_pos(location),
        )

    def _check_aggregate_syntax(self, node: ast.FuncCall, name: str) -> None:
        if node.agg_clause is None and not node.star:
            return
        is_agg = name in pg_builtins_data.AGGREGATE_FUNCTIONS
        is_window = name in pg_builtins_data.WINDOW_FUNCTIONS
        if node.agg_clause == "OVER":
            if is_agg or is_window:
                raise InvalidFilterError(
                    "window functions are not allowed in WHERE",
                    sqlstate="42P20",
                    position=_pos(node.pos),
                )
            raise InvalidFilterError(
                f"OVER specified, but {name} is not a window function nor an aggregate function",
                sqlstate="42809",
                position=_pos(node.pos),
            )
        if is_agg:
            raise InvalidFilterError(
                "aggregate functions are not allowed in WHERE",
                sqlstate="42803",
                position=_pos(node.pos),
            )
        clause = "*" if node.star else node.agg_clause
        shown = f"{name}(*)" if node.star else clause
        raise InvalidFilterError(
            f"{shown} specified, but {name} is not an aggregate function",
            sqlstate="42809",
            position=_pos(node.pos),
        )

    def _function_style_cast(self, name: str, args: list[Bound], location: int) -> Bound | None:
        """func_get_detail's "function call that is really a type coercion" case."""
        if len(args) != 1:
            return None
        entry = pg_builtins.type_by_name(name)
        if entry is None:
            return None
        arg = args[0]
        if isinstance(arg, Const) and arg.type == UNKNOWN:
            return self.coerce(arg, entry.oid, -1, CoercionContext.EXPLICIT, location)
        path, _ = pg_builtins.find_coercion_pathway(entry.oid, arg.type, CoercionContext.EXPLICIT)
        if path in (CoercionPath.RELABEL, CoercionPath.VIA_IO):
            return self.coerce(
                arg, entry.oid, -1, CoercionContext.EXPLICIT, location, explicit=True
            )
        return None

    def _make_func(self, entry: FunctionEntry, args: list[Bound], pos: int, location: int) -> Bound:
        declared = list(entry.args)
        if entry.variadic:
            fixed = len(declared) - 1
            declared = declared[:fixed] + [entry.variadic] * (len(args) - fixed)
        coerced = tuple(
            arg
            if _is_generic(target)
            else self.coerce(arg, target, -1, CoercionContext.IMPLICIT, arg.location)
            for arg, target in zip(args, declared, strict=True)
        )
        result = entry.result
        if _is_generic(result):
            result = _resolve_generic(result, declared, coerced)
        return Call("func", entry.name, entry.implementation, coerced, result, -1,
                    entry.volatility, entry.strict, leftmost(pos, location))  # fmt: skip

    # -- operators ----------------------------------------------------------------------------
    def make_op(
        self,
        name: str,
        left: Bound | None,
        right: Bound,
        pos: int,
        schema: str | None = None,
    ) -> Bound:
        if schema not in (None, "pg_catalog"):
            location = leftmost(pos, right.location, -1 if left is None else left.location)
            raise _walker_error("User-defined operators are not allowed.", location)
        if pg_builtins.operators_named(name) is None:
            if name not in pg_builtins_data.BUILTIN_OPERATORS:
                location = leftmost(pos, right.location, -1 if left is None else left.location)
                raise _walker_error("User-defined operators are not allowed.", location)
            raise UnsupportedFilterError(
                f"operator {name} is not supported by client-side row filters",
                sqlstate="0A000",
                position=_pos(pos),
            )
        entry = resolve_operator(name, None if left is None else left.type, right.type, pos)
        return self._op_call(entry, left, right, pos)

    def _op_call(self, entry: OperatorEntry, left: Bound | None, right: Bound, pos: int) -> Call:
        args: list[Bound] = []
        declared = [entry.left, entry.right] if left is not None else [entry.right]
        actual = [left, right] if left is not None else [right]
        for arg, target in zip(actual, declared, strict=True):
            assert arg is not None
            if _is_generic(target):
                args.append(arg)
            else:
                args.append(self.coerce(arg, target, -1, CoercionContext.IMPLICIT, arg.location))
        result = entry.result
        if _is_generic(result):
            result = _resolve_generic(result, declared, args)
        location = leftmost(pos, *(a.location for a in args))
        return Call("op", entry.name, entry.implementation, tuple(args), result, -1,
                    entry.volatility, entry.strict, location)  # fmt: skip

    def make_scalar_array_op(
        self, name: str, use_or: bool, left: Bound, array: ArrayExpr, pos: int
    ) -> Bound:
        if pg_builtins.operators_named(name) is None:
            raise UnsupportedFilterError(
                f"operator {name} is not supported by client-side row filters",
                sqlstate="0A000",
                position=_pos(pos),
            )
        entry = resolve_operator(name, left.type, array.element_type, pos)
        if entry.result != BOOL:
            raise InvalidFilterError(
                "op ANY/ALL (array) requires operator to yield boolean",
                sqlstate="42809",
                position=_pos(pos),
            )
        left = self.coerce(left, entry.left, -1, CoercionContext.IMPLICIT, left.location)
        right: Bound = array
        if entry.right != array.element_type:
            # the whole array is converted (varchar[] -> text[]): an ArrayCoerceExpr
            target = pg_builtins.type_entry(entry.right)
            right = ArrayCoerceExpr(array, target.array if target else 0, -1, array.location)
        op = Call("op", entry.name, entry.implementation, (), BOOL, -1, entry.volatility,
                  entry.strict, pos)  # fmt: skip
        location = leftmost(pos, left.location, right.location)
        return ScalarArrayOpExpr(op, use_or, left, right, location)

    # -- types and coercion -------------------------------------------------------------------
    def resolve_type(self, name: ast.TypeName, location: int = -1) -> tuple[int, int]:
        """(type oid, typmod) of a type name; ``location`` is where a user-defined type is
        reported (the expression of that type, as the server's check does)."""
        names = name.names
        shown = name.sql_name or ".".join(names)
        if len(names) > 2:
            raise InvalidFilterError(
                f"improper qualified name (too many dotted names): {'.'.join(names)}",
                sqlstate="42601",
                position=_pos(name.pos),
            )
        entry = pg_builtins.type_by_name(names[-1])
        if (len(names) == 2 and names[0] != "pg_catalog") or entry is None:
            raise InvalidFilterError(
                INVALID_EXPRESSION,
                sqlstate="0A000",
                detail=TYPE_DETAIL,
                hint=f'"{shown}" is not a built-in type of PostgreSQL.',
                position=_pos(location if location >= 0 else name.pos),
            )
        typmod = self._typmod(entry.name, name)
        return entry.oid, typmod

    def _typmod(self, typname: str, name: ast.TypeName) -> int:
        mods = name.typmods
        if not mods:
            return -1
        shown = name.sql_name or typname
        if typname not in _TYPMOD_TYPES:
            raise InvalidFilterError(
                f'type modifier is not allowed for type "{typname}"',
                sqlstate="42601",
                position=_pos(name.pos),
            )
        if typname == "numeric":
            if len(mods) > 2:
                raise InvalidFilterError(
                    "invalid NUMERIC type modifier", sqlstate="22023", position=_pos(name.pos)
                )
            precision = mods[0]
            scale = mods[1] if len(mods) == 2 else 0
            if not 1 <= precision <= 1000:
                raise InvalidFilterError(
                    f"NUMERIC precision {precision} must be between 1 and 1000",
                    sqlstate="22023",
                    position=_pos(name.pos),
                )
            if not -1000 <= scale <= 1000:
                raise InvalidFilterError(
                    f"NUMERIC scale {scale} must be between -1000 and 1000",
                    sqlstate="22023",
                    position=_pos(name.pos),
                )
            return ((precision << 16) | (scale & 0x7FF)) + 4
        if typname in ("varchar", "bpchar"):
            if len(mods) != 1:
                raise InvalidFilterError(
                    f"invalid type modifier for {shown}", sqlstate="22023", position=_pos(name.pos)
                )
            if mods[0] < 1:
                raise InvalidFilterError(
                    f"length for type {typname} must be at least 1",
                    sqlstate="22023",
                    position=_pos(name.pos),
                )
            if mods[0] > 10485760:
                raise InvalidFilterError(
                    f"length for type {typname} cannot exceed 10485760",
                    sqlstate="22023",
                    position=_pos(name.pos),
                )
            return mods[0] + 4
        if len(mods) != 1:
            raise InvalidFilterError(
                "invalid type modifier", sqlstate="22023", position=_pos(name.pos)
            )
        if mods[0] < 0:
            raise InvalidFilterError(
                f"{typname.upper()}({mods[0]}) precision must not be negative",
                sqlstate="22023",
                position=_pos(name.pos),
            )
        return min(mods[0], 6)

    def coerce(
        self,
        node: Bound,
        target: int,
        typmod: int,
        context: CoercionContext,
        location: int,
        *,
        explicit: bool = False,
    ) -> Bound:
        """coerce_to_target_type: ``node`` as ``target`` (and ``typmod``)."""
        explicit = explicit or context == CoercionContext.EXPLICIT
        if node.type == target:
            result = node
        elif node.type == UNKNOWN:
            result = self._coerce_unknown(node, target, location)
        elif _is_generic(target) or target == pg_builtins.ANY:
            return node
        else:
            path, cast = pg_builtins.find_coercion_pathway(target, node.type, context)
            result = self._apply_path(node, target, path, cast, location, context=context)
        return self._apply_typmod(result, target, typmod, explicit, location)

    def _coerce_unknown(self, node: Bound, target: int, location: int) -> Bound:
        if isinstance(node, SubLink):
            return replace(node, type=target)
        if isinstance(node, CollateExpr):
            inner = self._coerce_unknown(node.arg, target, location)
            return replace(node, arg=inner, type=target, typmod=inner.typmod)
        assert isinstance(node, Const)
        if node.value is None:
            return Const(None, target, -1, node.location)
        assert isinstance(node.value, str)
        if target in datums.SUPPORTED_TYPES:
            try:
                value = datums.input_value(target, node.value)
            except FilterEvaluationError as exc:
                raise InvalidFilterError(
                    exc.message,
                    sqlstate=exc.sqlstate,
                    detail=exc.detail,
                    hint=exc.hint,
                    position=_pos(node.location),
                ) from None
            except UnsupportedFilterError as exc:
                exc.position = _pos(node.location)
                raise
            return Const(value, target, -1, leftmost(node.location, location))
        entry = pg_builtins.type_entry(target)
        if target >= pg_builtins.FIRST_NORMAL_OBJECT_ID or entry is None:
            raise _walker_error(TYPE_DETAIL, node.location)
        # a built-in type the client does not evaluate: kept as text, refused after the
        # server's own checks (which may reject the expression for another reason first)
        return Const(node.value, target, -1, leftmost(node.location, location))

    def _apply_path(
        self,
        node: Bound,
        target: int,
        path: CoercionPath,
        cast: CastEntry | None,
        location: int,
        *,
        context: CoercionContext,
    ) -> Bound:
        location = leftmost(location, node.location)
        if path == CoercionPath.RELABEL:
            return RelabelType(node, target, -1, location)
        if path == CoercionPath.VIA_IO:
            return CoerceViaIO(node, target, -1, location)
        if path == CoercionPath.FUNC:
            assert cast is not None
            args: tuple[Bound, ...] = (node,)
            if cast.nargs >= 2:
                args += (Const(-1, pg_builtins.INT4, -1, -1),)
            if cast.nargs >= 3:
                args += (Const(context == CoercionContext.EXPLICIT, BOOL, -1, -1),)
            return Call("cast", f"{format_type(node.type)} to {format_type(target)}",
                        cast.implementation, args, target, -1, cast.volatility, True,
                        location)  # fmt: skip
        if path == CoercionPath.ARRAY:
            raise UnsupportedFilterError(
                "array casts are not supported", sqlstate="0A000", position=_pos(location)
            )
        raise InvalidFilterError(
            f"cannot cast type {format_type(node.type)} to {format_type(target)}",
            sqlstate="42846",
            position=_pos(location),
        )

    def _apply_typmod(
        self, node: Bound, target: int, typmod: int, explicit: bool, location: int
    ) -> Bound:
        if typmod < 0 or typmod == node.typmod:
            return node
        cast = pg_builtins.length_coercion(target)
        if cast is None:
            return RelabelType(node, target, typmod, leftmost(location, node.location))
        args: tuple[Bound, ...] = (node, Const(typmod, pg_builtins.INT4, -1, -1))
        if cast.nargs >= 3:
            args += (Const(explicit, BOOL, -1, -1),)
        return Call("cast", f"{format_type(target)} length coercion", cast.implementation,
                    args, target, typmod, cast.volatility, True,
                    leftmost(location, node.location))  # fmt: skip

    def coerce_to_boolean(self, node: Bound, what: str) -> Bound:
        if node.type == BOOL:
            return node
        if node.type == UNKNOWN:
            return self.coerce(node, BOOL, -1, CoercionContext.ASSIGNMENT, node.location)
        path, cast = pg_builtins.find_coercion_pathway(BOOL, node.type, CoercionContext.ASSIGNMENT)
        if path == CoercionPath.NONE:
            raise InvalidFilterError(
                f"argument of {what} must be type boolean, not type {format_type(node.type)}",
                sqlstate="42804",
                position=_pos(node.location),
            )
        return self._apply_path(
            node, BOOL, path, cast, node.location, context=CoercionContext.ASSIGNMENT
        )

    def coerce_to_common(self, node: Bound, target: int, what: str) -> Bound:
        if node.type == target:
            return node
        if node.type == UNKNOWN:
            return self.coerce(node, target, -1, CoercionContext.IMPLICIT, node.location)
        if not pg_builtins.can_coerce([node.type], [target], CoercionContext.IMPLICIT):
            raise InvalidFilterError(
                f"{what} could not convert type {format_type(node.type)} to {format_type(target)}",
                sqlstate="42846",
                position=_pos(node.location),
            )
        return self.coerce(node, target, -1, CoercionContext.IMPLICIT, node.location)


def cond_ast_pos(node: ast.Expr) -> int:
    return getattr(node, "pos", -1)


def _is_generic(oid: int) -> bool:
    return pg_builtins.is_polymorphic(oid) or oid in (pg_builtins.ANY, 2249)


def _resolve_generic(result: int, declared: Sequence[int], args: Sequence[Bound]) -> int:
    for target, arg in zip(declared, args, strict=True):
        if target == result and arg.type != UNKNOWN:
            return arg.type
    return result


def _common_typmod(nodes: Sequence[Bound]) -> int:
    typmods = {n.typmod for n in nodes}
    return typmods.pop() if len(typmods) == 1 else -1


def bind_expression(expr: ast.Expr, relation: Relation) -> Bound:
    """Bind ``expr`` to ``relation`` (PostgreSQL's parse analysis of a publication WHERE)."""
    return Binder(relation).bind(expr)
