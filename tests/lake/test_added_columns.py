"""A column added with a constant default (``ADD COLUMN ... DEFAULT``, which writes nothing to
the WAL): rows written before it read the default in PostgreSQL, and in every lake table,
whether they reached the lake before the column was added or in the same batch as rows that
have it."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.pipeline import Pipeline
from pgcdc.lake.target import DeltaTarget
from tests.fix_pg import PgDatabase, newest_server
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, make_config

pytestmark = pytest.mark.slow

ADDED = {
    "extra": 7,
    "tags": ["a,b", None],
    "note": "x, {y}",
    "amount": Decimal("7.500"),
    "code": "ab  ",
    "feel": "ok",
    "pos": 3,
}


@newest_server
def test_rows_written_before_add_column_read_its_default(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("ALTER TABLE t REPLICA IDENTITY FULL")
    pg.execute("INSERT INTO t VALUES (1, 'snapshot'), (5, 'snapshot')")
    config = make_config(pg, tmp_path / "lake", [{"name": "t", "history": True, "changelog": True}])
    Pipeline(config, spark=spark).run(until_caught_up=True)
    # in the lake before the column exists
    pg.execute("INSERT INTO t VALUES (2, 'before, first batch')")
    pg.execute("UPDATE t SET v = 'updated before, first batch' WHERE id = 5")
    Pipeline(config, spark=spark).run(until_caught_up=True)
    # written before the column exists, read in one batch with rows that have it
    pg.execute("INSERT INTO t VALUES (3, 'before')")
    pg.execute("UPDATE t SET v = 'updated before' WHERE id = 1")
    # types with a typmod, an enum, and a domain in a schema whose name needs quoting (one
    # without constraints: with one, ADD COLUMN rewrites the table, see the README's limits)
    pg.execute("CREATE TYPE feeling AS ENUM ('sad', 'ok')")
    pg.execute('CREATE SCHEMA "Odd Types"')
    pg.execute('CREATE DOMAIN "Odd Types"."pos Int" AS int')
    pg.execute(
        "ALTER TABLE t ADD COLUMN extra bigint DEFAULT 7, "
        "ADD COLUMN tags text[] DEFAULT '{\"a,b\",NULL}', ADD COLUMN note text DEFAULT 'x, {y}', "
        "ADD COLUMN plain text, ADD COLUMN amount numeric(12,3) DEFAULT 7.5, "
        "ADD COLUMN code char(4) DEFAULT 'ab', ADD COLUMN feel feeling DEFAULT 'ok', "
        'ADD COLUMN pos "Odd Types"."pos Int" DEFAULT 3'
    )
    pg.execute("INSERT INTO t VALUES (4, 'after', 1, NULL, NULL, 'p')")
    pg.execute("UPDATE t SET v = 'updated after' WHERE id = 2")
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    pipeline.check()
    assert_equal(pipeline)
    (table,) = pipeline.plan.tables if pipeline.plan else ()
    assert_history_matches_mirror(pipeline, table)

    def images(kind: str) -> list[dict[str, Any]]:
        return DeltaTarget(table.path(pipeline.layout, kind)).read().to_pylist()

    # every stored image of a row written before the column was added reads its default
    history = images("history")
    assert {r["id"] for r in history} == {1, 2, 3, 4, 5} and len(history) == 8
    for row in history:
        if row["id"] != 4:
            assert {k: row[k] for k in ADDED} == ADDED, row
    changelog = images("changelog")
    assert len(changelog) == 2 + 2 + 2 + 2
    for row in changelog:
        if row["id"] != 4:
            assert {k: row[k] for k in ADDED} == ADDED, row
            assert row["plain"] is None
        if row["__op"] == "U":  # REPLICA IDENTITY FULL: the whole old row
            assert row["__old_kind"] == "O"
            assert {k: row["__old"][k] for k in ADDED} == ADDED, row
