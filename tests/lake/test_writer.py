"""``pgcdc.lake.store.target.DeltaTarget`` (delta-rs) on tables Delta's Spark connector writes: what
it says of a table follows the table on disk, though it keeps loaded tables between checks; rows
come back with deletion vectors applied and in canonical Arrow layouts."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgcdc.lake.store.delta import create_table
from pgcdc.lake.store.target import DeltaTarget, canonical_type

APP = "app-1"


def _write(
    spark: Any, path: Path, rows: list[int], version: int | None, mode: str = "append"
) -> None:
    from pyspark.sql import types as T

    if not path.exists():
        schema = T.StructType(
            [T.StructField("id", T.LongType()), T.StructField("s", T.StringType())]
        )
        create_table(spark, path, schema, stats_columns=["id"], what="test")
    writer = (
        spark.createDataFrame([(r, f"s{r}") for r in rows], "id bigint, s string")
        .write.format("delta")
        .mode(mode)
    )
    if version is not None:
        writer = writer.option("txnAppId", APP).option("txnVersion", str(version))
    writer.save(str(path))


def test_a_target_sees_later_commits_and_a_table_recreated_at_its_path(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    target = DeltaTarget(path)
    assert target.table() is None and not target.applied(APP, 0)
    _write(spark, path, [1, 2], 1)
    assert target.applied(APP, 1) and not target.applied(APP, 2)
    assert target.version() == 1  # created, then written
    # another writer (another target object, or another process) commits
    _write(spark, path, [3], 2)
    assert target.applied(APP, 2) and target.version() == 2
    assert DeltaTarget(path).applied(APP, 2)
    assert target.count() == 3
    # a replayed write is skipped by Delta itself
    _write(spark, path, [4], 2)
    assert target.version() == 2 and target.count() == 3
    # the table is dropped and created again at the same path, with fewer commits
    shutil.rmtree(path)
    assert target.table() is None and not target.applied(APP, 1)
    _write(spark, path, [9], None)
    assert not target.applied(APP, 1) and target.version() == 1 and target.count() == 1
    assert not DeltaTarget(path).applied(APP, 1)
    _write(spark, path, [10], 5, mode="overwrite")
    assert target.applied(APP, 5) and target.count() == 1


def test_rows_come_back_with_deletion_vectors_applied_in_canonical_types(
    spark: Any, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    path = tmp_path / "t"
    _write(spark, path, list(range(100)), None)
    DeltaTable.forPath(spark, str(path)).delete("id % 10 = 0")  # a deletion vector
    target = DeltaTarget(path)
    rows = target.read()
    assert rows.num_rows == 90 == target.count()
    assert 10 not in rows.column("id").to_pylist()
    assert rows.schema.field("s").type == pa.string()  # not the reader's string_view
    assert target.read(columns=[]).num_rows == 90
    stats = target.files()
    assert "max.id" in stats.column_names  # by the column's name, not its physical one


def test_canonical_types() -> None:
    assert canonical_type(pa.string_view()) == pa.string()
    assert canonical_type(pa.large_string()) == pa.string()
    assert canonical_type(pa.binary_view()) == pa.binary()
    assert canonical_type(pa.large_list(pa.string_view())) == pa.list_(
        pa.field("element", pa.string())
    )
    assert canonical_type(pa.struct([("a", pa.large_binary())])) == pa.struct([("a", pa.binary())])
    assert canonical_type(pa.timestamp("ns", tz="Europe/Paris")) == pa.timestamp("us", tz="UTC")
