"""Where a run of a pipeline starts: the lake's state checked against the configuration and the
source, and the decision to resume the stream or to copy first.

``config_problems`` compares a lake's saved state with the configuration (``pgcdc run --check``
and every start; creates nothing); tables added or removed are not problems
(``table_set`` follows them). ``start_point`` reads the slot and refuses what cannot be
resumed, each refusal naming the fix: a lake whose slot ``pgcdc drop`` dropped, a slot without
a lake state, a slot gone or invalidated, a publication dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pgcdc.lake.config import ConfigError, PipelineConfig
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.catalog import SourcePlan
from pgcdc.lake.run.monitor import publication_gone_message, slot_gone_message, slot_lost_message
from pgcdc.lake.store.state import PipelineState, resync_requests
from pgcdc.lake.store.tables import LakeLayout
from pgcdc.replication import missing_publications, slot_info, source_catalog
from pgcdc.replication.database import connect_sql

__all__ = ["Start", "config_problems", "server_identity", "start_point", "unpublished_tables"]

log = logging.getLogger("pgcdc.lake")


def server_identity(dsn: str) -> tuple[str, str]:
    """The source's system identifier and database name: what a lake mirrors."""
    with connect_sql(dsn) as conn:
        return source_catalog.server_identity(conn)


def config_problems(
    state: PipelineState, config: PipelineConfig, plan: SourcePlan, server: tuple[str, str]
) -> list[tuple[str, str]]:
    """What in ``config`` (planned as ``plan``, against the source ``server_identity``)
    contradicts the pipeline the lake holds: (setting, problem and fix) pairs."""
    system_id, database = server
    layout = LakeLayout(config.lake.location())
    problems: list[tuple[str, str]] = []
    if state.system_identifier != system_id or state.database != database:
        problems.append(
            (
                "source.dsn",
                f"the lake {layout.root} mirrors database {state.database!r} of "
                f"server {state.system_identifier}, not {database!r} of {system_id}: "
                "point lake.path at a new folder for this source",
            )
        )
    if state.slot != config.source.slot:
        problems.append(
            (
                "source.slot",
                f"the lake's pipeline uses slot {state.slot!r}: keep that name, or start a new "
                "lake",
            )
        )
    if state.publication != config.source.publication:
        problems.append(
            (
                "source.publication",
                f"the lake's pipeline uses publication {state.publication!r}: keep that name, "
                "or start a new lake",
            )
        )
    if state.snapshot_done:
        problems.extend(_unpublished(plan, state, config))
        problems.extend(_late_kinds(plan, layout, state))
    return problems


def unpublished_tables(plan: SourcePlan, state: PipelineState) -> list[str]:
    """Tables the lake mirrors that the publication (one pgcdc created) no longer publishes:
    someone dropped them from it, or dropped the tables (and perhaps created them again).
    Their changes since are not in the stream, so adding them back to the publication would
    leave a gap in their mirrors: they are parked (``Pipeline.park``), or with ``[lake]
    on_table_failure = "stop"`` the run stops."""
    return sorted(
        table_id
        for spec in plan.publication_add
        if (table_id := f"{spec.schema or 'public'}.{spec.name}") in state.tables
    )


def _unpublished(
    plan: SourcePlan, state: PipelineState, config: PipelineConfig
) -> list[tuple[str, str]]:
    """``unpublished_tables`` as a problem, when a table's failure stops the run."""
    if config.lake.on_table_failure != "stop":
        return []
    gone = [
        t
        for t in unpublished_tables(plan, state)
        if t not in resync_requests(LakeLayout(config.lake.location()))
    ]
    if not gone:
        return []
    return [
        (
            "source.publication",
            f"publication {state.publication!r} no longer publishes {', '.join(gone)}, which "
            "the lake mirrors (it was dropped from the publication, or the table was dropped): "
            "the changes made since are not in the stream. Fix: pgcdc resync --config "
            f"pipeline.toml {' '.join(gone)} (copies it anew)",
        )
    ]


def _late_kinds(
    plan: SourcePlan, layout: LakeLayout, state: PipelineState
) -> list[tuple[str, str]]:
    """A history or changelog turned on after the table's copy: the copy writes every one the
    configuration asks for, so one missing after it would hold only the keys changed since
    (the others never get a version: the history's current versions would not be the table).
    A table the lake does not mirror yet is copied with them all (``table_set``)."""
    from pgcdc.lake.store.target import DeltaTarget

    problems = []
    for table in plan.tables:
        if table.table_id not in state.tables:
            continue
        entry = table.config_key or ""
        # the kinds written when a query last started (states before this record: unknown)
        written = state.shapes.get(table.table_id, {}).get("kinds")
        for kind in table.kinds():
            if kind == "mirror":
                continue
            if not DeltaTarget(str(table.path(layout, kind))).exists():
                why = (
                    f"{table.table_id} has no {kind} table: it was turned on after the initial "
                    f"copy, and a {kind} started now would lack the rows no change touched since"
                )
            elif written is not None and kind not in written:
                why = (
                    f"{table.table_id}'s {kind} was turned off and on again: it lacks every "
                    "change made while it was off"
                )
            else:
                continue
            problems.append(
                (
                    f"{entry}.{kind}" if entry.startswith("tables[") else f"lake.{kind}",
                    f"{why}. Turn it off again, or copy the table anew with it: leave the "
                    "table out of [[tables]] for one run, then add it back (it is copied "
                    "again, its lake tables replaced)",
                )
            )
    return problems


@dataclass(frozen=True, slots=True)
class Start:
    """How a run starts: ``resume`` the stream from the checkpoint, or copy first (then
    ``slot_exists`` says whether an unfinished copy left its slot behind)."""

    resume: bool
    slot_exists: bool


def start_point(config: PipelineConfig, state: PipelineState | None, dsn: str) -> Start:
    """Resume or copy; raises ``PipelineError`` or ``ConfigError`` naming the fix when the
    lake and the source do not allow either."""
    layout = LakeLayout(config.lake.location())
    source = config.source
    if state is not None and state.dropped_at is not None:
        raise PipelineError(
            f"the pipeline's slot {state.slot!r} was dropped by pgcdc drop at "
            f"{state.dropped_at}, so the changes since then cannot be streamed; the lake "
            f"{layout.root} is kept as it was. To start over, move the lake away (or delete it) "
            "and run again to copy everything again"
        )
    slot = slot_info(dsn, source.slot)
    if state is None and slot is not None:
        raise ConfigError(
            [
                (
                    "source.slot",
                    f"slot {slot.name!r} exists but the lake {layout.root} has no pipeline "
                    "state: another pipeline uses the slot, or this lake was lost; choose "
                    "another slot name, or drop the slot "
                    f"(SELECT pg_drop_replication_slot('{slot.name}')) to copy everything again",
                )
            ]
        )
    if state is None or not state.snapshot_done:
        return Start(resume=False, slot_exists=slot is not None)
    if slot is None:
        raise PipelineError(slot_gone_message(source.slot, layout.root, state.consistent_point))
    if slot.lost:
        raise PipelineError(
            slot_lost_message(
                slot.name,
                layout.root,
                wal_status=slot.wal_status,
                reason=slot.invalidation_reason,
                confirmed=slot.confirmed_flush_lsn,
            )
        )
    if missing_publications(dsn, [source.publication]):
        raise PipelineError(publication_gone_message(source.publication, layout.root))
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
            "lsn": None if slot.confirmed_flush_lsn is None else str(slot.confirmed_flush_lsn),
        },
    )
    return Start(resume=True, slot_exists=True)
