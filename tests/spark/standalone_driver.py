"""A driver program for the standalone-cluster test: run in its own process (one SparkContext per
process), against ``spark://...``, it copies the snapshot and runs the stream, then writes what it
read, and what the cluster looked like, as JSON.

    python -m tests.spark.standalone_driver <master> <dsn> <slot> <publication> <snapshot-name>
        <consistent-point> <checkpoint> <out.json>
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main(argv: list[str]) -> None:
    master, dsn, slot, publication, snapshot, point, checkpoint, out = argv
    from pgcdc.spark import read_stream, spark_session, table_column

    spark = spark_session(
        master,
        "pgcdc-standalone-test",
        conf={
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.executor.memory": "512m",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    column = table_column("public", "t")
    try:
        snap = (
            spark.read.format("pgcdc")
            .option("dsn", dsn)
            .option("publications", publication)
            .option("snapshot", snapshot)
            .option("consistentPoint", point)
            .option("partitionsPerTable", "3")
            .load()
        )
        copied = [r[column]["new"]["id"] for r in snap.collect()]
        rows: list[dict[str, Any]] = []
        pids: set[int] = set()

        def each(batch: Any, batch_id: int) -> None:
            for r in batch.orderBy("_commit_lsn", "_position").collect():
                rows.append(
                    {
                        "op": r["_op"],
                        "id": (r[column]["new"] or r[column]["old"])["id"],
                        "batch": batch_id,
                    }
                )
            # the Python processes that ran this batch's tasks
            pids.update(batch.rdd.mapPartitions(lambda _: [os.getpid()]).collect())

        query = (
            read_stream(spark, dsn, slot, [publication], maxChangesPerTrigger=50)
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        error = query.exception()
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()  # type: ignore[union-attr]
        result = {
            "copied": copied,
            "rows": rows,
            "error": None if error is None else str(error),
            "executor_pids": sorted(pids),
            "driver_pid": os.getpid(),
            "block_managers": executors,
            "master": spark.sparkContext.master,
        }
    finally:
        spark.stop()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])
