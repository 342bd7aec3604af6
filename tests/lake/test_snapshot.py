"""The initial copy (pgcdc.lake.write.snapshot): real PostgreSQL, real local Spark, real Delta
tables.

* the Arrow rows the copy tasks write (``arrow_rows``) are exactly the rows ``snapshot_rows``
  gives in Spark, for the mirror, the history and the changelog of tables of every column type;
* only columns whose rows hold few distinct values are dictionary-encoded in the Parquet files;
* a copy that fails leaves no Parquet file and no table behind;
* the copied files carry the statistics of the tables' key columns (a MERGE skips files by key
  range from the first batch on), under column mapping's physical names, and the tables are
  Delta tables of Delta's Spark connector: Spark's Delta reader and delta-rs read them alike.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.storage import LeaseLost
from pgcdc.lake.store.tables import ROW_ID, LakeLayout, LakeTable
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lake.write.snapshot import (
    DICTIONARY_SAMPLE,
    SnapshotResult,
    _remove_after,
    arrow_rows,
    arrow_schema,
    dictionary_columns,
    remove_tables,
    snapshot_outputs,
    snapshot_rows,
    write_snapshot,
)
from pgcdc.spark import read_snapshot, snapshot_options, snapshot_reader, table_column
from tests.fix_pg import PgDatabase, newest_server
from tests.lake.test_pipeline import make_config
from tests.lake.workload import SCHEMA, TABLES, Workload

pytestmark = pytest.mark.slow

KEYS = {"public.everything": ["id"], "public.kv": ["k1", "k2"], "public.full_t": ["a", "b", "c"]}
STARTED_AT = datetime(2026, 11, 22, 10, 30, 15, 123456, tzinfo=UTC)


def _plan(pg: PgDatabase, spark: Any, lake: Path) -> Pipeline:
    config = make_config(
        pg,
        lake,
        [
            {"name": "everything", "history": True, "changelog": True},
            {"name": "kv", "history": True, "changelog": True},
            {"name": "full_t", "changelog": True},
        ],
    )
    pipeline = Pipeline(config, spark=spark)
    pipeline.check()
    return pipeline


def _sorted(table: pa.Table, keys: list[str]) -> list[dict[str, Any]]:
    return table.sort_by([(k, "ascending") for k in keys]).to_pylist()


def test_arrow_rows_are_the_rows_snapshot_rows_gives_in_spark(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg.execute(SCHEMA)
    Workload(pg.dsn(), seed=pg.major).run(25)
    pg.execute("INSERT INTO full_t VALUES (-1, 'x', 1.5), (-2, NULL, NULL), (-2, NULL, NULL)")
    pipeline = _plan(pg, spark, tmp_path / "lake")
    assert pipeline.plan is not None
    reader = snapshot_reader(snapshot_options(pg.dsn(), tables=list(TABLES)))
    point = reader.consistent_point
    df = read_snapshot(spark, pg.dsn(), tables=list(TABLES), consistentPoint=str(point))
    batches = [batch for p in reader.partitions() for batch in reader.read(p)]
    compared = 0
    for table in pipeline.plan.tables:
        column = table_column(table.schema, table.name)
        outputs = snapshot_outputs(
            spark, reader, pipeline.layout, [table], {table.table_id: column}
        )
        (found,) = outputs.values()
        assert [o.kind for o in found] == list(table.kinds())
        for output in found:
            spec = snapshot_rows(
                df, table, column, output.kind, consistent_point=point, started_at=STARTED_AT
            )
            got = pa.concat_tables(
                [
                    arrow_rows(
                        b, output, consistent_point=point, started_at=STARTED_AT, partition=i
                    )
                    for i, b in enumerate(batches)
                ]
            )
            if ROW_ID in output.schema.names:  # a table without a key: each copy numbered
                ids = got.column(ROW_ID).to_pylist()
                assert len(set(ids)) == len(ids) == got.num_rows
                got = got.drop_columns([ROW_ID])
            # the schema built without Spark is the one Spark gives the expressions
            assert got.schema == arrow_schema(spec.schema)
            want = spec.toArrow()
            want = pa.Table.from_arrays(
                [c.cast(f.type) for c, f in zip(want.columns, got.schema, strict=True)],
                schema=got.schema,
            )
            assert got.num_rows == want.num_rows > 0, (table.table_id, output.kind)
            keys = KEYS[table.table_id]
            # repr: NaN equals NaN, and types are compared too
            assert repr(_sorted(got, keys)) == repr(_sorted(want, keys)), (
                table.table_id,
                output.kind,
            )
            compared += 1
    assert compared == 8  # three mirrors, two histories, three changelogs


@newest_server
def test_a_failed_copy_leaves_no_files_and_commits_nothing(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg.execute(SCHEMA)
    Workload(pg.dsn(), seed=pg.major).run(10)
    pg.execute("INSERT INTO full_t VALUES (-1, 'x', 1.5)")
    lake = tmp_path / "lake"
    pipeline = _plan(pg, spark, lake)
    assert pipeline.plan is not None
    tables = pipeline.plan.tables
    # the changelog of kv cannot be created: its copy task fails, the others may have written
    blocked = pipeline.plan.table("public.kv").path(pipeline.layout, "changelog").local()
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("in the way")
    reader = snapshot_reader(snapshot_options(pg.dsn(), tables=list(TABLES), partitionsPerTable=2))

    def copy() -> SnapshotResult:
        return write_snapshot(
            spark,
            reader,
            pipeline.layout,
            tables,
            {t.table_id: table_column(t.schema, t.name) for t in tables},
            consistent_point=reader.consistent_point,
            started_at=STARTED_AT,
            app_id="test-snapshot",
            generation=1,
        )

    with pytest.raises(Exception, match=r"File exists|Not a directory"):
        copy()
    assert sorted(str(p.relative_to(lake)) for p in lake.rglob("*.parquet")) == []
    for table in tables:
        for kind in table.kinds():
            assert DeltaTarget(table.path(pipeline.layout, kind)).table() is None
    # and with the way clear, the copy writes every table
    blocked.unlink()
    result = copy()
    for table in tables:
        rows = result.rows[table.table_id]
        assert rows > 0
        for kind in table.kinds():
            path = table.path(pipeline.layout, kind)
            target = DeltaTarget(path)
            assert target.read().num_rows == rows, (table.table_id, kind)
            assert spark.read.format("delta").load(str(path)).count() == rows
            # every file has its rows' count and the min/max of the statistics columns
            files = target.files()
            assert sum(files.column("num_records").to_pylist()) == rows
            for column in table.stats_columns(kind):
                if f"min.{column}" in files.column_names:
                    assert files.column(f"min.{column}").null_count < files.num_rows
            first = table.row_keys[0]
            if kind == "mirror":  # the commit time's statistics skip no file they hold
                at = (
                    spark.read.format("delta")
                    .load(str(path))
                    .where(f"__commit_time = '{STARTED_AT.isoformat()}'")
                )
                assert at.count() == rows, table.table_id
            if kind == "mirror" and first in ("id", "k1"):  # integer keys: min/max recorded
                assert files.column(f"min.{first}").null_count == 0, table.table_id
                assert files.column(f"max.{first}").null_count == 0, table.table_id


def test_only_columns_with_few_distinct_values_get_a_dictionary(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    n = 1000
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),  # a key: every value distinct
            "status": pa.array(["new", "paid", "sent"] * (n // 3) + ["new"], pa.string()),
            "lsn": pa.repeat(pa.scalar(42, pa.int64()), n),  # a constant
            "maybe": pa.nulls(n, pa.int32()),  # no values at all
            "old": pa.array([{"a": i, "b": "x"} for i in range(n)]),
            "tags": pa.array([["t"]] * n),
        }
    )
    columns = dictionary_columns(table)
    assert columns == ["status", "lsn", "old.a", "old.b", "tags.list.element"]
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, use_dictionary=columns)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    dictionary = {
        meta.column(i).path_in_schema
        for i in range(meta.num_columns)
        if any("DICTIONARY" in e for e in meta.column(i).encodings)
    }
    assert dictionary == set(columns)


def test_dictionary_columns_are_judged_on_the_first_rows() -> None:
    n = DICTIONARY_SAMPLE * 3
    # two values in the sample, then every value distinct: judged on the sample alone
    late = pa.array([i % 2 if i < DICTIONARY_SAMPLE else i for i in range(n)], pa.int64())
    early = pa.array([i if i < DICTIONARY_SAMPLE else 0 for i in range(n)], pa.int64())
    assert dictionary_columns(pa.table({"late": late, "early": early})) == ["late"]


def test_file_statistics_bound_every_value_or_give_none(tmp_path: Path) -> None:
    """A row group without min/max (pyarrow writes none for text over 4 kB) made the file's
    bounds those of the other row groups: a MERGE by key range then skipped the file holding
    the long key. A date after 9999 failed every copy (no Python date). Both now give no
    bounds for the column (a MERGE reads the file), and the other columns keep theirs."""
    import json
    from datetime import date

    import pyarrow.parquet as pq

    from pgcdc.lake.write.snapshot import SnapshotOutput, file_stats

    long = "z" * 5000
    days = pa.array([0, 2_932_897 + 10], pa.int32()).cast(pa.date32())  # 1970, year 10000
    table = pa.table(
        {
            "k": pa.array(["a", "b", "c", long]),
            "n": pa.array([1, 2, 3, 4], pa.int64()),
            "d": pa.concat_arrays([pa.array([date(2020, 1, 1)] * 2, pa.date32()), days]),
        }
    )
    path = tmp_path / "part.parquet"
    pq.write_table(table, path, row_group_size=2)
    output = SnapshotOutput(
        "public.t", "t", "mirror", str(tmp_path), table.schema, table.schema, ("k", "n", "d")
    )
    stats = json.loads(file_stats(str(path), output))
    assert stats["numRecords"] == 4
    assert stats["minValues"] == {"n": 1} and stats["maxValues"] == {"n": 4}
    assert stats["nullCount"] == {"k": 0, "n": 0, "d": 0}


def test_a_lake_taken_over_keeps_its_tables_when_the_copy_is_removed(tmp_path: Path) -> None:
    """An unfinished copy's tables are removed before copying again, and after a failed
    copy; a run whose lake was taken over removed them too, under the process now writing
    there. Removal checks the lease first."""
    layout = LakeLayout(tmp_path)
    table = LakeTable("public", "t", ("id",), "d", history=True)
    folders = [table.path(layout, kind).local() for kind in table.kinds()]
    for folder in folders:
        (folder / "_delta_log").mkdir(parents=True)

    def lost() -> None:
        raise LeaseLost("the lake was taken over by pgcdc run (pid 1 on another-host)")

    with pytest.raises(LeaseLost):
        remove_tables(layout, [table], lost)
    assert all(folder.is_dir() for folder in folders)
    # after a failed copy: the copy's own error is what is raised, noted with the lease
    failure = RuntimeError("a copy task failed")
    _remove_after(failure, layout, [table], lost)
    assert all(folder.is_dir() for folder in folders)
    assert failure.__notes__ == [
        "the copy's tables were left in place: the lake was taken over by pgcdc run (pid 1 on "
        "another-host)"
    ]
    remove_tables(layout, [table], lambda: None)
    assert not any(folder.exists() for folder in folders)
