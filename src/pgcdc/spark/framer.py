"""The framer: reads the pgoutput stream just enough to index transactions, never their rows.

For each message (already appended to the spool at a known offset) it looks at the type byte
and, inside a streamed block, the Xid that follows it; only the rare control messages (Begin,
Commit, Stream Start/Commit/Abort, Relation, Type) go through the full ``Decoder``. Changes are
counted (a TRUNCATE counts one row per relation) and their bytes summed.

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
import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pgcdc.protocol.decoder import Decoder
from pgcdc.protocol.errors import ProtocolError
from pgcdc.protocol.message_types import (
    CHANGES,
    DEFINITIONS,
    TWO_PHASE,
    XID_IN_STREAM,
    MessageType,
)
from pgcdc.protocol.messages import (
    Begin,
    Commit,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    Type,
)
from pgcdc.protocol.streamed import Subtransactions
from pgcdc.spark.errors import SparkSourceError
from pgcdc.spark.index import Definitions, TransactionIndex, TxnEntry
from pgcdc.spark.spool import RECORD_HEADER

__all__ = ["Framer", "FramerStats"]

log = logging.getLogger("pgcdc.spark")

_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)

_B, _C, _O, _M, _T = (
    MessageType.BEGIN,
    MessageType.COMMIT,
    MessageType.ORIGIN,
    MessageType.MESSAGE,
    MessageType.TRUNCATE,
)
_S, _E, _c, _A = (
    MessageType.STREAM_START,
    MessageType.STREAM_STOP,
    MessageType.STREAM_COMMIT,
    MessageType.STREAM_ABORT,
)


def _read_i32(payload: bytes, at: int) -> int:
    """A Truncate's relation count, read without decoding the message."""
    if len(payload) < at + _I32.size:
        raise ProtocolError(chr(payload[0]), len(payload), "message too short for its count")
    return int(_I32.unpack_from(payload, at)[0])


def unix_micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICRO


@dataclass
class _Sub:
    """Where a subtransaction's first message went, and the counts before it."""

    offset: int  # spool offset of its first message
    rows: int
    nbytes: int
    nranges: int
    ndefs: int


@dataclass
class _Open:
    """A transaction being received."""

    xid: int
    streamed: bool
    ranges: list[list[int]] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    defs: list[tuple[int, tuple[str, int], bytes]] = field(default_factory=list)  # offset, key
    subs: Subtransactions[_Sub] = field(init=False)
    commit_time: int = 0

    def __post_init__(self) -> None:
        self.subs = Subtransactions(self.xid)

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


class Framer:
    """Feeds the transaction index from raw pgoutput messages (see the module doc)."""

    def __init__(self, index: TransactionIndex, proto_version: int) -> None:
        self.index = index
        self.proto_version = proto_version
        self._decoder = Decoder(proto_version)
        self._txn: _Open | None = None
        self._body_start = 0
        self._block: _Open | None = None
        self._streams: dict[int, _Open] = {}
        self._defs: Definitions = {}
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
        ranges = [(self._body_start, end)] if self._txn is not None else []
        for stream in self._streams.values():
            ranges.extend((start, stop) for start, stop in stream.ranges)
        return ranges

    def reset(self) -> None:
        """A new connection: forget unfinished transactions (the server sends them again)."""
        self._txn = None
        self._block = None
        self._streams.clear()
        self._decoder.reset()
        self.skip_through = max(self.skip_through, self.index.last_commit_lsn)

    # -- feeding ---------------------------------------------------------------------------
    def feed(self, payload: bytes, offset: int) -> TxnEntry | None:
        """One message, written to the spool at ``offset``; the transaction it committed."""
        self.stats.messages += 1
        kind = payload[0] if payload else 0
        record = RECORD_HEADER.size + len(payload)
        block = self._block
        if block is not None:
            return self._in_block(block, kind, payload, offset, record)
        txn = self._txn
        if txn is not None:
            if kind == _C:
                return self._commit(txn, payload, offset)
            if kind in CHANGES:
                txn.rows += 1
            elif kind == _T:
                txn.rows += _read_i32(payload, 1)
            elif kind in DEFINITIONS:
                message = self._decode(payload)
                self._capture(txn, message, payload, offset)
            elif kind not in (_O, _M):
                self._decode(payload)  # raises for what cannot be inside a transaction
                raise self._unexpected(kind, "inside a transaction")
            txn.nbytes += len(payload)
            return None
        if kind == _B:
            begin = self._decode(payload)
            assert isinstance(begin, Begin)
            self._txn = _Open(begin.xid, False, commit_time=unix_micros(begin.commit_time))
            self._body_start = offset + record
            return None
        if kind == _S:
            start = self._decode(payload)
            assert isinstance(start, StreamStart)
            stream = self._streams.get(start.xid)
            if start.first_segment or stream is None:
                if stream is not None:
                    log.warning(
                        "streamed transaction %d started over from its first block", start.xid
                    )
                if not start.first_segment:
                    raise SparkSourceError(
                        f"Stream Start continues streamed transaction {start.xid}, whose first "
                        "block was not received on this connection",
                        "report this as a pgcdc bug (the stream is missing messages)",
                    )
                stream = self._streams[start.xid] = _Open(start.xid, True)
            self._block = stream
            return None
        if kind == _c:
            return self._stream_commit(payload)
        if kind == _A:
            self._stream_abort(payload)
            return None
        if kind == _M:
            self._decode(payload)  # a non-transactional logical message: not a row
            return None
        if kind in TWO_PHASE:
            raise SparkSourceError(
                "the slot decodes prepared transactions at PREPARE time (two_phase), which the "
                "pgcdc Spark source does not read",
                "use a slot created without two_phase",
            )
        self._decode(payload)
        raise self._unexpected(kind, "outside a transaction")

    # -- internals -------------------------------------------------------------------------
    def _decode(self, payload: bytes) -> object:
        return self._decoder.decode(payload)

    @staticmethod
    def _unexpected(kind: int, where: str) -> SparkSourceError:
        return SparkSourceError(
            f"unexpected pgoutput message {chr(kind)!r} {where}",
            "report this as a pgcdc bug, with the server version",
        )

    def _capture(self, txn: _Open, message: object, payload: bytes, offset: int) -> None:
        """Remember a Relation or Type message (as sent outside a stream: without the xid)."""
        if isinstance(message, Relation):
            key = ("R", message.relation_id)
        elif isinstance(message, Type):
            key = ("Y", message.type_id)
        else:  # pragma: no cover - callers only pass R and Y
            return
        plain = payload[:1] + payload[5:] if message.xid is not None else payload
        txn.defs.append((offset, key, plain))

    def _in_block(
        self, stream: _Open, kind: int, payload: bytes, offset: int, record: int
    ) -> TxnEntry | None:
        if kind == _E:
            self._decode(payload)
            self._block = None
            return None
        if kind in XID_IN_STREAM:
            if len(payload) < 1 + _U32.size:
                raise ProtocolError(chr(kind), len(payload), "message too short for its Xid")
            subxid = _U32.unpack_from(payload, 1)[0]
            subs = stream.subs
            if subxid != subs.xid and subxid != subs.last:  # noqa: PLR1714 - the hot path
                subs.note(
                    subxid,
                    lambda: _Sub(
                        offset, stream.rows, stream.nbytes, len(stream.ranges), len(stream.defs)
                    ),
                )
            if kind in CHANGES:
                stream.rows += 1
            elif kind == _T:
                stream.rows += _read_i32(payload, 5)
            elif kind in DEFINITIONS:
                self._capture(stream, self._decode(payload), payload, offset)
        elif kind != _O:
            self._decode(payload)
            raise self._unexpected(kind, "inside a streamed block")
        stream.nbytes += len(payload)
        stream.add(offset, record)
        return None

    def _stream_abort(self, payload: bytes) -> None:
        abort = self._decode(payload)
        assert isinstance(abort, StreamAbort)
        stream = self._streams.get(abort.xid)
        if stream is None:
            return
        if abort.xid == abort.subxid:
            del self._streams[abort.xid]
            self.stats.aborted += 1
            return
        self.stats.subtransaction_aborts += 1
        sub = stream.subs.abort(abort.subxid)
        if sub is not None:  # else nothing of it was streamed
            stream.truncate(sub)

    def _stream_commit(self, payload: bytes) -> TxnEntry | None:
        commit = self._decode(payload)
        assert isinstance(commit, StreamCommit)
        stream = self._streams.pop(commit.xid, None)
        if stream is None:
            if commit.commit_lsn <= self.skip_through:
                return None
            raise SparkSourceError(
                f"Stream Commit of transaction {commit.xid} at {commit.commit_lsn}, but no block "
                "of it was received on this connection",
                "report this as a pgcdc bug (the stream is missing messages)",
            )
        self.stats.streamed += 1
        stream.commit_time = unix_micros(commit.commit_time)
        return self._finish(stream, commit.commit_lsn, commit.end_lsn)

    def _commit(self, txn: _Open, payload: bytes, offset: int) -> TxnEntry | None:
        commit = self._decode(payload)
        assert isinstance(commit, Commit)
        self._txn = None
        if offset > self._body_start:
            txn.ranges.append([self._body_start, offset])
        return self._finish(txn, commit.commit_lsn, commit.end_lsn)

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
