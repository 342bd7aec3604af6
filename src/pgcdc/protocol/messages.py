"""One frozen dataclass per pgoutput message (protocol versions 1 to 4).

Names and fields follow PostgreSQL's "Logical Replication Message Formats" page in snake_case.
``xid`` is None where the message carries none: Relation, Type, Insert, Update, Delete, Truncate
and Message carry the transaction's Xid only inside a streamed block (protocol version 2+).
LSNs are ``Lsn`` (an int), times are timezone-aware UTC datetimes.

Column values of a TupleData are: None for a NULL ('n'), ``UNCHANGED_TOAST`` for an unchanged
TOASTed value whose data was not sent ('u'), ``str`` for text format ('t') and ``bytes`` for
binary format ('b').
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypeAlias

from pgcdc.lsn import Lsn

__all__ = [
    "UNCHANGED_TOAST",
    "Begin",
    "BeginPrepare",
    "Column",
    "Commit",
    "CommitPrepared",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "Prepare",
    "Relation",
    "ReplicationMessage",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "TupleValue",
    "Type",
    "UnchangedToast",
    "Update",
]


class UnchangedToast(enum.Enum):
    """The type of the ``UNCHANGED_TOAST`` sentinel ('u' in TupleData)."""

    UNCHANGED_TOAST = "u"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


#: An unchanged TOASTed value: the column kept its value but the server did not send it.
UNCHANGED_TOAST = UnchangedToast.UNCHANGED_TOAST

TupleValue: TypeAlias = str | bytes | UnchangedToast | None
TupleData: TypeAlias = tuple[TupleValue, ...]

#: Truncate option bits.
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2

#: Column flag: part of the replica identity key.
COLUMN_KEY = 1


@dataclass(frozen=True, slots=True)
class Begin:
    """'B': start of a (non-streamed) transaction."""

    final_lsn: Lsn
    commit_time: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Message:
    """'M': a logical decoding message (``pg_logical_emit_message``)."""

    xid: int | None
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Commit:
    """'C': end of a transaction."""

    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class Origin:
    """'O': the transaction was replayed from another node (replication origin)."""

    commit_lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a Relation message."""

    flags: int
    name: str
    type_id: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & COLUMN_KEY)


@dataclass(frozen=True, slots=True)
class Relation:
    """'R': describes a table before the first change to it (and after each schema change)."""

    xid: int | None
    relation_id: int
    namespace: str
    name: str
    replica_identity: str  # relreplident: 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    """'Y': describes a non-built-in data type used by a following Relation."""

    xid: int | None
    type_id: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    """'I': a new row."""

    xid: int | None
    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """'U': a changed row.

    The Update message may contain either a 'K' message part or an 'O' message part or neither
    of them, but never both of them: ``old_kind`` is 'K' (the old replica identity key, sent when
    the update changed it), 'O' (the whole old row, REPLICA IDENTITY FULL) or None.
    """

    xid: int | None
    relation_id: int
    old_kind: Literal["K", "O"] | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """'D': a removed row, identified by its key ('K') or its whole old row ('O')."""

    xid: int | None
    relation_id: int
    old_kind: Literal["K", "O"]
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    """'T': TRUNCATE of one or more relations; ``options`` bits: 1 CASCADE, 2 RESTART IDENTITY."""

    xid: int | None
    options: int
    relation_ids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class StreamStart:
    """'S': a block of changes of an in-progress transaction follows (protocol 2+)."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """'E': end of a streamed block."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """'c': a streamed transaction committed."""

    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """'A': a streamed transaction, or one of its subtransactions, aborted.

    ``subxid`` equals ``xid`` for the top-level transaction. ``abort_lsn`` and ``abort_time`` are
    sent only with protocol version 4 and ``streaming = parallel`` (pgoutput's
    ``write_abort_info``); they are None otherwise.
    """

    xid: int
    subxid: int
    abort_lsn: Lsn | None
    abort_time: datetime | None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """'b': start of a prepared transaction (two-phase, protocol 3+)."""

    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    """'P': PREPARE TRANSACTION decoded."""

    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    """'K': COMMIT PREPARED."""

    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    """'r': ROLLBACK PREPARED."""

    flags: int
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_time: datetime
    rollback_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    """'p': a streamed transaction was prepared."""

    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: datetime
    xid: int
    gid: str


ReplicationMessage: TypeAlias = (
    Begin
    | Message
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
