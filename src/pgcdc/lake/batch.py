"""The ``foreachBatch`` function: one micro-batch of the source into the lake's Delta tables.

``LakeBatchWriter(df, batch_id)`` runs on the Spark driver (in Spark Connect: in the server's
Python worker, so it is a plain picklable object). For each table with changes in the batch and
each of its Delta tables (mirror, history, changelog) not already holding this batch's commit
(``Transaction(app_id, batch_id)``), it builds the rows in Spark, collects them as Arrow and
commits them with delta-rs in one commit per Delta table. A table with more than
``rows_per_commit`` changes (or ``bytes_per_commit`` of values) in the batch is instead staged
by the executors and committed in chunks (``pgcdc.lake.stage``), so the driver holds one chunk
at a time however large a transaction is. A replayed batch's commits (or chunks) that are
already there are skipped.

``Progress`` (per app id, in ``PROGRESS``) sums what the batches applied in this process and
tells its listeners (``BatchListener``: the pipeline's metrics and progress display) about each
batch, applied or failed. Listeners run in the thread that runs the batch and must not raise.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from pgcdc.lake.catalog import missing_values
from pgcdc.lake.changelog import append_changelog, changelog_rows
from pgcdc.lake.changes import (
    TableOverview,
    batch_overview,
    image_columns,
    resolve_unchanged,
    table_events,
)
from pgcdc.lake.history import history_keys, history_rows, merge_history
from pgcdc.lake.maintenance import Maintenance
from pgcdc.lake.mirror import (
    last_per_key,
    merge_mirror,
    mirror_events,
    mirror_keys,
    mirror_rows,
    reducible_keys,
)
from pgcdc.lake.stage import (
    CHUNK,
    chunk_count,
    hash_chunks,
    range_chunks,
    range_splittable,
    stage_rows,
)
from pgcdc.lake.tables import CL_COMMIT_LSN, COMMIT_TIME, POSITION, LakeLayout, LakeTable, TableKind
from pgcdc.lake.toast import root_column
from pgcdc.lake.writer import Chunk, DeltaTarget
from pgcdc.lsn import Lsn

__all__ = [
    "MAX_COMMIT_BYTES",
    "PROGRESS",
    "BatchListener",
    "BatchResult",
    "LakeBatchWriter",
    "Progress",
    "commit_bytes",
    "driver_heap",
]

log = logging.getLogger("pgcdc.lake")


@dataclass(slots=True)
class BatchResult:
    batch_id: int
    changes: int = 0
    tables: int = 0
    skipped: bool = False
    min_lsn: int | None = None
    max_lsn: int | None = None
    seconds: float = 0.0
    per_table: dict[str, int] = field(default_factory=dict)
    #: changes per (table id, operation 'I' / 'U' / 'D' / 'T')
    per_op: dict[tuple[str, str], int] = field(default_factory=dict)
    #: commit time of the newest source transaction the batch wrote to a mirror
    max_commit_time: datetime | None = None
    #: wall-clock time (``time.time()``) the batch's commits were done
    finished_at: float = 0.0


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

#: ``bytes_per_commit`` with a driver heap of 1 GiB (Spark's default) or more
MAX_COMMIT_BYTES = 128 << 20
#: ... and at least, with the smallest heap Spark starts with
MIN_COMMIT_BYTES = 16 << 20
#: the part of the driver heap Spark reserves for itself (``spark.testing.reservedMemory``)
_SPARK_RESERVED = 300 << 20


def commit_bytes(max_heap: int | None) -> int:
    """The default ``bytes_per_commit`` for a driver JVM whose heap may grow to ``max_heap``
    bytes (None: unknown, as under Spark Connect): 128 MiB from a 1 GiB heap on, less below
    it, in proportion to the heap beyond what Spark reserves. A batch collected to the driver
    in one piece (``toArrow``) passes through the driver's heap several times over: measured
    with 1 KB rows, a 512 MiB heap collected 61 MB of values and ran out of heap at 94 MB
    (this gives it 37 MiB); 1 GiB collected 110 MB."""
    if max_heap is None:
        return MAX_COMMIT_BYTES
    usable = max(max_heap - _SPARK_RESERVED, 0)
    scaled = MAX_COMMIT_BYTES * usable // ((1 << 30) - _SPARK_RESERVED)
    return max(MIN_COMMIT_BYTES, min(MAX_COMMIT_BYTES, scaled))


def _lsn(value: int | None) -> str:
    return "-" if value is None else str(Lsn(value))


def cache_level() -> Any:
    """How a batch's rows (and its resolved events, when two tables read them) are cached:
    serialized in memory, else on disk (``MEMORY_AND_DISK``), not ``DataFrame.persist``'s
    default ``MEMORY_AND_DISK_DESER``. A batch larger than Spark's storage memory goes to disk
    either way, but a deserialized one is unrolled into memory again by every later read, as
    far as memory lasts, and memory a task is unrolling into cannot be taken back for another
    task's sort: with a 512 MiB driver heap, a 200 MB transaction into a table with a history
    table failed ("Unable to acquire 65536 bytes of memory, got 0"). A serialized block on disk
    is read into memory only when all of it fits, and otherwise read from the disk."""
    from pyspark import StorageLevel

    return StorageLevel.MEMORY_AND_DISK


@dataclass(frozen=True)
class LakeBatchWriter:
    """Applies micro-batches of the source's DataFrame to the lake (picklable)."""

    lake: str
    tables: tuple[LakeTable, ...]
    table_columns: tuple[tuple[str, str], ...]  # (table id, struct column)
    app_id: str
    dsn: str | None = field(default=None, repr=False)  # for added columns' existing values
    fail_after: int | None = None  # tests: raise after this many Delta commits of a batch
    #: a table's changes in one batch above this are staged and committed in chunks
    rows_per_commit: int = 250_000
    bytes_per_commit: int = MAX_COMMIT_BYTES  # ... or whose values weigh more than this
    #: compaction and vacuum of the Delta tables a batch wrote, after its commits (None: none)
    maintenance: Maintenance | None = None

    def _chunks(self, info: TableOverview) -> int:
        """How many commits a table's rows of the batch go in (deterministic per batch)."""
        return max(
            chunk_count(info.changes, self.rows_per_commit),
            chunk_count(info.image_bytes, self.bytes_per_commit),
        )

    def _stage_dir(self) -> Path:
        return LakeLayout(Path(self.lake)).stage_dir / self.app_id

    def _targets(self, table: LakeTable) -> dict[TableKind, DeltaTarget]:
        layout = LakeLayout(Path(self.lake))
        return {kind: DeltaTarget(table.path(layout, kind)) for kind in table.kinds()}

    def __call__(self, df: Any, batch_id: int) -> None:
        progress = PROGRESS.setdefault(self.app_id, Progress())
        try:
            result = self.apply(df, int(batch_id))
        except BaseException as exc:
            progress.record_failure(int(batch_id), exc)
            raise
        progress.record(result)

    def apply(self, df: Any, batch_id: int) -> BatchResult:
        started = time.monotonic()
        result = BatchResult(batch_id)
        columns = dict(self.table_columns)
        known = {t.table_id for t in self.tables}
        written: list[tuple[str, DeltaTarget]] = []  # for maintenance, after the batch
        df = df.persist(cache_level())
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
            unknown = sorted(set(overview.tables) - known)
            if unknown:
                log.warning(
                    "batch %s has changes of tables the pipeline does not mirror (%s): "
                    "ignored; mirror them with a new pipeline",
                    batch_id,
                    ", ".join(unknown),
                )
            commits = 0
            for table in self.tables:
                info = overview.tables.get(table.table_id)
                if info is None:
                    continue
                wanted = {
                    kind: target
                    for kind, target in self._targets(table).items()
                    if not target.applied(self.app_id, batch_id)
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
                commits = self._apply_table(
                    df=df,
                    batch_id=batch_id,
                    table=table,
                    column=column,
                    info=info,
                    targets=wanted,
                    metadata=overview_meta(batch_id, info),
                    commits=commits,
                    result=result,
                )
                result.tables += 1
                written += [(f"{table.table_id} {kind}", t) for kind, t in wanted.items()]
            result.skipped = result.tables == 0 and bool(overview.tables)
        finally:
            df.unpersist()
            # batches apply one at a time: what is staged for this app id is this batch's
            shutil.rmtree(self._stage_dir(), ignore_errors=True)
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
        # after the batch's timing (its lag and duration are its commits') and its unpersist
        if self.maintenance is not None:
            self.maintenance.after_batch(written)
        return result

    def _apply_table(
        self,
        *,
        df: Any,
        batch_id: int,
        table: LakeTable,
        column: str,
        info: TableOverview,
        targets: dict[TableKind, DeltaTarget],
        metadata: dict[str, Any],
        commits: int,
        result: BatchResult | None = None,
    ) -> int:
        _, names = image_columns(df, column)
        missing = [k for k in table.keys if k not in names]
        if missing:
            raise RuntimeError(
                f"the source's columns for {table.table_id} lack its key column(s) "
                f"{', '.join(missing)}: publish every key column"
            )
        defaults = None
        if self.dsn is not None:
            dsn = self.dsn

            def defaults(types: Mapping[str, pa.DataType]) -> Mapping[str, Any]:
                return missing_values(dsn, table, types)

        resolved = None
        if "mirror" in targets or "history" in targets:
            events = table_events(df, table, column, names)
            resolved = resolve_unchanged(
                events,
                names,
                info.unchanged_columns,
                table.keys,
                rekeyed=info.old_with_unchanged > 0,
            )
            if "mirror" in targets and "history" in targets and info.unchanged_columns:
                resolved = resolved.persist(cache_level())
        try:
            if "mirror" in targets:

                def apply_mirror(rows: pa.Table, chunk: Chunk | None) -> None:
                    if result is not None:
                        _note_commit_time(result, rows)
                    merge_mirror(
                        targets["mirror"],
                        rows,
                        table,
                        names,
                        # the first chunk empties the table; the later ones only add to it
                        truncated=bool(info.truncates) and (chunk is None or chunk.number == 0),
                        app_id=self.app_id,
                        version=batch_id,
                        metadata=metadata,
                        defaults=defaults,
                        chunk=chunk,
                    )

                def collect_mirror() -> pa.Table | None:
                    events = mirror_events(resolved, table, names, info)
                    if not reducible_keys(events, table):
                        return None
                    return last_per_key(events.toArrow(), table.keys)

                commits = self._commit_one(
                    batch_id,
                    table,
                    "mirror",
                    target=targets["mirror"],
                    build=lambda: mirror_rows(resolved, table, names, info),
                    key_frame=lambda: mirror_keys(resolved, table, info),
                    collect=collect_mirror,
                    apply=apply_mirror,
                    commits=commits,
                    chunks=self._chunks(info),
                )
            if "history" in targets:
                commits = self._commit_one(
                    batch_id,
                    table,
                    "history",
                    target=targets["history"],
                    build=lambda: history_rows(resolved, table, names, info),
                    key_frame=lambda: history_keys(resolved, table, info),
                    apply=lambda rows, chunk: merge_history(
                        targets["history"],
                        rows,
                        table,
                        names,
                        info,
                        app_id=self.app_id,
                        version=batch_id,
                        metadata=metadata,
                        defaults=defaults,
                        chunk=chunk,
                    ),
                    commits=commits,
                    # in one piece when a TRUNCATE closes every version no row of the MERGE
                    # touched, or when a key change leaves values to fill from another key's
                    # current version (which that key's own close may end in another chunk)
                    chunks=(1 if info.truncates or info.old_with_unchanged else self._chunks(info)),
                )
            if "changelog" in targets:
                commits = self._commit_one(
                    batch_id,
                    table,
                    "changelog",
                    target=targets["changelog"],
                    build=lambda: changelog_rows(df, table, column, names),
                    apply=lambda rows, chunk: append_changelog(
                        targets["changelog"],
                        rows,
                        table,
                        app_id=self.app_id,
                        version=batch_id,
                        metadata=metadata,
                        chunk=chunk,
                        defaults=defaults,
                    ),
                    commits=commits,
                    chunks=self._chunks(info),
                )
        finally:
            if resolved is not None and resolved.is_cached:
                resolved.unpersist()
        return commits

    def _commit_one(
        self,
        batch_id: int,
        table: LakeTable,
        kind: TableKind,
        *,
        target: DeltaTarget,
        build: Callable[[], Any],
        apply: Callable[[pa.Table, Chunk | None], object],
        commits: int,
        chunks: int = 1,
        collect: Callable[[], pa.Table | None] | None = None,
        key_frame: Callable[[], Any] | None = None,
    ) -> int:
        """Build one Delta table's rows in Spark (``build`` gives the DataFrame) and ``apply``
        them: collected as Arrow in one Delta commit (by ``collect``, a cheaper way to the
        same rows, unless it gives None), or (``chunks`` > 1) staged by the
        executors and applied chunk by chunk, skipping the chunks a failed attempt committed.
        A split by key ranges finds its boundaries in ``key_frame()`` (the rows' key columns, a
        cheaper DataFrame with the same distinct keys) unless the rows have root columns.
        Logs the time each side took and counts the commits (``fail_after`` injects a failure
        after that many commits, for tests)."""
        previous = target.partial_chunks(self.app_id, batch_id)
        split: str | None = None
        if previous is not None:
            if previous[0] != chunks:
                log.info(
                    "batch %s %s %s: continuing in %s chunks (split by %s), as the "
                    "interrupted attempt split it",
                    batch_id,
                    table.table_id,
                    kind,
                    previous[0],
                    previous[1],
                )
            chunks, split = previous
        if chunks == 1:
            clock = time.monotonic()
            rows = None if collect is None else collect()
            if rows is None:
                rows = build().toArrow()
            spark_seconds = time.monotonic() - clock
            apply(rows, None)
            log.debug(
                "batch %s %s %s: %s rows, Spark %.2f s, Delta %.2f s",
                batch_id,
                table.table_id,
                kind,
                rows.num_rows,
                spark_seconds,
                time.monotonic() - clock - spark_seconds,
            )
            return self._counted(commits)
        clock = time.monotonic()
        frame = build()
        if kind == "changelog":  # appended, not merged: any even split
            split = "hash"
            chunked = frame.withColumn(CHUNK, hash_chunks([CL_COMMIT_LSN, POSITION], chunks))
        else:
            keys = list(table.keys)
            roots: list[str] = []
            if kind == "mirror":  # a row together with the stored row its unchanged values
                # come from
                candidates = [root_column(j) for j in range(len(table.keys))]
                if all(r in frame.columns for r in candidates):
                    roots = candidates
            if split is None:
                split = "range" if range_splittable(frame, keys) else "hash"
            if split == "range":
                by = range_chunks(
                    frame,
                    keys[0],
                    chunks,
                    root=roots[0] if roots else None,
                    keys=None if roots or key_frame is None else key_frame(),
                )
            else:
                by = hash_chunks(keys, chunks, roots=roots)
            chunked = frame.withColumn(CHUNK, by)
        digest = hashlib.sha256(table.table_id.encode()).hexdigest()[:16]
        staged = stage_rows(chunked, self._stage_dir() / str(batch_id) / f"{digest}.{kind}", chunks)
        log.info(
            "batch %s %s %s: staged in %s chunks, split by %s (%.2f s)",
            batch_id,
            table.table_id,
            kind,
            chunks,
            split,
            time.monotonic() - clock,
        )
        try:
            for k in range(chunks):
                if target.chunk_applied(self.app_id, batch_id, k):
                    log.info(
                        "batch %s %s %s: chunk %s of %s is already in the lake",
                        batch_id,
                        table.table_id,
                        kind,
                        k + 1,
                        chunks,
                    )
                    continue
                clock = time.monotonic()
                rows = staged.read(k)
                apply(rows, Chunk(k, chunks, split))
                log.debug(
                    "batch %s %s %s: chunk %s of %s, %s rows, Delta %.2f s",
                    batch_id,
                    table.table_id,
                    kind,
                    k + 1,
                    chunks,
                    rows.num_rows,
                    time.monotonic() - clock,
                )
                del rows
                commits = self._counted(commits)
        finally:
            staged.remove()
        return commits

    def _counted(self, commits: int) -> int:
        commits += 1
        if self.fail_after is not None and commits >= self.fail_after:
            raise RuntimeError(f"injected failure after {commits} Delta commit(s) (tests)")
        return commits


def _note_commit_time(result: BatchResult, rows: pa.Table) -> None:
    """Keep the newest ``__commit_time`` of a mirror's MERGE source in ``result``."""
    import pyarrow.compute as pc

    if COMMIT_TIME not in rows.column_names or rows.num_rows == 0:
        return
    newest = pc.max(rows.column(COMMIT_TIME)).as_py()
    if not isinstance(newest, datetime):
        return
    if newest.tzinfo is None:
        newest = newest.replace(tzinfo=UTC)
    if result.max_commit_time is None or newest > result.max_commit_time:
        result.max_commit_time = newest


def overview_meta(batch_id: int, info: TableOverview) -> dict[str, Any]:
    """Commit metadata: which batch and LSN range a commit holds (no row values)."""
    return {
        "batch": batch_id,
        "changes": info.changes,
        "min_lsn": _lsn(info.min_lsn),
        "max_lsn": _lsn(info.max_lsn),
    }


def driver_heap(spark: Any) -> int | None:
    """The most heap the session's driver JVM may use (``Runtime.maxMemory``: however it was
    set), or None without a JVM of this process (Spark Connect)."""
    try:
        return int(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory())
    except Exception:  # Spark Connect has no SparkContext
        return None


def table_column_pairs(tables: Sequence[LakeTable]) -> tuple[tuple[str, str], ...]:
    """(table id, struct column) for each table, named as the Spark source names them."""
    from pgcdc.spark import table_column

    return tuple((t.table_id, table_column(t.schema, t.name)) for t in tables)
