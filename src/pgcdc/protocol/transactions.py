"""The transaction framer: which transaction each pgoutput message belongs to. Sans-I/O.

A pgoutput stream interleaves three shapes of transaction (PostgreSQL's "Logical Streaming
Replication Protocol" and "Logical Replication Message Formats"):

* regular: Begin, its messages, Commit;
* prepared (two-phase): Begin Prepare, its messages, Prepare; later Commit Prepared or
  Rollback Prepared, on their own;
* streamed (protocol 2+): blocks (Stream Start .. Stream Stop) of many transactions interleave;
  inside a block every data message carries its (sub)transaction's Xid; the transaction ends
  with Stream Commit, Stream Prepare or Stream Abort, outside any block. A Stream Abort of a
  subtransaction drops everything from that subtransaction's first message on, as the apply
  worker truncates its changes file (``pgcdc.protocol.streamed``).

``TransactionFramer`` is fed (message bytes, position) records, one at a time, and tells a
``FrameReader`` what each means; the reader keeps the messages (in a buffer, a spool, an
index), the framer keeps the structure: the open transaction, the open block, the open
streamed transactions and their subtransactions, and the order rules a stream must follow.
Positions are the reader's own numbers, passed through (LSNs for ``pgcdc.decoding``'s
assembler, spool offsets for ``pgcdc.spark``'s receiver). Only Begin, Commit and the other
control messages are decoded here; data messages go to the reader as bytes, to decode with
``framer.decoder`` (which knows whether a block is open, so reads the Xid of a streamed
message) if it wants them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Generic, Literal, Protocol, TypeVar

from pgcdc.protocol.decoder import Decoder
from pgcdc.protocol.errors import MESSAGE_NAMES, ProtocolError
from pgcdc.protocol.message_types import XID_IN_STREAM, MessageType, peek
from pgcdc.protocol.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Origin,
    Prepare,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
)
from pgcdc.protocol.streamed import Subtransactions

__all__ = ["Discard", "FrameReader", "TransactionFramer"]

T = TypeVar("T")
M = TypeVar("M")

#: Why an unfinished transaction is dropped: the connection was re-established (the server
#: sends it again from its start), or its first block came again.
Discard = Literal["reconnect", "restart"]

_U32 = struct.Struct("!I")
# plain ints: the hot path compares every message's type byte with them
_ORIGIN, _COMMIT, _PREPARE, _STREAM_STOP = (
    int(MessageType.ORIGIN),
    int(MessageType.COMMIT),
    int(MessageType.PREPARE),
    int(MessageType.STREAM_STOP),
)
_XID_IN_STREAM = frozenset(int(k) for k in XID_IN_STREAM)
#: What a regular or prepared transaction may hold between its Begin and its end.
_IN_TRANSACTION = frozenset({*_XID_IN_STREAM, _ORIGIN})
#: Data messages a server may send outside any transaction (the reader decides what they do).
_BETWEEN = frozenset({int(MessageType.RELATION), int(MessageType.TYPE), int(MessageType.MESSAGE)})


class FrameReader(Protocol[T, M]):
    """What a ``TransactionFramer`` tells the code that keeps a stream's messages.

    ``T`` is the reader's transaction, made by ``begin`` or ``stream_open``; ``M`` a mark of
    where a subtransaction's first message went (``mark``), handed back to ``stream_abort``
    when that subtransaction aborts. The framer has checked the order of everything it passes
    on; a reader raises for what it refuses (the framer keeps no state of a call that raised,
    beyond what the message had already changed).
    """

    def begin(self, message: Begin | BeginPrepare, position: int) -> T:
        """A regular or prepared transaction starts."""
        ...

    def data(self, txn: T, kind: int, payload: bytes, position: int) -> None:
        """A message of the open regular or prepared transaction: a change, Truncate, Relation,
        Type, logical decoding Message (transactional or not) or Origin."""
        ...

    def end(self, txn: T, message: Commit | Prepare, position: int) -> None:
        """The open transaction's Commit (a regular one) or Prepare (a prepared one)."""
        ...

    def between(self, kind: int, payload: bytes, position: int) -> None:
        """A Relation, Type or non-transactional Message outside any transaction."""
        ...

    def resolved(self, message: CommitPrepared | RollbackPrepared) -> None:
        """A prepared transaction committed or rolled back."""
        ...

    def stream_finished(self, message: StreamStart | StreamCommit | StreamPrepare) -> bool:
        """Has the reader already finished this streamed transaction (it is sent again after a
        reconnect)? Asked at a Stream Start before the framer opens the transaction (True: its
        blocks are skipped), and at a Stream Commit or Prepare of a transaction that is not
        open (False: the framer raises, the stream is missing messages)."""
        ...

    def stream_open(self, message: StreamStart) -> T:
        """A streamed transaction's first block starts."""
        ...

    def block_start(self, txn: T) -> None:
        """A block of the open streamed transaction ``txn`` starts (its first one included)."""
        ...

    def stream_data(self, txn: T, kind: int, payload: bytes, position: int) -> None:
        """A message of a block of ``txn``: what ``data`` gets, with the (sub)transaction's Xid
        after the type byte (Origin excepted)."""
        ...

    def block_stop(self, txn: T) -> None:
        """The block of ``txn`` ends (Stream Stop)."""
        ...

    def mark(self, txn: T) -> M:
        """Where the message about to be passed to ``stream_data`` goes: it is the first of a
        subtransaction."""
        ...

    def stream_abort(self, txn: T, message: StreamAbort, mark: M | None) -> None:
        """``txn`` aborted (``message.xid == message.subxid``: the framer has forgotten it), or
        one of its subtransactions did: drop everything from ``mark`` on (None: nothing of it
        was streamed)."""
        ...

    def stream_end(self, txn: T, message: StreamCommit | StreamPrepare) -> None:
        """``txn`` committed or was prepared; the framer has forgotten it."""
        ...

    def discard(self, txn: T, reason: Discard) -> None:
        """An unfinished transaction is dropped: the framer has forgotten it."""
        ...


class _Stream(Generic[T, M]):
    """An open streamed transaction: the reader's transaction and its subtransactions."""

    __slots__ = ("subs", "txn")

    def __init__(self, txn: T, xid: int) -> None:
        self.txn = txn
        self.subs: Subtransactions[M] = Subtransactions(xid)


class TransactionFramer(Generic[T, M]):
    """Frames one stream's messages into transactions for ``reader`` (see the module doc).

    ``where`` formats a position for error messages (" at 0/16B3748"); ``error`` makes the
    exception raised for messages out of order (the reader's own error class).
    """

    __slots__ = (
        "_between",
        "_block",
        "_cur",
        "_cur_xid",
        "_data",
        "_prepared",
        "_skipping",
        "_stream_data",
        "_streams",
        "decoder",
        "error",
        "reader",
        "where",
    )

    def __init__(
        self,
        reader: FrameReader[T, M],
        decoder: Decoder,
        *,
        where: Callable[[int], str] = lambda position: f" at position {position}",
        error: Callable[[str], Exception] = lambda text: ProtocolError(None, 0, text),
    ) -> None:
        self.reader = reader
        self._data = reader.data  # bound once: called for every message
        self._stream_data = reader.stream_data
        self.decoder = decoder
        self.where = where
        self.error = error
        self._cur: T | None = None
        self._cur_xid = 0
        self._prepared = False  # the open transaction began with Begin Prepare
        self._block: _Stream[T, M] | None = None
        self._skipping = False  # in a block of a transaction the reader has finished
        self._streams: dict[int, _Stream[T, M]] = {}
        self._between: dict[int, Callable[[bytes, int], None]] = {
            MessageType.BEGIN: self._begin,
            MessageType.BEGIN_PREPARE: self._begin,
            MessageType.STREAM_START: self._stream_start,
            MessageType.STREAM_COMMIT: self._stream_end,
            MessageType.STREAM_PREPARE: self._stream_end,
            MessageType.STREAM_ABORT: self._stream_abort,
            MessageType.COMMIT_PREPARED: self._resolved,
            MessageType.ROLLBACK_PREPARED: self._resolved,
        }

    # -- state -------------------------------------------------------------------------------
    @property
    def current(self) -> T | None:
        """The open regular or prepared transaction."""
        return self._cur

    @property
    def block(self) -> T | None:
        """The streamed transaction whose block is open (None in a skipped block)."""
        return None if self._block is None else self._block.txn

    @property
    def in_progress(self) -> bool:
        """Inside a transaction or a block (a skipped one too)."""
        return self._cur is not None or self._block is not None or self._skipping

    def streams(self) -> list[T]:
        """The open streamed transactions, in the order their first blocks came."""
        return [stream.txn for stream in self._streams.values()]

    def reset(self) -> None:
        """A new connection: drop every unfinished transaction (``reader.discard``); the
        server sends them again from their start."""
        cur, streams = self._cur, list(self._streams.values())
        self.clear()
        if cur is not None:
            self.reader.discard(cur, "reconnect")
        for stream in streams:
            self.reader.discard(stream.txn, "reconnect")

    def clear(self) -> None:
        """Forget every unfinished transaction without telling the reader."""
        self._cur = None
        self._block = None
        self._skipping = False
        self._streams.clear()
        self.decoder.reset()

    # -- feeding -----------------------------------------------------------------------------
    def feed(self, payload: bytes, position: int) -> None:
        """One message, at ``position``."""
        kind = payload[0] if payload else -1
        stream = self._block
        if stream is not None:
            if kind in _XID_IN_STREAM:
                if len(payload) < 5:
                    self.decoder.decode(payload)  # raises: too short for its Xid
                xid = _U32.unpack_from(payload, 1)[0]
                subs = stream.subs
                if xid != subs.xid and xid != subs.last:  # noqa: PLR1714 - the hot path
                    txn = stream.txn
                    subs.note(xid, lambda: self.reader.mark(txn))
                self._stream_data(stream.txn, kind, payload, position)
            elif kind == _ORIGIN:
                self._stream_data(stream.txn, kind, payload, position)
            elif kind == _STREAM_STOP:
                self.decoder.decode(payload)
                self._block = None
                self.reader.block_stop(stream.txn)
            else:
                self._misplaced(payload, position, "inside a streamed block")
            return
        cur = self._cur
        if cur is not None:
            if kind in _IN_TRANSACTION:
                self._data(cur, kind, payload, position)
            elif kind in (_COMMIT, _PREPARE):
                self._end(cur, payload, position)
            else:
                self._misplaced(payload, position, "inside a transaction")
            return
        if self._skipping:
            if kind == _STREAM_STOP:
                self.decoder.decode(payload)
                self._skipping = False
            elif kind not in _IN_TRANSACTION:
                self._misplaced(payload, position, "inside a streamed block")
            return
        handler = self._between.get(kind)
        if handler is not None:
            handler(payload, position)
        elif kind in _BETWEEN and (
            kind != MessageType.MESSAGE or not peek(payload, in_stream=False).transactional
        ):
            self.reader.between(kind, payload, position)
        else:
            self._misplaced(payload, position, "outside any transaction")

    # -- internals ---------------------------------------------------------------------------
    def _misplaced(self, payload: bytes, position: int, where: str) -> None:
        """A message where none of its kind may be: raise, naming it."""
        message = self.decoder.decode(payload)  # raises first if the message is malformed
        if isinstance(message, Begin | BeginPrepare):
            assert self._cur is not None
            lsn = message.final_lsn if isinstance(message, Begin) else message.prepare_lsn
            raise self.error(
                f"{MESSAGE_NAMES[chr(payload[0])]} for xid {message.xid} at {lsn} "
                f"while transaction {self._cur_xid} is still open (its Commit or Prepare never "
                "arrived)"
            )
        if isinstance(message, Commit):
            raise self.error(
                f"Commit at {message.commit_lsn} without a Begin"
                + (
                    f" (transaction {self._cur_xid} is prepared)"
                    if self._prepared and self._cur is not None
                    else ""
                )
            )
        if isinstance(message, Prepare):
            raise self.error(
                f"Prepare of xid {message.xid} (gid {message.gid!r}) at "
                f"{message.prepare_lsn} without its Begin Prepare"
            )
        if isinstance(message, Origin):
            raise self.error(
                f"Origin message{self.where(position)} {where}: the stream is missing messages"
            )
        if isinstance(message, StreamStart) and self._cur is not None:
            raise self.error(
                f"Stream Start of xid {message.xid}{self.where(position)} while transaction "
                f"{self._cur_xid} is open (its Commit or Prepare never arrived)"
            )
        name = MESSAGE_NAMES.get(chr(payload[0]), repr(chr(payload[0])))
        hint = (
            " (no Begin, Begin Prepare or Stream Start before it): the stream is missing messages"
            if where == "outside any transaction"
            else ""
        )
        raise self.error(f"{name} message{self.where(position)} {where}{hint}")

    def _begin(self, payload: bytes, position: int) -> None:
        message = self.decoder.decode(payload)
        assert isinstance(message, Begin | BeginPrepare)
        self._cur = self.reader.begin(message, position)
        self._cur_xid = message.xid
        self._prepared = isinstance(message, BeginPrepare)

    def _end(self, cur: T, payload: bytes, position: int) -> None:
        message = self.decoder.decode(payload)
        if isinstance(message, Commit):
            misplaced = self._prepared
        else:
            assert isinstance(message, Prepare)
            misplaced = not self._prepared or message.xid != self._cur_xid
        if misplaced:  # raises: a Commit of a prepared one, a Prepare of another or a regular one
            self._misplaced(payload, position, "inside a transaction")
        self._cur = None
        self.reader.end(cur, message, position)

    def _resolved(self, payload: bytes, position: int) -> None:
        message = self.decoder.decode(payload)
        assert isinstance(message, CommitPrepared | RollbackPrepared)
        self.reader.resolved(message)

    def _stream_start(self, payload: bytes, position: int) -> None:
        message = self.decoder.decode(payload)
        assert isinstance(message, StreamStart)
        reader = self.reader
        if reader.stream_finished(message):
            self._skipping = True
            return
        stream = self._streams.get(message.xid)
        if message.first_segment:
            if stream is not None:
                del self._streams[message.xid]
                reader.discard(stream.txn, "restart")
            stream = _Stream(reader.stream_open(message), message.xid)
            self._streams[message.xid] = stream
        elif stream is None:
            self.decoder.reset()  # no block is open
            raise self.error(
                f"Stream Start continues streamed transaction {message.xid}, whose first block "
                "was not received on this connection (messages are missing)"
            )
        self._block = stream
        reader.block_start(stream.txn)

    def _stream_abort(self, payload: bytes, position: int) -> None:
        message = self.decoder.decode(payload)
        assert isinstance(message, StreamAbort)
        stream = self._streams.get(message.xid)
        if stream is None:
            return  # nothing of it is open: aborted before any block, or finished already
        if message.xid == message.subxid:
            del self._streams[message.xid]
            self.reader.stream_abort(stream.txn, message, None)
        else:
            self.reader.stream_abort(stream.txn, message, stream.subs.abort(message.subxid))

    def _stream_end(self, payload: bytes, position: int) -> None:
        message = self.decoder.decode(payload)
        assert isinstance(message, StreamCommit | StreamPrepare)
        stream = self._streams.pop(message.xid, None)
        if stream is not None:
            self.reader.stream_end(stream.txn, message)
        elif not self.reader.stream_finished(message):
            what, lsn = (
                ("Stream Commit", message.commit_lsn)
                if isinstance(message, StreamCommit)
                else ("Stream Prepare", message.prepare_lsn)
            )
            raise self.error(
                f"{what} of xid {message.xid} at {lsn}, but no streamed block of it was "
                "received on this connection (messages are missing)"
            )
