"""``pgcdc run`` stopped by a service manager: SIGTERM stops it after the batch in progress,
like Ctrl-C, and it exits 0 with its exit hooks run, whoever else gets the signal: ``timeout``
and a terminal's job control signal the whole process group, systemd (``KillMode=
control-group``) every process of the service, and Spark's JVM and Python processes must go on
until pgcdc stops them (issue 41). Ctrl-C does the same, whatever handler pyspark installs. A
pgcdc killed outright still takes Spark's processes with it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tests.chaos.harness import kill_group, log_tail, session_members, start_run, write_config
from tests.fix_pg import PgDatabase, newest_server

pytestmark = pytest.mark.slow


def _last_run(log: Path) -> str:
    """What the last run wrote to ``log`` (each run appends to it after a header line)."""
    return log.read_text(errors="replace").rsplit("\n===== ", 1)[-1]


def _wait_for(log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in _last_run(log):
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{log_tail(log)}"
        time.sleep(0.2)


@contextmanager
def _steady_writes(pg: PgDatabase, first: int) -> Iterator[list[int]]:
    """A steady stream of transactions (one row each, ids from ``first``) while inside, so
    that batches keep coming; yields [the last id written]."""
    stop = threading.Event()
    written = [first - 1]

    def write() -> None:
        with pg.connect() as conn:
            while not stop.is_set():
                n = written[0] + 1
                conn.execute("INSERT INTO t VALUES (%s, 'streamed')", (n,))
                written[0] = n
                time.sleep(0.02)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield written
    finally:
        stop.set()
        writer.join(10)


def _assert_stopped_after_the_batch(log: Path, code: int, signame: str) -> None:
    text = _last_run(log)
    assert code == 0, log_tail(log)
    assert f"{signame}: stopping after the current batch" in text, log_tail(log)
    for wrong in ("KeyboardInterrupt", "the stream failed", "Traceback", "ran out of memory"):
        assert wrong not in text, log_tail(log)


def _assert_every_row_once(pg: PgDatabase, config: Path, log: Path, last: int) -> None:
    """A run to the end, with ``--verify``: every row once in the mirror and once in the
    changelog (none lost, none twice)."""
    from pgcdc.lake.config import load_config
    from pgcdc.lake.store.tables import LakeLayout
    from pgcdc.lake.store.target import DeltaTarget

    again = start_run(config, log, until_caught_up=True, verify=True)
    try:
        assert again.wait(300) == 0, log_tail(log)
    finally:
        kill_group(again)
    assert "public.t: equal" in _last_run(log), log_tail(log)
    lake = load_config(config).lake.path
    changelog = DeltaTarget(LakeLayout(lake).table_path("public", "t", "changelog")).read()
    assert sorted(changelog.column("id").to_pylist()) == list(range(1, last + 1))


def _table(pg: PgDatabase, tmp_path: Path) -> Path:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) AS g")
    return write_config(tmp_path, pg.dsn(), trigger=0.5)


def _jvm(pids: set[int]) -> int:
    """The Java process among ``pids``."""
    found = []
    for pid in pids:
        with suppress(OSError):
            if Path(f"/proc/{pid}/exe").resolve().name == "java":
                found.append(pid)
    assert len(found) == 1, found
    return found[0]


def _all_end(pids: set[int], session: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while left := pids & set(session_members(session)):
        assert time.monotonic() < deadline, f"processes {left} outlive the run"
        time.sleep(0.5)


@newest_server
def test_timeout_stops_after_the_batch_and_spark_ends_with_pgcdc(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """``timeout`` (as when its time runs out) sends SIGTERM to pgcdc and then to its whole
    process group, Spark's JVM included: the JVM ignores it, the batch in progress is finished
    and the run exits 0 (the JVM died under it, the batch failed and the message blamed the
    driver's memory). A JVM killed outright is reported as killed, not as out of memory. A
    pgcdc killed outright (alone) takes the JVM and every Python process of Spark with it."""
    config = _table(pg, tmp_path)
    log = tmp_path / "run.log"
    proc = start_run(config, log, until_caught_up=False, prefix=("timeout", "900"))
    try:
        _wait_for(log, "stream started", 240)
        with _steady_writes(pg, 101):
            _wait_for(log, "batch 1:", 120)  # batches are being applied
            proc.send_signal(signal.SIGTERM)  # what timeout does when its time runs out
            code = proc.wait(180)
    finally:
        kill_group(proc)
    _assert_stopped_after_the_batch(log, code, "SIGTERM")

    proc = start_run(config, log, until_caught_up=False)
    try:
        _wait_for(log, "stream started", 240)
        spark = set(session_members(proc.pid)) - {proc.pid}
        os.kill(_jvm(spark), signal.SIGKILL)
        code = proc.wait(180)
        _all_end(spark, proc.pid, 90)
    finally:
        kill_group(proc)
    text = " ".join(_last_run(log).split())  # as one line: the console wraps long ones
    assert code == 1, log_tail(log)
    assert "Spark's driver JVM was killed by SIGKILL" in text, log_tail(log)
    assert "give the driver more memory" not in text, log_tail(log)

    proc = start_run(config, log, until_caught_up=False)
    try:
        _wait_for(log, "stream started", 240)
        spark = set(session_members(proc.pid)) - {proc.pid}
        assert len(spark) >= 3, spark  # the JVM, a daemon, the stream's reader
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        _all_end(spark, proc.pid, 90)
    finally:
        kill_group(proc)


@newest_server
def test_sigterm_to_every_process_as_systemd_stops_after_the_batch(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """systemd's default stop (``KillMode=control-group``) sends SIGTERM to every process of
    the service at once, Spark's JVM and its Python daemons and workers included: the run
    finishes its batch and exits 0, and the next run finds every row once in the mirror and
    the changelog, the slot where the lake is."""
    config = _table(pg, tmp_path)
    log = tmp_path / "run.log"
    proc = start_run(config, log, until_caught_up=False)
    try:
        _wait_for(log, "stream started", 240)
        with _steady_writes(pg, 101) as written:
            _wait_for(log, "batch 1:", 120)  # batches are being applied
            everyone = session_members(proc.pid)
            assert len(everyone) >= 4, everyone  # pgcdc, the JVM, daemons, the stream's reader
            for pid in everyone:
                # a Python worker may have ended since the listing: systemd signals the
                # processes the group holds when it stops, so one gone is no failure
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            code = proc.wait(180)
    finally:
        kill_group(proc)
    _assert_stopped_after_the_batch(log, code, "SIGTERM")
    _assert_every_row_once(pg, config, log, written[0])


@newest_server
def test_ctrl_c_stops_after_the_batch_exits_0_and_loses_nothing(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT to the run's process group, as a terminal sends it) while batches are
    being applied: pyspark's own SIGINT handler (installed when the SparkContext starts) must
    not take over: the run stops after the batch in progress and exits 0, and the next run
    resumes with every row once in the mirror and once in the changelog (issue 24)."""
    config = _table(pg, tmp_path)
    log = tmp_path / "run.log"
    proc = start_run(config, log, until_caught_up=False)
    try:
        _wait_for(log, "stream started", 240)
        with _steady_writes(pg, 101) as written:
            _wait_for(log, "batch 1:", 120)  # batches are being applied
            os.killpg(proc.pid, signal.SIGINT)
            code = proc.wait(180)
    finally:
        kill_group(proc)
    _assert_stopped_after_the_batch(log, code, "SIGINT")
    _assert_every_row_once(pg, config, log, written[0])
