"""The unbound row filter expression: what the parser produces, before any name or type is
resolved. Frozen slotted dataclasses; ``pos`` is the 0-based offset in the filter text of the
node's own token (PostgreSQL's "location").

Nodes mirror PostgreSQL's raw parse tree closely enough that binding can follow
PostgreSQL's parse analysis (transformExpr) rule for rule, and that ``pgcdc.filters.sql``
can print them back as SQL the server parses into the same tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = [
    "ArrayLiteral",
    "Between",
    "BoolLiteral",
    "BoolOp",
    "BooleanTest",
    "Case",
    "Coalesce",
    "Collate",
    "ColumnRef",
    "Distinct",
    "Expr",
    "FuncCall",
    "InList",
    "Like",
    "MinMax",
    "Not",
    "NullIf",
    "NullLiteral",
    "NullTest",
    "NumberLiteral",
    "OpExpr",
    "QuantifiedOp",
    "SpecialValue",
    "StringLiteral",
    "Subquery",
    "TypeCast",
    "TypeName",
    "TypedLiteral",
]


@dataclass(frozen=True, slots=True)
class TypeName:
    """A type as written: ``names`` (qualified, folded), typmod expressions (integer
    literals), ``array`` for ``[]``. ``sql_name`` is the canonical spelling for keyword types
    (``double precision``, ``timestamp with time zone``) and None for generic names."""

    names: tuple[str, ...]
    typmods: tuple[int, ...]
    pos: int
    sql_name: str | None = None
    array: bool = False


@dataclass(frozen=True, slots=True)
class ColumnRef:
    """A column, possibly qualified by the table (and schema) name."""

    names: tuple[str, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class NumberLiteral:
    """An integer or decimal literal, its text as written (with a leading ``-`` when the
    parser folded a unary minus into it, as PostgreSQL's doNegate does)."""

    text: str
    pos: int


@dataclass(frozen=True, slots=True)
class StringLiteral:
    """A string literal: type unknown until context decides."""

    value: str
    pos: int


@dataclass(frozen=True, slots=True)
class NullLiteral:
    pos: int


@dataclass(frozen=True, slots=True)
class BoolLiteral:
    """TRUE or FALSE."""

    value: bool
    pos: int


@dataclass(frozen=True, slots=True)
class TypedLiteral:
    """``DATE '2024-01-01'``: a constant of the named type."""

    type: TypeName
    value: str
    pos: int


@dataclass(frozen=True, slots=True)
class TypeCast:
    """``x::type`` or ``CAST(x AS type)``; ``pos`` is the ``::`` or the CAST keyword."""

    arg: Expr
    type: TypeName
    pos: int


@dataclass(frozen=True, slots=True)
class Collate:
    """``x COLLATE name``."""

    arg: Expr
    collation: tuple[str, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class OpExpr:
    """A prefix (``left`` is None) or infix operator; ``schema`` for ``OPERATOR(s.op)``."""

    op: str
    left: Expr | None
    right: Expr
    pos: int
    schema: str | None = None


@dataclass(frozen=True, slots=True)
class BoolOp:
    """AND / OR over two or more arguments."""

    kind: Literal["and", "or"]
    args: tuple[Expr, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Not:
    arg: Expr
    pos: int


@dataclass(frozen=True, slots=True)
class NullTest:
    """``x IS [NOT] NULL``."""

    arg: Expr
    negated: bool
    pos: int


@dataclass(frozen=True, slots=True)
class BooleanTest:
    """``x IS [NOT] TRUE|FALSE|UNKNOWN``."""

    arg: Expr
    value: Literal["true", "false", "unknown"]
    negated: bool
    pos: int


@dataclass(frozen=True, slots=True)
class Distinct:
    """``a IS [NOT] DISTINCT FROM b``."""

    left: Expr
    right: Expr
    negated: bool
    pos: int


@dataclass(frozen=True, slots=True)
class Between:
    """``x [NOT] BETWEEN [SYMMETRIC] low AND high``."""

    arg: Expr
    low: Expr
    high: Expr
    negated: bool
    symmetric: bool
    pos: int


@dataclass(frozen=True, slots=True)
class InList:
    """``x [NOT] IN (a, b, ...)``."""

    arg: Expr
    items: tuple[Expr, ...]
    negated: bool
    pos: int


@dataclass(frozen=True, slots=True)
class Like:
    """``x [NOT] LIKE|ILIKE pattern [ESCAPE e]``."""

    arg: Expr
    pattern: Expr
    escape: Expr | None
    negated: bool
    case_insensitive: bool
    pos: int


@dataclass(frozen=True, slots=True)
class ArrayLiteral:
    """``ARRAY[a, b, ...]`` (only as the operand of ANY/ALL)."""

    items: tuple[Expr, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class QuantifiedOp:
    """``x op ANY|SOME|ALL (array)``."""

    op: str
    left: Expr
    quantifier: Literal["any", "all"]
    array: Expr
    pos: int
    schema: str | None = None


@dataclass(frozen=True, slots=True)
class Case:
    """``CASE [operand] WHEN ... THEN ... [ELSE ...] END``."""

    operand: Expr | None
    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr | None
    pos: int


@dataclass(frozen=True, slots=True)
class Coalesce:
    args: tuple[Expr, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class NullIf:
    left: Expr
    right: Expr
    pos: int


@dataclass(frozen=True, slots=True)
class MinMax:
    """GREATEST(...) or LEAST(...)."""

    kind: Literal["greatest", "least"]
    args: tuple[Expr, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class FuncCall:
    """A function call; ``syntax`` names SQL-standard call syntax it was written in (extract,
    substring, trim, position), for printing. ``star``: ``f(*)``; ``agg_clause``: DISTINCT,
    ORDER BY, FILTER, OVER or WITHIN GROUP was written (aggregate/window syntax)."""

    names: tuple[str, ...]
    args: tuple[Expr, ...]
    pos: int
    syntax: str | None = None
    star: bool = False
    agg_clause: str | None = None


@dataclass(frozen=True, slots=True)
class SpecialValue:
    """CURRENT_DATE, CURRENT_TIMESTAMP, CURRENT_USER, ... (PostgreSQL's SQLValueFunction)."""

    name: str
    pos: int


@dataclass(frozen=True, slots=True)
class Subquery:
    """A sub-SELECT (as an operand, after IN, or in EXISTS); its text is not parsed."""

    kind: Literal["expr", "exists", "in"]
    arg: Expr | None
    negated: bool
    pos: int
    text: str


Expr: TypeAlias = (
    ColumnRef
    | NumberLiteral
    | StringLiteral
    | NullLiteral
    | BoolLiteral
    | TypedLiteral
    | TypeCast
    | Collate
    | OpExpr
    | BoolOp
    | Not
    | NullTest
    | BooleanTest
    | Distinct
    | Between
    | InList
    | Like
    | ArrayLiteral
    | QuantifiedOp
    | Case
    | Coalesce
    | NullIf
    | MinMax
    | FuncCall
    | SpecialValue
    | Subquery
)
