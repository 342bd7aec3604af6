"""Operating a running pipeline: the Prometheus endpoint, heartbeats on an idle database, the
retained-WAL warning, an invalidated slot (a clear error, never a silent copy), and the progress
lines ``pgcdc run`` prints when stderr is not a terminal."""

from __future__ import annotations

import io
import logging
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from pgcdc.cli import main
from pgcdc.cli.throwaway_server import free_port
from pgcdc.lake.config import load_config
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lsn import Lsn
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_pipeline import Background
from tests.lake.test_drop import lake_files
from tests.lake.test_status import write_config


def wait_for(what: str, predicate: Callable[[], bool], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def confirmed(pg: PgDatabase) -> Lsn:
    rows = pg.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'ops_slot'"
    )
    return Lsn.parse(str(rows[0][0]))


@pytest.mark.slow
@newest_server
def test_metrics_and_heartbeats_while_running(
    pg: PgDatabase, spark: Any, tmp_path: Path, background: Callable[..., Background]
) -> None:
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    pg.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 10) g")
    port = free_port()
    config = load_config(
        write_config(
            tmp_path,
            pg.dsn(),
            source='heartbeat_interval = 1\nheartbeat = "table"\n'
            'heartbeat_table = "public.ops_heartbeat"\nhealth_check_interval = 1',
            extra=f"[metrics]\nport = {port}\n\n[stream]\ntrigger_interval = 1",
        )
    )
    pipeline = Pipeline(config, spark=spark)
    run = background(pipeline).start()
    try:
        assert pipeline.metrics_port == port
        pg.execute("INSERT INTO items VALUES (11, 1), (12, 2), (13, 3)")
        pg.execute("UPDATE items SET qty = -qty WHERE id IN (1, 2)")
        pg.execute("DELETE FROM items WHERE id = 3")
        labels = (("slot", "ops_slot"),)

        def changes(op: str) -> float:
            key = ("pgcdc_changes_total", (("op", op), *labels, ("table", "public.items")))
            return scrape(port).get(key, 0.0)

        wait_for("the changes in the metrics", lambda: changes("D") == 1.0)
        metrics = scrape(port)
        assert changes("I") == 3.0 and changes("U") == 2.0
        assert metrics[("pgcdc_batch_duration_seconds_count", labels)] >= 1
        assert metrics[("pgcdc_batches_total", labels)] >= 1
        assert metrics[("pgcdc_lag_bytes", labels)] >= 0
        assert 0 <= metrics[("pgcdc_lag_seconds", labels)] < 120
        assert metrics[("pgcdc_retained_wal_bytes", labels)] > 0
        assert metrics[("pgcdc_confirmed_lsn", labels)] > 0

        # idle: nothing published changes; the heartbeat (an unpublished table) writes WAL
        # in this database and the slot is confirmed past it
        def beat() -> object:
            return pg.execute("SELECT beat FROM public.ops_heartbeat")[0][0]

        wait_for(
            "a heartbeat",
            lambda: bool(pg.execute("SELECT 1 FROM pg_tables WHERE tablename = 'ops_heartbeat'")),
        )
        first = beat()
        wait_for("the next heartbeat", lambda: beat() != first, timeout=30)
        after_beat = Lsn.parse(str(pg.execute("SELECT pg_current_wal_lsn()::text")[0][0]))
        wait_for("the slot to pass the heartbeat", lambda: confirmed(pg) >= after_beat, 60)
        assert pipeline.heartbeat is not None and pipeline.heartbeat.beats >= 2
        assert pipeline.monitor is not None and pipeline.monitor.checks >= 2
    finally:
        run.stop(120)
    assert not run.thread.is_alive() and not run.failures, run.failures
    with pytest.raises(OSError):  # the endpoint is gone with the run
        scrape(port)


@pytest.mark.slow
def test_retained_wal_warning_then_invalidated_slot(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    pg.execute("CREATE TABLE filler (id serial PRIMARY KEY, pad text)")
    pg.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 10) g")
    config = write_config(tmp_path, pg.dsn(), source='retained_wal_warning = "64kB"')
    argv = ["run", "--config", str(config), "--until-caught-up"]
    assert main(argv) == 0
    # WAL piles up while the pipeline is not running
    pg.execute("INSERT INTO filler (pad) SELECT repeat('x', 200) FROM generate_series(1, 3000)")
    (retained,) = pg.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
        "FROM pg_replication_slots WHERE slot_name = 'ops_slot'"
    )[0]
    assert int(str(retained)) > 64 * 1024
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="pgcdc.lake")
    assert main(argv) == 0
    warnings = [r for r in caplog.records if "retains" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    text = warnings[0].getMessage()
    assert warnings[0].levelno == logging.WARNING
    assert "slot ops_slot retains" in text and "source.retained_wal_warning (64.0 KiB)" in text
    assert getattr(warnings[0], "retained_bytes", 0) > 64 * 1024
    assert getattr(warnings[0], "slot", None) == "ops_slot"

    lake = tmp_path / "lake"
    before = lake_files(lake)
    state = (lake / "_pgcdc" / "state.json").read_text()
    status: list[tuple[object, ...]] = []
    try:
        pg.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        pg.execute("SELECT pg_reload_conf()")
        for _ in range(30):
            pg.execute(
                "INSERT INTO filler (pad) SELECT repeat('y', 200) FROM generate_series(1, 50)"
            )
            pg.execute("SELECT pg_switch_wal()")
            pg.execute("CHECKPOINT")
            status = pg.execute(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'ops_slot'"
            )
            if status == [("lost",)]:
                break
            time.sleep(0.2)
    finally:
        pg.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        pg.execute("SELECT pg_reload_conf()")
    assert status == [("lost",)]
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "slot 'ops_slot' was invalidated" in err and "max_slot_wal_keep_size" in err
    assert "move the lake" in err and "pgcdc drop" in err
    assert lake_files(lake) == before  # no new copy
    assert (lake / "_pgcdc" / "state.json").read_text() == state
    assert main(["status", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "invalidated" in out and "max_slot_wal_keep_size" in out


def test_progress_lines_when_not_a_terminal() -> None:
    """Without a terminal, ``pgcdc run`` prints plain progress lines (never more often than
    every few seconds), and nothing with --quiet."""
    from pgcdc.cli.run import _Display, _Output
    from pgcdc.lake.results import BatchResult

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, width=200)
    display = _Display(_Output(console, json_logs=False, quiet=False), every=3600)
    assert display.mode == "lines"
    display._show(force=True)  # a resumed run's slot check: it starts, copies nothing
    display.snapshot_started(2, Lsn(0x1000))
    display.snapshot_progress(None, 30)
    display.snapshot_progress("public.a", 10)  # within `every`: no line
    display.snapshot_finished(30, 1.0)
    display.stream_started(Lsn(0x1000), Lsn(0x3000), True)
    display.batch_done(BatchResult(0, changes=5, max_lsn=0x2000))
    display.finished()
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert lines[0].endswith("starting the stream")
    assert lines[1].endswith("snapshot: 0/2 tables copied, 0 rows")
    assert lines[2].endswith("snapshot: 2/2 tables copied, 30 rows (30 rows read)")
    assert "catch-up 0% (0 B of 8.0 KiB WAL), 0 batches, 0 changes" in lines[3]

    quiet = io.StringIO()
    silent = _Display(_Output(Console(file=quiet), json_logs=False, quiet=True))
    silent.snapshot_started(1, Lsn(1))
    silent.stream_started(Lsn(1), Lsn(2), False)
    assert silent.mode == "none" and quiet.getvalue() == ""
