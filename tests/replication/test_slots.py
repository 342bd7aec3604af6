"""Slots: create (two_phase, temporary, with an exported snapshot), inspect, drop."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from pgcdc.protocol import Insert
from pgcdc.replication import (
    ReplicationSession,
    SlotActiveError,
    SlotExistsError,
    SlotNotFoundError,
    StreamOptions,
    create_slot,
    create_slot_with_snapshot,
    drop_slot,
    list_slots,
    slot_info,
)
from tests.fix_pg import PgDatabase
from tests.replication.streams import FAST, commits_at_least, read, setup_table, slot_row


@pytest.mark.parametrize("two_phase", [False, True])
def test_create_and_inspect(pg: PgDatabase, two_phase: bool) -> None:
    created = create_slot(pg.dsn(), "s1", two_phase=two_phase)
    info = slot_info(pg.dsn(), "s1")
    assert info is not None
    assert (info.name, info.plugin, info.slot_type, info.database) == (
        "s1",
        "pgoutput",
        "logical",
        pg.dbname,
    )
    assert info.two_phase is two_phase
    assert info.confirmed_flush_lsn == created.consistent_point
    assert info.restart_lsn is not None and info.restart_lsn <= created.consistent_point
    assert info.wal_status == "reserved"
    assert not info.active and not info.temporary and not info.lost
    if pg.major >= 17:
        assert info.invalidation_reason is None and info.inactive_since is not None
    else:
        assert info.inactive_since is None
    assert slot_info(pg.dsn(), "nope") is None
    assert [s.name for s in list_slots(pg.dsn(), database=pg.dbname)] == ["s1"]
    with pytest.raises(SlotExistsError, match="'s1' already exists"):
        create_slot(pg.dsn(), "s1")


def test_temporary_slot_through_sql_needs_a_connection(pg: PgDatabase) -> None:
    with pytest.raises(ValueError, match=r"pass an open psycopg\.Connection"):
        create_slot(pg.dsn(), "tmp", temporary=True)
    with pg.connect() as conn:
        create_slot(conn, "tmp", temporary=True)
        info = slot_info(pg.dsn(), "tmp")
        assert info is not None and info.temporary
    assert slot_info(pg.dsn(), "tmp") is None


@pytest.mark.parametrize("two_phase", [False, True])
def test_exported_snapshot(pg: PgDatabase, two_phase: bool) -> None:
    setup_table(pg, slot=None)
    pg.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    with create_slot_with_snapshot(pg.dsn(), "s", two_phase=two_phase) as exported:
        assert exported.held
        pg.execute("INSERT INTO t VALUES (3, 'after')")
        pg.execute("UPDATE t SET v = 'changed' WHERE id = 1")
        with pg.connect(autocommit=False) as copier:
            copier.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            copier.execute(_set_snapshot(exported.snapshot_name))
            rows = copier.execute("SELECT id, v FROM t ORDER BY id").fetchall()
            copier.rollback()
        assert rows == [(1, "a"), (2, "b")]  # exactly as of the consistent point
        info = slot_info(pg.dsn(), "s")
        assert info is not None
        assert info.confirmed_flush_lsn == exported.consistent_point
        assert info.two_phase is two_phase
    assert not exported.held
    # the snapshot dies with the connection (its backend exits a moment after the close):
    # its file is gone, or is left for a moment by a process that is ("The source process
    # with PID N is not running anymore", PostgreSQL's ImportSnapshot)
    gone = (
        psycopg.errors.InvalidParameterValue,
        psycopg.errors.UndefinedObject,
        psycopg.errors.ObjectNotInPrerequisiteState,
    )
    deadline = time.monotonic() + 10
    while True:
        with pg.connect(autocommit=False) as late:
            try:
                late.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                late.execute(_set_snapshot(exported.snapshot_name))
            except gone:
                break
        assert time.monotonic() < deadline, "the exported snapshot outlived its connection"
        time.sleep(0.1)
    # what committed after the consistent point is exactly what the slot streams
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), **FAST) as session:
        got = read(session, commits_at_least(2))
    assert [m.new for m in got.of(Insert)] == [("3", "after")]
    assert [type(m).__name__ for m in got.messages if type(m).__name__ == "Update"] == ["Update"]


def _set_snapshot(snapshot_name: str) -> sql.Composed:
    return sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name))


def test_exported_snapshot_of_a_temporary_slot(pg: PgDatabase) -> None:
    handle = create_slot_with_snapshot(pg.dsn(), "tmp", temporary=True)
    info = slot_info(pg.dsn(), "tmp")
    assert info is not None and info.temporary and info.active
    handle.release()
    handle.release()  # idempotent
    assert slot_info(pg.dsn(), "tmp") is None
    assert "held=False" in repr(handle)


def test_session_with_a_temporary_slot(pg: PgDatabase) -> None:
    setup_table(pg, slot=None)
    session = ReplicationSession(
        pg.dsn(), "tmp", StreamOptions(("pub",)), temporary_slot=True, **FAST
    )
    with session:
        info = slot_info(pg.dsn(), "tmp")
        assert info is not None and info.temporary
        pg.execute("INSERT INTO t VALUES (1, 'x')")
        got = read(session, commits_at_least(1))
        assert got.inserted_ids() == [1]
    # the walsender drops its temporary slot as it exits, which follows the client's close
    # a moment later: on a loaded machine the first look saw it still there
    deadline = time.monotonic() + 30
    while slot_info(pg.dsn(), "tmp") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slot_info(pg.dsn(), "tmp") is None


def test_drop(pg: PgDatabase) -> None:
    setup_table(pg)
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), **FAST) as session:
        next(iter(session.events()))
        with pytest.raises(SlotActiveError, match="terminate_active=True"):
            drop_slot(pg.dsn(), "s")
        assert slot_row(pg)["active"]
        assert drop_slot(pg.dsn(), "s", terminate_active=True) is True
    assert slot_info(pg.dsn(), "s") is None
    assert drop_slot(pg.dsn(), "s", missing_ok=True) is False
    with pytest.raises(SlotNotFoundError):
        drop_slot(pg.dsn(), "s")
    create_slot(pg.dsn(), "s2")
    with pg.connect() as conn:
        assert drop_slot(conn, "s2") is True
