"""Tables copied while the stream runs: a table that joins the pipeline, and ``pgcdc resync``.

A table joins as PostgreSQL's subscriber synchronises a table added to its publication
(``tablesync.c``: a table-sync worker per table beside the apply worker), one thread per table
beside the stream, in phases the lake's state records (``TablePhase``):

1. **copying** (``TableSet.apply``, with the stream stopped between two batches): the state
   records the table with the copy's attempt and ``from_batch``, the stream's next micro-batch;
   the publication gains it. From ``from_batch`` on the stream keeps the table's changes aside
   (``pgcdc.lake.write.held``) instead of writing them; the other tables stream on.
2. The thread (``TableSync``) creates a temporary slot with an exported snapshot, at consistent
   point X, and copies the table in that snapshot as the initial copy copies. A new table's
   Delta tables are created and committed; a table copied anew keeps its Delta tables until
   the copy lands, then each moves in one commit (``pgcdc.lake.write.landing``).
3. **catching-up** (the copy landed at X; the state records ``copied_at``): the changes kept
   aside are applied to the table's Delta tables, those committed at X or later, in rounds
   while the stream keeps batches coming; the last round runs between two batches and makes the
   table **direct**: from the next batch on the stream writes it itself.
4. **streaming**: the state lists the table among those the stream writes, with ``copied_at``.

The handover has no gap and no duplicate. The snapshot exported at X holds exactly the
transactions whose commit record starts before X, and the stream applies the table's changes
committed at X or later, and only those (``batch.skip_copied``). Every such change reaches the
stream after ``from_batch`` began: the stream was stopped and started again after the
publication gained the table and before the temporary slot was created; and a slot becomes
consistent only once the transactions running when it was created have ended, so every
transaction committed at X or later began after the publication gained the table and is
decoded with it published (the changes of a transaction that overlapped the ``ALTER
PUBLICATION``, which PostgreSQL's decoding has had bugs with, all commit before X and are in
the copy).

A kill at any point resumes: a table found **copying** is copied again from scratch (a new
attempt, a new ``from_batch``: what the earlier attempt kept aside is dropped, and a new table's
half-made Delta tables removed); one found **catching-up** applies what was kept aside from
where its Delta tables are (each records the newest batch applied to it, the catch-up's
application transaction) to the newest batch the streaming checkpoint committed, and the
stream's replay of later batches keeps theirs again.

A copy that fails (after ``copy_attempts``' tries for a table whose columns changed under it)
parks the table, naming the cause and the fix, unless ``[lake] on_table_failure`` is "stop":
then the run stops with it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgcdc.errors import PgcdcError
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.initial_copy import build_indexes, copy_attempts, copy_in_snapshot, shapes_at
from pgcdc.lake.store.deltalog import TableLog
from pgcdc.lake.store.state import (
    PipelineState,
    TablePhase,
    committed_batch,
    now,
    update_state,
)
from pgcdc.lake.store.storage import LakeLocation
from pgcdc.lake.store.tables import LakeLayout, LakeTable, TableKind
from pgcdc.lake.write.batch import LakeBatchWriter, table_column_pairs
from pgcdc.lake.write.held import HeldTable, held_folder, held_rows, held_tables
from pgcdc.lake.write.keyindex import forget_index
from pgcdc.lake.write.landing import copy_rows, land_changelog, land_history, overwrite
from pgcdc.lake.write.snapshot import Incompatible, SnapshotResult, remove_tables
from pgcdc.lsn import Lsn
from pgcdc.replication import create_slot_with_snapshot, scrub_secrets

if TYPE_CHECKING:
    from pgcdc.lake.run.pipeline import Pipeline

__all__ = ["SYNC_PHASES", "TableSync", "TableSyncs", "next_batch"]

log = logging.getLogger("pgcdc.lake")

#: the phases of a table whose copy is under way
SYNC_PHASES = ("copying", "catching-up")

#: the Spark scheduler pool of the copies' jobs (the stream's run in the default pool)
COPY_POOL = "pgcdc-copy"

#: a catch-up round applies what was kept aside without stopping the stream; the last one,
#: between two batches, once fewer than this many batches are left, or after ``MAX_ROUNDS``
#: (a round applies every batch kept aside since the last: each is shorter than the one before
#: unless the stream outruns the writes)
FINAL_ROUND_BATCHES = 2
MAX_ROUNDS = 5


def next_batch(layout: LakeLayout, state: PipelineState) -> int:
    """The stream's next micro-batch: the one after the newest its checkpoint committed."""
    committed = committed_batch(state.checkpoint(layout))
    return 0 if committed is None else committed + 1


class TableSyncs:
    """The copies of tables joining ``pipeline`` while it streams, a thread each."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._syncs: dict[str, TableSync] = {}
        self._lock = threading.Lock()
        #: set when a table's copy ended (joined, parked or failed): the stream looks
        self.changed = threading.Event()
        #: the rows copied of each table whose copy landed in this run
        self.copied: dict[str, int] = {}

    def start(self, tables: Sequence[LakeTable], state: PipelineState) -> None:
        """Start a copy for each table of ``tables`` that ``state`` records as being copied or
        catching up and that has none running; register what the stream keeps aside for them
        before any batch runs."""
        layout = self.pipeline.layout
        held = held_tables(state.stream_app_id)
        committed = committed_batch(state.checkpoint(layout))
        from pgcdc.spark import table_column

        for table in tables:
            phase = state.phases.get(table.table_id)
            if phase is None or phase.phase not in SYNC_PHASES or phase.from_batch is None:
                continue
            with self._lock:
                running = self._syncs.get(table.table_id)
                if running is not None and running.alive():
                    continue
            done = -1 if committed is None else committed
            entry = HeldTable(
                table=table,
                column=table_column(table.schema, table.name),
                folder=held_folder(layout, table, phase.attempt),
                from_batch=phase.from_batch,
                last_batch=max(phase.from_batch - 1, done),
            )
            held.hold(entry)
            sync = TableSync(self, table, phase, entry)
            with self._lock:
                self._syncs[table.table_id] = sync
            sync.start()

    def unfinished(self) -> list[str]:
        with self._lock:
            return sorted(t for t, s in self._syncs.items() if s.alive())

    def wait(self, stopping: threading.Event) -> None:
        """Until every copy ended (or ``stopping`` is set)."""
        while self.unfinished() and not stopping.is_set():
            self.changed.wait(1.0)
            self.changed.clear()

    def failure(self) -> BaseException | None:
        """The first error a copy ended with that stops the run (``on_table_failure`` "stop")."""
        with self._lock:
            for sync in self._syncs.values():
                if sync.fatal is not None:
                    return sync.fatal
        return None

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel the copies running (their tables stay as the state says: the next start
        copies them again, or goes on catching up)."""
        with self._lock:
            syncs = list(self._syncs.values())
        for sync in syncs:
            sync.cancel()
        deadline = time.monotonic() + timeout
        for sync in syncs:
            sync.join(max(0.0, deadline - time.monotonic()))

    def ended(self, sync: TableSync) -> None:
        self.changed.set()


class TableSync:
    """One table's copy beside the stream (see the module doc), in a thread of its own."""

    def __init__(
        self, owner: TableSyncs, table: LakeTable, phase: TablePhase, entry: HeldTable
    ) -> None:
        self.owner = owner
        self.pipeline = owner.pipeline
        self.table = table
        self.phase = phase
        self.entry = entry
        self.group = f"pgcdc-sync-{secrets.token_hex(6)}"
        self.cancelled = threading.Event()
        #: the error that ends the run (``on_table_failure`` "stop"), once there is one
        self.fatal: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"pgcdc-sync-{table.table_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def cancel(self) -> None:
        self.cancelled.set()
        try:
            self.pipeline.spark().sparkContext.cancelJobGroup(self.group)
        except Exception as exc:  # a session already stopped
            log.debug("cancelling the copy of %s: %s", self.table.table_id, exc)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        table_id = self.table.table_id
        try:
            spark = self.pipeline.spark()
            context = spark.sparkContext
            context.setJobGroup(self.group, f"pgcdc: copy of {table_id}", True)
            # beside the stream's batches, not ahead of them (``spark.scheduler.mode`` FAIR)
            context.setLocalProperty("spark.scheduler.pool", COPY_POOL)
            if self.phase.phase == "copying":
                point = self._copy()
            else:
                assert self.phase.copied_at is not None
                point = Lsn.parse(self.phase.copied_at)
            self.entry.copied_at = int(point)
            self._catch_up(point)
        except BaseException as exc:
            if self.cancelled.is_set():
                log.info("the copy of %s was stopped with the run", table_id)
            else:
                self._failed(exc)
        finally:
            self.owner.ended(self)

    def _failed(self, exc: BaseException) -> None:
        """Park the table (or stop the run, with ``on_table_failure`` "stop")."""
        table_id = self.table.table_id
        if isinstance(exc, PgcdcError):
            message = scrub_secrets(str(exc))
        else:
            message = f"the copy of {table_id} failed: {type(exc).__name__}: {exc}"
        fix = (
            ""
            if ". Fix: " in message
            else f". Fix: pgcdc resync --config pipeline.toml {table_id} once the cause is gone "
            "(copies it anew while the others stream on)"
        )
        pipeline = self.pipeline
        if pipeline.config.lake.on_table_failure == "stop":
            self.fatal = PipelineError(message + fix)
            self.fatal.__cause__ = exc
            log.error("%s", self.fatal)
            return
        log.warning("%s", message, exc_info=exc)
        held_tables(self.entry_app_id()).drop(table_id)
        pipeline.park({table_id: message + fix})

    def entry_app_id(self) -> str:
        state = self.pipeline.state
        assert state is not None
        return state.stream_app_id

    # -- 2. the copy -----------------------------------------------------------------------

    def _copy(self) -> Lsn:
        """Copy the table in a temporary slot's snapshot (again, with a new plan, while its
        columns change under the copy) and land it; the snapshot's consistent point X."""
        table = self.table
        state = self.pipeline.state
        assert state is not None

        def again(_attempt: int) -> None:
            replanned = self.pipeline.replan()
            for t in replanned.tables:
                if t.table_id == table.table_id:
                    self.table = self.entry.table = t

        return copy_attempts(self._copy_once, again, f"the copy of {table.table_id}")

    def _copy_once(self) -> Lsn:
        pipeline = self.pipeline
        table = self.table
        table_id = table.table_id
        layout = pipeline.layout
        source = pipeline.config.source
        again = self.phase.again
        if not again:  # what an earlier attempt left of a new table
            remove_tables(layout, [table], pipeline.lease.check)
        started = time.monotonic()
        name = f"pgcdc_add_{secrets.token_hex(6)}"
        with create_slot_with_snapshot(
            pipeline.dsn, name, temporary=True, connect_timeout=source.connect_timeout
        ) as exported:
            started_at = datetime.now(UTC)
            point = Lsn(exported.consistent_point)
            log.info(
                "copying %s at %s (temporary slot %s) while the stream runs",
                table_id,
                point,
                name,
                extra={"table": table_id, "lsn": str(point), "slot": name},
            )
            shapes = shapes_at(pipeline.dsn, exported.snapshot_name, [table])
            copied = self._write(exported, started_at, point)
        self._kill_point("sync-landed")

        def landed(state: PipelineState) -> PipelineState:
            phases = dict(state.phases)
            phases[table_id] = replace(
                phases[table_id],
                phase="catching-up",
                since=now(),
                copied_at=str(point),
                copy_started_at=started_at.isoformat(),
                rows=copied.rows.get(table_id, 0),
            )
            return state.evolve(phases=phases, shapes={**state.shapes, **shapes})

        pipeline.state = update_state(layout, landed)
        for kind in table.kinds():  # the indexes this process kept of what was replaced
            forget_index(str(table.path(layout, kind)))
        rows = self.owner.copied[table_id] = copied.rows.get(table_id, 0)
        pipeline.observer.snapshot_finished(rows, time.monotonic() - started)
        if pipeline.config.lake.write == "indexed":
            build_indexes(pipeline.spark(), layout, [table], copied)
        log.info(
            "copied %s: %s rows at %s in %.1f s; applying its changes since",
            table_id,
            copied.rows.get(table_id, 0),
            point,
            time.monotonic() - started,
            extra={"table": table_id, "rows": copied.rows.get(table_id, 0), "lsn": str(point)},
        )
        return point

    def _write(self, exported: Any, started_at: datetime, point: Lsn) -> SnapshotResult:
        """The copy into the table's Delta tables: created for a new table; for one copied
        anew, its mirror's files replaced in one commit, then its history and changelog
        landed from it (``pgcdc.lake.write.landing``)."""
        pipeline = self.pipeline
        table = self.table
        state = pipeline.state
        assert state is not None
        attempt = self.phase.attempt
        stops = pipeline.config.lake.on_table_failure == "stop"
        common: dict[str, Any] = {
            "started_at": started_at,
            "app_id": state.added_app_id,
            "version": attempt,
            "failed": f"the copy of {table.table_id} failed",
            "again": "the run stops" if stops else "the table is parked",
        }
        if not self.phase.again:
            return copy_in_snapshot(pipeline, exported, [table], **common)
        spark = pipeline.spark()
        layout = pipeline.layout
        mirror = str(table.path(layout, "mirror"))
        if TableLog(spark, mirror).transaction_version(state.added_app_id) == attempt:
            raise RuntimeError(f"{table.table_id}: attempt {attempt} of its copy landed already")
        meta = {"resync": attempt, "consistent_point": str(point)}
        try:
            copied = copy_in_snapshot(
                pipeline,
                exported,
                [table],
                kinds={table.table_id: ["mirror"]},
                replace=True,
                **common,
            )
        except PipelineError as exc:
            if not isinstance(exc.__cause__, Incompatible):
                raise
            log.info("%s: %s; its Delta tables are written anew", table.table_id, exc.__cause__)
            return self._write_anew(exported, started_at, point, common)
        version, _ = copied.files[(table.table_id, "mirror")]
        rows = spark.read.format("delta").option("versionAsOf", version).load(mirror)
        for kind in [k for k in table.kinds() if k != "mirror"]:
            path = str(table.path(layout, kind))
            pipeline.lease.check()
            land = land_history if kind == "history" else land_changelog
            land(
                spark,
                path,
                rows,
                point=point,
                started_at=started_at,
                app_id=state.added_app_id,
                version=attempt,
                metadata=meta,
            )
        return copied

    def _write_anew(
        self, exported: Any, started_at: datetime, point: Lsn, common: dict[str, Any]
    ) -> SnapshotResult:
        """A copy whose columns cannot take the Delta tables' schemas: copied into a Delta
        table of its own under ``_pgcdc/landing/``, then each Delta table overwritten from it
        with the new schema, one commit each."""
        from pgcdc.lake.store.delta import table_schema

        pipeline = self.pipeline
        table = self.table
        spark = pipeline.spark()
        state = pipeline.state
        assert state is not None
        layout = pipeline.layout
        location = layout.location
        staging = LakeLayout(
            LakeLocation(f"{location.root}/_pgcdc/landing/{self.phase.attempt}", location.s3)
        )
        remove_tables(staging, [table])
        copied = copy_in_snapshot(
            pipeline,
            exported,
            [table],
            kinds={table.table_id: ["mirror"]},
            layout=staging,
            **common,
        )
        rows = spark.read.format("delta").load(str(table.path(staging, "mirror")))
        meta = {"resync": self.phase.attempt, "consistent_point": str(point), "schema": "new"}
        kinds: tuple[TableKind, ...] = table.kinds()
        for kind in kinds:
            target = (
                table_schema(spark, str(table.path(staging, "mirror")))
                if kind == "mirror"
                else _kind_schema(rows, kind, multiset=table.multiset)
            )
            pipeline.lease.check()
            overwrite(
                spark,
                str(table.path(layout, kind)),
                copy_rows(rows, kind, target, point=point, started_at=started_at),
                app_id=state.added_app_id,
                version=self.phase.attempt,
                metadata=meta,
            )
        remove_tables(staging, [table])
        return _without_files(copied)

    # -- 3. catching up --------------------------------------------------------------------

    def _writer(self, point: Lsn) -> LakeBatchWriter:
        """The writer that applies what was kept aside: the stream's, for this table alone,
        with its changes from X on."""
        pipeline = self.pipeline
        state = pipeline.state
        assert state is not None
        table = self.table
        return LakeBatchWriter(
            lake=str(pipeline.layout.root),
            tables=(table,),
            table_columns=table_column_pairs([table]),
            app_id=state.stream_app_id,
            dsn=pipeline.dsn,
            maintenance=pipeline.config.lake.maintenance(),
            fence=pipeline.lease.check,
            indexed=pipeline.config.lake.write == "indexed",
            copied_at=((table.table_id, int(point)),),
            catch_up=True,
        )

    def _levels(self, spark: Any) -> list[int]:
        """The newest batch applied to each of the table's Delta tables since its copy
        (``from_batch - 1``: none), lowest first."""
        state = self.pipeline.state
        assert state is not None
        floor = self.entry.from_batch - 1
        levels = set()
        for kind in self.table.kinds():
            path = str(self.table.path(self.pipeline.layout, kind))
            done = TableLog(spark, path).transaction_version(state.stream_app_id)
            levels.add(floor if done is None or done < floor else done)
        return sorted(levels)

    def _apply(self, spark: Any, writer: LakeBatchWriter, after: int, through: int) -> None:
        """Apply what was kept aside from batch ``after`` (exclusive) to ``through``, tagged
        ``through``."""
        rows = held_rows(spark, self.entry, after, through)
        if rows is not None:
            result = writer.apply(rows, through)
            log.info(
                "%s: %s changes kept aside in batches %s to %s applied",
                self.table.table_id,
                result.changes,
                after + 1,
                through,
                extra={"table": self.table.table_id, "changes": result.changes},
            )

    def _catch_up(self, point: Lsn) -> None:
        pipeline = self.pipeline
        spark = pipeline.spark()
        writer = self._writer(point)
        held = held_tables(writer.app_id)
        # Delta tables a killed run left at different batches first
        levels = self._levels(spark)
        done = levels[0]
        for level in levels[1:]:
            self._apply(spark, writer, done, level)
            done = level
        for _ in range(MAX_ROUNDS):
            through = self.entry.last_batch
            if self.cancelled.is_set() or through - done < FINAL_ROUND_BATCHES:
                break
            self._apply(spark, writer, done, through)
            done = through
        if self.cancelled.is_set():
            return
        with held.lock:  # between two batches: none runs until the table is direct
            through = self.entry.last_batch
            if through > done:
                self._apply(spark, writer, done, through)
            self._kill_point("sync-caught-up")
            self._joined(point)
            self.entry.direct = True
        held_folder(pipeline.layout, self.table).remove_tree()
        log.info(
            "%s joined the stream: copied at %s, written by the stream from batch %s on",
            self.table.table_id,
            point,
            self.entry.last_batch + 1,
            extra={"table": self.table.table_id, "lsn": str(point)},
        )

    def _joined(self, point: Lsn) -> None:
        """Record the table as streamed since ``point``."""
        table_id = self.table.table_id

        def joined(state: PipelineState) -> PipelineState:
            phases = dict(state.phases)
            phases[table_id] = replace(
                phases[table_id], phase="streaming", since=now(), from_batch=None
            )
            return state.evolve(tables=tuple(sorted({*state.tables, table_id})), phases=phases)

        self.pipeline.state = update_state(self.pipeline.layout, joined)

    def _kill_point(self, point: str) -> None:
        """Tests: SIGKILL the run here when ``PGCDC_TEST_KILL_AT`` names ``point``
        (``batch.KILL_POINTS``)."""
        import os
        import signal

        kill = self.pipeline.kill_at
        if kill is None or kill.point != point:
            return
        log.warning("test kill point %s reached (%s): SIGKILL", point, self.table.table_id)
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def _kind_schema(mirror: Any, kind: TableKind, *, multiset: bool) -> Any:
    """The schema of a ``kind`` Delta table whose source columns are ``mirror``'s (a table
    without a key: the history keeps the mirror's ``__row_id``)."""
    from pyspark.sql import types as T

    from pgcdc.lake.store.tables import MIRROR_COLUMNS, ROW_ID
    from pgcdc.lake.write.snapshot import snapshot_struct

    fields = [f for f in mirror.schema.fields if f.name not in (*MIRROR_COLUMNS, ROW_ID)]
    struct = T.StructType(
        [
            T.StructField(
                "c",
                T.StructType(
                    [
                        T.StructField("new", T.StructType(fields)),
                        T.StructField("old", T.StructType(fields)),
                        T.StructField("old_kind", T.StringType()),
                        T.StructField("unchanged", T.ArrayType(T.StringType())),
                    ]
                ),
            ),
            T.StructField("_commit_lsn", T.LongType()),
            T.StructField("_commit_lsn_text", T.StringType()),
            T.StructField("_end_lsn", T.LongType()),
            T.StructField("_xid", T.LongType()),
            T.StructField("_commit_time", T.TimestampType()),
        ]
    )
    return snapshot_struct(struct, "c", kind, multiset=multiset)


def _without_files(copied: SnapshotResult) -> SnapshotResult:
    """``copied`` without its files: the Delta tables they went to are not the lake's (their
    key indexes are built from the tables instead)."""
    result = SnapshotResult()
    result.rows = dict(copied.rows)
    result.seconds = copied.seconds
    return result
