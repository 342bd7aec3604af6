"""The pipeline end to end: real PostgreSQL 15 and 18, real local Spark, real Delta tables.

* a randomized workload (every type, key changes, deletes, TOAST, truncates, prepared
  transactions, subtransactions, a streamed transaction, schema changes) around three
  ``run --until-caught-up`` runs: every mirror equals its source table, the history's current
  rows equal the mirror, and a batch replayed after a failure between two Delta commits is never
  applied twice;
* the row filter examples of the seed (t1/t2/t3, and the partitioned table in both
  ``publish_via_partition_root`` settings) leave the lake as the seed shows the subscriber's
  tables.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from pgcdc.lake.config import ConfigError, PipelineConfig, parse_config
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.catalog import ensure_publication
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.run.verify import compare_tables
from pgcdc.lake.store.state import PipelineState, save_state
from pgcdc.lake.store.tables import HISTORY_COLUMNS, IS_CURRENT, MIRROR_COLUMNS, LakeTable
from pgcdc.lake.store.target import DeltaTarget
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_pipeline import Background
from tests.lake.workload import SCHEMA, TABLES, Workload

pytestmark = pytest.mark.slow


def make_config(
    pg: PgDatabase, lake: Path, tables: list[dict[str, Any]], **extra: Any
) -> PipelineConfig:
    source = {"dsn": pg.dsn(), "slot": "lake_slot", "publication": "lake_pub"}
    source.update(extra.pop("source", {}))
    return parse_config(
        {
            "source": source,
            "lake": {"path": str(lake), **extra.pop("lake_options", {})},
            "stream": extra.pop("stream", {}),
            "tables": tables,
        }
    )


def assert_history_matches_mirror(pipeline: Pipeline, table: LakeTable) -> None:
    mirror = DeltaTarget(table.path(pipeline.layout, "mirror"))
    history = DeltaTarget(table.path(pipeline.layout, "history"))
    mirror_columns = [c for c in mirror.read().column_names if c not in MIRROR_COLUMNS]
    current = history.read().filter(history.read().column(IS_CURRENT))
    assert Counter(
        repr([row[c] for c in mirror_columns]) for row in current.select(mirror_columns).to_pylist()
    ) == Counter(
        repr([row[c] for c in mirror_columns])
        for row in mirror.read().select(mirror_columns).to_pylist()
    ), f"{table.table_id}: history's current versions differ from the mirror"
    versions = history.read().to_pylist()
    for row in versions:  # every closed version ends after it starts
        if row["__end_lsn"] is not None:
            assert row["__end_lsn"] >= row["__start_lsn"]
            assert row["__end_op"] in ("U", "D", "T", "S")  # S: ended by a resync's copy
        else:
            assert row["__end_op"] is None and row["__is_current"]


def batch_commits(target: DeltaTarget) -> list[int]:
    """The stream batch ids of a Delta table's data commits (from their commit metadata)."""
    return [
        int(meta["batch"])
        for _, _, meta in target.commits()
        if isinstance(meta, dict) and "batch" in meta
    ]


def assert_equal(pipeline: Pipeline) -> None:
    assert pipeline.plan is not None
    checks = compare_tables(pipeline.dsn, pipeline.layout, pipeline.plan.tables)
    for check in checks:
        assert check.equal, f"{check.describe()}\n{differing_rows(pipeline, check.table_id)}"


def differing_rows(pipeline: Pipeline, table_id: str, limit: int = 5) -> str:
    """Rows only in the source and only in the lake (for a failing comparison's message)."""
    from pgcdc.lake.run.verify import lake_rows, source_rows

    assert pipeline.plan is not None
    table = pipeline.plan.table(table_id)
    target = DeltaTarget(table.path(pipeline.layout))
    schema = target.arrow_schema()
    assert schema is not None
    columns = [f.name for f in schema if f.name not in MIRROR_COLUMNS]
    types = [schema.field(c).type for c in columns]
    lake = Counter(lake_rows(target, columns))
    source = Counter(source_rows(pipeline.dsn, table, columns, types))
    only_source = list((source - lake).elements())[:limit]
    only_lake = list((lake - source).elements())[:limit]
    return f"only in the source: {only_source}\nonly in the lake: {only_lake}"


@newest_server
def test_randomized_workload(
    pg: PgDatabase, spark: Any, tmp_path: Path, background: Callable[[Pipeline], Background]
) -> None:
    pg.execute(SCHEMA)
    seed = int(os.environ.get("PGCDC_TEST_SEED", pg.major))
    workload = Workload(pg.dsn(), seed=seed)
    workload.run(25)  # the initial copy
    lake = tmp_path / "lake"
    config = make_config(
        pg,
        lake,
        [
            {"name": "public.*"},
            {"name": "everything", "history": True, "changelog": True},
            {"name": "kv", "history": True},
        ],
        stream={"max_changes_per_trigger": 1000, "trigger_interval": 1},
    )
    pipeline = Pipeline(config, spark=spark)
    plan = pipeline.check()
    assert sorted(t.table_id for t in plan.tables) == sorted(TABLES)

    # first start: snapshot while the workload keeps writing, then the stream
    writer = threading.Thread(target=workload.run, args=(40,))
    writer.start()
    result = pipeline.run(until_caught_up=True)
    writer.join()
    assert not result.resumed and sum(result.snapshot_rows.values()) > 0
    with pg.connect() as conn:
        workload.big_transaction(conn)
    workload.run(25)
    Pipeline(config, spark=spark).run(until_caught_up=True)
    first = Pipeline(config, spark=spark)
    first.check()
    assert_equal(first)

    # schema changes while a continuous query runs: the source raises SchemaChanged and the
    # pipeline restarts the query with the new schema
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    failures = run.failures
    workload.schema_changes()
    workload.run(20)
    deadline = time.monotonic() + 240
    while running.restarts == 0 and time.monotonic() < deadline and not failures:
        time.sleep(1)
    run.stop()
    assert not failures and running.restarts >= 1

    # then a failure between the second and third Delta commit of a batch
    workload.run(20)
    failing = Pipeline(config, spark=spark, fail_after_commits=2)
    with pytest.raises(PipelineError, match="injected failure"):
        failing.run(until_caught_up=True)
    final = Pipeline(config, spark=spark)
    result = final.run(until_caught_up=True)
    assert result.resumed
    assert_equal(final)
    assert final.plan is not None
    for table in final.plan.tables:
        if table.history:
            assert_history_matches_mirror(final, table)
        for kind in table.kinds():
            ids = batch_commits(DeltaTarget(table.path(final.layout, kind)))
            assert len(ids) == len(set(ids)), f"{table.table_id} {kind}: a batch applied twice"
    everything = final.plan.table("public.everything")
    changelog = DeltaTarget(everything.path(final.layout, "changelog")).read()
    ops = Counter(changelog.column("__op").to_pylist())
    assert ops["S"] > 0 and ops["I"] > 0 and ops["U"] > 0 and ops["D"] > 0
    assert "vc" in changelog.column_names  # the changelog keeps the dropped column
    mirror_columns = DeltaTarget(everything.path(final.layout)).read().column_names
    assert "vc" not in mirror_columns and "extra" in mirror_columns

    # nothing new: a further run changes no Delta table
    before = {
        (t.table_id, kind): DeltaTarget(t.path(final.layout, kind)).version()
        for t in final.plan.tables
        for kind in t.kinds()
    }
    Pipeline(config, spark=spark).run(until_caught_up=True)
    after = {
        (t.table_id, kind): DeltaTarget(t.path(final.layout, kind)).version()
        for t in final.plan.tables
        for kind in t.kinds()
    }
    assert after == before


SEED_TABLES = """
CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c));
CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d));
CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g));
"""


def mirror_rows(pipeline: Pipeline, table_id: str) -> list[tuple[Any, ...]]:
    assert pipeline.plan is not None
    table = pipeline.plan.table(table_id)
    data = DeltaTarget(table.path(pipeline.layout)).read()
    columns = [c for c in data.column_names if c not in MIRROR_COLUMNS + HISTORY_COLUMNS]
    return sorted(tuple(r[c] for c in columns) for r in data.select(columns).to_pylist())


@newest_server  # the server's row filters are compared on both in tests/filters
def test_seed_row_filters(pg: PgDatabase, spark: Any, tmp_path: Path) -> None:
    pg.execute(SEED_TABLES)
    # t2's filter e = 99 uses a column outside its replica identity: a publication publishing
    # UPDATE and DELETE (which a mirror needs) would make the source's updates fail. pgcdc
    # refuses it before creating anything ...
    refused = make_config(
        pg, tmp_path / "refused", [{"name": "t2", "row_filter": ["e = 99", "d = 10"]}]
    )
    with pytest.raises(ConfigError, match=r"not part of the replica identity"):
        Pipeline(refused, spark=spark).run(until_caught_up=True)
    assert pg.execute("SELECT count(*) FROM pg_publication") == [(0,)]
    assert pg.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]
    # ... and takes it with REPLICA IDENTITY FULL
    pg.execute("ALTER TABLE t2 REPLICA IDENTITY FULL")

    for a, b, c in [(2, 102, "NSW"), (3, 103, "QLD"), (4, 104, "VIC"), (5, 105, "ACT")]:
        pg.execute("INSERT INTO t1 VALUES (%s, %s, %s)", (a, b, c))
    pg.execute("INSERT INTO t2 VALUES (1, 99, 0), (10, 1, 0), (11, 2, 0), (12, 99, 0)")
    pg.execute("INSERT INTO t3 VALUES (10, 1, 1), (11, 1, 1)")
    config = make_config(
        pg,
        tmp_path / "lake",
        [
            {"name": "t1", "row_filter": "a > 5 AND c = 'NSW'"},  # s1 subscribes to p1
            {"name": "t2", "row_filter": ["e = 99", "d = 10"]},  # p2 OR p3
            {"name": "t3", "row_filter": "g = 10"},  # p3
        ],
    )
    Pipeline(config, spark=spark).run(until_caught_up=True)  # snapshot: the filters apply
    for a, b, c in [(6, 106, "NSW"), (7, 107, "NT"), (8, 108, "QLD"), (9, 109, "NSW")]:
        pg.execute("INSERT INTO t1 VALUES (%s, %s, %s)", (a, b, c))
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert mirror_rows(pipeline, "public.t1") == [(6, 106, "NSW"), (9, 109, "NSW")]

    pg.execute("UPDATE t1 SET b = 999 WHERE a = 6")  # old and new match: UPDATE
    pg.execute("UPDATE t1 SET a = 555 WHERE a = 2")  # only new matches: INSERT
    pg.execute("UPDATE t1 SET c = 'VIC' WHERE a = 9")  # only old matches: DELETE
    pg.execute("UPDATE t2 SET e = 99 WHERE d = 11")
    pg.execute("UPDATE t2 SET e = 0 WHERE d = 12")
    pg.execute("INSERT INTO t3 VALUES (12, 2, 2)")
    pg.execute("UPDATE t3 SET h = 5 WHERE g = 10")
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert mirror_rows(pipeline, "public.t1") == [(6, 999, "NSW"), (555, 102, "NSW")]
    assert mirror_rows(pipeline, "public.t2") == [(1, 99, 0), (10, 1, 0), (11, 99, 0)]
    assert mirror_rows(pipeline, "public.t3") == [(10, 5, 1)]
    assert_equal(pipeline)


@newest_server
def test_seed_partitioned_table(pg: PgDatabase, spark: Any, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a)")
    pg.execute("CREATE TABLE child PARTITION OF parent DEFAULT")
    via_root = make_config(
        pg,
        tmp_path / "via_root",
        [{"name": "parent", "row_filter": "a < 5"}, {"name": "child", "row_filter": "a >= 5"}],
        source={"slot": "p4_root", "publication": "p4_root", "via_partition_root": True},
    )
    Pipeline(via_root, spark=spark).run(until_caught_up=True)
    pg.execute("INSERT INTO parent VALUES (2), (4), (6)")
    pg.execute("INSERT INTO child VALUES (3), (5), (7)")
    root = Pipeline(via_root, spark=spark)
    root.run(until_caught_up=True)
    assert mirror_rows(root, "public.parent") == [(2,), (3,), (4,)]

    leaves = make_config(
        pg,
        tmp_path / "leaves",
        [{"name": "parent"}, {"name": "child", "row_filter": "a >= 5"}],
        source={"slot": "p4_leaves", "publication": "p4_leaves"},
    )
    Pipeline(leaves, spark=spark).run(until_caught_up=True)  # snapshot: 5, 6, 7
    pg.execute("TRUNCATE parent")
    pg.execute("INSERT INTO parent VALUES (2), (4), (6)")
    pg.execute("INSERT INTO child VALUES (3), (5), (7)")
    leaf = Pipeline(leaves, spark=spark)
    leaf.run(until_caught_up=True)
    assert mirror_rows(leaf, "public.child") == [(5,), (6,), (7,)]
    assert leaf.plan is not None
    assert [t.table_id for t in leaf.plan.tables] == ["public.child"]
    assert_equal(leaf)
    root.run(until_caught_up=True)
    assert mirror_rows(root, "public.parent") == [(2,), (3,), (4,)]


@newest_server
def test_unfinished_snapshot_is_copied_again(pg: PgDatabase, spark: Any, tmp_path: Path) -> None:
    """A first start that died during the copy (state saved, slot created, a partial table)
    is redone from scratch: new slot, next generation, no leftovers."""
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    pg.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 30) g")
    config = make_config(pg, tmp_path / "lake", [{"name": "items", "history": True}])
    crashed = Pipeline(config, spark=spark)
    plan = crashed.check()
    ensure_publication(pg.dsn(), config, plan)
    state = PipelineState.new(
        system_identifier=str(
            pg.execute("SELECT system_identifier FROM pg_control_system()")[0][0]
        ),
        database=pg.dbname,
        slot="lake_slot",
        publication="lake_pub",
        tables=("public.items",),
    )
    save_state(crashed.layout, state)
    pg.execute("SELECT pg_create_logical_replication_slot('lake_slot', 'pgoutput')")
    history_path = plan.table("public.items").path(crashed.layout, "history")
    leftover = history_path.local() / "part-x.parquet"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"partial")
    pg.execute("UPDATE items SET qty = 0 WHERE id <= 10")  # after the crashed slot's start

    again = Pipeline(config, spark=spark)
    result = again.run(until_caught_up=True)
    assert result.snapshot_rows == {"public.items": 30}
    assert again.state is not None and again.state.generation == 2
    assert again.state.snapshot_done
    assert not leftover.exists()
    assert_equal(again)
    history = DeltaTarget(plan.table("public.items").path(again.layout, "history")).read()
    assert history.num_rows == 30 and set(history.column("__start_op").to_pylist()) == {"S"}


@newest_server
def test_a_torn_first_checkpoint_write_does_not_stall_later_runs(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """A kill -9 while Spark renamed the checkpoint's first offset file left
    ``offsets/.0.<uuid>.tmp``: Spark refuses a checkpoint at batch 0 that holds any file, so
    every later run failed the same way (found by the kill -9 chaos suite)."""
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    pg.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 30) g")
    config = make_config(pg, tmp_path / "lake", [{"name": "items"}])
    first = Pipeline(config, spark=spark)
    first.run(until_caught_up=True)  # the copy; nothing to stream yet
    assert first.state is not None
    checkpoint = first.state.checkpoint(first.layout).local()
    shutil.rmtree(checkpoint)  # as it was when the first run was killed amid its first batch
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / ".0.51c21851-4c3a-4a4e-9d7f-3c4f6b0e8a11.tmp").write_text("v1\n")
    pg.execute("UPDATE items SET qty = -qty WHERE id % 3 = 0")
    pg.execute("INSERT INTO items VALUES (31, 31)")

    second = Pipeline(config, spark=spark)
    second.run(until_caught_up=True)
    assert_equal(second)
    assert not list((checkpoint / "offsets").glob(".*.tmp"))


@newest_server
def test_a_float_key_changed_to_minus_zero_reads_minus_zero(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """PostgreSQL's 0 and -0 are one key but two values; an update between them is a key change
    (its old key is sent). Spark's equality also takes them as one key, so the MERGE matched the
    stored row and kept its 0 (keys were never set): the mirror read 0 where PostgreSQL reads
    -0."""
    pg.execute("CREATE TABLE f (id float8 PRIMARY KEY, r real UNIQUE NOT NULL, v int)")
    pg.execute("ALTER TABLE f REPLICA IDENTITY USING INDEX f_r_key")
    pg.execute("INSERT INTO f VALUES (0, 0, 1), (1, 1, 1)")
    config = make_config(pg, tmp_path / "lake", [{"name": "f", "history": True}])
    Pipeline(config, spark=spark).run(until_caught_up=True)
    pg.execute("UPDATE f SET id = '-0', r = '-0', v = 2 WHERE id = 0")
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    rows = mirror_rows(pipeline, "public.f")
    assert [(math.copysign(1, i), math.copysign(1, r), v) for i, r, v in rows] == [
        (-1.0, -1.0, 2),
        (1.0, 1.0, 1),
    ]
    assert_equal(pipeline)
    assert_history_matches_mirror(pipeline, pipeline.plan.table("public.f"))  # type: ignore[union-attr]


@newest_server
def test_an_inheritance_parent_holds_its_own_rows(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """A publication of a table publishes its inheritance children too, and the stream sends
    a child's changes under the child: the parent's copy read the children's rows as well
    (``FROM`` without ``ONLY``), and kept them after the child deleted them."""
    pg.execute("CREATE TABLE parent (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE child (extra int) INHERITS (parent)")
    pg.execute("ALTER TABLE child ADD PRIMARY KEY (id)")
    pg.execute("INSERT INTO parent VALUES (1, 'p'), (2, 'p')")
    pg.execute("INSERT INTO child VALUES (10, 'c', 0), (11, 'c', 0)")
    config = make_config(pg, tmp_path / "lake", [{"name": "parent"}, {"name": "child"}])
    Pipeline(config, spark=spark).run(until_caught_up=True)
    pg.execute("DELETE FROM parent WHERE id IN (2, 10)")  # one row of each table
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert [r[0] for r in mirror_rows(pipeline, "public.parent")] == [1]
    assert [r[0] for r in mirror_rows(pipeline, "public.child")] == [11]
    assert_equal(pipeline)


@newest_server
def test_the_copy_outlasts_the_databases_time_limits(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """A database's ``idle_in_transaction_session_timeout`` (and PostgreSQL 17's
    ``transaction_timeout``) ended the walsender holding the exported snapshot while the copy
    ran, and its ``statement_timeout`` a long COPY: every start failed the same way."""
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, payload text)")
    pg.execute("INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 400000) g")
    database = sql.Identifier(pg.dbname)
    for setting in ("idle_in_transaction_session_timeout", "transaction_timeout"):
        pg.execute(
            sql.SQL("ALTER DATABASE {} SET {} = '300ms'").format(database, sql.Identifier(setting))
        )
    pg.execute(sql.SQL("ALTER DATABASE {} SET statement_timeout = '300ms'").format(database))
    config = make_config(
        pg, tmp_path / "lake", [{"name": "items"}], stream={"snapshot_partitions_per_table": 1}
    )
    first = Pipeline(config, spark=spark)
    result = first.run(until_caught_up=True)
    assert result.snapshot_rows == {"public.items": 400000}
    assert result.snapshot_seconds > 0.3  # the snapshot was held longer than every limit
    pg.execute("UPDATE items SET payload = 'x' WHERE id % 1000 = 0")
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert_equal(pipeline)
