"""TypeRegistry: built-in types, added types, and user types loaded from a live catalog."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from pgcdc.protocol.values import (
    DEFAULT_REGISTRY,
    ConversionError,
    TypeInfo,
    TypeRegistry,
    arrow_type,
    loader,
    oids,
    pg_text,
    python_value,
    to_arrow,
)
from tests.fix_pg import PgDatabase
from tests.protocol.values.checks import check_samples
from tests.protocol.values.sampling import sample


def test_builtins() -> None:
    reg = TypeRegistry()
    assert reg.get(oids.INT4_OID) == TypeInfo(23, "int4", "pg_catalog", "base", 0, 0, 1007)
    array = reg.get(oids.INT4_ARRAY_OID)
    assert array is not None and array.kind == "array" and array.element_oid == 23
    box = reg.get(oids.BOX_OID)
    assert box is not None and box.delimiter == ";"
    name = reg.get(oids.NAME_OID)
    assert name is not None and name.kind == "base" and name.element_oid == 0
    assert reg.get(999_999) is None
    assert oids.TEXT_OID in reg and 999_999 not in reg
    assert len(reg) == len(oids.BUILTIN_TYPES)
    assert [t.oid for t in reg][:3] == [16, 17, 18]


def test_add_clears_cached_conversions() -> None:
    reg = TypeRegistry()
    assert python_value(b"happy", 400_000, reg) == b"happy"  # unknown: stays bytes
    assert arrow_type(400_000, -1, reg, binary=True) == pa.binary()
    reg.add(TypeInfo(400_000, "mood", "public", "enum", array_oid=400_001))
    reg.add(TypeInfo(400_001, "_mood", "public", "array", element_oid=400_000))
    assert python_value(b"happy", 400_000, reg) == "happy"
    assert python_value("{happy,NULL}", 400_001, reg) == ["happy", None]
    assert arrow_type(400_000, -1, reg, binary=True) == pa.string()
    assert reg.get(400_000) == TypeInfo(400_000, "mood", "public", "enum", array_oid=400_001)
    assert DEFAULT_REGISTRY.get(400_000) is None
    with pytest.raises(TypeError, match="takes a TypeInfo"):
        reg.add((1, "x"))  # type: ignore[arg-type]


def test_domain_chain_resolution() -> None:
    reg = TypeRegistry(
        [
            TypeInfo(
                500_000,
                "price",
                "public",
                "domain",
                base_oid=oids.NUMERIC_OID,
                type_modifier=((10 << 16) | 2) + 4,
            ),
            TypeInfo(500_001, "positive_price", "public", "domain", base_oid=500_000),
            TypeInfo(500_002, "loop", "public", "domain", base_oid=500_002),
        ]
    )
    resolved = reg.resolve(500_001)
    assert resolved is not None and resolved.oid == oids.NUMERIC_OID
    assert reg.domain_type_modifier(500_001) == ((10 << 16) | 2) + 4
    assert arrow_type(500_001, -1, reg) == pa.decimal128(10, 2)
    assert reg.resolve(500_002) is None  # a cycle is an unknown type, not a hang
    assert python_value("x", 500_002, reg) == "x"


def test_load_user_types(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        conn.execute("CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0)")
        conn.execute("CREATE DOMAIN small_price AS price CHECK (VALUE < 100)")
        conn.execute("CREATE DOMAIN stamp AS timestamptz")
        conn.execute("CREATE TYPE pair AS (a int, b text)")
        conn.execute("CREATE TYPE floatrange AS RANGE (subtype = float8)")
        reg = TypeRegistry()
        loaded = reg.load(conn)
        oid_of = dict(
            conn.execute(
                "SELECT typname::text, oid::int FROM pg_type WHERE typname IN "
                "('mood', '_mood', 'price', '_price', 'small_price', 'stamp', 'pair', "
                "'floatrange', 'floatmultirange')"
            ).fetchall()
        )
    assert loaded >= len(oid_of)
    kinds = {name: reg.get(oid).kind for name, oid in oid_of.items()}  # type: ignore[union-attr]
    assert kinds == {
        "mood": "enum",
        "_mood": "array",
        "price": "domain",
        "_price": "array",
        "small_price": "domain",
        "stamp": "domain",
        "pair": "composite",
        "floatrange": "range",
        "floatmultirange": "multirange",
    }
    price = reg.get(oid_of["price"])
    assert price is not None and price.base_oid == oids.NUMERIC_OID
    assert price.type_modifier == ((10 << 16) | 2) + 4 and price.namespace == "public"
    assert reg.get(oid_of["_mood"]).element_oid == oid_of["mood"]  # type: ignore[union-attr]
    assert reg.resolve(oid_of["small_price"]) == reg.get(oids.NUMERIC_OID)


def test_domains_convert_as_their_base_type(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        conn.execute("CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0)")
        conn.execute("CREATE DOMAIN small_price AS price")
        conn.execute("CREATE DOMAIN stamp AS timestamptz")
        reg = TypeRegistry()
        reg.load(conn)
        oid_of = dict(
            conn.execute(
                "SELECT typname::text, oid::int FROM pg_type "
                "WHERE typname IN ('price', '_price', 'small_price', 'stamp')"
            ).fetchall()
        )
        cases: list[tuple[str | None, object]] = [("1.5", Decimal("1.50")), (None, None)]
        for name in ("price", "small_price"):
            got = check_samples(
                conn,
                name,
                cases,
                registry=reg,
                type_oid=oid_of[name],
                expected_arrow=pa.decimal128(10, 2),
                arrow_values=[Decimal("1.50"), None],
            )
        check_samples(
            conn,
            "price[]",
            [("{1.5,NULL}", [Decimal("1.50"), None])],
            registry=reg,
            type_oid=oid_of["_price"],
            expected_arrow=pa.list_(pa.decimal128(10, 2)),
        )
        stamp = sample(conn, "stamp", ["2024-01-02 03:04:05+00"], timezone="America/New_York")
    binary = stamp.binary[0]
    assert binary is not None
    assert pg_text(binary, oid_of["stamp"], -1, reg, timezone="America/New_York") == (stamp.text[0])
    assert got.typmod in (-1, ((10 << 16) | 2) + 4)


def test_composites_and_ranges_stay_raw(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        conn.execute("CREATE TYPE pair AS (a int, b text)")
        reg = TypeRegistry()
        reg.load(conn)
        got = sample(conn, "pair", ['(1,"x y")', None])
        ranges = sample(conn, "int4range", ["[1,5)"])
    assert python_value(got.text[0], got.oid, reg) == '(1,"x y")'
    assert isinstance(python_value(got.binary[0], got.oid, reg), bytes)
    assert to_arrow(got.text, got.oid, -1, reg).to_pylist() == ['(1,"x y")', None]
    assert to_arrow(got.binary, got.oid, -1, reg).type == pa.binary()
    # pg_text reads their binary form itself (tests/protocol/values/test_ranges_records.py)
    assert pg_text(got.binary[0], got.oid, -1, reg) == '(1,"x y")'  # type: ignore[arg-type]
    assert python_value(ranges.text[0], ranges.oid) == "[1,5)"
    assert isinstance(python_value(ranges.binary[0], ranges.oid), bytes)


def test_a_binary_value_of_an_unknown_base_type_cannot_be_printed() -> None:
    reg = TypeRegistry([TypeInfo(70_000, "hstore", "public", "base")])
    with pytest.raises(ConversionError, match=r"public\.hstore.*text format"):
        pg_text(b"\x00", 70_000, -1, reg)


def test_loader_is_cached_per_registry() -> None:
    reg = TypeRegistry()
    load = loader(oids.INT4_OID, reg)
    assert load is loader(oids.INT4_OID, reg)
    assert load("12") == 12
    load_binary = loader(oids.INT4_OID, reg, binary=True)
    assert load_binary(b"\x00\x00\x00\x0c") == 12
    load_array = loader(oids.INT4_ARRAY_OID, reg)
    assert load_array is loader(oids.INT4_ARRAY_OID, reg)
    assert load_array("{1,NULL}") == [1, None]
    assert loader(oids.INT4_ARRAY_OID) is not load_array  # each registry has its own cache
