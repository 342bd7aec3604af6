"""Hostile identifiers end to end: quotes, spaces, dots, unicode and upper case in schema, table
and column names, through the whole pipeline (config, publication, snapshot, stream, lake).

One schema ``Weird "Schema"`` with three tables (``tab le ü``, ``Mixed.Case`` and ``../up``),
whose columns are ``Id``, ``first name``, ``qu"ote`` and ``größe`` with the composite primary key
(``Id``, ``first name``); history and changelog on; the tables are configured with the quoted
``name`` syntax (a pattern for the schema and one exact entry with a row filter on ``"Id"``).
Inserts, updates (a key change among them, and rows moving in and out of the row filter) and
deletes around two ``run --until-caught-up`` (the snapshot, then the stream): every mirror equals
its source, the history's current versions equal the mirror, the changelog holds the streamed
changes, and every lake folder is a safe path inside the lake root.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.tables import encode_name
from pgcdc.lake.store.target import DeltaTarget
from tests.fix_pg import PgDatabase, newest_server
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, make_config

pytestmark = pytest.mark.slow

SCHEMA = 'Weird "Schema"'
FILTERED = "tab le ü"
TABLES = (FILTERED, "Mixed.Case", "../up")
COLUMNS = ("Id", "first name", 'qu"ote', "größe")


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _table(name: str) -> sql.Identifier:
    return sql.Identifier(SCHEMA, name)


def _insert(pg: PgDatabase, table: str, rows: list[tuple[Any, ...]]) -> None:
    query = sql.SQL("INSERT INTO {} ({}) VALUES (%s, %s, %s, %s)").format(
        _table(table), sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
    )
    with pg.connect() as conn, conn.cursor() as cur:
        cur.executemany(query, rows)


def _stmt(pg: PgDatabase, template: str, table: str, params: tuple[Any, ...] = ()) -> None:
    """``template`` with {t} for the table and {c0}..{c3} for the columns."""
    idents = {f"c{i}": sql.Identifier(c) for i, c in enumerate(COLUMNS)}
    pg.execute(sql.SQL(template).format(t=_table(table), **idents), params)


def _assert_safe_paths(lake: Path) -> None:
    root = lake.resolve()
    for path in lake.rglob("*"):
        rel = path.relative_to(lake)
        assert path.resolve().is_relative_to(root), f"{rel} leaves the lake"
        assert '"' not in str(rel) and " " not in str(rel), f"raw quote or space in {rel}"
        assert all(part not in (".", "..") for part in rel.parts), rel
    assert sorted(p.name for p in lake.iterdir()) == sorted(["_pgcdc", encode_name(SCHEMA)])
    expected = {
        encode_name(t) + suffix for t in TABLES for suffix in ("", ".history", ".changelog")
    }
    assert {p.name for p in (lake / encode_name(SCHEMA)).iterdir()} == expected


@newest_server
def test_quoted_unicode_identifiers_end_to_end(pg: PgDatabase, spark: Any, tmp_path: Path) -> None:
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    for table in TABLES:
        _stmt(
            pg,
            "CREATE TABLE {t} ({c0} int, {c1} text, {c2} text, {c3} numeric(10,2), "
            "PRIMARY KEY ({c0}, {c1}))",
            table,
        )
        _insert(pg, table, [(i, f"n{i}", f'q"{i}', i * 1.5) for i in range(1, 21)])
        _insert(pg, table, [(1000 + i, f"n{i}", "outside", None) for i in range(3)])
    lake = tmp_path / "lake"
    key_filter = f"{quoted('Id')} < 1000"
    config = make_config(
        pg,
        lake,
        [
            {"name": f"{quoted(SCHEMA)}.*", "history": True, "changelog": True},
            {
                "name": f"{quoted(SCHEMA)}.{quoted(FILTERED)}",
                "row_filter": key_filter,
                "history": True,
                "changelog": True,
            },
        ],
    )
    pipeline = Pipeline(config, spark=spark)
    plan = pipeline.check()
    assert sorted(t.table_id for t in plan.tables) == sorted(f"{SCHEMA}.{t}" for t in TABLES)
    filtered = plan.table(f"{SCHEMA}.{FILTERED}")
    assert filtered.keys == ("Id", "first name") and filtered.row_filter is not None
    assert all(t.row_filter is None for t in plan.tables if t is not filtered)

    result = pipeline.run(until_caught_up=True)  # the snapshot
    assert result.snapshot_rows == {f"{SCHEMA}.{t}": 20 if t == FILTERED else 23 for t in TABLES}
    assert_equal(pipeline)

    for table in TABLES:
        _insert(pg, table, [(i, f"new {i}", 'n"', 0.25) for i in range(21, 26)])
        _stmt(pg, "UPDATE {t} SET {c2} = 'ü\"pdated', {c3} = {c3} + 1 WHERE {c0} <= 5", table)
        _stmt(pg, "UPDATE {t} SET {c1} = 'renamed ' || {c1} WHERE {c0} = 6", table)  # key
        _stmt(pg, "UPDATE {t} SET {c0} = 700 WHERE {c0} = 7", table)  # key
        _stmt(pg, "DELETE FROM {t} WHERE {c0} IN (8, 9, 22)", table)
        _stmt(pg, "UPDATE {t} SET {c0} = 2000 WHERE {c0} = 10", table)  # leaves the filter
        _stmt(pg, "UPDATE {t} SET {c0} = 500 WHERE {c0} = 1000", table)  # enters the filter
    pipeline = Pipeline(config, spark=spark)  # as a new start does: plans again
    result = pipeline.run(until_caught_up=True)  # the stream
    assert result.resumed and result.changes > 0
    assert_equal(pipeline)
    for table in plan.tables:
        assert_history_matches_mirror(pipeline, table)
        mirror = DeltaTarget(table.path(pipeline.layout)).read()
        assert set(COLUMNS) <= set(mirror.column_names)
        ids = sorted(mirror.column("Id").to_pylist())
        if table is filtered:
            assert ids == [*range(1, 7), *range(11, 22), 23, 24, 25, 500, 700]
        else:
            assert ids == [*range(1, 7), *range(11, 22), 23, 24, 25, 500, 700, 1001, 1002, 2000]
        changelog = DeltaTarget(table.path(pipeline.layout, "changelog")).read()
        assert set(COLUMNS) <= set(changelog.column_names)
        streamed = Counter(op for op in changelog.column("__op").to_pylist() if op != "S")
        if table is filtered:
            # 5 inserts, 5 + 2 updates, 3 deletes (id 8, 9, 22), 10 -> 2000 leaves the filter
            # (a delete), 1000 -> 500 enters it (an insert)
            assert streamed == Counter({"I": 6, "U": 7, "D": 4}), streamed
        else:
            assert streamed == Counter({"I": 5, "U": 9, "D": 3}), streamed
        renamed = [
            r for r in changelog.to_pylist() if r["__op"] == "U" and r["first name"] == "renamed n6"
        ]
        assert len(renamed) == 1 and renamed[0]["__old"]["first name"] == "n6"
    _assert_safe_paths(lake)
