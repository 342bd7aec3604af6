"""``pgcdc run`` stopped by a service manager: SIGTERM (systemd, docker, Kubernetes) stops it
after the batch in progress, like Ctrl-C, and it exits 0 with its exit hooks run; Ctrl-C does
the same, whatever handler pyspark installs."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.chaos.harness import kill_group, log_tail, start_run, write_config
from tests.fix_pg import PgDatabase, newest_server

pytestmark = pytest.mark.slow


def _wait_for(log: Path, text: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_bytes():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{log_tail(log)}"
        time.sleep(0.2)


@newest_server
def test_sigterm_stops_after_the_batch_and_exits_0(pg: PgDatabase, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) AS g")
    config = write_config(tmp_path, pg.dsn(), trigger=0.5)
    log = tmp_path / "run.log"
    proc = start_run(config, log, until_caught_up=False)
    try:
        _wait_for(log, b"stream started", 240)
        pg.execute("INSERT INTO t VALUES (101, 'after the snapshot')")
        _wait_for(log, b"batch ", 120)  # a batch applied: the run is in its steady state
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(180)
    finally:
        kill_group(proc)
    text = log.read_text(errors="replace")
    assert code == 0, log_tail(log)
    assert "SIGTERM: stopping after the current batch" in text, log_tail(log)


@newest_server
def test_ctrl_c_stops_after_the_batch_exits_0_and_loses_nothing(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT to the run's process group, as a terminal sends it) while batches are
    being applied: pyspark's own SIGINT handler (installed when the SparkContext starts) must
    not take over: the run stops after the batch in progress and exits 0, and the next run
    resumes with every row once in the mirror and once in the changelog (issue 24)."""
    from pgcdc.lake.config import load_config
    from pgcdc.lake.tables import LakeLayout
    from pgcdc.lake.target import DeltaTarget

    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) AS g")
    config = write_config(tmp_path, pg.dsn(), trigger=0.5)
    log = tmp_path / "run.log"
    stop = threading.Event()
    written = [100]

    def write() -> None:  # a steady stream of transactions: batches keep coming
        with pg.connect() as conn:
            while not stop.is_set():
                n = written[0] + 1
                conn.execute("INSERT INTO t VALUES (%s, 'streamed')", (n,))
                written[0] = n
                time.sleep(0.02)

    writer = threading.Thread(target=write, daemon=True)
    proc = start_run(config, log, until_caught_up=False)
    try:
        _wait_for(log, b"stream started", 240)
        writer.start()
        _wait_for(log, b"batch 1:", 120)  # batches are being applied
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(180)
    finally:
        stop.set()
        kill_group(proc)
        writer.join(10)
    text = log.read_text(errors="replace")
    assert code == 0, log_tail(log)
    assert "SIGINT: stopping after the current batch" in text, log_tail(log)
    assert "KeyboardInterrupt" not in text, log_tail(log)

    again = start_run(config, log, until_caught_up=True, verify=True)
    try:
        assert again.wait(300) == 0, log_tail(log)
    finally:
        kill_group(again)
    assert "public.t: equal" in log.read_text(errors="replace"), log_tail(log)
    lake = load_config(config).lake.path
    changelog = DeltaTarget(LakeLayout(lake).table_path("public", "t", "changelog")).read()
    ids = changelog.column("id").to_pylist()
    assert sorted(ids) == list(range(1, written[0] + 1))  # every row once: none lost, none twice
