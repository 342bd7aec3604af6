"""``pgcdc run`` stopped by a service manager: SIGTERM (systemd, docker, Kubernetes) stops it
after the batch in progress, like Ctrl-C, and it exits 0 with its exit hooks run."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.chaos.harness import kill_group, log_tail, start_run, write_config
from tests.fix_pg import PgDatabase

pytestmark = pytest.mark.slow


def _wait_for(log: Path, text: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_bytes():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{log_tail(log)}"
        time.sleep(0.2)


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
