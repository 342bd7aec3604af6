"""Slot health (retained WAL, warnings, invalidation) and heartbeats that keep a slot moving."""

from __future__ import annotations

import pytest

from pgcdc.lsn import Lsn
from pgcdc.replication import (
    ReplicationSession,
    SlotInvalidatedError,
    SlotNotFoundError,
    StreamOptions,
)
from pgcdc.replication.health import Heartbeat, SlotHealth, raise_if_lost, slot_health
from tests.fix_pg import PgDatabase
from tests.replication.streams import FAST, current_lsn, read, setup_table, slot_row, wait_for


def test_retained_wal_is_measured_and_warned_about(pg: PgDatabase) -> None:
    setup_table(pg)
    fresh = slot_health(pg.dsn(), "s")
    assert fresh.wal_status == "reserved" and not fresh.active and not fresh.lost
    assert fresh.warning() is None
    pg.execute("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
    later = slot_health(pg.dsn(), "s")
    assert later.retained_bytes is not None and later.retained_bytes > 1_000_000
    assert later.lag_bytes is not None and later.lag_bytes > 1_000_000
    assert later.server_lsn > fresh.server_lsn
    warning = later.warning(warn_bytes=100_000)
    assert warning is not None and "retains" in warning and "slot s" in warning
    with pytest.raises(SlotNotFoundError, match="does not exist"):
        slot_health(pg.dsn(), "nope")


def test_invalidated_slot_gives_an_error_naming_the_fix() -> None:
    lost = SlotHealth(
        "s", False, None, "lost", None, Lsn("0/10"), Lsn("1/0"), None, None, None, "1MB"
    )
    assert lost.warning() is not None and "invalidated" in (lost.warning() or "")
    with pytest.raises(SlotInvalidatedError) as info:
        raise_if_lost(lost, "db:5432/app as user cdc")
    assert "Fix: drop the slot and start over with a new snapshot" in str(info.value)
    unreserved = SlotHealth("s", True, 1, "unreserved", None, None, Lsn("1/0"), 10, 10, -5, "1MB")
    assert "max_slot_wal_keep_size" in (unreserved.warning() or "")


def test_heartbeat_moves_an_idle_slot(pg: PgDatabase) -> None:
    """Nothing published changes, yet the slot's confirmed position follows the heartbeats."""
    setup_table(pg)
    start = slot_row(pg)["confirmed_flush_lsn"]
    with ReplicationSession(pg.dsn(), "s", StreamOptions(publication_names=("pub",)), **FAST) as s:
        with Heartbeat(pg.dsn(), interval=0.2) as beat:
            wait_for(lambda: beat.beats >= 2)
            mark = current_lsn(pg)
            read(s, lambda r: s.confirmed_lsn >= mark, timeout=20)
        wait_for(lambda: slot_row(pg)["confirmed_flush_lsn"] >= mark, timeout=20)
    assert slot_row(pg)["confirmed_flush_lsn"] > start
    assert beat.failures == 0


def test_heartbeat_table_mode(pg: PgDatabase) -> None:
    beat = Heartbeat(pg.dsn(), mode="table", table="hb", interval=1)
    first = beat.beat()
    second = beat.beat()
    beat.stop()
    assert second > first
    assert pg.execute("SELECT count(*) FROM public.hb") == [(1,)]
    with pytest.raises(ValueError, match="'message' or 'table'"):
        Heartbeat(pg.dsn(), mode="sql")


def test_heartbeat_survives_errors(pg: PgDatabase) -> None:
    """A failing beat is counted and retried; it never stops the heartbeat."""
    beat = Heartbeat(pg.dsn(), interval=0.1, mode="table", table="hb2", create=False)
    beat.start()
    wait_for(lambda: beat.failures >= 2, timeout=10)  # the table does not exist yet
    assert beat.beats == 0
    pg.execute("CREATE TABLE hb2 (id int PRIMARY KEY, beat timestamptz)")
    pg.execute("INSERT INTO hb2 VALUES (1, now())")
    wait_for(lambda: beat.beats >= 2, timeout=10)
    beat.stop()
