"""``pgcdc status``: how a pipeline (``pipeline.toml``) is doing, for people and for scripts.

It reads the lake's state (``<lake>/_pgcdc/state.json``), the slot on the source
(``pg_replication_slots``), the server's current WAL position and each mirror's Delta log, and
reports: the pipeline (id, generation, snapshot done, dropped); the slot (active and its
walsender's pid, confirmed flush and restart LSN, WAL retained in bytes, ``wal_status``,
invalidation reason, ``safe_wal_size``); the lag; the stream's last committed micro-batch (from
its checkpoint) and the last batch a run failed on (``last_failure``: batch id, LSN range, error
class, its cause and fix when pgcdc recognised it, time, failed runs; ``standing`` until a batch
is applied; ``kept_outside_lake`` and ``state_error`` when the run could not write the lake's
state and kept the failure in a file outside it); and per table its rows (from
the Delta log's file statistics, without reading data), its last commit (version, time, stream
batch id from the commit's metadata) and the newest change it holds (``__commit_lsn`` /
``__commit_time``), with its ``phase``: ``streaming`` (``mirrored``), ``copying`` (added to the
configuration, its copy not finished: the next run finishes it) or ``removed`` (left the
configuration: its lake tables are kept and no longer written), and the LSN its copy was taken
at (``copied_at``: the initial copy's, or its own for a table added later). Nothing is written
anywhere.

Lag:

* ``lag.bytes``: the server's current WAL position minus the slot's confirmed flush position:
  WAL the pipeline has not confirmed yet (on an idle source it stays near 0, because the slot is
  confirmed up to the server's WAL end);
* ``lag.seconds``: now minus ``lag.last_applied_commit_time``, the commit time of the newest
  source transaction the lake holds (the newest ``__commit_time`` in the mirrors; the
  snapshot's start for rows copied by it). It says how old the lake's newest change is: when
  the source is busy that is how far behind the lake is; when the source is idle it grows
  although nothing is missing, so read it together with ``lag.bytes``.

Output: a rich table by default; ``--json`` prints one JSON object (keys as in ``collect``,
LSNs both as ``"X/XXXXXXXX"`` text and as ``..._int`` numbers). The connection string, and so
its password, never appears.

Exit codes: 0 the pipeline is healthy, or not started yet (no state in the lake); 1 it cannot
continue (slot gone or invalidated, dropped by ``pgcdc drop``), a run failed on a batch that has
not been applied since (the slot cannot advance past it), or the source or the state could not
be read, with a message naming the fix; 2 a bad configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from pgcdc.lsn import Lsn

if TYPE_CHECKING:  # the lake (delta-rs, pyarrow) is imported when the command runs
    from pgcdc.lake.config import PipelineConfig
    from pgcdc.lake.store.state import BatchFailure, PipelineState
    from pgcdc.lake.store.storage import LakePath
    from pgcdc.lake.store.tables import LakeLayout

NAME = "status"

#: How many of a table's newest commits are searched for its last stream batch.
HISTORY_LIMIT = 100


def register(sub: Any) -> tuple[str, Callable[[argparse.Namespace], int]]:
    p = sub.add_parser(
        NAME,
        help="show a pipeline's slot, lag, last batches and row counts (pipeline.toml)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, type=Path, help="the pipeline.toml file")
    p.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
    return NAME, run


def _lsn_fields(name: str, lsn: Lsn | int | None) -> dict[str, Any]:
    return {
        name: None if lsn is None else str(Lsn(lsn)),
        f"{name}_int": None if lsn is None else int(lsn),
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat(timespec="seconds")


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _mirror_path(layout: LakeLayout, table_id: str) -> tuple[str, str, LakePath]:
    """The schema, table and mirror path of a ``schema.table`` id (names may hold dots)."""
    schema, name = layout.split_table_id(table_id)
    return schema, name, layout.table_path(schema, name)


def _max(column: Any) -> Any:
    import pyarrow.compute as pc

    return pc.max(column).as_py()


def _table_status(layout: LakeLayout, table_id: str, state: PipelineState) -> dict[str, Any]:
    """One lake table's report: its mirror (rows, version, newest change, last batch) and its
    phase: ``streaming`` (mirrored), ``copying`` (its copy beside the stream not landed),
    ``catching-up`` (copied; the changes the stream kept aside meanwhile being applied),
    ``parked`` or ``removed`` (no longer in the configuration: kept, no longer written)."""
    from pgcdc.lake.store.tables import COMMIT_LSN, COMMIT_TIME
    from pgcdc.lake.store.target import DeltaTarget, commit_metadata

    phase = state.phases.get(table_id)
    if phase is not None:
        path = layout.table_path(phase.schema, phase.name)
    else:
        _schema, _name, path = _mirror_path(layout, table_id)
    # the copy's files carry no statistics: their rows are of the copy's point and time
    copied_at = state.consistent_point
    copied_time = state.snapshot_started_at
    if phase is not None and phase.copied_at is not None:
        copied_at, copied_time = phase.copied_at, phase.copy_started_at
    out: dict[str, Any] = {
        "table": table_id,
        "phase": "streaming" if phase is None else phase.phase,
        "mirrored": table_id in state.tables,
        "phase_since": None if phase is None else phase.since,
        "parked_reason": None if phase is None else phase.reason,
        **_lsn_fields("parked_at", _parse_lsn(None if phase is None else phase.parked_at)),
        **_lsn_fields("copied_at", _parse_lsn(copied_at)),
        "path": str(path),
        "exists": False,
        "rows": None,
        "delta_version": None,
        "last_commit_time": None,
        "last_operation": None,
        "last_batch": None,
        "snapshot_generation": None,
        "newest_change_time": None,
        **_lsn_fields("newest_change_lsn", None),
    }
    if not (path / "_delta_log").is_dir():
        return out
    target = DeltaTarget(path)
    version = target.version()
    if version is None:
        return out
    out["exists"] = True
    out["delta_version"] = version
    out["rows"] = target.count()  # deletion vectors applied
    actions = target.files()
    names = set(actions.column_names)
    newest_lsn: int | None = None
    newest_time: datetime | None = None
    lsn_column = f"max.{COMMIT_LSN}"
    time_column = f"max.{COMMIT_TIME}"
    without_stats = actions.num_rows
    if lsn_column in names:
        lsn_values = actions.column(lsn_column)
        without_stats = lsn_values.null_count
        if lsn_values.null_count < len(lsn_values):
            newest_lsn = int(_max(lsn_values))
    if time_column in names:
        value = _max(actions.column(time_column))
        if isinstance(value, datetime):
            newest_time = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if without_stats and copied_at:  # files of the copy carry no statistics
        point = int(Lsn.parse(copied_at))
        newest_lsn = point if newest_lsn is None else max(newest_lsn, point)
        started = _parse_time(copied_time)
        if started is not None:
            newest_time = started if newest_time is None else max(newest_time, started)
    out.update(_lsn_fields("newest_change_lsn", newest_lsn))
    out["newest_change_time"] = _iso(newest_time)
    table = target.table()
    assert table is not None
    history = table.history(limit=HISTORY_LIMIT)
    if history:
        last = history[0]
        stamp = last.get("timestamp")
        if isinstance(stamp, int | float):
            out["last_commit_time"] = _iso(datetime.fromtimestamp(stamp / 1000, UTC))
        out["last_operation"] = last.get("operation")
    for commit in history:
        meta = commit_metadata(commit)
        if isinstance(meta, dict) and "batch" in meta:
            out["last_batch"] = int(meta["batch"])
            break
        if isinstance(meta, dict) and "snapshot" in meta:
            out["snapshot_generation"] = int(meta["snapshot"])
            break
    return out


def _last_stream_batch(layout: LakeLayout, state: PipelineState) -> int | None:
    """The last micro-batch Spark committed (its streaming checkpoint's commit log)."""
    from pgcdc.lake.store.state import committed_batch

    return committed_batch(state.checkpoint(layout))


def _when(failure: BatchFailure) -> tuple[str, int]:
    return failure.at, failure.batch


def _failure(layout: LakeLayout, state: PipelineState | None) -> dict[str, Any] | None:
    """The failed batch: the state's, or a newer one a run kept outside the lake because the
    state could not be written (``pgcdc.lake.store.state.save_failure_note``); and whether it stands
    (not applied since)."""
    from pgcdc.lake.store.state import committed_batch, load_failure_note

    failure = None if state is None else state.last_failure
    if state is None:
        return None
    note = load_failure_note(layout, state)
    if note is not None and failure is not None and _when(note.failure) < _when(failure):
        note = None  # the state holds a later failure
    if note is not None:
        failure = note.failure
    if failure is None:
        return None
    committed = committed_batch(state.checkpoint(layout))
    return {
        "batch": failure.batch,
        **_lsn_fields("start_lsn", _parse_lsn(failure.start_lsn)),
        **_lsn_fields("end_lsn", _parse_lsn(failure.end_lsn)),
        "error": failure.error,
        "cause": failure.cause,
        "fix": failure.fix,
        "at": failure.at,
        "first_at": failure.first_at,
        "attempts": failure.attempts,
        "standing": committed is None or committed < failure.batch,
        "kept_outside_lake": None if note is None else str(note.path),
        "state_error": None if note is None else note.state_error,
    }


def collect(config: PipelineConfig, *, now: datetime | None = None) -> dict[str, Any]:
    """Everything ``status`` reports, as a JSON-ready dict; raises ``ReplicationError`` when
    the source cannot be reached and ``StateError`` when the state cannot be read."""
    from pgcdc.lake.store.state import load_state
    from pgcdc.lake.store.tables import LakeLayout
    from pgcdc.replication import SlotNotFoundError, slot_health, slot_info
    from pgcdc.replication.database import connect_sql

    now = now or datetime.now(UTC)
    layout = LakeLayout(config.lake.location())
    state = load_state(layout)
    slot_name = state.slot if state is not None else config.source.slot
    publication = state.publication if state is not None else config.source.publication
    dsn = config.source.resolved_dsn()
    with connect_sql(dsn, connect_timeout=config.source.connect_timeout) as conn:
        info = slot_info(conn, slot_name)
        health = None
        if info is not None:
            try:
                health = slot_health(conn, slot_name)
            except SlotNotFoundError:
                info = None
        row = conn.execute(
            "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_lsn() END::text, "
            "EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)",
            (publication,),
        ).fetchone()
    assert row is not None
    server_lsn = health.server_lsn if health is not None else Lsn.parse(str(row[0]))
    publication_exists = bool(row[1])

    problems: list[str] = []
    warnings: list[str] = []
    fix_lake = f"move the lake {layout.root} away and run pgcdc run again to copy everything"
    if state is None:
        phase = "not started"
    elif state.dropped_at is not None:
        phase = "dropped"
        problems.append(
            f"the pipeline was dropped by pgcdc drop at {state.dropped_at}; the lake "
            f"{layout.root} is kept as it was. To start over, {fix_lake}"
        )
    elif info is None:
        phase = "slot missing"
        problems.append(
            f"slot {slot_name!r} is gone from the source, so the changes since its last "
            f"confirmed position cannot be streamed. Fix: {fix_lake} again"
        )
    elif info.lost:
        phase = "slot invalidated"
        reason = f", invalidation reason {info.invalidation_reason!r}" * bool(
            info.invalidation_reason
        )
        problems.append(
            f"slot {slot_name!r} was invalidated (wal_status {info.wal_status!r}{reason}): the "
            "server removed WAL it still needed. Fix: raise max_slot_wal_keep_size (or keep "
            "pgcdc run running) so it does not happen again; then move the lake away, drop the "
            "slot (pgcdc drop) and run again to copy everything again"
        )
    elif not state.snapshot_done:
        phase = "copying" if info.active else "snapshot unfinished"
    else:
        phase = "running" if info.active else "stopped"
    failure = _failure(layout, state)
    if failure is not None and failure["standing"]:
        if not problems:
            phase = "failing"
        problems.append(_failure_problem(failure))
    if health is not None and not (info is not None and info.lost):
        threshold = config.source.retained_wal_warning
        if health.retained_bytes is not None and health.retained_bytes > threshold:
            warnings.append(
                f"slot {slot_name} retains {health.retained_bytes} bytes of WAL, more than "
                f"source.retained_wal_warning ({threshold}): keep pgcdc run running and check "
                "that it progresses"
            )
        if health.wal_status == "unreserved":
            text = health.warning(threshold)
            if text:
                warnings.append(text)

    tables: list[dict[str, Any]] = []
    if state is not None:
        others = sorted(t for t in state.phases if t not in state.tables)
        tables = [_table_status(layout, t, state) for t in (*state.tables, *others)]
        problems += [
            f"{t['table']} is parked since {t['phase_since']}: {t['parked_reason']}"
            for t in tables
            if t["phase"] == "parked"
        ]
    newest_times = [
        t
        for t in (_parse_time(x["newest_change_time"]) for x in tables if x["mirrored"])
        if t is not None
    ]
    last_applied = max(newest_times) if newest_times else None

    report: dict[str, Any] = {
        "ok": not problems,
        "state": phase,
        "config": None,
        "lake": str(layout.root),
        "checked_at": _iso(now),
        "pipeline": None
        if state is None
        else {
            "id": state.pipeline_id,
            "generation": state.generation,
            "snapshot_done": state.snapshot_done,
            "snapshot_rows": sum(state.snapshot_rows.values()),
            "snapshot_started_at": state.snapshot_started_at,
            **_lsn_fields("consistent_point", _parse_lsn(state.consistent_point)),
            "created_at": state.created_at,
            "updated_at": state.updated_at,
            "dropped_at": state.dropped_at,
            "tables": len(state.tables),
        },
        "slot": {
            "name": slot_name,
            "exists": info is not None,
            "active": None if info is None else info.active,
            "active_pid": None if info is None else info.active_pid,
            "wal_status": None if info is None else info.wal_status,
            "invalidation_reason": None if info is None else info.invalidation_reason,
            **_lsn_fields(
                "confirmed_flush_lsn", None if info is None else info.confirmed_flush_lsn
            ),
            **_lsn_fields("restart_lsn", None if info is None else info.restart_lsn),
            "retained_wal_bytes": None if health is None else health.retained_bytes,
            "safe_wal_size": None if health is None else health.safe_wal_size,
            "max_slot_wal_keep_size": None if health is None else health.max_slot_wal_keep_size,
        },
        "publication": {
            "name": publication,
            "exists": publication_exists,
            "created_by_pgcdc": None if state is None else state.publication_created,
        },
        "server": _lsn_fields("current_wal_lsn", server_lsn),
        "lag": {
            "bytes": None if health is None else health.lag_bytes,
            "seconds": None
            if last_applied is None
            else round(max(0.0, (now - last_applied).total_seconds()), 3),
            "last_applied_commit_time": _iso(last_applied),
        },
        "stream": {
            "last_batch": None if state is None else _last_stream_batch(layout, state),
            "checkpoint": None if state is None else str(state.checkpoint(layout)),
            "last_failure": failure,
        },
        "tables": tables,
        "problems": problems,
        "warnings": warnings,
    }
    return report


def _failure_problem(failure: dict[str, Any]) -> str:
    runs = failure["attempts"]
    since = f" (first at {failure['first_at']})" if runs > 1 else ""
    what = failure["cause"] or failure["error"]
    kept = (
        f" The lake's state could not be written ({failure['state_error']}): this failure "
        f"was kept in {failure['kept_outside_lake']}."
        if failure["kept_outside_lake"]
        else ""
    )
    fix = (
        f"{failure['fix']} (the batch is read again: nothing of it was confirmed to the source)"
        if failure["fix"]
        else "find that batch's error in pgcdc run's log, remove its cause and run pgcdc run "
        "again (the batch is read again: nothing of it was confirmed to the source)"
    )
    return (
        f"batch {failure['batch']} (LSN {failure['start_lsn'] or '-'} to "
        f"{failure['end_lsn'] or '-'}) failed with {what} at {failure['at']}, "
        f"{runs} failed run{'s' * (runs != 1)}{since}, and has not been applied since: the "
        f"slot cannot advance past it and the server keeps its WAL.{kept} Fix: {fix}"
    )


def _parse_lsn(text: str | None) -> Lsn | None:
    return None if not text else Lsn.parse(text)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    from pgcdc.lake.run.monitor import human_size

    return f"{human_size(n)} ({n} bytes)" if n >= 1024 else f"{n} bytes"


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render(report: dict[str, Any], console: Console) -> None:
    """The human form: a summary table, a table of tables, then problems and warnings."""
    slot = report["slot"]
    pipeline = report["pipeline"]
    lag = report["lag"]
    summary = Table(
        title=f"pgcdc status: {report['state']}", title_justify="left", show_header=False
    )
    summary.add_column("what", style="bold")
    summary.add_column("value")
    summary.add_row("lake", report["lake"])
    if pipeline is not None:
        summary.add_row(
            "pipeline",
            f"{pipeline['id']} generation {pipeline['generation']}, snapshot "
            f"{'done' if pipeline['snapshot_done'] else 'not done'} at "
            f"{_show(pipeline['consistent_point'])}",
        )
    active = slot["active"]
    summary.add_row(
        "slot",
        f"{slot['name']}: "
        + (
            "missing"
            if not slot["exists"]
            else ("active, pid " + _show(slot["active_pid"]) if active else "inactive")
            + f", wal_status {_show(slot['wal_status'])}"
            + (
                f", invalidated ({slot['invalidation_reason']})"
                if slot["invalidation_reason"]
                else ""
            )
        ),
    )
    summary.add_row("confirmed flush LSN", _show(slot["confirmed_flush_lsn"]))
    summary.add_row("restart LSN", _show(slot["restart_lsn"]))
    summary.add_row("server WAL LSN", _show(report["server"]["current_wal_lsn"]))
    summary.add_row("retained WAL", _size(slot["retained_wal_bytes"]))
    summary.add_row("lag", f"{_size(lag['bytes'])}, {_show(lag['seconds'])} s")
    summary.add_row("newest change in the lake", _show(lag["last_applied_commit_time"]))
    summary.add_row("last stream batch", _show(report["stream"]["last_batch"]))
    failure = report["stream"]["last_failure"]
    if failure is not None and failure["standing"]:
        summary.add_row(
            "failed batch",
            f"{failure['batch']}, LSN {_show(failure['start_lsn'])} to "
            f"{_show(failure['end_lsn'])}: {failure['cause'] or failure['error']} at "
            f"{failure['at']} ({failure['attempts']} failed run"
            f"{'s' * (failure['attempts'] != 1)})"
            + (
                f", kept in {failure['kept_outside_lake']}: the lake's state could not be written"
                if failure["kept_outside_lake"]
                else ""
            ),
        )
    pub = report["publication"]
    created = pub["created_by_pgcdc"]
    summary.add_row(
        "publication",
        f"{pub['name']} ({'exists' if pub['exists'] else 'missing'}"
        + ("" if created is None else f", {'created by pgcdc' if created else 'pre-existing'}")
        + ")",
    )
    console.print(summary)
    if report["tables"]:
        tables = Table(title="tables", title_justify="left")
        for name, justify in (
            ("table", "left"),
            ("rows", "right"),
            ("last batch", "right"),
            ("last commit", "left"),
            ("newest change", "left"),
            ("version", "right"),
        ):
            tables.add_column(name, justify=justify)  # type: ignore[arg-type]
        for t in report["tables"]:
            batch = t["last_batch"]
            if batch is None and t["snapshot_generation"] is not None:
                batch_text = f"snapshot {t['snapshot_generation']}"
            else:
                batch_text = _show(batch)
            phase = t["phase"]
            tables.add_row(
                t["table"]
                + {
                    "copying": " (being copied)",
                    "catching-up": " (copied; applying its changes since)",
                    "removed": " (removed: no longer mirrored)",
                    "parked": f" (parked at {_show(t['parked_at'])}: not written)",
                }.get(phase, ""),
                _show(t["rows"]),
                batch_text,
                _show(t["last_commit_time"]),
                f"{_show(t['newest_change_lsn'])} {_show(t['newest_change_time'])}"
                if t["exists"]
                else "no table yet",
                _show(t["delta_version"]),
            )
        console.print(tables)
    for problem in report["problems"]:
        console.print(f"problem: {problem}", style="red", highlight=False, markup=False)
    for warning in report["warnings"]:
        console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
    if report["state"] == "not started":
        console.print(
            "not started: the lake has no pipeline state yet (pgcdc run starts it)",
            highlight=False,
            markup=False,
        )


def run(args: argparse.Namespace) -> int:
    from pgcdc.lake.config import ConfigError, load_config
    from pgcdc.lake.store.state import StateError
    from pgcdc.replication import ReplicationError, scrub_secrets

    err = Console(stderr=True)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        err.print(str(exc), style="red", highlight=False, markup=False)
        return 2
    try:
        report = collect(config)
    except ConfigError as exc:
        err.print(str(exc), style="red", highlight=False, markup=False)
        return 2
    except (ReplicationError, StateError) as exc:
        message = f"pgcdc status: {scrub_secrets(str(exc))}"
        if args.json:
            print(json.dumps({"ok": False, "error": message}, sort_keys=True))
        err.print(message, style="red", highlight=False, markup=False)
        return 1
    report["config"] = str(args.config)
    if not args.json:
        out = Console(width=None if sys.stdout.isatty() else 160)
        render(report, out)
    else:
        sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
        sys.stdout.flush()
        for problem in report["problems"]:
            err.print(f"pgcdc status: {problem}", style="red", highlight=False, markup=False)
    return 0 if report["ok"] else 1
