"""Standby status bookkeeping: which write, flush and apply positions to report, and when.

The rule (the same as PostgreSQL's own apply worker): ``write`` is the last position received
(data or keepalive), ``flush`` and ``apply`` the last position the consumer confirmed as
durable. Data counts as pending from receipt until a ``confirm()`` at or beyond its position.
While nothing is pending, the server's WAL end (which the walsender only reports once everything
before it was sent) is reported as flushed, so a slot whose changes are all filtered out, or
that sees no traffic, does not keep WAL forever.

A consequence worth knowing: a server shutting down (fast or smart mode) waits for its logical
walsenders' clients to report everything sent as flushed, with no time limit while the client
answers its keepalives, so it would wait for the consumer to confirm what it received; the
session closes its connection instead (``pgcdc.replication.session``).
"""

from __future__ import annotations

from pgcdc.lsn import Lsn

__all__ = ["FeedbackTracker"]


class FeedbackTracker:
    """Positions received, confirmed and reported on one replication stream."""

    __slots__ = ("acknowledge", "confirmed", "received", "reported_flush", "server_wal_end")

    def __init__(self, start: Lsn, *, acknowledge: bool = True) -> None:
        #: False: never report a flush position, so the slot stays where it was (--no-ack)
        self.acknowledge = acknowledge
        #: highest non-zero dataStart received
        self.received = start
        #: highest position the consumer confirmed (or the slot's position at start)
        self.confirmed = start
        #: highest WAL end the server reported (keepalives and data)
        self.server_wal_end = start
        #: highest flush position sent to the server
        self.reported_flush = start

    def receive(self, data_start: int) -> None:
        if data_start > self.received:
            self.received = Lsn(data_start)

    def note_wal_end(self, wal_end: int) -> None:
        if wal_end > self.server_wal_end:
            self.server_wal_end = Lsn(wal_end)

    def confirm(self, lsn: int) -> Lsn:
        """Record that everything up to ``lsn`` is durable; returns the new confirmed position."""
        if isinstance(lsn, bool) or not isinstance(lsn, int):
            raise TypeError(f"confirm() takes an Lsn, not {type(lsn).__name__}")
        limit = max(self.received, self.server_wal_end)
        if lsn > limit:
            raise ValueError(
                f"confirm({Lsn(lsn)}) is beyond anything the server has sent (up to {limit}); "
                "confirm the end_lsn of a Commit you received"
            )
        if lsn > self.confirmed:
            self.confirmed = Lsn(lsn)
        return self.confirmed

    @property
    def pending(self) -> bool:
        """Whether something was received that the consumer has not confirmed yet."""
        return self.received > self.confirmed

    def positions(self) -> tuple[Lsn, Lsn, Lsn]:
        """``(write, flush, apply)`` to report now.

        ``write`` is everything received, keepalives' WAL end included (as the native apply
        worker reports it; a walsender shutting down waits for it to reach its last position).
        Without ``acknowledge`` the flush and apply positions are 0 (InvalidXLogRecPtr), which
        the walsender ignores: the slot does not move.
        """
        if not self.acknowledge:
            return max(self.received, self.server_wal_end), Lsn(0), Lsn(0)
        if self.pending:
            # never report less than before: an earlier idle acknowledgement stays valid
            flush = max(self.confirmed, self.reported_flush)
        else:
            flush = max(self.confirmed, self.server_wal_end, self.reported_flush)
        return max(self.received, self.server_wal_end, flush), flush, flush

    def reported(self, flush: Lsn) -> None:
        self.reported_flush = max(self.reported_flush, flush)
