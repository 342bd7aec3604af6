"""Integers, oid, numeric and money against the server's own text and binary output."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from pgcdc.protocol.values import (
    ConversionError,
    numeric_arrow_type,
    numeric_precision_scale,
    oids,
    pg_text,
    python_value,
    to_arrow,
)
from tests.fix_pg import PgDatabase
from tests.protocol.values.checks import check_samples
from tests.protocol.values.sampling import raw_column, sample

INT_CASES = {
    "int2": ([("0", 0), ("-32768", -32768), ("32767", 32767), (None, None)], pa.int16()),
    "int4": (
        [("0", 0), ("-2147483648", -(2**31)), ("2147483647", 2**31 - 1), (None, None)],
        pa.int32(),
    ),
    "int8": (
        [("-9223372036854775808", -(2**63)), ("9223372036854775807", 2**63 - 1), ("7", 7)],
        pa.int64(),
    ),
    "oid": ([("0", 0), ("4294967295", 2**32 - 1), ("1259", 1259), (None, None)], pa.uint32()),
    "xid": ([("0", 0), ("4294967295", 2**32 - 1)], pa.uint32()),
    "cid": ([("12", 12)], pa.uint32()),
}


@pytest.mark.parametrize("type_sql", sorted(INT_CASES))
def test_integers(pg: PgDatabase, type_sql: str) -> None:
    cases, arrow = INT_CASES[type_sql]
    with pg.connect() as conn:
        check_samples(
            conn,
            type_sql,
            cases,
            expected_arrow=arrow,
            arrow_values=[value for _, value in cases],
        )


def D(text: str) -> Decimal:
    return Decimal(text)


NUMERIC_UNCONSTRAINED = [
    ("0", D("0")),
    ("0.000", D("0.000")),
    ("1.50", D("1.50")),
    ("-1.5", D("-1.5")),
    ("123456789.000000001", D("123456789.000000001")),
    ("10000", D("10000")),
    ("0.0001", D("0.0001")),
    ("-0.00000000000000000000000000000000000012345", D("-1.2345E-37")),
    ("1e100", D("1" + "0" * 100)),
    ("1e-100", D("1E-100")),
    ("9999.9999", D("9999.9999")),
    ("NaN", D("NaN")),
    ("Infinity", D("Infinity")),
    ("-Infinity", D("-Infinity")),
    (None, None),
]


def test_numeric_unconstrained(pg: PgDatabase) -> None:
    """Unconstrained numeric keeps every value's own scale and maps to exact text."""
    with pg.connect() as conn:
        got = check_samples(conn, "numeric", NUMERIC_UNCONSTRAINED, expected_arrow=pa.string())
    assert got.typmod == -1
    assert to_arrow(got.binary, got.oid, -1).to_pylist() == got.text


def test_numeric_huge_and_tiny(pg: PgDatabase) -> None:
    """Values at the edges of numeric's range: 131072 digits before the point, 16383 after."""
    huge = "9" * 131072
    tiny = "0." + "0" * 16382 + "1"
    cases = [(huge, Decimal(huge)), ("-" + tiny, Decimal("-" + tiny)), (tiny, Decimal(tiny))]
    with pg.connect() as conn:
        check_samples(conn, "numeric", cases, expected_arrow=pa.string())


def test_numeric_constrained(pg: PgDatabase) -> None:
    cases = [
        ("0", D("0.00")),
        ("1.5", D("1.50")),
        ("-12345678.91", D("-12345678.91")),
        ("99999999.99", D("99999999.99")),
        (None, None),
    ]
    with pg.connect() as conn:
        check_samples(
            conn,
            "numeric(10,2)",
            cases,
            expected_arrow=pa.decimal128(10, 2),
            arrow_values=[v for _, v in cases],
        )


def test_numeric_precision_above_38_is_decimal256(pg: PgDatabase) -> None:
    big = "1" * 45 + "." + "2" * 5
    cases = [(big, D(big)), ("-" + big, D("-" + big)), ("0", D("0.00000")), (None, None)]
    with pg.connect() as conn:
        check_samples(
            conn,
            "numeric(50,5)",
            cases,
            expected_arrow=pa.decimal256(50, 5),
            arrow_values=[v for _, v in cases],
        )


def test_numeric_precision_above_76_is_string(pg: PgDatabase) -> None:
    cases = [("1.5", D("1.50")), (None, None)]
    with pg.connect() as conn:
        check_samples(conn, "numeric(100,2)", cases, expected_arrow=pa.string())


def test_numeric_negative_scale(pg: PgDatabase) -> None:
    """numeric(5,-2) (PostgreSQL 15+) rounds to hundreds: decimal128(7, 0)."""
    cases = [("12345.67", D("12300")), ("-9999949", D("-9999900")), ("0", D("0")), (None, None)]
    with pg.connect() as conn:
        check_samples(
            conn,
            "numeric(5,-2)",
            cases,
            expected_arrow=pa.decimal128(7, 0),
            arrow_values=[v for _, v in cases],
        )


def test_numeric_scale_above_precision(pg: PgDatabase) -> None:
    """numeric(3,5) (PostgreSQL 15+) holds 0.00xyz: decimal128(5, 5)."""
    cases = [("0.00123", D("0.00123")), ("-0.00999", D("-0.00999")), (None, None)]
    with pg.connect() as conn:
        check_samples(
            conn,
            "numeric(3,5)",
            cases,
            expected_arrow=pa.decimal128(5, 5),
            arrow_values=[v for _, v in cases],
        )


def test_numeric_nan_in_decimal_column_raises(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        col = sample(conn, "numeric(10,2)", ["1.5", "NaN", None])
    for values in (col.text, col.binary):
        with pytest.raises(ConversionError, match=r"NaN.*decimal128\(10, 2\).*string"):
            to_arrow(values, col.oid, col.typmod)
    # the Python values and text output are still fine
    assert python_value(col.binary[1], col.oid).is_nan()  # type: ignore[union-attr]
    assert pg_text(col.binary[1], col.oid, col.typmod) == "NaN"  # type: ignore[arg-type]
    # and as unconstrained numeric the column converts
    assert to_arrow(col.binary, col.oid, -1).to_pylist() == ["1.50", "NaN", None]


def test_numeric_typmod_decoding() -> None:
    def typmod(p: int, s: int) -> int:
        return ((p << 16) | (s & 0x7FF)) + 4

    assert numeric_precision_scale(-1) is None
    assert numeric_precision_scale(typmod(10, 2)) == (10, 2)
    assert numeric_precision_scale(typmod(5, -2)) == (5, -2)
    assert numeric_precision_scale(typmod(1000, 1000)) == (1000, 1000)
    assert numeric_precision_scale(typmod(3, -1000)) == (3, -1000)
    assert numeric_arrow_type(typmod(38, 0)) == pa.decimal128(38, 0)
    assert numeric_arrow_type(typmod(39, 0)) == pa.decimal256(39, 0)
    assert numeric_arrow_type(typmod(76, 76)) == pa.decimal256(76, 76)
    assert numeric_arrow_type(typmod(77, 0)) == pa.string()
    assert numeric_arrow_type(typmod(38, -1)) == pa.decimal256(39, 0)


def test_money(pg: PgDatabase) -> None:
    """money (lc_monetary C): a Decimal with two fraction digits, Arrow string."""
    cases = [
        ("0", D("0.00")),
        ("1234567.891", D("1234567.89")),
        ("-1234567.89", D("-1234567.89")),
        ("-0.05", D("-0.05")),
        ("-92233720368547758.08", D("-92233720368547758.08")),
        ("92233720368547758.07", D("92233720368547758.07")),
        (None, None),
    ]
    with pg.connect() as conn:
        check_samples(conn, "money", cases, expected_arrow=pa.string())


def test_bad_binary_lengths_raise() -> None:
    with pytest.raises(ConversionError, match="int4 value must be 4 bytes, got 3"):
        python_value(b"\x00\x00\x01", oids.INT4_OID)
    with pytest.raises(ConversionError, match="4 bytes long"):
        to_arrow([b"\x00\x00\x00\x01", b"\x00\x01"], oids.INT4_OID)
    with pytest.raises(ConversionError, match="numeric value is malformed"):
        python_value(b"\x00\x02\x00\x00\x00\x00\x00\x01\x00\x01", oids.NUMERIC_OID)
    with pytest.raises(ConversionError, match="not an integer"):
        python_value("1.5", oids.INT8_OID)
    with pytest.raises(ConversionError, match="cannot parse as int32"):
        to_arrow(["1", "x"], oids.INT4_OID)


HYPOTHESIS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@HYPOTHESIS
@given(
    st.lists(
        st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
            lambda d: abs(d.adjusted()) < 1000
        ),
        min_size=1,
        max_size=40,
    )
)
def test_random_numerics(pg: PgDatabase, numbers: list[Decimal]) -> None:
    """Random numerics, printed by the server (text) and sent in binary, in one query."""
    with pg.connect() as conn:
        oid, typmod, text, binary = raw_column(
            conn,
            sql.SQL("SELECT x FROM unnest(%s::text[]::numeric[]) AS x"),
            [[str(n) for n in numbers]],
        )
    for t, b in zip(text, binary, strict=True):
        assert t is not None and b is not None
        server = t.decode()
        assert pg_text(b, oid, typmod) == server
        loaded = python_value(b, oid)
        assert isinstance(loaded, Decimal) and str(loaded) == str(Decimal(server))


@HYPOTHESIS
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=40))
def test_random_int8(pg: PgDatabase, numbers: list[int]) -> None:
    with pg.connect() as conn:
        oid, typmod, text, binary = raw_column(
            conn, sql.SQL("SELECT x FROM unnest(%s::int8[]) AS x"), [numbers]
        )
    assert [python_value(b, oid) for b in binary] == numbers
    assert [pg_text(b, oid, typmod) for b in binary if b is not None] == [
        t.decode() for t in text if t is not None
    ]
    assert to_arrow(binary, oid).to_pylist() == numbers
