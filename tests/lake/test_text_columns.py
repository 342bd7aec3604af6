"""Values no typed lake column holds, mirrored through ``[[tables]] text_columns``.

PostgreSQL lets a ``numeric(p,s)`` hold NaN, an ``int[]`` hold arrays of any
number of dimensions, and ``time`` hold ``24:00:00``; a typed Delta column holds none of them,
so before ``text_columns`` the initial copy (and every later batch) failed on such a value, run
after run, with no fix but changing the source table. A timestamp key holding both
``infinity`` and 9999-12-31 23:59:59.999999 (one value once clamped to Spark's range) is two
rows as text. Each column in ``text_columns`` is mirrored as the text its type's output
function prints, in the copy and in the stream alike; a time column (a string in the lake)
always is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from pgcdc.lake.config import ConfigError
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.state import request_resync
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_pipeline import Background
from tests.lake.test_pipeline import assert_equal, make_config, mirror_rows

pytestmark = pytest.mark.slow

STOP = {"on_table_failure": "stop"}  # the value's error itself, not the table parked

ODD = """
CREATE TABLE odd (
    id int PRIMARY KEY,
    n numeric(10,2),
    m int[],
    t time,
    c char(4),
    ip inet,
    big text
);
ALTER TABLE odd ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE ts (k timestamp PRIMARY KEY, v int);
"""

ROWS = """
INSERT INTO odd VALUES
    ({0}, 'NaN', '{{{{1,2}},{{3,4}}}}', '24:00:00', 'ab', '10.0.0.1/32', repeat(md5('x'), 700)),
    ({1}, -1.255, '[0:1]={{5,6}}', '12:34:56.5', NULL, '10.0.0.0/8', NULL),
    ({2}, NULL, '{{}}', NULL, 'abcd', NULL, NULL),
    ({3}, 12.5, NULL, '00:00:00', ' ', '::1', NULL)
"""


def odd_rows(pipeline: Pipeline) -> dict[int, tuple[Any, ...]]:
    return {row[0]: row[1:] for row in mirror_rows(pipeline, "public.odd")}


def test_values_no_typed_column_holds_are_mirrored_as_text(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg.execute(ODD)
    pg.execute(ROWS.format(1, 2, 3, 4))
    pg.execute(
        "INSERT INTO ts VALUES ('infinity', 1), ('9999-12-31 23:59:59.999999', 2), "
        "('-infinity', 3), ('0001-01-01 00:00:00', 4)"
    )
    lake = tmp_path / "lake"
    tables = [
        {"name": "odd", "history": True, "changelog": True, "text_columns": ["n", "m", "c", "ip"]},
        {"name": "ts", "history": True, "text_columns": ["k"]},
    ]
    config = make_config(pg, lake, tables)
    first = Pipeline(config, spark=spark)
    first.run(until_caught_up=True)  # the initial copy
    assert_equal(first)
    copied = odd_rows(first)
    # the output functions' text: char(n) keeps its padding, inet drops a /32
    assert copied[1][:5] == ("NaN", "{{1,2},{3,4}}", "24:00:00", "ab  ", "10.0.0.1")
    assert copied[2][:5] == ("-1.26", "[0:1]={5,6}", "12:34:56.5", None, "10.0.0.0/8")
    assert copied[3][:2] == (None, "{}")
    assert copied[4][:2] == ("12.50", None)
    assert len(mirror_rows(first, "public.ts")) == 4

    # the stream: the same values inserted, updated (TOAST unchanged) and deleted
    pg.execute(ROWS.format(11, 12, 13, 14))
    pg.execute("UPDATE odd SET n = 'NaN', m = '{{7},{8}}', t = '24:00' WHERE id IN (1, 4)")
    pg.execute("DELETE FROM odd WHERE id IN (2, 13)")
    pg.execute("UPDATE ts SET v = v + 10 WHERE k IN ('infinity', '-infinity')")
    pg.execute("DELETE FROM ts WHERE k = '9999-12-31 23:59:59.999999'")
    # a column added with a constant default no typed column holds, then mapped as text
    pg.execute("ALTER TABLE odd ADD COLUMN n2 numeric(6,1) DEFAULT 'NaN'")
    pg.execute("INSERT INTO odd (id, n2) VALUES (20, 'NaN'), (21, 3.25)")
    tables[0]["text_columns"] = ["n", "m", "c", "ip", "n2"]
    config = make_config(pg, lake, tables)
    second = Pipeline(config, spark=spark)
    second.run(until_caught_up=True)
    assert_equal(second)
    streamed = odd_rows(second)
    assert streamed[1][:3] == ("NaN", "{{7},{8}}", "24:00:00")
    assert streamed[11][:4] == ("NaN", "{{1,2},{3,4}}", "24:00:00", "ab  ")
    assert streamed[1][-1] == "NaN"  # rows from before the column read its missing value
    assert (streamed[20][-1], streamed[21][-1]) == ("NaN", "3.3")
    assert 2 not in streamed and 13 not in streamed
    assert sorted(v for _, v in mirror_rows(second, "public.ts")) == [4, 11, 13]

    # the lake's column holds text: taking it out of text_columns parks the table (the
    # default), nothing written to it; ts streams on
    tables[0]["text_columns"] = ["n", "c", "ip", "n2"]
    pg.execute("INSERT INTO odd (id) VALUES (30)")
    pg.execute("UPDATE ts SET v = 99 WHERE v = 4")
    third = Pipeline(make_config(pg, lake, tables), spark=spark)
    third.run(until_caught_up=True)
    assert third.state is not None
    reason = third.state.parked()["public.odd"].reason or ""
    assert "'m' of public.odd is mirrored typed now" in reason, reason
    assert 30 not in odd_rows(third)
    assert sorted(v for _, v in mirror_rows(third, "public.ts")) == [11, 13, 99]


def test_without_text_columns_the_error_names_the_column_and_the_fix(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """In the copy and in the stream: the value's column, and text_columns as the fix (it
    said "report a bug in pgcdc")."""
    pg.execute("CREATE TABLE odd (id int PRIMARY KEY, n numeric(10,2), m int[])")
    pg.execute("INSERT INTO odd VALUES (1, 'NaN', '{1}')")
    config = make_config(pg, tmp_path / "lake", [{"name": "odd"}])
    with pytest.raises(PipelineError) as info:
        Pipeline(config, spark=spark).run(until_caught_up=True)
    text = str(info.value)
    assert "column 'n'" in text and 'text_columns = ["n"]' in text, text
    assert "report a bug" not in text

    pg.execute("UPDATE odd SET n = 1")
    config = make_config(pg, tmp_path / "lake", [{"name": "odd"}], lake_options=STOP)
    Pipeline(config, spark=spark).run(until_caught_up=True)  # the copy, again
    pg.execute("UPDATE odd SET m = '{{1},{2}}'")
    with pytest.raises(PipelineError) as info:
        Pipeline(config, spark=spark).run(until_caught_up=True)
    text = str(info.value)
    assert "column 'm'" in text and 'text_columns = ["m"]' in text, text


@newest_server
def test_a_value_no_column_holds_parks_its_table_and_resync_brings_it_back(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """A NaN in the stream for a typed numeric(p,s) parks that table (the default), with the
    column and text_columns as the fix; the other table streams on, and later runs read past
    the parked table's values (more NaNs, DDL) without failing. text_columns and ``pgcdc
    resync`` bring it back, equal to its source."""
    pg.execute(
        "CREATE TABLE odd (id int PRIMARY KEY, n numeric(10,2));"
        "CREATE TABLE fine (id int PRIMARY KEY, v int);"
        "INSERT INTO odd VALUES (1, 1.5), (2, 2.5);"
        "INSERT INTO fine SELECT g, g FROM generate_series(1, 5) g"
    )
    lake = tmp_path / "lake"
    tables: list[dict[str, Any]] = [{"name": "odd"}, {"name": "fine"}]
    config = make_config(pg, lake, tables)
    Pipeline(config, spark=spark).run(until_caught_up=True)  # the copy

    pg.execute("UPDATE odd SET n = 'NaN' WHERE id = 1; UPDATE fine SET v = 10 WHERE id = 1")
    pg.execute("UPDATE fine SET v = 20 WHERE id = 2; DELETE FROM odd WHERE id = 2")
    parked = Pipeline(config, spark=spark)
    parked.run(until_caught_up=True)  # does not raise: fine went on
    assert parked.state is not None
    reason = parked.state.parked()["public.odd"].reason or ""
    assert "column 'n'" in reason and 'text_columns = ["n"]' in reason, reason
    assert "pgcdc resync --config pipeline.toml public.odd" in reason, reason
    assert sorted(mirror_rows(parked, "public.odd")) == [(1, Decimal("1.50")), (2, Decimal("2.50"))]
    assert [v for _, v in mirror_rows(parked, "public.fine")] == [10, 20, 3, 4, 5]

    # the parked table's changes are left unread: its values and DDL fail nothing
    pg.execute("INSERT INTO odd VALUES (3, 'NaN'); ALTER TABLE odd ADD COLUMN w int")
    pg.execute("INSERT INTO odd VALUES (4, 'NaN', 4); UPDATE fine SET v = 30 WHERE id = 3")
    on = Pipeline(config, spark=spark)
    on.run(until_caught_up=True)
    assert [v for _, v in mirror_rows(on, "public.fine")] == [10, 20, 30, 4, 5]
    assert on.state is not None and "public.odd" in on.state.parked()

    tables[0]["text_columns"] = ["n"]
    config = make_config(pg, lake, tables)
    back = Pipeline(config, spark=spark)
    request_resync(back.layout, ["public.odd"])
    assert back.run(until_caught_up=True).added_rows == {"public.odd": 3}
    assert back.state is not None and back.state.parked() == {}
    pg.execute("UPDATE odd SET n = 'NaN' WHERE id = 3; UPDATE fine SET v = 40 WHERE id = 4")
    final = Pipeline(config, spark=spark)
    final.run(until_caught_up=True)
    assert sorted(mirror_rows(final, "public.odd")) == [
        (1, "NaN", None),
        (3, "NaN", None),
        (4, "NaN", 4),
    ]
    assert_equal(final)


def test_a_text_column_the_table_lacks_is_refused(pg: PgDatabase, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE odd (id int PRIMARY KEY, n numeric(10,2))")
    pg.execute("CREATE TABLE odd2 (id int PRIMARY KEY, x int GENERATED ALWAYS AS (id) STORED)")
    for entry, field in (
        ({"name": "odd", "text_columns": ["N"]}, "tables[0].text_columns"),
        ({"name": "odd2", "text_columns": ["x"]}, "tables[0].text_columns"),
        ({"name": "odd*", "text_columns": ["n", "nope"]}, "tables[0].text_columns"),
    ):
        config = make_config(pg, tmp_path / "lake", [entry])
        with pytest.raises(ConfigError) as info:
            Pipeline(config).check()
        assert info.value.problems[0][0] == field, info.value.problems
    assert not (tmp_path / "lake").exists()


def database_default(pg: PgDatabase, name: str, value: str) -> None:
    with pg.connect() as conn:
        database = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(database), sql.Identifier(name), sql.Literal(value)
            )
        )


@newest_server
def test_a_timestamptz_key_as_text_under_a_database_time_zone(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """A composite column makes the stream text format (binary=auto), which the walsender
    printed in the database's TimeZone while the copy printed UTC: the delete's key matched no
    row, and the update added a second one (found by review). --verify read the source in the
    database's zone and float digits too, and called an equal mirror different."""
    database_default(pg, "TimeZone", "America/New_York")
    database_default(pg, "extra_float_digits", "0")
    pg.execute(
        "CREATE TYPE pair AS (a int, b text);"
        "CREATE TABLE ev (k timestamptz PRIMARY KEY, v int, f float8, p pair);"
        "INSERT INTO ev VALUES ('2024-01-02 03:04:05+00', 1, 1.0/3, '(1,x)'),"
        " ('2024-06-01 00:00:00+00', 2, NULL, NULL)"
    )
    config = make_config(pg, tmp_path / "lake", [{"name": "ev", "text_columns": ["k", "f"]}])
    first = Pipeline(config, spark=spark)
    first.run(until_caught_up=True)  # the copy
    assert [row[:3] for row in mirror_rows(first, "public.ev")] == [
        ("2024-01-02 03:04:05+00", 1, "0.3333333333333333"),
        ("2024-06-01 00:00:00+00", 2, None),
    ]
    assert_equal(first)
    pg.execute("DELETE FROM ev WHERE v = 1")
    pg.execute("UPDATE ev SET v = 3 WHERE v = 2")
    second = Pipeline(config, spark=spark)
    second.run(until_caught_up=True)
    assert [row[:2] for row in mirror_rows(second, "public.ev")] == [("2024-06-01 00:00:00+00", 3)]
    assert_equal(second)


@newest_server
def test_a_text_column_a_pattern_table_gains_while_the_query_runs(
    pg: PgDatabase, spark: Any, tmp_path: Path, background: Callable[[Pipeline], Background]
) -> None:
    """The new column's NaN failed the batch before the schema change restarted the query,
    naming as the fix the text_columns already set; and the restarted query kept the options
    of the plan before the change (found by review)."""
    pg.execute(
        "CREATE TABLE odd1 (id int PRIMARY KEY, n numeric(10,2));"
        "CREATE TABLE odd2 (id int PRIMARY KEY, v int);"
        "INSERT INTO odd1 VALUES (1, 'NaN'); INSERT INTO odd2 VALUES (1, 1)"
    )
    config = make_config(pg, tmp_path / "lake", [{"name": "odd*", "text_columns": ["n"]}])
    Pipeline(config, spark=spark).run(until_caught_up=True)  # the copy
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    pg.execute("ALTER TABLE odd2 ADD COLUMN n numeric(10,2)")
    pg.execute("INSERT INTO odd2 VALUES (2, 2, 'NaN')")
    deadline = time.monotonic() + 180
    rows: list[tuple[Any, ...]] = []
    while time.monotonic() < deadline and not run.failures:
        rows = mirror_rows(running, "public.odd2")
        if len(rows) == 2:
            break
        time.sleep(1)
    failures = [str(f.__cause__ or f)[:2000] for f in run.failures]
    run.stop()
    assert not failures, failures
    assert rows == [(1, 1, None), (2, 2, "NaN")]
