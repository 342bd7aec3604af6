"""Delta's commit API as ``TableLog`` drives it: what a commit costs in Spark jobs, before and
after a process restarts (its in-memory state gone), and the checksum files that spare the
next process the table's state rebuilt."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.store.delta import create_table
from pgcdc.lake.store.deltalog import TableLog, write_checksums
from pgcdc.lake.store.target import DeltaTarget


def _jobs(spark: Any) -> int:
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def _forget_logs(spark: Any) -> None:
    """As a new process: Delta's cached logs and their snapshots gone."""
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def _commit(
    spark: Any,
    path: str,
    batch: int,
    actions: list[dict[str, Any]] | None = None,
    snapshot: Any | None = None,
) -> int:
    """Commit ``actions`` (none by default) as batch ``batch``, on top of ``snapshot`` (default:
    the table's latest)."""
    table = TableLog(spark, path)
    return table.commit(
        actions or [],
        snapshot=table.snapshot() if snapshot is None else snapshot,
        session=spark,
        app_id="test-deltalog",
        txn_version=batch,
        metadata={"batch": batch},
    )


def test_commits_run_no_spark_job_and_a_restart_reads_the_checksum(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import types as T

    path, bare = str(tmp_path / "t"), str(tmp_path / "bare")
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
    for each in (path, bare):
        create_table(spark, each, schema, stats_columns=["id"], what="t")
        _commit(spark, each, 1)
    before = _jobs(spark)
    for batch in range(2, 5):
        _commit(spark, path, batch)
        TableLog(spark, path).schema()  # the next batch's schema check
    # a STREAMING UPDATE commit's checksum is derived from the previous one's: no job rebuilds
    # the table's state after it, nor to read the schema of the new version
    assert _jobs(spark) == before
    log_dir = Path(path) / "_delta_log"
    assert not list(log_dir.glob("*.crc")) or all(
        p.name.startswith(".") for p in log_dir.glob("*.crc")
    )
    _forget_logs(spark)  # the bare table: a restart without its checksum file
    before = _jobs(spark)
    _commit(spark, bare, 2)
    assert _jobs(spark) > before  # its state rebuilt to derive the new checksum
    for batch in range(5, 7):
        _commit(spark, path, batch)
    written = write_checksums(spark)
    assert written >= 1
    checksum = log_dir / f"{6:020d}.crc"
    assert checksum.exists()
    crc = json.loads(checksum.read_text())
    assert crc["numFiles"] == 0 and crc["metadata"]["id"]
    assert write_checksums(spark) == 0  # written once per version
    _forget_logs(spark)
    before = _jobs(spark)
    assert TableLog(spark, path).schema()["fields"][0]["name"] == "id"
    assert _commit(spark, path, 7) == 7
    # the new process's first commit derives its checksum from the file: still no job
    assert _jobs(spark) == before
    commit = next(TableLog(spark, path).commits(7, 7))
    assert commit.operation == "STREAMING UPDATE"
    assert commit.transactions == {"test-deltalog": 7}
    assert commit.metadata == {"batch": 7}


def _mark(spark: Any, path: str, rows: list[int], batch: int) -> None:
    """Mark ``rows`` (row indexes) of the table's one data file deleted, in one commit."""
    import numpy as np

    table = TableLog(spark, path)
    snapshot = table.snapshot()
    (stored,) = table.files(snapshot)
    updated = table.mark_deleted([(stored, np.array(rows, dtype=np.int64))])
    now = int(time.time() * 1000)
    actions = [stored.remove_action(now), updated[stored.path].add_action()]
    _commit(spark, path, batch, actions, snapshot)


def test_deletion_vectors_merge_with_the_ones_written_before_and_after_a_restart(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import types as T

    from pgcdc.lake.store import deltalog

    path = str(tmp_path / "t")
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
    create_table(spark, path, schema, stats_columns=["id"], what="t")
    rows = [(i, f"v{i}") for i in range(1000)]
    spark.createDataFrame(rows, schema).coalesce(1).write.format("delta").mode("append").save(path)
    (first,) = TableLog(spark, path).files()
    # the file's rows in order (column mapping: its columns have physical names; id is first)
    order = [r[0] for r in spark.read.parquet(f"{path}/{first.path}").collect()]
    gone: set[int] = set()

    def mark(positions: list[int], batch: int) -> None:
        _mark(spark, path, positions, batch)
        gone.update(order[p] for p in positions)
        expected = sorted(set(order) - gone)
        seen = sorted(r["id"] for r in spark.read.format("delta").load(path).collect())
        assert seen == expected
        read = DeltaTarget(path).read(["id"]).column("id").to_pylist()
        assert sorted(read) == expected

    mark([0, 5, 999], 1)
    (marked,) = TableLog(spark, path).files()
    assert marked.deletion_vector is not None
    key = deltalog._vector_key(path, marked.deletion_vector)
    held = deltalog._WRITTEN_VECTORS.take(key)  # the vector this process wrote is remembered
    assert held is not None and held.tolist() == [0, 5, 999]
    deltalog._WRITTEN_VECTORS.put(key, held)
    mark([5, 6, 500], 2)  # merged with the remembered vector (5 again: once)
    assert deltalog._WRITTEN_VECTORS.take(key) is None  # replaced: no longer held
    (marked,) = TableLog(spark, path).files()
    assert marked.deletion_vector is not None
    assert marked.deletion_vector["cardinality"] == 5
    # as a new process: nothing remembered, the current vector read through Delta's store
    held = deltalog._WRITTEN_VECTORS.take(deltalog._vector_key(path, marked.deletion_vector))
    assert held is not None and held.tolist() == [0, 5, 6, 500, 999]
    _forget_logs(spark)
    mark([1, 2, 500], 3)
    (marked,) = TableLog(spark, path).files()
    assert marked.deletion_vector is not None
    assert marked.deletion_vector["cardinality"] == 7


def test_batched_calls_of_the_jar_commit_what_the_calls_one_by_one_commit(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgcdc's jar parses a commit's actions and writes its deletion vectors in one gateway
    call each; without the jar the same Delta calls are made one by one. Both commit the same
    table, as Spark's Delta reader and delta-rs read it."""
    import numpy as np
    from pyspark.sql import types as T

    from pgcdc.lake.store import deltalog

    classes = deltalog._classes(spark.sparkContext._jvm)
    assert classes.batched is not None, "pgcdc's jar is not loaded: run `make setup`"
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
    rows = [(i, f"v{i}") for i in range(3000)]
    seen: dict[str, list[int]] = {}
    for how in ("batched", "one by one"):
        if how == "one by one":
            monkeypatch.setattr(classes, "batched", None)
        path = str(tmp_path / how.replace(" ", "-"))
        create_table(spark, path, schema, stats_columns=["id"], what="t")
        df = spark.createDataFrame(rows, schema).repartition(3, "id").sortWithinPartitions("id")
        df.write.format("delta").mode("append").save(path)
        for batch in (1, 2):  # the second merges with the first's vectors
            table = TableLog(spark, path)
            snapshot = table.snapshot()
            stored = sorted(table.files(snapshot), key=lambda f: f.stats or "")
            marks = [(f, np.arange(batch, 600, 7 * (n + 1) * batch)) for n, f in enumerate(stored)]
            updated = table.mark_deleted(marks)
            now = int(time.time() * 1000)
            actions = [
                a for f in stored for a in (f.remove_action(now), updated[f.path].add_action())
            ]
            _commit(spark, path, batch, actions, snapshot)
        by_spark = sorted(r["id"] for r in spark.read.format("delta").load(path).collect())
        assert sorted(DeltaTarget(path).read(["id"]).column("id").to_pylist()) == by_spark
        cardinalities = sorted(
            f.deletion_vector["cardinality"]
            for f in TableLog(spark, path).files()
            if f.deletion_vector is not None
        )
        assert len(cardinalities) == 3 and len(by_spark) == 3000 - sum(cardinalities)
        seen[how] = by_spark
    assert seen["batched"] == seen["one by one"]
