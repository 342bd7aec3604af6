"""The public entry points: type checks, unknown types, UNCHANGED_TOAST, formats."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgcdc.protocol.messages import UNCHANGED_TOAST
from pgcdc.protocol.values import arrow_type, oids, pg_text, python_value, to_arrow
from pgcdc.protocol.values.adapt import CONVERTERS

UNKNOWN_OID = 4_000_000_000


def test_unknown_types_stay_raw() -> None:
    assert python_value("anything", UNKNOWN_OID) == "anything"
    assert python_value(b"\x00\x01", UNKNOWN_OID) == b"\x00\x01"
    assert python_value(None, UNKNOWN_OID) is None
    assert arrow_type(UNKNOWN_OID) == pa.string()
    assert arrow_type(UNKNOWN_OID, binary=True) == pa.binary()
    assert to_arrow(["a", None], UNKNOWN_OID).to_pylist() == ["a", None]
    assert to_arrow([b"a", None], UNKNOWN_OID).type == pa.binary()
    assert to_arrow([None, None], UNKNOWN_OID).type == pa.string()
    assert to_arrow([None], UNKNOWN_OID, binary=True).type == pa.binary()
    assert pg_text("as sent", UNKNOWN_OID) == "as sent"


def test_text_values_are_their_own_text() -> None:
    assert pg_text("1.50", oids.NUMERIC_OID) == "1.50"
    assert pg_text("2024-01-02 03:04:05+00", oids.TIMESTAMPTZ_OID, timezone="Asia/Tokyo") == (
        "2024-01-02 03:04:05+00"
    )


def test_unchanged_toast_is_refused() -> None:
    with pytest.raises(TypeError, match=r"UNCHANGED_TOAST.*mask"):
        to_arrow(["a", UNCHANGED_TOAST, None], oids.TEXT_OID)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="UNCHANGED_TOAST"):
        python_value(UNCHANGED_TOAST, oids.TEXT_OID)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="UNCHANGED_TOAST"):
        pg_text(UNCHANGED_TOAST, oids.TEXT_OID)  # type: ignore[arg-type]


def test_bad_value_types() -> None:
    with pytest.raises(TypeError, match="both text"):
        to_arrow(["1", b"\x00\x00\x00\x01"], oids.INT4_OID)
    with pytest.raises(TypeError, match="not int"):
        to_arrow([1], oids.INT4_OID)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="binary=True but got str"):
        to_arrow(["1"], oids.INT4_OID, binary=True)
    with pytest.raises(TypeError, match="not bytearray"):
        python_value(bytearray(b"x"), oids.BYTEA_OID)  # type: ignore[arg-type]


def test_to_arrow_accepts_any_sequence() -> None:
    assert to_arrow(("1", None, "3"), oids.INT4_OID).to_pylist() == [1, None, 3]
    assert to_arrow([], oids.INT8_OID).type == pa.int64()


def test_every_listed_type_has_a_converter() -> None:
    listed = [
        "BOOL", "INT2", "INT4", "INT8", "OID", "FLOAT4", "FLOAT8", "NUMERIC", "TEXT",
        "VARCHAR", "BPCHAR", "NAME", "CHAR", "BYTEA", "UUID", "DATE", "TIME", "TIMETZ",
        "TIMESTAMP", "TIMESTAMPTZ", "INTERVAL", "JSON", "JSONB", "INET", "CIDR", "MACADDR",
        "MACADDR8", "BIT", "VARBIT", "MONEY",
    ]  # fmt: skip
    for name in listed:
        assert getattr(oids, f"{name}_OID") in CONVERTERS, name
