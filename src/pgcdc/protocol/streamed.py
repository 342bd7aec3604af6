"""Subtransactions of a streamed transaction: where each one's first message went, so that a
Stream Abort of one drops everything from there on.

PostgreSQL's apply worker does exactly this with its changes file (``subxact_info_add`` and
``stream_abort_internal`` in ``src/backend/replication/logical/worker.c``): the first message a
subtransaction sends inside a streamed block records the file's offset; "Stream Abort" of that
subtransaction truncates the file there, dropping the later subtransactions too, since their
messages came after. Sans-I/O: a reader says what a mark is (a spool offset and counters, a
buffer position) and applies the truncation itself. ``pgcdc.protocol.transactions``' framer
keeps each open streamed transaction's subtransactions here, for every reader of a stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Subtransactions"]

M = TypeVar("M")


class Subtransactions(Generic[M]):
    """The subtransactions one streamed transaction ``xid`` has sent, each with its mark.

    The hot path is one comparison: call ``note`` only when a message's Xid is neither the
    transaction's own nor the last one noted (``xid in (subs.xid, subs.last)``).
    """

    __slots__ = ("_marks", "last", "xid")

    def __init__(self, xid: int) -> None:
        self.xid = xid
        #: the Xid of the last message that was a subtransaction's (None after an abort)
        self.last: int | None = None
        self._marks: list[tuple[int, M]] = []

    def __len__(self) -> int:
        return len(self._marks)

    def note(self, xid: int, mark: Callable[[], M]) -> None:
        """A message of subtransaction ``xid`` arrived: if it is that subtransaction's first,
        remember ``mark()``, where that message goes."""
        if xid in (self.xid, self.last):
            return
        self.last = xid
        for seen, _ in reversed(self._marks):
            if seen == xid:
                return
        self._marks.append((xid, mark()))

    def abort(self, xid: int) -> M | None:
        """Subtransaction ``xid`` aborted: forget it and every later one, and return the mark
        of its first message, from which the reader drops everything (None: nothing of it was
        streamed, so nothing is dropped)."""
        self.last = None
        marks = self._marks
        for i in range(len(marks) - 1, -1, -1):
            if marks[i][0] == xid:
                mark = marks[i][1]
                del marks[i:]
                return mark
        return None
