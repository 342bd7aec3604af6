"""CopyConnection: a COPY read through a write callback, against real servers.

* every CopyData message reaches ``write`` in order, and the row count is the server's;
* statements run in the caller's transaction (a snapshot-importing REPEATABLE READ one);
* a refused statement raises ``StatementError`` with its SQLSTATE, a refused login or an
  unreachable server the ``ReplicationError`` the psycopg 3 helpers raise, without the password;
* an exception raised by ``write`` ends the COPY at once and propagates as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from psycopg import sql

from pgcdc.replication import ReplicationError, ServerUnreachableError
from pgcdc.replication.copy import CopyConnection, StatementError
from pgcdc.replication.database import connect_sql
from tests.fix_pg import PgDatabase


def test_copy_out_hands_every_message_to_write_in_order(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE t (id int, note text)")
    pg.execute("INSERT INTO t SELECT g, 'n' || g FROM generate_series(1, 2500) g")
    messages: list[bytes] = []
    with CopyConnection(pg.dsn()) as conn:
        rows = conn.copy_out(
            sql.SQL("COPY (SELECT * FROM {} ORDER BY id) TO STDOUT").format(sql.Identifier("t")),
            messages.append,
        )
    assert rows == 2500
    # text COPY: one message per row, exactly the server's rows
    assert [m.decode() for m in messages] == [f"{i}\tn{i}\n" for i in range(1, 2501)]
    assert all(isinstance(m, bytes) for m in messages)


def test_statements_run_in_the_callers_transaction(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE t (id int)")
    pg.execute("INSERT INTO t VALUES (1)")
    with CopyConnection(pg.dsn()) as conn:
        conn.execute("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        assert conn.execute("SELECT count(*) FROM t") == [(1,)]
        pg.execute("INSERT INTO t VALUES (2)")  # committed elsewhere, after the snapshot
        messages: list[bytes] = []
        assert conn.copy_out("COPY t TO STDOUT", messages.append) == 1
        assert messages == [b"1\n"]
        assert conn.execute("COMMIT") == []
        assert conn.execute("SELECT count(*) FROM t") == [(2,)]


def test_a_failed_statement_names_its_sqlstate(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE t (id int)")
    with CopyConnection(pg.dsn()) as conn:
        with pytest.raises(StatementError) as err:
            conn.copy_out("COPY (SELECT nope FROM t) TO STDOUT", lambda m: None)
        assert err.value.sqlstate == "42703"
        assert "nope" in str(err.value)
        assert not err.value.lost
    with CopyConnection(pg.dsn()) as conn:
        conn.execute("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(StatementError) as err:
            conn.execute("SET TRANSACTION SNAPSHOT '00000003-0000001B-1'")
        # no such snapshot: invalid_parameter_value (15), undefined_object (18)
        assert err.value.sqlstate in ("22023", "42704")
        assert "snapshot" in str(err.value).lower()


def _refusal(connect: Callable[[str], object], dsn: str) -> ReplicationError:
    with pytest.raises(ReplicationError) as err:
        connect(dsn)
    assert "S3cr3t-pw" not in str(err.value)
    return err.value


def test_a_refused_login_is_the_error_the_sql_helpers_raise(pg: PgDatabase) -> None:
    role = f"nologin_{pg.dbname}"
    pg.execute(f"CREATE ROLE {role} NOLOGIN")
    try:
        for dsn in (
            pg.dsn(user=role, password="S3cr3t-pw"),
            "host=127.0.0.1 port=1 dbname=x user=x password=S3cr3t-pw",
        ):
            ours = _refusal(CopyConnection, dsn)
            theirs = _refusal(connect_sql, dsn)
            assert type(ours) is type(theirs)
            assert ours.fix == theirs.fix
    finally:
        pg.execute(f"DROP ROLE {role}")
    unreachable = _refusal(CopyConnection, "host=127.0.0.1 port=1 dbname=x user=x")
    assert isinstance(unreachable, ServerUnreachableError)


def test_an_exception_in_write_ends_the_copy_at_once(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE t (id int, note text)")
    pg.execute("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 200000) g")

    class Enough(Exception):
        pass

    seen = 0

    def write(message: bytes) -> None:
        nonlocal seen
        seen += 1
        if seen == 10:
            raise Enough

    with CopyConnection(pg.dsn()) as conn:
        started = time.monotonic()
        with pytest.raises(Enough):
            conn.copy_out("COPY t TO STDOUT", write)
        assert time.monotonic() - started < 5
    assert seen == 10
