"""Fixtures: real, throwaway PostgreSQL 15 and 18 servers shared across the test session.

``pg_server`` is parametrized over both major versions, so every test that uses it (directly or
through ``pg``) runs against both. ``pg`` gives each test its own fresh database on that server
and drops it, with any replication slots in it, afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgcdc.cli.throwaway_server import Cluster

PG_VERSIONS = (15, 18)
_counter = itertools.count()

#: Marks a test of what the server's version does not change (how the lake writes a decoded
#: stream: the layers that meet the server, protocol to Spark source, are tested on both): it
#: runs against the newest server only, so that the suite stays within CI's time. Regression
#: tests of issue 24's three defects run on both.
newest_server = pytest.mark.parametrize(
    "pg_server", [PG_VERSIONS[-1]], indirect=True, ids=[f"pg{PG_VERSIONS[-1]}"]
)


@pytest.fixture(scope="session", params=PG_VERSIONS, ids=lambda v: f"pg{v}")
def pg_server(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cluster = Cluster(request.param)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass
class PgDatabase:
    """One test's database on a throwaway server."""

    cluster: Cluster
    dbname: str

    @property
    def major(self) -> int:
        return self.cluster.major

    def dsn(self, **extra: str) -> str:
        return self.cluster.dsn(self.dbname, **extra)

    def connect(self, autocommit: bool = True) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.dsn(), autocommit=autocommit)

    def execute(
        self, query: str | sql.Composable, params: object = None
    ) -> list[tuple[object, ...]]:
        """Run one statement in its own autocommit connection; the rows it returns, if any."""
        with self.connect() as conn:
            cur = conn.execute(query, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []


def drop_slots(conn: psycopg.Connection[Any], dbname: str | None = None) -> None:
    """Drop the replication slots (of ``dbname``, or all): terminate a walsender still using
    one and wait for it to release the slot (termination, and a walsender's exit after its
    client went away, are asynchronous)."""
    for (slot,) in conn.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE %s::text IS NULL OR database = %s",
        (dbname, dbname),
    ).fetchall():
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = %s AND active_pid IS NOT NULL",
            (slot,),
        )
        deadline = time.monotonic() + 30
        while (
            conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            == (True,)
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def _drop_database(cluster: Cluster, dbname: str) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        drop_slots(conn, dbname)
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
        )


@contextlib.contextmanager
def _database(server: Cluster) -> Iterator[PgDatabase]:
    dbname = f"t{next(_counter)}"
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    db = PgDatabase(server, dbname)
    try:
        yield db
    finally:
        # prepared transactions pin the database: roll them back first
        with psycopg.connect(db.dsn(), autocommit=True) as conn:
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
            ).fetchall():
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        _drop_database(server, dbname)
        # replication origins belong to the whole server, not to the database
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin")


@pytest.fixture
def pg(pg_server: Cluster) -> Iterator[PgDatabase]:
    """A fresh database for one test, on PostgreSQL 15 and on 18."""
    with _database(pg_server) as db:
        yield db


@pytest.fixture(scope="module")
def pg_module(pg_server: Cluster) -> Iterator[PgDatabase]:
    """A database shared by the tests of one module, on PostgreSQL 15 and on 18."""
    with _database(pg_server) as db:
        yield db
