"""A column added with a constant default (``ADD COLUMN ... DEFAULT``, which writes nothing to
the WAL): rows written before it read the default in PostgreSQL, and in every lake table,
whether they reached the lake before the column was added or in the same batch as rows that
have it, and also when a table rewrite wrote it into the rows before pgcdc read the column.
What the lake cannot give those rows stops the pipeline, saying why."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.tables import LakeTable
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lake.write.missing import missing_values
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
    # a default given later: the rows written before read NULL in it, as the lake does
    pg.execute("ALTER TABLE t ALTER COLUMN plain SET DEFAULT 'later'")
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


def test_a_constant_default_survives_a_later_rewrite(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """Issue 41: a table rewrite (here a type change of another column) after a constant-default
    ``ADD COLUMN``, before pgcdc read it, writes the default into the rows and clears
    ``attmissingval``: the run stopped, taking the cleared value for a default computed row by
    row. The rows written before the column was added read the default in the mirror, every
    history version and every changelog image (new and whole old), as the source's rows
    (which hold it now) read it: copied, streamed before the ``ADD COLUMN`` in the batch, and
    updated after it."""
    pg.execute("CREATE TABLE s2 (id int PRIMARY KEY, n int, m int, vc varchar(10))")
    pg.execute("ALTER TABLE s2 REPLICA IDENTITY FULL")
    pg.execute("INSERT INTO s2 VALUES (1, 1, 1, 'a'), (2, 2, 2, 'b'), (3, 3, 3, 'c')")
    config = make_config(
        pg, tmp_path / "lake", [{"name": "s2", "history": True, "changelog": True}]
    )
    Pipeline(config, spark=spark).run(until_caught_up=True)  # the copy
    pg.execute("INSERT INTO s2 VALUES (4, 4, 4, 'd')")  # streamed before the ADD COLUMN
    pg.execute("UPDATE s2 SET n = 10 WHERE id = 1")
    pg.execute("DELETE FROM s2 WHERE id = 3")
    pg.execute("ALTER TABLE s2 ADD COLUMN c5 int DEFAULT 9")
    pg.execute("INSERT INTO s2 (id, n, m, vc) VALUES (3001, 1, 1, 'z')")
    pg.execute("INSERT INTO s2 VALUES (3002, 1, 1, 'y', 5)")
    pg.execute("UPDATE s2 SET n = 20 WHERE id = 2")  # a row written before, updated after
    pg.execute("ALTER TABLE s2 ALTER COLUMN m TYPE bigint")  # rewrites: attmissingval cleared
    pg.execute("UPDATE s2 SET n = 40 WHERE id = 4")
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    pipeline.check()
    assert_equal(pipeline)
    (table,) = pipeline.plan.tables if pipeline.plan else ()
    assert_history_matches_mirror(pipeline, table)

    # no row's c5 changed over its life: each image reads the source's value (the deleted
    # row, written before the column was added, its default)
    source = {r[0]: r[1] for r in pg.execute("SELECT id, c5 FROM s2")}
    assert source == {1: 9, 2: 9, 4: 9, 3001: 9, 3002: 5}
    expected = {**source, 3: 9}

    def images(kind: str) -> list[dict[str, Any]]:
        return DeltaTarget(table.path(pipeline.layout, kind)).read().to_pylist()

    history = images("history")
    assert {r["id"] for r in history} == set(expected) and len(history) == 9
    for row in history:
        assert row["c5"] == expected[row["id"]], row
    changelog = images("changelog")
    assert len(changelog) == 3 + 7  # the copy, then every change
    for row in changelog:
        if row["__op"] != "D":  # a delete has only the old image
            assert row["c5"] == expected[row["id"]], row
        if row["__op"] in ("U", "D"):  # REPLICA IDENTITY FULL: the whole old row
            assert row["__old_kind"] == "O"
            assert row["__old"]["c5"] == expected[row["__old"]["id"]], row


@newest_server
@pytest.mark.parametrize(
    "column",
    [
        "u uuid DEFAULT gen_random_uuid()",
        "n bigserial",
        "i int GENERATED BY DEFAULT AS IDENTITY",
        "p posint DEFAULT 5",
    ],
    ids=["volatile", "serial", "identity", "domain-with-check"],
)
def test_a_column_added_by_rewriting_the_table_stops_the_pipeline(
    pg: PgDatabase, spark: Any, tmp_path: Path, column: str
) -> None:
    """PostgreSQL rewrites the table to give existing rows a default computed row by row, and
    logical replication sends none of those values: the lake's rows would read NULL where
    PostgreSQL's hold values. The pipeline stops and names the table, the column and the fix;
    the lake keeps its last consistent state."""
    pg.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    config = make_config(pg, tmp_path / "lake", [{"name": "t"}])
    Pipeline(config, spark=spark).run(until_caught_up=True)
    pg.execute(f"ALTER TABLE t ADD COLUMN {column}")
    pg.execute("INSERT INTO t (id, v) VALUES (3, 'c')")
    name = column.split(maxsplit=1)[0]
    with pytest.raises(Exception, match=f"rewritten when column '{name}' was added") as failed:
        Pipeline(config, spark=spark).run(until_caught_up=True)
    assert "copy the table again" in str(failed.value)


@pytest.mark.parametrize(
    ("statements", "cause"),
    [
        (
            ["ALTER TABLE t ADD COLUMN c timestamptz DEFAULT now()", "VACUUM FULL t"],
            r"t was rewritten \(VACUUM FULL, .*\(DEFAULT now\(\)\) is not a literal of its type "
            "but was computed when the column was added",
        ),
        (
            ["ALTER TABLE t ADD COLUMN c int DEFAULT 9", "ALTER TABLE t ALTER COLUMN c TYPE int8"],
            r"column 'c' of public\.t had its type changed, .*ALTER COLUMN TYPE stored its "
            r"default \(DEFAULT 9\) again",
        ),
    ],
    ids=["computed-once", "stored-again"],
)
def test_a_value_the_catalog_no_longer_tells_stops_with_its_cause(
    pg: PgDatabase, statements: list[str], cause: str
) -> None:
    """A table rewrite before pgcdc read an ``ADD COLUMN`` removed the value the rows written
    before it read, and the column's default does not give it back: the error says why (not
    that the default is computed row by row) and the fix. What the lake's batch asks,
    without Spark."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg.execute("INSERT INTO t VALUES (1), (2)")
    for statement in statements:
        pg.execute(statement)
    table = LakeTable("public", "t", ("id",), "d")
    with pytest.raises(PipelineError, match=cause) as failed:
        missing_values(pg.dsn(), table, {"c": pa.int64()})
    assert "rewritten when column" not in str(failed.value)
    assert "Fix: copy the table again" in str(failed.value)


@newest_server
def test_a_column_dropped_and_added_again_under_its_name(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """Dropped and added again between two runs, a column keeps its name but not its values:
    the lake's rows held the old column's. They stayed (10 and 20 where PostgreSQL reads 7);
    now the run stops naming the column. Dropped in one run and added again in the next, the
    new column is an added one: existing rows read its default."""
    pg.execute("CREATE TABLE c (id int PRIMARY KEY, x int, y int)")
    pg.execute("INSERT INTO c VALUES (1, 10, 1), (2, 20, 2)")
    config = make_config(
        pg,
        tmp_path / "lake",
        [{"name": "c", "history": True}],
        lake_options={"on_table_failure": "stop"},  # parking: test_shape.py
    )
    Pipeline(config, spark=spark).run(until_caught_up=True)
    pg.execute("ALTER TABLE c DROP COLUMN x")
    pg.execute("ALTER TABLE c ADD COLUMN x int DEFAULT 7")
    pg.execute("INSERT INTO c VALUES (3, 1, 30)")
    with pytest.raises(Exception, match=r"column 'x' of public\.c was dropped and added") as failed:
        Pipeline(config, spark=spark).run(until_caught_up=True)
    assert "Fix: pgcdc resync" in str(failed.value)

    other = tmp_path / "lake2"
    config = make_config(
        pg, other, [{"name": "c"}], source={"slot": "lake_slot2", "publication": "lake_pub2"}
    )
    Pipeline(config, spark=spark).run(until_caught_up=True)
    pg.execute("ALTER TABLE c DROP COLUMN y")
    pg.execute("INSERT INTO c VALUES (4, 4)")
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert_equal(pipeline)
    pg.execute("ALTER TABLE c ADD COLUMN y int DEFAULT 5")
    pg.execute("INSERT INTO c VALUES (5, 5, 50)")
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert_equal(pipeline)
