"""Printing a row filter back as SQL: an expression PostgreSQL parses into the same tree, for a
publication's ``WHERE (...)`` and for a snapshot query's ``WHERE``.

Every compound expression is parenthesized, identifiers (columns, collations, types written
as names) are always double-quoted, functions are qualified with pg_catalog so a function of
the same name earlier in search_path cannot stand in, strings are quoted as quote_literal does,
and negative numbers keep their sign attached (``(-5)``) so the server folds them into the
literal just as the parser here did.

Nothing is printed that was not parsed: a sub-SELECT (kept as unparsed text by the parser) and
aggregate or window syntax (which the tree does not keep) are refused with PostgreSQL's error,
so the output is exactly one expression built from the tree. ``render`` wraps it as the
``RowFilterSQL`` that the layers writing SQL accept.
"""

from __future__ import annotations

from pgcdc.filters import ast
from pgcdc.filters.errors import InvalidFilterError
from pgcdc.filters.visitor import Visitor, visits
from pgcdc.protocol.filter_sql import RowFilterSQL
from pgcdc.protocol.identifiers import quote_literal

__all__ = ["render", "to_sql", "type_sql"]

# PostgreSQL's answer to a sub-SELECT in a publication WHERE clause
_INVALID = "invalid publication WHERE expression"
_ONLY = (
    "Only columns, constants, built-in operators, built-in data types, built-in collations, "
    "and immutable built-in functions are allowed."
)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _names(names: tuple[str, ...]) -> str:
    return ".".join(_ident(n) for n in names)


def type_sql(typ: ast.TypeName) -> str:
    """A type name as SQL (keyword spellings for SQL-standard types)."""
    mods = f"({', '.join(str(m) for m in typ.typmods)})" if typ.typmods else ""
    if typ.sql_name is not None:
        for word in ("timestamp", "time"):
            if typ.sql_name.startswith(word + " "):
                return word + mods + typ.sql_name[len(word) :]
        return typ.sql_name + mods
    return _names(typ.names) + mods


def _func_name(names: tuple[str, ...]) -> str:
    if len(names) == 1 or names[0] == "pg_catalog":
        return "pg_catalog." + _ident(names[-1])
    return _names(names)


def to_sql(node: ast.Expr) -> str:
    """The SQL text of an unbound expression; InvalidFilterError for what cannot be printed
    from the tree (sub-SELECTs, aggregate and window clauses)."""
    return _Printer().visit(node)


def render(node: ast.Expr) -> RowFilterSQL:
    """``to_sql(node)`` as the ``RowFilterSQL`` that CREATE PUBLICATION and the snapshot and
    verification queries accept: the one place text becomes one."""
    return RowFilterSQL(to_sql(node))


class _Printer(Visitor[ast.Expr, str]):
    def generic_visit(self, node: ast.Expr) -> str:
        raise TypeError(f"no SQL for a {type(node).__name__} node")  # a parser bug

    @visits
    def _ColumnRef(self, node: ast.ColumnRef) -> str:
        return _names(node.names)

    @visits
    def _NumberLiteral(self, node: ast.NumberLiteral) -> str:
        return f"({node.text})" if node.text.startswith("-") else node.text

    @visits
    def _StringLiteral(self, node: ast.StringLiteral) -> str:
        return quote_literal(node.value)

    @visits
    def _NullLiteral(self, node: ast.NullLiteral) -> str:
        return "NULL"

    @visits
    def _BoolLiteral(self, node: ast.BoolLiteral) -> str:
        return "TRUE" if node.value else "FALSE"

    @visits
    def _TypedLiteral(self, node: ast.TypedLiteral) -> str:
        return f"CAST({quote_literal(node.value)} AS {type_sql(node.type)})"

    @visits
    def _TypeCast(self, node: ast.TypeCast) -> str:
        return f"CAST({self.visit(node.arg)} AS {type_sql(node.type)})"

    @visits
    def _Collate(self, node: ast.Collate) -> str:
        return f"({self.visit(node.arg)} COLLATE {_names(node.collation)})"

    def _op(self, op: str, schema: str | None) -> str:
        return op if schema is None else f"OPERATOR({_ident(schema)}.{op})"

    @visits
    def _OpExpr(self, node: ast.OpExpr) -> str:
        op = self._op(node.op, node.schema)
        if node.left is None:
            return f"({op} {self.visit(node.right)})"
        return f"({self.visit(node.left)} {op} {self.visit(node.right)})"

    @visits
    def _BoolOp(self, node: ast.BoolOp) -> str:
        joiner = " AND " if node.kind == "and" else " OR "
        return "(" + joiner.join(self.visit(a) for a in node.args) + ")"

    @visits
    def _Not(self, node: ast.Not) -> str:
        return f"(NOT {self.visit(node.arg)})"

    @visits
    def _NullTest(self, node: ast.NullTest) -> str:
        return f"({self.visit(node.arg)} IS {'NOT ' if node.negated else ''}NULL)"

    @visits
    def _BooleanTest(self, node: ast.BooleanTest) -> str:
        neg = "NOT " if node.negated else ""
        return f"({self.visit(node.arg)} IS {neg}{node.value.upper()})"

    @visits
    def _Distinct(self, node: ast.Distinct) -> str:
        neg = "NOT " if node.negated else ""
        return f"({self.visit(node.left)} IS {neg}DISTINCT FROM {self.visit(node.right)})"

    @visits
    def _Between(self, node: ast.Between) -> str:
        neg = "NOT " if node.negated else ""
        sym = "SYMMETRIC " if node.symmetric else ""
        return (
            f"({self.visit(node.arg)} {neg}BETWEEN {sym}{self.visit(node.low)} AND "
            f"{self.visit(node.high)})"
        )

    @visits
    def _InList(self, node: ast.InList) -> str:
        items = ", ".join(self.visit(i) for i in node.items)
        return f"({self.visit(node.arg)} {'NOT ' if node.negated else ''}IN ({items}))"

    @visits
    def _Like(self, node: ast.Like) -> str:
        op = ("NOT " if node.negated else "") + ("ILIKE" if node.case_insensitive else "LIKE")
        escape = "" if node.escape is None else f" ESCAPE {self.visit(node.escape)}"
        return f"({self.visit(node.arg)} {op} {self.visit(node.pattern)}{escape})"

    @visits
    def _ArrayLiteral(self, node: ast.ArrayLiteral) -> str:
        return "ARRAY[" + ", ".join(self.visit(i) for i in node.items) + "]"

    @visits
    def _QuantifiedOp(self, node: ast.QuantifiedOp) -> str:
        op = self._op(node.op, node.schema)
        return (
            f"({self.visit(node.left)} {op} {node.quantifier.upper()} ({self.visit(node.array)}))"
        )

    @visits
    def _Case(self, node: ast.Case) -> str:
        parts = ["CASE"]
        if node.operand is not None:
            parts.append(self.visit(node.operand))
        for cond, result in node.whens:
            parts.append(f"WHEN {self.visit(cond)} THEN {self.visit(result)}")
        if node.default is not None:
            parts.append(f"ELSE {self.visit(node.default)}")
        parts.append("END")
        return " ".join(parts)

    @visits
    def _Coalesce(self, node: ast.Coalesce) -> str:
        return "COALESCE(" + ", ".join(self.visit(a) for a in node.args) + ")"

    @visits
    def _NullIf(self, node: ast.NullIf) -> str:
        return f"NULLIF({self.visit(node.left)}, {self.visit(node.right)})"

    @visits
    def _MinMax(self, node: ast.MinMax) -> str:
        return node.kind.upper() + "(" + ", ".join(self.visit(a) for a in node.args) + ")"

    @visits
    def _FuncCall(self, node: ast.FuncCall) -> str:
        if node.agg_clause is not None:
            # the tree does not keep the clause: printing without it would change the filter
            raise InvalidFilterError(
                f"{node.agg_clause} is not allowed in a publication WHERE expression "
                "(aggregate and window functions are not allowed in WHERE)",
                sqlstate="42803",
                position=node.pos + 1,
            )
        if node.syntax == "extract" and len(node.args) == 2:
            field, arg = node.args
            return f"EXTRACT({self.visit(field)} FROM {self.visit(arg)})"
        args = "*" if node.star else ", ".join(self.visit(a) for a in node.args)
        return f"{_func_name(node.names)}({args})"

    @visits
    def _SpecialValue(self, node: ast.SpecialValue) -> str:
        return node.name.upper()

    @visits
    def _Subquery(self, node: ast.Subquery) -> str:
        # its text was skipped, not parsed: it never goes back to the server
        raise InvalidFilterError(_INVALID, sqlstate="0A000", detail=_ONLY, position=node.pos + 1)
