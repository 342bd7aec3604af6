"""The initial copy step of a run: the pipeline's tables copied in parallel inside the snapshot
its new slot exports, written as the lake's first Delta commits (``snapshot.write_snapshot``).

Its state is saved at each step (generation, consistent point, done), so a start that finds an
unfinished copy drops the slot and copies again as the next generation. A table whose columns
change while the copy runs fails it with ``pgcdc.spark.CopyAgain``: the copy is taken again
with a new snapshot and a new plan, at most ``MAX_COPY_ATTEMPTS`` times in one run
(``copy_attempts``).

``copy_in_snapshot``, ``shapes_at`` and ``build_indexes`` are the copy itself, in an exported
snapshot of any slot: the tables added to a running pipeline are copied by them too, in the
snapshot of a temporary slot (``pgcdc.lake.run.table_set``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pgcdc.lake.diagnosis import diagnose
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.bootstrap import server_identity
from pgcdc.lake.run.catalog import SourcePlan, ensure_publication
from pgcdc.lake.run.monitor import Observer
from pgcdc.lake.run.shape import recorded_shape
from pgcdc.lake.store.deltalog import TableLog
from pgcdc.lake.store.state import PipelineState, load_state, save_state
from pgcdc.lake.store.tables import LakeLayout, LakeTable, TableKind, text_columns_option
from pgcdc.lake.write.batch import table_column_pairs
from pgcdc.lake.write.indexed import IndexWanted, mirror_indexes
from pgcdc.lake.write.keyindex import index_folder
from pgcdc.lake.write.snapshot import SnapshotResult, remove_tables, write_snapshot
from pgcdc.lsn import Lsn
from pgcdc.replication import (
    ExportedSnapshot,
    create_slot_with_snapshot,
    drop_slot,
    scrub_secrets,
    slot_info,
)

if TYPE_CHECKING:
    from pgcdc.lake.run.pipeline import Pipeline, RunResult

__all__ = [
    "MAX_COPY_ATTEMPTS",
    "InitialCopy",
    "build_indexes",
    "copy_attempts",
    "copy_in_snapshot",
    "shapes_at",
]

log = logging.getLogger("pgcdc.lake")

#: Initial copies started in one run when tables keep being rewritten under them.
MAX_COPY_ATTEMPTS = 3

_T = TypeVar("_T")


def copy_attempts(copy: Callable[[], _T], again: Callable[[int], None], what: str) -> _T:
    """``copy()``, again (after ``again(attempt)``: a new plan) while it fails because a table
    changed its columns while it ran (``pgcdc.spark.CopyAgain``), at most
    ``MAX_COPY_ATTEMPTS`` times in all; ``what`` names the copy in the log."""
    from pgcdc.spark.errors import CopyAgain, raised_as

    attempt = 1
    while True:
        try:
            return copy()
        except PipelineError as exc:
            raised = raised_as(exc)
            if attempt >= MAX_COPY_ATTEMPTS or raised is None or not issubclass(raised, CopyAgain):
                raise
            attempt += 1
            log.warning(
                "a table changed its columns during %s: copying again with a new snapshot "
                "(attempt %s of %s)",
                what,
                attempt,
                MAX_COPY_ATTEMPTS,
                extra={"attempt": attempt},
            )
            again(attempt)


class InitialCopy:
    """The initial copy step of ``pipeline``'s run."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.config = pipeline.config
        self.layout = pipeline.layout
        self.observer = pipeline.observer
        self.dsn = pipeline.dsn

    def spark(self) -> Any:
        return self.pipeline.spark()

    def run(
        self,
        plan: SourcePlan,
        previous: PipelineState | None,
        slot_exists: bool,
        result: RunResult,
    ) -> PipelineState:
        """The initial copy; copied again (a new snapshot, a new plan) when a table changed its
        columns while it ran, at most ``MAX_COPY_ATTEMPTS`` times."""

        def again(_attempt: int) -> None:
            nonlocal plan, previous, slot_exists
            plan = self.pipeline.plan = self.pipeline.replan()  # new columns
            previous = load_state(self.layout)
            slot_exists = slot_info(self.dsn, self.config.source.slot) is not None

        return copy_attempts(
            lambda: self._copy(plan, previous, slot_exists, result), again, "the initial copy"
        )

    def _copy(
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
            system_id, database = server_identity(dsn)
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
            self.pipeline.lease.check()  # the slot and tables may be another holder's now
            if slot_exists:
                drop_slot(dsn, source.slot, terminate_active=True)
            remove_tables(self.layout, plan.tables, self.pipeline.lease.check)
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
        with create_slot_with_snapshot(
            dsn, source.slot, connect_timeout=source.connect_timeout
        ) as exported:
            started_at = datetime.now(UTC)
            state = state.evolve(
                consistent_point=str(exported.consistent_point),
                snapshot_started_at=started_at.isoformat(),
                shapes=shapes_at(dsn, exported.snapshot_name, plan.tables),
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
            snapshot = copy_in_snapshot(
                self.pipeline,
                exported,
                plan.tables,
                started_at=started_at,
                app_id=state.snapshot_app_id,
                version=state.generation,
                failed="the initial copy failed",
                again="the next start copies everything again",
            )
        state = state.evolve(snapshot_done=True, snapshot_rows=dict(snapshot.rows))
        save_state(self.layout, state)
        if self.config.lake.write == "indexed":
            build_indexes(spark, self.layout, plan.tables, snapshot)
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


def copy_in_snapshot(
    pipeline: Pipeline,
    exported: ExportedSnapshot,
    tables: Sequence[LakeTable],
    *,
    started_at: datetime,
    app_id: str,
    version: int,
    failed: str,
    again: str,
    kinds: Mapping[str, Sequence[TableKind]] | None = None,
    replace: bool = False,
    layout: LakeLayout | None = None,
    observer: Observer | None = None,
) -> SnapshotResult:
    """Copy ``tables`` (as the pipeline's publication publishes them: row filters, columns)
    inside ``exported``'s snapshot into their Delta tables, created now
    (``snapshot.write_snapshot``), each one commit tagged ``(app_id, version)``; ``observer``
    (default the pipeline's) hears of it. A failure is a ``PipelineError`` saying ``failed``,
    the cause and ``again`` (what the next start does). ``kinds``, ``replace``: see
    ``write_snapshot``; ``layout``: the lake written to (default the pipeline's)."""
    from pgcdc.spark import snapshot_options, snapshot_reader

    config = pipeline.config
    dsn = pipeline.dsn
    layout = pipeline.layout if layout is None else layout
    observer = pipeline.observer if observer is None else observer
    observer.snapshot_started(len(tables), Lsn(exported.consistent_point))
    options: dict[str, Any] = {}
    partitions = config.stream.snapshot_partitions_per_table
    if partitions is not None:
        options["partitionsPerTable"] = partitions
    texts = text_columns_option(tables)
    if texts:
        options["textColumns"] = texts
    try:
        reader = snapshot_reader(
            snapshot_options(
                dsn, exported=exported, publications=[config.source.publication], **options
            ),
            only=[t.table_id for t in tables],
        )
        return write_snapshot(
            pipeline.spark(),
            reader,
            layout,
            tables,
            dict(table_column_pairs(tables)),
            consistent_point=Lsn(exported.consistent_point),
            started_at=started_at,
            app_id=app_id,
            generation=version,
            on_progress=observer.snapshot_progress,
            fence=pipeline.lease.check,
            kinds=kinds,
            replace=replace,
        )
    except Exception as exc:
        found = diagnose(exc, str(layout.root))
        fix = f". Fix: {found.fix}" if found.fix else ""
        raise PipelineError(f"{failed}: {scrub_secrets(found.cause)}; {again}{fix}") from exc


def build_indexes(
    spark: Any, layout: LakeLayout, tables: Sequence[LakeTable], copied: SnapshotResult
) -> None:
    """The key indexes of the copied mirrors and histories (``pgcdc.lake.write.indexed``),
    built now, by one Spark job for all, so that the first batch does not build them: read
    from the files the copy committed (``copied``; as Parquet, nothing of the tables' logs
    but their schemas), or, for a table whose log moved on since, from the table. A failure
    is logged: the first batch that needs an index builds it."""

    wanted = []
    for table in tables:
        if table.multiset:
            continue
        # a history's index too (its current versions): the first batch would build each
        # anew, a Spark job listing its files per history (100 s for a hundred of them)
        for kind in [k for k in table.kinds() if k in ("mirror", "history")]:
            log_ = TableLog(spark, str(table.path(layout, kind)))
            folder = index_folder(layout, table, kind)
            snapshot = log_.snapshot()
            version, files = copied.files.get((table.table_id, kind), (-1, None))
            known = files if int(snapshot.version()) == version else None
            keys = tuple(table.row_keys)
            wanted.append(IndexWanted(log_, snapshot, keys, folder, kind == "history", known))
    if not wanted:
        return
    try:
        mirror_indexes(spark, wanted)
    except Exception as exc:  # the first batch builds what is missing
        log.warning("the key indexes were not built after the copy (%s): %s", type(exc), exc)


def shapes_at(dsn: str, snapshot: str, tables: Sequence[LakeTable]) -> dict[str, dict[str, Any]]:
    """The tables' shapes as the exported snapshot sees the catalog: the baseline the stream
    compares with (``pgcdc.lake.run.shape``), so that DDL made while the copy runs is a change to
    judge, not the baseline."""
    from psycopg import sql

    from pgcdc.replication import source_catalog
    from pgcdc.replication.database import connect_sql

    with connect_sql(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        shapes = {
            table.table_id: recorded_shape(table, shape)
            for table in tables
            if (shape := source_catalog.table_shape(conn, table.schema, table.name)) is not None
        }
        conn.execute("COMMIT")
    return shapes
