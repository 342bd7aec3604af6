"""Connections cut mid-stream (through a loopback proxy): the session reconnects and resumes,
and the assembled stream delivers every committed transaction exactly once."""

from __future__ import annotations

import threading
import time
from typing import Any

from pgcdc.decoding import OutputPlugin, run
from pgcdc.lsn import Lsn
from pgcdc.replication import ReconnectPolicy, ReplicationSession, StreamOptions
from tests.fix_pg import PgDatabase
from tests.fix_proxy import TcpProxy
from tests.replication.streams import setup_table


class Collect(OutputPlugin):
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.commits: list[Lsn] = []

    def begin(self, ctx: Any, txn: Any) -> None:
        pass

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        self.ids.append(int(change.new[0]))

    def commit(self, ctx: Any, txn: Any, commit_lsn: Lsn) -> None:
        self.commits.append(commit_lsn)


def _workload(pg: PgDatabase, n: int, done: threading.Event) -> None:
    with pg.connect() as conn:
        for i in range(n):
            with conn.transaction():
                conn.execute("INSERT INTO t VALUES (%s, 'v')", (i,))
                if i % 50 == 0:  # now and then a transaction big enough to stream
                    conn.execute(
                        "INSERT INTO t SELECT g, repeat('s', 50) FROM generate_series(%s, %s) g",
                        (100_000 + i * 1000, 100_000 + i * 1000 + 800),
                    )
            time.sleep(0.005)
    done.set()


def test_cut_connections_lose_and_double_nothing(
    pg: PgDatabase, proxy_factory: type[TcpProxy]
) -> None:
    setup_table(pg)
    proxy = proxy_factory(pg.cluster.port)
    dsn = pg.dsn(port=str(proxy.port))
    options = StreamOptions(publication_names=("pub",), streaming="on")
    plugin = Collect()
    stop = threading.Event()
    session = ReplicationSession(
        dsn,
        "s",
        options,
        reconnect=ReconnectPolicy(initial_delay=0.05, max_delay=0.5, max_attempts=50),
        status_interval=0.2,
        poll_interval=0.1,
    )
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with session:
                run(plugin, session, stop=stop)
        except BaseException as exc:
            errors.append(exc)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    done = threading.Event()
    writer = threading.Thread(target=_workload, args=(pg, 300, done), daemon=True)
    writer.start()
    cuts = 0
    while not done.is_set():
        time.sleep(0.3)
        cuts += proxy.cut() > 0
    writer.join()
    expected = {i for i in range(300)} | {
        g for i in range(0, 300, 50) for g in range(100_000 + i * 1000, 100_000 + i * 1000 + 801)
    }
    deadline = (
        time.monotonic() + 180
    )  # a loaded machine: the last streamed transaction may come late
    while set(plugin.ids) != expected and time.monotonic() < deadline and not errors:
        time.sleep(0.1)
    stop.set()
    consumer.join(timeout=30)
    assert not errors, errors
    assert cuts >= 3 and session.reconnects >= 3
    assert set(plugin.ids) == expected
    assert len(plugin.ids) == len(expected), "a change was delivered twice"
    assert plugin.commits == sorted(plugin.commits)
