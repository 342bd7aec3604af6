"""One typed visitor for the filters' trees: the binder (``ast`` to ``bound``), the folder, the
SQL printer and the evaluator all dispatch through it.

A subclass marks one method per node type with ``@visits``; the types come from the annotation
of the method's node parameter, unions included, as ``functools.singledispatch`` reads them.
``visit(node)`` is one dict lookup by the node's exact type (a subclass of a registered type is
resolved through its MRO once, then cached), then the call. ``functools.singledispatchmethod``
would do the same at many times the cost per call, and the evaluator visits every node of a
filter for every row.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

__all__ = ["Visitor", "visits"]

N = TypeVar("N")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

_VISITS = "__pgcdc_visits__"


def visits(method: F) -> F:
    """Register ``method`` (``def m(self, node: SomeNode | OtherNode) -> ...``) for the node
    types its ``node`` parameter is annotated with."""
    setattr(method, _VISITS, True)
    return method


def _node_types(method: Callable[..., Any]) -> tuple[type, ...]:
    params = list(inspect.signature(method).parameters.values())
    if len(params) != 2:
        raise TypeError(f"{method.__qualname__}: a visit method takes (self, node)")
    annotation: Any = params[1].annotation
    if isinstance(annotation, str):  # postponed evaluation (from __future__ import annotations)
        annotation = eval(annotation, method.__globals__)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        found = typing.get_args(annotation)
    else:
        found = (annotation,)
    if not all(isinstance(t, type) for t in found):
        raise TypeError(f"{method.__qualname__}: annotate its node parameter with node classes")
    return found


class Visitor(Generic[N, R]):
    """Dispatches ``visit(node)`` to the method registered for the node's type; a node type
    without one goes to ``generic_visit``."""

    __slots__ = ()
    _handlers: ClassVar[dict[type, Callable[[Any, Any], Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type, Callable[[Any, Any], Any]] = {}
        for klass in reversed(cls.__mro__):
            for attr in vars(klass).values():
                if callable(attr) and getattr(attr, _VISITS, False):
                    table.update(dict.fromkeys(_node_types(attr), attr))
        cls._handlers = table

    def visit(self, node: N) -> R:
        handler = self._handlers.get(type(node))
        if handler is None:
            handler = self._resolve(type(node))
        result: R = handler(self, node)
        return result

    @classmethod
    def _resolve(cls, node_type: type) -> Callable[[Any, Any], Any]:
        for base in node_type.__mro__[1:]:
            handler = cls._handlers.get(base)
            if handler is not None:
                break
        else:
            handler = cls.generic_visit
        cls._handlers[node_type] = handler
        return handler

    def generic_visit(self, node: N) -> R:
        """A node type without a visit method: a bug of the tree's producer."""
        raise TypeError(f"{type(self).__name__} has no visit method for a {type(node).__name__}")
