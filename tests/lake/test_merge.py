"""The mirror's MERGE as pgcdc runs it (Delta's Spark connector, deletion vectors), on real
Delta tables read back by Spark's Delta reader and by delta-rs.

* a MERGE writes what the batch changed, not what the table weighs: an update of a few rows of a
  large file marks them in a deletion vector and writes the new rows; no stored row is copied;
* pgcdc's MERGEs bound the target's key by the batch's key range, so Delta skips the files
  outside it: appending new keys (a bulk load, increasing ids) never reads the stored rows;
  a batch that truncated the table has no such bound (it deletes every row it did not write).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pgcdc.lake.store.tables import COMMIT_LSN, COMMIT_TIME, LakeTable
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lake.write.mirror import OP_COLUMN, merge_mirror

TABLE = LakeTable("public", "items", ("id",), "d")


def _rows(spark: Any, ids: list[int], ops: list[str], lsn: int) -> Any:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("note", T.StringType()),
            T.StructField(COMMIT_LSN, T.LongType()),
            T.StructField(COMMIT_TIME, T.TimestampType()),
            T.StructField(OP_COLUMN, T.StringType()),
        ]
    )
    at = datetime(2026, 1, 1, tzinfo=UTC)
    data = [(i, f"note {i} at {lsn}", lsn, at, op) for i, op in zip(ids, ops, strict=True)]
    return spark.createDataFrame(data, schema)


def _merge(spark: Any, path: Path, rows: Any, version: int, *, truncated: bool = False) -> None:
    merge_mirror(
        spark,
        str(path),
        rows,
        TABLE,
        ["id", "note"],
        truncated=truncated,
        app_id="test",
        version=version,
        metadata={"batch": version},
    )


def _last_merge(spark: Any, path: Path) -> tuple[str, dict[str, str]]:
    from delta.tables import DeltaTable

    (commit,) = DeltaTable.forPath(spark, str(path)).history(1).collect()
    assert commit["operation"] == "MERGE"
    assert json.loads(commit["userMetadata"]) == {"pgcdc": {"batch": commit["version"]}}
    return str(commit["operationParameters"]["predicate"]), dict(commit["operationMetrics"])


def test_a_merge_writes_the_changed_rows_only(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "mirror"
    _merge(spark, path, _rows(spark, list(range(20_000)), ["U"] * 20_000, 10), 1)
    _merge(spark, path, _rows(spark, [5, 7, 19_999], ["U", "D", "U"], 20), 2)
    _, metrics = _last_merge(spark, path)
    assert metrics["numTargetRowsCopied"] == "0"  # nothing rewritten but the changed rows
    assert metrics["numTargetRowsUpdated"] == "2" and metrics["numTargetRowsDeleted"] == "1"
    assert int(metrics["numTargetDeletionVectorsAdded"]) >= 1
    assert int(metrics["numTargetBytesAdded"]) < 10_000
    stored = DeltaTarget(path).read().sort_by("id")  # delta-rs applies the deletion vectors
    assert stored.num_rows == 19_999
    notes = dict(zip(stored["id"].to_pylist(), stored["note"].to_pylist(), strict=True))
    assert (notes[5], notes[6], notes[19_999]) == (
        "note 5 at 20",
        "note 6 at 10",
        "note 19999 at 20",
    )
    assert 7 not in notes
    read = spark.read.format("delta").load(str(path))  # so does Spark's Delta reader
    assert read.count() == 19_999 and read.where("id = 7").count() == 0


def test_a_merge_reads_only_the_batch_keys_range(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "mirror"
    _merge(spark, path, _rows(spark, list(range(1000)), ["U"] * 1000, 10), 1)
    # new keys above the stored ones: the MERGE is bounded to their range (the files of keys
    # 0-999 are skipped by their statistics, not read)
    _merge(spark, path, _rows(spark, list(range(1000, 2000)), ["U"] * 1000, 20), 2)
    predicate, metrics = _last_merge(spark, path)
    assert ">= 1000" in predicate and "<= 1999" in predicate, predicate
    assert metrics["numTargetRowsUpdated"] == "0" and metrics["numTargetRowsInserted"] == "1000"
    # an update and a delete in the stored range, and an insert: still exact
    _merge(spark, path, _rows(spark, [5, 1500, 2500], ["U", "D", "U"], 30), 3)
    predicate, _ = _last_merge(spark, path)
    assert ">= 5" in predicate and "<= 2500" in predicate, predicate
    stored = DeltaTarget(path).read().sort_by("id")
    ids = stored["id"].to_pylist()
    assert ids == [i for i in range(2000) if i != 1500] + [2500]
    notes = dict(zip(ids, stored["note"].to_pylist(), strict=True))
    assert (notes[5], notes[4], notes[1999], notes[2500]) == (
        "note 5 at 30",
        "note 4 at 10",
        "note 1999 at 20",
        "note 2500 at 30",
    )


def test_a_truncating_merge_reads_the_whole_table(spark: Any, tmp_path: Path) -> None:
    """A batch that truncated the table deletes every stored row it did not write, also
    outside its keys' range: no bound there."""
    path = tmp_path / "mirror"
    _merge(spark, path, _rows(spark, list(range(100)), ["U"] * 100, 10), 1)
    _merge(spark, path, _rows(spark, [500, 501], ["U", "U"], 20), 2, truncated=True)
    predicate, _ = _last_merge(spark, path)
    assert ">=" not in predicate, predicate
    assert sorted(DeltaTarget(path).read()["id"].to_pylist()) == [500, 501]
