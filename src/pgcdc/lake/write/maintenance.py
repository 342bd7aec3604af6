"""Keeping the lake's Delta tables fit for long runs: few files, few deleted rows, old files gone.

Every micro-batch adds files to each Delta table it writes (the rows a MERGE wrote, an append,
and with deletion vectors a small bitmap file per changed data file): a continuous pipeline at
one batch a second adds tens of thousands of small files a day to each table. Every reader pays
for each file, and so do the MERGEs. So after each batch, for each Delta table it wrote
(``Maintenance.after_batch``), with Delta's own operations through its Spark connector:

* **compaction** (``OPTIMIZE``): once the table holds ``[lake] compact_files`` files smaller
  than a quarter of ``[lake] target_file_size`` (16 MB) more than the last compaction left,
  files below the target size are rewritten into files of about that size. One commit, its
  ``userMetadata`` ``{"pgcdc": {"operation": "compact"}}``; it changes no row, so it needs no
  application transaction and a replayed batch is still recognised by its own. The files'
  count comes from the connector's log: the table's files once, then the commits since;
* **purge** (``REORG TABLE ... APPLY (PURGE)``): at most every ``[lake] vacuum_interval``
  seconds per table (counted from the last REORG, or the table's creation), when the rows the
  table's deletion vectors mark deleted are more than ``[lake] purge_deleted_share`` of its
  rows, the files holding them are rewritten without them (scattered updates mark a little of
  every file; readers skip those rows at a cost);
* **vacuum** (``VACUUM``): at most every ``[lake] vacuum_interval`` seconds (3600) per table,
  counted from the last vacuum or else the table's creation (both read from the table's log,
  so scheduled runs share it), the
  files (and deletion vectors) no version of the last ``[lake] vacuum_retention_hours`` (168,
  Delta's default) uses any more are deleted, and files no version ever used (a write killed
  before its commit) once they are that old. Every file in the table's folder not used by the
  log is such a file: keep nothing else there. Time travel to versions older than that then
  fails, as after any ``VACUUM``.

Maintenance runs beside the batches, never inside one (``MaintenanceWorker``: a thread per
pipeline that takes the tables each batch wrote once its commits are done), and never fails a
batch: its data is committed before, and a failed step leaves the table as it was; it is
logged and tried again after a later batch. A compaction or purge that commits while a batch
writes the same table makes that batch's write conflict; the batch writes it again (its
application transaction makes that safe). A vacuum with a retention under
``EXCLUSIVE_VACUUM_HOURS`` could delete the files of a write in flight, so it waits for the
batch in flight and holds off the next one; with Delta's default retention it runs beside them.
A compaction or purge that lost ``EXCLUSIVE_AFTER`` races in a row does the same: under updates
scattered over a table every batch marks rows in the files it would rewrite, and it would never
land while the stream runs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pgcdc.lake.diagnosis import diagnose
from pgcdc.lake.store.delta import (
    CHECKPOINT_EVERY,
    USER_METADATA,
    conflicts,
    quote_name,
    user_metadata,
)
from pgcdc.lake.store.deltalog import TableLog
from pgcdc.lake.store.storage import LeaseLost

__all__ = [
    "COMPACT_METADATA",
    "EXCLUSIVE_AFTER",
    "EXCLUSIVE_VACUUM_HOURS",
    "GAVE_WAY_WARNING",
    "PURGE_METADATA",
    "Maintenance",
    "MaintenanceWorker",
    "deleted_share",
    "last_vacuum",
    "worker_for",
]

log = logging.getLogger("pgcdc.lake")

#: pgcdc's metadata of a compaction's and a purge's commits
COMPACT_METADATA = {"operation": "compact"}
PURGE_METADATA = {"operation": "purge"}
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
VACUUM_LISTING_TASKS = 4
#: per table path: when this process last vacuumed it / checked it for a purge (monotonic)
_vacuumed: dict[str, float] = {}
_purge_checked: dict[str, float] = {}
#: per table path: the small files the last compaction left (those it could not merge)
_left_small: dict[str, int] = {}
#: (step, table path) -> the step's conflicts since it last succeeded there
_gave_way: dict[tuple[str, str], int] = {}
#: per (table path, small-file limit): the table version counted, and its small files then
_small: dict[tuple[str, int], tuple[int, frozenset[str]]] = {}
_lock = threading.Lock()

#: conflicts in a row after which a step's giving way is a warning (and every as many after)
GAVE_WAY_WARNING = 20
#: conflicts in a row after which a compaction or purge holds off the batches while it runs
EXCLUSIVE_AFTER = 3


def deleted_share(spark: Any, path: str) -> float:
    """The share of the table's rows its deletion vectors mark deleted (one Spark job over
    the Delta log's file list)."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    jvm = spark.sparkContext._jvm
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    files = DataFrame(delta_log.unsafeVolatileSnapshot().allFiles().toDF(), spark)
    summary = files.agg(
        F.sum(F.coalesce(F.col("deletionVector.cardinality"), F.lit(0))),
        F.sum(F.get_json_object(F.col("stats"), "$.numRecords").cast("long")),
    ).first()
    deleted, total = (None, None) if summary is None else (summary[0], summary[1])
    if not total:
        return 0.0
    return float(deleted or 0) / float(total)


#: commits of a table's log searched for its last vacuum (newest first)
VACUUM_SEARCH_COMMITS = 1000


def last_vacuum(spark: Any, path: str) -> float | None:
    """When the table's last ``VACUUM`` ended (on the monotonic clock), as its log records it
    among its ``VACUUM_SEARCH_COMMITS`` latest commits; None if not there."""
    return _last_commit(spark, path, ("VACUUM END",), created=False)


def _last_commit(
    spark: Any, path: str, operations: tuple[str, ...], *, created: bool
) -> float | None:
    """When the table's newest commit of one of ``operations`` was made (on the monotonic
    clock), among its ``VACUUM_SEARCH_COMMITS`` latest (read through the connector's log);
    with ``created``, else when the table was created if its log is that short. None if
    neither is found."""

    log_ = TableLog(spark, path)
    found = None
    last = None
    for commit in log_.newest_commits(VACUUM_SEARCH_COMMITS):
        last = commit
        if commit.operation in operations:
            found = commit
            break
    if found is None and created and last is not None and last.version == 0:
        found = last
    if found is None or found.timestamp is None:
        return None
    at = found.timestamp / 1000.0
    return time.monotonic() - max(0.0, time.time() - at)


@dataclass(frozen=True, slots=True)
class Maintenance:
    """When to checkpoint, compact, purge and vacuum (``[lake] checkpoint_commits``,
    ``compact_files``, ``target_file_size``, ``purge_deleted_share``, ``vacuum``,
    ``vacuum_retention_hours``, ``vacuum_interval``); picklable, like the batch writer that
    holds it."""

    checkpoint_commits: int = CHECKPOINT_EVERY
    compact_files: int = 100  # 0: never compact
    target_file_size: int = 16 << 20
    purge_deleted_share: float = 0.25  # 1.0 or more: never purge
    vacuum: bool = True
    vacuum_retention_hours: int = 168
    vacuum_interval: float = 3600.0  # seconds between two vacuums (and purge checks) of a table

    def after_batch(
        self,
        spark: Any,
        tables: Iterable[tuple[str, str]],
        gate: BatchGate | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """Checkpoint, compact, purge and vacuum, when due, each ``(name, path)`` a batch
        wrote; a vacuum under ``EXCLUSIVE_VACUUM_HOURS`` of retention holds ``gate``
        exclusively. No further step starts once ``stopping()``."""
        for name, path in tables:
            steps = (self.checkpoint_if_due, self.compact, self.purge_if_due, self.vacuum_if_due)
            for step in steps:
                if stopping():
                    return
                key = (step.__name__, path)
                with _lock:
                    lost_before = _gave_way.get(key, 0)
                # a compaction or purge that keeps losing the commit race to the batches (each
                # batch marks rows in the files it rewrites) would never land: it holds them off
                crowded = lost_before >= EXCLUSIVE_AFTER and step in (
                    self.compact,
                    self.purge_if_due,
                )
                exclusive = crowded or (
                    step == self.vacuum_if_due
                    and self.vacuum_retention_hours < EXCLUSIVE_VACUUM_HOURS
                )
                if crowded and gate is not None:
                    log.info(
                        "maintenance (%s) of %s gave way to batches' commits %d times: it "
                        "holds off the next batch while it runs",
                        step.__name__,
                        name,
                        lost_before,
                    )
                guard = (
                    gate.exclusive() if gate is not None and exclusive else contextlib.nullcontext()
                )
                try:
                    with guard:
                        if stopping():  # again: an exclusive step may have waited long
                            return
                        step(spark, name, path)
                except (KeyboardInterrupt, SystemExit):
                    raise
                # never fails the batch, whose commits are done: nothing of it depends on this
                except Exception as exc:
                    if stopping():  # the run's stop cancelled the step's jobs: nothing failed
                        log.info(
                            "maintenance (%s) of %s cancelled: the run stops", step.__name__, name
                        )
                        return
                    conflict = isinstance(exc, conflicts())
                    with _lock:
                        lost = _gave_way[key] = _gave_way.get(key, 0) + int(conflict)
                    log.log(
                        logging.INFO if conflict else logging.WARNING,
                        "maintenance (%s) of %s %s (%s: %s); tried again after a later batch",
                        step.__name__,
                        name,
                        "gave way to a batch's commit" if conflict else "failed",
                        type(exc).__name__,
                        _first_line(exc) if conflict else str(diagnose(exc))[:600],
                    )
                    if conflict and lost % GAVE_WAY_WARNING == 0:
                        # a step that always loses never runs: small files or deleted rows pile
                        # up, and every batch slows down
                        log.warning(
                            "maintenance (%s) of %s gave way to batches' commits %d times in a "
                            "row and has not run since: give it room (a longer [stream] "
                            "trigger_interval), or stop pgcdc run and run it then (OPTIMIZE, "
                            "REORG TABLE ... APPLY (PURGE), VACUUM)",
                            step.__name__,
                            name,
                            lost,
                            extra={"table": name, "step": step.__name__, "conflicts": lost},
                        )
                else:
                    with _lock:
                        _gave_way.pop(key, None)

    def checkpoint_interval(self, path: str) -> int:
        """The commits between two checkpoints of the table at ``path``: ``checkpoint_commits``
        less up to half of it, by the path's hash. Tables that every batch commits (a pipeline's
        hundred small tables) would all come due in the same batch, a burst of a hundred
        checkpoints; this spreads them over the batches."""
        spread = zlib.crc32(path.encode()) % max(1, self.checkpoint_commits // 2)
        return self.checkpoint_commits - spread

    def checkpoint_if_due(self, spark: Any, name: str, path: str) -> bool:
        """Checkpoint the table's log when ``checkpoint_interval`` commits or more followed its
        newest checkpoint (tables pgcdc creates leave that to this step: ``TABLE_PROPERTIES``);
        whether it did."""
        log_ = TableLog(spark, path)
        snapshot = log_.snapshot()
        version = int(snapshot.version())
        if version - log_.checkpoint_version(snapshot) < self.checkpoint_interval(path):
            return False
        started = time.monotonic()
        log_.checkpoint(snapshot)
        log.debug("checkpoint of %s at %s: %.2f s", name, version, time.monotonic() - started)
        return True

    def small_files(self, spark: Any, path: str) -> int:
        """How many of the table's files are smaller than a quarter of the target size.

        Counted through the connector's log: once per process from the table's files (a
        Spark job), then carried forward by the commits since (their JSON files, no job: a
        batch over a hundred tables must not cost a hundred jobs here)."""

        limit = self.target_file_size // 4
        log_ = TableLog(spark, path)
        latest = log_.version()
        if latest < 0:
            return 0
        with _lock:
            known = _small.get((path, limit))
        small: set[str] | None = None
        if known is not None and known[0] <= latest:
            small = set(known[1])
            try:
                for commit in log_.commits(known[0] + 1, latest):
                    small.difference_update(commit.removed)
                    small.update(f.path for f in commit.added if f.size < limit)
            except LookupError:  # the JSON files are gone (a checkpoint's cleanup)
                small = None
        if small is None:
            snapshot = log_.snapshot()
            latest = int(snapshot.version())
            small = {f.path for f in log_.files(snapshot) if f.size < limit}
        with _lock:
            _small[(path, limit)] = (latest, frozenset(small))
        return len(small)

    def compact(self, spark: Any, name: str, path: str) -> bool:
        """Compact the table if it holds ``compact_files`` small files more than the last
        compaction left; whether it did.

        A compaction can leave small files it cannot merge (a lone small file, say): those do
        not count, else every batch would compact again and do nothing."""
        from delta.tables import DeltaTable

        if self.compact_files <= 0:
            return False
        small = self.small_files(spark, path)
        with _lock:
            left = _left_small.get(path, 0)
        if small - left < self.compact_files:
            return False
        started = time.monotonic()
        conf = spark.conf
        settings = {
            "spark.databricks.delta.optimize.maxFileSize": str(self.target_file_size),
            "spark.databricks.delta.optimize.minFileSize": str(self.target_file_size),
            # rows marked deleted are the purge's to drop, not every compaction's
            "spark.databricks.delta.optimize.maxDeletedRowsRatio": "1.0",
            USER_METADATA: user_metadata(COMPACT_METADATA),
        }
        for key, value in settings.items():
            conf.set(key, value)
        try:
            metrics = DeltaTable.forPath(spark, path).optimize().executeCompaction().first()
        finally:
            for key in settings:
                conf.unset(key)
        seconds = time.monotonic() - started
        remaining = self.small_files(spark, path)
        with _lock:
            _left_small[path] = remaining
        removed = metrics["metrics"]["numFilesRemoved"] if metrics is not None else None
        log.info(
            "compacted %s: %s files rewritten, %d small files left (%.2f s)",
            name,
            removed,
            remaining,
            seconds,
            extra={"table": name, "files_removed": removed},
        )
        return True

    @staticmethod
    def _remember(
        spark: Any, done: dict[str, float], path: str, operations: tuple[str, ...]
    ) -> None:
        """What a process that has not yet done a step for the table starts from: the step's
        last commit in the table's log, else the table's creation (a new table has nothing to
        vacuum or purge: scheduled runs and short ones do not each start with a step)."""
        with _lock:
            if path in done:
                return
        last = _last_commit(spark, path, operations, created=True)
        if last is not None:
            with _lock:
                done.setdefault(path, last)

    def _due(self, done: dict[str, float], path: str, now: float | None) -> float | None:
        now = time.monotonic() if now is None else now
        with _lock:
            last = done.get(path)
        if last is not None and now - last < self.vacuum_interval:
            return None
        return now

    def purge_if_due(self, spark: Any, name: str, path: str, *, now: float | None = None) -> bool:
        """Purge the rows the table's deletion vectors mark when they pass
        ``purge_deleted_share`` of its rows (checked at most every ``vacuum_interval``);
        whether it purged."""
        if self.purge_deleted_share >= 1.0:
            return False
        self._remember(spark, _purge_checked, path, ("REORG",))
        checked = self._due(_purge_checked, path, now)
        if checked is None:
            return False
        share = deleted_share(spark, path)
        purge = share > self.purge_deleted_share
        if purge:
            started = time.monotonic()
            conf = spark.conf
            conf.set(USER_METADATA, user_metadata(PURGE_METADATA))
            try:
                spark.sql(f"REORG TABLE delta.{quote_name(path)} APPLY (PURGE)")
            finally:
                conf.unset(USER_METADATA)
            log.info(
                "purged %s: %.0f%% of its rows were marked deleted (%.2f s)",
                name,
                share * 100,
                time.monotonic() - started,
                extra={"table": name},
            )
        with _lock:
            _purge_checked[path] = checked
        return purge

    def vacuum_if_due(self, spark: Any, name: str, path: str, *, now: float | None = None) -> bool:
        """Vacuum the table unless it was within ``vacuum_interval`` (by this process, or by
        any as the table's log tells); whether it vacuumed."""
        from delta.tables import DeltaTable

        if not self.vacuum:
            return False
        self._remember(spark, _vacuumed, path, ("VACUUM END",))
        due = self._due(_vacuumed, path, now)
        if due is None:
            return False
        # VACUUM lists the table's folder in this many Spark tasks (Spark's default for
        # partition discovery, 10,000: a table's folder needs a few)
        conf = spark.conf
        conf.set(LISTING_PARALLELISM, str(VACUUM_LISTING_TASKS))
        try:
            DeltaTable.forPath(spark, path).vacuum(float(self.vacuum_retention_hours))
        finally:
            conf.unset(LISTING_PARALLELISM)
        with _lock:  # after it succeeded: a failed vacuum is tried again after the next batch
            _vacuumed[path] = due
        log.debug("vacuumed %s (retention %d hours)", name, self.vacuum_retention_hours)
        return True


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


#: a vacuum with less retention than this (hours) runs between batches only: it deletes files
#: no version uses once older than the retention, and a write in flight has such files
EXCLUSIVE_VACUUM_HOURS = 1


class BatchGate:
    """Batches in flight against exclusive maintenance: any number of batches at once, or one
    exclusive step when none is in flight."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._batches = 0
        self._exclusive = False

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._exclusive)
            self._batches += 1
        try:
            yield
        finally:
            with self._changed:
                self._batches -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._exclusive and self._batches == 0)
            self._exclusive = True
        try:
            yield
        finally:
            with self._changed:
                self._exclusive = False
                self._changed.notify_all()


#: the Spark job group of maintenance's jobs, cancelled when a pipeline stops
JOB_GROUP = "pgcdc-maintenance"


class MaintenanceWorker:
    """Maintenance of the Delta tables batches wrote, in a thread of its own, so that no
    batch's latency includes it: ``submit`` (after a batch's commits) queues the tables, each
    once however many batches wrote it since, and the thread works through them in a Spark
    session of its own. ``drain`` waits for the queue to empty (a run that ends when caught up
    leaves its tables maintained); ``stop`` cancels the step in flight (it leaves its table as
    it was) and ends the thread."""

    def __init__(self, maintenance: Maintenance) -> None:
        self.maintenance = maintenance
        self.gate = BatchGate()
        self._changed = threading.Condition()
        self._pending: dict[str, str] = {}  # path -> name, in the order first queued
        self._spark: Any = None
        self._fence: Callable[[], None] | None = None
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def submit(
        self,
        spark: Any,
        tables: Iterable[tuple[str, str]],
        fence: Callable[[], None] | None = None,
    ) -> None:
        """Queue ``tables`` for maintenance; ``fence`` (the run's lease check, raising
        ``LeaseLost``) is called before each step, which a lost lake does not start."""
        with self._changed:
            if self._stopped:
                return
            for name, path in tables:
                self._pending.setdefault(path, name)
            self._spark = spark
            self._fence = fence
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="pgcdc-maintenance", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued table is maintained; whether it was within ``timeout``."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._stopped or (not self._pending and not self._busy), timeout
            )

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._pending.clear()
            spark = self._spark if self._busy else None  # Spark warns of a group with no job
            self._changed.notify_all()
        if spark is not None:
            with contextlib.suppress(Exception):  # a stopped context has nothing to cancel
                spark.sparkContext.cancelJobGroup(JOB_GROUP)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)

    def _must_stop(self) -> bool:
        """Stopped, or the lake is no longer this run's: a step would write a lake another
        process holds (a compaction or a purge commits, a vacuum deletes files)."""
        if self._stopped:
            return True
        fence = self._fence
        if fence is None:
            return False
        try:
            fence()
        except LeaseLost as exc:
            log.warning("maintenance stopped: %s", exc)
            with self._changed:
                self._stopped = True
                self._pending.clear()
                self._changed.notify_all()
            return True
        return False

    def _run(self) -> None:
        session: Any = None
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopped or bool(self._pending))
                if self._stopped:
                    return
                path, name = next(iter(self._pending.items()))
                del self._pending[path]
                spark = self._spark
                self._busy = True
            try:
                app = spark.sparkContext.applicationId
                if session is None or session.sparkContext.applicationId != app:
                    session = spark.newSession()
                # pinned threads: the group is this thread's, so stop cancels only maintenance
                session.sparkContext.setJobGroup(JOB_GROUP, "pgcdc maintenance", False)
                self.maintenance.after_batch(
                    session, [(name, path)], self.gate, stopping=self._must_stop
                )
            except Exception as exc:  # a stopped context: nothing to maintain any more
                log.debug("maintenance of %s not run (%s)", name, type(exc).__name__)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()


#: per pipeline application id: its maintenance worker
_WORKERS: dict[str, MaintenanceWorker] = {}


def worker_for(app_id: str, maintenance: Maintenance | None = None) -> MaintenanceWorker | None:
    """The maintenance worker of the pipeline ``app_id`` (created with ``maintenance`` when
    given; a stopped one is replaced); None if it has none."""
    replaced = None
    with _lock:
        worker = _WORKERS.get(app_id)
        if maintenance is not None and (
            worker is None or worker.stopped or worker.maintenance != maintenance
        ):
            replaced, worker = worker, MaintenanceWorker(maintenance)
            _WORKERS[app_id] = worker
    if replaced is not None:
        replaced.stop()
    return worker
