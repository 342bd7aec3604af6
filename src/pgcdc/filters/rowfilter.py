"""``RowFilter`` (a parsed publication WHERE expression) and ``BoundFilter`` (that expression
bound to one relation, ready to test pgoutput tuples).

``RowFilter.parse(text)`` parses once; ``bind(relation)`` resolves it against a pgoutput
Relation message (columns, types, replica identity) the way the server analyses a publication
WHERE clause, then folds constants as the server does when it prepares the filter;
``BoundFilter.matches(values)`` converts the referenced column values of a pgoutput tuple
(text or binary) and evaluates. ``to_sql()`` prints SQL the server accepts for the same filter;
``sql()`` gives it as the ``RowFilterSQL`` that the layers writing SQL take (never the text as
written).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pgcdc.filters import ast, datums
from pgcdc.filters.binder import Binder, children
from pgcdc.filters.bound import BoolExpr, Bound, Var
from pgcdc.filters.errors import FilterEvaluationError, RowFilterError
from pgcdc.filters.evaluate import Evaluator
from pgcdc.filters.fold import fold
from pgcdc.filters.parser import parse_expression
from pgcdc.filters.sql import render, to_sql
from pgcdc.filters.validate import ColumnCollations, prepare
from pgcdc.protocol.filter_sql import RowFilterSQL
from pgcdc.protocol.messages import Relation, TupleValue, UnchangedToast
from pgcdc.protocol.values import ConversionError, TypeRegistry

__all__ = ["BoundFilter", "RowFilter"]


@dataclass(frozen=True, slots=True)
class RowFilter:
    """A parsed row filter expression, not yet bound to a table."""

    text: str
    expression: ast.Expr = field(compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> RowFilter:
        """Parse a filter (the expression of ``WHERE (...)``); raises RowFilterError."""
        return cls(text, parse_expression(text))

    def bind(
        self,
        relation: Relation,
        registry: TypeRegistry | None = None,
        *,
        publishes_update_or_delete: bool = True,
        collation: str = "C",
        column_collations: ColumnCollations | None = None,
    ) -> BoundFilter:
        """This filter bound to ``relation`` (a pgoutput Relation message).

        ``publishes_update_or_delete``: the publication publishes UPDATE or DELETE, so the
        filter may only use replica identity columns (the Relation's key flags; every column
        for REPLICA IDENTITY FULL). ``collation`` is the database's collation, which text
        columns and literals use: text ordering and case mapping are refused under anything
        but C/POSIX (and C.UTF-8's case mapping); ``column_collations`` the columns declared
        with another (``source.column_collations``). ``registry`` converts the column values
        (built-in types by default).
        """
        try:
            bound = Binder(relation).bind(self.expression)
            prepared = prepare(
                bound,
                relation,
                publishes_update_or_delete=publishes_update_or_delete,
                collation=collation,
                column_collations=column_collations or {},
            )
        except RowFilterError as exc:
            raise exc.with_expression(self.text) from None
        return BoundFilter((self,), relation, prepared, fold(prepared), registry)

    def to_sql(self) -> str:
        """SQL for ``CREATE PUBLICATION ... WHERE (<this>)`` or a query's WHERE, printed from
        the parse tree; RowFilterError for what cannot be printed from it (sub-SELECTs)."""
        try:
            return to_sql(self.expression)
        except RowFilterError as exc:
            raise exc.with_expression(self.text) from None

    def sql(self) -> RowFilterSQL:
        """``to_sql()`` as a ``RowFilterSQL``, what CREATE PUBLICATION and queries take."""
        try:
            return render(self.expression)
        except RowFilterError as exc:
            raise exc.with_expression(self.text) from None

    @staticmethod
    def any_of_sql(filters: Sequence[RowFilter]) -> RowFilterSQL:
        """The OR of ``filters`` as one ``RowFilterSQL`` (several publications' filters),
        printed from one OR node over their trees."""
        if not filters:
            raise ValueError("any_of_sql needs at least one filter")
        if len(filters) == 1:
            return filters[0].sql()
        either = ast.BoolOp("or", tuple(f.expression for f in filters), -1)
        try:
            return render(either)
        except RowFilterError as exc:
            raise exc.with_expression(" OR ".join(f"({f.text})" for f in filters)) from None

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class BoundFilter:
    """A row filter bound to one relation. ``expression`` is folded and ready to evaluate;
    ``prepared`` is the unfolded tree (what ``any_of`` combines)."""

    sources: tuple[RowFilter, ...]
    relation: Relation
    prepared: Bound = field(repr=False)
    expression: Bound = field(repr=False)
    registry: TypeRegistry | None = field(default=None, repr=False, compare=False)
    columns: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.columns:
            used = sorted({v.index for v in _vars(self.expression) if v.index >= 0})
            object.__setattr__(self, "columns", tuple(used))

    @classmethod
    def any_of(cls, filters: Sequence[BoundFilter]) -> BoundFilter:
        """The OR of several filters of one relation, folded together as pgoutput combines
        the filters of several publications (make_orclause, then ExecPrepareExpr)."""
        if not filters:
            raise ValueError("any_of needs at least one filter")
        if len(filters) == 1:
            return filters[0]
        first = filters[0]
        combined = BoolExpr("or", tuple(f.prepared for f in filters), -1)
        sources = tuple(s for f in filters for s in f.sources)
        return cls(sources, first.relation, combined, fold(combined), first.registry)

    @property
    def text(self) -> str:
        """The filter text (filters combined by ``any_of`` joined with OR)."""
        if len(self.sources) == 1:
            return self.sources[0].text
        return " OR ".join(f"({s.text})" for s in self.sources)

    def evaluate(self, values: Sequence[TupleValue]) -> bool | None:
        """The filter's value for a pgoutput tuple: True, False or None (NULL)."""
        relation = self.relation
        if len(values) != len(relation.columns):
            raise ValueError(
                f"tuple has {len(values)} values but relation "
                f'"{relation.namespace}.{relation.name}" has {len(relation.columns)} columns'
            )
        row: list[object] = [None] * len(values)
        for index in self.columns:
            value = values[index]
            if value is None:
                continue
            column = relation.columns[index]
            if isinstance(value, UnchangedToast):
                raise FilterEvaluationError(
                    f'cannot evaluate the row filter of "{relation.namespace}.{relation.name}": '
                    f'column "{column.name}" is an unchanged TOASTed value the server did not '
                    "send",
                    sqlstate="55000",
                    hint="Filter on replica identity columns (the server sends their old "
                    "values), or use REPLICA IDENTITY FULL.",
                )
            try:
                row[index] = datums.from_tuple_value(value, column.type_id, self.registry)
            except ConversionError as exc:
                raise FilterEvaluationError(
                    f'cannot read column "{column.name}" for the row filter: {exc}',
                    sqlstate="22P02",
                ) from None
        result = Evaluator(row).eval(self.expression)
        assert result is None or isinstance(result, bool)
        return result

    def matches(self, values: Sequence[TupleValue]) -> bool:
        """Whether a pgoutput tuple passes: NULL counts as not passing, like the server.

        Raises FilterEvaluationError where the server's evaluation raises (division by zero,
        out-of-range results, ...).
        """
        return self.evaluate(values) is True

    def to_sql(self) -> str:
        """SQL of the filter (several combined filters joined with OR)."""
        if len(self.sources) == 1:
            return self.sources[0].to_sql()
        return "(" + " OR ".join(s.to_sql() for s in self.sources) + ")"


def _vars(node: Bound) -> list[Var]:
    if isinstance(node, Var):
        return [node]
    out: list[Var] = []
    for child in children(node):
        out += _vars(child)
    return out
