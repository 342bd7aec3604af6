"""Decoding pgoutput messages: bytes in, one frozen dataclass out. No I/O.

``Decoder.decode`` takes exactly one message, as ``pg_logical_slot_get_binary_changes`` returns it
in its ``data`` column or a walsender sends it as the payload of an XLogData message. The decoder
is stateful only in what the format requires: between Stream Start and Stream Stop, Relation,
Type, Insert, Update, Delete, Truncate and Message carry the Xid of the streamed transaction, and
nowhere else.

Every malformed input raises ``ProtocolError`` naming the message type, the byte offset and what
was wrong; nothing else escapes and nothing loops on truncated input.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import datetime
from typing import Literal

from pgcdc.lsn import Lsn
from pgcdc.protocol.errors import ProtocolError
from pgcdc.protocol.message_types import OUTSIDE_STREAM, MessageType
from pgcdc.protocol.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    ReplicationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    TupleValue,
    Type,
    Update,
)
from pgcdc.protocol.timestamps import from_pg_micros

__all__ = ["MAX_PROTO_VERSION", "MESSAGE_VERSIONS", "Decoder"]

MAX_PROTO_VERSION = 4

#: The lowest protocol version in which a server sends each message type (``MessageType.since``).
MESSAGE_VERSIONS: dict[int, int] = {int(kind): kind.since for kind in MessageType}

_U8 = struct.Struct("!B")
_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")
_I16 = struct.Struct("!h")
_U64 = struct.Struct("!Q")
_BEGIN = struct.Struct("!QqI")  # final_lsn, commit_time, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit_lsn, end_lsn, commit_time
_MESSAGE = struct.Struct("!BQ")  # flags, lsn
_COLUMN_TAIL = struct.Struct("!Ii")  # type oid, typmod
_RELATION_TAIL = struct.Struct("!Bh")  # replica identity, number of columns
_TRUNCATE = struct.Struct("!iB")  # number of relations, options
_STREAM_START = struct.Struct("!IB")  # xid, first segment
_STREAM_COMMIT = struct.Struct("!IBQQq")  # xid, flags, commit_lsn, end_lsn, commit_time
_STREAM_ABORT = struct.Struct("!II")  # xid, subxid
_ABORT_INFO = struct.Struct("!Qq")  # abort_lsn, abort_time (protocol 4, parallel streaming)
_BEGIN_PREPARE = struct.Struct("!QQqI")  # prepare_lsn, end_lsn, prepare_time, xid
_PREPARE = struct.Struct("!BQQqI")  # flags, lsn, end_lsn, time, xid (also K and p)
_ROLLBACK_PREPARED = struct.Struct("!BQQqqI")  # flags, prepare_end, rollback_end, 2 times, xid

_KIND_NULL = 0x6E  # 'n'
_KIND_TOAST = 0x75  # 'u'
_KIND_TEXT = 0x74  # 't'
_KIND_BINARY = 0x62  # 'b'
_TUPLE_NEW = 0x4E  # 'N'
_TUPLE_KEY = 0x4B  # 'K'
_TUPLE_OLD = 0x4F  # 'O'


class _Cursor:
    """Reads one message; every read checks bounds and raises ProtocolError with the offset."""

    __slots__ = ("data", "encoding", "end", "mtype", "pos")

    def __init__(self, data: bytes, encoding: str) -> None:
        self.data = data
        self.end = len(data)
        self.pos = 1
        self.mtype = chr(data[0])
        self.encoding = encoding

    def fail(self, reason: str, offset: int | None = None) -> ProtocolError:
        return ProtocolError(self.mtype, self.pos if offset is None else offset, reason)

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.end:
            raise self.fail(
                f"truncated: {what} needs {n} bytes, {self.end - self.pos} remain "
                f"(message is {self.end} bytes)"
            )

    def unpack(self, st: struct.Struct, what: str) -> tuple[int, ...]:
        self.need(st.size, what)
        values: tuple[int, ...] = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return values

    def u8(self, what: str) -> int:
        if self.pos >= self.end:
            raise self.fail(
                f"truncated: {what} needs 1 byte, 0 remain (message is {self.end} bytes)"
            )
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u32(self, what: str) -> int:
        return self.unpack(_U32, what)[0]

    def string(self, what: str) -> str:
        zero = self.data.find(b"\0", self.pos)
        if zero < 0:
            raise self.fail(f"truncated: {what} is a string without its terminating zero byte")
        raw = self.data[self.pos : zero]
        text = self.text(raw, what)
        self.pos = zero + 1
        return text

    def text(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode(self.encoding)
        except UnicodeDecodeError as exc:
            raise self.fail(
                f"{what} is not valid {self.encoding}: {exc.reason} at byte {exc.start}",
            ) from None

    def time(self, micros: int, what: str, offset: int) -> datetime:
        try:
            return from_pg_micros(micros)
        except OverflowError:
            raise self.fail(
                f"{what} {micros} microseconds since 2000-01-01 is out of range", offset
            ) from None

    def gid(self) -> str:
        return self.string("gid")

    def finish(self) -> None:
        if self.pos != self.end:
            raise self.fail(f"{self.end - self.pos} trailing bytes after the message")

    def tuple_data(self) -> TupleData:
        start = self.pos
        (ncols,) = self.unpack(_I16, "TupleData column count")
        if ncols < 0:
            raise self.fail(f"impossible TupleData column count {ncols}", start)
        data = self.data
        end = self.end
        pos = self.pos
        values: list[TupleValue] = []
        append = values.append
        for index in range(ncols):
            if pos >= end:
                self.pos = pos
                raise self.fail(f"truncated: TupleData column {index} of {ncols} is missing")
            kind = data[pos]
            pos += 1
            if kind in (_KIND_TEXT, _KIND_BINARY):
                if pos + 4 > end:
                    self.pos = pos
                    raise self.fail(f"truncated: length of TupleData column {index}")
                (length,) = _I32.unpack_from(data, pos)
                if length < 0:
                    self.pos = pos
                    raise self.fail(f"impossible length {length} of TupleData column {index}")
                pos += 4
                stop = pos + length
                if stop > end:
                    self.pos = pos
                    raise self.fail(
                        f"truncated: TupleData column {index} has length {length}, "
                        f"{end - pos} bytes remain"
                    )
                if kind == _KIND_TEXT:
                    self.pos = pos
                    append(self.text(data[pos:stop], f"text value of TupleData column {index}"))
                else:
                    append(data[pos:stop])
                pos = stop
            elif kind == _KIND_NULL:
                append(None)
            elif kind == _KIND_TOAST:
                append(UNCHANGED_TOAST)
            else:
                self.pos = pos - 1
                raise self.fail(
                    f"unknown TupleData kind {chr(kind)!r} (0x{kind:02x}) for column {index}; "
                    "expected 'n', 'u', 't' or 'b'"
                )
        self.pos = pos
        return tuple(values)


class Decoder:
    """Stateful pgoutput decoder for one replication stream.

    ``proto_version`` is the ``proto_version`` option the stream was started with (1 to 4):
    message types introduced in a later version are rejected. ``parallel_streaming`` says
    whether it was started with ``streaming = parallel`` (Stream Abort then carries the abort
    LSN and time); leave it None to accept either form of Stream Abort. Text values and names
    are decoded with ``encoding`` (the connection's client encoding). Call ``reset()`` when a
    new stream starts (a reconnect), since a streamed block cannot continue across connections.
    """

    __slots__ = ("_dispatch", "encoding", "parallel_streaming", "proto_version", "stream_xid")

    def __init__(
        self,
        proto_version: int = 1,
        *,
        encoding: str = "utf-8",
        parallel_streaming: bool | None = None,
    ) -> None:
        if not 1 <= proto_version <= MAX_PROTO_VERSION:
            raise ValueError(
                f"proto_version must be 1 to {MAX_PROTO_VERSION}, not {proto_version!r}"
            )
        self.proto_version = proto_version
        self.encoding = encoding
        #: Whether the stream was started with ``streaming = parallel``, which (with protocol
        #: version 4) adds the abort LSN and time to Stream Abort. None: tell by the length.
        self.parallel_streaming = parallel_streaming
        #: Xid of the streamed transaction whose block is open, None outside Stream Start/Stop.
        self.stream_xid: int | None = None
        self._dispatch: dict[int, Callable[[_Cursor], ReplicationMessage]] = {
            MessageType.BEGIN: self._begin,
            MessageType.MESSAGE: self._message,
            MessageType.COMMIT: self._commit,
            MessageType.ORIGIN: self._origin,
            MessageType.RELATION: self._relation,
            MessageType.TYPE: self._type,
            MessageType.INSERT: self._insert,
            MessageType.UPDATE: self._update,
            MessageType.DELETE: self._delete,
            MessageType.TRUNCATE: self._truncate,
            MessageType.STREAM_START: self._stream_start,
            MessageType.STREAM_STOP: self._stream_stop,
            MessageType.STREAM_COMMIT: self._stream_commit,
            MessageType.STREAM_ABORT: self._stream_abort,
            MessageType.BEGIN_PREPARE: self._begin_prepare,
            MessageType.PREPARE: self._prepare,
            MessageType.COMMIT_PREPARED: self._commit_prepared,
            MessageType.ROLLBACK_PREPARED: self._rollback_prepared,
            MessageType.STREAM_PREPARE: self._stream_prepare,
        }

    @property
    def in_stream(self) -> bool:
        return self.stream_xid is not None

    def reset(self) -> None:
        """Forget any open streamed block (a new connection starts outside one)."""
        self.stream_xid = None

    def decode(self, data: bytes | bytearray | memoryview) -> ReplicationMessage:
        """Decode one message. Raises ProtocolError for anything malformed."""
        if not isinstance(data, bytes):
            data = bytes(data)
        if not data:
            raise ProtocolError(None, 0, "empty message: expected at least the type byte")
        code = data[0]
        handler = self._dispatch.get(code)
        if handler is None:
            raise ProtocolError(
                chr(code),
                0,
                f"unknown message type {chr(code)!r} (0x{code:02x})",
            )
        since = MESSAGE_VERSIONS[code]
        if since > self.proto_version:
            raise ProtocolError(
                chr(code),
                0,
                f"message type {chr(code)!r} exists from protocol version {since}, "
                f"but this stream uses version {self.proto_version}",
            )
        if self.stream_xid is not None and code in OUTSIDE_STREAM:
            raise ProtocolError(
                chr(code),
                0,
                f"message type {chr(code)!r} inside the streamed block of xid {self.stream_xid} "
                "(expected Stream Stop first)",
            )
        cursor = _Cursor(data, self.encoding)
        message = handler(cursor)
        cursor.finish()
        # the stream state changes only once a message is known to be whole
        if code == MessageType.STREAM_START:
            self.stream_xid = message.xid  # type: ignore[union-attr]
        elif code == MessageType.STREAM_STOP:
            self.stream_xid = None
        return message

    # -- helpers ---------------------------------------------------------------------------
    def _xid(self, c: _Cursor) -> int | None:
        if self.stream_xid is None:
            return None
        return c.u32("Xid of the streamed transaction")

    def _check_flags(self, c: _Cursor, flags: int, offset: int) -> None:
        # PostgreSQL's own logicalrep_read_* reject any flags: "unrecognized flags %u in ..."
        if flags != 0:
            raise c.fail(f"unrecognized flags {flags} (currently unused, must be 0)", offset)

    # -- messages --------------------------------------------------------------------------
    def _begin(self, c: _Cursor) -> Begin:
        lsn, t, xid = c.unpack(_BEGIN, "Begin fields")
        return Begin(final_lsn=Lsn(lsn), commit_time=c.time(t, "commit time", 9), xid=xid)

    def _message(self, c: _Cursor) -> Message:
        xid = self._xid(c)
        at = c.pos
        flags, lsn = c.unpack(_MESSAGE, "flags and LSN")
        if flags not in (0, 1):
            raise c.fail(f"unrecognized flags {flags} (0 or 1 for transactional)", at)
        prefix = c.string("prefix")
        at = c.pos
        (length,) = c.unpack(_I32, "content length")
        if length < 0:
            raise c.fail(f"impossible content length {length}", at)
        c.need(length, "content")
        content = c.data[c.pos : c.pos + length]
        c.pos += length
        return Message(
            xid=xid, transactional=flags == 1, lsn=Lsn(lsn), prefix=prefix, content=content
        )

    def _commit(self, c: _Cursor) -> Commit:
        flags, lsn, end, t = c.unpack(_COMMIT, "Commit fields")
        self._check_flags(c, flags, 1)
        return Commit(
            flags=flags,
            commit_lsn=Lsn(lsn),
            end_lsn=Lsn(end),
            commit_time=c.time(t, "commit time", 18),
        )

    def _origin(self, c: _Cursor) -> Origin:
        (lsn,) = c.unpack(_U64, "origin commit LSN")
        return Origin(commit_lsn=Lsn(lsn), name=c.string("origin name"))

    def _relation(self, c: _Cursor) -> Relation:
        xid = self._xid(c)
        relid = c.u32("relation OID")
        namespace = c.string("namespace")
        name = c.string("relation name")
        at = c.pos
        ident, ncols = c.unpack(_RELATION_TAIL, "replica identity and column count")
        if ident not in (0x64, 0x6E, 0x66, 0x69):  # d n f i
            raise c.fail(
                f"unknown replica identity {chr(ident)!r} (0x{ident:02x}); expected d, n, f or i",
                at,
            )
        if ncols < 0:
            raise c.fail(f"impossible column count {ncols}", at + 1)
        columns = []
        for index in range(ncols):
            flags = c.u8(f"flags of column {index}")
            if flags not in (0, 1):
                raise c.fail(f"unrecognized flags {flags} of column {index}", c.pos - 1)
            cname = c.string(f"name of column {index}")
            type_id, typmod = c.unpack(_COLUMN_TAIL, f"type of column {index}")
            columns.append(Column(flags=flags, name=cname, type_id=type_id, type_modifier=typmod))
        return Relation(
            xid=xid,
            relation_id=relid,
            namespace=namespace,
            name=name,
            replica_identity=chr(ident),
            columns=tuple(columns),
        )

    def _type(self, c: _Cursor) -> Type:
        xid = self._xid(c)
        type_id = c.u32("type OID")
        return Type(
            xid=xid, type_id=type_id, namespace=c.string("namespace"), name=c.string("name")
        )

    def _insert(self, c: _Cursor) -> Insert:
        xid = self._xid(c)
        relid = c.u32("relation OID")
        marker = c.u8("'N' marker")
        if marker != _TUPLE_NEW:
            raise c.fail(f"expected 'N' before the new tuple, found {chr(marker)!r}", c.pos - 1)
        return Insert(xid=xid, relation_id=relid, new=c.tuple_data())

    def _update(self, c: _Cursor) -> Update:
        xid = self._xid(c)
        relid = c.u32("relation OID")
        marker = c.u8("'K', 'O' or 'N' marker")
        old_kind: Literal["K", "O"] | None = None
        old = None
        if marker in (_TUPLE_KEY, _TUPLE_OLD):
            old_kind = "K" if marker == _TUPLE_KEY else "O"
            old = c.tuple_data()
            marker = c.u8("'N' marker")
        if marker != _TUPLE_NEW:
            raise c.fail(
                f"expected {'N' if old_kind else 'K, O or N'!s} before the tuple, "
                f"found {chr(marker)!r} (an Update carries 'K' or 'O', never both)",
                c.pos - 1,
            )
        return Update(xid=xid, relation_id=relid, old_kind=old_kind, old=old, new=c.tuple_data())

    def _delete(self, c: _Cursor) -> Delete:
        xid = self._xid(c)
        relid = c.u32("relation OID")
        marker = c.u8("'K' or 'O' marker")
        if marker not in (_TUPLE_KEY, _TUPLE_OLD):
            raise c.fail(
                f"expected 'K' or 'O' before the old tuple, found {chr(marker)!r}", c.pos - 1
            )
        kind: Literal["K", "O"] = "K" if marker == _TUPLE_KEY else "O"
        return Delete(xid=xid, relation_id=relid, old_kind=kind, old=c.tuple_data())

    def _truncate(self, c: _Cursor) -> Truncate:
        xid = self._xid(c)
        at = c.pos
        count, options = c.unpack(_TRUNCATE, "relation count and options")
        if count < 0:
            raise c.fail(f"impossible relation count {count}", at)
        if options & ~3:
            raise c.fail(
                f"unrecognized option bits {options} (1 CASCADE, 2 RESTART IDENTITY)", at + 4
            )
        c.need(4 * count, f"{count} relation OIDs")
        relids = struct.unpack_from(f"!{count}I", c.data, c.pos)
        c.pos += 4 * count
        return Truncate(xid=xid, options=options, relation_ids=relids)

    def _stream_start(self, c: _Cursor) -> StreamStart:
        if self.stream_xid is not None:
            raise c.fail(f"Stream Start while the block of xid {self.stream_xid} is open", 0)
        xid, first = c.unpack(_STREAM_START, "Xid and first-segment flag")
        if first not in (0, 1):
            raise c.fail(f"first-segment flag must be 0 or 1, not {first}", 5)
        return StreamStart(xid=xid, first_segment=first == 1)

    def _stream_stop(self, c: _Cursor) -> StreamStop:
        if self.stream_xid is None:
            raise c.fail("Stream Stop without a Stream Start", 0)
        return StreamStop()

    def _stream_commit(self, c: _Cursor) -> StreamCommit:
        xid, flags, lsn, end, t = c.unpack(_STREAM_COMMIT, "Stream Commit fields")
        self._check_flags(c, flags, 5)
        return StreamCommit(
            xid=xid,
            flags=flags,
            commit_lsn=Lsn(lsn),
            end_lsn=Lsn(end),
            commit_time=c.time(t, "commit time", 22),
        )

    def _stream_abort(self, c: _Cursor) -> StreamAbort:
        xid, subxid = c.unpack(_STREAM_ABORT, "Xid and subtransaction Xid")
        remaining = c.end - c.pos
        with_info = self.proto_version >= 4 and self.parallel_streaming is not False
        if remaining == 0 and not (with_info and self.parallel_streaming):
            return StreamAbort(xid=xid, subxid=subxid, abort_lsn=None, abort_time=None)
        if not with_info:
            raise c.fail(
                f"{remaining} bytes after the subtransaction Xid; the abort LSN and time "
                "exist only with protocol version 4 and streaming = parallel (this stream: "
                f"version {self.proto_version}, parallel {self.parallel_streaming})"
            )
        lsn, t = c.unpack(_ABORT_INFO, "abort LSN and time")
        return StreamAbort(
            xid=xid, subxid=subxid, abort_lsn=Lsn(lsn), abort_time=c.time(t, "abort time", 17)
        )

    def _begin_prepare(self, c: _Cursor) -> BeginPrepare:
        lsn, end, t, xid = c.unpack(_BEGIN_PREPARE, "Begin Prepare fields")
        return BeginPrepare(
            prepare_lsn=Lsn(lsn),
            end_lsn=Lsn(end),
            prepare_time=c.time(t, "prepare time", 17),
            xid=xid,
            gid=c.gid(),
        )

    def _prepare_fields(self, c: _Cursor, what: str) -> tuple[int, Lsn, Lsn, datetime, int]:
        flags, lsn, end, t, xid = c.unpack(_PREPARE, what)
        self._check_flags(c, flags, 1)
        return flags, Lsn(lsn), Lsn(end), c.time(t, "timestamp", 18), xid

    def _prepare(self, c: _Cursor) -> Prepare:
        flags, lsn, end, t, xid = self._prepare_fields(c, "Prepare fields")
        return Prepare(
            flags=flags, prepare_lsn=lsn, end_lsn=end, prepare_time=t, xid=xid, gid=c.gid()
        )

    def _commit_prepared(self, c: _Cursor) -> CommitPrepared:
        flags, lsn, end, t, xid = self._prepare_fields(c, "Commit Prepared fields")
        return CommitPrepared(
            flags=flags, commit_lsn=lsn, end_lsn=end, commit_time=t, xid=xid, gid=c.gid()
        )

    def _rollback_prepared(self, c: _Cursor) -> RollbackPrepared:
        flags, pend, rend, pt, rt, xid = c.unpack(_ROLLBACK_PREPARED, "Rollback Prepared fields")
        self._check_flags(c, flags, 1)
        return RollbackPrepared(
            flags=flags,
            prepare_end_lsn=Lsn(pend),
            rollback_end_lsn=Lsn(rend),
            prepare_time=c.time(pt, "prepare time", 18),
            rollback_time=c.time(rt, "rollback time", 26),
            xid=xid,
            gid=c.gid(),
        )

    def _stream_prepare(self, c: _Cursor) -> StreamPrepare:
        flags, lsn, end, t, xid = self._prepare_fields(c, "Stream Prepare fields")
        return StreamPrepare(
            flags=flags, prepare_lsn=lsn, end_lsn=end, prepare_time=t, xid=xid, gid=c.gid()
        )
