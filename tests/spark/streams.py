"""Helpers for the Spark tests: run a pgcdc stream with foreachBatch, collect what it read."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pgcdc.replication import slot_info
from pgcdc.spark import read_stream


def plain(row: Any) -> Any:
    """A Spark Row (recursively) as dicts and lists."""
    if hasattr(row, "asDict"):
        return {k: plain(v) for k, v in row.asDict().items()}
    if isinstance(row, list):
        return [plain(v) for v in row]
    if isinstance(row, dict):
        return {k: plain(v) for k, v in row.items()}
    return row


@dataclass
class Collected:
    """Rows per batch id, in the order foreachBatch saw them."""

    batches: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    attempts: list[int] = field(default_factory=list)
    partitions: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    elapsed: float = 0.0

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [row for batch_id in sorted(self.batches) for row in self.batches[batch_id]]


def wait_slot_released(dsn: str, slot: str, timeout: float = 30.0) -> None:
    """Wait until no process streams from the slot (Spark ends the reader process after the
    query stops; its walsender goes away a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        info = slot_info(dsn, slot)
        if info is None or not info.active:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"slot {slot} still in use by {info.active_pid} after {timeout}s")
        time.sleep(0.1)


def ordered(df: DataFrame) -> list[dict[str, Any]]:
    """The rows in stream order (sorted here: Spark's orderBy would read the data twice)."""
    rows = [plain(r) for r in df.collect()]
    return sorted(rows, key=lambda r: (r["_commit_lsn"], r["_position"]))


def run_stream(
    spark: SparkSession,
    dsn: str,
    slot: str,
    publications: list[str],
    checkpoint: Path,
    *,
    df: DataFrame | None = None,
    collected: Collected | None = None,
    fail_on: Callable[[int, list[dict[str, Any]]], bool] | None = None,
    timeout: float = 120.0,
    **options: Any,
) -> Collected:
    """Run the stream with Trigger.AvailableNow until it stops; every batch's rows collected.

    ``fail_on(batch_id, rows)`` True makes that batch fail after its rows were recorded (the
    query then stops with the error, which is re-raised). ``df``: a stream DataFrame defined
    earlier (its schema was fixed then).
    """
    out = collected if collected is not None else Collected()
    if df is None:
        df = read_stream(spark, dsn, slot, publications, **options)

    def each(batch: DataFrame, batch_id: int) -> None:
        rows = ordered(batch)
        with out.lock:
            out.attempts.append(batch_id)
            out.batches[batch_id] = rows
            out.partitions[batch_id] = batch.rdd.getNumPartitions()
        if fail_on is not None and fail_on(batch_id, rows):
            raise RuntimeError(f"test failure injected in batch {batch_id}")

    query = (
        df.writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    started = time.monotonic()
    try:
        finished = query.awaitTermination(timeout)
    finally:
        if query.isActive:
            query.stop()
    wait_slot_released(dsn, slot)
    error = query.exception()
    if error is not None:
        raise error
    assert finished, f"the stream did not finish within {timeout}s"
    out.elapsed = time.monotonic() - started
    return out
