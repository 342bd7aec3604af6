"""``pgcdc run``: the pipeline from PostgreSQL to the lake, first start and every later one.

First start (no state under ``<lake>/_pgcdc``):

1. the configuration is checked against the source (``catalog.plan_source``), creating
   nothing;
2. the state is saved (generation 1, snapshot not done), the publication created (with its row
   filters) and the slot created with an exported snapshot;
3. the snapshot is copied in parallel (``snapshot.write_snapshot``), the exported snapshot
   released, and the state saved with ``snapshot_done``;
4. the stream starts at the slot's consistent point.

Later starts resume the stream from its checkpoint (``<lake>/_pgcdc/checkpoint-<generation>``):
batches Spark planned but did not commit are read again and skipped where the lake already has
them (Delta application transactions). A start that finds an unfinished snapshot drops the slot
and copies again (the next generation). The stream runs with ``foreachBatch``
(``batch.LakeBatchWriter``); when the source raises ``pgcdc.spark.SchemaChanged`` (a column
added or retyped), the query is defined again, which reads the new schema from the catalog, and
restarted on the same checkpoint.

``until_caught_up`` runs the stream with ``Trigger.AvailableNow``: everything committed before
the start is applied, then ``run`` returns.

While it runs (``monitor``): the metrics (``pgcdc.metrics.PipelineMetrics``, served over HTTP
when ``[metrics] port`` is set) count every batch's changes by table and operation and its
duration; a ``SlotMonitor`` checks the slot every ``[source] health_check_interval`` seconds
(lag, retained WAL with a warning past ``[source] retained_wal_warning``) and stops the
pipeline with a ``PipelineError`` naming the fix when the slot is invalidated or gone; a
``Heartbeat`` (``[source] heartbeat_interval``) writes a small WAL record in the source
database so the slot keeps advancing when nothing it publishes changes. A ``RunObserver``
passed to ``Pipeline`` hears about the snapshot's and the stream's progress.

A stream that fails on a micro-batch records it in the state (``state.last_failure``: the
batch planned in the checkpoint's offset log and not committed, its LSN range, the error's
class, when) before ``run`` raises, so that ``pgcdc status`` reports it (exit 1); a batch applied
later clears it, as does a run whose checkpoint committed that batch.

A lake whose slot ``pgcdc drop`` dropped (``state.dropped_at``) is never copied into again:
``run`` fails and says to move the lake away first.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from pgcdc.errors import PgcdcError
from pgcdc.lake.batch import PROGRESS, BatchResult, LakeBatchWriter, Progress, table_column_pairs
from pgcdc.lake.catalog import SourcePlan, ensure_publication, plan_source, source_columns
from pgcdc.lake.config import ConfigError, PipelineConfig
from pgcdc.lake.delta import delta_settings, is_delta_table, quiet_logs, table_schema
from pgcdc.lake.maintenance import worker_for
from pgcdc.lake.monitor import (
    BatchEvents,
    Observer,
    RunObserver,
    SlotMonitor,
    publication_gone_message,
    slot_gone_message,
    slot_lost_message,
)
from pgcdc.lake.schema_evolution import evolve
from pgcdc.lake.snapshot import remove_tables, write_snapshot
from pgcdc.lake.state import (
    BatchFailure,
    PipelineState,
    batch_offset,
    committed_batch,
    load_state,
    planned_batch,
    save_state,
)
from pgcdc.lake.tables import MIRROR_COLUMNS, LakeLayout
from pgcdc.lsn import Lsn
from pgcdc.metrics import PipelineMetrics
from pgcdc.replication import (
    Heartbeat,
    SlotHealth,
    create_slot_with_snapshot,
    drop_slot,
    missing_publications,
    scrub_secrets,
    slot_info,
)
from pgcdc.replication.database import connect_sql

__all__ = ["Pipeline", "PipelineError", "RunResult", "session_conf"]

log = logging.getLogger("pgcdc.lake")

#: A query restarted this often in a row for schema changes means something else is wrong.
MAX_SCHEMA_RESTARTS = 50
#: Initial copies started in one run when tables keep being rewritten under them.
MAX_COPY_ATTEMPTS = 3
#: adaptive query execution, off for local sessions unless [spark.conf] sets it
ADAPTIVE_KEY = "spark.sql.adaptive.enabled"
#: rows of a cached (persisted) micro-batch's column batches, unless [spark.conf] sets it
CACHE_BATCH_ROWS_KEY = "spark.sql.inMemoryColumnarStorage.batchSize"
CACHE_BATCH_ROWS = 1000
#: Java serialization streams forget the objects they wrote or read after this many, unless
#: [spark.conf] sets it
STREAM_RESET_KEY = "spark.serializer.objectStreamReset"
STREAM_RESET = 1
#: whether a sort's spill readers read ahead (two more 1 MiB buffers each), unless
#: [spark.conf] sets it
SPILL_READ_AHEAD_KEY = "spark.unsafe.sorter.spill.read.ahead.enabled"


def session_conf(config: PipelineConfig) -> dict[str, str]:
    """The Spark settings of the session a pipeline starts: ``[spark.conf]`` with Delta's
    connector added (``delta.delta_settings``), and defaults for what it leaves out
    (``[spark] driver_host``, the cached batch size, the serializer's reset interval and the
    sort spill readers' read-ahead below)."""
    conf = delta_settings(config.spark.conf)
    if config.spark.master.startswith("local"):
        # adaptive execution cannot coalesce a local session's few shuffle partitions, and
        # it runs each shuffle stage as a job of its own: a fixed cost per stage
        conf.setdefault(ADAPTIVE_KEY, "false")
    if config.spark.driver_host:
        conf.setdefault("spark.driver.host", config.spark.driver_host)
    # the persisted micro-batch is unrolled a column batch at a time before memory is
    # checked: smaller batches let a large transaction spill in time
    conf.setdefault(CACHE_BATCH_ROWS_KEY, str(CACHE_BATCH_ROWS))
    # Java serialization streams keep every object read until a reset: the cached column
    # batches are large, so reset after each
    conf.setdefault(STREAM_RESET_KEY, str(STREAM_RESET))
    # a spilled sort merges all its files at once, a reader each, outside Spark's memory
    # accounting: without read-ahead each reader holds a third of the buffers
    conf.setdefault(SPILL_READ_AHEAD_KEY, "false")
    return conf


class PipelineError(PgcdcError, RuntimeError):
    """The pipeline cannot start or continue; the message names the cause and the fix."""


@dataclass(slots=True)
class RunResult:
    snapshot_rows: dict[str, int] = field(default_factory=dict)
    snapshot_seconds: float = 0.0
    batches: int = 0
    changes: int = 0
    restarts: int = 0
    resumed: bool = False


def _server_identity(dsn: str) -> tuple[str, str]:
    with connect_sql(dsn) as conn:
        row = conn.execute(
            "SELECT system_identifier::text, current_database()::text FROM pg_control_system()"
        ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


class Pipeline:
    """One configured pipeline; ``run`` starts (or resumes) it."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        spark: Any | None = None,
        fail_after_commits: int | None = None,
        observer: Observer | None = None,
        metrics: PipelineMetrics | None = None,
        on_spark: Callable[[Any], None] | None = None,
    ) -> None:
        """``spark``: a session to use (default: one from ``[spark]``);
        ``fail_after_commits``: fault injection for tests (each batch fails after this many
        Delta commits; 0: before any, every run); ``observer``: told about progress (progress
        displays);
        ``metrics``: where to record (default: a new ``PipelineMetrics`` for the slot);
        ``on_spark``: called with the session once this pipeline started it (pyspark installs
        its own SIGINT handler then, which a command line may want to replace again)."""
        self.config = config
        self.observer: Observer = observer if observer is not None else RunObserver()
        self.metrics = metrics if metrics is not None else PipelineMetrics(config.source.slot)
        self.metrics_port: int | None = None  # the port /metrics is served on, while running
        self.monitor: SlotMonitor | None = None
        self.heartbeat: Heartbeat | None = None
        self._fatal: str | None = None
        self._fail_after = fail_after_commits
        self.layout = LakeLayout(config.lake.path)
        self._spark = spark
        self._on_spark = on_spark
        self._query: Any | None = None
        self._stop = threading.Event()
        self.state: PipelineState | None = None
        self._state_lock = threading.Lock()  # batches clear a failure from Spark's thread
        self._failed: tuple[int, str] | None = None  # (batch id, error class) seen in-process
        self.plan: SourcePlan | None = None
        self.restarts = 0  # queries restarted for schema changes

    # -- setup -----------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        return self.config.source.resolved_dsn()

    def spark(self) -> Any:
        if self._spark is None:
            from pgcdc.spark import spark_session

            conf = session_conf(self.config)
            try:
                self._spark = spark_session(
                    master=self.config.spark.master, app_name=self.config.spark.app_name, conf=conf
                )
            except Exception as exc:  # Py4J / Spark Connect errors of a session that won't start
                raise PipelineError(
                    f"Spark did not start ({scrub_secrets(_spark_reason(exc))}): check [spark] "
                    "master and [spark.conf] (and that Java 17 is installed)"
                ) from exc
            quiet_logs(self._spark)
            if self._on_spark is not None:
                self._on_spark(self._spark)
        return self._spark

    def check(self) -> SourcePlan:
        """Validate the configuration against the source and the lake; creates nothing."""
        dsn = self.dsn
        plan = plan_source(dsn, self.config)
        state = load_state(self.layout)
        system_id, database = _server_identity(dsn)
        if state is not None:
            problems: list[tuple[str, str]] = []
            if state.system_identifier != system_id or state.database != database:
                problems.append(
                    (
                        "source.dsn",
                        f"the lake {self.layout.root} mirrors database {state.database!r} of "
                        f"server {state.system_identifier}, not {database!r} of {system_id}: "
                        "point lake.path at a new folder for this source",
                    )
                )
            if state.slot != self.config.source.slot:
                problems.append(
                    (
                        "source.slot",
                        f"the lake's pipeline uses slot {state.slot!r}: keep that name, or "
                        "start a new lake",
                    )
                )
            if state.publication != self.config.source.publication:
                problems.append(
                    (
                        "source.publication",
                        f"the lake's pipeline uses publication {state.publication!r}: keep "
                        "that name, or start a new lake",
                    )
                )
            wanted = tuple(sorted(t.table_id for t in plan.tables))
            if state.snapshot_done and tuple(sorted(state.tables)) != wanted:
                added = sorted(set(wanted) - set(state.tables))
                removed = sorted(set(state.tables) - set(wanted))
                what = []
                if added:
                    what.append("adds " + ", ".join(added))
                if removed:
                    what.append("removes " + ", ".join(removed))
                problems.append(
                    (
                        "tables",
                        f"the configuration {' and '.join(what)} compared to the running "
                        "pipeline; changing the table set of a pipeline is not supported: "
                        "restore the table list, or mirror the new tables with a new pipeline "
                        "(another slot, publication and lake path)",
                    )
                )
            if problems:
                raise ConfigError(problems)
        self.state = state
        self.plan = plan
        return plan

    def drop_gone_columns(self) -> None:
        """Remove from the mirrors the columns their source tables no longer have.

        A dropped column stays in the running query's schema (its later values are NULL); this
        runs when a query starts and when an ``until_caught_up`` run ends. Histories and
        changelogs keep such columns (old rows keep their values).
        """
        plan = self.plan
        if plan is None:
            return
        spark = self.spark()
        for table in plan.tables:
            path = str(table.path(self.layout, "mirror"))
            if not is_delta_table(spark, path):
                continue
            schema = table_schema(spark, path)
            present = set(source_columns(self.dsn, table)) | set(MIRROR_COLUMNS)
            gone = [name for name in schema.names if name not in present]
            if gone:
                from pyspark.sql import types as T

                keep = T.StructType([f for f in schema.fields if f.name not in gone])
                evolve(spark, path, keep, drop_missing=True, what=f"{table.table_id} mirror")

    # -- run -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask a running ``run`` to stop once the current batch is done (thread-safe)."""
        self._stop.set()

    @property
    def progress(self) -> Progress | None:
        state = self.state
        return None if state is None else PROGRESS.get(state.stream_app_id)

    @property
    def query(self) -> Any | None:
        return self._query

    def run(
        self,
        *,
        until_caught_up: bool = False,
        on_started: Callable[[Pipeline], None] | None = None,
    ) -> RunResult:
        """Start or resume the pipeline; returns when caught up (or stopped)."""
        plan = self.check() if self.plan is None else self.plan
        self._fatal = None
        metrics = self.config.metrics
        if metrics.port:
            try:
                self.metrics_port = self.metrics.serve(metrics.port, addr=metrics.addr)
            except OSError as exc:
                raise ConfigError(
                    [
                        (
                            "metrics.port",
                            f"cannot serve metrics on {metrics.addr}:{metrics.port} "
                            f"({exc.strerror or exc}): choose a free port, or 0 for none",
                        )
                    ]
                ) from None
            log.info(
                "serving metrics at http://%s:%s/metrics",
                metrics.addr,
                self.metrics_port,
                extra={"port": self.metrics_port},
            )
        try:
            return self._run(plan, until_caught_up, on_started)
        except PipelineError:
            self.metrics.record_error("pipeline")
            raise
        finally:
            self.metrics.close()
            self.metrics_port = None
            self.observer.finished()

    def _run(
        self,
        plan: SourcePlan,
        until_caught_up: bool,
        on_started: Callable[[Pipeline], None] | None,
    ) -> RunResult:
        result = RunResult()
        state = self.state
        dsn = self.dsn
        if state is not None and state.dropped_at is not None:
            raise PipelineError(
                f"the pipeline's slot {state.slot!r} was dropped by pgcdc drop at "
                f"{state.dropped_at}, so the changes since then cannot be streamed; the lake "
                f"{self.layout.root} is kept as it was. To start over, move the lake away (or "
                "delete it) and run again to copy everything again"
            )
        slot = slot_info(dsn, self.config.source.slot)
        if state is None and slot is not None:
            raise ConfigError(
                [
                    (
                        "source.slot",
                        f"slot {slot.name!r} exists but the lake {self.layout.root} has no "
                        "pipeline state: another pipeline uses the slot, or this lake was "
                        "lost; choose another slot name, or drop the slot "
                        f"(SELECT pg_drop_replication_slot('{slot.name}')) to copy everything "
                        "again",
                    )
                ]
            )
        if state is not None and state.snapshot_done:
            if slot is None:
                raise PipelineError(
                    slot_gone_message(
                        self.config.source.slot, self.layout.root, state.consistent_point
                    )
                )
            if slot.lost:
                raise PipelineError(
                    slot_lost_message(
                        slot.name,
                        self.layout.root,
                        wal_status=slot.wal_status,
                        reason=slot.invalidation_reason,
                        confirmed=slot.confirmed_flush_lsn,
                    )
                )
            if missing_publications(dsn, [self.config.source.publication]):
                raise PipelineError(
                    publication_gone_message(self.config.source.publication, self.layout.root)
                )
            result.resumed = True
            log.info(
                "resuming pipeline %s (generation %s) at slot %s, confirmed up to %s",
                state.pipeline_id,
                state.generation,
                slot.name,
                slot.confirmed_flush_lsn,
                extra={
                    "pipeline_id": state.pipeline_id,
                    "generation": state.generation,
                    "slot": slot.name,
                    "lsn": None
                    if slot.confirmed_flush_lsn is None
                    else str(slot.confirmed_flush_lsn),
                },
            )
        else:
            state = self._copy(plan, state, slot is not None, result)
        self.state = state
        progress = PROGRESS.setdefault(state.stream_app_id, Progress())
        batches, changes = progress.batches, progress.changes
        events = BatchEvents(self.metrics, self.observer)
        progress.subscribe(events)
        failures = _FailureWatch(self)
        progress.subscribe(failures)
        source = self.config.source
        if source.heartbeat_interval > 0:
            schema, table = source.heartbeat_schema_table
            self.heartbeat = Heartbeat(
                dsn,
                interval=source.heartbeat_interval,
                mode=source.heartbeat,
                schema=schema,
                table=table,
            )
        monitor = self.monitor = SlotMonitor(
            dsn,
            source.slot,
            self.layout.root,
            metrics=self.metrics,
            observer=self.observer,
            interval=source.health_check_interval,
            warn_bytes=source.retained_wal_warning,
            on_fatal=self._set_fatal,
            heartbeat=self.heartbeat,
            publication=source.publication,
        )
        try:
            health = monitor.check()
            self._raise_fatal()
            if self.heartbeat is not None:
                self.heartbeat.start()
            monitor.start()
            self._stream(plan, state, until_caught_up, result, on_started, health=health)
            self._raise_fatal()
        finally:
            worker = worker_for(state.stream_app_id)
            if worker is not None:  # a step in flight is cancelled; the table stays as it was
                worker.stop()
            monitor.stop()
            if self.heartbeat is not None:
                self.heartbeat.stop()
                self.heartbeat = None
            progress.unsubscribe(events)
            progress.unsubscribe(failures)
        result.batches = progress.batches - batches
        result.changes = progress.changes - changes
        return result

    def _set_fatal(self, message: str) -> None:
        self._fatal = message

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise PipelineError(self._fatal)

    def _copy(
        self,
        plan: SourcePlan,
        previous: PipelineState | None,
        slot_exists: bool,
        result: RunResult,
    ) -> PipelineState:
        """The initial copy; copied again (a new snapshot, a new plan) when a table changed its
        columns while it ran, at most ``MAX_COPY_ATTEMPTS`` times."""
        from pgcdc.spark.errors import CopyAgain, raised_as

        attempt = 1
        while True:
            try:
                return self._snapshot(plan, previous, slot_exists, result)
            except PipelineError as exc:
                raised = raised_as(exc)
                if (
                    attempt >= MAX_COPY_ATTEMPTS
                    or raised is None
                    or not issubclass(raised, CopyAgain)
                ):
                    raise
                attempt += 1
                log.warning(
                    "a table changed its columns during the initial copy: copying again with a "
                    "new snapshot (attempt %s of %s)",
                    attempt,
                    MAX_COPY_ATTEMPTS,
                    extra={"attempt": attempt},
                )
                plan = self.plan = plan_source(self.dsn, self.config)  # the new columns
                previous = load_state(self.layout)
                slot_exists = slot_info(self.dsn, self.config.source.slot) is not None

    def _snapshot(
        self,
        plan: SourcePlan,
        previous: PipelineState | None,
        slot_exists: bool,
        result: RunResult,
    ) -> PipelineState:
        dsn = self.dsn
        source = self.config.source
        tables = tuple(sorted(t.table_id for t in plan.tables))
        spark = self.spark()  # a Spark that cannot start fails before anything is created
        if previous is None:
            system_id, database = _server_identity(dsn)
            state = PipelineState.new(
                system_identifier=system_id,
                database=database,
                slot=source.slot,
                publication=source.publication,
                tables=tables,
            )
        else:
            log.warning(
                "the initial snapshot of generation %s did not finish: copying again",
                previous.generation,
            )
            if slot_exists:
                drop_slot(dsn, source.slot, terminate_active=True)
            remove_tables(self.layout, plan.tables)
            state = previous.evolve(
                generation=previous.generation + 1,
                tables=tables,
                consistent_point=None,
                snapshot_done=False,
                snapshot_rows={},
                last_failure=None,
            )
        save_state(self.layout, state)
        if ensure_publication(dsn, self.config, plan):
            state = state.evolve(publication_created=True)
            save_state(self.layout, state)
            log.info(
                "created publication %s",
                source.publication,
                extra={"publication": source.publication},
            )
        started = time.monotonic()
        from pgcdc.spark import snapshot_options, snapshot_reader

        with create_slot_with_snapshot(
            dsn, source.slot, connect_timeout=source.connect_timeout
        ) as exported:
            started_at = datetime.now(UTC)
            state = state.evolve(
                consistent_point=str(exported.consistent_point),
                snapshot_started_at=started_at.isoformat(),
            )
            save_state(self.layout, state)
            log.info(
                "copying %s tables at %s (snapshot %s)",
                len(plan.tables),
                exported.consistent_point,
                exported.snapshot_name,
                extra={
                    "tables": len(plan.tables),
                    "lsn": str(exported.consistent_point),
                    "slot": source.slot,
                    "generation": state.generation,
                },
            )
            self.observer.snapshot_started(len(plan.tables), Lsn(exported.consistent_point))
            options: dict[str, Any] = {}
            partitions = self.config.stream.snapshot_partitions_per_table
            if partitions is not None:
                options["partitionsPerTable"] = partitions
            try:
                reader = snapshot_reader(
                    snapshot_options(
                        dsn, exported=exported, publications=[source.publication], **options
                    )
                )
                snapshot = write_snapshot(
                    spark,
                    reader,
                    self.layout,
                    plan.tables,
                    dict(table_column_pairs(plan.tables)),
                    consistent_point=Lsn(exported.consistent_point),
                    started_at=started_at,
                    app_id=state.snapshot_app_id,
                    generation=state.generation,
                    on_progress=self.observer.snapshot_progress,
                )
            except Exception as exc:
                raise PipelineError(
                    f"the initial copy failed: {scrub_secrets(_first_line(exc))}; the next "
                    "start copies everything again"
                ) from exc
        state = state.evolve(snapshot_done=True, snapshot_rows=dict(snapshot.rows))
        save_state(self.layout, state)
        result.snapshot_rows = dict(snapshot.rows)
        result.snapshot_seconds = time.monotonic() - started
        log.info(
            "snapshot done: %s rows of %s tables in %.1f s",
            sum(snapshot.rows.values()),
            len(snapshot.rows),
            result.snapshot_seconds,
            extra={
                "rows": sum(snapshot.rows.values()),
                "tables": len(snapshot.rows),
                "seconds": round(result.snapshot_seconds, 3),
                "lsn": state.consistent_point,
            },
        )
        self.observer.snapshot_finished(sum(snapshot.rows.values()), result.snapshot_seconds)
        return state

    def _stream(
        self,
        plan: SourcePlan,
        state: PipelineState,
        until_caught_up: bool,
        result: RunResult,
        on_started: Callable[[Pipeline], None] | None,
        *,
        health: SlotHealth | None = None,
    ) -> None:
        from pgcdc.spark import is_schema_changed, read_stream

        source = self.config.source
        stream = self.config.stream
        checkpoint = state.checkpoint(self.layout)
        writer = LakeBatchWriter(
            lake=str(self.layout.root),
            tables=plan.tables,
            table_columns=table_column_pairs(plan.tables),
            app_id=state.stream_app_id,
            dsn=self.dsn,
            fail_after=self._fail_after,
            maintenance=self.config.lake.maintenance(),
        )
        self.drop_gone_columns()
        options: dict[str, Any] = {}
        if stream.max_changes_per_trigger is not None:
            options["maxChangesPerTrigger"] = stream.max_changes_per_trigger
        if stream.max_bytes_per_trigger is not None:
            options["maxBytesPerTrigger"] = stream.max_bytes_per_trigger
        # created on stop: the source then plans no more batches, so that the query stops
        # between two even when batches follow each other at once (a busy source)
        pause = self.layout.state_dir / f"pause-{uuid.uuid4().hex}"
        options["pauseFile"] = str(pause)
        restarts = 0
        while not self._stop.is_set():
            spark = self.spark()
            df = read_stream(spark, self.dsn, source.slot, [source.publication], **options)
            query_writer = df.writeStream.foreachBatch(writer).option(
                "checkpointLocation", str(checkpoint)
            )
            if until_caught_up:
                query_writer = query_writer.trigger(availableNow=True)
            else:
                query_writer = query_writer.trigger(
                    processingTime=f"{stream.trigger_interval:g} seconds"
                )
            query = query_writer.queryName(f"pgcdc_{source.slot}").start()
            self._query = query
            start = None if health is None else health.confirmed_flush_lsn
            target = None if health is None else health.server_lsn
            log.info(
                "stream started (query %s, checkpoint %s, %s) at %s",
                query.id,
                checkpoint,
                "until caught up" if until_caught_up else "continuous",
                start if start is not None else "the checkpoint",
                extra={
                    "slot": source.slot,
                    "lsn": None if start is None else str(start),
                    "server_lsn": None if target is None else str(target),
                    "mode": "until caught up" if until_caught_up else "continuous",
                },
            )
            if restarts == 0:
                self.observer.stream_started(start, target, until_caught_up)
            if on_started is not None and restarts == 0:
                on_started(self)
            error: BaseException | None
            try:
                while not query.awaitTermination(1):
                    if self._fatal is not None:
                        query.stop()
                        break
                    if self._stop.is_set():
                        pause.touch()
                        try:
                            _stop_between_batches(query)
                        finally:
                            pause.unlink(missing_ok=True)
                        break
                if self._fatal is not None:
                    return
                error = query.exception()
            except Exception as exc:  # awaitTermination raises the query's failure
                error = exc
            finally:
                self._query = None
            if error is None:
                self._clear_failure(None)  # if the checkpoint committed the failed batch since
                if until_caught_up:
                    self._drain_maintenance(state.stream_app_id)
                    self.drop_gone_columns()
                return
            if self._fatal is not None:
                return
            if is_schema_changed(error) and restarts < MAX_SCHEMA_RESTARTS:
                restarts += 1
                result.restarts = restarts
                self.restarts += 1
                log.info(
                    "schema change in the source: restarting the query (%s)",
                    restarts,
                    extra={"restarts": restarts},
                )
                continue
            self.metrics.record_error("stream")
            lost = self._slot_lost()
            if lost is not None:
                # the slot went (pgcdc drop --force, pg_drop_replication_slot) or was
                # invalidated under the stream: the pipeline's fix, not the source's
                raise PipelineError(lost) from error
            self._record_failure(error)
            raise PipelineError(
                f"the stream failed: {scrub_secrets(_first_line(error))}{_spark_hint(error)}"
            ) from error

    def _drain_maintenance(self, app_id: str) -> None:
        """Wait for the maintenance the run's batches left due (a run that ends when caught up
        leaves its tables maintained), unless the pipeline is asked to stop meanwhile."""
        worker = worker_for(app_id)
        if worker is None:
            return
        while not self._stop.is_set() and self._fatal is None:
            if worker.drain(timeout=1.0):
                return

    # -- the failed batch in the state (pgcdc status) ------------------------------------------

    def _update_state(self, change: Callable[[PipelineState], PipelineState | None]) -> None:
        """Apply ``change`` to the state as saved (``pgcdc drop`` may have written it since)
        and save it atomically; ``change`` returns None to leave it as it is."""
        with self._state_lock:
            current = load_state(self.layout) or self.state
            if current is None:
                return
            new = change(current)
            if new is None:
                return
            save_state(self.layout, new)
            self.state = new

    def _record_failure(self, error: BaseException) -> None:
        """Record the micro-batch the stream failed on (planned in the checkpoint's offset
        log, not committed) in the state, before ``run`` raises: ``pgcdc status`` reports it
        until a batch is applied. A stream that failed planning a batch records nothing."""
        state = self.state
        if state is None:
            return
        checkpoint = state.checkpoint(self.layout)
        batch = planned_batch(checkpoint)
        committed = committed_batch(checkpoint)
        if batch is None or (committed is not None and committed >= batch):
            return
        seen = self._failed
        error_class = seen[1] if seen is not None and seen[0] == batch else _error_class(error)
        start = state.consistent_point if batch == 0 else batch_offset(checkpoint, batch - 1)
        end = batch_offset(checkpoint, batch)
        now = datetime.now(UTC).isoformat(timespec="seconds")

        def record(current: PipelineState) -> PipelineState:
            before = current.last_failure
            again = before is not None and before.batch == batch
            failure = BatchFailure(
                batch=batch,
                start_lsn=start,
                end_lsn=end,
                error=error_class,
                at=now,
                first_at=before.first_at if again and before is not None else now,
                attempts=before.attempts + 1 if again and before is not None else 1,
            )
            return current.evolve(last_failure=failure)

        try:
            self._update_state(record)
        except Exception as exc:  # the run fails with the stream's error all the same
            log.warning(
                "could not record the failed batch %s in the pipeline state: %s",
                batch,
                scrub_secrets(f"{type(exc).__name__}: {exc}"),
            )
            return
        log.warning(
            "batch %s (LSN %s to %s) failed with %s: recorded in the pipeline state, "
            "pgcdc status reports it until a batch is applied",
            batch,
            start or "-",
            end or "-",
            error_class,
            extra={"batch": batch, "min_lsn": start, "max_lsn": end, "error": error_class},
        )

    def _clear_failure(self, applied: int | None) -> None:
        """Forget the recorded failure: batch ``applied`` is in the lake (a later batch, or
        the failed one applied this time), or (None) when the checkpoint committed it."""
        state = self.state
        if state is None or state.last_failure is None:
            return

        def clear(current: PipelineState) -> PipelineState | None:
            failure = current.last_failure
            if failure is None:
                return None
            if applied is None and current.failure_standing(self.layout) is not None:
                return None
            if applied is not None and applied < failure.batch:
                return None
            log.info(
                "batch %s is applied: the failure of batch %s is cleared",
                failure.batch if applied is None else applied,
                failure.batch,
                extra={"batch": failure.batch},
            )
            return current.evolve(last_failure=None)

        try:
            self._update_state(clear)
        except Exception as exc:  # status then reports a failure that was repaired: harmless
            log.warning(
                "could not clear the failed batch in the pipeline state: %s",
                scrub_secrets(f"{type(exc).__name__}: {exc}"),
            )

    def _slot_lost(self) -> str | None:
        """After a failed stream: the slot monitor's message when the slot is gone or
        invalidated (or the publication dropped), checked now, else None."""
        monitor = self.monitor
        if monitor is not None and self._fatal is None:
            try:
                monitor.check()
            except Exception as exc:  # the source unreachable: the stream's error stands
                log.debug("slot check after the stream failed: %s", scrub_secrets(str(exc)))
        return self._fatal


class _FailureWatch:
    """A ``BatchListener`` keeping the failed-batch record of the state: a batch applied clears
    it, a batch failing in this process tells its error's class (a Spark failure's text names
    the Java or Python exception; the exception in the batch is exact)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def batch_done(self, result: BatchResult) -> None:
        self.pipeline._failed = None
        self.pipeline._clear_failure(result.batch_id)

    def batch_failed(self, batch_id: int, error: BaseException) -> None:
        self.pipeline._failed = (batch_id, _error_class(error))


def _error_class(error: BaseException) -> str:
    """The class of the exception that failed: the last one a Spark or Py4J error's text
    names (``java.lang.OutOfMemoryError``, ``RuntimeError``), else the error's own."""
    for line in reversed(str(error).splitlines()):
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            return match.group(1)[:200]
    return type(error).__name__


_OUT_OF_MEMORY = ("OutOfMemoryError", "Java heap space", "GC overhead limit exceeded")
_JVM_GONE = ("Answer from Java side is empty", "Error while receiving", "Connection refused")


def _spark_reason(error: BaseException) -> str:
    """Spark's own message in a Py4J error (the line after the Java exception's class)."""
    for raw in str(error).splitlines():
        line = raw.strip()
        if line.startswith(": "):
            return line[2:][:500]
    return _first_line(error)


def _spark_hint(error: BaseException) -> str:
    """The fix for failures of Spark itself: its driver ran out of memory, or its JVM is gone
    (``spark_session`` makes the JVM exit on OutOfMemoryError rather than hang)."""
    text = f"{type(error).__name__}: {error}"
    if any(marker in text for marker in _OUT_OF_MEMORY + _JVM_GONE):
        return (
            "; Spark's driver ran out of memory or stopped (a micro-batch holds whole source "
            "transactions, so a very large transaction needs a driver heap to match). Nothing "
            "of the failed batch was confirmed to PostgreSQL. Fix: give the driver more memory, "
            'e.g. [spark.conf] "spark.driver.memory" = "4g", and run again'
        )
    return ""


def _stop_between_batches(query: Any, timeout: float = 300.0) -> None:
    """Stop a query when no batch is running (stopping mid-batch interrupts its commits); its
    source's pause file exists, so no trigger plans a new batch meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            active = bool(query.status.get("isTriggerActive"))
        except Exception:  # pragma: no cover - a query that already ended
            break
        if not active:
            break
        time.sleep(0.05)
    query.stop()


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Changed|Exit)): .+")


def _first_line(error: BaseException) -> str:
    """What failed, in one line: the Python exception a Spark error wraps, if any."""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if raised:
        return raised[-1][:2000]
    return lines[0][:2000] if lines else type(error).__name__


def source_connection(config: PipelineConfig) -> psycopg.Connection[Any]:
    """An autocommit connection to the configured source (for checks and verification)."""
    return connect_sql(config.source.resolved_dsn())
