"""Compaction, purges and vacuum of the lake's Delta tables (pgcdc.lake.maintenance) with Delta's
own operations: real Delta tables, and a real pipeline whose batches each add files."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.delta import create_table
from pgcdc.lake.maintenance import COMPACT_METADATA, PURGE_METADATA, Maintenance, deleted_share
from pgcdc.lake.pipeline import Pipeline
from pgcdc.lake.target import DeltaTarget
from tests.fix_pg import PgDatabase, newest_server
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, make_config


def _parquet_on_disk(path: Path) -> int:
    """Data files in a table's folder (column mapping spreads them over random subfolders)."""
    return sum(1 for f in path.rglob("*.parquet") if "_delta_log" not in f.parts)


def _appended(spark: Any, path: Path, files: int, start: int = 0) -> str:
    from pyspark.sql import types as T

    if not path.exists():
        schema = T.StructType([T.StructField("id", T.LongType())])
        create_table(spark, path, schema, stats_columns=["id"], what="test")
    for i in range(start, start + files):
        rows = spark.createDataFrame([(j,) for j in range(i * 10, i * 10 + 10)], "id bigint")
        rows.coalesce(1).write.format("delta").mode("append").save(str(path))
    return str(path)


def _operations(path: str) -> list[tuple[str, dict[str, Any] | None]]:
    return [(op, meta) for _, op, meta in DeltaTarget(path).commits()]


def test_small_files_are_compacted_and_replaced_files_vacuumed(spark: Any, tmp_path: Path) -> None:
    path = _appended(spark, tmp_path / "t", 6)
    target = DeltaTarget(path)
    rows = sorted(target.read().column("id").to_pylist())
    Maintenance(compact_files=7, vacuum=False).after_batch(spark, [("t", path)])
    assert len(target.files()) == 6  # fewer small files than the threshold
    maintenance = Maintenance(compact_files=6, vacuum_retention_hours=0)
    assert maintenance.small_files(path) == 6
    maintenance.after_batch(spark, [("t", path)])
    assert len(target.files()) == 1
    assert sorted(target.read().column("id").to_pylist()) == rows
    assert ("OPTIMIZE", COMPACT_METADATA) in _operations(path)
    # the replaced files were deleted (retention 0): only the compacted one is left on disk
    assert _parquet_on_disk(tmp_path / "t") == 1
    # at most one vacuum per vacuum_interval and table
    _appended(spark, tmp_path / "t", 2, start=6)
    Maintenance(compact_files=2, vacuum_retention_hours=0).after_batch(spark, [("t", path)])
    assert len(target.files()) == 1 and _parquet_on_disk(tmp_path / "t") == 4
    # past the interval after the vacuums above, whose time is the real monotonic clock
    later = Maintenance(compact_files=0, vacuum_retention_hours=1)
    clock = time.monotonic()
    assert later.vacuum_if_due(spark, "t", path, now=clock + later.vacuum_interval * 20)
    assert sorted(target.read().column("id").to_pylist()) == sorted(rows + list(range(60, 80)))


def test_a_vacuum_counts_for_the_next_process_through_the_tables_log(
    spark: Any, tmp_path: Path
) -> None:
    """Scheduled runs (``--until-caught-up`` every few minutes) vacuum a table once per
    ``vacuum_interval``, not once per run: a process that never vacuumed the table reads the
    last vacuum's time from its log."""
    from pgcdc.lake import maintenance

    path = _appended(spark, tmp_path / "t", 2)
    assert maintenance.last_vacuum(path) is None
    first = Maintenance(compact_files=0)
    assert first.vacuum_if_due(spark, "t", path)
    maintenance._vacuumed.clear()  # as in the next process
    ended = maintenance.last_vacuum(path)
    assert ended is not None and abs(time.monotonic() - ended) < 120
    assert not Maintenance(compact_files=0).vacuum_if_due(spark, "t", path)
    maintenance._vacuumed.clear()
    later = time.monotonic() + first.vacuum_interval + 1
    assert Maintenance(compact_files=0).vacuum_if_due(spark, "t", path, now=later)


def test_rows_marked_deleted_are_purged_past_the_share(spark: Any, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    path = _appended(spark, tmp_path / "t", 4)
    DeltaTable.forPath(spark, path).delete("id % 10 < 2")  # 20% marked in deletion vectors
    assert deleted_share(spark, path) == pytest.approx(0.2)
    clock = time.monotonic()
    assert not Maintenance(purge_deleted_share=0.25).purge_if_due(spark, "t", path, now=clock)
    purge = Maintenance(purge_deleted_share=0.1)
    # checked at most every vacuum_interval: the check above counts for this table
    assert not purge.purge_if_due(spark, "t", path, now=clock + 1)
    assert purge.purge_if_due(spark, "t", path, now=clock + purge.vacuum_interval + 1)
    assert deleted_share(spark, path) == 0.0
    assert ("REORG", PURGE_METADATA) in _operations(path)
    assert DeltaTarget(path).count() == 32


def test_maintenance_that_fails_never_fails_the_batch(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _appended(spark, tmp_path / "t", 3)
    # the next commit of the log is garbage: loading the table fails
    version = DeltaTarget(path).version()
    assert version is not None
    (tmp_path / "t" / "_delta_log" / f"{version + 1:020d}.json").write_text("not json\n")
    with caplog.at_level(logging.WARNING, logger="pgcdc.lake"):
        Maintenance(compact_files=2).after_batch(spark, [("public.t mirror", path)])
    assert "maintenance (compact) of public.t mirror failed" in caplog.text


@pytest.mark.slow
@newest_server
def test_a_pipeline_compacts_what_its_batches_add(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = make_config(
        pg,
        tmp_path / "lake",
        [{"name": "t", "history": True, "changelog": True}],
        stream={"max_changes_per_trigger": 20},
        lake_options={"compact_files": 3, "vacuum_retention_hours": 0, "vacuum_interval": 0},
    )
    Pipeline(config, spark=spark).run(until_caught_up=True)
    for i in range(4):  # four transactions of 20 changes: four batches
        pg.execute(
            "INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
            (i * 10 + 1, i * 10 + 10),
        )
        pg.execute(
            "UPDATE t SET v = v || '+' WHERE id BETWEEN %s AND %s", (i * 10 + 1, i * 10 + 10)
        )
    pipeline = Pipeline(config, spark=spark)
    result = pipeline.run(until_caught_up=True)
    assert result.batches >= 4
    pipeline.check()
    assert_equal(pipeline)
    (table,) = pipeline.plan.tables if pipeline.plan else ()
    assert_history_matches_mirror(pipeline, table)
    for kind in ("mirror", "history", "changelog"):
        target = DeltaTarget(table.path(pipeline.layout, kind))
        operations = _operations(str(target.path))
        assert ("OPTIMIZE", COMPACT_METADATA) in operations, kind
        assert len(target.files()) < 3 + 3, kind  # compacted as the batches went
        assert _parquet_on_disk(target.path) == len(target.files()), kind  # vacuumed
    changelog = DeltaTarget(table.path(pipeline.layout, "changelog")).read()
    assert changelog.num_rows == 80
