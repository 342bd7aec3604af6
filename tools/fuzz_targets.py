"""The fuzz targets and seed corpus of ``tools/fuzz.py`` (imported under atheris'
instrumentation there, so that libFuzzer sees the coverage of pgcdc's code)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pgcdc.decoding import DEFAULT_MEMORY_LIMIT, Assembler, DecodingError, OutputPlugin
from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Encoder,
    Insert,
    Message,
    Origin,
    Prepare,
    ProtocolError,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from pgcdc.protocol.arrow.columnar import ColumnarDecoder
from pgcdc.spark.errors import SparkSourceError
from pgcdc.spark.framer import Framer
from pgcdc.spark.index import TransactionIndex

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def split(data: bytes) -> tuple[int, list[bytes]]:
    """(protocol version, messages) of a fuzzer input (see the module doc)."""
    if not data:
        return 1, []
    proto = data[0] % 4 + 1
    messages = []
    at = 1
    while at + 2 <= len(data):
        size = int.from_bytes(data[at : at + 2], "big")
        at += 2
        messages.append(data[at : at + size])
        at += size
    return proto, messages


def join(proto: int, messages: list[bytes]) -> bytes:
    return bytes([proto - 1]) + b"".join(len(m).to_bytes(2, "big") + m for m in messages)


# -- targets -------------------------------------------------------------------------------------


def decoder(data: bytes) -> None:
    proto, messages = split(data)
    decode = Decoder(proto).decode
    for raw in messages:
        try:
            decode(raw)
        except ProtocolError as exc:
            if not 0 <= exc.offset <= len(raw):
                raise AssertionError(f"offset {exc.offset} outside the message") from exc


def columnar(data: bytes) -> None:
    proto, messages = split(data)
    with contextlib.suppress(ProtocolError):
        ColumnarDecoder(proto).decode(messages)


def feed_framer(proto: int, messages: Sequence[bytes]) -> None:
    """The Spark source's ``Framer`` over ``messages``; only its own errors pass."""
    feed = Framer(TransactionIndex(), proto).feed
    offset = 0
    try:
        for raw in messages:
            feed(raw, offset)
            offset += 8 + len(raw)
    except (ProtocolError, SparkSourceError):
        pass


class NullPlugin(OutputPlugin):
    """An output plugin that keeps nothing."""

    def begin(self, ctx: Any, txn: Any) -> None:
        pass

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        pass

    def commit(self, ctx: Any, txn: Any, commit_lsn: Lsn) -> None:
        pass


def feed_assembler(
    proto: int, messages: Sequence[bytes], spill_dir: str, memory_limit: int = DEFAULT_MEMORY_LIMIT
) -> None:
    """The decoding ``Assembler`` (into a ``NullPlugin``) over ``messages``; only its own
    errors pass."""
    target = Assembler(
        NullPlugin(), proto_version=proto, spill_dir=spill_dir, memory_limit=memory_limit
    )
    try:
        for i, raw in enumerate(messages):
            target.feed_message(raw, Lsn(0x1000 + i))
    except (ProtocolError, DecodingError):
        pass
    finally:
        target.close()


def framer(data: bytes) -> None:
    feed_framer(*split(data))


_SPILL = tempfile.mkdtemp(prefix="pgcdc-fuzz-")


def assembler(data: bytes) -> None:
    proto, messages = split(data)
    # a tiny memory limit: larger transactions go through the spill files too
    feed_assembler(proto, messages, _SPILL, memory_limit=256)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "decoder": decoder,
    "columnar": columnar,
    "framer": framer,
    "assembler": assembler,
}


# -- seed corpus ---------------------------------------------------------------------------------


def _relation(xid: int | None) -> Relation:
    return Relation(
        xid=xid,
        relation_id=16384,
        namespace="public",
        name="items",
        replica_identity="d",
        columns=(Column(1, "id", 20, -1), Column(0, "qty", 23, -1), Column(0, "note", 25, -1)),
    )


def seed_streams() -> Iterator[tuple[int, list[bytes]]]:
    """Well-formed streams covering every message type of every protocol version."""
    for proto in (1, 2, 3, 4):
        e = Encoder(proto)
        plain = [
            e.encode(Begin(final_lsn=Lsn(0x2000), commit_time=T0, xid=7)),
            e.encode(Origin(Lsn(0x10), "upstream")),
            e.encode(Type(None, 90000, "public", "mood")),
            e.encode(_relation(None)),
            e.encode(Insert(None, 16384, ("1", "10", "a"))),
            e.encode(Insert(None, 16384, (b"\x00\x00\x00\x00\x00\x00\x00\x02", None, b"b"))),
            e.encode(Update(None, 16384, "K", ("1", None, None), ("1", "11", None))),
            e.encode(Update(None, 16384, None, None, ("1", "12", "c"))),
            e.encode(Delete(None, 16384, "K", ("1", None, None))),
            e.encode(Truncate(None, 1, (16384,))),
            e.encode(Message(None, True, Lsn(0x1800), "pgcdc", b"hello")),
            e.encode(Commit(0, Lsn(0x2000), Lsn(0x2040), T0)),
        ]
        yield proto, plain
        if proto >= 2:
            yield (
                proto,
                [
                    e.encode(StreamStart(8, True)),
                    e.encode(_relation(8)),
                    e.encode(Insert(8, 16384, ("2", "20", "x"))),
                    e.encode(StreamStop()),
                    e.encode(StreamStart(8, False)),
                    e.encode(Insert(9, 16384, ("3", "30", "y"))),
                    e.encode(StreamStop()),
                    e.encode(StreamAbort(8, 9, None, None)),
                    e.encode(StreamCommit(8, 0, Lsn(0x3000), Lsn(0x3040), T0)),
                ],
            )
        if proto >= 3:
            yield (
                proto,
                [
                    e.encode(BeginPrepare(Lsn(0x4000), Lsn(0x4040), T0, 10, "gid1")),
                    e.encode(_relation(None)),
                    e.encode(Insert(None, 16384, ("4", "40", "z"))),
                    e.encode(Prepare(0, Lsn(0x4000), Lsn(0x4040), T0, 10, "gid1")),
                    e.encode(CommitPrepared(0, Lsn(0x4100), Lsn(0x4140), T0, 10, "gid1")),
                    e.encode(RollbackPrepared(0, Lsn(0x4040), Lsn(0x4240), T0, T0, 10, "gid1")),
                    e.encode(StreamStart(11, True)),
                    e.encode(Insert(11, 16384, ("5", "50", "w"))),
                    e.encode(StreamStop()),
                    e.encode(StreamPrepare(0, Lsn(0x5000), Lsn(0x5040), T0, 11, "gid2")),
                ],
            )
        if proto >= 4:
            yield (
                proto,
                [
                    e.encode(StreamStart(12, True)),
                    e.encode(Insert(12, 16384, ("6", "60", "v"))),
                    e.encode(StreamStop()),
                    e.encode(StreamAbort(12, 12, Lsn(0x6000), T0)),
                ],
            )


def write_seeds(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    count = 0
    for i, (proto, messages) in enumerate(seed_streams()):
        (folder / f"seed-{i}").write_bytes(join(proto, messages))
        count += 1
    return count
