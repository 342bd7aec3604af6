"""The receiver's framer: reads the pgoutput stream just enough to index transactions, never
their rows.

``pgcdc.protocol.transactions.TransactionFramer`` says which transaction each message (already
appended to the spool at a known offset) belongs to; this reader of it counts changes (a
TRUNCATE counts one row per relation), sums their bytes, and keeps each transaction's spool
ranges. Only the rare control messages and Relation and Type go through the full ``Decoder``.

* A plain transaction is one contiguous spool range, from after its Begin to its Commit.
* A streamed transaction collects the ranges of its blocks. Per subtransaction it remembers
  where that subtransaction's first message is; a Stream Abort of a subtransaction drops
  everything from there on (and the later subtransactions), exactly as PostgreSQL's apply worker
  truncates its changes file; a Stream Abort of the whole transaction drops it; Stream Commit
  makes the survivors one index entry.
* Relation and Type messages: the ones a committed transaction carried become the definitions
  in effect for the transactions after it (pgoutput marks a relation's schema as sent when the
  transaction commits, streamed or not).
* Transactions that commit at or below ``skip_through`` (already delivered before a reconnect)
  and transactions without rows are not indexed. Two-phase messages are refused: the source
  reads slots without two-phase decoding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pgcdc.protocol.decoder import Decoder
from pgcdc.protocol.message_types import (
    CHANGES,
    DEFINITIONS,
    MessageType,
    truncated_relations,
    without_xid,
)
from pgcdc.protocol.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    Type,
)
from pgcdc.protocol.transactions import Discard, TransactionFramer
from pgcdc.spark.errors import SparkSourceError
from pgcdc.spark.index import Definitions, TransactionIndex, TxnEntry
from pgcdc.spark.spool import RECORD_HEADER

__all__ = ["Framer", "FramerStats"]

log = logging.getLogger("pgcdc.spark")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)

_T = int(MessageType.TRUNCATE)
_CHANGES = frozenset(int(k) for k in CHANGES)
_DEFINITIONS = frozenset(int(k) for k in DEFINITIONS)
_HEADER = RECORD_HEADER.size


def unix_micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICRO


@dataclass
class _Sub:
    """Where a subtransaction's first message went, and the counts before it."""

    offset: int  # spool offset of its first message
    rows: int
    nbytes: int
    ndefs: int


@dataclass
class _Open:
    """A transaction being received: its spool ranges, counts and definitions."""

    xid: int
    streamed: bool
    ranges: list[list[int]] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    defs: list[tuple[int, tuple[str, int], bytes]] = field(default_factory=list)  # offset, key
    commit_time: int = 0
    body_start: int = 0  # a regular transaction's: the spool offset after its Begin

    def add(self, offset: int, record: int) -> None:
        ranges = self.ranges
        if ranges and ranges[-1][1] == offset:
            ranges[-1][1] = offset + record
        else:
            ranges.append([offset, offset + record])

    def truncate(self, sub: _Sub) -> None:
        cut = sub.offset
        kept: list[list[int]] = []
        for start, end in self.ranges:
            if end <= cut:
                kept.append([start, end])
            elif start < cut:
                kept.append([start, cut])
        self.ranges = kept
        self.rows, self.nbytes = sub.rows, sub.nbytes
        del self.defs[sub.ndefs :]


@dataclass
class FramerStats:
    messages: int = 0
    transactions: int = 0
    streamed: int = 0
    skipped: int = 0
    aborted: int = 0
    subtransaction_aborts: int = 0
    empty: int = 0


def _two_phase() -> SparkSourceError:
    return SparkSourceError(
        "the slot decodes prepared transactions at PREPARE time (two_phase), which the "
        "pgcdc Spark source does not read",
        "use a slot created without two_phase",
    )


def _out_of_order(text: str) -> SparkSourceError:
    return SparkSourceError(text, "report this as a pgcdc bug, with the server version")


class Framer:
    """Feeds the transaction index from raw pgoutput messages (see the module doc): the
    shared ``TransactionFramer`` frames them, this reader counts and indexes them."""

    def __init__(self, index: TransactionIndex, proto_version: int) -> None:
        self.index = index
        self.proto_version = proto_version
        self._framer: TransactionFramer[_Open, _Sub] = TransactionFramer(
            self,
            Decoder(proto_version),
            where=lambda offset: f" at spool offset {offset}",
            error=_out_of_order,
        )
        self._decode = self._framer.decoder.decode
        self._defs: Definitions = {}
        self._position = 0  # the spool offset of the message being fed
        self._record = 0  # and its record's size
        self._committed: TxnEntry | None = None
        #: transactions committing at or below this are not indexed again
        self.skip_through = 0
        #: the highest commit end LSN processed
        self.progress = 0
        self.stats = FramerStats()

    # -- state -----------------------------------------------------------------------------
    @property
    def definitions(self) -> Definitions:
        return self._defs

    def open_ranges(self, end: int) -> list[tuple[int, int]]:
        """The spool byte ranges unfinished transactions still need (an open transaction's
        body up to ``end``, the spool offset after the last message framed)."""
        txn = self._framer.current
        ranges = [(txn.body_start, end)] if txn is not None else []
        for stream in self._framer.streams():
            ranges.extend((start, stop) for start, stop in stream.ranges)
        return ranges

    def reset(self) -> None:
        """A new connection: forget unfinished transactions (the server sends them again)."""
        self._framer.reset()
        self.skip_through = max(self.skip_through, self.index.last_commit_lsn)

    # -- feeding ---------------------------------------------------------------------------
    def feed(self, payload: bytes, offset: int) -> TxnEntry | None:
        """One message, written to the spool at ``offset``; the transaction it committed."""
        self.stats.messages += 1
        self._position = offset
        self._record = _HEADER + len(payload)
        self._framer.feed(payload, offset)
        entry = self._committed
        if entry is not None:
            self._committed = None
        return entry

    # -- what the framer tells (FrameReader) -------------------------------------------------
    def begin(self, message: Begin | BeginPrepare, position: int) -> _Open:
        if isinstance(message, BeginPrepare):
            raise _two_phase()
        return _Open(
            message.xid,
            False,
            commit_time=unix_micros(message.commit_time),
            body_start=position + self._record,
        )

    def data(self, txn: _Open, kind: int, payload: bytes, position: int) -> None:
        if kind in _CHANGES:
            txn.rows += 1
        elif kind == _T:
            txn.rows += truncated_relations(payload, in_stream=False)
        elif kind in _DEFINITIONS:
            self._capture(txn, payload, position)
        txn.nbytes += len(payload)

    def end(self, txn: _Open, message: Commit | Prepare, position: int) -> None:
        assert isinstance(message, Commit)
        if position > txn.body_start:
            txn.ranges.append([txn.body_start, position])
        self._committed = self._finish(txn, message.commit_lsn, message.end_lsn)

    def between(self, kind: int, payload: bytes, position: int) -> None:
        self._decode(payload)
        if kind != MessageType.MESSAGE:  # a non-transactional logical message is not a row
            raise _out_of_order(f"unexpected pgoutput message {chr(kind)!r} outside a transaction")

    def resolved(self, message: CommitPrepared | RollbackPrepared) -> None:
        raise _two_phase()

    def stream_finished(self, message: StreamStart | StreamCommit | StreamPrepare) -> bool:
        if isinstance(message, StreamPrepare):
            raise _two_phase()
        return isinstance(message, StreamCommit) and message.commit_lsn <= self.skip_through

    def stream_open(self, message: StreamStart) -> _Open:
        return _Open(message.xid, True)

    def block_start(self, txn: _Open) -> None:
        pass

    def stream_data(self, txn: _Open, kind: int, payload: bytes, position: int) -> None:
        if kind in _CHANGES:
            txn.rows += 1
        elif kind == _T:
            txn.rows += truncated_relations(payload, in_stream=True)
        elif kind in _DEFINITIONS:
            self._capture(txn, payload, position)
        txn.nbytes += len(payload)
        txn.add(position, self._record)

    def block_stop(self, txn: _Open) -> None:
        pass

    def mark(self, txn: _Open) -> _Sub:
        # called before stream_data adds the message: the counts are those before it
        return _Sub(self._position, txn.rows, txn.nbytes, len(txn.defs))

    def stream_abort(self, txn: _Open, message: StreamAbort, mark: _Sub | None) -> None:
        if message.xid == message.subxid:
            self.stats.aborted += 1
            return
        self.stats.subtransaction_aborts += 1
        if mark is not None:  # else nothing of it was streamed
            txn.truncate(mark)

    def stream_end(self, txn: _Open, message: StreamCommit | StreamPrepare) -> None:
        if isinstance(message, StreamPrepare):
            raise _two_phase()
        self.stats.streamed += 1
        txn.commit_time = unix_micros(message.commit_time)
        self._committed = self._finish(txn, message.commit_lsn, message.end_lsn)

    def discard(self, txn: _Open, reason: Discard) -> None:
        if reason == "restart":
            log.warning("streamed transaction %d started over from its first block", txn.xid)

    # -- internals -------------------------------------------------------------------------
    def _capture(self, txn: _Open, payload: bytes, offset: int) -> None:
        """Remember a Relation or Type message (as sent outside a stream: without the xid)."""
        message = self._decode(payload)
        if isinstance(message, Relation):
            key = ("R", message.relation_id)
        elif isinstance(message, Type):
            key = ("Y", message.type_id)
        else:  # pragma: no cover - callers only pass R and Y
            return
        plain = without_xid(payload) if message.xid is not None else payload
        txn.defs.append((offset, key, plain))

    def _finish(self, txn: _Open, commit_lsn: int, end_lsn: int) -> TxnEntry | None:
        self.progress = max(self.progress, end_lsn)
        merged: dict[tuple[str, int], bytes] | None = None
        if txn.defs:
            merged = dict(self._defs)
            for _, key, plain in txn.defs:
                merged[key] = plain
            self._defs = merged
        entry: TxnEntry | None = None
        if commit_lsn <= self.skip_through or commit_lsn <= self.index.last_commit_lsn:
            self.stats.skipped += 1
        elif not txn.rows or not txn.ranges:
            self.stats.empty += 1
        else:
            entry = TxnEntry(
                commit_lsn=commit_lsn,
                end_lsn=end_lsn,
                commit_time=txn.commit_time,
                xid=txn.xid,
                streamed=txn.streamed,
                ranges=tuple((start, end) for start, end in txn.ranges),
                rows=txn.rows,
                nbytes=txn.nbytes,
            )
            inline = tuple(plain for _, key, plain in txn.defs if key[0] == "R")
            self.index.append(entry, inline=inline)
            self.stats.transactions += 1
        if merged is not None:
            self.index.note_definitions(merged)
        return entry
