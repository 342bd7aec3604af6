"""Standby status updates: flush only on confirm(), idle slots advance, keepalives get answers."""

from __future__ import annotations

import time

import pytest

from pgcdc.lsn import Lsn
from pgcdc.replication import Idle, Reconnected, ReplicationSession, StreamOptions, WalData
from pgcdc.replication.feedback import FeedbackTracker
from tests.fix_pg import PgDatabase
from tests.replication.streams import (
    FAST,
    commits_at_least,
    current_lsn,
    read,
    setup_table,
    slot_row,
    wait_for,
)


def _idle_ticks(session: ReplicationSession, seconds: float) -> list[Idle | Reconnected]:
    """Iterate for ``seconds`` (nothing should arrive but Idle ticks)."""
    seen: list[Idle | Reconnected] = []
    deadline = time.monotonic() + seconds
    for event in session.events():
        assert not isinstance(event, WalData), event
        seen.append(event)
        if time.monotonic() > deadline:
            return seen
    raise AssertionError("events() ended")


def test_flush_moves_only_on_confirm(pg: PgDatabase) -> None:
    setup_table(pg)
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), **FAST) as session:
        for i in range(3):
            pg.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
        got = read(session, commits_at_least(3))
        ends = [c.end_lsn for c in got.commits]
        _idle_ticks(session, 0.3)  # a status sent before the data arrived may still land
        pinned = slot_row(pg)["confirmed_flush_lsn"]
        # many status intervals pass, with keepalives asked for: nothing was confirmed
        session.request_status()
        _idle_ticks(session, 0.6)
        assert slot_row(pg)["confirmed_flush_lsn"] == pinned
        assert pinned < got.commits[0].commit_lsn  # the first transaction would be resent
        # the session reported no more than the slot's position at start (PostgreSQL 18 once
        # showed the slot 72 bytes past it before any confirm: a slot may start ahead of
        # what pgcdc read before START_REPLICATION, never ahead of the first transaction)
        assert session.confirmed_lsn <= pinned
        # write = everything received (up to the last commit, or further: a keepalive's WAL
        # end counts too, as the native apply worker reports it), flush = confirmed: the
        # walsender saw both
        written = pg.execute(
            "SELECT write_lsn::text, flush_lsn::text FROM pg_stat_replication WHERE pid = %s",
            (slot_row(pg)["active_pid"],),  # an earlier test's walsender may still be listed
        )
        assert ends[-1] <= Lsn.parse(written[0][0]) <= current_lsn(pg)
        assert Lsn.parse(written[0][1]) == session.confirmed_lsn

        session.confirm(ends[0])
        session.request_status()
        wait_for(lambda: slot_row(pg)["confirmed_flush_lsn"] == ends[0])
        _idle_ticks(session, 0.6)  # and it stays there while the rest is unconfirmed
        assert slot_row(pg)["confirmed_flush_lsn"] == ends[0]

        session.confirm(ends[2])
        session.request_status()
        wait_for(lambda: slot_row(pg)["confirmed_flush_lsn"] >= ends[2])
        with pytest.raises(ValueError, match="beyond anything the server has sent"):
            session.confirm(Lsn(ends[2] + 10**9))


def test_idle_slot_advances(pg: PgDatabase) -> None:
    """Writes to a table outside the publication: nothing arrives, yet the slot moves on."""
    setup_table(pg)
    pg.execute("CREATE TABLE other (id int)")
    before = slot_row(pg)["confirmed_flush_lsn"]
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), **FAST) as session:
        for i in range(20):
            pg.execute("INSERT INTO other VALUES (%s)", (i,))
        target = current_lsn(pg)
        deadline = time.monotonic() + 10
        for event in session.events():
            assert not isinstance(event, WalData), "no change of 'other' is published"
            if slot_row(pg)["confirmed_flush_lsn"] >= target:
                break
            assert time.monotonic() < deadline, "the idle slot did not advance"
    assert target > before
    assert slot_row(pg)["confirmed_flush_lsn"] >= target


def test_idle_ack_waits_for_confirm(pg: PgDatabase) -> None:
    """Received but unconfirmed data pins the slot, even when the server's WAL end moves on."""
    setup_table(pg)
    pg.execute("CREATE TABLE other (id int)")
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), **FAST) as session:
        pg.execute("INSERT INTO t VALUES (1, 'x')")
        got = read(session, commits_at_least(1))
        _idle_ticks(session, 0.3)  # a status sent before the data arrived may still land
        pinned = slot_row(pg)["confirmed_flush_lsn"]
        assert pinned < got.commits[0].commit_lsn
        for i in range(10):
            pg.execute("INSERT INTO other VALUES (%s)", (i,))
        session.request_status()
        _idle_ticks(session, 0.8)
        assert slot_row(pg)["confirmed_flush_lsn"] == pinned
        assert session.server_wal_end > got.commits[0].end_lsn
        session.confirm(got.commits[0].end_lsn)
        target = current_lsn(pg)
        session.request_status()
        deadline = time.monotonic() + 10
        for _ in session.events():
            if slot_row(pg)["confirmed_flush_lsn"] >= target:
                break
            assert time.monotonic() < deadline, "the slot did not advance after confirm"


def test_keepalive_replies(pg: PgDatabase) -> None:
    """The server asks for replies; the transport answers them while the consumer iterates.

    With wal_sender_timeout at 2s and no periodic status from the session (status_interval 60s,
    data pending so no idle acknowledgement), only the answers to the server's keepalive
    requests keep the connection alive; a consumer that stops iterating is cut off.
    """
    setup_table(pg)
    # the walsender asks for a reply after half the timeout: 2s leaves the session a second to
    # answer (it polls every 0.1s), so a stall of the loaded machine does not cut it off
    pg.execute("ALTER SYSTEM SET wal_sender_timeout = '2s'")
    pg.execute("SELECT pg_reload_conf()")
    try:
        session = ReplicationSession(
            pg.dsn(),
            "s",
            StreamOptions(("pub",)),
            status_interval=60,
            poll_interval=0.1,
            receive_timeout=60,
        )
        with session:
            pg.execute("INSERT INTO t VALUES (1, 'pending')")
            read(session, commits_at_least(1))  # received, never confirmed: pending
            pid = slot_row(pg)["active_pid"]
            began = pg.execute("SELECT now()")[0][0]
            seen = _idle_ticks(session, 4.0)  # twice the timeout
            assert not any(isinstance(e, Reconnected) for e in seen)
            assert slot_row(pg)["active_pid"] == pid
            replied = pg.execute(
                "SELECT reply_time > %s + interval '2 seconds' FROM pg_stat_replication "
                "WHERE pid = %s",
                (began, pid),
            )
            assert replied == [(True,)]
            # the control: a consumer that does not iterate does not answer, and is cut off
            wait_for(lambda: slot_row(pg)["active_pid"] != pid, timeout=30)  # it gave up on us
            got = read(session, lambda r: bool(r.reconnects), timeout=5)
            assert len(got.reconnects) == 1 and session.reconnects == 1
    finally:
        pg.execute("ALTER SYSTEM RESET wal_sender_timeout")
        pg.execute("SELECT pg_reload_conf()")


def test_tracker_rules() -> None:
    tracker = FeedbackTracker(Lsn(100))
    assert not tracker.pending
    tracker.note_wal_end(150)
    assert tracker.positions() == (150, 150, 150)  # nothing pending: acknowledge the WAL end
    tracker.reported(Lsn(150))
    tracker.receive(200)
    tracker.receive(0)  # Relation messages carry dataStart 0
    assert tracker.pending
    assert tracker.positions() == (200, 150, 150)  # never below what was already reported
    tracker.note_wal_end(400)
    assert tracker.positions() == (400, 150, 150)  # write: keepalives' WAL end counts too
    tracker.confirm(Lsn(200))
    assert not tracker.pending
    assert tracker.positions() == (400, 400, 400)
    with pytest.raises(ValueError):
        tracker.confirm(Lsn(401))
    with pytest.raises(TypeError):
        tracker.confirm("0/10")  # type: ignore[arg-type]
