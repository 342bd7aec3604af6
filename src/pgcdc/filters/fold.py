"""Constant folding, as the planner's eval_const_expressions does it when pgoutput prepares a
row filter (ExecPrepareExpr): it decides which errors a filter raises and when.

- a call whose arguments are all constants is evaluated now; a strict call with a constant
  NULL argument becomes NULL (after its other arguments were folded);
- AND/OR are flattened, constant FALSE (OR) / TRUE (AND) arguments dropped, a constant TRUE
  (OR) / FALSE (AND) decides the result and the arguments after it are never folded;
- CASE drops WHEN arms that are constantly false or NULL; a constantly true arm becomes the
  result and nothing after it is folded; COALESCE drops constant NULLs and stops at the first
  non-NULL constant.

An error while folding makes the whole filter fail for every row (the server fails to prepare
it): ``fold`` returns an ``ErrorExpr`` then. ``1/0 = 1 OR a > 0`` therefore always fails, while
``CASE WHEN TRUE THEN 1 ELSE 1/0 END`` never does.
"""

from __future__ import annotations

from dataclasses import replace

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
)
from pgcdc.filters.errors import FilterEvaluationError
from pgcdc.filters.evaluate import Evaluator
from pgcdc.filters.visitor import Visitor, visits

__all__ = ["fold"]

_BOOL = 16


def fold(node: Bound) -> Bound:
    """The folded expression, or an ErrorExpr if folding raised."""
    try:
        return _Folder().visit(node)
    except FilterEvaluationError as exc:
        return ErrorExpr(exc, node.type, node.location)


def _is_const(node: Bound) -> bool:
    return isinstance(node, Const)


class _Folder(Visitor[Bound, Bound]):
    __slots__ = ("case_value",)

    def __init__(self) -> None:
        self.case_value: Const | None = None

    def _const(self, node: Bound, value: object) -> Const:
        return Const(value, node.type, node.typmod, node.location)

    def _evaluate(self, node: Bound) -> Const:
        return self._const(node, Evaluator(()).eval(node))

    # -- one handler per node type; leaves (Const, Var, Param, ...) stay as they are
    def generic_visit(self, node: Bound) -> Bound:
        return node

    @visits
    def _call(self, node: Call) -> Bound:
        args = tuple(self.visit(a) for a in node.args)
        node = replace(node, args=args)
        if node.strict and any(isinstance(a, Const) and a.value is None for a in args):
            return self._const(node, None)
        if all(_is_const(a) for a in args):
            return self._evaluate(node)
        return node

    @visits
    def _bool(self, node: BoolExpr) -> Bound:
        if node.kind == "not":
            arg = self.visit(node.args[0])
            if isinstance(arg, Const):
                return self._const(node, None if arg.value is None else not arg.value)
            return replace(node, args=(arg,))
        return self._and_or(node)

    @visits
    def _test(self, node: NullTest | BooleanTest) -> Bound:
        arg = self.visit(node.arg)
        folded = replace(node, arg=arg)
        return self._evaluate(folded) if isinstance(arg, Const) else folded

    @visits
    def _distinct(self, node: DistinctExpr | NullIfExpr) -> Bound:
        eq = node.eq
        args = tuple(self.visit(a) for a in eq.args)
        folded = replace(node, eq=replace(eq, args=args))
        if isinstance(node, NullIfExpr):
            # either argument NULL: they cannot be equal, the result is the first one
            for a in args:
                if isinstance(a, Const) and a.value is None:
                    return args[0]
        return self._evaluate(folded) if all(_is_const(a) for a in args) else folded

    @visits
    def _any_all(self, node: ScalarArrayOpExpr) -> Bound:
        left = self.visit(node.left)
        array = self.visit(node.array)
        folded = replace(node, left=left, array=array)
        if (
            _is_const(left)
            and isinstance(array, ArrayExpr)
            and all(_is_const(e) for e in array.elements)
        ):
            return self._evaluate(folded)
        return folded

    @visits
    def _array(self, node: ArrayExpr) -> Bound:
        return replace(node, elements=tuple(self.visit(e) for e in node.elements))

    @visits
    def _case_test(self, node: CaseTestExpr) -> Bound:
        return self.case_value if self.case_value is not None else node

    @visits
    def _min_max(self, node: MinMaxExpr) -> Bound:
        args = tuple(self.visit(a) for a in node.args)
        folded = replace(node, args=args)
        return self._evaluate(folded) if all(_is_const(a) for a in args) else folded

    @visits
    def _relabel(self, node: RelabelType | CollateExpr) -> Bound:
        arg = self.visit(node.arg)
        if isinstance(arg, Const):
            return Const(arg.value, node.type, node.typmod, arg.location)
        return replace(node, arg=arg)

    def _and_or(self, node: BoolExpr) -> Bound:
        is_or = node.kind == "or"
        pending = list(node.args)
        kept: list[Bound] = []
        saw_null = False
        while pending:
            arg = pending.pop(0)
            if isinstance(arg, BoolExpr) and arg.kind == node.kind:
                pending = list(arg.args) + pending
                continue
            arg = self.visit(arg)
            if isinstance(arg, BoolExpr) and arg.kind == node.kind:
                pending = list(arg.args) + pending
                continue
            if isinstance(arg, Const):
                if arg.value is None:
                    saw_null = True
                elif arg.value is is_or:
                    return self._const(node, is_or)
                continue
            kept.append(arg)
        if saw_null:
            kept.append(Const(None, _BOOL, -1, -1))
        if not kept:
            return self._const(node, not is_or)
        if len(kept) == 1:
            return kept[0]
        return replace(node, args=tuple(kept))

    @visits
    def _case(self, node: CaseExpr) -> Bound:
        arg = None if node.arg is None else self.visit(node.arg)
        saved = self.case_value
        self.case_value = arg if isinstance(arg, Const) else None
        try:
            whens: list[tuple[Bound, Bound]] = []
            default: Bound | None = None
            for cond, result in node.whens:
                folded = self.visit(cond)
                if isinstance(folded, Const):
                    if folded.value is not True:
                        continue
                    default = self.visit(result)
                    break
                whens.append((folded, self.visit(result)))
            if default is None:
                default = self.visit(node.default)
        finally:
            self.case_value = saved
        if not whens:
            return default
        return replace(node, arg=arg, whens=tuple(whens), default=default)

    @visits
    def _coalesce(self, node: CoalesceExpr) -> Bound:
        args: list[Bound] = []
        for arg in node.args:
            folded = self.visit(arg)
            if isinstance(folded, Const):
                if folded.value is None:
                    continue
                if not args:
                    return folded
                args.append(folded)
                break
            args.append(folded)
        if not args:
            return self._const(node, None)
        return replace(node, args=tuple(args))
