"""The columnar decoder: the same changes as the row decoder, typed, per relation, in Arrow.

Streams are built with the Encoder from hypothesis-generated relations and values (text and
binary format, NULL, unchanged TOAST, updates with 'K', 'O' or no old tuple, deletes with 'K' or
'O', streamed blocks with Xids, schema changes mid-batch) and decoded both ways: every columnar
cell must equal the row decoder's value converted by an independent parser written here (for
the types the columnar decoder reads itself) or by ``pgcdc.protocol.values`` (for the types it
hands over). Real PostgreSQL 15 and 18 servers then produce the streams, in text and binary
format, and the typed values must equal what psycopg reads from the table. Malformed input
raises only ProtocolError: exactly the error the row decoder raises on the first bad message.
"""

from __future__ import annotations

import ipaddress
import json
import math
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, localcontext
from typing import Any
from unittest import mock

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    CopyFormatError,
    Decoder,
    Delete,
    Encoder,
    Insert,
    ProtocolError,
    Relation,
    ReplicationMessage,
    StreamStart,
    StreamStop,
    Type,
    Update,
    encode_tuple,
)
from pgcdc.protocol.arrow import columnar
from pgcdc.protocol.arrow.columnar import ColumnarBatch, ColumnarDecoder, RelationBatch
from pgcdc.protocol.message_types import MessageType
from pgcdc.protocol.values import to_arrow
from pgcdc.protocol.values.registry import TypeInfo, TypeRegistry
from tests.fix_pg import PgDatabase

UNIX_EPOCH = datetime(1970, 1, 1)
UNIX_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
PG_EPOCH_DATE = date(2000, 1, 1)
PG_EPOCH_MICROS = 946_684_800_000_000
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
TIME = datetime(2024, 1, 1, tzinfo=UTC)


# -- plain forms: what a column holds, comparable with == ------------------------------------


def plain(array: pa.Array) -> list[Any]:
    """Python values of an Arrow array; dates and times as their storage integers."""
    kind = array.type
    if pa.types.is_timestamp(kind) or pa.types.is_time64(kind):
        array = array.cast(pa.int64())
    elif pa.types.is_date32(kind):
        array = array.cast(pa.int32())
    return array.to_pylist()


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def micros(value: datetime) -> int:
    base = UNIX_EPOCH_UTC if value.tzinfo is not None else UNIX_EPOCH
    return (value - base) // timedelta(microseconds=1)


# -- PostgreSQL value formats (what the server's output and send functions produce) ------------


def pg_float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def pg_float4(value: float) -> str:
    text = str(np.float32(value))
    return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(text, text)


def numeric_binary(value: Decimal, dscale: int) -> bytes:
    """numeric_send: base-10000 digits, weight, sign, display scale."""
    if value.is_nan():
        return struct.pack(">hhHH", 0, 0, 0xC000, 0)
    sign = 0x4000 if value < 0 else 0
    text = format(value.copy_abs(), f".{dscale}f")
    whole, _, fraction = text.partition(".")
    whole = whole.lstrip("0")
    whole = whole.rjust((len(whole) + 3) // 4 * 4, "0")
    fraction = fraction.ljust((len(fraction) + 3) // 4 * 4, "0")
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i : i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight, sign = 0, 0
    return struct.pack(f">hhHH{len(groups)}h", len(groups), weight, sign, dscale, *groups)


def numeric_from_binary(data: bytes) -> Decimal:
    ndigits, weight, sign, dscale = struct.unpack_from(">hhHH", data)
    assert sign in (0, 0x4000)
    digits = struct.unpack_from(f">{ndigits}h", data, 8)
    with localcontext() as ctx:
        ctx.prec = 200
        total = sum((Decimal(d) * Decimal(10000) ** (weight - k) for k, d in enumerate(digits)),
                    Decimal(0))  # fmt: skip
        total = total.quantize(Decimal(1).scaleb(-dscale))
    return total.copy_negate() if sign else total


def pg_timestamp(value: datetime) -> str:
    text = (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    )
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text


def pg_offset(seconds: int) -> str:
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{sign}{hours:02d}"
    if minutes or secs:
        text += f":{minutes:02d}"
    if secs:
        text += f":{secs:02d}"
    return text


def pg_time(value: time) -> str:
    text = f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text


INFINITY = "infinity"
NEG_INFINITY = "-infinity"


def pg_ts_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return pg_timestamp(value)


def pg_ts_binary(value: Any) -> bytes:
    if value == INFINITY:
        return struct.pack(">q", INT64_MAX)
    if value == NEG_INFINITY:
        return struct.pack(">q", INT64_MIN)
    return struct.pack(">q", micros(value) - PG_EPOCH_MICROS)


def pg_tstz_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    moment, offset = value
    return pg_timestamp(moment.replace(tzinfo=None) + timedelta(seconds=offset)) + pg_offset(offset)


def pg_tstz_binary(value: Any) -> bytes:
    if isinstance(value, str):
        return pg_ts_binary(value)
    return pg_ts_binary(value[0])


# -- independent parsers: the row decoder's str/bytes -> the plain column value -------------------


def ts_from_text(text: str) -> int:
    if text == INFINITY:
        return INT64_MAX
    if text == NEG_INFINITY:
        return INT64_MIN
    return micros(datetime.fromisoformat(text))


def ts_from_binary(data: bytes) -> int:
    (value,) = struct.unpack(">q", data)
    if value in (INT64_MAX, INT64_MIN):
        return int(value)
    return int(value) + PG_EPOCH_MICROS


_DATE_INFINITY = {INFINITY: INT32_MAX, NEG_INFINITY: INT32_MIN}
_UNIX_DAYS = (PG_EPOCH_DATE - date(1970, 1, 1)).days


def pg_date(value: date | str) -> str:
    if isinstance(value, str):
        return value
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"


def pg_date_binary(value: date | str) -> bytes:
    if isinstance(value, str):
        return struct.pack(">i", _DATE_INFINITY[value])
    return struct.pack(">i", (value - PG_EPOCH_DATE).days)


def date_from_text(text: str) -> int:
    if text in _DATE_INFINITY:
        return _DATE_INFINITY[text]
    return (date.fromisoformat(text) - date(1970, 1, 1)).days


def date_from_binary(data: bytes) -> int:
    (days,) = struct.unpack(">i", data)
    if days in (INT32_MAX, INT32_MIN):
        return int(days)
    return int(days) + _UNIX_DAYS


def jsonb_from_binary(data: bytes) -> str:
    assert data[0] == 1
    return data[1:].decode()


@dataclass(frozen=True)
class Kind:
    """A PostgreSQL type in the generated streams: values, their two formats, their oracle.

    ``parse_text``/``parse_binary`` None means the oracle is ``pgcdc.protocol.values``.
    """

    name: str
    oid: int
    values: st.SearchStrategy[Any]
    text: Callable[[Any], str] | None
    binary: Callable[[Any], bytes] | None
    parse_text: Callable[[str], Any] | None
    parse_binary: Callable[[bytes], Any] | None
    typmod: int = -1


def _ints(bits: int, fmt: str) -> Kind:
    name = {16: "int2", 32: "int4", 64: "int8"}[bits]
    oid = {16: 21, 32: 23, 64: 20}[bits]
    return Kind(
        name,
        oid,
        st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1),
        str,
        lambda v: struct.pack(fmt, v),
        int,
        lambda b: int.from_bytes(b, "big", signed=True),
    )


_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
_JSON = st.dictionaries(
    st.text(max_size=4), st.integers(-5, 5) | st.text(max_size=4), max_size=3
).map(json.dumps)
_DATES = st.dates(date(1, 1, 1), date(9999, 12, 31))
_TIMESTAMPS = st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30))
_OFFSETS = st.integers(-12 * 60, 14 * 60).map(lambda m: m * 60) | st.sampled_from(
    [20_008, -3_600 - 7]
)
_TSTZ = st.tuples(
    st.datetimes(datetime(1800, 1, 1), datetime(2200, 1, 1)).map(lambda d: d.replace(tzinfo=UTC)),
    _OFFSETS,
)


def _numeric(precision: int, scale: int) -> Kind:
    bound = 10**precision - 1
    return Kind(
        f"numeric({precision},{scale})",
        1700,
        st.integers(-bound, bound).map(lambda u: Decimal(f"{u}E-{scale}")),
        lambda d: format(d, f".{scale}f"),
        lambda d: numeric_binary(d, scale),
        Decimal,
        numeric_from_binary,
        typmod=((precision << 16) | scale) + 4,
    )


def _unconstrained(value: Decimal) -> int:
    return max(0, -int(value.as_tuple().exponent)) if value.is_finite() else 0


KINDS: list[Kind] = [
    _ints(16, ">h"),
    _ints(32, ">i"),
    _ints(64, ">q"),
    Kind("oid", 26, st.integers(0, 2**32 - 1), str, lambda v: struct.pack(">I", v), int,
         lambda b: int.from_bytes(b, "big")),
    Kind("float8", 701, st.floats(), pg_float, lambda v: struct.pack(">d", v), float,
         lambda b: struct.unpack(">d", b)[0]),
    Kind("float4", 700, st.floats(width=32), pg_float4, lambda v: struct.pack(">f", v),
         lambda s: float(np.float32(s)), lambda b: struct.unpack(">f", b)[0]),
    Kind("bool", 16, st.booleans(), lambda v: "t" if v else "f", lambda v: bytes([v]),
         lambda s: s == "t", lambda b: b != b"\x00"),
    Kind("text", 25, _TEXT, str, str.encode, str, bytes.decode),
    Kind("varchar", 1043, _TEXT, str, str.encode, str, bytes.decode),
    Kind("bpchar", 1042, _TEXT, str, str.encode, str, bytes.decode),
    Kind("name", 19, _TEXT, str, str.encode, str, bytes.decode),
    Kind("json", 114, _JSON, str, str.encode, str, bytes.decode),
    Kind("jsonb", 3802, _JSON, str, lambda s: b"\x01" + s.encode(), str, jsonb_from_binary),
    Kind("date", 1082, _DATES | st.sampled_from([INFINITY, NEG_INFINITY]), pg_date,
         pg_date_binary, date_from_text, date_from_binary),
    Kind("timestamp", 1114, _TIMESTAMPS | st.sampled_from([INFINITY, NEG_INFINITY]), pg_ts_text,
         pg_ts_binary, ts_from_text, ts_from_binary),
    Kind("timestamptz", 1184, _TSTZ | st.sampled_from([INFINITY, NEG_INFINITY]), pg_tstz_text,
         pg_tstz_binary, ts_from_text, ts_from_binary),
    Kind("numeric", 1700, st.decimals(allow_infinity=False, places=None, min_value=-(10**30),
                                      max_value=10**30) | st.just(Decimal("NaN")),
         lambda d: "NaN" if d.is_nan() else format(d, "f"),
         lambda d: numeric_binary(d, _unconstrained(d)), str, None),
    Kind("bytea", 17, st.binary(max_size=12), lambda b: "\\x" + b.hex(), bytes, None, bytes),
    Kind("uuid", 2950, st.uuids(), str, lambda u: u.bytes, str, None),
    Kind("time", 1083, st.times(), pg_time,
         lambda t: struct.pack(">q", ((t.hour * 60 + t.minute) * 60 + t.second) * 10**6
                               + t.microsecond), None, None),
    Kind("interval", 1186, st.tuples(st.integers(-100, 100), st.integers(-100, 100),
                                     st.integers(-(10**12), 10**12)),
         None, lambda v: struct.pack(">qii", v[2], v[1], v[0]), None, None),
    Kind("int4[]", 1007, st.lists(st.integers(-5, 5) | st.none(), max_size=3),
         lambda xs: "{" + ",".join("NULL" if x is None else str(x) for x in xs) + "}", None,
         None, None),
]  # fmt: skip
KINDS_BY_OID = {k.oid: k for k in KINDS}


def kind_of(column: Column) -> Kind | None:
    if column.type_id == 1700 and column.type_modifier != -1:
        packed = column.type_modifier - 4
        precision, scale = packed >> 16, packed & 0xFFFF
        if 1 <= precision <= 38 and scale <= precision:
            return _numeric(precision, scale)
        return None  # what pgcdc.protocol.values makes of odd type modifiers is its business
    return KINDS_BY_OID.get(column.type_id)


def oracle(column: Column, value: str | bytes) -> Any:
    """The plain column value the row decoder's ``value`` stands for."""
    kind = kind_of(column)
    parse = None
    if kind is not None:
        parse = kind.parse_text if isinstance(value, str) else kind.parse_binary
    if parse is None:
        return plain(to_arrow([value], column.type_id, column.type_modifier))[0]
    return parse(value)  # type: ignore[arg-type]


# -- generated streams -----------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A relation and, per column, its kind and value format ('t', 'b' or 'mixed')."""

    relation: Relation
    kinds: tuple[Kind, ...]
    formats: tuple[str, ...]


@st.composite
def kinds(draw: st.DrawFn) -> Kind:
    if draw(st.integers(0, 5)) == 0:
        precision = draw(st.integers(1, 40))
        return _numeric(precision, draw(st.integers(0, precision)))
    return draw(st.sampled_from(KINDS))


@st.composite
def specs(draw: st.DrawFn, relid: int) -> Spec:
    ncols = draw(st.integers(0, 5))
    picked = [draw(kinds()) for _ in range(ncols)]
    formats = []
    for kind in picked:
        choices = [f for f, ok in (("t", kind.text), ("b", kind.binary)) if ok is not None]
        if len(choices) == 2:
            choices.append("mixed")
        formats.append(draw(st.sampled_from(choices)))
    columns = tuple(
        Column(flags=draw(st.sampled_from([0, 1])), name=f"c{i}_{k.name}", type_id=k.oid,
               type_modifier=k.typmod)
        for i, k in enumerate(picked)
    )  # fmt: skip
    relation = Relation(
        xid=None,
        relation_id=relid,
        namespace=draw(st.sampled_from(["public", "", "sales"])),
        name=f"t{relid}",
        replica_identity=draw(st.sampled_from("dnfi")),
        columns=columns,
    )
    return Spec(relation, tuple(picked), tuple(formats))


@st.composite
def tuples(draw: st.DrawFn, spec: Spec) -> tuple[Any, ...]:
    values: list[Any] = []
    for kind, fmt in zip(spec.kinds, spec.formats, strict=True):
        roll = draw(st.integers(0, 19))
        if roll < 2:
            values.append(None)
        elif roll == 2:  # also in old tuples, where it reads as null
            values.append(UNCHANGED_TOAST)
        else:
            value = draw(kind.values)
            use = fmt if fmt != "mixed" else draw(st.sampled_from("tb"))
            if use == "t":
                assert kind.text is not None
                values.append(kind.text(value))
            else:
                assert kind.binary is not None
                values.append(kind.binary(value))
    return tuple(values)


@st.composite
def changes(draw: st.DrawFn, spec: Spec, xid: int | None) -> ReplicationMessage:
    relid = spec.relation.relation_id
    op = draw(st.sampled_from("IIUUD"))
    if op == "I":
        return Insert(xid=xid, relation_id=relid, new=draw(tuples(spec)))
    if op == "U":
        kind = draw(st.sampled_from([None, "K", "O"]))
        old = None if kind is None else draw(tuples(spec))
        return Update(xid=xid, relation_id=relid, old_kind=kind, old=old, new=draw(tuples(spec)))
    kind = draw(st.sampled_from(["K", "O"]))
    return Delete(xid=xid, relation_id=relid, old_kind=kind, old=draw(tuples(spec)))


@st.composite
def streams(draw: st.DrawFn, max_blocks: int = 4) -> tuple[int, list[bytes]]:
    """A stream: transactions and streamed blocks of changes to two relations, whose schemas
    may change between changes."""
    proto = draw(st.sampled_from([1, 2, 4]))
    messages: list[ReplicationMessage] = []
    current: dict[int, Spec] = {}
    for _ in range(draw(st.integers(1, max_blocks))):
        streamed = proto >= 2 and draw(st.booleans())
        xid = draw(st.integers(1, 2**32 - 1)) if streamed else None
        if streamed:
            messages.append(StreamStart(xid=xid, first_segment=draw(st.booleans())))  # type: ignore[arg-type]
        else:
            messages.append(Begin(final_lsn=Lsn(100), commit_time=TIME, xid=7))
        for _ in range(draw(st.integers(1, 10))):
            relid = draw(st.sampled_from([16384, 16385]))
            if relid not in current or draw(st.integers(0, 7)) == 0:
                spec = current[relid] = draw(specs(relid))
                messages.append(replace(spec.relation, xid=xid))
            elif draw(st.integers(0, 15)) == 0:  # the same schema described again
                messages.append(replace(current[relid].relation, xid=xid))
            messages.append(draw(changes(current[relid], xid)))
        if streamed:
            messages.append(StreamStop())
        else:
            messages.append(
                Commit(flags=0, commit_lsn=Lsn(100), end_lsn=Lsn(120), commit_time=TIME)
            )
    encoder = Encoder(proto)
    return proto, [encoder.encode(m) for m in messages]


# -- the comparison ---------------------------------------------------------------------------


@dataclass
class Rows:
    """A RelationBatch as plain Python lists."""

    part: RelationBatch
    meta: dict[str, list[Any]]  # _seq, _op, _xid
    new: list[list[Any]]  # per relation column
    old_valid: list[bool]
    old: list[list[Any]]


def as_rows(part: RelationBatch) -> Rows:
    batch = part.batch
    ncols = len(part.relation.columns)
    old = batch.column(3 + ncols)
    return Rows(
        part,
        {name: batch.column(name).to_pylist() for name in ("_seq", "_op", "_xid")},
        [plain(batch.column(3 + j)) for j in range(ncols)],
        old.is_valid().to_pylist(),
        [plain(old.field(j)) for j in range(ncols)],
    )


def check_same_as_row_decoder(proto: int, data: Sequence[bytes], result: ColumnarBatch) -> None:
    """Every change in ``result`` equals what the row decoder gives, converted per type."""
    where: dict[int, tuple[Rows, int]] = {}
    for part in result.changes:
        rows = as_rows(part)
        assert part.batch.schema.names[:3] == ["_seq", "_op", "_xid"]
        assert part.batch.schema.names[-3:] == ["_old", "_old_kind", "_unchanged"]
        for r, seq in enumerate(rows.meta["_seq"]):
            assert seq not in where
            where[seq] = (rows, r)
    decoder = Decoder(proto)
    relations: dict[int, Relation] = {}
    others = []
    for index, message_bytes in enumerate(data):
        message = decoder.decode(message_bytes)
        if isinstance(message, Relation):
            relations[message.relation_id] = message
        if not isinstance(message, Insert | Update | Delete):
            others.append((index, message))
            continue
        rows, r = where.pop(index)
        relation = relations[message.relation_id]
        assert rows.part.relation.relation_id == relation.relation_id
        assert rows.part.relation.columns == relation.columns
        assert rows.part.relation.name == relation.name
        op = {Insert: "I", Update: "U", Delete: "D"}[type(message)]
        assert rows.meta["_op"][r] == op
        assert rows.meta["_xid"][r] == message.xid
        unchanged = rows.part.batch.column("_unchanged")[r].as_py()
        new = None if isinstance(message, Delete) else message.new
        expected_unchanged = []
        for j, column in enumerate(relation.columns):
            got = rows.new[j][r]
            value = None if new is None else new[j]
            if value is None or value is UNCHANGED_TOAST:
                assert got is None, (column, value, got)
                if value is UNCHANGED_TOAST:
                    expected_unchanged.append(column.name)
            else:
                want = oracle(column, value)  # type: ignore[arg-type]
                assert same(got, want), (column, value, got, want)
        assert unchanged == expected_unchanged
        old = message.old if isinstance(message, Update | Delete) else None
        old_kind = message.old_kind if isinstance(message, Update | Delete) else None
        assert rows.part.batch.column("_old_kind")[r].as_py() == old_kind
        assert rows.old_valid[r] == (old is not None)
        if old is not None:
            for j, column in enumerate(relation.columns):
                got = rows.old[j][r]
                value = old[j]
                if value is None or value is UNCHANGED_TOAST:
                    assert got is None
                else:
                    assert same(got, oracle(column, value)), (column, value, got)  # type: ignore[arg-type]
    assert not where, "rows the input does not have"
    assert list(result.others) == others
    assert result.message_count == len(data)
    seqs = [part.batch.column("_seq")[0].as_py() for part in result.changes]
    assert seqs == sorted(seqs)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(streams(), st.integers(1, 8))
def test_same_changes_as_the_row_decoder(stream: tuple[int, list[bytes]], block: int) -> None:
    proto, data = stream
    result = ColumnarDecoder(proto).decode(data)
    check_same_as_row_decoder(proto, data, result)
    assert result.change_count == sum(1 for m in data if m[:1] in (b"I", b"U", b"D"))
    # long inputs are decoded a block at a time and the blocks' batches joined
    with mock.patch.object(columnar, "_BLOCK_MESSAGES", block):
        blocked = ColumnarDecoder(proto).decode(data)
    check_same_as_row_decoder(proto, data, blocked)
    assert [p.batch.num_rows for p in blocked.changes] == [p.batch.num_rows for p in result.changes]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_chunks_decode_like_the_whole(stream: tuple[int, list[bytes]], sizes: list[int]) -> None:
    """State (relations, an open streamed block) carries across calls."""
    proto, data = stream
    decoder = ColumnarDecoder(proto)
    start = 0
    parts: list[RelationBatch] = []
    others: list[tuple[int, ReplicationMessage]] = []
    cuts = iter(sizes * (len(data) + 1))
    while start < len(data):
        stop = min(len(data), start + next(cuts))
        result = decoder.decode(data[start:stop])
        for part in result.changes:
            seq = pa.array([s + start for s in part.batch.column("_seq").to_pylist()], pa.int64())
            parts.append(RelationBatch(part.relation, part.batch.set_column(0, "_seq", seq)))
        others += [(i + start, m) for i, m in result.others]
        start = stop
    whole = ColumnarBatch(tuple(parts), tuple(others), len(data))
    check_same_as_row_decoder(proto, data, whole)


Context = list[tuple[int, int | None]]


def without_stream_blocks(data: Sequence[bytes]) -> tuple[list[bytes], Context, list[int]]:
    """``data`` without its Stream Start and Stop messages, the stream context that says which
    of the remaining messages were inside a block (as a spool reader has them), and each
    remaining message's index in ``data``."""
    kept: list[bytes] = []
    context: Context = []
    where: list[int] = []
    for index, message in enumerate(data):
        if message[0] == MessageType.STREAM_START:
            context.append((len(kept), struct.unpack_from("!I", message, 1)[0]))
        elif message[0] == MessageType.STREAM_STOP:
            context.append((len(kept), None))
        else:
            kept.append(message)
            where.append(index)
    return kept, context, where


@SETTINGS
@given(streams(), st.integers(1, 8))
def test_stream_context_given_directly_reads_like_the_blocks(
    stream: tuple[int, list[bytes]], block: int
) -> None:
    """Messages read out of their stream, without Stream Start/Stop, decode with their Xids
    when the context is given; blocks never span a change of context."""
    proto, data = stream
    kept, context, where = without_stream_blocks(data)
    with mock.patch.object(columnar, "_BLOCK_MESSAGES", block):
        decoder = ColumnarDecoder(proto)
        direct = decoder.decode(kept, streams=context)
    assert decoder.stream_xid is None
    parts = []
    for part in direct.changes:  # as if decoded from ``data``: _seq of the original messages
        seq = pa.array([where[s] for s in part.batch.column("_seq").to_pylist()], pa.int64())
        parts.append(RelationBatch(part.relation, part.batch.set_column(0, "_seq", seq)))
    # the Stream Start/Stop messages the decoder never saw, as the row decoder reads them
    row_decoder = Decoder(proto)
    blocks = [
        (i, message)
        for i, message in enumerate(row_decoder.decode(m) for m in data)
        if isinstance(message, StreamStart | StreamStop)
    ]
    others = sorted([*((where[i], m) for i, m in direct.others), *blocks], key=lambda o: o[0])
    check_same_as_row_decoder(proto, data, ColumnarBatch(tuple(parts), tuple(others), len(data)))


def test_a_spools_run_of_transactions_is_one_block() -> None:
    """A context naming every transaction of a spool, none of them streamed, decodes in one
    block: one vectorised pass, not a pass per transaction (each costs about 2 ms)."""
    relation, _ = _plain_stream()
    encoder = Encoder(2)
    changes = [
        encoder.encode(Insert(xid=None, relation_id=16384, new=(str(i), "1", "x")))
        for i in range(50)
    ]
    messages = [encoder.encode(relation), *changes]
    context: Context = [(0, None), *((i, None) for i in range(1, 51, 2))]
    decoder = ColumnarDecoder(2)
    with mock.patch.object(
        ColumnarDecoder, "_decode_block", autospec=True, side_effect=ColumnarDecoder._decode_block
    ) as blocks:
        result = decoder.decode(messages, streams=context)
    assert blocks.call_count == 1
    (part,) = result.changes
    assert part.batch.column("id").to_pylist() == list(range(50))
    assert part.batch.column("_seq").to_pylist() == list(range(1, 51))


def test_stream_context_out_of_order_is_refused() -> None:
    with pytest.raises(ValueError, match="index order"):
        ColumnarDecoder(2).decode([b"x", b"y"], streams=[(1, 5), (0, None)])


# -- malformed input ---------------------------------------------------------------------------


def reference_error(proto: int, data: Sequence[bytes]) -> tuple[str | None, int, str] | None:
    """The first error in ``data``: the row decoder's, or a change it cannot place."""
    decoder = Decoder(proto)
    relations: dict[int, Relation] = {}
    for message_bytes in data:
        try:
            message = decoder.decode(message_bytes)
        except ProtocolError as exc:
            return exc.message_type, exc.offset, exc.reason
        if isinstance(message, Relation):
            relations[message.relation_id] = message
        elif isinstance(message, Insert | Update | Delete):
            code = message_bytes[:1].decode()
            at = 1 if message.xid is None else 5
            relation = relations.get(message.relation_id)
            if relation is None:
                return code, at, "no Relation message"
            pos = at + 5
            if isinstance(message, Update) and message.old is not None:
                if len(message.old) != len(relation.columns):
                    return code, pos, "TupleData has"
                pos += len(encode_tuple(message.old)) + 1
            tuple_ = message.new if isinstance(message, Insert | Update) else message.old
            if len(tuple_) != len(relation.columns):
                return code, pos, "TupleData has"
    return None


@st.composite
def damaged(draw: st.DrawFn) -> tuple[int, list[bytes]]:
    proto, data = draw(streams(max_blocks=2))
    data = list(data)
    index = draw(st.integers(0, len(data) - 1))
    message = bytearray(data[index])
    how = draw(st.sampled_from(["truncate", "set", "insert", "delete", "drop", "append"]))
    at = draw(st.integers(0, len(message)))
    if how == "truncate":
        del message[at:]
    elif how == "set" and at < len(message):
        message[at] = draw(st.integers(0, 255))
    elif how == "insert":
        message[at:at] = draw(st.binary(min_size=1, max_size=6))
    elif how == "delete":
        del message[at : at + draw(st.integers(1, 6))]
    elif how == "append":
        message += draw(st.binary(min_size=1, max_size=6))
    if how == "drop":
        del data[index]
    else:
        data[index] = bytes(message)
    return proto, data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged(), st.sampled_from([3, 32_768]))
def test_damaged_input_raises_the_row_decoders_error(
    stream: tuple[int, list[bytes]], block: int
) -> None:
    proto, data = stream
    expected = reference_error(proto, data)
    decoder = ColumnarDecoder(proto)
    try:
        with mock.patch.object(columnar, "_BLOCK_MESSAGES", block):
            result = decoder.decode(data)
    except ProtocolError as exc:
        if expected is None:
            # the framing is sound: only a value its type cannot take is left
            assert exc.reason.startswith("value of column"), exc
        else:
            message_type, offset, reason = expected
            assert (exc.message_type, exc.offset) == (message_type, offset), (exc, expected)
            assert reason in exc.reason
        assert decoder.relations == {}
        assert decoder.stream_xid is None
        return
    assert expected is None, expected
    check_same_as_row_decoder(proto, data, result)


def _plain_stream() -> tuple[Relation, list[bytes]]:
    relation = Relation(
        xid=None,
        relation_id=16384,
        namespace="public",
        name="items",
        replica_identity="d",
        columns=(Column(1, "id", 20, -1), Column(0, "qty", 23, -1), Column(0, "note", 25, -1)),
    )
    encoder = Encoder(2)
    data = [
        encoder.encode(Begin(final_lsn=Lsn(1), commit_time=TIME, xid=5)),
        encoder.encode(relation),
        encoder.encode(Insert(xid=None, relation_id=16384, new=("1", "10", "a"))),
        encoder.encode(Insert(xid=None, relation_id=16384, new=("2", "20", "b"))),
        encoder.encode(Commit(flags=0, commit_lsn=Lsn(1), end_lsn=Lsn(2), commit_time=TIME)),
    ]
    return relation, data


def test_change_to_an_undescribed_relation() -> None:
    _, data = _plain_stream()
    del data[1]
    with pytest.raises(ProtocolError) as caught:
        ColumnarDecoder(2).decode(data)
    assert caught.value.message_type == "I"
    assert caught.value.offset == 1
    assert "relation OID 16384, which no Relation message described" in caught.value.reason
    assert "message 1 of the 4 decoded" in caught.value.__notes__[0]


def test_column_count_must_match_the_relation() -> None:
    encoder = Encoder(1)
    _, data = _plain_stream()
    data[3] = encoder.encode(Insert(xid=None, relation_id=16384, new=("2", "20")))
    with pytest.raises(ProtocolError) as caught:
        ColumnarDecoder(1).decode(data)
    assert (caught.value.message_type, caught.value.offset) == ("I", 6)
    assert "TupleData has 2 columns but relation public.items (OID 16384) has 3" in str(
        caught.value
    )


def test_errors_leave_the_state_as_it_was() -> None:
    relation, data = _plain_stream()
    decoder = ColumnarDecoder(2)
    decoder.decode(data[:2])
    assert decoder.relations == {16384: relation}
    bad = [data[2], data[3][:-1]]
    with pytest.raises(ProtocolError, match="truncated"):
        decoder.decode(bad)
    assert decoder.relations == {16384: relation}
    result = decoder.decode(data[2:])
    assert result.change_count == 2
    assert result.changes[0].batch.column("id").to_pylist() == [1, 2]


def test_value_errors_name_the_column_and_never_the_value() -> None:
    encoder = Encoder(1)
    _, data = _plain_stream()
    data[3] = encoder.encode(Insert(xid=None, relation_id=16384, new=("2", "secret-99", "b")))
    with pytest.raises(ProtocolError) as caught:
        ColumnarDecoder(1).decode(data)
    error = caught.value
    assert error.message_type == "I"
    assert error.offset == 6 + 2 + 5 + 1 + 5  # the qty value, after the id value
    assert "'qty'" in error.reason and "int4" in error.reason
    assert "secret" not in str(error) and "secret" not in "".join(error.__notes__)
    assert "message 3 of the 5 decoded" in error.__notes__[0]


def test_invalid_utf8_is_the_row_decoders_error() -> None:
    _, data = _plain_stream()
    message = bytearray(data[3])
    message[-1] = 0xFF  # the last byte of the 'b' note
    data[3] = bytes(message)
    with pytest.raises(ProtocolError) as row_error:
        Decoder(2).decode(data[3])
    with pytest.raises(ProtocolError) as caught:
        ColumnarDecoder(2).decode(data)
    assert (caught.value.offset, caught.value.reason) == (
        row_error.value.offset,
        row_error.value.reason,
    )


def test_empty_input_and_empty_message() -> None:
    result = ColumnarDecoder(1).decode([])
    assert (result.changes, result.others, result.message_count) == ((), (), 0)
    with pytest.raises(ProtocolError, match="empty message"):
        ColumnarDecoder(1).decode([b""])


def test_only_utf8() -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        ColumnarDecoder(1, encoding="latin-1")


# -- the batch layout ---------------------------------------------------------------------------


def test_layout_of_one_batch() -> None:
    """Schema, ops, old tuples, unchanged TOAST and Xids of streamed blocks, as documented."""
    relation = Relation(
        xid=None, relation_id=16384, namespace="public", name="items", replica_identity="f",
        columns=(Column(1, "id", 20, -1), Column(0, "price", 1700, ((10 << 16) | 2) + 4),
                 Column(0, "doc", 25, -1)),
    )  # fmt: skip
    encoder = Encoder(2)
    messages: list[ReplicationMessage] = [
        Begin(final_lsn=Lsn(1), commit_time=TIME, xid=5),
        relation,
        Insert(xid=None, relation_id=16384, new=("1", "1.50", "big")),
        Update(xid=None, relation_id=16384, old_kind=None, old=None,
               new=("1", "2.00", UNCHANGED_TOAST)),
        Commit(flags=0, commit_lsn=Lsn(1), end_lsn=Lsn(2), commit_time=TIME),
        StreamStart(xid=900, first_segment=True),
        Update(xid=900, relation_id=16384, old_kind="O", old=("1", "2.00", "big"),
               new=("3", None, "x")),
        Delete(xid=900, relation_id=16384, old_kind="K", old=("3", None, None)),
        StreamStop(),
    ]  # fmt: skip
    result = ColumnarDecoder(2).decode([encoder.encode(m) for m in messages])
    assert [i for i, _ in result.others] == [0, 1, 4, 5, 8]
    assert len(result.changes) == 1
    batch = result.changes[0].batch
    assert batch.schema.names == [
        "_seq", "_op", "_xid", "id", "price", "doc", "_old", "_old_kind", "_unchanged",
    ]  # fmt: skip
    assert batch.schema.field("price").type == pa.decimal128(10, 2)
    assert batch.schema.field("_op").type == pa.dictionary(pa.int8(), pa.string())
    assert batch.schema.metadata[b"pgcdc.name"] == b"items"
    assert batch.to_pydict() == {
        "_seq": [2, 3, 6, 7],
        "_op": ["I", "U", "U", "D"],
        "_xid": [None, None, 900, 900],
        "id": [1, 1, 3, None],
        "price": [Decimal("1.50"), Decimal("2.00"), None, None],
        "doc": ["big", None, "x", None],
        "_old": [
            None,
            None,
            {"id": 1, "price": Decimal("2.00"), "doc": "big"},
            {"id": 3, "price": None, "doc": None},
        ],
        "_old_kind": [None, None, "O", "K"],
        "_unchanged": [[], ["doc"], [], []],
    }


def test_schema_change_starts_a_new_batch_and_a_resent_schema_does_not() -> None:
    relation, data = _plain_stream()
    encoder = Encoder(2)
    wider = replace(relation, columns=(*relation.columns, Column(0, "extra", 16, -1)))
    data = [
        *data[:3],
        encoder.encode(relation),  # described again, unchanged: same batch
        data[3],
        encoder.encode(wider),
        encoder.encode(Insert(xid=None, relation_id=16384, new=("3", "30", "c", "t"))),
        encoder.encode(relation),
        encoder.encode(Insert(xid=None, relation_id=16384, new=("4", "40", "d"))),
        data[4],
    ]
    result = ColumnarDecoder(2).decode(data)
    assert [part.batch.column("id").to_pylist() for part in result.changes] == [[1, 2], [3], [4]]
    assert [part.relation.columns[-1].name for part in result.changes] == ["note", "extra", "note"]
    assert result.changes[1].batch.column("extra").to_pylist() == [True]
    check_same_as_row_decoder(2, data, result)


def test_many_relations_interleaved() -> None:
    """More relations than are peeled off one by one: rows are grouped by sorting."""
    encoder = Encoder(1)
    data = []
    for relid in range(100, 112):
        relation = Relation(
            xid=None, relation_id=relid, namespace="s", name=f"t{relid}", replica_identity="d",
            columns=(Column(1, "id", 23, -1), Column(0, "v", 25, -1)),
        )  # fmt: skip
        data.append(encoder.encode(relation))
    for i in range(240):
        relid = 100 + (i * 7) % 12
        data.append(encoder.encode(Insert(xid=None, relation_id=relid, new=(str(i), f"v{i}"))))
    result = ColumnarDecoder(1).decode(data)
    check_same_as_row_decoder(1, data, result)
    assert len(result.changes) == 12
    assert sorted(i for p in result.changes for i in p.batch.column("id").to_pylist()) == list(
        range(240)
    )


def test_arrow_types_of_the_mapping() -> None:
    columns = [
        (16, -1, pa.bool_()), (21, -1, pa.int16()), (23, -1, pa.int32()), (20, -1, pa.int64()),
        (26, -1, pa.uint32()), (700, -1, pa.float32()), (701, -1, pa.float64()),
        (1700, ((12 << 16) | 2) + 4, pa.decimal128(12, 2)),
        (1700, ((50 << 16) | 10) + 4, pa.decimal256(50, 10)), (1700, -1, pa.string()),
        (25, -1, pa.string()), (1043, 24, pa.string()), (1042, 8, pa.string()),
        (19, -1, pa.string()),
        (2950, -1, pa.string()), (114, -1, pa.string()), (3802, -1, pa.string()),
        (869, -1, pa.string()), (650, -1, pa.string()), (829, -1, pa.string()),
        (1560, 5, pa.string()), (1562, -1, pa.string()), (1266, -1, pa.string()),
        (705, -1, pa.string()), (17, -1, pa.binary()), (1082, -1, pa.date32()),
        (1083, -1, pa.time64("us")), (1114, -1, pa.timestamp("us")),
        (1184, -1, pa.timestamp("us", tz="UTC")), (1186, -1, pa.month_day_nano_interval()),
        (1007, -1, pa.list_(pa.int32())),
    ]  # fmt: skip
    relation = Relation(
        xid=None, relation_id=1, namespace="", name="all", replica_identity="d",
        columns=tuple(Column(0, f"c{i}", oid, mod) for i, (oid, mod, _) in enumerate(columns)),
    )  # fmt: skip
    schema = ColumnarDecoder(1).arrow_schema(relation)
    assert [schema.field(f"c{i}").type for i in range(len(columns))] == [t for *_, t in columns]


def test_domains_read_as_their_base_type() -> None:
    registry = TypeRegistry(
        [TypeInfo(60_000, "price", "public", "domain", base_oid=1700,
                  type_modifier=((10 << 16) | 2) + 4)]
    )  # fmt: skip
    relation = Relation(
        xid=None, relation_id=7, namespace="public", name="d", replica_identity="d",
        columns=(Column(0, "p", 60_000, -1),),
    )  # fmt: skip
    encoder = Encoder(1)
    data = [
        encoder.encode(Type(xid=None, type_id=60_000, namespace="public", name="price")),
        encoder.encode(relation),
        encoder.encode(Insert(xid=None, relation_id=7, new=("12.34",))),
        encoder.encode(Insert(xid=None, relation_id=7, new=(numeric_binary(Decimal("-0.5"), 2),))),
    ]
    result = ColumnarDecoder(1, registry).decode(data)
    column = result.changes[0].batch.column("p")
    assert column.type == pa.decimal128(10, 2)
    assert column.to_pylist() == [Decimal("12.34"), Decimal("-0.50")]


def test_values_the_fast_paths_hand_over() -> None:
    """NaN numerics, infinite dates, odd time zone offsets: pgcdc.protocol.values decides."""
    relation = Relation(
        xid=None, relation_id=9, namespace="", name="odd", replica_identity="d",
        columns=(Column(0, "n", 1700, ((8 << 16) | 2) + 4), Column(0, "d", 1082, -1),
                 Column(0, "tz", 1184, -1), Column(0, "ts", 1114, -1)),
    )  # fmt: skip
    encoder = Encoder(1)
    rows = [
        ("1.00", "infinity", "1900-01-01 05:53:28+05:53:28", "2000-01-01 00:00:00 BC"),
        ("2.50", "-infinity", "infinity", "-infinity"),
    ]
    data = [encoder.encode(relation)] + [
        encoder.encode(Insert(xid=None, relation_id=9, new=row)) for row in rows
    ]
    batch = ColumnarDecoder(1).decode(data).changes[0].batch
    for j, column in enumerate(relation.columns):
        expected = plain(to_arrow([row[j] for row in rows], column.type_id, column.type_modifier))
        assert plain(batch.column(column.name)) == expected
    assert plain(batch.column("d")) == [INT32_MAX, INT32_MIN]
    assert plain(batch.column("tz")) == [micros(datetime(1900, 1, 1, tzinfo=UTC)), INT64_MAX]

    nan = [data[0], encoder.encode(Insert(xid=None, relation_id=9, new=("NaN", None, None, None)))]
    with pytest.raises(ProtocolError) as caught:
        ColumnarDecoder(1).decode(nan)
    assert caught.value.reason.startswith("value of column 'n' (numeric) cannot be converted")


# -- real servers ------------------------------------------------------------------------------

_UUID_1 = "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"
_UUID_2 = "'00000000-0000-0000-0000-0000000000ff'"

# name, SQL type, values of the first two rows (the third is NULL but for its id)
SERVER_COLUMNS: list[tuple[str, str, tuple[str, str]]] = [
    ("i2", "smallint", ("-32768", "7")),
    ("i4", "integer", ("2147483647", "-5")),
    ("i8", "bigint", ("-9223372036854775808", "42")),
    ("o", "oid", ("4294967295", "0")),
    ("f4", "real", ("3.25", "'NaN'")),
    ("f8", "double precision", ("-1.5e300", "'-Infinity'")),
    ("n", "numeric(12,3)", ("123456789.125", "-0.001")),
    ("nw", "numeric(40,5)", ("-12345678901234567890123456789012345.12345", "0")),
    ("nu", "numeric", ("'NaN'", "1.500")),
    ("b", "boolean", ("true", "false")),
    ("t", "text", ("'héllo ✓ wörld'", "''")),
    ("vc", "varchar(10)", ("'abc'", "'x'")),
    ("bp", "char(4)", ("'ab'", "'abcd'")),
    ("j", "json", ("'{\"a\": [1, 2]}'", "'[]'")),
    ("jb", "jsonb", ("'{\"k\": \"v\", \"n\": 1.5}'", "'null'")),
    ("by", "bytea", ("'\\x00ff10'", "''")),
    ("u", "uuid", (_UUID_1, _UUID_2)),
    ("d", "date", ("'2024-02-29'", "'0001-01-01'")),
    ("tm", "time", ("'23:59:59.999999'", "'00:00:00'")),
    ("ts", "timestamp", ("'2024-01-02 03:04:05.123456'", "'1999-12-31 23:59:59'")),
    ("tz", "timestamptz", ("'2024-01-02 03:04:05.5+00'", "'1900-01-01 00:00:00+00'")),
    ("iv", "interval", ("'3 days 04:05:06.5'", "'-1 days'")),
    ("ip", "inet", ("'192.168.0.1/24'", "'::1'")),
    ("ar", "integer[]", ("'{1,NULL,3}'", "'{}'")),
]  # fmt: skip


def _server_value(name: str, value: Any) -> Any:
    """psycopg's typed value of a column, in a form comparable with ``_column_value``."""
    if value is None:
        return None
    if name in ("u", "ip"):
        return str(value)
    if name in ("ts", "tz"):
        return micros(value)
    if name == "d":
        return (value - date(1970, 1, 1)).days
    if name == "tm":
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 10**6 + value.microsecond
    if name == "iv":  # no months in the rows, so psycopg's timedelta is exact
        return (0, value.days, (value.seconds * 10**6 + value.microseconds) * 1000)
    return value  # json and jsonb as Python objects, numeric as Decimal, the rest as is


def _column_value(name: str, value: Any) -> Any:
    """A columnar cell (in ``plain`` form), comparable with ``_server_value``."""
    if value is None:
        return None
    if name in ("j", "jb"):
        return json.loads(value)
    if name == "nu":  # unconstrained numeric: its exact text
        return Decimal(value)
    if name == "iv":
        return (value.months, value.days, value.nanoseconds)
    if name == "ip":  # PostgreSQL prints an address without its /32 or /128
        return str(ipaddress.ip_interface(value).with_prefixlen if "/" in value else value)
    return value


def _slot_messages(
    conn: psycopg.Connection[Any], slot: str, binary: bool, peek: bool
) -> list[bytes]:
    function = (
        "pg_logical_slot_peek_binary_changes" if peek else "pg_logical_slot_get_binary_changes"
    )
    query = (
        f"SELECT data FROM {function}(%s, NULL, NULL, 'proto_version', '1', "  # noqa: S608
        "'publication_names', 'pub', 'binary', %s)"
    )
    return [bytes(row[0]) for row in conn.execute(query, (slot, "true" if binary else "false"))]


def _same_value(got: Any, want: Any) -> bool:
    if isinstance(got, float) and isinstance(want, float):
        return same(got, want)
    if isinstance(want, Decimal) and isinstance(got, Decimal):
        return got == want or (got.is_nan() and want.is_nan())
    return bool(got == want)


def _wide_table(pg: PgDatabase) -> str:
    """Table ``wide`` (a column of each of SERVER_COLUMNS) in publication ``pub`` with slot
    ``s``, and its three inserts (the two rows of values, one of NULLs); its column list."""
    names = ", ".join(name for name, *_ in SERVER_COLUMNS)
    columns = ", ".join(f"{name} {sqltype}" for name, sqltype, _ in SERVER_COLUMNS)
    pg.execute(f"CREATE TABLE wide (id integer PRIMARY KEY, {columns})")
    pg.execute("CREATE PUBLICATION pub FOR TABLE wide")
    pg.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    for row_id in (1, 2):
        values = ", ".join(values[row_id - 1] for _, _, values in SERVER_COLUMNS)
        pg.execute(f"INSERT INTO wide (id, {names}) VALUES ({row_id}, {values})")  # noqa: S608
    pg.execute("INSERT INTO wide (id) VALUES (3)")
    return names


def test_real_server_changes_typed(pg: PgDatabase) -> None:
    names = _wide_table(pg)
    with pg.connect() as conn:
        conn.execute("SET extra_float_digits = 3")  # psycopg reads floats at full precision
        server = conn.execute(f"SELECT id, {names} FROM wide ORDER BY id").fetchall()  # noqa: S608
        # the text output follows this session's time zone: +05:30, and +05:53:28 in 1900
        conn.execute("SET TimeZone = 'Asia/Kolkata'")
        text = _slot_messages(conn, "s", binary=False, peek=True)
        binary = _slot_messages(conn, "s", binary=True, peek=False)
    assert len(text) == len(binary) == 3 * 3 + 1  # B I C per row, one R
    for data in (text, binary):
        result = ColumnarDecoder(1).decode(data)
        check_same_as_row_decoder(1, data, result)
        assert len(result.changes) == 1
        batch = result.changes[0].batch
        assert batch.column("_op").to_pylist() == ["I", "I", "I"]
        got = {name: plain(batch.column(name)) for name in ["id", *(n for n, *_ in SERVER_COLUMNS)]}
        for r, row in enumerate(server):
            for k, name in enumerate(["id", *(n for n, *_ in SERVER_COLUMNS)]):
                want = _server_value(name, row[k])
                value = _column_value(name, got[name][r])
                assert _same_value(value, want), (name, r, value, want, pg.major)


# large and incompressible, so PostgreSQL stores it out of line (TOAST)
_INCOMPRESSIBLE = "".join(f"{(i * 2654435761) % 4294967291:x}" for i in range(2000))


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_real_server_updates_deletes_and_toast(pg: PgDatabase, binary: bool) -> None:
    pg.execute(
        "CREATE TABLE keyed (id bigint PRIMARY KEY, price numeric(8,2), at timestamptz, big text)"
    )
    pg.execute("CREATE TABLE full_rows (id int, tag text)")
    pg.execute("ALTER TABLE full_rows REPLICA IDENTITY FULL")
    pg.execute("CREATE PUBLICATION pub FOR TABLE keyed, full_rows")
    pg.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    with pg.connect() as conn:
        conn.execute(
            "INSERT INTO keyed VALUES (1, 9.99, '2024-05-06 07:08:09.000001+00', %s), "
            "(2, NULL, NULL, 'small')",
            (_INCOMPRESSIBLE,),
        )
        conn.execute("UPDATE keyed SET price = 10.50 WHERE id = 1")  # big: unchanged TOAST
        conn.execute("UPDATE keyed SET id = 20 WHERE id = 2")  # key change: 'K'
        conn.execute("DELETE FROM keyed WHERE id = 20")  # 'K'
        conn.execute("INSERT INTO full_rows VALUES (1, 'a')")
        conn.execute("UPDATE full_rows SET tag = 'b'")  # 'O'
        conn.execute("DELETE FROM full_rows")  # 'O'
        data = _slot_messages(conn, "s", binary=binary, peek=False)
    result = ColumnarDecoder(1).decode(data)
    check_same_as_row_decoder(1, data, result)
    keyed, full = result.changes
    assert keyed.relation.name == "keyed" and full.relation.name == "full_rows"
    k = keyed.batch.to_pydict()
    assert k["_op"] == ["I", "I", "U", "U", "D"]
    assert k["id"] == [1, 2, 1, 20, None]
    assert k["price"] == [Decimal("9.99"), None, Decimal("10.50"), None, None]
    assert k["at"][0] == datetime(2024, 5, 6, 7, 8, 9, 1, tzinfo=UTC)
    assert k["big"] == [_INCOMPRESSIBLE, "small", None, "small", None]
    assert k["_unchanged"] == [[], [], ["big"], [], []]
    assert k["_old_kind"] == [None, None, None, "K", "K"]
    assert [old and old["id"] for old in k["_old"]] == [None, None, None, 2, 20]
    assert k["_old"][3] == {"id": 2, "price": None, "at": None, "big": None}
    f = full.batch.to_pydict()
    assert f["_op"] == ["I", "U", "D"]
    assert f["_old_kind"] == [None, "O", "O"]
    assert f["_old"] == [None, {"id": 1, "tag": "a"}, {"id": 1, "tag": "b"}]
    assert f["tag"] == ["a", "b", None]
    # stream order back from _seq
    merged = sorted(k["_seq"] + f["_seq"])
    assert merged == [i for i, m in enumerate(data) if m[:1] in (b"I", b"U", b"D")]


def test_real_server_streamed_transaction(pg: PgDatabase) -> None:
    """A transaction bigger than logical_decoding_work_mem (64kB) streams with its Xid."""
    pg.execute("CREATE TABLE big (id int PRIMARY KEY, payload text)")
    pg.execute("CREATE PUBLICATION pub FOR TABLE big")
    pg.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    with pg.connect() as conn:
        with conn.transaction():
            conn.execute(
                "INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 3000) g"
            )
            xid = conn.execute("SELECT txid_current()::text::bigint % (2^32)::bigint").fetchone()
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_binary_changes('s', NULL, NULL, "
            "'proto_version', '2', 'publication_names', 'pub', 'streaming', 'on')"
        ).fetchall()
    data = [bytes(row[0]) for row in rows]
    assert data[0][:1] == b"S"
    result = ColumnarDecoder(2).decode(data)
    check_same_as_row_decoder(2, data, result)
    assert result.change_count == 3000
    xids = set()
    for part in result.changes:
        xids |= set(part.batch.column("_xid").to_pylist())
    assert xid is not None and xids == {xid[0]}
    ids = sorted(i for part in result.changes for i in part.batch.column("id").to_pylist())
    assert ids == list(range(1, 3001))


def test_uuid_values_are_canonical_text() -> None:
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")
    relation = Relation(
        xid=None, relation_id=3, namespace="", name="u", replica_identity="d",
        columns=(Column(0, "u", 2950, -1),),
    )  # fmt: skip
    encoder = Encoder(1)
    data = [
        encoder.encode(relation),
        encoder.encode(Insert(xid=None, relation_id=3, new=(str(value),))),
        encoder.encode(Insert(xid=None, relation_id=3, new=(value.bytes,))),
    ]
    column = ColumnarDecoder(1).decode(data).changes[0].batch.column("u")
    assert column.to_pylist() == [str(value), str(value)]


def test_binary_value_of_a_type_without_binary_reader_is_refused() -> None:
    """A 'b' value of a type pgcdc only reads as text: the row Decoder hands over its bytes,
    the typed columns cannot hold them (not as a string that happens to decode)."""
    relation = Relation(
        xid=None, relation_id=9, namespace="", name="ext", replica_identity="d",
        columns=(Column(1, "id", 20, -1), Column(0, "shape", 99_999, -1)),
    )  # fmt: skip
    encoder = Encoder(1)
    data = [
        encoder.encode(relation),
        encoder.encode(Insert(xid=None, relation_id=9, new=("1", b"abc"))),
    ]
    row = Decoder(1)
    assert [row.decode(m) for m in data][1].new == ("1", b"abc")
    with pytest.raises(ProtocolError) as caught:
        ColumnarDecoder(1).decode(data)
    assert caught.value.reason.startswith("value of column 'shape' (oid 99999) is in binary format")
    assert "text format" in caught.value.reason
    # in text format the same column reads as its text
    text = [data[0], encoder.encode(Insert(xid=None, relation_id=9, new=("1", "abc")))]
    batch = ColumnarDecoder(1).decode(text).changes[0].batch
    assert batch.column("shape").to_pylist() == ["abc"]


# -- COPY (FORMAT binary) tuples ------------------------------------------------------------------

_COPY_RELATION = Relation(
    xid=None,
    relation_id=16390,
    namespace="public",
    name="copied",
    replica_identity="d",
    columns=(
        Column(1, "id", 23, -1),
        Column(0, "data", 17, -1),
        Column(0, "label", 25, -1),
        Column(0, "amount", 1700, -1),
    ),
)


def _copy_tuple(values: Sequence[bytes | None]) -> bytes:
    parts = [struct.pack("!h", len(values))]
    for value in values:
        parts.append(struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)))
        parts.append(value or b"")
    return b"".join(parts)


_NUMERIC_42_5 = struct.pack("!hhhhhh", 2, 0, 0, 1, 42, 5000)  # 42.5: digits 42, 5000; dscale 1
_copy_rows = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1).map(lambda i: struct.pack("!i", i))),
        st.one_of(st.none(), st.binary(max_size=40)),
        st.one_of(st.none(), st.text(max_size=12).map(lambda t: t.encode())),
        st.one_of(st.none(), st.just(_NUMERIC_42_5)),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(_copy_rows)
def test_copy_tuples_decode_like_the_same_inserts(rows: list[tuple[bytes | None, ...]]) -> None:
    """A COPY tuple is TupleData without kind bytes: the same values as an Insert's (binary
    values, and text ones for the columns the COPY casts to text)."""
    encoder = Encoder(1)
    inserts = [
        encoder.encode(
            Insert(None, 16390, (r[0], r[1], None if r[2] is None else r[2].decode(), r[3]))
        )
        for r in rows
    ]
    decoder = ColumnarDecoder(1)
    expected = decoder.decode([encoder.encode(_COPY_RELATION), *inserts])
    part = decoder.decode_copy(16390, [_copy_tuple(r) for r in rows], text_columns={2})
    assert part.relation == _COPY_RELATION
    assert part.batch.num_rows == len(rows)
    assert part.batch.column("_seq").to_pylist() == list(range(len(rows)))
    if rows:
        (want,) = expected.changes
        assert part.batch.schema == want.batch.schema
        for name in part.batch.schema.names[1:]:
            assert part.batch.column(name).equals(want.batch.column(name)), name


def test_copy_tuples_that_are_not_one_tuple_each_are_refused_with_row_and_offset() -> None:
    decoder = ColumnarDecoder(1)
    decoder.decode([Encoder(1).encode(_COPY_RELATION)])
    good = _copy_tuple([struct.pack("!i", 7), b"x", b"y", None])
    cases = [
        ([good, good + good], 1, len(good), "bytes after the last field"),
        ([good, good[:-5]], 1, len(good) - 5, "inside the value of field 2"),
        ([good, good[:-1]], 1, len(good) - 4, "before the length of field 3"),
        ([good[:9]], 0, 9, "inside the value of field 0"),
        ([b"\x00"], 0, 0, "too short"),
        ([struct.pack("!h", 3) + good[2:]], 0, 0, "3 fields, but the relation has 4"),
        ([good, b"\xff\xff"], 1, 0, "the trailer"),
        ([good[:10] + struct.pack("!i", -2) + good[14:]], 0, 10, "field 1 has length -2"),
    ]
    for rows, row, offset, reason in cases:
        with pytest.raises(CopyFormatError) as caught:
            decoder.decode_copy(16390, rows, text_columns={2})
        assert (caught.value.row, caught.value.offset) == (row, offset), rows
        assert reason in caught.value.reason
    with pytest.raises(ValueError, match="was not described"):
        decoder.decode_copy(16391, [good])
    empty = decoder.decode_copy(16390, [])
    assert empty.batch.num_rows == 0 and empty.batch.schema == decoder.arrow_schema(_COPY_RELATION)


def test_copy_value_errors_name_the_row_and_column_and_never_the_value() -> None:
    decoder = ColumnarDecoder(1)
    decoder.decode([Encoder(1).encode(_COPY_RELATION)])
    good = _copy_tuple([struct.pack("!i", 7), b"x", b"y", None])
    bad = _copy_tuple([b"secret", b"x", b"y", None])  # an int4 of 6 bytes
    with pytest.raises(CopyFormatError) as caught:
        decoder.decode_copy(16390, [good, good, bad])
    assert (caught.value.row, caught.value.offset) == (2, 6)
    assert "'id'" in caught.value.reason and "secret" not in str(caught.value)


def test_real_server_copy_gives_the_values_of_its_stream(pg: PgDatabase) -> None:
    names = _wide_table(pg)
    with pg.connect() as conn:
        stream = _slot_messages(conn, "s", binary=True, peek=False)
        with conn.cursor().copy(
            f"COPY (SELECT id, {names} FROM wide ORDER BY id) TO STDOUT (FORMAT binary)"  # noqa: S608
        ) as copy:
            blocks = [bytes(block) for block in copy]
    # PostgreSQL sends every tuple in a message of its own: the header comes with the first,
    # the trailer alone
    assert len(blocks) == 4 and blocks[0][:11] == b"PGCOPY\n\xff\r\n\x00"
    assert blocks[-1] == b"\xff\xff"
    header = 19 + struct.unpack("!i", blocks[0][15:19])[0]
    tuples = [blocks[0][header:], *blocks[1:-1]]
    decoder = ColumnarDecoder(1)
    (want,) = decoder.decode(stream).changes
    part = decoder.decode_copy(want.relation_id, tuples)
    assert part.batch.num_rows == 3
    assert part.batch.schema == want.batch.schema
    for name in part.batch.schema.names[1:]:
        got, expected = part.batch.column(name).to_pylist(), want.batch.column(name).to_pylist()
        assert all(map(_same_value, got, expected)), (name, got, expected)
