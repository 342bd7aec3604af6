"""Keeping the lake's Delta tables fit for long runs: few files, and old files removed.

Every micro-batch adds at least one file to each Delta table it writes (a MERGE of new keys, an
append): a continuous pipeline at one batch a second adds some 86,000 small files a day to each
table. Every reader pays for each file (listing, opening, footers), and so does the Delta log:
its checkpoints (every 100 commits, delta-rs's post-commit hook) list every file. So after each
batch, for each Delta table it wrote (``Maintenance.after_batch``):

* **compaction**: once the table holds ``[lake] compact_files`` files smaller than a quarter
  of ``[lake] target_file_size`` (16 MB), delta-rs's ``optimize.compact`` rewrites its files
  below that size into files of about that size, keeping neighbouring files together (the
  order rows were written in, so a mirror's files keep their key ranges for the MERGE's
  pruning). It rewrites the files an earlier compaction made until they reach the size, so
  the size bounds a compaction's work: with 64 MB, the compactions of the latency benchmark's
  insert-only mirror took 0.5, 0.8, then 1.2 s (one per 100 batches), with 16 MB 0.5 to
  0.7 s each (and a copy-on-write MERGE rewrites smaller files). One
  commit, tagged ``{"pgcdc": {"operation": "compact"}}``; it changes no row, so it needs no
  application transaction and a replayed batch is still recognised by its own. Small files
  a compaction cannot merge (one between two files of the target size) do not count
  towards the next;
* **vacuum**: at most once every ``[lake] vacuum_interval`` seconds (3600) per table and
  process, the files no version of the last
  ``[lake] vacuum_retention_hours`` (168, Delta's default) uses any more are deleted
  (delta-rs ``vacuum``): the files compaction and copy-on-write MERGEs replaced, and files no
  version ever used (a write killed before its commit) once they are that old (with a
  retention of an hour at least: younger ones may be another writer's, not committed yet).
  Every file in the table's folder not used by the log is such a file: keep nothing else
  there. Time travel to versions older than that then fails, as it does after Delta's own
  ``VACUUM``.

Maintenance never fails a batch: its data is committed before, and a compaction or vacuum that
fails (a full disk, say) leaves the table as it was; it is logged as a warning and tried again
after a later batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable

from pgcdc.lake.writer import DeltaTarget

__all__ = ["COMPACT_METADATA", "Maintenance"]

log = logging.getLogger("pgcdc.lake")

#: the custom commit metadata of a compaction
COMPACT_METADATA = {"pgcdc": {"operation": "compact"}}
#: per table: when this process last vacuumed it (monotonic clock)
_vacuumed: dict[Path, float] = {}
#: per table: the small files the last compaction left (those it could not merge)
_left_small: dict[Path, int] = {}
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Maintenance:
    """When to compact and vacuum (``[lake] compact_files``, ``target_file_size``,
    ``vacuum``, ``vacuum_retention_hours``, ``vacuum_interval``); picklable, like the batch
    writer that holds it."""

    compact_files: int = 100  # 0: never compact
    target_file_size: int = 16 << 20
    vacuum: bool = True
    vacuum_retention_hours: int = 168
    vacuum_interval: float = 3600.0  # seconds between two vacuums of a table by a process

    def after_batch(self, targets: Iterable[tuple[str, DeltaTarget]]) -> None:
        """Compact and vacuum, when due, each ``(name, target)`` a batch wrote."""
        for name, target in targets:
            for step in (self.compact, self.vacuum_if_due):
                try:
                    step(name, target)
                except (KeyboardInterrupt, SystemExit):
                    raise
                # never fails the batch, whose commits are done: nothing of it depends on this.
                # BaseException: a panic in delta-rs arrives as pyo3's PanicException
                except BaseException as exc:
                    log.warning(
                        "maintenance (%s) of %s failed (%s: %s); tried again after a later batch",
                        step.__name__,
                        name,
                        type(exc).__name__,
                        str(exc)[:300],
                    )

    def small_files(self, target: DeltaTarget) -> int:
        """How many of the table's files are smaller than a quarter of the target size."""
        table = target.table()
        return 0 if table is None else self._small_files(table)

    def _small_files(self, table: DeltaTable) -> int:
        sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes")
        return int(pc.sum(pc.less(sizes, self.target_file_size // 4)).as_py() or 0)

    def compact(self, name: str, target: DeltaTarget) -> bool:
        """Compact the table if it holds ``compact_files`` small files more than the last
        compaction left; whether it did.

        A compaction can leave small files it cannot merge (one between two files of the
        target size or more, say): those do not count, else every batch would compact again
        and do nothing."""
        if self.compact_files <= 0:
            return False
        table = target.table()
        if table is None:
            return False
        small = self._small_files(table)
        with _lock:
            left = _left_small.get(target.path, 0)
        if small - left < self.compact_files:
            return False
        started = time.monotonic()
        metrics = table.optimize.compact(
            target_size=self.target_file_size,
            commit_properties=CommitProperties(custom_metadata=COMPACT_METADATA),
        )
        seconds = time.monotonic() - started
        remaining = self.small_files(target)
        with _lock:
            _left_small[target.path] = remaining
        log.log(
            logging.INFO if metrics.get("numFilesRemoved") else logging.DEBUG,
            "compacted %s: %s files into %s, %d small files left (%.2f s)",
            name,
            metrics.get("numFilesRemoved"),
            metrics.get("numFilesAdded"),
            remaining,
            seconds,
            extra={"table": name, "files_removed": metrics.get("numFilesRemoved")},
        )
        return True

    def vacuum_if_due(self, name: str, target: DeltaTarget, *, now: float | None = None) -> int:
        """Vacuum the table unless this process did within ``vacuum_interval``; how many
        replaced files past the retention it found (delta-rs counts those a previous vacuum
        deleted too)."""
        if not self.vacuum:
            return 0
        now = time.monotonic() if now is None else now
        with _lock:
            last = _vacuumed.get(target.path)
            if last is not None and now - last < self.vacuum_interval:
                return 0
        table = target.table()
        if table is None:
            return 0
        deleted = table.vacuum(
            retention_hours=self.vacuum_retention_hours,
            dry_run=False,
            # below Delta's default of 7 days only when the configuration says so
            enforce_retention_duration=self.vacuum_retention_hours >= 168,
            # also the files no version ever referenced (a write killed before its commit),
            # once an hour old at least: younger ones may be another writer's, not committed yet
            full=self.vacuum_retention_hours >= 1,
        )
        with _lock:  # after it succeeded: a failed vacuum is tried again after the next batch
            _vacuumed[target.path] = now
        log.debug(
            "vacuumed %s: %d replaced files past %d hours (deleted now or before)",
            name,
            len(deleted),
            self.vacuum_retention_hours,
        )
        return len(deleted)
