"""The transaction index: every committed transaction received, in commit order, as offsets.

Per transaction it keeps its commit LSN, end LSN, commit time, xid, row count (changes, plus one
per relation of a TRUNCATE), pgoutput byte count and where its messages are in the spool; never
the data. Entries live in parallel ``array`` columns (about 70 bytes a transaction); a streamed
transaction, whose messages came in several blocks, keeps its list of spool ranges aside.

It also keeps the Relation and Type definitions in effect before each transaction (copy-on-
write snapshots, shared by every transaction until the next change), so that a partition can
start decoding at any transaction, and the Relation messages each transaction carries inline
(the planner checks them against the query's schema).

Batches are chosen here: ``select`` applies the read limits and never splits a transaction.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Definitions", "TransactionIndex", "TxnEntry"]

#: Relation ('R') and Type ('Y') messages in effect, by (message type, OID), as sent outside a
#: streamed block (no xid).
Definitions = Mapping[tuple[str, int], bytes]

_EMPTY: Definitions = {}


@dataclass(frozen=True, slots=True)
class TxnEntry:
    """One committed transaction: what a partition needs to read and label its rows."""

    commit_lsn: int
    end_lsn: int
    commit_time: int  # microseconds since the Unix epoch
    xid: int
    streamed: bool
    ranges: tuple[tuple[int, int], ...]  # spool byte ranges of its messages, in order
    rows: int
    nbytes: int  # pgoutput bytes of its messages

    @property
    def spool_bytes(self) -> int:
        return sum(end - start for start, end in self.ranges)


class TransactionIndex:
    """Committed transactions in commit order (not thread-safe: the caller locks)."""

    def __init__(self) -> None:
        self._base = 0  # absolute sequence number of the first entry kept
        self._commit = array("Q")
        self._end = array("Q")
        self._time = array("q")
        self._xid = array("Q")
        self._rows = array("q")
        self._bytes = array("q")
        self._start = array("q")  # first spool offset (lowest of its ranges)
        self._stop = array("q")  # spool offset after its single range
        self._streamed = bytearray()
        self._ranges: dict[int, tuple[tuple[int, int], ...]] = {}  # seq -> ranges (multi)
        self._inline: dict[int, tuple[bytes, ...]] = {}  # seq -> inline Relation messages
        self._defs_seq: list[int] = [0]  # definitions in effect from entry seq on
        self._defs: list[Definitions] = [_EMPTY]

    def __len__(self) -> int:
        return len(self._commit)

    @property
    def last_commit_lsn(self) -> int:
        return self._commit[-1] if self._commit else 0

    @property
    def total_rows(self) -> int:
        return sum(self._rows)

    def note_definitions(self, definitions: Definitions) -> None:
        """The definitions in effect for the transactions appended from now on."""
        seq = self._base + len(self._commit)
        if self._defs_seq[-1] == seq:
            self._defs[-1] = definitions
        else:
            self._defs_seq.append(seq)
            self._defs.append(definitions)

    def append(self, entry: TxnEntry, *, inline: tuple[bytes, ...] = ()) -> None:
        """Add the next transaction (its commit LSN must be higher than every earlier one)."""
        if self._commit and entry.commit_lsn <= self._commit[-1]:
            raise ValueError(
                f"commit LSN {entry.commit_lsn} is not after the last indexed one "
                f"{self._commit[-1]}"
            )
        if not entry.ranges:
            raise ValueError("a transaction without messages is not indexed")
        seq = self._base + len(self._commit)
        self._commit.append(entry.commit_lsn)
        self._end.append(entry.end_lsn)
        self._time.append(entry.commit_time)
        self._xid.append(entry.xid)
        self._rows.append(entry.rows)
        self._bytes.append(entry.nbytes)
        ranges = entry.ranges
        self._start.append(min(r[0] for r in ranges))
        self._stop.append(ranges[0][1] if len(ranges) == 1 else -1)
        self._streamed.append(1 if entry.streamed else 0)
        if len(ranges) != 1:
            self._ranges[seq] = ranges
        if inline:
            self._inline[seq] = inline

    # -- lookups ---------------------------------------------------------------------------
    def after(self, lsn: int) -> int:
        """Index of the first transaction whose commit LSN is above ``lsn``."""
        return bisect.bisect_right(self._commit, lsn)

    def find(self, commit_lsn: int) -> int | None:
        """Index of the transaction with this commit LSN, if indexed."""
        i = bisect.bisect_left(self._commit, commit_lsn)
        if i < len(self._commit) and self._commit[i] == commit_lsn:
            return i
        return None

    def commit_lsn(self, i: int) -> int:
        return self._commit[i]

    def end_lsn(self, i: int) -> int:
        return self._end[i]

    def entry(self, i: int) -> TxnEntry:
        seq = self._base + i
        ranges = self._ranges.get(seq)
        if ranges is None:
            ranges = ((self._start[i], self._stop[i]),)
        return TxnEntry(
            commit_lsn=self._commit[i],
            end_lsn=self._end[i],
            commit_time=self._time[i],
            xid=self._xid[i],
            streamed=bool(self._streamed[i]),
            ranges=ranges,
            rows=self._rows[i],
            nbytes=self._bytes[i],
        )

    def inline_relations(self, i: int) -> tuple[bytes, ...]:
        return self._inline.get(self._base + i, ())

    def definitions_before(self, i: int) -> Definitions:
        """The Relation/Type definitions in effect before transaction ``i``."""
        k = bisect.bisect_right(self._defs_seq, self._base + i) - 1
        return self._defs[k]

    def select(
        self,
        start_lsn: int,
        *,
        max_rows: int | None = None,
        max_bytes: int | None = None,
        end_lsn_limit: int | None = None,
    ) -> tuple[int, int, int, int]:
        """The batch after ``start_lsn``: ``(first, stop, rows, bytes)`` index bounds.

        Takes whole transactions while the limits hold, but always at least one (if any is
        available); ``end_lsn_limit`` excludes transactions whose commit record ends after it.
        """
        first = self.after(start_lsn)
        stop = first
        rows = nbytes = 0
        n = len(self._commit)
        while stop < n:
            if end_lsn_limit is not None and self._end[stop] > end_lsn_limit:
                break
            more_rows = rows + self._rows[stop]
            more_bytes = nbytes + self._bytes[stop]
            if stop > first and (
                (max_rows is not None and more_rows > max_rows)
                or (max_bytes is not None and more_bytes > max_bytes)
            ):
                break
            rows, nbytes = more_rows, more_bytes
            stop += 1
        return first, stop, rows, nbytes

    def limited(self, stop: int, end_lsn_limit: int | None = None) -> bool:
        """Whether a ``select`` that ended at ``stop`` was cut by its row or byte limit: the
        next transaction is indexed and within ``end_lsn_limit``, so the selection is final
        (transactions indexed later cannot change it)."""
        return stop < len(self._commit) and (
            end_lsn_limit is None or self._end[stop] <= end_lsn_limit
        )

    def available(self, start_lsn: int, end_lsn_limit: int | None = None) -> tuple[int, int]:
        """Rows and transactions available after ``start_lsn``."""
        first = self.after(start_lsn)
        stop = len(self._commit)
        if end_lsn_limit is not None:
            stop = first + bisect.bisect_right(self._end[first:], end_lsn_limit)
        return sum(self._rows[first:stop]), stop - first

    # -- forgetting ------------------------------------------------------------------------
    def drop_through(self, commit_lsn: int) -> int:
        """Forget every transaction with a commit LSN up to ``commit_lsn``; how many."""
        k = self.after(commit_lsn)
        if not k:
            return 0
        old_base = self._base
        for column in (
            self._commit,
            self._end,
            self._time,
            self._xid,
            self._rows,
            self._bytes,
            self._start,
            self._stop,
        ):
            del column[:k]
        del self._streamed[:k]
        self._base += k
        for mapping in (self._ranges, self._inline):
            for seq in [s for s in mapping if s < self._base]:
                del mapping[seq]
        # keep the definitions in effect at the new first entry, and later ones
        j = bisect.bisect_right(self._defs_seq, self._base) - 1
        if j > 0:
            del self._defs_seq[:j]
            del self._defs[:j]
        assert self._base == old_base + k
        return k

    def lowest_offset(self) -> int | None:
        """The lowest spool offset any kept transaction still needs."""
        return min(self._start) if self._start else None

    def needed_ranges(self) -> list[tuple[int, int]]:
        """The spool byte ranges the kept transactions read."""
        out: list[tuple[int, int]] = []
        for i, (start, stop) in enumerate(zip(self._start, self._stop, strict=True)):
            ranges = self._ranges.get(self._base + i)
            out.extend(ranges if ranges is not None else ((start, stop),))
        return out
