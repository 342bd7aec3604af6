"""Network faults under a running pipeline: the source DSN points at a loopback proxy the test
controls; while a continuous ``Pipeline.run`` streams a workload, every connection through the
proxy is cut several times and the PostgreSQL server is restarted once. The pipeline recovers by
itself (no failure, it keeps applying changes), and at the end every mirror equals its source,
histories are consistent and every changelog holds each change exactly once (against a
``test_decoding`` audit slot, tests/chaos/harness.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc.lake.config import parse_config
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.run.verify import compare_tables
from tests.chaos.harness import audit_transactions, check_lake, create_audit_slot
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_pipeline import Background
from tests.fix_proxy import TcpProxy

pytestmark = pytest.mark.slow

#: transactions of 2,000 rows in the fast shutdown test's backlog, one batch each
TRANSACTIONS = 16


class Writer:
    """Transactions of inserts, updates and deletes (now and then one big enough to be
    streamed), paused on request (the server restart)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.running = threading.Event()
        self.running.set()
        self.paused = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.transactions = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            n = 0
            while not self.done.is_set():
                if not self.running.is_set():
                    self.paused.set()
                    self.running.wait()
                    self.paused.clear()
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    for _ in range(20):
                        n += 1
                        with conn.transaction():
                            conn.execute("INSERT INTO items VALUES (%s, 'v', 0)", (n,))
                            conn.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (n // 2,))
                            if n % 7 == 0:
                                conn.execute("DELETE FROM items WHERE id = %s", (n - 3,))
                            if n % 60 == 0:  # streamed: over logical_decoding_work_mem
                                conn.execute(
                                    "INSERT INTO items SELECT g, repeat('s', 60), 1 "
                                    "FROM generate_series(%s, %s) g",
                                    (10**7 + n * 1000, 10**7 + n * 1000 + 900),
                                )
                        self.transactions += 1
                        time.sleep(0.01)
                        if not self.running.is_set() or self.done.is_set():
                            break
        except BaseException as exc:
            self.error = exc

    def pause(self) -> None:
        self.running.clear()
        assert self.paused.wait(60)

    def resume(self) -> None:
        self.running.set()


@pytest.mark.parametrize("pg_server", [18], indirect=True, ids=["pg18"])
def test_cuts_and_server_restart_lose_and_double_nothing(
    pg: PgDatabase,
    spark: Any,
    proxy_factory: type[TcpProxy],
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
) -> None:
    pg.execute("CREATE TABLE items (id bigint PRIMARY KEY, v text, qty int)")
    pg.execute("INSERT INTO items SELECT g, 'snap', 0 FROM generate_series(-500, -1) g")
    create_audit_slot(pg.dsn())
    proxy = proxy_factory(pg.cluster.port)
    config = parse_config(
        {
            "source": {
                "dsn": pg.dsn(port=str(proxy.port)),
                "slot": "net_slot",
                "publication": "net_pub",
                "connect_timeout": 5,
            },
            "lake": {"path": str(tmp_path / "lake"), "history": True, "changelog": True},
            # batches of many changes: each Delta operation's fixed cost (a second or more on
            # a loaded 2-core machine) must not leave the lake minutes behind the writer
            "stream": {"trigger_interval": 0.5, "max_changes_per_trigger": 25_000},
            "tables": [{"name": "items"}],
        }
    )
    pipeline = Pipeline(config, spark=spark)
    run = background(pipeline).start()
    failures = run.failures
    writer = Writer(pg.dsn())
    writer.thread.start()

    def applied() -> int:
        progress = pipeline.progress
        return 0 if progress is None else progress.changes

    def wait_for_progress(what: str) -> None:
        before = applied()
        deadline = time.monotonic() + 120
        while applied() <= before:
            assert not failures, f"the pipeline failed after {what}: {failures[0]}"
            assert time.monotonic() < deadline, f"no progress after {what}"
            time.sleep(0.2)

    cuts = 0
    for i in range(4):
        time.sleep(1.5)
        cuts += proxy.cut() > 0
        wait_for_progress(f"cut {i + 1}")
    writer.pause()
    pg.cluster.restart()
    writer.resume()
    wait_for_progress("the server restart")
    time.sleep(1.5)
    cuts += proxy.cut() > 0
    wait_for_progress("the last cut")
    writer.done.set()
    writer.thread.join(60)
    assert writer.error is None, writer.error
    assert cuts >= 4 and writer.transactions > 50

    assert pipeline.plan is not None
    deadline = time.monotonic() + 300
    while True:
        assert not failures, failures[0]
        checks = compare_tables(pg.dsn(), pipeline.layout, pipeline.plan.tables)
        if all(c.equal for c in checks):
            break
        assert time.monotonic() < deadline, [c.describe() for c in checks]
        time.sleep(1)
    run.stop()
    assert not failures, failures[0]
    direct = config.model_copy(
        update={"source": config.source.model_copy(update={"dsn": pg.dsn()})}
    )
    report = check_lake(direct, audit_transactions(pg.dsn()))
    assert report.changes > writer.transactions


@newest_server
def test_fast_shutdown_while_batches_are_pending_is_prompt(
    pg: PgDatabase, spark: Any, tmp_path: Path, background: Callable[[Pipeline], Background]
) -> None:
    """``pg_ctl restart -m fast`` while a continuous pipeline has received a backlog it is
    still applying: the walsender waits for a flush confirmation of everything it sent, which
    the pipeline cannot give before its batches are in the lake; the receiver closes the
    replication connection instead, so the restart takes seconds (it took until the backlog
    was applied, or until pg_ctl gave up after 60 s). The pipeline reconnects and the lake ends
    equal to the source, every change once in the changelog (issue 24)."""
    from pgcdc.lake.store.tables import LakeLayout
    from pgcdc.lake.store.target import DeltaTarget

    pg.execute("CREATE TABLE items (id bigint PRIMARY KEY, v text, qty int)")
    pg.execute("INSERT INTO items SELECT g, 'snap', 0 FROM generate_series(-50, -1) g")
    config = parse_config(
        {
            "source": {"dsn": pg.dsn(), "slot": "shut_slot", "publication": "shut_pub"},
            "lake": {"path": str(tmp_path / "lake"), "changelog": True},
            "stream": {"trigger_interval": 0.5, "max_changes_per_trigger": 2000},
            "tables": [{"name": "items"}],
        }
    )
    pipeline = Pipeline(config, spark=spark)
    run = background(pipeline).start()
    failures = run.failures
    try:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            for t in range(TRANSACTIONS):  # a batch each: a backlog of some 16 s at least
                conn.execute(
                    "INSERT INTO items SELECT g, repeat('b', 200), %s "
                    "FROM generate_series(%s::bigint, %s::bigint) g",
                    (t, t * 2000, t * 2000 + 1999),
                )
            end = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        deadline = time.monotonic() + 120
        while True:  # the receiver has it all; the lake has some of it (the first batch's
            # schema changes, which read the source, are done), not most
            sent = pg.execute(
                "SELECT bool_or(sent_lsn >= %s) FROM pg_stat_replication", (end[0] if end else 0,)
            )
            progress = pipeline.progress
            if sent == [(True,)] and progress is not None and progress.changes >= 2000:
                break
            assert time.monotonic() < deadline and not failures, failures
            time.sleep(0.1)
        assert progress is not None and progress.changes < TRANSACTIONS * 2000 // 2
        started_at = time.monotonic()
        pg.cluster.restart()
        took = time.monotonic() - started_at
        assert took < 20, f"pg_ctl restart took {took:.1f} s"

        assert pipeline.plan is not None
        deadline = time.monotonic() + 300
        while True:
            assert not failures, failures[0]
            checks = compare_tables(pg.dsn(), pipeline.layout, pipeline.plan.tables)
            if all(c.equal for c in checks):
                break
            assert time.monotonic() < deadline, [c.describe() for c in checks]
            time.sleep(1)
    finally:
        run.stop()
    assert not failures, failures[0]
    layout = LakeLayout(tmp_path / "lake")
    changelog = DeltaTarget(layout.table_path("public", "items", "changelog"))
    ids = changelog.read(columns=["id"]).column(0).to_pylist()
    assert sorted(ids) == list(range(-50, 0)) + list(range(TRANSACTIONS * 2000))  # each once
