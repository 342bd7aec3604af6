"""Evaluation of a bound filter against one row: a visitor with SQL's three-valued logic,
following the executor (execExprInterp.c) where order matters for errors:

- function and operator arguments are all evaluated, then a strict function returns NULL if
  any argument is NULL, without being called;
- AND stops at the first FALSE, OR at the first TRUE, CASE at the first true WHEN, COALESCE at
  the first non-NULL argument;
- ``x op ANY/ALL (array)`` evaluates ``x`` and every element first, then compares element by
  element, stopping at the first deciding result;
- IS DISTINCT FROM and NULLIF call = only when both sides are non-NULL; GREATEST and LEAST
  ignore NULLs and keep the first of equal values.

Values are in ``pgcdc.filters.datums``' representation; None is NULL.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgcdc.filters.bound import (
    ArrayExpr,
    BooleanTest,
    BoolExpr,
    Bound,
    Call,
    CaseExpr,
    CaseTestExpr,
    CoalesceExpr,
    CollateExpr,
    Const,
    DistinctExpr,
    ErrorExpr,
    MinMaxExpr,
    NullIfExpr,
    NullTest,
    RelabelType,
    ScalarArrayOpExpr,
    Var,
)
from pgcdc.filters.visitor import Visitor, visits

__all__ = ["Evaluator", "Row", "evaluate"]

Row = Sequence[object]


class Evaluator(Visitor[Bound, object]):
    """Evaluates bound expressions; ``row[var.index]`` is each column's value."""

    __slots__ = ("_case_values", "row")

    def __init__(self, row: Row = ()) -> None:
        self.row = row
        self._case_values: list[object] = []

    def eval(self, node: Bound) -> object:
        """The value of ``node`` for this row (None is NULL)."""
        return self.visit(node)

    @visits
    def var(self, node: Var) -> object:
        return self.row[node.index]

    @visits
    def const(self, node: Const) -> object:
        return node.value

    @visits
    def error(self, node: ErrorExpr) -> object:
        raise node.error.copy()

    @visits
    def call(self, node: Call) -> object:
        args = [self.visit(a) for a in node.args]
        return apply(node, args)

    @visits
    def bool_expr(self, node: BoolExpr) -> object:
        if node.kind == "not":
            value = self.visit(node.args[0])
            return None if value is None else not value
        stop = node.kind == "or"
        saw_null = False
        for arg in node.args:
            value = self.visit(arg)
            if value is None:
                saw_null = True
            elif value is stop:
                return stop
        return None if saw_null else not stop

    @visits
    def null_test(self, node: NullTest) -> object:
        value = self.visit(node.arg)
        return (value is not None) if node.negated else (value is None)

    @visits
    def boolean_test(self, node: BooleanTest) -> object:
        value = self.visit(node.arg)
        kind = node.kind
        if kind == "is_true":
            return value is True
        if kind == "is_not_true":
            return value is not True
        if kind == "is_false":
            return value is False
        if kind == "is_not_false":
            return value is not False
        if kind == "is_unknown":
            return value is None
        return value is not None

    @visits
    def distinct(self, node: DistinctExpr) -> object:
        left, right = (self.visit(a) for a in node.eq.args)
        if left is None or right is None:
            return (left is None) != (right is None)
        return not apply(node.eq, [left, right])

    @visits
    def nullif(self, node: NullIfExpr) -> object:
        left, right = (self.visit(a) for a in node.eq.args)
        if left is not None and right is not None and apply(node.eq, [left, right]):
            return None
        return left

    @visits
    def array(self, node: ArrayExpr) -> object:
        return [self.visit(e) for e in node.elements]

    @visits
    def scalar_array_op(self, node: ScalarArrayOpExpr) -> object:
        scalar = self.visit(node.left)
        elements = self.visit(node.array)
        if elements is None:
            return None
        assert isinstance(elements, list)
        use_or = node.use_or
        if not elements:
            return not use_or
        op = node.op
        if scalar is None and op.strict:
            return None
        saw_null = False
        for element in elements:
            if element is None and op.strict:
                result: object = None
            else:
                result = apply(op, [scalar, element])
            if result is None:
                saw_null = True
            elif result is use_or:
                return use_or
        return None if saw_null else not use_or

    @visits
    def case(self, node: CaseExpr) -> object:
        pushed = node.arg is not None
        if node.arg is not None:
            self._case_values.append(self.visit(node.arg))
        try:
            for cond, result in node.whens:
                if self.visit(cond) is True:
                    return self.visit(result)
            return self.visit(node.default)
        finally:
            if pushed:
                self._case_values.pop()

    @visits
    def case_test(self, node: CaseTestExpr) -> object:
        return self._case_values[-1]

    @visits
    def coalesce(self, node: CoalesceExpr) -> object:
        for arg in node.args:
            value = self.visit(arg)
            if value is not None:
                return value
        return None

    @visits
    def min_max(self, node: MinMaxExpr) -> object:
        compare = node.compare.fn
        assert compare is not None
        result: object = None
        for arg in node.args:
            value = self.visit(arg)
            if value is None:
                continue
            if result is None:
                result = value
                continue
            c = compare(result, value)
            assert isinstance(c, int)
            if (node.kind == "least" and c > 0) or (node.kind == "greatest" and c < 0):
                result = value
        return result

    @visits
    def relabel(self, node: RelabelType | CollateExpr) -> object:
        return self.visit(node.arg)


def apply(node: Call, args: list[object]) -> object:
    """Call a function on evaluated arguments (NULL in, NULL out when strict)."""
    if node.strict and any(a is None for a in args):
        return None
    fn = node.fn
    assert fn is not None, f"{node.implementation} has no implementation attached"
    return fn(*args)


def evaluate(node: Bound, row: Row = ()) -> object:
    """The value of ``node`` for ``row`` (None is NULL)."""
    return Evaluator(row).eval(node)
