"""``pgcdc.lake.write.changes``: the Column expressions a table's batches share are built once."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from pgcdc.lake.write.changes import expressions


def test_expressions_are_built_once_across_foreach_batch_batches(
    spark: Any, tmp_path: Path
) -> None:
    """``foreachBatch`` wraps every micro-batch in a new Python session object: the cache of
    expressions must outlive it, and the cached Columns must work in the later batches."""
    from pyspark.sql import functions as F

    source = tmp_path / "in"
    source.mkdir()
    for n in range(3):
        (source / f"part-{n}.json").write_text(f'{{"x": {n}}}\n')
    key = ("test", uuid.uuid4().hex)
    builds: list[int] = []
    seen: list[tuple[int, int]] = []
    sessions: list[int] = []

    def build() -> Any:
        builds.append(1)
        return (F.col("x") * 10).alias("y")

    def batch(df: Any, batch_id: int) -> None:
        sessions.append(id(df.sparkSession))
        column = expressions(df, key, build)
        seen.extend((row["x"], row["y"]) for row in df.select("x", column).collect())

    query = (
        spark.readStream.schema("x INT")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(seen) == [(0, 0), (1, 10), (2, 20)]
    assert len(sessions) == 3
    assert len(builds) == 1
