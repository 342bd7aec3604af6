"""What output plugins receive: transaction metadata, row changes, truncations, messages.

All are frozen slotted dataclasses. Row values stay exactly as the codec decoded them (``str``
for text format, ``bytes`` for binary format, None for NULL, ``UNCHANGED_TOAST`` for an unchanged
TOASTed value the server did not send), so nothing is lost or converted unless asked:
``Change.value(column)`` converts one value to Python with ``pgcdc.protocol.values``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pgcdc.decoding.relations import RelationInfo
from pgcdc.lsn import Lsn
from pgcdc.protocol.messages import UNCHANGED_TOAST, TupleData, TupleValue

if TYPE_CHECKING:
    from pgcdc.protocol.values.registry import TypeRegistry

__all__ = [
    "Change",
    "ChangeAction",
    "LogicalMessage",
    "StreamAbortInfo",
    "Transaction",
    "TruncateChange",
]


@dataclass(frozen=True, slots=True)
class Transaction:
    """Metadata of a transaction (PostgreSQL's ReorderBufferTXN, as far as pgoutput sends it).

    What is known depends on the callback: a transaction delivered whole (begin/change/commit)
    carries its commit data from ``begin`` on, as PostgreSQL's does; a streamed transaction's
    ``stream_start`` knows only the xid (and origin), ``stream_commit`` everything.

    ``commit_lsn`` is the LSN of the commit record (Begin's final LSN, Commit / Stream Commit /
    Commit Prepared commit LSN); ``end_lsn`` the end of the record that completed the step being
    delivered (the commit, or for ``begin_prepare``/``prepare`` the PREPARE, for
    ``rollback_prepared`` the ROLLBACK PREPARED): confirming ``end_lsn`` means the server will
    not send this transaction again. Prepared transactions also carry ``gid``,
    ``prepare_lsn``, ``prepare_end_lsn`` and ``prepare_time``. ``origin`` / ``origin_lsn`` come
    from an Origin message (a transaction replayed from another node); ``origin_lsn`` is None
    for streamed transactions, whose Origin message carries none.
    """

    xid: int
    commit_lsn: Lsn | None = None
    end_lsn: Lsn | None = None
    commit_time: datetime | None = None
    origin: str | None = None
    origin_lsn: Lsn | None = None
    gid: str | None = None
    prepare_lsn: Lsn | None = None
    prepare_end_lsn: Lsn | None = None
    prepare_time: datetime | None = None
    rollback_time: datetime | None = None
    streamed: bool = False

    @property
    def final_lsn(self) -> Lsn | None:
        """The LSN that decides this transaction's place: commit LSN, else prepare LSN."""
        return self.commit_lsn if self.commit_lsn is not None else self.prepare_lsn

    @property
    def is_prepared(self) -> bool:
        """A two-phase transaction (PREPARE TRANSACTION ... COMMIT/ROLLBACK PREPARED)."""
        return self.gid is not None


class ChangeAction(enum.StrEnum):
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


def _converter() -> Callable[[TupleValue, int, Any], Any]:
    """``pgcdc.protocol.values.python_value``, imported on first use."""
    from pgcdc.protocol.values import python_value

    return python_value  # type: ignore[return-value]


def _registry(registry: TypeRegistry | None) -> TypeRegistry | None:
    if registry is not None:
        return registry
    from pgcdc.protocol.values.registry import DEFAULT_REGISTRY

    return DEFAULT_REGISTRY


@dataclass(frozen=True, slots=True)
class Change:
    """One row change: INSERT, UPDATE or DELETE.

    ``new`` is the new row (INSERT, UPDATE), ``old`` the old row (DELETE; UPDATE when the server
    sent it): with ``old_kind`` 'K' it holds only the replica identity key columns (the others
    are None), with 'O' the whole old row (REPLICA IDENTITY FULL). Values are as the codec gave
    them (str / bytes / None / ``UNCHANGED_TOAST``), one per column of ``relation``.

    ``position`` is the change's ordinal within its transaction (0, 1, ...; counted over the
    changes, truncations and transactional messages the plugin receives), so
    ``(commit_lsn, position)`` orders every change. ``lsn`` is the WAL position of the change
    when the source reported one (XLogData dataStart, or the SQL interface's lsn column);
    ``xid`` is the (sub)transaction xid the server labelled it with in a streamed block (None
    outside streaming): a streaming plugin needs it to honour subtransaction aborts.
    """

    action: ChangeAction
    relation: RelationInfo
    old_kind: Literal["K", "O"] | None
    old: TupleData | None
    new: TupleData | None
    position: int
    lsn: Lsn | None = None
    xid: int | None = None

    def _tuple(self, old: bool) -> TupleData:
        values = self.old if old else self.new
        if values is None:
            which = "old" if old else "new"
            raise ValueError(
                f"this {self.action} on {self.relation.qualified_name} has no {which} row"
                + (
                    " (the server sends the old row of an UPDATE only when the key changed or "
                    "with REPLICA IDENTITY FULL)"
                    if old and self.action is ChangeAction.UPDATE
                    else ""
                )
            )
        return values

    def raw(self, column: str, *, old: bool = False) -> TupleValue:
        """The value of ``column`` as sent: str, bytes, None or ``UNCHANGED_TOAST``."""
        return self._tuple(old)[self.relation.column_index(column)]

    def value(self, column: str, *, old: bool = False, registry: TypeRegistry | None = None) -> Any:
        """The value of ``column`` as a Python object (None for NULL).

        ``UNCHANGED_TOAST`` is returned as is: the column kept a value the server did not send,
        which is not NULL.
        """
        index = self.relation.column_index(column)
        raw = self._tuple(old)[index]
        if raw is None or raw is UNCHANGED_TOAST:
            return raw
        return _converter()(raw, self.relation.columns[index].type_id, _registry(registry))

    def values(self, *, old: bool = False, registry: TypeRegistry | None = None) -> dict[str, Any]:
        """Every column of the new (or old) row as Python objects, by column name."""
        values = self._tuple(old)
        convert = _converter()
        reg = _registry(registry)
        out: dict[str, Any] = {}
        for col, raw in zip(self.relation.columns, values, strict=True):
            if raw is None or raw is UNCHANGED_TOAST:
                out[col.name] = raw
            else:
                out[col.name] = convert(raw, col.type_id, reg)
        return out

    def raw_values(self, *, old: bool = False) -> dict[str, TupleValue]:
        """Every column of the new (or old) row as sent, by column name."""
        return dict(zip(self.relation.column_names, self._tuple(old), strict=True))

    def identity(self, registry: TypeRegistry | None = None) -> dict[str, Any]:
        """The replica identity key of the row this change touched, as Python values.

        From the old row when the server sent one (DELETE; UPDATE that changed the key or with
        REPLICA IDENTITY FULL), else from the new row.
        """
        use_old = self.old is not None
        return {
            c.name: self.value(c.name, old=use_old, registry=registry)
            for c in self.relation.key_columns
        }


@dataclass(frozen=True, slots=True)
class TruncateChange:
    """TRUNCATE of one or more relations (together, as foreign keys may require)."""

    relations: tuple[RelationInfo, ...]
    cascade: bool
    restart_identity: bool
    position: int
    lsn: Lsn | None = None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A message from ``pg_logical_emit_message(transactional, prefix, content)``.

    A transactional message is delivered inside its transaction (with a ``position``); a
    non-transactional one at once, outside any transaction (``position`` None). ``lsn`` is the
    message's WAL position; ``end_lsn`` (``lsn + 1``) is what to confirm once it is durable.
    """

    lsn: Lsn
    transactional: bool
    prefix: str
    content: bytes
    position: int | None = None
    xid: int | None = None

    @property
    def end_lsn(self) -> Lsn:
        return Lsn(self.lsn + 1)


@dataclass(frozen=True, slots=True)
class StreamAbortInfo:
    """Why ``stream_abort`` was called and what to discard.

    ``subxid`` is the aborted (sub)transaction; ``top_level`` is True when that is the whole
    transaction (``subxid`` is then the transaction's xid). Discard every change, truncation
    and message of this transaction with ``position >= discard_from`` that was streamed so
    far: that is what PostgreSQL's apply worker does (everything from the first change of the
    aborted subtransaction on, which includes its nested subtransactions). ``reason`` is
    'abort' (the server aborted it), 'reconnect' (the connection was lost mid-transaction;
    the server will send the
    transaction again from its start), 'restart' (the server started the transaction over
    without a reconnect) or 'duplicate' (the transaction turned out to be one already
    delivered before a reconnect). ``abort_lsn`` / ``abort_time`` are sent by the server only
    with protocol version 4 and ``streaming = parallel``.
    """

    subxid: int
    top_level: bool
    discard_from: int
    reason: Literal["abort", "reconnect", "restart", "duplicate"] = "abort"
    abort_lsn: Lsn | None = None
    abort_time: datetime | None = None
