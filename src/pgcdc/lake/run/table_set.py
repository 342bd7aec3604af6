"""The tables of a running pipeline follow its configuration: at every start that resumes the
stream, a table added is copied and joins the stream, a table removed leaves it.

``table_changes`` compares the plan (the configured tables as the source has them now) with the
lake's state: the tables added (to ``[[tables]]``, or created on the source and matched by a
pattern, or added before and not copied to the end), the tables removed, and unfinished copies
of tables no longer configured. ``pgcdc run --check`` reports them and changes nothing.

``TableSet.apply`` runs under the run lock before the stream starts:

1. The publication gains the added tables (with their row filters) and loses the removed ones,
   in one transaction, when pgcdc created it (``catalog.ensure_publication``); a publication
   someone else made is never changed: it must publish what ``[[tables]]`` asks for.
2. A removed table leaves the state's ``tables`` and is recorded ``removed`` (``TablePhase``):
   its Delta tables are kept and no longer written; ``pgcdc status`` lists them so. Changes of
   it the stream still reads (committed before the publication dropped it) are ignored.
3. The added tables are copied the way PostgreSQL's subscriber synchronises a table added to
   its publication (``tablesync.c``), all of them in one copy:

   a. the state records each as ``copying`` (the attempt's number) before the publication is
      changed or anything is created, so that a start that finds one so (a kill -9 at any
      point) removes what that copy left (its Delta tables and key indexes, nothing else) and
      copies it again; a table added again after it was removed is copied anew the same way;
   b. a temporary slot is created with an exported snapshot, at consistent point X; the tables
      are copied in that snapshot as the initial copy copies (``initial_copy``: mirror,
      history and changelog as configured, their shapes as of the snapshot, key indexes);
   c. the state records each as ``streaming`` from X (``copied_at``) and among ``tables``;
      then the temporary slot is dropped (it lives as long as its connection: a killed run
      leaves none behind).

   A table that changed its columns during the copy makes it copy again (``copy_attempts``).

The same copy takes a table anew: one ``pgcdc resync`` asked for (``state.request_resync``),
or a parked one with ``[lake] on_table_failure = "resync"`` (``Pipeline.check_shapes`` parks a
table whose DDL the lake cannot follow); its old Delta tables are removed first. A running
``pgcdc run`` looks for such tables, and for new ones patterns match, while it streams
(``TableDiscovery``), and stops its stream between two batches to copy them.

The handover has no gap and no duplicate. The stream resumes at the main slot's confirmed LSN
(before X) and applies an added table's changes committed at X or later, and only those
(``batch.skip_copied``): the snapshot exported at X holds exactly the transactions whose commit
record starts before X. And the main slot sends every one of those changes: a slot becomes
consistent only once the transactions running when it was created have ended, and the
temporary slot was created after the publication gained the table, so every transaction
committed at X or later began after that, and is decoded with the table published (the changes
of a transaction that overlapped the ``ALTER PUBLICATION``, which PostgreSQL's decoding has
had bugs with, all commit before X and are in the copy). The other tables' Delta tables are not
touched.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pgcdc.errors import PgcdcError
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.catalog import SourcePlan, ensure_publication
from pgcdc.lake.run.initial_copy import build_indexes, copy_attempts, copy_in_snapshot, shapes_at
from pgcdc.lake.store.state import (
    PipelineState,
    TablePhase,
    load_state,
    now,
    resync_done,
    resync_requests,
    save_state,
)
from pgcdc.lake.store.tables import LakeLayout, LakeTable, TableKind
from pgcdc.lake.write.snapshot import remove_tables
from pgcdc.replication import create_slot_with_snapshot, scrub_secrets

if TYPE_CHECKING:
    from pgcdc.lake.config import PipelineConfig
    from pgcdc.lake.run.pipeline import Pipeline, RunResult

__all__ = ["TableChanges", "TableDiscovery", "TableSet", "changes_of", "table_changes"]

log = logging.getLogger("pgcdc.lake")

_KINDS: tuple[TableKind, ...] = ("mirror", "history", "changelog")


@dataclass(frozen=True, slots=True)
class TableChanges:
    """How the configured tables differ from the lake's: ``added`` (to copy), ``removed``
    (table ids, to stop mirroring) and ``unfinished`` (table ids whose copy did not finish
    and that are no longer configured: what their copy left is removed)."""

    added: tuple[LakeTable, ...] = ()
    removed: tuple[str, ...] = ()
    unfinished: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.unfinished)

    def describe(self) -> str:
        """What a start does about them, in a sentence (``pgcdc run --check``)."""
        what = []
        if self.added:
            what.append(
                "copy the added tables " + ", ".join(t.table_id for t in self.added) + " and "
                "stream them"
            )
        if self.removed:
            what.append(
                "stop mirroring the removed tables " + ", ".join(self.removed) + " (their lake "
                "tables are kept)"
            )
        if self.unfinished:
            what.append(
                "remove what the unfinished copies of " + ", ".join(self.unfinished) + " left"
            )
        return "; ".join(what)


def table_changes(
    state: PipelineState,
    plan: SourcePlan,
    *,
    resync: Collection[str] = (),
    resync_parked: bool = False,
) -> TableChanges:
    """The tables ``plan`` adds to and removes from the lake ``state`` describes (nothing
    before the initial copy finished: that copy takes the plan's tables as they are). Tables
    to copy anew count as added: those of ``resync`` (``pgcdc resync``), and the parked ones
    with ``resync_parked``; a parked table stays out otherwise."""
    if not state.snapshot_done:
        return TableChanges()
    planned = {t.table_id for t in plan.tables}
    mirrored = set(state.tables)
    parked = set(state.parked())
    again = set(resync) | (parked if resync_parked else set())
    return TableChanges(
        added=tuple(
            t
            for t in plan.tables
            if t.table_id in again or (t.table_id not in mirrored and t.table_id not in parked)
        ),
        removed=tuple(sorted((mirrored | parked) - planned)),
        unfinished=tuple(
            sorted(
                table_id
                for table_id, phase in state.phases.items()
                if phase.phase == "copying" and table_id not in planned
            )
        ),
    )


def changes_of(
    config: PipelineConfig,
    state: PipelineState,
    plan: SourcePlan,
    requests: Collection[str],
) -> TableChanges:
    """``table_changes`` as ``config`` asks: parked tables copied anew at once with ``[lake]
    on_table_failure = "resync"``; ``requests``: the tables ``pgcdc resync`` named."""
    return table_changes(
        state,
        plan,
        resync=requests,
        resync_parked=config.lake.on_table_failure == "resync",
    )


class TableDiscovery:
    """While ``pipeline`` streams: the tables to add now. Every ``interval`` seconds, the
    tables created on the source since it started that a ``[[tables]]`` pattern matches (the
    catalog, as a start plans it); every ``REQUESTS_INTERVAL`` seconds, the tables ``pgcdc
    resync`` asked to copy anew, and parked tables when ``[lake] on_table_failure`` is
    "resync". Found, they join the way a start adds tables: the stream stops between two
    batches, ``TableSet.apply`` copies them, the stream resumes (``pipeline.Pipeline``)."""

    #: seconds between two looks for ``pgcdc resync``'s requests (a listing of a folder)
    REQUESTS_INTERVAL = 5.0

    def __init__(self, pipeline: Pipeline, interval: float) -> None:
        self.pipeline = pipeline
        self.interval = interval
        started = time.monotonic()
        self._next_plan = started + interval if interval > 0 else float("inf")
        self._next_requests = started
        self._said: str | None = None

    @classmethod
    def of(cls, pipeline: Pipeline) -> TableDiscovery:
        return cls(pipeline, pipeline.config.source.table_discovery_interval)

    def found(self) -> tuple[str, ...]:
        """The table ids to add now, when a look is due (else, or on failure, none: a source
        that cannot be planned is the stream's to report, or the next start's)."""
        now_ = time.monotonic()
        pipeline = self.pipeline
        patterns = any(t.is_pattern for t in pipeline.config.tables)
        plan_due = patterns and now_ >= self._next_plan
        requests_due = now_ >= self._next_requests
        if not plan_due and not requests_due:
            return ()
        if requests_due:
            self._next_requests = now_ + self.REQUESTS_INTERVAL
        try:
            state = load_state(pipeline.layout) or pipeline.state
            if state is None:
                return ()
            requests = resync_requests(pipeline.layout)
            resync_parked = pipeline.config.lake.on_table_failure == "resync" and state.parked()
            if not plan_due and not requests and not resync_parked:
                return ()
            if plan_due:
                self._next_plan = now_ + self.interval
            plan = pipeline.replan(state)
        except (PgcdcError, OSError) as exc:
            message = scrub_secrets(str(exc))
            if message != self._said:  # once per reason, not every interval
                log.warning("looking for tables to add failed (tried again later): %s", message)
                self._said = message
            return ()
        self._said = None
        return tuple(t.table_id for t in changes_of(pipeline.config, state, plan, requests).added)


class TableSet:
    """Applies the configuration's table changes to ``pipeline``'s lake (see the module doc)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.config = pipeline.config
        self.layout = pipeline.layout
        self.dsn = pipeline.dsn

    def apply(self, plan: SourcePlan, state: PipelineState, result: RunResult) -> PipelineState:
        """The lake's state once the tables ``plan`` adds (or ``pgcdc resync`` asks for) are
        copied and the ones it removes are left; the state as it was when nothing changes."""
        requests = resync_requests(self.layout)
        changes = changes_of(self.pipeline.config, state, plan, requests)
        if not changes and not plan.publication_add and not plan.publication_drop:
            resync_done(requests, list(requests))  # of tables no longer configured
            return state
        self._refuse_unknown_folders(changes.added, state)
        if changes.unfinished:
            remove_tables(
                self.layout,
                [_table(state.phases[table_id]) for table_id in changes.unfinished],
                self.pipeline.lease.check,
            )
        phases = {k: v for k, v in state.phases.items() if k not in changes.unfinished}
        for table in changes.added:  # before anything of the copy is created
            before = phases.get(table.table_id)
            attempt = 1 if before is None else before.attempt + 1
            phases[table.table_id] = TablePhase(
                "copying", table.schema, table.name, attempt=attempt
            )
        # a table copied anew (pgcdc resync) is not written until its copy lands: a start
        # after a kill in between copies it again instead of writing a half-copied table
        again = {t.table_id for t in changes.added}
        state = state.evolve(phases=phases, tables=tuple(t for t in state.tables if t not in again))
        save_state(self.layout, state)
        ensure_publication(self.dsn, self.config, plan)
        if changes.removed:
            state = self._remove(state, changes.removed)
            result.removed = changes.removed
        if changes.added:
            state = self._add(plan, changes.added, state, result)
        resync_done(requests, list(requests))
        return state

    def _refuse_unknown_folders(self, added: Sequence[LakeTable], state: PipelineState) -> None:
        """An added table the state knows nothing of, with something at one of its lake paths
        already: pgcdc did not write it, and never removes what it did not write."""
        for table in added:
            if table.table_id in state.phases:
                continue
            for kind in _KINDS:
                path = table.path(self.layout, kind)
                if path.is_dir():
                    raise PipelineError(
                        f"{table.table_id} was added to the pipeline, but the lake already has "
                        f"{path}, which this pipeline did not write. Fix: move that folder away "
                        "(or remove the table from [[tables]]), and run again"
                    )

    def _remove(self, state: PipelineState, removed: Sequence[str]) -> PipelineState:
        state = state.unwritten({t: _removed(state, self.layout, t) for t in removed})
        save_state(self.layout, state)
        log.info(
            "stopped mirroring %s: removed from the configuration; their lake tables are kept",
            ", ".join(removed),
            extra={"tables": list(removed)},
        )
        return state

    def _add(
        self,
        plan: SourcePlan,
        added: Sequence[LakeTable],
        state: PipelineState,
        result: RunResult,
    ) -> PipelineState:
        """Copy ``added`` in a temporary slot's snapshot; again with a new plan when a table
        changed its columns while it ran."""
        tables = list(added)

        def again(_attempt: int) -> None:
            nonlocal tables, state
            replanned = self.pipeline.replan()
            wanted = {t.table_id for t in tables}
            tables = [t for t in replanned.tables if t.table_id in wanted]
            state = load_state(self.layout) or state
            phases = dict(state.phases)
            for table in tables:
                before = phases[table.table_id]
                phases[table.table_id] = replace(before, attempt=before.attempt + 1, since=now())
            state = state.evolve(phases=phases)
            save_state(self.layout, state)

        return copy_attempts(
            lambda: self._copy(tables, state, result), again, "the copy of the added tables"
        )

    def _copy(
        self, tables: Sequence[LakeTable], state: PipelineState, result: RunResult
    ) -> PipelineState:
        pipeline = self.pipeline
        source = self.config.source
        spark = pipeline.spark()
        ids = [t.table_id for t in tables]
        # what an earlier attempt left, or the old lake tables of a table added again
        remove_tables(self.layout, tables, pipeline.lease.check)
        started = time.monotonic()
        # temporary: dropped with its connection, whatever ends this run
        name = f"pgcdc_add_{secrets.token_hex(6)}"
        with create_slot_with_snapshot(
            self.dsn, name, temporary=True, connect_timeout=source.connect_timeout
        ) as exported:
            started_at = datetime.now(UTC)
            point = str(exported.consistent_point)
            log.info(
                "copying the added tables %s at %s (temporary slot %s)",
                ", ".join(ids),
                point,
                name,
                extra={"tables": ids, "lsn": point, "slot": name},
            )
            shapes = shapes_at(self.dsn, exported.snapshot_name, tables)
            attempt = max(state.phases[t].attempt for t in ids)
            copied = copy_in_snapshot(
                pipeline,
                exported,
                tables,
                started_at=started_at,
                app_id=state.added_app_id,
                version=attempt,
                failed=f"the copy of the added tables {', '.join(ids)} failed",
                again=(
                    "the next start copies them again (or remove them from [[tables]] to "
                    "stream the others)"
                ),
            )
            phases = dict(state.phases)
            for table_id in ids:
                phases[table_id] = replace(
                    phases[table_id],
                    phase="streaming",
                    since=now(),
                    copied_at=point,
                    copy_started_at=started_at.isoformat(),
                    rows=copied.rows.get(table_id, 0),
                )
            state = state.evolve(
                tables=tuple(sorted({*state.tables, *ids})),
                phases=phases,
                shapes={**state.shapes, **shapes},
            )
            save_state(self.layout, state)
        if self.config.lake.write == "indexed":
            build_indexes(spark, self.layout, tables, copied)
        seconds = time.monotonic() - started
        result.added_rows = dict(copied.rows)
        log.info(
            "added %s tables: %s rows copied at %s in %.1f s",
            len(ids),
            sum(copied.rows.values()),
            point,
            seconds,
            extra={
                "tables": ids,
                "rows": sum(copied.rows.values()),
                "lsn": point,
                "seconds": round(seconds, 3),
            },
        )
        pipeline.observer.snapshot_finished(sum(copied.rows.values()), seconds)
        return state


def _table(phase: TablePhase) -> LakeTable:
    """The table a phase is of, for its lake paths."""
    return LakeTable(schema=phase.schema, name=phase.name, keys=(), replica_identity="d")


def _removed(state: PipelineState, layout: LakeLayout, table_id: str) -> TablePhase:
    """The phase of a table removed from the configuration; one of the initial copy has none
    yet, and its schema and name are read from the lake (the folder its mirror is in)."""
    before = state.phases.get(table_id)
    if before is not None:
        return replace(before, phase="removed", since=now())
    schema, name = layout.split_table_id(table_id)
    return TablePhase("removed", schema, name)
