"""Source-catalog queries against real servers, with names that need quoting."""

from __future__ import annotations

import pytest
from psycopg import sql

from pgcdc.replication import source_catalog
from pgcdc.replication.database import connect_sql
from tests.fix_pg import PgDatabase


@pytest.mark.parametrize("name", ["t%(col)s", "a%b", 'Odd "T"'])
def test_written_when_added_reads_the_named_table_whatever_its_name(
    pg: PgDatabase, name: str
) -> None:
    """A '%' in a table's name once became a query placeholder: the query read another table
    (``t%(col)s`` read ``t$1``) or failed (``a%b``)."""

    def run(statement: str) -> None:
        pg.execute(sql.SQL(statement).format(sql.Identifier(name)))

    pg.execute("CREATE TABLE t (id int)")  # what ``t%(col)s`` turned into, with other rows
    run("CREATE TABLE {} (id int PRIMARY KEY)")
    run("INSERT INTO {} VALUES (1), (2)")
    run("ALTER TABLE {} ADD COLUMN later text")
    run("ALTER TABLE {} ALTER COLUMN later SET DEFAULT 'x'")
    pg.execute("ALTER TABLE t ADD COLUMN u uuid DEFAULT gen_random_uuid()")
    run("ALTER TABLE {} ADD COLUMN u uuid DEFAULT gen_random_uuid()")
    with connect_sql(pg.dsn()) as conn:
        assert not source_catalog.written_when_added(conn, "public", name, "later")
        assert source_catalog.written_when_added(conn, "public", name, "u")
        run("TRUNCATE {}")
        assert not source_catalog.written_when_added(conn, "public", name, "u")
