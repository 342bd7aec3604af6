"""float4 and float8 against the server: loading, Arrow, and shortest-exact text output."""

from __future__ import annotations

import math
import struct

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from pgcdc.protocol.values import format_float4, format_float8, pg_text, python_value
from tests.fix_pg import PgDatabase
from tests.protocol.values.checks import check_samples
from tests.protocol.values.sampling import raw_column


def f32(value: float) -> float:
    result: float = struct.unpack("=f", struct.pack("=f", value))[0]
    return result


FLOAT8_CASES = [
    ("0", 0.0),
    ("-0", -0.0),
    ("1.5", 1.5),
    ("0.1", 0.1),
    ("1e15", 1e15),
    ("123456789012345.6", 123456789012345.6),
    ("1e-4", 1e-4),
    ("9.999e-5", 9.999e-5),
    ("1e16", 1e16),
    ("-1.7976931348623157e308", -1.7976931348623157e308),
    ("5e-324", 5e-324),
    ("2.2250738585072014e-308", 2.2250738585072014e-308),
    ("9007199254740993", 9007199254740992.0),
    ("NaN", math.nan),
    ("Infinity", math.inf),
    ("-Infinity", -math.inf),
    (None, None),
]

FLOAT4_CASES = [
    ("0", 0.0),
    ("-0", -0.0),
    ("1.1", f32(1.1)),
    ("0.1", f32(0.1)),
    ("1e6", 1e6),
    ("123456", 123456.0),
    ("16777217", 16777216.0),
    ("3.4028235e38", f32(3.4028235e38)),
    ("1e-45", f32(1e-45)),
    ("-1.17549435e-38", f32(-1.17549435e-38)),
    ("NaN", math.nan),
    ("Infinity", math.inf),
    ("-Infinity", -math.inf),
    (None, None),
]


def test_float8(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        got = check_samples(conn, "float8", FLOAT8_CASES, expected_arrow=pa.float64())
    assert "1e+15" in got.text and "-0" in got.text and "NaN" in got.text


def test_float4(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        got = check_samples(conn, "float4", FLOAT4_CASES, expected_arrow=pa.float32())
    assert "1e+06" in got.text and "1.1" in got.text


def test_format_edge_cases() -> None:
    assert format_float8(100.0) == "100"
    assert format_float8(1e-5) == "1e-05"
    assert format_float8(1.5e300) == "1.5e+300"
    assert format_float8(-123.456) == "-123.456"
    assert format_float4(f32(0.0001)) == "0.0001"
    assert format_float4(f32(123456.7)) == "123456.7"
    assert format_float4(f32(1234567.0)) == "1.234567e+06"


HYPOTHESIS = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@HYPOTHESIS
@given(st.lists(st.floats(), min_size=1, max_size=60))
def test_random_float8(pg: PgDatabase, numbers: list[float]) -> None:
    """Any double, including NaN, infinities, subnormals and -0: same bits, same text."""
    with pg.connect() as conn:
        oid, typmod, text, binary = raw_column(
            conn, sql.SQL("SELECT x FROM unnest(%s::float8[]) AS x"), [numbers]
        )
    for number, t, b in zip(numbers, text, binary, strict=True):
        assert t is not None and b is not None
        assert format_float8(number) == t.decode()
        assert pg_text(b, oid, typmod) == t.decode()
        loaded = python_value(b, oid)
        assert isinstance(loaded, float)
        assert struct.pack(">d", loaded) == struct.pack(">d", number) or math.isnan(number)
        assert struct.pack(">d", python_value(t.decode(), oid)) == struct.pack(">d", loaded)  # type: ignore[arg-type]


@HYPOTHESIS
@given(st.lists(st.floats(width=32), min_size=1, max_size=60))
def test_random_float4(pg: PgDatabase, numbers: list[float]) -> None:
    """Any float32: the server's float4out equals ours, text and binary load the same value."""
    with pg.connect() as conn:
        oid, typmod, text, binary = raw_column(
            conn, sql.SQL("SELECT x::float4 FROM unnest(%s::float8[]) AS x"), [numbers]
        )
    for number, t, b in zip(numbers, text, binary, strict=True):
        assert t is not None and b is not None
        assert format_float4(number) == t.decode(), number
        assert pg_text(b, oid, typmod) == t.decode()
        from_text, from_binary = python_value(t.decode(), oid), python_value(b, oid)
        assert isinstance(from_text, float) and isinstance(from_binary, float)
        if not math.isnan(number):
            assert from_binary == number and from_text == number
            assert math.copysign(1, from_text) == math.copysign(1, number)
