"""``pgcdc run``: the pipeline from PostgreSQL to the lake, first start and every later one.

A run is three steps: where it starts (``bootstrap``: the lake's state against the
configuration and the source, resume or copy), the initial copy (``initial_copy``) and the
stream (``stream_runner``); ``failures`` keeps what a failed run says and records.

First start (no state under ``<lake>/_pgcdc``):

1. the configuration is checked against the source (``catalog.plan_source``), creating
   nothing;
2. the state is saved (generation 1, snapshot not done), the publication created (with its row
   filters) and the slot created with an exported snapshot;
3. the snapshot is copied in parallel (``snapshot.write_snapshot``), the exported snapshot
   released, and the state saved with ``snapshot_done``;
4. the stream starts at the slot's consistent point.

Later starts first follow the configuration's table set (``table_set``): tables added since
are copied in a temporary slot's snapshot and join the stream from that snapshot's LSN on,
tables removed leave the publication (their lake tables are kept). Then they resume the
stream from its checkpoint (``<lake>/_pgcdc/checkpoint-<generation>``):
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
batch planned in the checkpoint's offset log and not committed, or the next one if planning it
failed, its LSN range, the error's class, when, and the cause and fix of a failure pgcdc
recognises, ``failures.diagnose``) before ``run`` raises, so that ``pgcdc status`` reports it
(exit 1); a batch applied later clears it, as does a run whose checkpoint committed that batch.
When the state cannot be written, the failure is kept outside the lake, where ``status`` reads
it too (``state.save_failure_note``).

With ``[catalog]``, a ``metastore.Registrar`` registers the lake's tables in the session's
catalog when the run starts (those the lake has) and as each is created (the copy's, and any
the stream creates), until the run ends.

A lake whose slot ``pgcdc drop`` dropped (``state.dropped_at``) is never copied into again:
``run`` fails and says to move the lake away first.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pgcdc.lake.config import ConfigError, PipelineConfig
from pgcdc.lake.diagnosis import spark_reason
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.bootstrap import (
    config_problems,
    server_identity,
    start_point,
    unpublished_tables,
)
from pgcdc.lake.run.catalog import SourcePlan, plan_source
from pgcdc.lake.run.initial_copy import InitialCopy
from pgcdc.lake.run.monitor import Observer, RunObserver, SlotMonitor
from pgcdc.lake.run.shape import recorded_shape, renamed_columns, shape_problem
from pgcdc.lake.run.stream_runner import StreamRunner
from pgcdc.lake.run.table_set import TableChanges, TableSet, changes_of
from pgcdc.lake.run.table_sync import TableSyncs
from pgcdc.lake.store.delta import (
    delta_settings,
    is_delta_table,
    local_file_system,
    quiet_logs,
    quote_name,
    s3_jars_missing,
    table_schema,
)
from pgcdc.lake.store.deltalog import TableLog
from pgcdc.lake.store.metastore import (
    Registrar,
    catalog_conf,
    name_problems,
    registrations,
    uses_session_catalog,
)
from pgcdc.lake.store.state import (
    PipelineState,
    TablePhase,
    load_state,
    resync_requests,
    run_lock,
    update_state,
)
from pgcdc.lake.store.storage import Lease
from pgcdc.lake.store.tables import MIRROR_COLUMNS, LakeLayout, LakeTable
from pgcdc.lake.store.tables import OLD as CHANGELOG_OLD
from pgcdc.lake.write.batch import (
    KILL_ENV,
    KILL_POINTS,
    PROGRESS,
    SYNC_KILL_POINTS,
    KillAt,
    Progress,
)
from pgcdc.lake.write.held import held_tables
from pgcdc.lake.write.schema_evolution import evolve
from pgcdc.metrics import PipelineMetrics
from pgcdc.replication import Heartbeat, scrub_secrets, slot_info, source_catalog
from pgcdc.replication.database import connect_sql
from pgcdc.replication.source_catalog import TableShape

__all__ = ["Pipeline", "RunResult", "session_conf"]

log = logging.getLogger("pgcdc.lake")

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
#: how the jobs of the stream and of tables copied beside it share the executors, unless
#: [spark.conf] sets it
SCHEDULER_MODE_KEY = "spark.scheduler.mode"


def session_conf(config: PipelineConfig) -> dict[str, str]:
    """The Spark settings of the session a pipeline starts: ``[spark.conf]`` with Delta's
    connector added (``delta.delta_settings``), the S3A file system's settings of an s3://
    lake (``[lake.s3]``), Hive support and the embedded metastore of a ``[catalog]`` that
    ``[spark.conf]`` names no catalog for (``metastore.catalog_conf``), and defaults for what
    it leaves out
    (``[spark] driver_host``, the cached batch size, the serializer's reset interval, the
    sort spill readers' read-ahead and fair scheduling below)."""
    location = config.lake.location()
    conf = delta_settings(config.spark.conf, s3=location.is_s3)
    for key, value in location.spark_settings().items():
        conf.setdefault(key, value)
    if config.catalog is not None:
        catalog_conf(conf, LakeLayout(location))
    if config.spark.master.startswith("local"):
        local_file_system(conf)
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
    # a table copied beside the stream runs its jobs in a pool of their own: the stream's
    # batches get their share of the cores instead of waiting for the copy's tasks (FIFO)
    conf.setdefault(SCHEDULER_MODE_KEY, "FAIR")
    return conf


@dataclass(slots=True)
class RunResult:
    snapshot_rows: dict[str, int] = field(default_factory=dict)
    snapshot_seconds: float = 0.0
    batches: int = 0
    changes: int = 0
    restarts: int = 0
    resumed: bool = False
    #: rows copied of each table added to the pipeline by this run
    added_rows: dict[str, int] = field(default_factory=dict)
    #: the tables this run stopped mirroring (removed from the configuration)
    removed: tuple[str, ...] = ()


def kill_point() -> KillAt | None:
    """The tests' kill point from ``$PGCDC_TEST_KILL_AT`` (``pgcdc.lake.write.batch.KILL_ENV``),
    None when it is not set; a value that names no kill point is an error, not a run without
    the kill."""
    text = os.environ.get(KILL_ENV) or None
    if text is None:
        return None
    point, at, batch = text.partition("@")
    if point not in (*KILL_POINTS, *SYNC_KILL_POINTS) or (at and not batch.isdigit()):
        raise ConfigError(
            [
                (
                    f"${KILL_ENV}",
                    f"{text!r} is no kill point of the tests: unset it (it is for pgcdc's "
                    f"tests only), or name one of {', '.join((*KILL_POINTS, *SYNC_KILL_POINTS))}, "
                    "with @N to kill "
                    "in batch N or later",
                )
            ]
        )
    return KillAt(point, int(batch) if at else 0)


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
        #: why the run must end (the slot monitor's finding), once it must
        self.fatal: str | None = None
        self.fail_after = fail_after_commits
        #: tests: the point of the indexed write where the run SIGKILLs itself (``KILL_ENV``)
        self.kill_at = kill_point()
        self.layout = LakeLayout(config.lake.location())
        self._spark = spark
        self._on_spark = on_spark
        #: the streaming query, while one runs
        self.query: Any | None = None
        #: set by ``stop``
        self.stopping = threading.Event()
        self._state: PipelineState | None = None
        self.plan: SourcePlan | None = None
        #: how the configured tables differ from the lake's (``check``)
        self.changes = TableChanges()
        self.restarts = 0  # queries restarted for schema changes
        #: the lake held by this run (checked before each write; a no-op outside a run)
        self.lease = Lease()
        #: registers the lake's tables in the catalog while a run runs (``[catalog]``)
        self.registrar: Registrar | None = None
        #: the copies of tables joining the stream while it runs
        self.syncs = TableSyncs(self)

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
                    f"Spark did not start ({scrub_secrets(spark_reason(exc))}): check [spark] "
                    "master and [spark.conf] (and that Java 17 is installed)"
                ) from exc
            quiet_logs(self._spark)
            if self._on_spark is not None:
                self._on_spark(self._spark)
        return self._spark

    def check(self) -> SourcePlan:
        """Validate the configuration against the source and the lake; creates nothing."""
        if self.layout.location.is_s3 and self._spark is None:
            missing = s3_jars_missing()
            if missing is not None:
                raise PipelineError(missing)
        state = load_state(self.layout)
        plan = self.replan(state)
        catalog = self.config.catalog
        if catalog is not None:
            names = registrations(catalog, self.layout, plan.tables)
            session = uses_session_catalog(self.config.spark.conf)
            problems = name_problems(names, session_catalog=session)
            if problems:
                raise ConfigError(problems)
        if state is not None:
            problems = config_problems(state, self.config, plan, server_identity(self.dsn))
            if problems:
                raise ConfigError(problems)
        self.state = state
        self.plan = plan
        self.changes = (
            TableChanges()
            if state is None
            else changes_of(self.config, state, plan, resync_requests(self.layout))
        )
        return plan

    def replan(self, state: PipelineState | None = None) -> SourcePlan:
        """The configuration planned against the source now (``catalog.plan_source``); tables
        added or removed since are planned as changes to the publication when pgcdc created it
        (the lake's state, ``state`` or the one saved, says so)."""
        if state is None:
            state = load_state(self.layout)
        managed = state is not None and state.publication_created
        return plan_source(self.dsn, self.config, managed=managed)

    def drop_gone_columns(self, *, every: bool = False) -> None:
        """Remove from the mirrors the columns their source tables no longer have.

        A dropped column stays in the running query's schema (its later values are NULL); this
        runs when a query starts, for the tables whose columns changed since the last start
        (a mirror's schema is read from its log, about 0.15 s a table: 15 s at every start for
        a hundred tables), and for every table when an ``until_caught_up`` run ends
        (``every``): a column added and dropped again before a start, whose rows that start's
        stream still applied, came back into the mirror after that start's check (a continuous
        run stopped keeps such a column until its table's columns change again). Histories and
        changelogs keep such columns (old rows keep their values).
        """
        plan = self.plan
        if plan is None:
            return
        state = load_state(self.layout) or self.state
        recorded = {} if state is None else {t: set(s["columns"]) for t, s in state.shapes.items()}
        # first: a renamed column must not be dropped as a gone one
        shapes = self.check_shapes()
        if not shapes:
            return
        spark = self.spark()
        tables = [
            t
            for t in plan.tables
            if t.table_id in shapes
            and (every or recorded.get(t.table_id) != set(shapes[t.table_id].columns))
        ]

        for table in tables:
            path = str(table.path(self.layout, "mirror"))
            present = set(shapes[table.table_id].columns) | set(MIRROR_COLUMNS)
            names = TableLog(spark, path).column_names() or []
            gone = [name for name in names if name not in present]
            if gone:
                from pyspark.sql import types as T

                schema = table_schema(spark, path)
                keep = T.StructType([f for f in schema.fields if f.name not in gone])
                evolve(spark, path, keep, drop_missing=True, what=f"{table.table_id} mirror")

    def check_shapes(self, *, replan: bool = False) -> dict[str, TableShape]:
        """Stop before a query starts when a table changed in a way the lake cannot follow
        (``pgcdc.lake.run.shape``); then record the tables' shapes, and return them by table id
        (empty before the lake has a state). ``replan``: read the tables' keys again (a
        restart for a schema change: the run's plan predates it), and keep them as ``plan``."""
        plan = self.plan
        unplanned: ConfigError | None = None
        if replan:
            try:
                plan = self.replan()
            except ConfigError as exc:  # e.g. a table renamed away, or its key gone
                unplanned = exc
            else:
                self.plan = plan
        state = load_state(self.layout) or self.state
        if plan is None or state is None:
            return {}
        # the tables the lake mirrors: one added since the run started joins at the next
        mirrored = [t for t in plan.tables if t.table_id in state.tables]
        with connect_sql(self.dsn) as conn:
            now = {t.table_id: source_catalog.table_shape(conn, t.schema, t.name) for t in mirrored}
        problems: dict[str, str] = {}
        renames: dict[str, dict[str, str]] = {}
        for table in mirrored:
            before = state.shapes.get(table.table_id)
            if before is None and table.table_id in state.columns:  # a state from before shapes
                numbers = state.columns[table.table_id]
                before = {"columns": {name: [number] for name, number in numbers.items()}}
            problem = None if before is None else shape_problem(table, before, now[table.table_id])
            if problem is not None:
                problems[table.table_id] = problem
            elif before is not None:
                renamed = renamed_columns(table, before, now[table.table_id])
                if renamed:
                    renames[table.table_id] = renamed
        if unplanned is not None and not problems:
            raise PipelineError(
                f"the source changed while the query ran, and the pipeline's tables no longer "
                f"plan: {unplanned}. Nothing after the change was written"
            )
        if problems and self.config.lake.on_table_failure == "stop":
            raise PipelineError(
                f"{'; '.join(problems.values())}: the lake cannot follow that, its rows no "
                "longer match what the stream changes. Nothing after it was written. Fix: "
                f"pgcdc resync --config pipeline.toml {' '.join(problems)} (copies it anew; "
                "the other tables are not touched)"
            )
        if problems:
            state = self.park(
                {
                    t: f"{problem}: the lake cannot follow that. Fix: pgcdc resync --config "
                    f"pipeline.toml {t} (copies it anew while the others stream on)"
                    for t, problem in problems.items()
                },
            )
            mirrored = [t for t in mirrored if t.table_id not in problems]
        found = {
            table_id: shape
            for table_id, shape in now.items()
            if shape is not None and table_id not in problems
        }
        for table in mirrored:
            if table.table_id in renames:
                self._rename_columns(table, renames[table.table_id])
        shapes = {
            t.table_id: recorded_shape(
                t,
                found[t.table_id],
                renamed=[
                    *state.shapes.get(t.table_id, {}).get("renamed", []),
                    *renames.get(t.table_id, {}).items(),
                ],
            )
            for t in mirrored
            if t.table_id in found
        }
        if shapes != {t: state.shapes.get(t) for t in shapes}:
            self.state = update_state(
                self.layout, lambda now: now.evolve(shapes={**now.shapes, **shapes})
            )
        return found

    def _rename_columns(self, table: LakeTable, renames: Mapping[str, str]) -> None:
        """Follow columns renamed in the source in ``table``'s Delta tables: Delta's column
        mapping renames a column in the table's metadata, rewriting no file (the changelog's
        old image too). Each rename is skipped where it was made already (a run killed
        between two tables' renames, before the state recorded them)."""
        spark = self.spark()
        for kind in table.kinds():
            path = str(table.path(self.layout, kind))
            if not is_delta_table(spark, path):
                continue
            schema = table_schema(spark, path)
            fields = {f.name: f for f in schema.fields}
            targets = [""]
            old = fields.get(CHANGELOG_OLD)
            if old is not None and hasattr(old.dataType, "fieldNames"):
                targets.append(CHANGELOG_OLD)
            for parent in targets:
                names = set(fields) if not parent else set(fields[parent].dataType.fieldNames())
                prefix = f"{quote_name(parent)}." if parent else ""
                for former, name in renames.items():
                    if former in names and name not in names:
                        spark.sql(
                            f"ALTER TABLE delta.{quote_name(path)} RENAME COLUMN "
                            f"{prefix}{quote_name(former)} TO {quote_name(name)}"
                        )
            log.info(
                "%s %s: column(s) renamed as in the source: %s",
                table.table_id,
                kind,
                ", ".join(f"{a} -> {b}" for a, b in renames.items()),
                extra={"table": table.table_id},
            )

    def park_unreadable(self, table_id: str, message: str) -> None:
        """Park ``table_id``, whose value in the stream no lake column holds (``message``: the
        source's ``UnreadableValueError``, which names the column and ``text_columns`` as the
        fix); the stream restarts without it."""
        cause, _, fix = message.partition(". Fix: ")
        self.park(
            {
                table_id: f"a value its lake column cannot hold ({cause}). Fix: {fix.rstrip('.')}"
                f"; then pgcdc resync --config pipeline.toml {table_id} (copies it anew while "
                "the others stream on)"
            },
        )

    def _park_unpublished(self, plan: SourcePlan) -> None:
        """Park the tables the lake mirrors that left the publication pgcdc created (dropped
        from it, or dropped and created again): their changes since are not in the stream
        (with ``on_table_failure = "stop"`` the run refused to start: ``config_problems``)."""
        state = self.state
        if state is None or self.config.lake.on_table_failure == "stop":
            return
        gone = [t for t in unpublished_tables(plan, state) if t not in resync_requests(self.layout)]
        if gone:
            self.park(
                {
                    t: f"the publication {state.publication!r} no longer published it (dropped "
                    "from it, or the table was dropped and created again): its changes since "
                    f"are not in the stream. Fix: pgcdc resync --config pipeline.toml {t} "
                    "(copies it anew while the others stream on)"
                    for t in gone
                }
            )

    def park(self, reasons: Mapping[str, str]) -> PipelineState:
        """Stop writing the tables of ``reasons`` (table id -> what happened and the fix):
        parked at the slot's confirmed LSN (the lake has their changes up to there); the
        others stream on, and the stream leaves the parked ones' changes unread (from its
        next query on). ``[lake] on_table_failure = "resync"`` copies them anew at once
        instead (``TableSet``). Safe from any thread of the run."""
        slot = slot_info(self.dsn, self.config.source.slot)
        at = None if slot is None or slot.confirmed_flush_lsn is None else slot.confirmed_flush_lsn

        def parked(state: PipelineState) -> PipelineState:
            phases: dict[str, TablePhase] = {}
            for table_id, reason in reasons.items():
                schema, name = self.layout.split_table_id(table_id)
                before = state.phases.get(table_id)
                phases[table_id] = TablePhase(
                    "parked",
                    schema if before is None else before.schema,
                    name if before is None else before.name,
                    attempt=1 if before is None else before.attempt,
                    reason=reason,
                    parked_at=None if at is None else str(at),
                )
            return state.unwritten(phases)

        state = self.state = update_state(self.layout, parked)
        for table_id, reason in reasons.items():
            log.warning(
                "parked %s at %s: %s",
                table_id,
                at,
                reason,
                extra={"table": table_id, "lsn": None if at is None else str(at)},
            )
        self.metrics.record_error("parked")
        return state

    # -- run -------------------------------------------------------------------------------

    @property
    def state(self) -> PipelineState | None:
        """The pipeline's state as this run last saved or read it."""
        return self._state

    @state.setter
    def state(self, state: PipelineState | None) -> None:
        self._state = state
        if state is not None:  # every table's phase, as the metrics show it
            self.metrics.record_tables(state.table_phases())

    def stop(self) -> None:
        """Ask a running ``run`` to stop once the current batch is done (thread-safe)."""
        self.stopping.set()

    @property
    def progress(self) -> Progress | None:
        state = self.state
        return None if state is None else PROGRESS.get(state.stream_app_id)

    def run(
        self,
        *,
        until_caught_up: bool = False,
        on_started: Callable[[Pipeline], None] | None = None,
    ) -> RunResult:
        """Start or resume the pipeline; returns when caught up (or stopped). The lake is held
        for the whole run (``run_lock``): a second process on it, or a lake this process cannot
        write, is refused at once, before Spark starts."""
        # what fails on a bad configuration or source fails before the lake is created
        self.check()
        start_point(self.config, self.state, self.dsn)
        fresh = not self.layout.root.is_dir()
        with run_lock(self.layout, on_lost=self._lost) as lease:
            try:
                self.spark()
            except BaseException:
                if fresh:  # a first start whose Spark did not start leaves no lake behind
                    self.layout.root.remove_tree()
                raise
            self.lease = lease
            try:
                return self._run(until_caught_up=until_caught_up, on_started=on_started)
            finally:
                self.lease = Lease()
                if self.registrar is not None:
                    self.registrar.close()
                    self.registrar = None

    def _lost(self, holder: str) -> None:
        self.set_fatal(
            f"another process ({holder}) took the lake {self.layout.root} over: this run "
            "stopped writing. Fix: run one pgcdc per lake; if that process is stale, stop it"
        )

    def _run(
        self, *, until_caught_up: bool, on_started: Callable[[Pipeline], None] | None
    ) -> RunResult:
        plan = self.check()  # under the lock: the state as the last holder left it
        self.fatal = None
        catalog = self.config.catalog
        if catalog is not None:  # before any table is created: each is registered as it is
            self.registrar = Registrar(
                self.layout, registrations(catalog, self.layout, plan.tables)
            )
            self.registrar.start(self.spark())
        self._serve_metrics()
        try:
            result = RunResult()
            start = start_point(self.config, self.state, self.dsn)
            if start.resume:
                result.resumed = True
                assert self.state is not None
                self._park_unpublished(plan)
                self.state = TableSet(self).apply(plan, self.state, result)
            else:
                self.state = InitialCopy(self).run(plan, self.state, start.slot_exists, result)
            while StreamRunner(self).run(
                self.plan or plan,
                self.state,
                result,
                until_caught_up=until_caught_up,
                on_started=on_started,
            ):  # tables created on the source that patterns match: they join, then stream on
                on_started = None
                plan = self.check()
                assert self.state is not None
                self._park_unpublished(plan)
                self.state = TableSet(self).apply(plan, self.state, result)
            return result
        except PipelineError:
            self.metrics.record_error("pipeline")
            raise
        finally:
            self.syncs.stop()
            if self.state is not None:  # nothing of a run's copies outlives it
                held_tables(self.state.stream_app_id).clear()
            self.metrics.close()
            self.metrics_port = None
            self.observer.finished()

    def set_fatal(self, message: str) -> None:
        """End the run with ``message`` (the slot monitor's finding)."""
        self.fatal = message

    def raise_fatal(self) -> None:
        if self.fatal is not None:
            raise PipelineError(self.fatal)

    def _serve_metrics(self) -> None:
        metrics = self.config.metrics
        if not metrics.port:
            return
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
