"""Typed values from changes, and type names in the relation cache."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pgcdc.decoding import Assembler, RelationCache
from pgcdc.protocol import UNCHANGED_TOAST, Type
from pgcdc.protocol.values import TypeInfo, TypeRegistry
from tests.decoding.wire import Recorder, Wire, dele, feed, ins, rel, upd

COLUMNS = (("id", 23), ("name", 25), ("amount", 1700), ("ok", 16), ("blob", 17))


def _changes(*messages: object) -> Recorder:
    w = Wire(proto=1)
    w.txn(100, rel(columns=COLUMNS), *messages)  # type: ignore[arg-type]
    p = Recorder()
    feed(Assembler(p, proto_version=1), w.take())
    return p


def test_typed_values_by_column_name() -> None:
    p = _changes(
        ins("1", "a", "12.50", "t", "\\x00ff"),
        upd("1", UNCHANGED_TOAST, "13.00", None, UNCHANGED_TOAST),
        dele("1", None, None, None, None),
    )
    insert, update, delete = p.changes
    assert insert.value("id") == 1 and insert.value("amount") == Decimal("12.50")
    assert insert.values() == {
        "id": 1,
        "name": "a",
        "amount": Decimal("12.50"),
        "ok": True,
        "blob": b"\x00\xff",
    }
    # an unchanged TOASTed value is not NULL, and is never converted
    assert update.value("name") is UNCHANGED_TOAST and update.value("ok") is None
    assert update.values()["blob"] is UNCHANGED_TOAST
    assert update.identity() == {"id": 1}
    assert delete.identity() == {"id": 1}
    assert delete.value("id", old=True) == 1
    with pytest.raises(ValueError, match="has no new row"):
        delete.values()


def test_binary_values() -> None:
    w = Wire(proto=1)
    w.txn(100, rel(), ins((5).to_bytes(4, "big"), b"text in binary"))
    p = Recorder()
    feed(Assembler(p, proto_version=1), w.take())
    (change,) = p.changes
    assert change.value("id") == 5 and change.value("v") == "text in binary"


def test_user_types_through_a_registry() -> None:
    registry = TypeRegistry([TypeInfo(90001, "mood", "public", "enum")])
    cache = RelationCache(registry)
    assert cache.type_name(90001) == "public.mood"
    assert cache.type_name(23) == "int4" and cache.type_name(1043) == "varchar"
    assert cache.type_name(90002) is None
    cache.add_type(Type(None, 90002, "s", "pair"))
    assert cache.type_name(90002) == "s.pair"


def test_type_lookup_hook_is_asked_once_per_type() -> None:
    asked: list[int] = []

    def lookup(oid: int) -> str | None:
        asked.append(oid)
        return "ext.thing" if oid == 90003 else None

    cache = RelationCache(type_lookup=lookup)
    assert [cache.type_name(90003) for _ in range(3)] == ["ext.thing"] * 3
    assert cache.type_name(90004) is None and cache.type_name(90004) is None
    assert cache.type_name(25) == "text"  # built in: no lookup
    assert asked == [90003, 90004]
