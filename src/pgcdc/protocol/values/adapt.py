"""Dispatch on type OIDs: the public conversion functions of ``pgcdc.protocol.values``.

A type OID is resolved through the registry once (domains to their base type, arrays to their
element type, enums to text) into a conversion plan, cached in the registry. Types the codec
does not know stay as they came: str for text format, bytes for binary format (Arrow string or
binary), never an error, except that their binary form cannot be printed by ``pg_text``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import pyarrow as pa

from pgcdc.protocol.messages import UnchangedToast
from pgcdc.protocol.values import string
from pgcdc.protocol.values.array import (
    ParsedArray,
    array_text,
    arrow_lists,
    map_nested,
    parse_binary_array,
    parse_text_array,
)
from pgcdc.protocol.values.bits import CONVERTERS as BITS
from pgcdc.protocol.values.boolean import CONVERTERS as BOOLEAN
from pgcdc.protocol.values.converter import Converter, string_arrow_text
from pgcdc.protocol.values.datetime import CONVERTERS as DATETIME
from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.floats import CONVERTERS as FLOATS
from pgcdc.protocol.values.geometry import CONVERTERS as GEOMETRY
from pgcdc.protocol.values.json import CONVERTERS as JSON
from pgcdc.protocol.values.network import CONVERTERS as NETWORK
from pgcdc.protocol.values.numeric import CONVERTERS as NUMERIC
from pgcdc.protocol.values.ranges import multirange_text, range_text
from pgcdc.protocol.values.records import record_text
from pgcdc.protocol.values.registry import DEFAULT_REGISTRY, TypeRegistry
from pgcdc.protocol.values.system import CONVERTERS as SYSTEM
from pgcdc.protocol.values.text_search import CONVERTERS as TEXT_SEARCH
from pgcdc.protocol.values.uuid import CONVERTERS as UUID

__all__ = [
    "CONVERTERS",
    "SERVER_RENDERED",
    "UNKNOWN",
    "Plan",
    "ServerText",
    "arrow_type",
    "loader",
    "pg_text",
    "plan_for",
    "python_value",
    "to_arrow",
]

_NoneType = type(None)

#: The converter of every built-in type the codec knows, by OID.
CONVERTERS: dict[int, Converter] = {
    **BOOLEAN,
    **NUMERIC,
    **FLOATS,
    **string.CONVERTERS,
    **UUID,
    **JSON,
    **BITS,
    **NETWORK,
    **DATETIME,
    **GEOMETRY,
    **TEXT_SEARCH,
    **SYSTEM,
}


#: Built-in types with a binary send function whose output the codec leaves to the server
#: (``pg_text``'s ``server_text``), and why; every other built-in base type it reads itself
#: (tests/protocol/values/test_builtin_types.py checks both servers' pg_type against this).
SERVER_RENDERED: dict[str, str] = {
    **{
        name: "an OID, printed as the name the catalog gives it"
        for name in (
            "regproc",
            "regprocedure",
            "regoper",
            "regoperator",
            "regclass",
            "regtype",
            "regconfig",
            "regdictionary",
            "regnamespace",
            "regrole",
            "regcollation",
        )
    },
    **{
        name: "the planner's statistics in their internal form; not a column type of user data"
        for name in (
            "pg_ndistinct",
            "pg_dependencies",
            "pg_mcv_list",
            "pg_brin_bloom_summary",
            "pg_brin_minmax_multi_summary",
        )
    },
}


def _identity(value: Any) -> Any:
    return value


def _unknown_type(typmod: int) -> Any:
    return pa.string()


def _unknown_arrow_binary(values: list[bytes | None], arrow_type: Any) -> pa.Array:
    return pa.array(values, pa.binary())


def _cannot_render(data: bytes, timezone: str) -> str:
    raise AssertionError("unreachable: unknown types are rejected before rendering")


#: Types the codec does not know: str stays str, bytes stays bytes.
UNKNOWN = Converter(
    "unknown",
    _identity,
    _identity,
    _cannot_render,
    _unknown_type,
    string_arrow_text,
    _unknown_arrow_binary,
)


#: what ``pg_text`` prints a binary value of a type as, when the codec reads no Python value
#: of it: a range (``bound``: its bound type's plan), a multirange (``bound``: its range type's
#: plan) or a composite (its columns' types come with each value)
Shape = Literal["scalar", "range", "multirange", "record"]

#: record, the pseudo-type of anonymous composite values (``ROW(1, 'a')``)
RECORD_OID = 2249


@dataclass(frozen=True, slots=True)
class Plan:
    """How to convert one type OID: a scalar converter, or an array of an element plan.

    Ranges, multiranges and composites convert as types the codec does not know (their text or
    bytes as they came); ``shape`` and ``bound`` say how ``pg_text`` prints their binary form.
    """

    oid: int
    name: str
    converter: Converter
    element: Plan | None = None
    delimiter: str = ","
    type_modifier: int = -1
    shape: Shape = "scalar"
    bound: Plan | None = None


def plan_for(type_oid: int, registry: TypeRegistry | None = None) -> Plan:
    """The (cached) conversion plan of a type OID."""
    reg = DEFAULT_REGISTRY if registry is None else registry
    key = ("plan", type_oid)
    plan = reg.cache.get(key)
    if plan is None:
        plan = _build_plan(type_oid, reg, 0)
        reg.cache[key] = plan
    assert isinstance(plan, Plan)
    return plan


def _build_plan(type_oid: int, reg: TypeRegistry, depth: int) -> Plan:
    declared = reg.get(type_oid)
    name = declared.qualified_name if declared is not None else f"type with OID {type_oid}"
    info = reg.resolve(type_oid)
    typmod = reg.domain_type_modifier(type_oid)
    if info is None:
        return Plan(type_oid, name, UNKNOWN)
    if info.kind == "array" and depth < 2:
        element = _build_plan(info.element_oid, reg, depth + 1)
        element_info = reg.resolve(info.element_oid)
        delimiter = element_info.delimiter if element_info is not None else ","
        return Plan(type_oid, name, UNKNOWN, element, delimiter, typmod)
    if info.kind == "enum":
        return Plan(type_oid, name, string.ENUM, type_modifier=typmod)
    if info.kind in ("range", "multirange") and info.subtype_oid and depth < 4:
        bound = _build_plan(info.subtype_oid, reg, depth + 1)
        return Plan(type_oid, name, UNKNOWN, shape=info.kind, bound=bound)
    if info.kind == "composite" or info.oid == RECORD_OID:
        return Plan(type_oid, name, UNKNOWN, shape="record")
    return Plan(type_oid, name, CONVERTERS.get(info.oid, UNKNOWN), type_modifier=typmod)


# -- Python values --------------------------------------------------------------------------


@overload
def loader(
    type_oid: int, registry: TypeRegistry | None = None, binary: Literal[False] = False
) -> Callable[[str], object]: ...
@overload
def loader(
    type_oid: int, registry: TypeRegistry | None, binary: Literal[True]
) -> Callable[[bytes], object]: ...
@overload
def loader(
    type_oid: int, registry: TypeRegistry | None = None, *, binary: Literal[True]
) -> Callable[[bytes], object]: ...
@overload
def loader(
    type_oid: int, registry: TypeRegistry | None, binary: bool
) -> Callable[[Any], object]: ...
def loader(
    type_oid: int, registry: TypeRegistry | None = None, binary: bool = False
) -> Callable[[Any], object]:
    """The function loading one non-NULL value of a type (str if text, bytes if ``binary``).

    Cached per registry: fetch it once per column and call it per row.
    """
    reg = DEFAULT_REGISTRY if registry is None else registry
    key = ("binary" if binary else "text", type_oid)
    fn = reg.cache.get(key)
    if fn is None:
        plan = plan_for(type_oid, reg)
        fn = _binary_loader(plan) if binary else _text_loader(plan)
        reg.cache[key] = fn
    return fn  # type: ignore[return-value]


def _text_loader(plan: Plan) -> Callable[[str], object]:
    if plan.element is None:
        return plan.converter.from_text
    load_element = _text_loader(plan.element)
    delimiter = plan.delimiter

    def load_array(text: str) -> object:
        return map_nested(parse_text_array(text, delimiter).elements, load_element)

    return load_array


def _binary_loader(plan: Plan) -> Callable[[bytes], object]:
    if plan.element is None:
        return plan.converter.from_binary
    load_element = _binary_loader(plan.element)

    def load_array(data: bytes) -> object:
        return map_nested(parse_binary_array(data).elements, load_element)

    return load_array


def python_value(
    value: str | bytes | None, type_oid: int, registry: TypeRegistry | None = None
) -> object:
    """The Python value of one column value: str is text format, bytes binary, None NULL.

    See the package documentation for the Python type of each PostgreSQL type. Types the
    registry does not know come back unchanged.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return loader(type_oid, registry, False)(value)
    if isinstance(value, bytes):
        return loader(type_oid, registry, True)(value)
    raise _value_type_error(value, "python_value")


def _value_type_error(value: object, where: str) -> TypeError:
    if isinstance(value, UnchangedToast):
        return TypeError(
            f"{where} got UNCHANGED_TOAST: an unchanged TOASTed value has no data; mask such "
            "values before converting (take them from the old row, or leave the column out)"
        )
    return TypeError(
        f"{where} takes column values as str (text format), bytes (binary format) or None, "
        f"not {type(value).__name__}"
    )


# -- PostgreSQL text output -----------------------------------------------------------------


def pg_text(
    value: str | bytes,
    type_oid: int,
    type_modifier: int = -1,
    registry: TypeRegistry | None = None,
    *,
    timezone: str = "UTC",
    server_text: ServerText | None = None,
) -> str:
    """The text PostgreSQL's output function prints for a value (as test_decoding does).

    Text-format values are returned unchanged. Binary values are rendered with DateStyle ISO,
    IntervalStyle postgres, extra_float_digits 1, bytea_output hex, lc_monetary C and, for
    timestamptz, the session time zone ``timezone`` (an IANA name). A binary value of a type
    the codec cannot print (an unknown base type, or an element of an array of one) goes to
    ``server_text`` (type OID, bytes), which asks a server; without it, ConversionError.
    """
    if isinstance(value, str):
        return value
    if not isinstance(value, bytes):
        raise _value_type_error(value, "pg_text")
    reg = DEFAULT_REGISTRY if registry is None else registry
    return _Renderer(reg, timezone, server_text).render(plan_for(type_oid, reg), value)


#: Renders a binary value of a type OID with the server's own receive and output functions.
ServerText = Callable[[int, bytes], str]


@dataclass(frozen=True, slots=True)
class _Renderer:
    registry: TypeRegistry
    timezone: str
    server_text: ServerText | None

    def render(self, plan: Plan, data: bytes) -> str:
        element = plan.element
        if element is not None:
            parsed = parse_binary_array(data)
            return array_text(parsed, lambda e: self.render(element, e), plan.delimiter)
        bound = plan.bound
        if plan.shape == "range" and bound is not None:
            return range_text(data, lambda b: self.render(bound, b))
        if plan.shape == "multirange" and bound is not None:
            return multirange_text(data, lambda r: self.render(bound, r))
        if plan.shape == "record":
            return record_text(data, lambda oid, v: self.render(plan_for(oid, self.registry), v))
        if plan.converter is UNKNOWN:
            if self.server_text is not None:
                return self.server_text(plan.oid, data)
            raise ConversionError(
                f"cannot print a binary value of {plan.name}: the codec has no output function "
                "for it. Stream the column in text format (leave out the binary option), or add "
                "the type to the registry if it is an enum or a domain"
            )
        return plan.converter.render(data, self.timezone)


# -- Arrow ----------------------------------------------------------------------------------


def arrow_type(
    type_oid: int,
    type_modifier: int = -1,
    registry: TypeRegistry | None = None,
    ndims: int = 1,
    *,
    binary: bool = False,
) -> pa.DataType:
    """The Arrow type of a column of this type (arrays: ``list_`` nested ``ndims`` deep).

    ``binary`` matters only for types the codec does not know: their text form maps to
    string, their binary form to binary. See the package documentation for the mapping.
    """
    plan = plan_for(type_oid, registry)
    element = plan.element
    if element is None:
        return _scalar_type(plan, type_modifier, binary)
    if ndims < 1:
        raise ValueError(f"ndims must be at least 1 for the array type {plan.name}, not {ndims}")
    typ = _scalar_type(
        element, type_modifier if type_modifier != -1 else plan.type_modifier, binary
    )
    for _ in range(ndims):
        typ = pa.list_(typ)
    return typ


def _scalar_type(plan: Plan, type_modifier: int, binary: bool) -> pa.DataType:
    if plan.converter is UNKNOWN and binary:
        return pa.binary()
    typmod = type_modifier if type_modifier != -1 else plan.type_modifier
    result: pa.DataType = plan.converter.arrow_type(typmod)
    return result


def to_arrow(
    values: Sequence[str | bytes | None],
    type_oid: int,
    type_modifier: int = -1,
    registry: TypeRegistry | None = None,
    ndims: int = 1,
    *,
    binary: bool | None = None,
) -> pa.Array:
    """One column of values (all text str, or all binary bytes; None for NULL) as Arrow.

    The result has type ``arrow_type(type_oid, type_modifier, registry, ndims, binary=...)``;
    ``binary`` defaults to the values' format (text if all are NULL). Integers, floats,
    decimals, dates and timestamps in text form go through Arrow's cast kernels and fixed-width
    binary values through numpy; everything else is converted value by value.
    UNCHANGED_TOAST values are refused with TypeError: the caller masks them first.
    """
    column = values if isinstance(values, list) else list(values)
    kinds = set(map(type, column))
    kinds.discard(_NoneType)
    if kinds - {str, bytes}:
        odd = next(v for v in column if type(v) not in (str, bytes, _NoneType))
        raise _value_type_error(odd, "to_arrow")
    if len(kinds) > 1:
        raise TypeError("to_arrow got both text (str) and binary (bytes) values in one column")
    is_binary = bytes in kinds if binary is None else binary
    if kinds and (bytes in kinds) != is_binary:
        raise TypeError(
            f"to_arrow was told binary={binary} but got {'bytes' if bytes in kinds else 'str'} "
            "values"
        )
    plan = plan_for(type_oid, registry)
    target = arrow_type(type_oid, type_modifier, registry, ndims, binary=is_binary)
    element = plan.element
    if element is None:
        return _scalar_arrow(plan, column, target, is_binary)
    leaf_type = target
    for _ in range(ndims):
        leaf_type = leaf_type.value_type
    parsed: list[ParsedArray | None]
    if is_binary:
        parsed = [None if v is None else parse_binary_array(v) for v in column]  # type: ignore[arg-type]
    else:
        delimiter = plan.delimiter
        parsed = [None if v is None else parse_text_array(v, delimiter) for v in column]  # type: ignore[arg-type]

    def convert_leaves(leaves: list[Any]) -> pa.Array:
        return _scalar_arrow(element, leaves, leaf_type, is_binary)

    return arrow_lists(parsed, ndims, convert_leaves, target, plan.name)


def _scalar_arrow(plan: Plan, values: list[Any], target: pa.DataType, binary: bool) -> pa.Array:
    if binary:
        return plan.converter.arrow_binary(values, target)
    return plan.converter.arrow_text(values, target)
