"""``pgcdc drop``: remove what a pipeline created on the source, after confirmation.

It drops the pipeline's replication slot, and its publication only if pgcdc created it (the
lake's state records that; a publication that existed before, or any publication of a lake
whose state predates that record, is kept), and nothing else: no other slot or publication,
and never the lake's files (it says where they are). ``--keep-publication`` keeps the
publication as well. ``--catalog`` also removes from the catalog (``[catalog]``) the names
pgcdc registered for the lake's tables, and the databases it created that are left empty; a
name that points elsewhere by then, or that pgcdc did not register, stays. The tables' files
stay either way.

It first prints exactly what it will drop, then asks to type the slot's name; ``--yes`` skips
the question, and without ``--yes`` it refuses when stdin is not a terminal. A slot in use (a
``pgcdc run`` is streaming from it) is an error unless ``--force``, which terminates that
walsender first.

``--table schema.table`` (repeatable) drops one table's lake data instead, and nothing on the
source: the Delta tables (mirror, history, changelog) and key indexes of a table that left the
pipeline (``pgcdc status`` lists it as removed; a table still mirrored or parked is refused:
take it out of ``[[tables]]`` and run once first), its phase in the state, and with
``--catalog`` the names pgcdc registered for it. It needs the lake to itself: a running ``pgcdc
run`` must be stopped first.

Afterwards the lake's state records the drop (``dropped_at``): a later ``pgcdc run`` on that
lake fails with a message saying the slot is gone and to move the lake away to start over, so
it never copies everything again into a lake that holds the old tables.

Exit codes: 0 dropped (or nothing left to drop); 1 a runtime error (slot in use without
``--force``, server unreachable, permission denied), or the confirmation did not match; 2 bad
usage (no ``--yes`` and stdin is not a terminal, a bad configuration, or a lake whose state
names another slot than the configuration).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:  # the lake is imported when the command runs
    from pgcdc.lake.store.state import PipelineState
    from pgcdc.lake.store.tables import LakeLayout

log = logging.getLogger("pgcdc.drop")

NAME = "drop"


def register(sub: Any) -> tuple[str, Callable[[argparse.Namespace], int]]:
    p = sub.add_parser(
        NAME,
        help="drop the slot and publication a pipeline created (pipeline.toml), after asking",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, type=Path, help="the pipeline.toml file")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--keep-publication",
        action="store_true",
        help="drop only the slot, keep the publication even if pgcdc created it",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="terminate the walsender using the slot (a running pgcdc run) before dropping it",
    )
    p.add_argument(
        "--catalog",
        action="store_true",
        help="also remove from the catalog the lake tables pgcdc registered there ([catalog]); "
        "their files are kept",
    )
    p.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="TABLE",
        help="drop only this removed table's lake data (schema.table, as status names it; "
        "repeatable): its Delta tables and key indexes; the slot and publication stay",
    )
    return NAME, run


def _say(console: Console, text: str, style: str | None = None) -> None:
    console.print(text, style=style, highlight=False, markup=False)


def run(args: argparse.Namespace) -> int:
    from pgcdc.lake.config import ConfigError, load_config
    from pgcdc.lake.store.state import StateError, run_lock
    from pgcdc.lake.store.tables import LakeLayout
    from pgcdc.replication.slot import ACTIVE_WAIT_SECONDS

    console = Console(stderr=True)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        _say(console, str(exc), "red")
        return 2
    layout = LakeLayout(config.lake.location())
    if args.table:
        if args.force or args.keep_publication:
            _say(
                console,
                "pgcdc drop: --table drops no slot: --force and --keep-publication "
                "do not apply (nothing was dropped)",
                "red",
            )
            return 2
        try:
            with run_lock(layout, what="pgcdc drop --table"):
                return _drop_tables(args, config, layout, console)
        except StateError as exc:  # a run holds the lake
            _say(console, f"pgcdc drop: {exc}; stop it first (nothing was dropped)", "red")
            return 1
    if not layout.state_dir.is_dir():  # no run ever held this lake: nothing to lock
        return _drop(args, config, layout, console)
    with contextlib.ExitStack() as stack:
        # a run stopping right now (a service stopped, then dropped) lets go in a while
        deadline = time.monotonic() + (0 if args.force else ACTIVE_WAIT_SECONDS)
        while True:
            try:
                stack.enter_context(run_lock(layout, what="pgcdc drop"))
                break
            except StateError as exc:  # a run holds the lake: its slot may look idle (a copy)
                if time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                if not args.force:
                    _say(
                        console,
                        f"pgcdc drop: {exc}; or pass --force to drop under it (nothing was "
                        "dropped)",
                        "red",
                    )
                    return 1
                _say(console, f"pgcdc drop: {exc}; dropping under it (--force)")
                break
        return _drop(args, config, layout, console)


def _drop(args: argparse.Namespace, config: Any, layout: Any, console: Console) -> int:
    from pgcdc.lake.config import ConfigError
    from pgcdc.lake.store.metastore import CatalogError, Registrar
    from pgcdc.lake.store.state import StateError, load_state
    from pgcdc.replication import (
        ReplicationError,
        drop_publication,
        drop_slot,
        scrub_secrets,
        slot_info,
    )
    from pgcdc.replication.database import connect_sql, server_name
    from pgcdc.replication.slot import ACTIVE_WAIT_SECONDS, wait_for_release

    try:
        state = load_state(layout)
    except StateError as exc:
        _say(console, f"pgcdc drop: {exc}", "red")
        return 1
    slot = config.source.slot
    publication = config.source.publication
    if state is not None and (state.slot != slot or state.publication != publication):
        _say(
            console,
            f"pgcdc drop: the lake {layout.root} belongs to a pipeline with slot {state.slot!r} "
            f"and publication {state.publication!r}, but the configuration names {slot!r} and "
            f"{publication!r}: fix source.slot / source.publication (nothing was dropped)",
            "red",
        )
        return 2
    try:
        dsn = config.source.resolved_dsn()
        with connect_sql(dsn, connect_timeout=config.source.connect_timeout) as conn:
            server = server_name(conn)
            info = slot_info(conn, slot)
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)",
                (publication,),
            ).fetchone()
            publication_exists = bool(row and row[0])
            created = state is not None and state.publication_created
            drop_pub = publication_exists and created and not args.keep_publication

            plan: list[str] = []
            keep: list[str] = []
            if info is not None:
                use = (
                    f", in use by process {info.active_pid}"
                    if info.active and info.active_pid is not None
                    else ""
                )
                plan.append(f"replication slot {slot} on {server}{use}")
            else:
                keep.append(f"replication slot {slot}: not on {server} (nothing to drop)")
            if drop_pub:
                plan.append(f"publication {publication} (created by pgcdc)")
            elif not publication_exists:
                keep.append(f"publication {publication}: does not exist")
            elif args.keep_publication:
                keep.append(f"publication {publication}: kept (--keep-publication)")
            elif state is None:
                keep.append(
                    f"publication {publication}: kept (the lake has no pipeline state, so "
                    "pgcdc cannot tell it created it; DROP PUBLICATION it yourself if so)"
                )
            else:
                keep.append(f"publication {publication}: kept (it existed before the pipeline)")
            names = [str(r.name) for r in Registrar(layout, []).recorded()]
            if names and args.catalog:
                plan.append(f"from the catalog: {', '.join(names)} (registered by pgcdc)")
            elif names:
                keep.append(f"in the catalog: {', '.join(names)}: kept (--catalog removes them)")
            keep.append(f"the lake {layout.root}: kept (delete the folder yourself if unwanted)")

            if not plan:
                _say(console, "pgcdc drop: nothing to drop")
                for line in keep:
                    _say(console, f"  {line}")
                _mark_dropped(state, layout, dropped=False)
                return 0
            _say(console, "pgcdc drop will drop:")
            for line in plan:
                _say(console, f"  {line}", "bold")
            _say(console, "and keep:")
            for line in keep:
                _say(console, f"  {line}")
            if not args.force:
                info = wait_for_release(conn, slot, ACTIVE_WAIT_SECONDS, info)
            if info is not None and info.active and not args.force:
                _say(
                    console,
                    f"pgcdc drop: replication slot {slot} is in use by process "
                    f"{info.active_pid} (a running pgcdc run?): stop it first, or pass --force to "
                    "terminate that walsender (nothing was dropped)",
                    "red",
                )
                return 1
            if not args.yes:
                if not sys.stdin.isatty():
                    _say(
                        console,
                        "pgcdc drop: stdin is not a terminal, so it cannot ask for "
                        "confirmation: pass --yes to drop without asking (nothing was dropped)",
                        "red",
                    )
                    return 2
                console.print(f"type the slot name ({slot}) to confirm: ", end="")
                answer = sys.stdin.readline().strip()
                if answer != slot:
                    _say(console, "pgcdc drop: not confirmed, nothing was dropped", "red")
                    return 1
            if info is not None:
                dropped = drop_slot(conn, slot, terminate_active=args.force, missing_ok=True)
                log.info("dropped replication slot %s", slot, extra={"slot": slot})
                _say(console, f"dropped replication slot {slot}" if dropped else "slot gone")
            if drop_pub:
                drop_publication(conn, publication, missing_ok=True)
                log.info("dropped publication %s", publication, extra={"publication": publication})
                _say(console, f"dropped publication {publication}")
        if names and args.catalog:
            for line in _unregister(config, layout):
                _say(console, line)
    except ConfigError as exc:
        _say(console, str(exc), "red")
        return 2
    except (ReplicationError, CatalogError) as exc:
        _say(console, f"pgcdc drop: {scrub_secrets(str(exc))}", "red")
        return 1
    _mark_dropped(state, layout, dropped=True)
    if state is not None:
        _say(
            console,
            f"the lake {layout.root} is kept; pgcdc run refuses to use it again (move it away "
            "to start over)",
        )
    return 0


def _drop_tables(args: argparse.Namespace, config: Any, layout: Any, console: Console) -> int:
    """``--table``: the removed tables' lake data, after confirmation (see the module doc)."""
    from pgcdc.lake.store.metastore import CatalogError, Registrar
    from pgcdc.lake.store.state import StateError, load_state, save_state
    from pgcdc.lake.store.storage import StorageError

    try:
        state = load_state(layout)
    except StateError as exc:
        _say(console, f"pgcdc drop: {exc}", "red")
        return 1
    if state is None:
        _say(console, f"pgcdc drop: the lake {layout.root} holds no pipeline", "red")
        return 2
    folders: dict[str, list[Any]] = {}
    for table_id in dict.fromkeys(args.table):
        phase = state.phases.get(table_id)
        if table_id in state.tables or (phase is not None and phase.phase != "removed"):
            how = "parked" if phase is not None and phase.phase == "parked" else "mirrored"
            _say(
                console,
                f"pgcdc drop: {table_id} is still {how}: take it out of [[tables]] (or out of "
                "its pattern's reach), run pgcdc run once, then drop it (nothing was dropped)",
                "red",
            )
            return 2
        if phase is None:
            _say(
                console,
                f"pgcdc drop: the lake holds no table {table_id} (pgcdc status lists the "
                "removed ones; nothing was dropped)",
                "red",
            )
            return 2
        paths = [layout.table_path(phase.schema, phase.name, k) for k in KINDS]
        folders[table_id] = [
            p for p in (*paths, *(layout.state_dir / "index" / p.key for p in paths)) if p.is_dir()
        ]
    registered = [r for r in Registrar(layout, []).recorded() if r.table_id in folders]
    _say(console, "pgcdc drop will delete:")
    for table_id, paths in folders.items():
        for path in paths:
            _say(console, f"  {path} ({table_id})", "bold")
    if registered and args.catalog:
        names = ", ".join(str(r.name) for r in registered)
        _say(console, f"  from the catalog: {names} (registered by pgcdc)", "bold")
    _say(console, "and keep:")
    if registered and not args.catalog:
        names = ", ".join(str(r.name) for r in registered)
        _say(console, f"  in the catalog: {names} (--catalog removes them)")
    _say(console, f"  the slot {state.slot}, the publication and every other table")
    if not args.yes:
        if not sys.stdin.isatty():
            _say(
                console,
                "pgcdc drop: stdin is not a terminal, so it cannot ask for confirmation: pass "
                "--yes to drop without asking (nothing was dropped)",
                "red",
            )
            return 2
        wanted = " ".join(folders)
        console.print(f"type {wanted} to confirm: ", end="")
        if sys.stdin.readline().strip() != wanted:
            _say(console, "pgcdc drop: not confirmed, nothing was dropped", "red")
            return 1
    try:
        if registered and args.catalog:
            for line in _unregister(config, layout, tables=list(folders)):
                _say(console, line)
        for table_id, paths in folders.items():
            for path in paths:  # a drop stopped half-way: the state still names the table
                path.remove_tree()
            log.info("dropped the lake data of %s", table_id, extra={"table": table_id})
            _say(console, f"dropped the lake data of {table_id}")
    except (StorageError, CatalogError) as exc:
        _say(console, f"pgcdc drop: {exc}", "red")
        return 1
    state = load_state(layout) or state
    save_state(
        layout, state.evolve(phases={t: p for t, p in state.phases.items() if t not in folders})
    )
    return 0


#: a table's Delta tables, each with its folder (``LakeLayout.table_path``)
KINDS = ("mirror", "history", "changelog")


def _unregister(config: Any, layout: Any, *, tables: list[str] | None = None) -> list[str]:
    """Remove what pgcdc registered from the catalog, in a Spark session with the pipeline's
    catalog settings (those of ``[catalog]`` with its defaults when the file has none now)."""
    from pgcdc.lake.config import CatalogSettings
    from pgcdc.lake.run.pipeline import session_conf
    from pgcdc.lake.store.metastore import Registrar
    from pgcdc.spark import spark_session

    if config.catalog is None:
        config = config.model_copy(update={"catalog": CatalogSettings()})
    spark = spark_session(
        master=config.spark.master, app_name=config.spark.app_name, conf=session_conf(config)
    )
    try:
        return Registrar(layout, []).unregister(spark, tables=tables)
    finally:
        spark.stop()


def _mark_dropped(state: PipelineState | None, layout: LakeLayout, *, dropped: bool) -> None:
    """Record the drop in the lake's state (a later run then refuses to copy into it)."""
    from pgcdc.lake.store.state import save_state

    if state is None or state.dropped_at is not None:
        return
    if not dropped and not state.snapshot_done and state.consistent_point is None:
        return  # no slot was ever created for this state
    save_state(layout, state.evolve(dropped_at=datetime.now(UTC).isoformat(timespec="seconds")))
