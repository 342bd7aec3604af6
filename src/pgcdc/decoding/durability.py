"""Which WAL position is durable: the ledger between delivered transactions and confirmations.

Each finished transaction (or non-transactional message) ends at a WAL position. One that was
skipped (filtered, rolled back, already delivered) is durable at once; one delivered to the
plugin is durable when the finishing callback returns (``auto_confirm``) or when the plugin
confirms a position at or beyond its end. ``durable`` is the highest position up to which
everything finished is durable: it never passes a delivered transaction the plugin has not
confirmed yet. Prepared transactions the assembler still holds are handled by
``Assembler.safe_confirm_lsn``, not here.
"""

from __future__ import annotations

from collections import deque

from pgcdc.lsn import Lsn

__all__ = ["Ledger"]


class Ledger:
    """Durability bookkeeping for one stream."""

    __slots__ = ("_pending", "auto", "confirmed", "processed")

    def __init__(self, auto: bool = True) -> None:
        self.auto = auto
        #: End of the latest finished transaction or message, delivered or not.
        self.processed = Lsn(0)
        #: Highest position the plugin confirmed.
        self.confirmed = Lsn(0)
        # delivered but unconfirmed: (end, position durable before it)
        self._pending: deque[tuple[Lsn, Lsn]] = deque()

    def passed(self, end: Lsn) -> None:
        """Something finished that needs no confirmation (skipped, discarded, filtered)."""
        self.processed = max(self.processed, end)

    def delivered(self, end: Lsn, returned: object = None) -> None:
        """Something was delivered; ``returned`` is what the finishing callback returned."""
        if isinstance(returned, int) and not isinstance(returned, bool):
            self.confirm(Lsn(returned))
        if not self.auto and end > self.confirmed:
            self._pending.append((end, self.processed))
        self.processed = max(self.processed, end)

    def confirm(self, lsn: Lsn) -> None:
        """The plugin made everything ending at or before ``lsn`` durable."""
        self.confirmed = max(self.confirmed, lsn)
        pending = self._pending
        while pending and pending[0][0] <= lsn:
            pending.popleft()

    @property
    def durable(self) -> Lsn:
        """Everything finished before this position is durable."""
        if self._pending:
            return self._pending[0][1]
        return self.processed

    @property
    def unconfirmed(self) -> int:
        """Delivered transactions the plugin has not confirmed yet."""
        return len(self._pending)
