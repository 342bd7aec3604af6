"""The configuration checked against a real source: nothing is created when anything is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from pgcdc.lake.config import ConfigError, PipelineConfig, parse_config
from pgcdc.lake.run.bootstrap import config_problems
from pgcdc.lake.run.catalog import ensure_publication, plan_source
from pgcdc.lake.store.state import PipelineState
from tests.fix_pg import PgDatabase

SCHEMA = """
CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a, c));
CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d));
CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g));
CREATE TABLE nokey(x int, y int);
CREATE TABLE full_id(x int, y text);
ALTER TABLE full_id REPLICA IDENTITY FULL;
CREATE TABLE by_index(x int NOT NULL, y int NOT NULL, z text, PRIMARY KEY (x));
CREATE UNIQUE INDEX by_index_y ON by_index (y);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_y;
CREATE SCHEMA "Odd Schema";
CREATE TABLE "Odd Schema"."T.1"(id int PRIMARY KEY, v text);
CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a);
CREATE TABLE child PARTITION OF parent DEFAULT;
"""


def config(pg: PgDatabase, tables: list[dict[str, Any]], **source: Any) -> PipelineConfig:
    return parse_config(
        {
            "source": {"dsn": pg.dsn(), "slot": "s", "publication": "p", **source},
            "lake": {"path": "/tmp/unused-lake"},
            "tables": tables,
        }
    )


def publications(pg: PgDatabase) -> list[object]:
    return [r[0] for r in pg.execute("SELECT pubname FROM pg_publication ORDER BY 1")]


def errors(pg: PgDatabase, tables: list[dict[str, Any]], **source: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        plan_source(pg.dsn(), config(pg, tables, **source))
    assert publications(pg) == [], "a failed check must create nothing"
    return dict(info.value.problems)


def test_plan_resolves_names_keys_and_filters(pg: PgDatabase) -> None:
    pg.execute(SCHEMA)
    pg.execute("ALTER TABLE t2 REPLICA IDENTITY FULL")  # so that e = 99 is a legal filter
    cfg = config(
        pg,
        [
            {"name": "public.t*"},
            {"name": "t1", "row_filter": "a > 5 AND c = 'NSW'", "history": True},
            {"name": "t2", "row_filter": ["e = 99", "d = 10"]},
            {"name": "full_id", "changelog": True},
            {"name": "by_index"},
            {"name": '"Odd Schema"."T.1"'},
        ],
    )
    plan = plan_source(pg.dsn(), cfg)
    assert publications(pg) == []
    tables = {t.table_id: t for t in plan.tables}
    assert sorted(tables) == [
        "Odd Schema.T.1",
        "public.by_index",
        "public.full_id",
        "public.t1",
        "public.t2",
        "public.t3",
    ]
    assert tables["public.t1"].keys == ("a", "c") and tables["public.t1"].history
    assert tables["public.t1"].row_filter == "((a > 5) AND (c = 'NSW'::text))"
    assert tables["public.t2"].row_filter == "((e = 99) OR (d = 10))"
    assert tables["public.t2"].keys == ("d",)
    assert tables["public.t3"].row_filter is None
    assert tables["public.full_id"].keys == ("x", "y") and tables["public.full_id"].changelog
    assert tables["public.by_index"].keys == ("y",)
    ensure_publication(pg.dsn(), cfg, plan)
    assert publications(pg) == ["p"]
    again = plan_source(pg.dsn(), cfg)  # the existing publication matches: fine
    assert again.publication_exists
    changed = config(pg, [{"name": "t1"}])
    with pytest.raises(ConfigError) as info:
        plan_source(pg.dsn(), changed)
    assert "publishes other tables" in dict(info.value.problems)["source.publication"]


def test_a_publication_pgcdc_created_follows_the_tables_added_and_removed(
    pg: PgDatabase,
) -> None:
    """A pipeline's publication that pgcdc created (``managed``) gains the tables the
    configuration adds (with their row filters) and loses the ones it removes, in place; one
    someone else made is refused as before, and so is a row filter changed on a kept table
    (its mirror holds the old filter's rows), naming the fix."""
    pg.execute(SCHEMA)
    first = config(pg, [{"name": "t1", "row_filter": "a > 5"}, {"name": "t2"}])
    ensure_publication(pg.dsn(), first, plan_source(pg.dsn(), first))
    changed = config(
        pg, [{"name": "t1", "row_filter": "a > 5"}, {"name": "t3", "row_filter": "g < 10"}]
    )
    with pytest.raises(ConfigError, match="publishes other tables"):
        plan_source(pg.dsn(), changed)
    plan = plan_source(pg.dsn(), changed, managed=True)
    assert [t.table_id for t in plan.tables] == ["public.t1", "public.t3"]
    assert [(t.schema, t.name, t.where is not None) for t in plan.publication_add] == [
        ("public", "t3", True)
    ]
    assert [(t.schema, t.name) for t in plan.publication_drop] == [("public", "t2")]
    assert pg.execute("SELECT tablename::text FROM pg_publication_tables ORDER BY 1") == [
        ("t1",),
        ("t2",),
    ], "planning changes nothing"
    ensure_publication(pg.dsn(), changed, plan)
    assert pg.execute(
        "SELECT tablename::text, rowfilter FROM pg_publication_tables ORDER BY 1"
    ) == [("t1", "(a > 5)"), ("t3", "(g < 10)")]
    again = plan_source(pg.dsn(), changed, managed=True)
    assert again.publication_add == () and again.publication_drop == ()
    refiltered = config(
        pg, [{"name": "t1", "row_filter": "a > 6"}, {"name": "t3", "row_filter": "g < 10"}]
    )
    with pytest.raises(ConfigError) as info:
        plan_source(pg.dsn(), refiltered, managed=True)
    assert "add it back with the new filter" in dict(info.value.problems)["tables"]
    # a table the lake mirrors, dropped from the publication behind pgcdc's back, lost its
    # changes since: added back silently, its mirror would have a gap
    pg.execute("ALTER PUBLICATION p DROP TABLE t3")
    state = PipelineState.new(
        system_identifier="1",
        database=pg.dbname,
        slot="s",
        publication="p",
        tables=("public.t1", "public.t3"),
    ).evolve(snapshot_done=True)
    plan = plan_source(pg.dsn(), changed, managed=True)
    # by default the table is parked by the run (``TableChanges.left``); a run whose tables'
    # failures stop it refuses to start, naming the table and the fix
    assert "source.publication" not in dict(config_problems(state, changed, plan, ("1", pg.dbname)))
    stopping = parse_config(
        {
            "source": {"dsn": pg.dsn(), "slot": "s", "publication": "p"},
            "lake": {"path": "/tmp/unused-lake", "on_table_failure": "stop"},
            "tables": [
                {"name": "t1", "row_filter": "a > 5"},
                {"name": "t3", "row_filter": "g < 10"},
            ],
        }
    )
    found = dict(config_problems(state, stopping, plan, ("1", pg.dbname)))
    assert "no longer publishes public.t3" in found["source.publication"]
    assert "pgcdc resync --config pipeline.toml public.t3" in found["source.publication"]


def test_partitioned_tables(pg: PgDatabase) -> None:
    pg.execute(SCHEMA)
    tables = [{"name": "parent", "row_filter": "a < 5"}, {"name": "child", "row_filter": "a >= 5"}]
    via_root = plan_source(pg.dsn(), config(pg, tables, via_partition_root=True))
    assert [(t.table_id, t.row_filter) for t in via_root.tables] == [("public.parent", "(a < 5)")]
    tables = [{"name": "parent"}, {"name": "child", "row_filter": "a >= 5"}]
    leaves = plan_source(pg.dsn(), config(pg, tables))
    assert [(t.table_id, t.row_filter) for t in leaves.tables] == [("public.child", "(a >= 5)")]


def test_wrong_tables(pg: PgDatabase) -> None:
    pg.execute(SCHEMA)
    found = errors(pg, [{"name": "missing"}, {"name": "nothing_*"}])
    assert "'missing' names no table" in found["tables[0].name"]
    assert "matches no table" in found["tables[1].name"]
    found = errors(pg, [{"name": "nokey"}])
    assert "no primary key" in found["tables[0].name"]
    assert "REPLICA IDENTITY FULL" in found["tables[0].name"]


def test_column_names_spark_cannot_tell_apart(pg: PgDatabase) -> None:
    """Spark resolves names without regard to case: a source column named like a metadata
    column in another case, or two differing only in case, are refused before anything is
    created, not on the first batch."""
    pg.execute(
        'CREATE TABLE meta(id int PRIMARY KEY, "__COMMIT_LSN" bigint);'
        'CREATE TABLE work(id int PRIMARY KEY, "__PGCDC_op" text);'
        'CREATE TABLE twins(id int PRIMARY KEY, "Id2" int, id2 int, "V" int);'
    )
    found = errors(pg, [{"name": "meta"}, {"name": "work"}, {"name": "twins"}])
    assert "__COMMIT_LSN" in found["tables[0].name"] and "reserves" in found["tables[0].name"]
    assert "__PGCDC_op" in found["tables[1].name"]
    twins = found["tables[2].name"]
    assert "Id2, id2" in twins and "differ only in case" in twins and "V" not in twins


def test_wrong_row_filters(pg: PgDatabase) -> None:
    pg.execute(SCHEMA)
    found = errors(pg, [{"name": "t2", "row_filter": "e = 99"}])
    assert "not part of the replica identity" in found["tables[0].row_filter"]
    assert "public.t2" in found["tables[0].row_filter"]
    found = errors(pg, [{"name": "t3", "row_filter": "g = = 1"}])  # refused by the parser
    assert 'syntax error at or near "="' in found["tables[0].row_filter"]
    found = errors(pg, [{"name": "t3", "row_filter": "nosuch > 1"}])  # by the server
    assert "PostgreSQL refuses the filter for public.t3" in found["tables[0].row_filter"]
    assert 'column "nosuch" does not exist' in found["tables[0].row_filter"]
    found = errors(pg, [{"name": "t3", "row_filter": "random() > 0.5"}])
    assert "tables[0].row_filter" in found
    found = errors(pg, [])
    assert "no tables configured" in found["tables"]


def test_existing_publication_without_tables(pg: PgDatabase) -> None:
    pg.execute(SCHEMA)
    pg.execute('CREATE PUBLICATION p FOR TABLES IN SCHEMA "Odd Schema"')
    plan = plan_source(pg.dsn(), config(pg, []))
    assert plan.publication_exists
    assert [(t.table_id, t.keys) for t in plan.tables] == [("Odd Schema.T.1", ("id",))]
    pg.execute("ALTER PUBLICATION p SET (publish = 'insert, truncate')")
    with pytest.raises(ConfigError) as info:
        plan_source(pg.dsn(), config(pg, []))
    assert "does not publish delete, update" in dict(info.value.problems)["source.publication"]


def test_tables_whose_names_read_alike_are_refused(pg: PgDatabase) -> None:
    """Schema "a.b" table c and schema a table "b.c" are both a.b.c as schema.table, what the
    lake names a table by: the initial copy failed on them at every start (a zip() error)."""
    pg.execute('CREATE SCHEMA "a.b"; CREATE SCHEMA a')
    pg.execute(
        'CREATE TABLE "a.b".c (id int PRIMARY KEY); CREATE TABLE a."b.c" (id int PRIMARY KEY)'
    )
    problems = errors(pg, [{"name": '"a.b".c'}, {"name": 'a."b.c"'}])
    ((key, problem),) = problems.items()
    assert key in ("tables[0].name", "tables[1].name")
    assert "'a.b.c'" in problem and '"a"."b.c" and "a.b"."c"' in problem, problem
