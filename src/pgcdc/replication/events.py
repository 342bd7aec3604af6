"""What a replication session yields: WAL data, a reconnect notice, or an idle tick.

These three frozen dataclasses are the whole vocabulary between the session (or the SQL slot
reader) and its consumer, the transaction assembler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from pgcdc.lsn import Lsn

__all__ = ["Idle", "Reconnected", "ReplicationEvent", "WalData"]


@dataclass(frozen=True, slots=True)
class WalData:
    """One pgoutput message as received.

    ``data_start`` is the XLogData message's dataStart: the LSN the walsender attached to the
    message. The walsender sends 0 for messages written as part of a larger write (Relation and
    Type messages that precede a change, a Begin followed by an Origin). Through the SQL
    interface it is the row's ``lsn`` column, which is never 0. ``wal_end`` is the server's WAL
    end reported with the message (equal to ``data_start`` for logical replication, and always
    so through the SQL interface). ``payload`` is exactly one pgoutput message, for
    ``pgcdc.protocol.Decoder.decode``.
    """

    data_start: Lsn
    wal_end: Lsn
    payload: bytes


@dataclass(frozen=True, slots=True)
class Reconnected:
    """The connection was re-established; the server resends from the last confirmed position.

    Every consumer must drop its in-progress state (open transactions, streamed blocks,
    ``protocol.Decoder.reset()``) and keep what it already delivered: transactions that
    committed after ``resume_lsn`` arrive again, whole, and must be skipped by commit LSN.
    """

    resume_lsn: Lsn


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing arrived within the poll interval.

    ``server_wal_end`` is the walsender's position: everything before it was sent (through the
    SQL interface: a WAL position up to which every change has been read).
    """

    server_wal_end: Lsn


ReplicationEvent: TypeAlias = WalData | Reconnected | Idle
