"""The bound row filter expression: every name resolved to a column, an operator or a function
of the built-in catalog, every node typed. Node kinds are PostgreSQL's (primnodes.h): Var,
Const, FuncExpr/OpExpr (``Call``), BoolExpr, NullTest, BooleanTest, DistinctExpr, NullIfExpr,
ScalarArrayOpExpr, CaseExpr, CoalesceExpr, MinMaxExpr, RelabelType, CoerceViaIO, CollateExpr,
ArrayExpr, SQLValueFunction and SubLink, so that the validation walk and constant folding can
follow the server's code node for node.

``location`` is PostgreSQL's exprLocation of the node: the 0-based offset of its leftmost
token, as the server points its errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from pgcdc.filters.errors import RowFilterError

__all__ = [
    "ArrayCoerceExpr",
    "ArrayExpr",
    "BoolExpr",
    "BooleanTest",
    "Bound",
    "Call",
    "CaseExpr",
    "CaseTestExpr",
    "CoalesceExpr",
    "CoerceViaIO",
    "CollateExpr",
    "Const",
    "DistinctExpr",
    "ErrorExpr",
    "MinMaxExpr",
    "NullIfExpr",
    "NullTest",
    "RelabelType",
    "SQLValueFunction",
    "ScalarArrayOpExpr",
    "SubLink",
    "Var",
]

Implementation: TypeAlias = Callable[..., object]


@dataclass(frozen=True, slots=True)
class Var:
    """A column of the relation: ``index`` into the tuple, ``attnum`` < 0 for system columns."""

    index: int
    name: str
    type: int
    typmod: int
    location: int
    attnum: int = 1


@dataclass(frozen=True, slots=True)
class Const:
    """A constant in the evaluator's representation (None is NULL)."""

    value: object
    type: int
    typmod: int
    location: int


@dataclass(frozen=True, slots=True)
class Call:
    """A function call: FuncExpr (``kind`` 'func' or 'cast') or OpExpr ('op').

    ``implementation`` is pg_proc's prosrc, ``name`` what messages show. ``fn`` is set once
    the implementation is looked up (None until then and for unimplemented functions).
    """

    kind: Literal["func", "cast", "op"]
    name: str
    implementation: str
    args: tuple[Bound, ...]
    type: int
    typmod: int
    volatility: str
    strict: bool
    location: int
    fn: Implementation | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class BoolExpr:
    kind: Literal["and", "or", "not"]
    args: tuple[Bound, ...]
    location: int
    type: int = 16
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class NullTest:
    arg: Bound
    negated: bool
    location: int
    type: int = 16
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class BooleanTest:
    """``kind``: is_true, is_not_true, is_false, is_not_false, is_unknown, is_not_unknown."""

    arg: Bound
    kind: str
    location: int
    type: int = 16
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class DistinctExpr:
    """``left IS DISTINCT FROM right``, ``eq`` the resolved = operator."""

    eq: Call
    location: int
    type: int = 16
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class NullIfExpr:
    """NULLIF(a, b): ``eq`` the resolved = operator, whose first argument is the result."""

    eq: Call
    type: int
    typmod: int
    location: int


@dataclass(frozen=True, slots=True)
class ScalarArrayOpExpr:
    """``left op ANY|ALL (array)``: ``op`` applied to ``left`` and each array element."""

    op: Call
    use_or: bool
    left: Bound
    array: Bound
    location: int
    type: int = 16
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class ArrayExpr:
    elements: tuple[Bound, ...]
    element_type: int
    location: int
    type: int = 0
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class CaseTestExpr:
    """The CASE operand inside ``CASE x WHEN v`` (each WHEN compares it with =)."""

    type: int
    typmod: int
    location: int = -1


@dataclass(frozen=True, slots=True)
class CaseExpr:
    arg: Bound | None
    whens: tuple[tuple[Bound, Bound], ...]
    default: Bound
    type: int
    typmod: int
    location: int


@dataclass(frozen=True, slots=True)
class CoalesceExpr:
    args: tuple[Bound, ...]
    type: int
    typmod: int
    location: int


@dataclass(frozen=True, slots=True)
class MinMaxExpr:
    """GREATEST/LEAST: ``compare`` is the type's btree comparison."""

    kind: Literal["greatest", "least"]
    args: tuple[Bound, ...]
    compare: Call
    type: int
    typmod: int
    location: int


@dataclass(frozen=True, slots=True)
class RelabelType:
    """A binary-compatible change of type (varchar -> text)."""

    arg: Bound
    type: int
    typmod: int
    location: int


@dataclass(frozen=True, slots=True)
class CoerceViaIO:
    """A cast through the types' text forms (integer -> text): never allowed in row filters."""

    arg: Bound
    type: int
    typmod: int
    location: int


@dataclass(frozen=True, slots=True)
class ArrayCoerceExpr:
    """An array converted element by element (varchar[] -> text[]): never allowed in row
    filters."""

    arg: Bound
    type: int
    typmod: int
    location: int


@dataclass(frozen=True, slots=True)
class CollateExpr:
    arg: Bound
    collation: str
    schema: str | None
    type: int
    typmod: int
    location: int
    keyword: int = -1  # the COLLATE keyword (collation conflicts point there)


@dataclass(frozen=True, slots=True)
class SQLValueFunction:
    name: str
    type: int
    location: int
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class SubLink:
    location: int
    type: int = 16
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class ErrorExpr:
    """A constant subexpression whose folding failed: evaluating it raises ``error``, like the
    server's planner does for every row once the filter is prepared."""

    error: RowFilterError
    type: int
    location: int
    typmod: int = -1


Bound: TypeAlias = (
    Var
    | Const
    | Call
    | BoolExpr
    | NullTest
    | BooleanTest
    | DistinctExpr
    | NullIfExpr
    | ScalarArrayOpExpr
    | ArrayExpr
    | CaseTestExpr
    | CaseExpr
    | CoalesceExpr
    | MinMaxExpr
    | RelabelType
    | CoerceViaIO
    | ArrayCoerceExpr
    | CollateExpr
    | SQLValueFunction
    | SubLink
    | ErrorExpr
)
