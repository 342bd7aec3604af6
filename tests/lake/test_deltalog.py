"""Delta's commit API as ``TableLog`` drives it: what a commit costs in Spark jobs, before and
after a process restarts (its in-memory state gone), and the checksum files that spare the
next process the table's state rebuilt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pgcdc.lake.store.delta import create_table
from pgcdc.lake.store.deltalog import TableLog, write_checksums


def _jobs(spark: Any) -> int:
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def _forget_logs(spark: Any) -> None:
    """As a new process: Delta's cached logs and their snapshots gone."""
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def _commit(spark: Any, path: str, batch: int) -> int:
    table = TableLog(spark, path)
    return table.commit(
        [],
        snapshot=table.snapshot(),
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
