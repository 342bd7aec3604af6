"""The ``foreachBatch`` function: one micro-batch of the source into the lake's Delta tables.

``LakeBatchWriter(df, batch_id)`` runs on the Spark driver (in Spark Connect: in the server's
Python worker, so it is a plain picklable object), but no row of the batch passes through it:
one small Spark job per batch gathers per table its change counts, LSN range, TRUNCATEs and
unchanged-TOAST columns (``changes.batch_overview``), then for each table with changes, the
table's ``sink.TableBatch`` goes to the sink of each of its Delta tables (history, mirror,
changelog) not already holding this batch's commit: the rows are built in Spark and written by
Delta's Spark connector on the executors, a MERGE into the history and the mirror, an append
to the changelog, one commit per Delta table, tagged with the application transaction
``(app_id, batch id)``. A table's Delta tables are written at
the same time (each Delta operation's fixed cost, planning and job scheduling, is most of a
small batch's time); what the history reads of the mirror is pinned to its version before
the batch. A replayed batch's
commits that are already there are skipped (and Delta itself skips a tagged write it already
has). However large a transaction, it passes through the executors' memory and disk, never
through the driver.

A table added to the pipeline after its initial copy was copied at an LSN of its own
(``LakeBatchWriter.copied_at``): its changes committed before that LSN are in its copy and are
left out of every batch before anything reads it (``skip_copied``), the rule PostgreSQL's own
subscriber hands a table over from its table-sync worker to the apply worker by.

``Progress`` (per app id, in ``PROGRESS``) sums what the batches applied in this process and
tells its listeners (``BatchListener``: the pipeline's metrics and progress display) about each
batch, applied or failed. Listeners run in the thread that runs the batch and must not raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import operator
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from pgcdc.lake.results import BatchResult
from pgcdc.lake.store.delta import cache_level, conflicts
from pgcdc.lake.store.deltalog import TableLog
from pgcdc.lake.store.storage import LakePath
from pgcdc.lake.store.tables import ROW_ID, LakeLayout, LakeTable, TableKind
from pgcdc.lake.write.changes import (
    TableOverview,
    batch_overview,
    image_columns,
    resolve_unchanged,
    table_events,
)
from pgcdc.lake.write.held import HeldTable, held_tables, keep_rows
from pgcdc.lake.write.indexed import direct_write
from pgcdc.lake.write.maintenance import Maintenance, worker_for
from pgcdc.lake.write.mirror import inserted_only
from pgcdc.lake.write.missing import missing_values
from pgcdc.lake.write.multiset import assign_rows
from pgcdc.lake.write.schema_evolution import Defaults
from pgcdc.lake.write.sessions import in_sessions
from pgcdc.lake.write.sink import SINKS, TableBatch
from pgcdc.lsn import Lsn

__all__ = [
    "KILL_POINTS",
    "PROGRESS",
    "SYNC_KILL_POINTS",
    "BatchListener",
    "LakeBatchWriter",
    "Progress",
    "again_on_conflict",
    "skip_copied",
    "table_column_pairs",
]

log = logging.getLogger("pgcdc.lake")

#: tables of one batch written (and maintained) at the same time
PARALLEL_TABLES = 4
#: Delta commits of one batch made at the same time: each mostly waits (on the JVM, the log's
#: files, a small Spark job after it), so more than the cores
COMMIT_THREADS = 8

#: Tests only: ``pgcdc run`` with this variable set to one of ``KILL_POINTS`` (``point``, or
#: ``point@N``: in batch N or a later one) SIGKILLs itself the first time a batch's indexed
#: write reaches that point (``_Commits.reached``)
KILL_ENV = "PGCDC_TEST_KILL_AT"
#: The indexed write's points (``pgcdc.lake.write.indexed``) where a crash leaves the lake half
#: written: every Delta table's data files written, no index segment or commit yet; a table's
#: deletion vectors and index segment written, not its commit; a table's commit about to
#: start once another commit of the batch is in (the commits run ``COMMIT_THREADS`` at a
#: time: a batch of more Delta tables reaches it); a key index rebuilt from its table (the
#: Spark job read it), not yet saved or used; the histories' ended versions copied, not
#: committed
KILL_POINTS = ("data-files", "index-segment", "between-commits", "index-rebuild", "closed-copies")
#: The points of a table's copy beside the stream (``pgcdc.lake.run.table_sync``) where a
#: ``KILL_ENV`` run SIGKILLs itself: the copy landed, nothing kept aside applied yet; the last
#: changes kept aside applied, the table not yet recorded as streamed
SYNC_KILL_POINTS = ("sync-landed", "sync-caught-up")

_T = TypeVar("_T")
_R = TypeVar("_R")


class KillAt(NamedTuple):
    """Tests: where a run SIGKILLs itself (``KILL_ENV``): a point of ``KILL_POINTS``, in the
    first batch from ``batch`` on that reaches it."""

    point: str
    batch: int = 0


class BatchListener(Protocol):
    """Told about every batch of a ``Progress`` (from the thread running the batch)."""

    def batch_done(self, result: BatchResult) -> None: ...

    def batch_failed(self, batch_id: int, error: BaseException) -> None: ...


class Progress:
    """What the batches applied so far (in this process), for live progress displays."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches = 0
        self.changes = 0
        self.failures = 0
        self.last: BatchResult | None = None
        self.per_table: dict[str, int] = {}
        self._listeners: list[BatchListener] = []

    def subscribe(self, listener: BatchListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def unsubscribe(self, listener: BatchListener) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def record(self, result: BatchResult) -> None:
        with self._lock:
            self.batches += 1
            self.changes += result.changes
            self.last = result
            for table, n in result.per_table.items():
                self.per_table[table] = self.per_table.get(table, 0) + n
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener.batch_done(result)
            except Exception:  # a display or metric must never fail a batch
                log.exception("progress listener failed")

    def record_failure(self, batch_id: int, error: BaseException) -> None:
        with self._lock:
            self.failures += 1
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener.batch_failed(batch_id, error)
            except Exception:
                log.exception("progress listener failed")


#: Progress per app id, for callers in the same process as the foreachBatch function.
PROGRESS: dict[str, Progress] = {}


def _lsn(value: int | None) -> str:
    return "-" if value is None else str(Lsn(value))


#: how many times a table's write is tried when a concurrent commit (maintenance) conflicts
CONFLICT_ATTEMPTS = 5

#: a table's Delta tables, in the order their writes start
_ORDER: tuple[TableKind, ...] = ("history", "mirror", "changelog")


@dataclass(frozen=True)
class LakeBatchWriter:
    """Applies micro-batches of the source's DataFrame to the lake (picklable)."""

    lake: str
    tables: tuple[LakeTable, ...]
    table_columns: tuple[tuple[str, str], ...]  # (table id, struct column)
    app_id: str
    dsn: str | None = field(default=None, repr=False)  # for added columns' existing values
    #: tests: raise after this many Delta commits of a batch (0: before any, every attempt)
    fail_after: int | None = None
    #: tests: SIGKILL this process at this point of the indexed write (``KILL_ENV``)
    kill_at: KillAt | None = None
    #: compaction, purges and vacuum of the Delta tables a batch wrote, after its commits
    maintenance: Maintenance | None = None
    #: raises when this process may no longer write the lake (``Lease.check``): called
    #: before each Delta commit
    fence: Callable[[], None] | None = field(default=None, repr=False)
    #: the indexed write (new files, deletion vectors from the key index, one commit) for
    #: changelogs and the mirrors of tables with a key; False: Delta's MERGE and append only
    indexed: bool = True
    #: (table id, LSN) of the tables added after the initial copy: their copy holds what
    #: committed before the LSN (``skip_copied``)
    copied_at: tuple[tuple[str, int], ...] = ()
    #: the parked tables (their changes are not written; ``pgcdc resync`` brings them back)
    parked: tuple[str, ...] = ()
    #: applies changes kept aside for a table copied beside the stream (``held``), not a batch
    #: of the stream: the stream's held tables are not this writer's concern
    catch_up: bool = False

    def _paths(self, table: LakeTable) -> dict[TableKind, str]:
        layout = LakeLayout(LakePath.parse(self.lake).location)
        return {kind: str(table.path(layout, kind)) for kind in table.kinds()}

    def __call__(self, df: Any, batch_id: int) -> None:
        progress = PROGRESS.setdefault(self.app_id, Progress())
        try:
            result = self.apply(df, int(batch_id))
        except BaseException as exc:
            progress.record_failure(int(batch_id), exc)
            raise
        finally:
            release_jvm_objects()
        progress.record(result)

    def apply(self, df: Any, batch_id: int) -> BatchResult:
        if self.catch_up:
            return self._apply_batch(df, batch_id, ())
        held = held_tables(self.app_id)
        with held.batch():  # a table's switch from kept aside to written waits for the end
            joined = [e for e in held.direct() if e.table_id not in self._ids()]
            writer = self
            if joined:  # copied beside the stream and caught up since this query started
                writer = dataclasses.replace(
                    self,
                    tables=(*self.tables, *(e.table for e in joined)),
                    table_columns=(*self.table_columns, *((e.table_id, e.column) for e in joined)),
                    copied_at=(
                        *self.copied_at,
                        *((e.table_id, e.copied_at) for e in joined if e.copied_at is not None),
                    ),
                )
            return writer._apply_batch(df, batch_id, held.held())

    def _ids(self) -> set[str]:
        return {t.table_id for t in self.tables}

    def _apply_batch(self, df: Any, batch_id: int, held: Sequence[HeldTable]) -> BatchResult:
        started = time.monotonic()
        result = BatchResult(batch_id)
        columns = dict(self.table_columns)
        columns.update((e.table_id, e.column) for e in held)
        known = self._ids()
        written: list[tuple[str, str]] = []  # (name, path), for maintenance after the batch
        worker = None if self.maintenance is None else worker_for(self.app_id, self.maintenance)
        df = skip_copied(df, self.copied_at).persist(cache_level())
        with contextlib.ExitStack() as stack:
            if worker is not None:  # no vacuum of short retention while the batch writes
                stack.enter_context(worker.gate.batch())
            self._apply(
                df, batch_id, result, columns=columns, known=known, written=written, held=held
            )
        result.seconds = time.monotonic() - started
        result.finished_at = time.time()
        log.info(
            "batch %s: %s changes of %s tables, LSN %s to %s, %.2f s",
            batch_id,
            result.changes,
            result.tables,
            _lsn(result.min_lsn),
            _lsn(result.max_lsn),
            result.seconds,
            extra={
                "batch": batch_id,
                "changes": result.changes,
                "tables": result.tables,
                "min_lsn": _lsn(result.min_lsn),
                "max_lsn": _lsn(result.max_lsn),
                "seconds": round(result.seconds, 3),
            },
        )
        if worker is not None:  # beside the next batches, never inside one
            worker.submit(df.sparkSession, written, self.fence)
        return result

    def _apply(
        self,
        df: Any,
        batch_id: int,
        result: BatchResult,
        *,
        columns: dict[str, str],
        known: set[str],
        written: list[tuple[str, str]],
        held: Sequence[HeldTable] = (),
    ) -> None:
        try:
            clock = time.monotonic()
            overview = batch_overview(df, columns)
            log.debug("batch %s overview: %.2f s", batch_id, time.monotonic() - clock)
            result.changes = overview.changes
            result.min_lsn, result.max_lsn = overview.min_lsn, overview.max_lsn
            result.per_table = {t: info.changes for t, info in overview.tables.items()}
            for t, seen in overview.tables.items():
                for op, n in (
                    ("I", seen.inserts),
                    ("U", seen.updates),
                    ("D", seen.deletes),
                    ("T", len(seen.truncates)),
                ):
                    if n:
                        result.per_op[(t, op)] = n
            for entry in held:  # before the batch ends: the slot may advance past it then
                if entry.table_id in overview.tables:
                    keep_rows(df, entry, batch_id)
                    log.debug(
                        "batch %s: %s changes of %s kept aside while it is copied",
                        batch_id,
                        overview.tables[entry.table_id].changes,
                        entry.table_id,
                    )
                entry.last_batch = max(entry.last_batch, batch_id)
            kept = {e.table_id for e in held}
            unknown = sorted(set(overview.tables) - known - set(self.parked) - kept)
            if unknown:
                log.warning(
                    "batch %s has changes of tables the pipeline does not mirror (%s): "
                    "ignored (a table removed from [[tables]] leaves the publication; one "
                    "added joins at the next start)",
                    batch_id,
                    ", ".join(unknown),
                )
            jobs: list[_TableJob] = []
            for table in self.tables:
                info = overview.tables.get(table.table_id)
                if info is None:
                    continue
                paths = self._paths(table)
                wanted = {
                    kind: path
                    for kind, path in paths.items()
                    if not self._applied(df.sparkSession, path, batch_id)
                }
                if not wanted:
                    log.info("batch %s of %s is already in the lake", batch_id, table.table_id)
                    continue
                column = columns.get(table.table_id)
                if column is None or column not in df.columns:
                    log.warning(
                        "batch %s has %s changes of %s but no column for it: skipped",
                        batch_id,
                        info.changes,
                        table.table_id,
                    )
                    continue
                jobs.append(_TableJob(table, column, info, paths, wanted))
                written += [(f"{table.table_id} {kind}", p) for kind, p in wanted.items()]
            for newest in self._apply_tables(df, batch_id, jobs):
                if newest is not None and (
                    result.max_commit_time is None or newest > result.max_commit_time
                ):
                    result.max_commit_time = newest
            result.tables = len(jobs)
            result.skipped = result.tables == 0 and bool(overview.tables)
        finally:
            df.unpersist()

    def _apply_tables(self, df: Any, batch_id: int, jobs: Sequence[_TableJob]) -> list[Any]:
        """Write each table's Delta tables; the newest commit time each mirror got.

        The mirrors the key index serves and the changelogs are written together: their rows
        as new files by one Spark job for the whole batch, then a commit per Delta table
        (``pgcdc.lake.write.indexed``). The rest (histories; mirrors of tables without a key or that
        the batch truncated) by Delta's MERGE, the tables at the same time, up to
        ``PARALLEL_TABLES``, each in a Spark session of its own (a session's settings carry its
        writes' application transaction)."""
        commits = _Commits(self.fail_after, self.kill_at, batch_id)
        if self.fail_after == 0:
            raise RuntimeError("injected failure before any Delta commit (tests)")
        spark = df.sparkSession
        batches = [self._table_batch(spark, df, batch_id, job) for job in jobs]
        try:
            direct: list[tuple[TableBatch, TableKind, str]] = []
            merged: list[tuple[_TableJob, TableBatch, list[TableKind]]] = []
            for job, batch in zip(jobs, batches, strict=True):
                kinds = [k for k in _ORDER if k in job.wanted]
                own = [k for k in kinds if self._direct(job.table, job.info, k)]
                direct += [(batch, k, job.wanted[k]) for k in own]
                rest = [k for k in kinds if k not in own]
                if rest:
                    merged.append((job, batch, rest))
            newest: dict[str, Any] = {}
            if direct:
                for table_id, moment in self._write_direct(spark, direct, commits).items():
                    newest[table_id] = moment
            if merged:

                def run(session: Any, item: tuple[_TableJob, TableBatch, list[TableKind]]) -> Any:
                    job, batch, kinds = item
                    return self._merge_kinds(
                        session, batch_id, job=job, batch=batch, kinds=kinds, commits=commits
                    )

                for (job, _, _), moment in zip(
                    merged, in_sessions(spark, run, merged, PARALLEL_TABLES), strict=True
                ):
                    if moment is not None:
                        newest[job.table.table_id] = moment
        finally:
            for batch in batches:
                if batch.resolved is not None and batch.resolved.is_cached:
                    batch.resolved.unpersist()
        return [newest.get(job.table.table_id) for job in jobs]

    def _direct(self, table: LakeTable, info: TableOverview, kind: TableKind) -> bool:
        """Whether ``kind`` of a table is written without a MERGE: a changelog, or a mirror or
        history the key index serves (a table with a key, a batch without TRUNCATE)."""
        if not self.indexed:
            return False
        if kind == "changelog":
            return True
        return not table.multiset and not info.truncates

    def _write_direct(
        self,
        spark: Any,
        items: Sequence[tuple[TableBatch, TableKind, str]],
        commits: _Commits,
    ) -> dict[str, Any]:
        """Write ``items`` (a table's batch, the kind, the Delta table's path) by the indexed
        write: the rows of all of them by one Spark job, then one commit each (at the same
        time, up to ``PARALLEL_TABLES``); the newest commit time each mirror got."""

        return direct_write(
            spark,
            items,
            layout=LakeLayout(LakePath.parse(self.lake).location),
            fence=self.fence,
            on_commit=commits.count,
            parallel=COMMIT_THREADS,
            reached=commits.reached,
        )

    def _table_batch(self, spark: Any, df: Any, batch_id: int, job: _TableJob) -> TableBatch:
        """One table's part of the batch as its sinks read it (Spark plans; nothing runs
        but the mirror's pinned version). The history and a keyless table's row ids read the
        mirror as it was before the batch: its version is pinned before any of them writes."""
        table, column, info, paths, wanted = job
        metadata = overview_meta(batch_id, info)
        _, names = image_columns(df, column)
        missing = [k for k in table.keys if k not in names]
        if missing:
            raise RuntimeError(
                f"the source's columns for {table.table_id} lack its key column(s) "
                f"{', '.join(missing)}: publish every key column"
            )
        defaults: Defaults | None = None
        if self.dsn is not None:
            dsn = self.dsn

            def defaults(types: Mapping[str, Any]) -> Mapping[str, Any]:
                return missing_values(dsn, table, types)

        columns: Sequence[str] = [*names, ROW_ID] if table.multiset else names
        # only INSERTs: the Delta tables' keys are new, the rows are appended without a MERGE
        inserts_only = inserted_only(info)
        stored = None
        resolved = None
        # the events, resolved, are read by the MERGEs and by a mirror or history with
        # unchanged TOAST values; the shared plan of the indexed write reads the batch itself
        mirror_alone, history_alone = (
            kind in wanted and (not self._direct(table, info, kind) or bool(info.unchanged_columns))
            for kind in ("mirror", "history")
        )
        if mirror_alone or history_alone:
            before = self._mirror_before(spark, paths["mirror"], batch_id, wanted)
            # read only where the mirror's stored rows are needed (a table without a key's
            # copies, unchanged TOAST values, the history's MERGE): each reader of a pinned
            # version costs the driver that version's snapshot
            needed = (
                table.multiset
                or info.unchanged_columns
                or ("history" in wanted and not self._direct(table, info, "history"))
            )
            if before is not None and needed:
                stored = (
                    spark.read.format("delta").option("versionAsOf", before).load(paths["mirror"])
                )
            events = table_events(df, table, column, names)
            if table.multiset:
                events = assign_rows(events, table, columns, info, stored)
                info = dataclasses.replace(info, unchanged_columns=frozenset())
            resolved = resolve_unchanged(
                events,
                columns,
                info.unchanged_columns,
                table.row_keys,
                rekeyed=info.old_with_unchanged > 0,
            )
            if mirror_alone and history_alone:
                resolved = resolved.persist(cache_level())
        return TableBatch(
            table=table,
            batch_id=batch_id,
            app_id=self.app_id,
            changes=df,
            column=column,
            names=names,
            columns=columns,
            overview=info,
            resolved=resolved,
            stored=stored,
            inserts_only=inserts_only,
            metadata=metadata,
            defaults=defaults,
        )

    def _merge_kinds(
        self,
        spark: Any,
        batch_id: int,
        *,
        job: _TableJob,
        batch: TableBatch,
        kinds: Sequence[TableKind],
        commits: _Commits,
    ) -> Any:
        """Write ``kinds`` of one table by its sinks (Delta's MERGE or append), at the same
        time, each in a Spark session of its own; the newest commit time its mirror got
        (None without one)."""
        table = job.table

        def write(session: Any, kind: TableKind) -> Any:
            return again_on_conflict(
                lambda: write_once(session, kind), f"batch {batch_id} {table.table_id} {kind}"
            )

        def write_once(session: Any, kind: TableKind) -> Any:
            if self.fence is not None:
                self.fence()
            clock = time.monotonic()
            newest = SINKS[kind].write(session, job.wanted[kind], batch)
            log.debug(
                "batch %s %s %s: %.2f s", batch_id, table.table_id, kind, time.monotonic() - clock
            )
            commits.count()
            return newest

        results = dict(zip(kinds, in_sessions(spark, write, kinds, len(kinds)), strict=True))
        return results.get("mirror")

    def _applied(self, spark: Any, path: str, batch_id: int) -> bool:
        """Whether the Delta table at ``path`` holds this batch already (its commit recorded
        the batch's application transaction, or a later one)."""
        done = TableLog(spark, path).transaction_version(self.app_id)
        return done is not None and done >= batch_id

    def _mirror_before(
        self, spark: Any, path: str, batch_id: int, wanted: Mapping[TableKind, str]
    ) -> int | None:
        """The mirror's version before this batch's write (None: there was no mirror): its
        current one, unless a replay finds the batch's commit in it already."""
        table = TableLog(spark, path)
        latest = table.version()
        if "mirror" in wanted:
            return None if latest < 0 else latest
        before = table.version_before(self.app_id, batch_id)
        if before is None and latest >= 0:
            raise RuntimeError(
                f"the mirror at {path} holds batch {batch_id} but its log no longer has the "
                "commit: cannot tell what it held before; drop and copy the table again"
            )
        return before


def again_on_conflict(write: Callable[[], _R], what: str) -> _R:
    """``write()``, again while it fails for a concurrent commit (a compaction or purge by the
    maintenance running beside the batches; nothing of the failed commit is in the table and
    the write's application transaction keeps it once), up to ``CONFLICT_ATTEMPTS`` times."""
    for attempt in range(1, CONFLICT_ATTEMPTS):
        try:
            return write()
        except conflicts() as exc:
            log.info(
                "%s: a concurrent commit (%s); writing it again (%d)",
                what,
                type(exc).__name__,
                attempt,
            )
    return write()


class _TableJob(NamedTuple):
    """One table's part of a batch: its struct column, overview, Delta tables' paths, and the
    ones still to write."""

    table: LakeTable
    column: str
    info: TableOverview
    paths: Mapping[TableKind, str]
    wanted: Mapping[TableKind, str]


class _Commits:
    """The Delta commits a batch made (across the threads writing its tables), and the tests'
    injected failures: an error after ``fail_after`` of them, a SIGKILL at ``kill_at``."""

    def __init__(
        self, fail_after: int | None, kill_at: KillAt | None = None, batch_id: int = 0
    ) -> None:
        self.fail_after = fail_after
        self.kill_at = kill_at
        self.batch_id = batch_id
        self.done = 0
        self._lock = threading.Lock()

    def count(self) -> None:
        with self._lock:
            self.done += 1
            done = self.done
        if self.fail_after is not None and done >= self.fail_after:
            raise RuntimeError(f"injected failure after {done} Delta commit(s) (tests)")

    def reached(self, point: str, what: str) -> None:
        """The write reached ``point`` (one of ``KILL_POINTS``) of ``what``: the tests' kill
        there, if asked. The marker line goes out first, through the log (flushed on each
        record). The run's process group is killed with it when the run leads one (Spark's
        JVM and Python workers at once, as the chaos suite kills a run); otherwise they end
        as after any crash of this process (the JVM when its pipe from it closes)."""
        kill = self.kill_at
        if kill is None or point != kill.point or self.batch_id < kill.batch:
            return
        log.warning(
            "test kill point %s reached in batch %s (%s): SIGKILL", point, self.batch_id, what
        )
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def release_jvm_objects() -> None:
    """Free the JVM objects that Python objects of a finished batch still hold: its DataFrames
    keep their plans alive in the driver (in Spark 4 a plan node carries bit sets of a kilobyte:
    a batch of many tables holds tens of megabytes). Some of them sit in reference cycles, which
    only Python's full collection frees, and its thresholds count Python's allocations, not the
    JVM's heap, which fills first (``OutOfMemoryError`` after some hundred batches)."""
    gc.collect()


def skip_copied(df: Any, copied_at: Sequence[tuple[str, int]]) -> Any:
    """A batch's changes without those its added tables' copies hold: a change of a table
    copied at LSN X (``copied_at``: the consistent point of the snapshot it was copied in) is
    applied when its transaction's commit LSN is X or later, as PostgreSQL's subscriber applies
    a table's changes once its sync is done at X (``should_apply_changes_for_rel``: statelsn
    <= the commit's LSN). The snapshot exported at X holds exactly the transactions whose
    commit record starts before X; the slot streams the others."""
    if not copied_at:
        return df
    from pyspark.sql import functions as F

    held = [
        (F.col("_table_id") == F.lit(table_id)) & (F.col("_commit_lsn") < F.lit(lsn))
        for table_id, lsn in copied_at
    ]
    return df.where(~functools.reduce(operator.or_, held))


def overview_meta(batch_id: int, info: TableOverview) -> dict[str, Any]:
    """Commit metadata: which batch and LSN range a commit holds (no row values)."""
    return {
        "batch": batch_id,
        "changes": info.changes,
        "min_lsn": _lsn(info.min_lsn),
        "max_lsn": _lsn(info.max_lsn),
    }


def table_column_pairs(tables: Sequence[LakeTable]) -> tuple[tuple[str, str], ...]:
    """(table id, struct column) for each table, named as the Spark source names them."""
    from pgcdc.spark import table_column

    return tuple((t.table_id, table_column(t.schema, t.name)) for t in tables)
