"""``pgcdc run``: mirror PostgreSQL tables into Delta Lake tables, as ``pipeline.toml`` says.

The first start creates the publication (with its row filters) and the slot, copies the tables
in parallel and then streams; later starts copy the tables added to the configuration since
(and stop mirroring the ones removed), then resume where the last one stopped. With
``--until-caught-up`` it applies everything committed up to the moment it started and exits 0
(for scheduled runs and tests); otherwise it runs until interrupted: Ctrl-C or SIGTERM stops
it after the current batch (or the initial copy) and it exits 0; a second Ctrl-C stops it at
once (exit 130; the next start reads that batch again). ``--check`` validates the
configuration against the source, says which tables the next run would add or stop mirroring,
and exits, creating nothing.

Progress: on a terminal, rich progress bars for the snapshot (tables copied, rows) and the
stream (WAL bytes from the slot's position to the server's, batches, changes/s); otherwise a
plain line at most every few seconds; nothing with ``--quiet``. With ``pgcdc --log-format
json`` every message and progress line is a log record (logger ``pgcdc.run``, INFO) instead.
Exit codes: 0 done, 1 runtime error (slot gone or invalidated, failed stream, mirrors differ
after ``--verify``), 2 bad configuration.
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
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from pgcdc.lsn import Lsn

if TYPE_CHECKING:  # the lake (Spark, delta-rs, pyarrow) is imported when the command runs
    from pgcdc.lake.results import BatchResult
    from pgcdc.replication import SlotHealth

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


class _Output:
    """Where the command's messages go: the console, or log records in JSON log mode."""

    def __init__(self, console: Console, *, json_logs: bool, quiet: bool) -> None:
        self.console = console
        self.json_logs = json_logs
        self.quiet = quiet

    def say(self, text: str, *, level: int = logging.INFO, **extra: Any) -> None:
        if self.json_logs:
            log.log(level, "%s", text, extra=extra)
        elif not self.quiet or level >= logging.ERROR:
            style = "red" if level >= logging.ERROR else None
            self.console.print(text, style=style, highlight=False, markup=False)


def _size(n: float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


class _Display:
    """The run's progress (a ``pgcdc.lake.run.monitor.Observer``): rich bars on a terminal, else
    plain lines (or log records) at most every ``every`` seconds, or nothing when quiet."""

    def __init__(self, out: _Output, every: float = 5.0) -> None:
        self.out = out
        self.every = every
        self.mode = (
            "none"
            if out.quiet
            else "log"
            if out.json_logs
            else "rich"
            if out.console.is_terminal
            else "lines"
        )
        self._lock = threading.Lock()
        self._bars: Progress | None = None
        self._snapshot_task: TaskID | None = None
        self._stream_task: TaskID | None = None
        self._last_line = 0.0
        # snapshot
        self.copying = False
        self.tables = 0
        self.tables_done = 0
        self.rows_read: int | None = None
        self.rows = 0
        # stream
        self.streaming = False
        self.until_caught_up = False
        self.start: int | None = None
        self.target: int | None = None
        self.applied: int | None = None
        self.batches = 0
        self.changes = 0
        self._t0 = 0.0
        self.lag_bytes: int | None = None

    # -- RunObserver ------------------------------------------------------------------------
    def snapshot_started(self, tables: int, consistent_point: Lsn) -> None:
        with self._lock:
            self.copying = True
            self.tables = tables
        if self.mode == "rich":
            bars = self._ensure_bars()
            self._snapshot_task = bars.add_task("snapshot", total=tables, info="reading")
        self._show(force=True)

    def snapshot_progress(self, table: str | None, rows: int) -> None:
        with self._lock:
            if table is None:
                self.rows_read = rows
            else:
                self.tables_done += 1
                self.rows += rows
        self._show()

    def snapshot_finished(self, rows: int, seconds: float) -> None:
        with self._lock:
            self.rows = rows
            self.tables_done = self.tables
        self._show(force=True)

    def stream_started(self, start: Lsn | None, target: Lsn | None, until_caught_up: bool) -> None:
        with self._lock:
            self.streaming = True
            self.until_caught_up = until_caught_up
            self.start = None if start is None else int(start)
            self.target = None if target is None else int(target)
            self.applied = self.start
            self._t0 = time.monotonic()
        if self.mode == "rich":
            bars = self._ensure_bars()
            self._stream_task = bars.add_task(
                "catch-up" if until_caught_up else "stream", total=None, info="starting"
            )
        self._show(force=True)

    def batch_done(self, result: BatchResult) -> None:
        with self._lock:
            self.batches += 1
            self.changes += result.changes
            if result.max_lsn is not None:
                self.applied = max(self.applied or 0, result.max_lsn)
        self._show()

    def slot_checked(self, health: SlotHealth) -> None:
        with self._lock:
            if health.confirmed_flush_lsn is not None and self.streaming:
                self.applied = max(self.applied or 0, int(health.confirmed_flush_lsn))
            if not self.until_caught_up and self.streaming:
                self.target = max(self.target or 0, int(health.server_lsn))
            self.lag_bytes = health.lag_bytes
        self._show()

    def finished(self) -> None:
        bars, self._bars = self._bars, None
        if bars is not None:
            self._refresh(bars)
            bars.stop()

    # -- rendering ----------------------------------------------------------------------------
    def _ensure_bars(self) -> Progress:
        if self._bars is None:
            self._bars = Progress(
                SpinnerColumn(),
                TextColumn("{task.description:<9}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=self.out.console,
                refresh_per_second=4,
            )
            self._bars.start()
        return self._bars

    def _stream_numbers(self) -> tuple[int | None, int, float, str]:
        """(total bytes, done bytes, changes/s, position)"""
        total = None
        done = 0
        if self.start is not None and self.target is not None:
            total = max(0, self.target - self.start)
        if self.start is not None and self.applied is not None:
            done = max(0, self.applied - self.start)
            if total is not None:
                done = min(done, total)
        elapsed = max(time.monotonic() - self._t0, 1e-6)
        rate = self.changes / elapsed
        at = "-" if self.applied is None else str(Lsn(self.applied))
        return total, done, rate, at

    def _refresh(self, bars: Progress) -> None:
        with self._lock:
            if self._snapshot_task is not None:
                read = "" if self.rows_read is None else f" of {self.rows_read}"
                bars.update(
                    self._snapshot_task,
                    completed=self.tables_done,
                    info=f"{self.tables_done}/{self.tables} tables, {self.rows}{read} rows",
                )
            if self._stream_task is not None:
                total, done, rate, at = self._stream_numbers()
                bars.update(
                    self._stream_task,
                    total=total if total else None,
                    completed=done,
                    info=f"{_size(done)} of {_size(total or 0)} WAL, {self.batches} batches, "
                    f"{self.changes} changes, {rate:.0f}/s, at {at}",
                )

    def _line(self) -> tuple[str, dict[str, Any]]:
        with self._lock:
            if not self.streaming and not self.copying:  # the slot checked before the stream
                return "starting the stream", {}
            if not self.streaming:
                read = "" if self.rows_read is None else f" ({self.rows_read} rows read)"
                return (
                    f"snapshot: {self.tables_done}/{self.tables} tables copied, "
                    f"{self.rows} rows{read}",
                    {"tables": self.tables_done, "rows": self.rows},
                )
            total, done, rate, at = self._stream_numbers()
            what = "catch-up" if self.until_caught_up else "stream"
            share = f" {100 * done / total:.0f}%" if total else ""
            lag = "" if self.lag_bytes is None else f", lag {_size(self.lag_bytes)}"
            return (
                f"{what}{share} ({_size(done)} of {_size(total or 0)} WAL), {self.batches} "
                f"batches, {self.changes} changes, {rate:.0f} changes/s, at {at}{lag}",
                {
                    "batches": self.batches,
                    "changes": self.changes,
                    "lsn": at,
                    "done_bytes": done,
                    "total_bytes": total,
                    "lag_bytes": self.lag_bytes,
                },
            )

    def _show(self, *, force: bool = False) -> None:
        if self.mode == "none":
            return
        if self.mode == "rich":
            if self._bars is not None:
                self._refresh(self._bars)
            return
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_line < self.every:
                return
            self._last_line = now
        text, extra = self._line()
        if self.mode == "log":
            log.info("progress: %s", text, extra=extra)
        else:
            self.out.console.print(
                f"{time.strftime('%H:%M:%S')} {text}", highlight=False, markup=False
            )


def run(args: argparse.Namespace) -> int:
    from pgcdc.lake.config import ConfigError, load_config
    from pgcdc.lake.results import PipelineError
    from pgcdc.lake.run.pipeline import Pipeline
    from pgcdc.lake.run.verify import compare_tables
    from pgcdc.lake.store.metastore import CatalogError
    from pgcdc.lake.store.state import StateError
    from pgcdc.lake.write.schema_evolution import SchemaEvolutionError
    from pgcdc.replication import ReplicationError, scrub_secrets

    console = Console(stderr=True)
    out = _Output(
        console, json_logs=getattr(args, "log_format", "text") == "json", quiet=args.quiet
    )
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        out.say(str(exc), level=logging.ERROR)
        return 2
    display = _Display(out)
    stopping = (signal.SIGINT, signal.SIGTERM)
    main = threading.current_thread() is threading.main_thread()
    asked: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if asked and signum == signal.SIGINT:
            # a second Ctrl-C: stop now (the batch in progress is read again next time)
            raise KeyboardInterrupt
        asked.append(signum)
        again = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
        out.say(f"{signal.Signals(signum).name}: stopping after the current batch ...{again}")
        pipeline.stop()

    def handle_signals(spark: Any = None) -> None:
        # pyspark's SparkContext installs its own SIGINT handler when it starts (it cancels
        # every running job and raises KeyboardInterrupt): installed again once Spark runs
        if main:
            for signum in stopping:
                signal.signal(signum, interrupt)

    pipeline = Pipeline(config, observer=display, on_spark=handle_signals)
    try:
        plan = pipeline.check()
        if args.check:
            from pgcdc.lake.run.bootstrap import start_point
            from pgcdc.lake.store.state import check_writable

            # what run would refuse at start (a dropped, lost or foreign slot); reads only
            start_point(config, pipeline.state, pipeline.dsn)
            # and a lake it cannot write: a probe file under _pgcdc/, removed again
            check_writable(pipeline.layout)
            changes = pipeline.changes
            out.say(
                f"configuration OK: {len(plan.tables)} tables "
                f"({', '.join(t.table_id for t in plan.tables)}), "
                f"{'resuming' if pipeline.state else 'first start'}"
                + (f"; the next run would {changes.describe()}" if changes else ""),
                tables=len(plan.tables),
                added=[t.table_id for t in changes.added],
                removed=list(changes.removed),
            )
            return 0
        out.say(f"pgcdc run: {config.describe()}", slot=config.source.slot)
        # Ctrl-C, and SIGTERM (systemd, docker, Kubernetes stopping the service): stop after
        # the batch in progress, so that the process exits normally (its exit hooks run)
        previous = {signum: signal.getsignal(signum) for signum in stopping}
        handle_signals()
        try:
            result = pipeline.run(until_caught_up=args.until_caught_up)
        finally:
            if main:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
        if result.snapshot_rows:
            out.say(
                f"snapshot: {sum(result.snapshot_rows.values())} rows of "
                f"{len(result.snapshot_rows)} tables in {result.snapshot_seconds:.1f} s",
                rows=sum(result.snapshot_rows.values()),
                tables=len(result.snapshot_rows),
            )
        if result.added_rows:
            out.say(
                f"added tables: {sum(result.added_rows.values())} rows of "
                f"{', '.join(sorted(result.added_rows))} copied",
                rows=sum(result.added_rows.values()),
                tables=sorted(result.added_rows),
            )
        if result.removed:
            out.say(
                f"removed tables: {', '.join(result.removed)} no longer mirrored (their lake "
                "tables are kept)",
                tables=list(result.removed),
            )
        out.say(
            f"stream: {result.batches} batches, {result.changes} changes"
            + (f", {result.restarts} restarts for schema changes" if result.restarts else ""),
            batches=result.batches,
            changes=result.changes,
        )
        state = pipeline.state
        parked = {} if state is None else state.parked()
        for table_id, phase in sorted(parked.items()):
            out.say(
                f"parked: {table_id} is not written since {phase.parked_at}: {phase.reason}",
                level=logging.ERROR,
                table=table_id,
            )
        if args.verify:
            mirrored = [t for t in (pipeline.plan or plan).tables if t.table_id not in parked]
            checks = compare_tables(pipeline.dsn, pipeline.layout, mirrored)
            for check in checks:
                out.say(
                    check.describe(),
                    level=logging.INFO if check.equal else logging.ERROR,
                    table=check.table_id,
                )
            if not all(c.equal for c in checks):
                return 1
        # a table not written is not caught up: a scheduled run must not look fine
        return 1 if parked and args.until_caught_up else 0
    except ConfigError as exc:
        out.say(str(exc), level=logging.ERROR)
        return 2
    except (
        CatalogError,
        PipelineError,
        ReplicationError,
        StateError,
        SchemaEvolutionError,
    ) as exc:
        out.say(f"pgcdc run: {scrub_secrets(str(exc))}", level=logging.ERROR)
        return 1
