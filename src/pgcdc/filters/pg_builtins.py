"""The built-in PostgreSQL catalog as the binder sees it: types, casts, operators, functions.

Rows come from the generated ``pg_builtins_data`` (PostgreSQL 15 and 18). Lookups return frozen
dataclasses; ``find_coercion_pathway`` and ``can_coerce`` follow parse_coerce.c, so implicit
casts, binary-coercible relabelings and I/O conversions are decided as on the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from typing import Literal, cast

from pgcdc.filters import pg_builtins_data

__all__ = [
    "ANY",
    "BOOL",
    "BPCHAR",
    "DATE",
    "FIRST_NORMAL_OBJECT_ID",
    "FLOAT4",
    "FLOAT8",
    "INT2",
    "INT4",
    "INT8",
    "NAME",
    "NUMERIC",
    "TEXT",
    "TIMESTAMP",
    "TIMESTAMPTZ",
    "UNKNOWN",
    "VARCHAR",
    "CastEntry",
    "CoercionContext",
    "CoercionPath",
    "FunctionEntry",
    "OperatorEntry",
    "TypeEntry",
    "can_coerce",
    "find_coercion_pathway",
    "format_type",
    "functions_named",
    "is_polymorphic",
    "length_coercion",
    "operators_named",
    "type_by_name",
    "type_entry",
]

#: OIDs at or above this are user-defined (FirstNormalObjectId).
FIRST_NORMAL_OBJECT_ID = 16384

BOOL, NAME, INT8, INT2, INT4, TEXT = 16, 19, 20, 21, 23, 25
FLOAT4, FLOAT8, UNKNOWN, BPCHAR, VARCHAR, DATE = 700, 701, 705, 1042, 1043, 1082
TIMESTAMP, TIMESTAMPTZ, NUMERIC = 1114, 1184, 1700
ANY, RECORD = 2276, 2249
ANYELEMENT, ANYARRAY, ANYNONARRAY, ANYENUM, ANYRANGE, ANYMULTIRANGE = (
    2283,
    2277,
    2776,
    3500,
    3831,
    4537,
)
ANYCOMPATIBLE, ANYCOMPATIBLEARRAY, ANYCOMPATIBLENONARRAY = 5077, 5078, 5079
ANYCOMPATIBLERANGE, ANYCOMPATIBLEMULTIRANGE = 5080, 4538

_POLYMORPHIC = frozenset(
    {
        ANYELEMENT,
        ANYARRAY,
        ANYNONARRAY,
        ANYENUM,
        ANYRANGE,
        ANYMULTIRANGE,
        ANYCOMPATIBLE,
        ANYCOMPATIBLEARRAY,
        ANYCOMPATIBLENONARRAY,
        ANYCOMPATIBLERANGE,
        ANYCOMPATIBLEMULTIRANGE,
    }
)


@dataclass(frozen=True, slots=True)
class TypeEntry:
    """A pg_type row: category and preferred flag drive implicit resolution."""

    oid: int
    name: str
    sql_name: str  # format_type()
    category: str
    preferred: bool
    typtype: str
    element: int
    array: int
    collatable: bool


@dataclass(frozen=True, slots=True)
class CastEntry:
    """A pg_cast row; ``implementation`` is empty for binary-coercible and I/O casts."""

    source: int
    target: int
    implementation: str
    volatility: str
    nargs: int
    context: Literal["i", "a", "e"]
    method: Literal["f", "b", "i"]


@dataclass(frozen=True, slots=True)
class OperatorEntry:
    """A pg_operator row ('b' infix or 'l' prefix; ``left`` is 0 for prefix operators)."""

    name: str
    kind: Literal["b", "l"]
    left: int
    right: int
    result: int
    implementation: str
    volatility: str
    strict: bool

    @property
    def args(self) -> tuple[int, ...]:
        return (self.left, self.right) if self.kind == "b" else (self.right,)


@dataclass(frozen=True, slots=True)
class FunctionEntry:
    """A pg_proc row (only the functions the binder knows by name)."""

    name: str
    args: tuple[int, ...]
    result: int
    volatility: str
    strict: bool
    variadic: int
    ndefaults: int
    kind: str
    retset: bool
    implementation: str


class CoercionContext(IntEnum):
    IMPLICIT = 0
    ASSIGNMENT = 1
    EXPLICIT = 2


class CoercionPath(IntEnum):
    NONE = 0
    FUNC = 1
    RELABEL = 2
    ARRAY = 3
    VIA_IO = 4


_CONTEXTS = {"i": CoercionContext.IMPLICIT, "a": CoercionContext.ASSIGNMENT}


@cache
def _types() -> dict[int, TypeEntry]:
    out: dict[int, TypeEntry] = {}
    for row in pg_builtins_data.TYPES:
        oid, name, sql_name, category, preferred, typtype, elem, array, coll, _majors = row
        out[oid] = TypeEntry(oid, name, sql_name, category, preferred, typtype, elem, array, coll)
    return out


@cache
def _types_by_name() -> dict[str, TypeEntry]:
    return {t.name: t for t in _types().values()}


def type_entry(oid: int) -> TypeEntry | None:
    """The built-in type with this OID."""
    return _types().get(oid)


def type_by_name(name: str) -> TypeEntry | None:
    """The built-in type named ``name`` (pg_type.typname)."""
    return _types_by_name().get(name)


def format_type(oid: int) -> str:
    """The type's name as PostgreSQL prints it in messages (``integer``, ``text``)."""
    entry = type_entry(oid)
    return entry.sql_name if entry is not None else f"type with OID {oid}"


def category(oid: int) -> str:
    entry = type_entry(oid)
    return entry.category if entry is not None else "U"


def is_preferred(oid: int) -> bool:
    entry = type_entry(oid)
    return entry.preferred if entry is not None else False


def is_polymorphic(oid: int) -> bool:
    return oid in _POLYMORPHIC


@cache
def _casts() -> dict[tuple[int, int], CastEntry]:
    out: dict[tuple[int, int], CastEntry] = {}
    for row in pg_builtins_data.CASTS:
        source, target, impl, volatility, nargs, context, method, majors = row
        if majors and 18 not in majors:
            continue
        out[(source, target)] = CastEntry(
            source,
            target,
            impl,
            volatility,
            nargs,
            cast(Literal["i", "a", "e"], context),
            cast(Literal["f", "b", "i"], method),
        )
    return out


def cast_entry(source: int, target: int) -> CastEntry | None:
    return _casts().get((source, target))


def length_coercion(oid: int) -> CastEntry | None:
    """The length-coercion cast of a type (``varchar(varchar, int, bool)``), if any."""
    entry = _casts().get((oid, oid))
    return entry if entry is not None and entry.method == "f" else None


@cache
def _operators() -> dict[str, tuple[OperatorEntry, ...]]:
    grouped: dict[str, list[OperatorEntry]] = {}
    for row in pg_builtins_data.OPERATORS:
        name, kind, left, right, result, impl, volatility, strict, _comm, _majors = row
        entry = OperatorEntry(
            name, cast(Literal["b", "l"], kind), left, right, result, impl, volatility, strict
        )
        grouped.setdefault(name, []).append(entry)
    return {k: tuple(v) for k, v in grouped.items()}


def operators_named(name: str) -> tuple[OperatorEntry, ...] | None:
    """Every built-in operator with this name, or None if the binder does not know the name."""
    return _operators().get(name)


@cache
def _functions() -> dict[str, tuple[FunctionEntry, ...]]:
    grouped: dict[str, list[FunctionEntry]] = {}
    for row in pg_builtins_data.FUNCTIONS:
        name, args, result, volatility, strict, variadic, ndef, kind, retset, impl, _m = row
        grouped.setdefault(name, []).append(
            FunctionEntry(
                name, args, result, volatility, strict, variadic, ndef, kind, retset, impl
            )
        )
    return {k: tuple(v) for k, v in grouped.items()}


def functions_named(name: str) -> tuple[FunctionEntry, ...] | None:
    """Every built-in function with this name, or None if the binder does not know it."""
    return _functions().get(name)


def find_coercion_pathway(
    target: int, source: int, context: CoercionContext
) -> tuple[CoercionPath, CastEntry | None]:
    """How a value of ``source`` type becomes ``target`` in ``context`` (parse_coerce.c)."""
    if source == target:
        return CoercionPath.RELABEL, None
    entry = cast_entry(source, target)
    if entry is not None:
        if context >= _CONTEXTS.get(entry.context, CoercionContext.EXPLICIT):
            if entry.method == "f":
                return CoercionPath.FUNC, entry
            if entry.method == "b":
                return CoercionPath.RELABEL, entry
            return CoercionPath.VIA_IO, entry
        return CoercionPath.NONE, None
    src = type_entry(source)
    tgt = type_entry(target)
    if (
        tgt is not None
        and src is not None
        and tgt.element
        and src.element
        and tgt.category == "A"
        and src.category == "A"
    ):
        path, _ = find_coercion_pathway(tgt.element, src.element, context)
        if path != CoercionPath.NONE:
            return CoercionPath.ARRAY, None
    if context >= CoercionContext.ASSIGNMENT and category(target) == "S":
        return CoercionPath.VIA_IO, None
    if context >= CoercionContext.EXPLICIT and category(source) == "S":
        return CoercionPath.VIA_IO, None
    return CoercionPath.NONE, None


def can_coerce(inputs: Sequence[int], targets: Sequence[int], context: CoercionContext) -> bool:
    """Whether each input type coerces to its target type (can_coerce_type)."""
    generics = False
    for source, target in zip(inputs, targets, strict=True):
        if target in (source, ANY):
            continue
        if target in _POLYMORPHIC:
            generics = True
            continue
        if source == UNKNOWN:
            continue
        path, _ = find_coercion_pathway(target, source, context)
        if path != CoercionPath.NONE:
            continue
        if source == RECORD and category(target) == "C":
            continue
        return False
    return not generics or _generic_consistent(inputs, targets)


def _is_array(oid: int) -> bool:
    entry = type_entry(oid)
    return entry is not None and entry.element != 0 and entry.category == "A"


def _generic_consistent(inputs: Sequence[int], targets: Sequence[int]) -> bool:
    """check_generic_type_consistency, for the argument types row filters can have."""
    elem: int | None = None
    compatible: list[int] = []
    for source, target in zip(inputs, targets, strict=True):
        if source == UNKNOWN:
            continue
        entry = type_entry(source)
        if target in (ANYELEMENT, ANYNONARRAY, ANYENUM):
            if elem is not None and elem != source:
                return False
            elem = source
            if target == ANYNONARRAY and _is_array(source):
                return False
            if target == ANYENUM and (entry is None or entry.typtype != "e"):
                return False
        elif target == ANYARRAY:
            if not _is_array(source) or entry is None:
                return False
            if elem is not None and elem != entry.element:
                return False
            elem = entry.element
        elif target in (ANYRANGE, ANYMULTIRANGE, ANYCOMPATIBLERANGE, ANYCOMPATIBLEMULTIRANGE):
            if entry is None or entry.typtype not in ("r", "m"):
                return False
        elif target in (ANYCOMPATIBLE, ANYCOMPATIBLENONARRAY):
            if target == ANYCOMPATIBLENONARRAY and _is_array(source):
                return False
            compatible.append(source)
        elif target == ANYCOMPATIBLEARRAY:
            if not _is_array(source) or entry is None:
                return False
            compatible.append(entry.element)
    if len(set(compatible)) > 1:
        first = compatible[0]
        cat = category(first)
        return all(category(t) == cat for t in compatible)
    return True
