"""The tables of a running pipeline follow its configuration: a table added joins the stream,
copied while the others stream on; a table removed leaves it.

``table_changes`` compares the plan (the configured tables as the source has them now) with the
lake's state: the tables added (to ``[[tables]]``, or created on the source and matched by a
pattern, or whose copy did not land), the tables removed, and unfinished copies of tables no
longer configured. ``pgcdc run --check`` reports them and changes nothing.

``TableSet.apply`` runs under the run lock, with the stream stopped (before it starts, or
between two batches when ``TableDiscovery`` found tables while it ran):

1. The state records each added table as ``copying`` (the attempt's number, and the stream's
   next micro-batch, from which the stream keeps its changes aside) before the publication is
   changed or anything is created; what an earlier attempt left is dropped.
2. The publication gains the added tables (with their row filters) and loses the removed ones,
   in one transaction, when pgcdc created it (``catalog.ensure_publication``); a publication
   someone else made is never changed: it must publish what ``[[tables]]`` asks for.
3. A removed table leaves the state's ``tables`` and is recorded ``removed`` (``TablePhase``):
   its Delta tables are kept and no longer written; ``pgcdc status`` lists them so. Changes of
   it the stream still reads (committed before the publication dropped it) are ignored.

The stream then starts again, and each added table is copied beside it and handed over to it
(``pgcdc.lake.run.table_sync``, which states the handover's rule). The same copy takes a table
anew: one ``pgcdc resync`` asked for (``state.request_resync``), a parked one with ``[lake]
on_table_failure = "resync"``, a removed one added back; its Delta tables are kept as they are
until its copy lands (``pgcdc.lake.write.landing``). A running ``pgcdc run`` looks for such
tables, and for new ones patterns match, while it streams (``TableDiscovery``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pgcdc.errors import PgcdcError
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.bootstrap import unpublished_tables
from pgcdc.lake.run.catalog import SourcePlan, ensure_publication
from pgcdc.lake.run.table_sync import SYNC_PHASES, next_batch
from pgcdc.lake.store.state import (
    PipelineState,
    TablePhase,
    load_state,
    now,
    resync_done,
    resync_requests,
    save_state,
    state_lock,
)
from pgcdc.lake.store.tables import LakeLayout, LakeTable, TableKind
from pgcdc.lake.write.held import held_folder
from pgcdc.lake.write.snapshot import remove_tables
from pgcdc.replication import scrub_secrets

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
    #: tables the lake mirrors that left the publication pgcdc created: parked
    left: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.unfinished or self.left)

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
        if self.left:
            what.append(
                "park " + ", ".join(self.left) + " (no longer in the publication: their changes "
                "since are not in the stream; pgcdc resync copies them anew)"
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
    # a copy that landed goes on catching up (``table_sync``); one that did not is done again
    landed = {t for t, p in state.phases.items() if p.phase == "catching-up"}
    again = set(resync) | (parked if resync_parked else set())
    return TableChanges(
        added=tuple(
            t
            for t in plan.tables
            if t.table_id in again
            or (t.table_id not in mirrored and t.table_id not in parked | landed)
        ),
        removed=tuple(sorted((mirrored | parked) - planned)),
        unfinished=tuple(
            sorted(
                table_id
                for table_id, phase in state.phases.items()
                if phase.phase in SYNC_PHASES and table_id not in planned
            )
        ),
    )


def changes_of(
    config: PipelineConfig,
    state: PipelineState,
    plan: SourcePlan,
    requests: Collection[str],
    copying: Collection[str] = (),
) -> TableChanges:
    """``table_changes`` as ``config`` asks: parked tables copied anew at once with ``[lake]
    on_table_failure = "resync"``; ``requests``: the tables ``pgcdc resync`` named;
    ``copying``: the tables whose copy runs in this process (left as they are: a resync asked
    for meanwhile waits for it to end)."""
    changes = table_changes(
        state,
        plan,
        resync=requests,
        resync_parked=config.lake.on_table_failure == "resync",
    )
    if state.snapshot_done and config.lake.on_table_failure != "stop":
        left = [t for t in unpublished_tables(plan, state) if t not in requests]
        changes = replace(changes, left=tuple(left))
    if not copying:
        return changes
    return replace(changes, added=tuple(t for t in changes.added if t.table_id not in copying))


class TableDiscovery:
    """While ``pipeline`` streams: the tables to take up now. Every ``interval`` seconds, the
    tables created on the source since it started that a ``[[tables]]`` pattern matches (the
    catalog, as a start plans it), and the tables it writes that left the publication pgcdc
    created (dropped and created again); every ``REQUESTS_INTERVAL`` seconds, the tables
    ``pgcdc resync`` asked to copy anew, and parked tables when ``[lake] on_table_failure`` is
    "resync". Found, the stream stops between two batches, ``TableSet.apply`` records the
    tables to copy and changes the publication, and the stream starts again (checking the
    tables' shapes: a table created again is parked) while they are copied beside it
    (``pipeline.Pipeline``)."""

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
        plan_due = now_ >= self._next_plan
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
        copying = pipeline.syncs.unfinished()
        changes = changes_of(pipeline.config, state, plan, requests, copying)
        # and the tables the stream writes that left the publication pgcdc made (dropped and
        # created again, say): parked between two batches
        return (*(t.table_id for t in changes.added), *changes.left)


class TableSet:
    """Applies the configuration's table changes to ``pipeline``'s lake (see the module doc)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.config = pipeline.config
        self.layout = pipeline.layout
        self.dsn = pipeline.dsn

    def apply(self, plan: SourcePlan, state: PipelineState, result: RunResult) -> PipelineState:
        """The lake's state once the tables ``plan`` adds (or ``pgcdc resync`` asks for) are
        recorded as being copied, the publication gains them, and the ones it removes are
        left; the state as it was when nothing changes. The copies themselves run beside the
        stream (``pgcdc.lake.run.table_sync``): called with the stream stopped, before it
        starts again."""
        # copies of other tables running beside the stream change the state too
        with state_lock():
            return self._apply(plan, load_state(self.layout) or state, result)

    def _apply(self, plan: SourcePlan, state: PipelineState, result: RunResult) -> PipelineState:
        copying = self.pipeline.syncs.unfinished()
        requests = {t: p for t, p in resync_requests(self.layout).items() if t not in copying}
        changes = changes_of(self.pipeline.config, state, plan, requests, copying)
        if not changes and not plan.publication_add and not plan.publication_drop:
            resync_done(requests, list(requests))  # of tables no longer configured
            return state
        self._refuse_unknown_folders(changes.added, state)
        if changes.unfinished:
            gone = [_table(state.phases[table_id]) for table_id in changes.unfinished]
            unwritten = [t for t in gone if not state.phases[t.table_id].again]
            remove_tables(self.layout, unwritten, self.pipeline.lease.check)
            for table in gone:
                held_folder(self.layout, table).remove_tree()
        phases = {k: v for k, v in state.phases.items() if k not in changes.unfinished}
        first = next_batch(self.layout, state)
        for table in changes.added:  # before anything of the copy is created
            before = phases.get(table.table_id)
            attempt = 1 if before is None else before.attempt + 1
            phases[table.table_id] = TablePhase(
                "copying",
                table.schema,
                table.name,
                attempt=attempt,
                from_batch=first,
                again=self._again(table, state, before),
            )
        # a table copied anew (pgcdc resync) is not written by the stream until its copy lands
        # and what the stream kept aside meanwhile is applied
        again = {t.table_id for t in changes.added}
        state = state.evolve(phases=phases, tables=tuple(t for t in state.tables if t not in again))
        save_state(self.layout, state)
        for table in changes.added:  # what earlier attempts kept aside
            held_folder(self.layout, table).remove_tree()
        ensure_publication(self.dsn, self.config, plan)
        if changes.removed:
            state = self._remove(state, changes.removed)
            result.removed = changes.removed
        if changes.added:
            log.info(
                "copying %s while the stream runs (their changes are kept aside from batch %s "
                "until their copy lands)",
                ", ".join(t.table_id for t in changes.added),
                first,
                extra={"tables": [t.table_id for t in changes.added], "batch": first},
            )
        resync_done(requests, list(requests))
        return state

    def _again(self, table: LakeTable, state: PipelineState, before: TablePhase | None) -> bool:
        """Whether ``table`` is copied anew over Delta tables of a copy that landed (kept
        until the new one lands), rather than into new ones."""
        if before is not None and before.phase == "copying":
            return before.again
        written = table.table_id in state.tables or before is not None
        return written and (table.path(self.layout, "mirror") / "_delta_log").is_dir()

    def _refuse_unknown_folders(self, added: Sequence[LakeTable], state: PipelineState) -> None:
        """An added table the state knows nothing of, with something at one of its lake paths
        already: pgcdc did not write it, and never removes what it did not write."""
        for table in added:
            if table.table_id in state.phases or table.table_id in state.tables:
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
