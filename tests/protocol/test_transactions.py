"""The transaction framer: what it tells a reader for each shape of transaction, the order
rules it enforces, and its two readers (the Spark receiver's ``Framer`` and the decoding
``Assembler``) agreeing on what survives interleaved streamed transactions with aborted
subtransactions, against a model of the apply worker's changes file."""

from __future__ import annotations

import re
import tempfile
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.decoding import Assembler, OutputPlugin
from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Decoder,
    Encoder,
    Insert,
    Message,
    Origin,
    Prepare,
    ProtocolError,
    Relation,
    ReplicationMessage,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Type,
)
from pgcdc.protocol.transactions import Discard, TransactionFramer
from pgcdc.spark.framer import Framer
from pgcdc.spark.index import TransactionIndex

T0 = datetime(2024, 1, 1, tzinfo=UTC)
REL = 16384


def relation(xid: int | None) -> Relation:
    return Relation(xid, REL, "public", "t", "d", (Column(1, "id", 23, -1),))


def insert(xid: int | None, value: int) -> Insert:
    return Insert(xid, REL, (str(value),))


class Recorder:
    """A reader that writes down what it is told; transactions are their xids, marks the
    position of the message they precede."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.position = 0
        self.finished: set[int] = set()

    def begin(self, message: Begin | BeginPrepare, position: int) -> int:
        self.events.append(("begin", message.xid, position))
        return message.xid

    def data(self, txn: int, kind: int, payload: bytes, position: int) -> None:
        self.events.append(("data", txn, chr(kind), position))

    def end(self, txn: int, message: Commit | Prepare, position: int) -> None:
        self.events.append(("end", txn, type(message).__name__, position))

    def between(self, kind: int, payload: bytes, position: int) -> None:
        self.events.append(("between", chr(kind), position))

    def resolved(self, message: Any) -> None:
        self.events.append(("resolved", type(message).__name__, message.xid))

    def stream_finished(self, message: StreamStart | StreamCommit | StreamPrepare) -> bool:
        return message.xid in self.finished

    def stream_open(self, message: StreamStart) -> int:
        self.events.append(("open", message.xid))
        return message.xid

    def block_start(self, txn: int) -> None:
        self.events.append(("block", txn))

    def stream_data(self, txn: int, kind: int, payload: bytes, position: int) -> None:
        self.events.append(("sdata", txn, chr(kind), position))

    def block_stop(self, txn: int) -> None:
        self.events.append(("stop", txn))

    def mark(self, txn: int) -> int:
        return self.position

    def stream_abort(self, txn: int, message: StreamAbort, mark: int | None) -> None:
        self.events.append(("abort", txn, message.subxid, mark))

    def stream_end(self, txn: int, message: StreamCommit | StreamPrepare) -> None:
        self.events.append(("stream_end", txn, type(message).__name__))

    def discard(self, txn: int, reason: Discard) -> None:
        self.events.append(("discard", txn, reason))


def framed(
    messages: list[ReplicationMessage], proto: int = 4
) -> tuple[Recorder, TransactionFramer[int, int]]:
    reader = Recorder()
    framer: TransactionFramer[int, int] = TransactionFramer(reader, Decoder(proto))
    encoder = Encoder(proto)
    for position, message in enumerate(messages):
        reader.position = position
        framer.feed(encoder.encode(message), position)
    return reader, framer


def test_regular_and_prepared_transactions_and_what_comes_between() -> None:
    reader, framer = framed(
        [
            relation(None),
            Message(None, False, Lsn(1), "p", b"x"),
            Begin(Lsn(0x20), T0, 7),
            Origin(Lsn(5), "up"),
            relation(None),
            insert(None, 1),
            Message(None, False, Lsn(2), "p", b"y"),
            Commit(0, Lsn(0x20), Lsn(0x28), T0),
            BeginPrepare(Lsn(0x30), Lsn(0x38), T0, 8, "g"),
            insert(None, 2),
            Prepare(0, Lsn(0x30), Lsn(0x38), T0, 8, "g"),
            CommitPrepared(0, Lsn(0x40), Lsn(0x48), T0, 8, "g"),
        ]
    )
    assert reader.events == [
        ("between", "R", 0),
        ("between", "M", 1),
        ("begin", 7, 2),
        ("data", 7, "O", 3),
        ("data", 7, "R", 4),
        ("data", 7, "I", 5),
        ("data", 7, "M", 6),  # non-transactional inside: the reader decides
        ("end", 7, "Commit", 7),
        ("begin", 8, 8),
        ("data", 8, "I", 9),
        ("end", 8, "Prepare", 10),
        ("resolved", "CommitPrepared", 8),
    ]
    assert not framer.in_progress


def test_streamed_blocks_interleave_and_a_subtransaction_abort_gets_its_first_mark() -> None:
    reader, framer = framed(
        [
            StreamStart(10, True),
            insert(10, 1),  # 1
            insert(11, 2),  # 2: the first of subtransaction 11
            StreamStop(),
            StreamStart(20, True),
            insert(20, 3),
            StreamStop(),
            StreamStart(10, False),
            insert(12, 4),  # 8: the first of 12
            insert(11, 5),  # 11 again: its mark stays 2
            StreamStop(),
            StreamAbort(10, 12, None, None),  # 12 and nothing before it
            StreamAbort(10, 11, None, None),  # 11, from its first message on
            StreamAbort(10, 13, None, None),  # never streamed
            StreamAbort(20, 20, None, None),
            StreamCommit(10, 0, Lsn(0x50), Lsn(0x58), T0),
        ]
    )
    aborts = [e for e in reader.events if e[0] in ("abort", "stream_end")]
    # 12 began after 11, so aborting 11 first would have dropped 12 too; here 12 goes first
    assert aborts == [
        ("abort", 10, 12, 8),
        ("abort", 10, 11, 2),
        ("abort", 10, 13, None),
        ("abort", 20, 20, None),
        ("stream_end", 10, "StreamCommit"),
    ]
    assert reader.events[:4] == [
        ("open", 10),
        ("block", 10),
        ("sdata", 10, "I", 1),
        ("sdata", 10, "I", 2),
    ]
    assert ("open", 10) not in reader.events[4:]  # the second block continues it
    assert framer.streams() == [] and not framer.in_progress


def test_a_finished_stream_sent_again_is_skipped_and_a_reconnect_discards_the_rest() -> None:
    reader = Recorder()
    reader.finished.add(10)
    framer: TransactionFramer[int, int] = TransactionFramer(reader, Decoder(2))
    e = Encoder(2)
    for position, message in enumerate(
        [
            StreamStart(10, True),
            insert(10, 1),
            Origin(Lsn(1), "o"),
            StreamStop(),
            StreamCommit(10, 0, Lsn(0x50), Lsn(0x58), T0),  # finished: skipped too
            StreamStart(20, True),
            insert(20, 2),
            StreamStop(),
            Begin(Lsn(0x60), T0, 30),
        ]
    ):
        framer.feed(e.encode(message), position)
    assert reader.events == [
        ("open", 20),
        ("block", 20),
        ("sdata", 20, "I", 6),
        ("stop", 20),
        ("begin", 30, 8),
    ]
    assert framer.current == 30 and framer.streams() == [20]
    framer.reset()
    assert reader.events[-2:] == [("discard", 30, "reconnect"), ("discard", 20, "reconnect")]
    assert not framer.in_progress and framer.streams() == []
    # the first block again after a restart of the stream: the old one is discarded
    for message in (StreamStart(40, True), StreamStop(), StreamStart(40, True)):
        framer.feed(e.encode(message), 0)
    assert ("discard", 40, "restart") in reader.events


ORDER_ERRORS: list[tuple[list[ReplicationMessage], str]] = [
    ([Commit(0, Lsn(0x20), Lsn(0x28), T0)], r"Commit at 0/20 without a Begin$"),
    ([insert(None, 1)], r"Insert message at position 0 outside any transaction \(no Begin"),
    ([Message(None, True, Lsn(1), "p", b"x")], r"Message message at position 0 outside any"),
    ([Origin(Lsn(1), "o")], r"Origin message at position 0 outside any transaction"),
    ([Begin(Lsn(0x20), T0, 7), Begin(Lsn(0x30), T0, 8)], r"Begin for xid 8 .* transaction 7 is"),
    (
        [BeginPrepare(Lsn(0x30), Lsn(0x38), T0, 8, "g"), Commit(0, Lsn(0x30), Lsn(0x38), T0)],
        r"without a Begin \(transaction 8 is prepared\)",
    ),
    (
        [
            BeginPrepare(Lsn(0x30), Lsn(0x38), T0, 8, "g"),
            Prepare(0, Lsn(0x30), Lsn(0x38), T0, 9, "g"),
        ],
        r"Prepare of xid 9 .* without its Begin Prepare",
    ),
    (
        [Begin(Lsn(0x20), T0, 7), StreamStart(9, True)],
        r"Stream Start of xid 9 .* transaction 7 is open",
    ),
    ([StreamStart(9, False)], r"continues streamed transaction 9, whose first block was not"),
    ([StreamStop()], r"Stream Stop without a Stream Start"),
    (
        [StreamCommit(9, 0, Lsn(0x50), Lsn(0x58), T0)],
        r"Stream Commit of xid 9 at 0/50, but no streamed block of it was received",
    ),
    (
        [StreamPrepare(0, Lsn(0x50), Lsn(0x58), T0, 9, "g")],
        r"Stream Prepare of xid 9 at 0/50, but no streamed block",
    ),
    (
        [Begin(Lsn(0x20), T0, 7), CommitPrepared(0, Lsn(0x40), Lsn(0x48), T0, 8, "g")],
        r"inside a transaction",
    ),
    (
        [StreamStart(9, True), StreamStart(9, False)],
        r"Stream Start while the block of xid 9 is open",
    ),
    (
        [StreamStart(9, True), Type(9, 1, "s", "t"), Begin(Lsn(0x20), T0, 7)],
        r"inside the streamed block",
    ),
]


@pytest.mark.parametrize(("messages", "error"), ORDER_ERRORS)
def test_messages_out_of_order_are_refused_naming_them(
    messages: list[ReplicationMessage], error: str
) -> None:
    with pytest.raises(ProtocolError, match=error):
        framed(messages)


# -- the two readers against a model -------------------------------------------------------------


class Counting(OutputPlugin):
    def __init__(self) -> None:
        self.committed: list[tuple[int, int]] = []
        self.rows = 0

    def begin(self, ctx: Any, txn: Any) -> None:
        self.rows = 0

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        self.rows += 1

    def commit(self, ctx: Any, txn: Any, commit_lsn: Lsn) -> None:
        self.committed.append((txn.xid, self.rows))


@st.composite
def interleaved(draw: st.DrawFn) -> tuple[list[ReplicationMessage], list[tuple[int, int]]]:
    """Streamed transactions whose blocks interleave, each with subtransactions (nested in
    order, as PostgreSQL sends them) some of which abort, then commit or abort; plus regular
    transactions between blocks. Returns the messages and, per committed transaction in
    commit order, (xid, rows that survive) by the apply worker's rule."""
    count = draw(st.integers(1, 4))
    tops = [100 * (i + 1) for i in range(count)]
    files: dict[int, list[int]] = {x: [] for x in tops}  # each transaction's changes file
    open_subs: dict[int, int] = dict.fromkeys(tops, 0)
    out: list[ReplicationMessage] = [
        Begin(Lsn(0x10), T0, 1),
        relation(None),
        Commit(0, Lsn(0x10), Lsn(0x18), T0),
    ]
    expected: list[tuple[int, int]] = []
    started: set[int] = set()
    lsn = 0x1000
    regular = 1
    actions = ["block", "block", "abort_sub", "commit", "abort", "regular"]
    steps = draw(st.lists(st.tuples(st.sampled_from(tops), st.sampled_from(actions)), max_size=24))
    steps += [(top, "commit") for top in tops]
    ended: set[int] = set()
    for top, action in steps:
        if top in ended:
            continue
        if action == "block":
            out.append(StreamStart(top, top not in started))
            if top not in started:
                out.append(relation(top))
            started.add(top)
            for _ in range(draw(st.integers(1, 3))):
                if draw(st.booleans()) and open_subs[top] < 9:
                    open_subs[top] += 1  # a new subtransaction starts
                xid = top + open_subs[top]
                out.append(insert(xid, len(out)))
                files[top].append(xid)
            out.append(StreamStop())
        elif action == "abort_sub" and open_subs[top]:
            sub = top + draw(st.integers(1, open_subs[top]))
            out.append(StreamAbort(top, sub, None, None))
            if sub in files[top]:
                del files[top][files[top].index(sub) :]
            open_subs[top] = sub - top - 1  # back in its parent
        elif action in ("commit", "abort") and top in started:
            ended.add(top)
            lsn += 0x100
            if action == "commit":
                out.append(StreamCommit(top, 0, Lsn(lsn), Lsn(lsn + 8), T0))
                if files[top]:
                    expected.append((top, len(files[top])))
            else:
                out.append(StreamAbort(top, top, None, None))
        elif action == "regular":
            lsn += 0x100
            xid = 10_000 + regular
            regular += 1
            rows = draw(st.integers(0, 3))
            out.append(Begin(Lsn(lsn), T0, xid))
            out += [insert(None, i) for i in range(rows)]
            out.append(Commit(0, Lsn(lsn), Lsn(lsn + 8), T0))
            if rows:
                expected.append((xid, rows))
    return out, expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interleaved())
def test_both_readers_keep_what_the_apply_worker_keeps(
    case: tuple[list[ReplicationMessage], list[tuple[int, int]]],
) -> None:
    messages, expected = case
    encoder = Encoder(2)
    raws = [encoder.encode(m) for m in messages]

    index = TransactionIndex()
    spark = Framer(index, 2)
    offset = 0
    indexed: list[tuple[int, int]] = []
    for raw in raws:
        entry = spark.feed(raw, offset)
        offset += 8 + len(raw)
        if entry is not None:
            indexed.append((entry.xid, entry.rows))

    plugin = Counting()
    with tempfile.TemporaryDirectory() as spill:
        assembler = Assembler(plugin, proto_version=2, spill_dir=spill, memory_limit=512)
        with assembler:
            for i, raw in enumerate(raws):
                assembler.feed_message(raw, 0x10 + i)
    delivered = [(xid, rows) for xid, rows in plugin.committed if rows]
    assert indexed == expected
    assert delivered == expected


def test_the_readers_name_their_own_errors() -> None:
    raw = Encoder(2).encode(Commit(0, Lsn(0x20), Lsn(0x28), T0))
    with pytest.raises(Exception, match=re.escape("Commit at 0/20 without a Begin")) as spark:
        Framer(TransactionIndex(), 2).feed(raw, 0)
    assert type(spark.value).__name__ == "SparkSourceError"
    error = re.escape("Commit at 0/20 without a Begin")
    with (
        tempfile.TemporaryDirectory() as spill,
        Assembler(Counting(), spill_dir=spill) as a,
        pytest.raises(Exception, match=error) as dec,
    ):
        a.feed_message(raw, 0x10)
    assert type(dec.value).__name__ == "DecodingError"
