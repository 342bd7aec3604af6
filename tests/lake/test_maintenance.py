"""Compaction and vacuum of the lake's Delta tables (pgcdc.lake.maintenance): real Delta tables,
and a real pipeline whose batches each add files."""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pgcdc.lake.maintenance import COMPACT_METADATA, Maintenance
from pgcdc.lake.pipeline import Pipeline
from pgcdc.lake.target import DeltaTarget
from tests.fix_pg import PgDatabase
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, make_config


def _parquet_on_disk(path: Path) -> int:
    return len(list(path.glob("*.parquet")))


def _appended(path: Path, files: int) -> DeltaTarget:
    for i in range(files):
        rows = pa.table({"id": list(range(i * 10, i * 10 + 10))})
        write_deltalake(str(path), rows, mode="append")
    return DeltaTarget(path)


def test_small_files_are_compacted_and_replaced_files_vacuumed(tmp_path: Path) -> None:
    target = _appended(tmp_path / "t", 6)
    rows = sorted(target.read().column("id").to_pylist())
    keep = Maintenance(compact_files=7, vacuum=False)
    keep.after_batch([("t", target)])
    assert len(target.table().file_uris()) == 6  # fewer small files than the threshold
    maintenance = Maintenance(compact_files=6, vacuum_retention_hours=0)
    assert maintenance.small_files(target) == 6
    maintenance.after_batch([("t", target)])
    table = target.table()
    assert len(table.file_uris()) == 1
    assert sorted(target.read().column("id").to_pylist()) == rows
    compactions = [c for c in table.history() if c.get("operation") == "OPTIMIZE"]
    assert len(compactions) == 1 and compactions[0]["pgcdc"] == COMPACT_METADATA["pgcdc"]
    # the replaced files were deleted (retention 0): only the compacted one is left on disk
    assert _parquet_on_disk(tmp_path / "t") == 1
    # at most one vacuum per vacuum_interval and table
    _appended(tmp_path / "t", 2)
    Maintenance(compact_files=2, vacuum_retention_hours=0).after_batch([("t", target)])
    assert len(target.table().file_uris()) == 1 and _parquet_on_disk(tmp_path / "t") == 4
    # a file no version ever referenced (a write killed before its commit) goes too, once
    # older than the retention, and only with a retention of an hour or more (a younger file
    # may be another writer's, about to be committed)
    orphan, young = tmp_path / "t" / "part-orphan.parquet", tmp_path / "t" / "part-young.parquet"
    orphan.write_bytes(b"PAR1")
    young.write_bytes(b"PAR1")
    two_hours_ago = time.time() - 7200
    os.utime(orphan, (two_hours_ago, two_hours_ago))
    later = Maintenance(compact_files=0, vacuum_retention_hours=0)
    # past the interval after the vacuum above, whose time is the real monotonic clock (the
    # machine's uptime: a fixed time is within the interval of it on a machine up long enough)
    clock = time.monotonic()
    assert later.vacuum_if_due("t", target, now=clock + later.vacuum_interval * 10) > 0
    assert _parquet_on_disk(tmp_path / "t") == 3 and orphan.exists() and young.exists()
    hourly = Maintenance(compact_files=0, vacuum_retention_hours=1)
    hourly.vacuum_if_due("t", target, now=clock + hourly.vacuum_interval * 20)
    assert not orphan.exists() and young.exists()
    assert _parquet_on_disk(tmp_path / "t") == 2
    assert sorted(target.read().column("id").to_pylist()) == sorted(rows + list(range(20)))


def test_small_files_compaction_cannot_merge_do_not_make_every_batch_compact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # small files each between two files above the target size: no compaction merges them
    path = tmp_path / "t"
    for i in range(4):
        write_deltalake(str(path), pa.table({"id": [i]}), mode="append")
        big = pa.table({"id": [random.getrandbits(62) for _ in range(2000)]})
        write_deltalake(str(path), big, mode="append")
    target = DeltaTarget(path)
    maintenance = Maintenance(compact_files=3, target_file_size=4096, vacuum=False)
    assert maintenance.small_files(target) == 4
    version = target.table().version()
    assert maintenance.compact("t", target)  # tried once: nothing to merge
    assert maintenance.small_files(target) == 4 and target.table().version() == version
    with caplog.at_level(logging.DEBUG, logger="pgcdc.lake"):
        caplog.clear()
        assert not maintenance.compact("t", target)  # not again and again
    assert "compacted" not in caplog.text
    # new small files, side by side, count: the next compaction merges them
    for i in range(3):
        write_deltalake(str(path), pa.table({"id": [100 + i]}), mode="append")
    assert maintenance.compact("t", target)
    assert maintenance.small_files(target) == 5 and len(target.table().file_uris()) == 9
    assert not maintenance.compact("t", target)


def test_maintenance_that_fails_never_fails_the_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = _appended(tmp_path / "t", 3)
    # the next commit of the log is garbage: loading the table fails
    (tmp_path / "t" / "_delta_log" / f"{3:020d}.json").write_text("not json\n")
    with caplog.at_level(logging.WARNING, logger="pgcdc.lake"):
        Maintenance(compact_files=2).after_batch([("public.t mirror", target)])
    assert "maintenance (compact) of public.t mirror failed" in caplog.text


@pytest.mark.slow
def test_a_pipeline_compacts_what_its_batches_add(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = make_config(
        pg,
        tmp_path / "lake",
        [{"name": "t", "history": True, "changelog": True}],
        stream={"max_changes_per_trigger": 20},
        lake_options={"compact_files": 4, "vacuum_retention_hours": 0, "vacuum_interval": 0},
    )
    Pipeline(config, spark=spark).run(until_caught_up=True)
    for i in range(12):  # twelve transactions of 20 changes: twelve batches
        pg.execute(
            "INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
            (i * 10 + 1, i * 10 + 10),
        )
        pg.execute(
            "UPDATE t SET v = v || '+' WHERE id BETWEEN %s AND %s", (i * 10 + 1, i * 10 + 10)
        )
    pipeline = Pipeline(config, spark=spark)
    result = pipeline.run(until_caught_up=True)
    assert result.batches >= 12
    pipeline.check()
    assert_equal(pipeline)
    (table,) = pipeline.plan.tables if pipeline.plan else ()
    assert_history_matches_mirror(pipeline, table)
    for kind in ("mirror", "history", "changelog"):
        target = DeltaTarget(table.path(pipeline.layout, kind))
        delta = target.table()
        assert delta is not None
        assert any(c.get("operation") == "OPTIMIZE" for c in delta.history()), kind
        assert len(delta.file_uris()) < 4 + 4, kind  # compacted as the batches went
        assert _parquet_on_disk(target.path) == len(delta.file_uris()), kind  # vacuumed
    changelog = DeltaTarget(table.path(pipeline.layout, "changelog")).read()
    assert changelog.num_rows == 240
