"""Encoding pgoutput messages: the exact inverse of ``Decoder``.

Used by tests and benchmarks to build replication streams byte for byte as PostgreSQL's
``logicalrep_write_*`` functions (src/backend/replication/logical/proto.c) would. A message
that carries an ``xid`` where the format has one only inside a streamed block is encoded with
it; decoding such bytes needs a decoder inside a Stream Start/Stop block, as on the wire.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pgcdc.protocol.decoder import (
    _ABORT_INFO,
    _BEGIN,
    _BEGIN_PREPARE,
    _COLUMN_TAIL,
    _COMMIT,
    _I16,
    _I32,
    _MESSAGE,
    _PREPARE,
    _RELATION_TAIL,
    _ROLLBACK_PREPARED,
    _STREAM_ABORT,
    _STREAM_COMMIT,
    _STREAM_START,
    _U32,
    _U64,
    MAX_PROTO_VERSION,
)
from pgcdc.protocol.message_types import MessageType
from pgcdc.protocol.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
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
    Type,
    Update,
)
from pgcdc.protocol.timestamps import to_pg_micros

__all__ = ["Encoder", "encode_tuple"]

_TYPE_CODES: dict[type, MessageType] = {
    Begin: MessageType.BEGIN,
    Message: MessageType.MESSAGE,
    Commit: MessageType.COMMIT,
    Origin: MessageType.ORIGIN,
    Relation: MessageType.RELATION,
    Type: MessageType.TYPE,
    Insert: MessageType.INSERT,
    Update: MessageType.UPDATE,
    Delete: MessageType.DELETE,
    Truncate: MessageType.TRUNCATE,
    StreamStart: MessageType.STREAM_START,
    StreamStop: MessageType.STREAM_STOP,
    StreamCommit: MessageType.STREAM_COMMIT,
    StreamAbort: MessageType.STREAM_ABORT,
    BeginPrepare: MessageType.BEGIN_PREPARE,
    Prepare: MessageType.PREPARE,
    CommitPrepared: MessageType.COMMIT_PREPARED,
    RollbackPrepared: MessageType.ROLLBACK_PREPARED,
    StreamPrepare: MessageType.STREAM_PREPARE,
}


def _cstring(text: str, encoding: str) -> bytes:
    raw = text.encode(encoding)
    if b"\0" in raw:
        raise ValueError(f"string {text!r} contains a zero byte, which the format cannot carry")
    return raw + b"\0"


def encode_tuple(values: TupleData, encoding: str = "utf-8") -> bytes:
    """TupleData bytes for ``values`` (None, UNCHANGED_TOAST, str or bytes per column)."""
    out = [_I16.pack(len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(value, str):
            raw = value.encode(encoding)
            out.append(b"t" + _I32.pack(len(raw)) + raw)
        elif isinstance(value, bytes):
            out.append(b"b" + _I32.pack(len(value)) + value)
        else:
            raise TypeError(f"unsupported tuple value {type(value).__name__}")
    return b"".join(out)


class Encoder:
    """Encodes messages for a stream of protocol version ``proto_version``."""

    __slots__ = ("_handlers", "encoding", "proto_version")

    def __init__(self, proto_version: int = 1, *, encoding: str = "utf-8") -> None:
        if not 1 <= proto_version <= MAX_PROTO_VERSION:
            raise ValueError(f"proto_version must be 1 to {MAX_PROTO_VERSION}")
        self.proto_version = proto_version
        self.encoding = encoding
        self._handlers: dict[type, Callable[[Any], bytes]] = {
            Begin: self._begin,
            Message: self._message,
            Commit: self._commit,
            Origin: self._origin,
            Relation: self._relation,
            Type: self._type,
            Insert: self._insert,
            Update: self._update,
            Delete: self._delete,
            Truncate: self._truncate,
            StreamStart: self._stream_start,
            StreamStop: lambda m: b"",
            StreamCommit: self._stream_commit,
            StreamAbort: self._stream_abort,
            BeginPrepare: self._begin_prepare,
            Prepare: self._prepare_like,
            CommitPrepared: self._commit_prepared,
            RollbackPrepared: self._rollback_prepared,
            StreamPrepare: self._prepare_like,
        }

    def encode(self, message: ReplicationMessage) -> bytes:
        code = _TYPE_CODES[type(message)]
        since = code.since
        if since > self.proto_version:
            raise ValueError(
                f"{type(message).__name__} exists from protocol version {since}, "
                f"not in version {self.proto_version}"
            )
        return bytes((code,)) + self._handlers[type(message)](message)

    def _xid(self, xid: int | None) -> bytes:
        if xid is None:
            return b""
        if self.proto_version < 2:
            raise ValueError("an Xid on a data message needs protocol version 2 (streaming)")
        return _U32.pack(xid)

    def _s(self, text: str) -> bytes:
        return _cstring(text, self.encoding)

    def _begin(self, m: Begin) -> bytes:
        return _BEGIN.pack(m.final_lsn, to_pg_micros(m.commit_time), m.xid)

    def _message(self, m: Message) -> bytes:
        return (
            self._xid(m.xid)
            + _MESSAGE.pack(1 if m.transactional else 0, m.lsn)
            + self._s(m.prefix)
            + _I32.pack(len(m.content))
            + m.content
        )

    def _commit(self, m: Commit) -> bytes:
        return _COMMIT.pack(m.flags, m.commit_lsn, m.end_lsn, to_pg_micros(m.commit_time))

    def _origin(self, m: Origin) -> bytes:
        return _U64.pack(m.commit_lsn) + self._s(m.name)

    def _relation(self, m: Relation) -> bytes:
        parts = [
            self._xid(m.xid),
            _U32.pack(m.relation_id),
            self._s(m.namespace),
            self._s(m.name),
            _RELATION_TAIL.pack(ord(m.replica_identity), len(m.columns)),
        ]
        for col in m.columns:
            parts.append(
                bytes([col.flags])
                + self._s(col.name)
                + _COLUMN_TAIL.pack(col.type_id, col.type_modifier)
            )
        return b"".join(parts)

    def _type(self, m: Type) -> bytes:
        return self._xid(m.xid) + _U32.pack(m.type_id) + self._s(m.namespace) + self._s(m.name)

    def _insert(self, m: Insert) -> bytes:
        return (
            self._xid(m.xid) + _U32.pack(m.relation_id) + b"N" + encode_tuple(m.new, self.encoding)
        )

    def _update(self, m: Update) -> bytes:
        head = self._xid(m.xid) + _U32.pack(m.relation_id)
        if m.old_kind is not None:
            if m.old is None:
                raise ValueError("an Update with old_kind needs the old tuple")
            head += m.old_kind.encode() + encode_tuple(m.old, self.encoding)
        elif m.old is not None:
            raise ValueError("an Update with an old tuple needs old_kind 'K' or 'O'")
        return head + b"N" + encode_tuple(m.new, self.encoding)

    def _delete(self, m: Delete) -> bytes:
        return (
            self._xid(m.xid)
            + _U32.pack(m.relation_id)
            + m.old_kind.encode()
            + encode_tuple(m.old, self.encoding)
        )

    def _truncate(self, m: Truncate) -> bytes:
        return (
            self._xid(m.xid)
            + _I32.pack(len(m.relation_ids))
            + bytes([m.options])
            + struct.pack(f"!{len(m.relation_ids)}I", *m.relation_ids)
        )

    def _stream_start(self, m: StreamStart) -> bytes:
        return _STREAM_START.pack(m.xid, 1 if m.first_segment else 0)

    def _stream_commit(self, m: StreamCommit) -> bytes:
        return _STREAM_COMMIT.pack(
            m.xid, m.flags, m.commit_lsn, m.end_lsn, to_pg_micros(m.commit_time)
        )

    def _stream_abort(self, m: StreamAbort) -> bytes:
        head = _STREAM_ABORT.pack(m.xid, m.subxid)
        if m.abort_lsn is None and m.abort_time is None:
            return head
        if m.abort_lsn is None or m.abort_time is None:
            raise ValueError("a Stream Abort carries both abort_lsn and abort_time, or neither")
        if self.proto_version < 4:
            raise ValueError("abort_lsn and abort_time exist from protocol version 4")
        return head + _ABORT_INFO.pack(m.abort_lsn, to_pg_micros(m.abort_time))

    def _begin_prepare(self, m: BeginPrepare) -> bytes:
        return _BEGIN_PREPARE.pack(
            m.prepare_lsn, m.end_lsn, to_pg_micros(m.prepare_time), m.xid
        ) + self._s(m.gid)

    def _prepare_like(self, m: Prepare | StreamPrepare) -> bytes:
        return _PREPARE.pack(
            m.flags, m.prepare_lsn, m.end_lsn, to_pg_micros(m.prepare_time), m.xid
        ) + self._s(m.gid)

    def _commit_prepared(self, m: CommitPrepared) -> bytes:
        return _PREPARE.pack(
            m.flags, m.commit_lsn, m.end_lsn, to_pg_micros(m.commit_time), m.xid
        ) + self._s(m.gid)

    def _rollback_prepared(self, m: RollbackPrepared) -> bytes:
        return _ROLLBACK_PREPARED.pack(
            m.flags,
            m.prepare_end_lsn,
            m.rollback_end_lsn,
            to_pg_micros(m.prepare_time),
            to_pg_micros(m.rollback_time),
            m.xid,
        ) + self._s(m.gid)
