"""Typed column values: pgoutput's text ('t', str) and binary ('b', bytes) values converted to
Python, to Arrow, and back to the exact text PostgreSQL's output functions print.

Entry points:

- ``python_value(value, type_oid, registry=None)``, and ``loader(type_oid, registry, binary)``
  for a cached per-type function;
- ``arrow_type(type_oid, type_modifier, registry=None, ndims=1)`` and ``to_arrow(values, ...)``
  for a whole column;
- ``pg_text(value, type_oid, type_modifier, registry=None, timezone="UTC")``: what the server
  prints (``SELECT v`` in text format, test_decoding's output) for a value;
- ``TypeRegistry`` / ``TypeInfo``: the built-in types (generated from a real server into
  ``oids.py``) plus user types added with ``add`` or loaded with ``load(conn)``.

Python values: bool; int (int2/int4/int8/oid/xid/cid/xid8); float (float4 as its exact float32
value); Decimal (numeric with its exact scale, NaN/±Infinity as Decimal specials; money with two
fraction digits); str (text, varchar, bpchar, name, "char", xml, enums, json/jsonb/jsonpath as
their JSON text, bit/varbit as '0'/'1' characters, macaddr/macaddr8, unknown text); bytes (bytea,
unknown binary); uuid.UUID; ipaddress objects (inet: address or interface, cidr: network);
date/time/datetime (timestamptz aware UTC, timetz with a fixed-offset tzinfo) or the markers
``INFINITY``, ``NEG_INFINITY``, ``PgDate``, ``PgTimestamp``, ``PgTime`` where Python's types
cannot hold the value; ``Interval(months, days, microseconds)``; arrays as nested lists. Domains
convert as their base type.

Arrow types: bool -> bool_; int2/int4/int8 -> int16/int32/int64; oid/xid/cid -> uint32; xid8 ->
uint64; float4/float8 -> float32/float64; numeric(p,s) -> decimal128(p,s), decimal256 when
p > 38 (negative scale s -> decimal(p-s, 0), s > p -> decimal(s, s)), unconstrained numeric or
p > 76 -> string (exact text); NaN in a decimal column raises ConversionError; bytea -> binary;
date -> date32; time -> time64('us'); timestamp -> timestamp('us'); timestamptz ->
timestamp('us', tz='UTC'); interval -> month_day_nano_interval; ±infinity -> the minimum/maximum
of the storage integer (values Arrow cannot hold raise ConversionError: time 24:00:00,
timestamps after year 294246, intervals over ~292 years of hours); all other known types, enums
and unknown text -> string (their text);
unknown binary -> binary; arrays -> list_ nested ``ndims`` deep; domains -> their base type's
mapping (with the domain's typmod when the column has none).
"""

from pgcdc.protocol.values.adapt import (
    CONVERTERS,
    UNKNOWN,
    Plan,
    ServerText,
    arrow_type,
    loader,
    pg_text,
    plan_for,
    python_value,
    to_arrow,
)
from pgcdc.protocol.values.converter import Converter
from pgcdc.protocol.values.datetime import (
    INFINITY,
    NEG_INFINITY,
    DateValue,
    Infinity,
    Interval,
    PgDate,
    PgTime,
    PgTimestamp,
    TimestampValue,
    TimeValue,
)
from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.floats import format_float4, format_float8
from pgcdc.protocol.values.numeric import numeric_arrow_type, numeric_precision_scale
from pgcdc.protocol.values.registry import (
    DEFAULT_REGISTRY,
    FIRST_USER_OID,
    Kind,
    TypeInfo,
    TypeRegistry,
    fetch_types,
)

__all__ = [
    "CONVERTERS",
    "DEFAULT_REGISTRY",
    "FIRST_USER_OID",
    "INFINITY",
    "NEG_INFINITY",
    "UNKNOWN",
    "ConversionError",
    "Converter",
    "DateValue",
    "Infinity",
    "Interval",
    "Kind",
    "PgDate",
    "PgTime",
    "PgTimestamp",
    "Plan",
    "ServerText",
    "TimeValue",
    "TimestampValue",
    "TypeInfo",
    "TypeRegistry",
    "arrow_type",
    "fetch_types",
    "format_float4",
    "format_float8",
    "loader",
    "numeric_arrow_type",
    "numeric_precision_scale",
    "pg_text",
    "plan_for",
    "python_value",
    "to_arrow",
]
