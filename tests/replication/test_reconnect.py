"""Reconnecting after a dropped connection and after a server restart, losing nothing."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from pgcdc.protocol import Begin
from pgcdc.replication import (
    ConnectionLostError,
    ReconnectGaveUpError,
    ReconnectPolicy,
    ReplicationSession,
    SlotNotFoundError,
    StreamOptions,
)
from pgcdc.replication.reconnect import Backoff
from tests.fix_pg import PgDatabase, drop_slots
from tests.replication.streams import FAST, read, setup_table, slot_row

QUICK = ReconnectPolicy(initial_delay=0.05, max_delay=0.5, max_attempts=40, deadline=30)


def _insert(pg: PgDatabase, ids: range) -> None:
    with pg.connect() as conn:
        for i in ids:
            conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))


def test_reconnect_after_walsender_terminated(pg: PgDatabase) -> None:
    setup_table(pg)
    session = ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), reconnect=QUICK, **FAST)
    with session:
        _insert(pg, range(0, 10))
        got = read(session, lambda r: len(r.commits) >= 10)
        confirmed = got.commits[4].end_lsn  # the consumer made the first five durable
        session.confirm(confirmed)
        session.request_status()
        read(session, lambda r: slot_row(pg)["confirmed_flush_lsn"] >= confirmed, reading=got)
        old_pid = slot_row(pg)["active_pid"]
        pg.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        _insert(pg, range(10, 20))
        got = read(session, lambda r: set(range(20)) <= set(r.inserted_ids()), reading=got)
        assert slot_row(pg)["active_pid"] != old_pid
    (reconnected,) = got.reconnects
    assert reconnected.resume_lsn == confirmed
    assert session.reconnects == 1
    # the server resumed at the confirmed position: the first transaction after the reconnect
    # is the first unconfirmed one
    before = sum(1 for e in got.events[: got.events.index(reconnected)] if e in got.data)
    first_begin = next(m for m in got.messages[before:] if isinstance(m, Begin))
    assert first_begin.final_lsn == got.commits[5].commit_lsn > confirmed
    # every committed row arrived, at least once; what was not confirmed came again
    ids = got.inserted_ids()
    assert set(ids) == set(range(20))
    assert all(ids.count(i) == 1 for i in range(5))  # confirmed before: not resent
    assert all(ids.count(i) == 2 for i in range(5, 10))  # delivered, unconfirmed: resent
    assert all(ids.count(i) == 1 for i in range(10, 20))


def test_reconnect_after_server_restart(pg: PgDatabase) -> None:
    """A fast shutdown waits for the consumer to confirm what it received, then restarts."""
    setup_table(pg)
    session = ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), reconnect=QUICK, **FAST)
    with session:
        _insert(pg, range(0, 10))
        got = read(session, lambda r: len(r.commits) >= 10)
        restart = threading.Thread(target=pg.cluster.restart)
        restart.start()
        confirmed = got.commits[-1].end_lsn  # the consumer finishes its work meanwhile
        session.confirm(confirmed)
        read(session, lambda r: bool(r.reconnects), reading=got, timeout=30)
        restart.join()
        _insert(pg, range(10, 20))
        got = read(session, lambda r: set(range(10, 20)) <= set(r.inserted_ids()), reading=got)
    (reconnected,) = got.reconnects
    assert reconnected.resume_lsn >= confirmed
    ids = got.inserted_ids()
    assert sorted(ids) == list(range(20))  # all there, and nothing confirmed came again
    assert all(c.commit_lsn > reconnected.resume_lsn for c in got.commits[10:])


@pytest.mark.parametrize("limit", ["attempts", "deadline"])
def test_gives_up_with_a_clear_error(
    pg: PgDatabase, limit: str, caplog: pytest.LogCaptureFixture
) -> None:
    setup_table(pg)
    policy = (
        ReconnectPolicy(initial_delay=0.05, max_attempts=3, deadline=None)
        if limit == "attempts"
        else ReconnectPolicy(initial_delay=0.05, max_delay=0.1, max_attempts=None, deadline=0.6)
    )
    session = ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), reconnect=policy, **FAST)
    caplog.set_level(logging.INFO, logger="pgcdc.replication")
    with session:
        pg.execute("INSERT INTO t VALUES (1, 'x')")
        got = read(session, lambda r: len(r.commits) == 1)
        session.confirm(got.commits[0].end_lsn)  # else the shutdown waits for it
        stop = threading.Thread(target=pg.cluster.stop_server)
        stop.start()
        try:
            with pytest.raises(ReconnectGaveUpError) as err:
                read(session, lambda r: False, timeout=30)
        finally:
            stop.join()
            pg.cluster.start_server()
    message = str(err.value)
    assert f"127.0.0.1:{pg.cluster.port}/{pg.dbname}" in message
    assert "slot 's'" in message
    # the cause, as libpq told it: refused once the server is down, or cut while it shuts down
    causes = ("Connection refused", "shutting down", "closed the connection unexpectedly")
    assert any(cause in message for cause in causes), message
    if limit == "attempts":
        assert "after 3 attempt(s)" in message
    assert "Fix:" in message and "resumes" in message
    assert any("reconnecting to" in r.getMessage() for r in caplog.records)


def test_backoff_schedule() -> None:
    clock = [0.0]
    backoff = Backoff(
        ReconnectPolicy(initial_delay=1, max_delay=5, multiplier=2, max_attempts=6, jitter=0),
        clock=lambda: clock[0],
    )
    delays = []
    while (delay := backoff.next_delay()) is not None:
        delays.append(delay)
    assert delays == [1, 2, 4, 5, 5, 5]
    timed = Backoff(
        ReconnectPolicy(initial_delay=1, max_attempts=None, deadline=2.5, jitter=0),
        clock=lambda: clock[0],
    )
    assert timed.next_delay() == 1
    clock[0] += 1
    assert timed.next_delay() == 1.5  # capped at the deadline
    clock[0] += 1.5
    assert timed.next_delay() is None
    with pytest.raises(ValueError, match="retry forever"):
        ReconnectPolicy(max_attempts=None, deadline=None)


def test_temporary_slot_cannot_resume(pg: PgDatabase) -> None:
    setup_table(pg, slot=None)
    session = ReplicationSession(
        pg.dsn(), "tmp_slot", StreamOptions(("pub",)), temporary_slot=True, **FAST
    )
    with session:
        pg.execute("INSERT INTO t VALUES (1, 'x')")
        got = read(session, lambda r: len(r.commits) == 1)
        assert got.inserted_ids() == [1]
        pid = slot_row(pg, "tmp_slot")["active_pid"]
        pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(ConnectionLostError, match="temporary slot 'tmp_slot'"):
            read(session, lambda r: False)
    assert pg.execute("SELECT count(*) FROM pg_replication_slots")[0][0] == 0


def test_slot_dropped_under_the_session(pg: PgDatabase) -> None:
    """A slot dropped while the session streamed (``pgcdc drop --force``): the reconnect finds
    it gone and says so, with the position the consumer had confirmed, and does not advise
    creating it again (a new slot would skip what was not confirmed)."""
    setup_table(pg)
    session = ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), reconnect=QUICK, **FAST)
    with session:
        _insert(pg, range(0, 3))
        got = read(session, lambda r: len(r.commits) >= 3)
        confirmed = got.commits[0].end_lsn
        session.confirm(confirmed)
        session.request_status()
        read(session, lambda r: slot_row(pg)["confirmed_flush_lsn"] >= confirmed, reading=got)
        with pg.connect() as conn:
            drop_slots(conn, pg.dbname)  # terminates the walsender first, as --force does
        with pytest.raises(SlotNotFoundError) as err:
            read(session, lambda r: False, reading=got)
    message = str(err.value)
    assert "replication slot 's' was dropped" in message and "while this session" in message
    assert f"confirmed up to {confirmed}" in message, message
    assert "create" not in message.split("Fix:")[1], message


@pytest.mark.parametrize("mode", ["restart", "stop"])
def test_fast_shutdown_with_unconfirmed_changes_is_prompt(pg: PgDatabase, mode: str) -> None:
    """A fast shutdown while the consumer has received transactions it has not confirmed: the
    walsender waits for a flush confirmation up to what it sent, and answering its keepalives
    kept it waiting (and pg_ctl with it) until the consumer confirmed. The session does not
    confirm them: it closes the connection, so the shutdown takes seconds; after the server
    is back it resumes at the confirmed position and the unconfirmed transactions come again,
    nothing lost (issue 24)."""
    setup_table(pg)
    session = ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), reconnect=QUICK, **FAST)
    with session:
        _insert(pg, range(0, 10))
        got = read(session, lambda r: len(r.commits) >= 10)
        confirmed = got.commits[4].end_lsn  # the first five are durable, the rest not yet
        session.confirm(confirmed)
        session.request_status()
        read(session, lambda r: slot_row(pg)["confirmed_flush_lsn"] >= confirmed, reading=got)
        took: list[float] = []
        failed: list[BaseException] = []

        def shut_down() -> None:
            started = time.monotonic()
            try:
                if mode == "restart":
                    pg.cluster.restart()
                else:
                    pg.cluster.stop_server()
            except BaseException as exc:  # pg_ctl gave up waiting (ClusterError)
                failed.append(exc)
            took.append(time.monotonic() - started)
            if mode == "stop":
                pg.cluster.start_server()

        thread = threading.Thread(target=shut_down)
        thread.start()
        try:
            # the consumer keeps reading (and psycopg2 answering keepalives) meanwhile
            read(session, lambda r: bool(r.reconnects), reading=got, timeout=90)
        finally:
            thread.join()
        assert not failed and took[0] < 15, (took, failed)
        assert slot_row(pg)["confirmed_flush_lsn"] == confirmed  # nothing more was confirmed
        _insert(pg, range(10, 15))
        got = read(session, lambda r: set(range(15)) <= set(r.inserted_ids()), reading=got)
    assert got.reconnects and got.reconnects[0].resume_lsn == confirmed
    ids = got.inserted_ids()
    assert all(ids.count(i) == 1 for i in range(5))  # confirmed before: not sent again
    assert all(ids.count(i) == 2 for i in range(5, 10))  # unconfirmed: sent again
    assert all(ids.count(i) == 1 for i in range(10, 15))
