"""pgoutput's message type bytes, and a look at a message's header without decoding it.

Every pgoutput message starts with one type byte (PostgreSQL's "Logical Replication Message
Formats": "Byte1('B') Identifies the message as a begin message.", and so on). ``MessageType``
names them; nobody outside ``pgcdc.protocol`` spells a type byte. ``peek`` reads what a framer
needs to route a message (its type, the streamed transaction's Xid, the relation it changes,
whether a logical decoding message is transactional) at the fixed offsets the formats give,
without decoding the rest.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from pgcdc.protocol.errors import ProtocolError

__all__ = [
    "CHANGES",
    "DEFINITIONS",
    "OUTSIDE_STREAM",
    "TWO_PHASE",
    "XID_IN_STREAM",
    "MessageHeader",
    "MessageType",
    "peek",
    "relation_id",
    "truncated_relations",
    "without_xid",
]


class MessageType(enum.IntEnum):
    """The type byte of each pgoutput message, with the protocol version a server first sends
    it in (``since``)."""

    BEGIN = ord("B")
    MESSAGE = ord("M")
    COMMIT = ord("C")
    ORIGIN = ord("O")
    RELATION = ord("R")
    TYPE = ord("Y")
    INSERT = ord("I")
    UPDATE = ord("U")
    DELETE = ord("D")
    TRUNCATE = ord("T")
    STREAM_START = ord("S")
    STREAM_STOP = ord("E")
    STREAM_COMMIT = ord("c")
    STREAM_ABORT = ord("A")
    BEGIN_PREPARE = ord("b")
    PREPARE = ord("P")
    COMMIT_PREPARED = ord("K")
    ROLLBACK_PREPARED = ord("r")
    STREAM_PREPARE = ord("p")

    @property
    def since(self) -> int:
        """The lowest protocol version in which a server sends this message. The two-phase
        messages come in every version: logical.c decodes prepared transactions at PREPARE time
        whenever the slot was created with two_phase (``ctx->twophase &=
        slot->data.two_phase || ctx->twophase_opt_given``); pgoutput only refuses the *option*
        below version 3. Streaming (and Stream Prepare) needs version 2."""
        return 2 if self in _STREAMING else 1

    @property
    def letter(self) -> str:
        return chr(self)


_STREAMING = frozenset(
    {
        MessageType.STREAM_START,
        MessageType.STREAM_STOP,
        MessageType.STREAM_COMMIT,
        MessageType.STREAM_ABORT,
        MessageType.STREAM_PREPARE,
    }
)

#: Row changes: Insert, Update, Delete (each names its relation after the optional Xid).
CHANGES: frozenset[int] = frozenset({MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE})
#: Relation and Type messages: definitions a later change refers to.
DEFINITIONS: frozenset[int] = frozenset({MessageType.RELATION, MessageType.TYPE})
#: Messages that carry the streamed transaction's Xid right after the type byte inside a
#: Stream Start/Stop block (protocol version 2+).
XID_IN_STREAM: frozenset[int] = frozenset(
    {*CHANGES, *DEFINITIONS, MessageType.TRUNCATE, MessageType.MESSAGE}
)
#: Messages that may only appear outside a streamed block.
OUTSIDE_STREAM: frozenset[int] = frozenset(
    {
        MessageType.BEGIN,
        MessageType.COMMIT,
        MessageType.BEGIN_PREPARE,
        MessageType.PREPARE,
        MessageType.COMMIT_PREPARED,
        MessageType.ROLLBACK_PREPARED,
        MessageType.STREAM_COMMIT,
        MessageType.STREAM_ABORT,
        MessageType.STREAM_PREPARE,
    }
)
#: The messages of prepared transactions (two-phase decoding).
TWO_PHASE: frozenset[int] = frozenset(
    {
        MessageType.BEGIN_PREPARE,
        MessageType.PREPARE,
        MessageType.COMMIT_PREPARED,
        MessageType.ROLLBACK_PREPARED,
        MessageType.STREAM_PREPARE,
    }
)
_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")


@dataclass(frozen=True, slots=True)
class MessageHeader:
    """What ``peek`` reads of a message: its type; the Xid it carries (a streamed data
    message's, Stream Start's and the other messages that name their transaction: Begin's is
    at the end of its fixed part, so it is read too); the relation an Insert, Update, Delete
    or Relation names; whether a logical decoding Message is transactional."""

    kind: MessageType
    xid: int | None = None
    relation_id: int | None = None
    transactional: bool | None = None


def peek(payload: bytes, *, in_stream: bool) -> MessageHeader:
    """The header of one message (``in_stream``: inside a Stream Start/Stop block, where data
    messages carry an Xid first). Raises ProtocolError for an unknown type or a message too
    short for the header's fields."""
    if not payload:
        raise ProtocolError(None, 0, "empty message: expected at least the type byte")
    try:
        kind = MessageType(payload[0])
    except ValueError:
        code = payload[0]
        raise ProtocolError(
            chr(code), 0, f"unknown message type {chr(code)!r} (0x{code:02x})"
        ) from None
    at = 1
    xid = None
    try:
        if kind in XID_IN_STREAM:
            if in_stream:
                (xid,) = _U32.unpack_from(payload, at)
                at += 4
            if kind in CHANGES or kind == MessageType.RELATION:
                (relation,) = _U32.unpack_from(payload, at)
                return MessageHeader(kind, xid, relation)
            if kind == MessageType.MESSAGE:
                if len(payload) <= at:
                    raise struct.error
                return MessageHeader(kind, xid, transactional=payload[at] != 0)
            return MessageHeader(kind, xid)
        if kind in (MessageType.STREAM_START, MessageType.STREAM_COMMIT, MessageType.STREAM_ABORT):
            (xid,) = _U32.unpack_from(payload, 1)
        elif kind == MessageType.BEGIN:
            (xid,) = _U32.unpack_from(payload, 1 + 8 + 8)  # final_lsn, commit_time, xid
    except struct.error:
        raise ProtocolError(kind.letter, len(payload), "message too short for its header") from None
    return MessageHeader(kind, xid)


def relation_id(payload: bytes, *, in_stream: bool) -> int:
    """The relation an Insert, Update, Delete or Relation names ("Int32 (Oid) OID of the
    relation", after the Xid inside a streamed block), read without decoding the message."""
    at = 5 if in_stream else 1
    if len(payload) < at + 4:
        raise ProtocolError(
            chr(payload[0]) if payload else None, len(payload), "message too short for its relation"
        )
    relation: int = _U32.unpack_from(payload, at)[0]
    return relation


def truncated_relations(payload: bytes, *, in_stream: bool) -> int:
    """How many relations a Truncate names ("Int32 Number of relations"), read without decoding
    the message."""
    at = 5 if in_stream else 1
    if len(payload) < at + 4:
        raise ProtocolError("T", len(payload), "message too short for its relation count")
    count: int = _I32.unpack_from(payload, at)[0]
    return count


def without_xid(payload: bytes) -> bytes:
    """A data message of a streamed block as it is sent outside one: the same bytes without
    the Xid that follows the type byte."""
    return payload[:1] + payload[5:]
