"""Source-catalog queries against real servers, with names that need quoting."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgcdc.replication import source_catalog
from pgcdc.replication.database import connect_sql
from tests.fix_pg import PgDatabase

#: Columns added with a constant default (kept in ``attmissingval``), and one with ``now()``
CONSTANTS = (
    "ADD COLUMN c int DEFAULT 9, ADD COLUMN code char(4) DEFAULT 'ab', "
    "ADD COLUMN neg bigint DEFAULT -1, ADD COLUMN tags text[] DEFAULT '{\"a,b\",NULL}', "
    "ADD COLUMN amount numeric(12,3) DEFAULT 7.5, ADD COLUMN quote text DEFAULT 'it''s', "
    "ADD COLUMN at timestamptz DEFAULT '2024-01-02 03:04:05+02', ADD COLUMN yes bool DEFAULT "
    "true, ADD COLUMN now timestamptz DEFAULT now(), ADD COLUMN later text"
)


def missing(conn: psycopg.Connection[Any], name: str) -> dict[str, str]:
    oid = conn.execute("SELECT %s::regclass::oid::int8", (sql.Identifier(name).as_string(conn),))
    ((relid,),) = oid.fetchall()
    return {c: t for (_, c), t in source_catalog.missing_value_texts(conn, [relid]).items()}


def unknown(
    conn: psycopg.Connection[Any], name: str, column: str
) -> source_catalog.UnknownValue | None:
    oid = conn.execute("SELECT %s::regclass::oid::int8", (sql.Identifier(name).as_string(conn),))
    ((relid,),) = oid.fetchall()
    return source_catalog.unknown_missing_value(conn, relid, column)


@pytest.mark.parametrize("rewrite", ["ALTER TABLE {} ALTER COLUMN m TYPE bigint", "VACUUM FULL {}"])
@pytest.mark.parametrize("name", ["t%(col)s", 'Odd "T"'])
def test_a_constant_default_is_read_after_a_rewrite_cleared_it(
    pg: PgDatabase, name: str, rewrite: str
) -> None:
    """Issue 41: a table rewrite after a constant-default ``ADD COLUMN`` writes the value into
    the rows and clears ``attmissingval``; the constant default gives the same text (the
    column's typmod applied). A default given later (``SET DEFAULT``) gave those rows nothing;
    ``now()``'s value is lost. (A '%' in a table's name once became a query placeholder.)"""

    def run(statement: str) -> None:
        pg.execute(sql.SQL(statement).format(sql.Identifier(name)))

    run("CREATE TABLE {} (id int PRIMARY KEY, m int)")
    run("INSERT INTO {} VALUES (1, 1), (2, 2)")
    pg.execute(sql.SQL("ALTER TABLE {} ").format(sql.Identifier(name)) + sql.SQL(CONSTANTS))
    run("ALTER TABLE {} ALTER COLUMN later SET DEFAULT 'x'")
    with connect_sql(pg.dsn()) as conn:
        kept = missing(conn, name)
        assert set(kept) == {"c", "code", "neg", "tags", "amount", "quote", "at", "yes", "now"}
        run("INSERT INTO {} (id, m) VALUES (3, 3)")
        run(rewrite)
        del kept["now"]
        assert missing(conn, name) == kept
        for column in (*kept, "later"):
            assert unknown(conn, name, column) is None, column
        assert unknown(conn, name, "now") == ("computed once", "now()")


def test_defaults_the_catalog_no_longer_tells(pg: PgDatabase) -> None:
    """A default computed row by row rewrote the table when added, still told after a
    ``VACUUM FULL`` (which keeps the rows' xmin) and not after a ``TRUNCATE``; a default stored
    again by its column's type change, rewriting the table, tells nothing."""
    pg.execute("CREATE TABLE v (id int PRIMARY KEY)")
    pg.execute("INSERT INTO v VALUES (1), (2)")
    pg.execute("ALTER TABLE v ADD COLUMN u uuid DEFAULT gen_random_uuid()")
    pg.execute("CREATE TABLE r (id int PRIMARY KEY)")
    pg.execute("INSERT INTO r VALUES (1), (2)")
    pg.execute("ALTER TABLE r ADD COLUMN c int DEFAULT 9")
    pg.execute("ALTER TABLE r ALTER COLUMN c TYPE bigint")
    with connect_sql(pg.dsn()) as conn:
        assert unknown(conn, "v", "u") == ("row by row", "gen_random_uuid()")
        pg.execute("VACUUM FULL v")
        assert unknown(conn, "v", "u") == ("row by row", "gen_random_uuid()")
        pg.execute("TRUNCATE v")
        assert unknown(conn, "v", "u") is None
        assert "c" not in missing(conn, "r")
        assert unknown(conn, "r", "c") == ("stored again", "9")
