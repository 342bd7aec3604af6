"""``pgcdc run``: mirror PostgreSQL tables into Delta Lake tables, as ``pipeline.toml`` says.

The first start creates the publication (with its row filters) and the slot, copies the tables
in parallel and then streams; later starts resume where the last one stopped. With
``--until-caught-up`` it applies everything committed up to the moment it started and exits 0
(for scheduled runs and tests); otherwise it runs until interrupted (Ctrl-C stops it after the
current batch). ``--check`` validates the configuration against the source and exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich.console import Console

from pgcdc.lsn import Lsn

if TYPE_CHECKING:  # the lake (Spark, delta-rs, pyarrow) is imported when the command runs
    from pgcdc.lake.pipeline import Pipeline

log = logging.getLogger("pgcdc.run")

NAME = "run"


def register(sub: Any) -> tuple[str, Callable[[argparse.Namespace], int]]:
    p = sub.add_parser(
        NAME,
        help="mirror PostgreSQL tables into Delta Lake tables (pipeline.toml)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, type=Path, help="the pipeline.toml file")
    p.add_argument(
        "--until-caught-up",
        action="store_true",
        help="apply everything committed up to the WAL position at start, then exit 0",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the configuration against the source and the lake, create nothing",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="after an --until-caught-up run, compare every mirror with its source table",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return NAME, run


class _Ticker:
    """Prints a progress line every few seconds while the stream runs."""

    def __init__(self, pipeline: Pipeline, console: Console, every: float = 5.0) -> None:
        self.pipeline = pipeline
        self.console = console
        self.every = every
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pgcdc-progress", daemon=True)

    def start(self, _pipeline: Pipeline) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()

    def _loop(self) -> None:
        shown = -1
        while not self._done.wait(self.every):
            progress = self.pipeline.progress
            if progress is None or progress.batches == shown:
                continue
            shown = progress.batches
            last = progress.last
            lsn = "" if last is None or last.max_lsn is None else f", at {Lsn(last.max_lsn)}"
            self.console.print(
                f"[dim]{time.strftime('%H:%M:%S')}[/dim] {progress.batches} batches, "
                f"{progress.changes} changes applied{lsn}"
            )


def run(args: argparse.Namespace) -> int:
    from pgcdc.lake.config import ConfigError, load_config
    from pgcdc.lake.pipeline import Pipeline, PipelineError
    from pgcdc.lake.schema_evolution import SchemaEvolutionError
    from pgcdc.lake.state import StateError
    from pgcdc.lake.verify import compare_tables
    from pgcdc.replication import ReplicationError, scrub_secrets

    console = Console(stderr=True, quiet=args.quiet)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        return 2
    pipeline = Pipeline(config)
    try:
        plan = pipeline.check()
        if args.check:
            console.print(
                f"configuration OK: {len(plan.tables)} tables "
                f"({', '.join(t.table_id for t in plan.tables)}), "
                f"{'resuming' if pipeline.state else 'first start'}"
            )
            return 0
        console.print(f"pgcdc run: {config.describe()}", highlight=False)
        ticker = _Ticker(pipeline, console)
        previous = signal.getsignal(signal.SIGINT)

        def interrupt(signum: int, frame: FrameType | None) -> None:
            console.print("stopping after the current batch ...")
            pipeline.stop()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, interrupt)
        try:
            result = pipeline.run(until_caught_up=args.until_caught_up, on_started=ticker.start)
        finally:
            ticker.stop()
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, previous)
        if result.snapshot_rows:
            console.print(
                f"snapshot: {sum(result.snapshot_rows.values())} rows of "
                f"{len(result.snapshot_rows)} tables in {result.snapshot_seconds:.1f} s"
            )
        console.print(
            f"stream: {result.batches} batches, {result.changes} changes"
            + (f", {result.restarts} restarts for schema changes" if result.restarts else "")
        )
        if args.verify:
            checks = compare_tables(pipeline.dsn, pipeline.layout, plan.tables)
            for check in checks:
                console.print(check.describe(), highlight=False)
            if not all(c.equal for c in checks):
                return 1
        return 0
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        return 2
    except (
        PipelineError,
        ReplicationError,
        StateError,
        SchemaEvolutionError,
    ) as exc:
        console.print(f"[red]pgcdc run: {scrub_secrets(str(exc))}[/red]", highlight=False)
        return 1
