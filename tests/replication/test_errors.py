"""Each way a session can fail raises a ReplicationError naming the cause and the fix."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from pgcdc.cli.throwaway_server import free_port
from pgcdc.replication import (
    PublicationNotFoundError,
    ReplicationError,
    ReplicationPermissionError,
    ReplicationSession,
    ServerUnreachableError,
    SlotActiveError,
    SlotInvalidatedError,
    SlotMismatchError,
    SlotNotFoundError,
    SqlSlotReader,
    StreamOptions,
    scrub_secrets,
)
from pgcdc.replication.errors import describe_server
from tests.fix_pg import PgDatabase
from tests.replication.streams import FAST, setup_table, slot_row, wait_for

OPTIONS = StreamOptions(("pub",))


def _both(pg: PgDatabase, slot: str = "s", dsn: str | None = None) -> Iterator[object]:
    """The same failure through the replication session and through the SQL interface."""
    yield ReplicationSession(dsn or pg.dsn(), slot, OPTIONS, **FAST, slot_wait=0.5)
    yield SqlSlotReader(dsn or pg.dsn(), slot, OPTIONS, poll_interval=0.1, slot_wait=0.5)


def _connect(source: object) -> None:
    assert isinstance(source, ReplicationSession | SqlSlotReader)
    try:
        source.connect()
        next(iter(source.events()))
    finally:
        source.close()


def test_wrong_slot_name(pg: PgDatabase) -> None:
    setup_table(pg)
    for source in _both(pg, "no_such_slot"):
        with pytest.raises(SlotNotFoundError) as err:
            _connect(source)
        assert "'no_such_slot' does not exist on 127.0.0.1:" in str(err.value)
        assert "Fix: create it first" in str(err.value)
    with pytest.raises(ValueError, match="lower-case letters, digits and underscores"):
        ReplicationSession(pg.dsn(), "Bad-Name", OPTIONS)


def test_missing_publication(pg: PgDatabase) -> None:
    setup_table(pg)
    options = StreamOptions(("pub", "nopub"))
    for source in (
        ReplicationSession(pg.dsn(), "s", options, **FAST),
        SqlSlotReader(pg.dsn(), "s", options),
    ):
        with pytest.raises(PublicationNotFoundError) as err:
            _connect(source)
        assert "'nopub' do not exist" in str(err.value)
        assert "create_publication" in str(err.value)


def test_publication_dropped_while_streaming(pg: PgDatabase) -> None:
    """PostgreSQL 15 fails at the next change; 18 skips the missing publication and warns."""
    setup_table(pg)
    with ReplicationSession(pg.dsn(), "s", OPTIONS, **FAST) as session:
        next(iter(session.events()))
        pg.execute("DROP PUBLICATION pub")
        pg.execute("INSERT INTO t VALUES (1, 'x')")
        if pg.major == 15:
            with pytest.raises(PublicationNotFoundError, match="'pub' does not exist"):
                for _ in session.events():
                    pass
        else:
            events = iter(session.events())
            assert all(type(next(events)).__name__ == "Idle" for _ in range(5))


def test_permission_denied(pg: PgDatabase) -> None:
    setup_table(pg)
    role = f"norepl_{pg.dbname}"
    pg.execute(f"CREATE ROLE {role} LOGIN")
    try:
        for source in _both(pg, dsn=pg.dsn(user=role)):
            with pytest.raises(ReplicationPermissionError) as err:
                _connect(source)
            message = str(err.value)
            assert f"role '{role}'" in message
            assert f"ALTER ROLE {role} REPLICATION" in message
    finally:
        pg.execute(f"DROP ROLE {role}")


def test_server_unreachable_without_leaking_the_password(
    pg: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = free_port()  # nothing listens there
    dsn = f"host=127.0.0.1 port={port} dbname=app user=cdc password=S3cr3t-pw connect_timeout=2"
    for source in _both(pg, dsn=dsn):
        with pytest.raises(ServerUnreachableError) as err:
            _connect(source)
        text = f"{err.value} {err.value!r} {err.value.cause} {err.value.fix}"
        assert f"127.0.0.1:{port}/app as user cdc" in text
        assert "Connection refused" in text
        assert "S3cr3t" not in text
    uri = f"postgresql://cdc:S3cr3t-pw@127.0.0.1:{port}/app"
    with pytest.raises(ServerUnreachableError) as err:
        _connect(ReplicationSession(uri, "s", OPTIONS))
    assert "S3cr3t" not in str(err.value)
    assert all("S3cr3t" not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("dsn", "secret"),
    [
        ("postgresql://cdc:S3cr%t!pw@127.0.0.1:1/app", "S3cr"),  # not percent-encoded
        ("postgresql://cdc:hun ter2@127.0.0.1:1/app", "hun ter2"),
        ("host=127.0.0.1 password=hunter2 secondhalf", "secondhalf"),  # a space in it
        ("postgresql://cdc:Pa/ssW0rd@127.0.0.1:1/app", "ssW0rd"),  # a slash in it
    ],
    ids=["percent", "space-uri", "space-keyword", "slash"],
)
def test_a_connection_string_libpq_cannot_read_never_shows_its_password(
    pg: PgDatabase, caplog: pytest.LogCaptureFixture, dsn: str, secret: str
) -> None:
    """libpq's parse errors quote the piece they stumbled on, and a password with a character
    a URI reserves splits into host, port and database: none of it reaches a message or log."""
    caplog.set_level(logging.DEBUG)
    for source in _both(pg, dsn=dsn):
        with pytest.raises(ReplicationError) as err:
            _connect(source)
        text = f"{err.value} {err.value!r}"
        assert secret not in text, text
    assert secret not in describe_server(dsn)
    assert all(secret not in r.getMessage() for r in caplog.records)


def test_scrub_secrets() -> None:
    assert scrub_secrets("host=h password=abc user=u") == "host=h password=*** user=u"
    assert scrub_secrets("password = 'a b\\'c' x=1") == "password = *** x=1"
    assert scrub_secrets("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert scrub_secrets("postgres://h/db?user=u&password=pw&x=1") == (
        "postgres://h/db?user=u&password=***&x=1"
    )
    error = ReplicationError("cannot use dsn host=h password=hunter2", "fix password=hunter2")
    assert "hunter2" not in str(error)
    # the client key's passphrase, and a double-quoted value (libpq keeps the quotes)
    assert scrub_secrets("host=h sslpassword=keypass sslkey=k") == (
        "host=h sslpassword=*** sslkey=k"
    )
    assert (
        scrub_secrets("postgres://h/db?sslpassword=kp&x=1") == "postgres://h/db?sslpassword=***&x=1"
    )
    assert scrub_secrets('host=h password="secret" x=1') == "host=h password=*** x=1"


def test_slot_already_active(pg: PgDatabase) -> None:
    setup_table(pg)
    with ReplicationSession(pg.dsn(), "s", OPTIONS, **FAST) as first:
        next(iter(first.events()))
        pid = slot_row(pg)["active_pid"]
        for source in _both(pg):
            with pytest.raises(SlotActiveError) as err:
                _connect(source)
            assert "in use by" in str(err.value)
            assert "pg_terminate_backend" in str(err.value)
        assert slot_row(pg)["active_pid"] == pid  # the first consumer was left alone


def test_slot_released_while_waiting(pg: PgDatabase) -> None:
    """A consumer that just stopped leaves its walsender exiting for a moment: the next one
    waits for the slot (``slot_wait``) instead of failing with SlotActiveError."""
    setup_table(pg)
    first = ReplicationSession(pg.dsn(), "s", OPTIONS, **FAST)
    first.connect()
    next(iter(first.events()))
    pid = slot_row(pg)["active_pid"]
    timer = threading.Timer(1.5, first.close)
    timer.start()
    second = ReplicationSession(pg.dsn(), "s", OPTIONS, **FAST, slot_wait=30)
    try:
        second.connect()
        next(iter(second.events()))
        assert slot_row(pg)["active_pid"] not in (None, pid)
    finally:
        second.close()
        timer.join()


def test_slot_invalidated(pg: PgDatabase) -> None:
    setup_table(pg)
    pg.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    pg.execute("SELECT pg_reload_conf()")
    try:
        for i in range(4):  # move the WAL well past what the slot may keep
            pg.execute("INSERT INTO t VALUES (%s, repeat('x', 1000))", (i,))
            pg.execute("SELECT pg_switch_wal()")
        pg.execute("CHECKPOINT")
        wait_for(lambda: slot_row(pg)["wal_status"] == "lost", timeout=10)
    finally:
        pg.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        pg.execute("SELECT pg_reload_conf()")
    for source in _both(pg):
        with pytest.raises(SlotInvalidatedError) as err:
            _connect(source)
        message = str(err.value)
        assert "invalidated" in message and "'lost'" in message
        assert "drop the slot and create it again" in message


def test_slot_of_another_plugin_or_database(pg: PgDatabase) -> None:
    setup_table(pg)
    pg.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    with pytest.raises(SlotMismatchError, match="'test_decoding', not pgoutput"):
        _connect(ReplicationSession(pg.dsn(), "td", OPTIONS))
    other_db = pg.cluster.dsn("postgres")
    with pytest.raises(SlotMismatchError, match=f"belongs to database '{pg.dbname}'"):
        _connect(ReplicationSession(other_db, "s", OPTIONS))
