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

import functools

from pgcdc.filters import ast
from pgcdc.filters.errors import InvalidFilterError
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
    return _Printer().print(node)


def render(node: ast.Expr) -> RowFilterSQL:
    """``to_sql(node)`` as the ``RowFilterSQL`` that CREATE PUBLICATION and the snapshot and
    verification queries accept: the one place text becomes one."""
    return RowFilterSQL(to_sql(node))


class _Printer:
    @functools.singledispatchmethod
    def print(self, node: ast.Expr) -> str:
        """Print one node: the handler registered for its type (below)."""
        raise TypeError(f"no SQL for a {type(node).__name__} node")  # a parser bug

    @print.register
    def _ColumnRef(self, node: ast.ColumnRef) -> str:
        return _names(node.names)

    @print.register
    def _NumberLiteral(self, node: ast.NumberLiteral) -> str:
        return f"({node.text})" if node.text.startswith("-") else node.text

    @print.register
    def _StringLiteral(self, node: ast.StringLiteral) -> str:
        return quote_literal(node.value)

    @print.register
    def _NullLiteral(self, node: ast.NullLiteral) -> str:
        return "NULL"

    @print.register
    def _BoolLiteral(self, node: ast.BoolLiteral) -> str:
        return "TRUE" if node.value else "FALSE"

    @print.register
    def _TypedLiteral(self, node: ast.TypedLiteral) -> str:
        return f"CAST({quote_literal(node.value)} AS {type_sql(node.type)})"

    @print.register
    def _TypeCast(self, node: ast.TypeCast) -> str:
        return f"CAST({self.print(node.arg)} AS {type_sql(node.type)})"

    @print.register
    def _Collate(self, node: ast.Collate) -> str:
        return f"({self.print(node.arg)} COLLATE {_names(node.collation)})"

    def _op(self, op: str, schema: str | None) -> str:
        return op if schema is None else f"OPERATOR({_ident(schema)}.{op})"

    @print.register
    def _OpExpr(self, node: ast.OpExpr) -> str:
        op = self._op(node.op, node.schema)
        if node.left is None:
            return f"({op} {self.print(node.right)})"
        return f"({self.print(node.left)} {op} {self.print(node.right)})"

    @print.register
    def _BoolOp(self, node: ast.BoolOp) -> str:
        joiner = " AND " if node.kind == "and" else " OR "
        return "(" + joiner.join(self.print(a) for a in node.args) + ")"

    @print.register
    def _Not(self, node: ast.Not) -> str:
        return f"(NOT {self.print(node.arg)})"

    @print.register
    def _NullTest(self, node: ast.NullTest) -> str:
        return f"({self.print(node.arg)} IS {'NOT ' if node.negated else ''}NULL)"

    @print.register
    def _BooleanTest(self, node: ast.BooleanTest) -> str:
        neg = "NOT " if node.negated else ""
        return f"({self.print(node.arg)} IS {neg}{node.value.upper()})"

    @print.register
    def _Distinct(self, node: ast.Distinct) -> str:
        neg = "NOT " if node.negated else ""
        return f"({self.print(node.left)} IS {neg}DISTINCT FROM {self.print(node.right)})"

    @print.register
    def _Between(self, node: ast.Between) -> str:
        neg = "NOT " if node.negated else ""
        sym = "SYMMETRIC " if node.symmetric else ""
        return (
            f"({self.print(node.arg)} {neg}BETWEEN {sym}{self.print(node.low)} AND "
            f"{self.print(node.high)})"
        )

    @print.register
    def _InList(self, node: ast.InList) -> str:
        items = ", ".join(self.print(i) for i in node.items)
        return f"({self.print(node.arg)} {'NOT ' if node.negated else ''}IN ({items}))"

    @print.register
    def _Like(self, node: ast.Like) -> str:
        op = ("NOT " if node.negated else "") + ("ILIKE" if node.case_insensitive else "LIKE")
        escape = "" if node.escape is None else f" ESCAPE {self.print(node.escape)}"
        return f"({self.print(node.arg)} {op} {self.print(node.pattern)}{escape})"

    @print.register
    def _ArrayLiteral(self, node: ast.ArrayLiteral) -> str:
        return "ARRAY[" + ", ".join(self.print(i) for i in node.items) + "]"

    @print.register
    def _QuantifiedOp(self, node: ast.QuantifiedOp) -> str:
        op = self._op(node.op, node.schema)
        return (
            f"({self.print(node.left)} {op} {node.quantifier.upper()} ({self.print(node.array)}))"
        )

    @print.register
    def _Case(self, node: ast.Case) -> str:
        parts = ["CASE"]
        if node.operand is not None:
            parts.append(self.print(node.operand))
        for cond, result in node.whens:
            parts.append(f"WHEN {self.print(cond)} THEN {self.print(result)}")
        if node.default is not None:
            parts.append(f"ELSE {self.print(node.default)}")
        parts.append("END")
        return " ".join(parts)

    @print.register
    def _Coalesce(self, node: ast.Coalesce) -> str:
        return "COALESCE(" + ", ".join(self.print(a) for a in node.args) + ")"

    @print.register
    def _NullIf(self, node: ast.NullIf) -> str:
        return f"NULLIF({self.print(node.left)}, {self.print(node.right)})"

    @print.register
    def _MinMax(self, node: ast.MinMax) -> str:
        return node.kind.upper() + "(" + ", ".join(self.print(a) for a in node.args) + ")"

    @print.register
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
            return f"EXTRACT({self.print(field)} FROM {self.print(arg)})"
        args = "*" if node.star else ", ".join(self.print(a) for a in node.args)
        return f"{_func_name(node.names)}({args})"

    @print.register
    def _SpecialValue(self, node: ast.SpecialValue) -> str:
        return node.name.upper()

    @print.register
    def _Subquery(self, node: ast.Subquery) -> str:
        # its text was skipped, not parsed: it never goes back to the server
        raise InvalidFilterError(_INVALID, sqlstate="0A000", detail=_ONLY, position=node.pos + 1)
