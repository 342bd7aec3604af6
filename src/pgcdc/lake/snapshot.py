"""The initial copy: every published table into its Delta tables, in parallel, consistently.

The slot is created with an exported snapshot; the Spark source's batch reader
(``spark.read.format("pgcdc")`` with the ``snapshot`` option) copies each table in ctid ranges
on the executors, all in that snapshot, with the publication's row filters. When several Delta
tables are written (more than one table, or history and changelog tables), the copy is kept on
the executors' disks (``DISK_ONLY``) while they are written, so PostgreSQL is read once; a
single mirror is written straight from the source.

Executors write the Parquet files straight into each Delta table's folder, and each table's
files are added in one commit tagged ``Transaction(snapshot app id, generation)``
(``files.write_delta_files``): the mirror and the history (every row a current version,
``__start_op`` 'S', starting at the consistent point) and the changelog (rows with ``__op``
'S'). A snapshot that
did not finish is redone from scratch with a new slot (the next generation): the tables of the
unfinished one are removed first.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pgcdc.lake.changelog import changelog_rows
from pgcdc.lake.changes import image_columns, lake_image, quote_column
from pgcdc.lake.files import write_delta_files, written_rows
from pgcdc.lake.tables import (
    CL_COMMIT_TIME,
    COMMIT_LSN,
    COMMIT_TIME,
    END_AT,
    END_LSN,
    END_OP,
    IS_CURRENT,
    OP,
    START_AT,
    START_LSN,
    START_OP,
    LakeLayout,
    LakeTable,
    TableKind,
)
from pgcdc.lake.writer import DeltaTarget, nullable_schema
from pgcdc.lsn import Lsn

__all__ = ["SnapshotResult", "remove_tables", "snapshot_rows", "write_snapshot"]

log = logging.getLogger("pgcdc.lake")


class SnapshotResult:
    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.seconds = 0.0


def snapshot_rows(
    df: Any,
    table: LakeTable,
    column: str,
    kind: TableKind,
    *,
    consistent_point: Lsn,
    started_at: datetime,
) -> Any:
    """The rows of one Delta table of ``table`` for a snapshot DataFrame (Spark)."""
    from pyspark.sql import functions as F

    image_type, names = image_columns(df, column)
    if kind == "changelog":
        rows = changelog_rows(df, table, column, names)
        return rows.withColumn(OP, F.lit("S")).withColumn(
            CL_COMMIT_TIME, F.coalesce(F.col(CL_COMMIT_TIME), F.lit(started_at))
        )
    new = lake_image(F.col(quote_column(column)).getField("new"), image_type)
    values = [new.getField(n).alias(n) for n in names]
    rows = df.where((F.col("_table_id") == table.table_id) & (F.col("_op") != "T"))
    if kind == "mirror":
        return rows.select(
            *values,
            F.lit(int(consistent_point)).cast("long").alias(COMMIT_LSN),
            F.lit(started_at).cast("timestamp").alias(COMMIT_TIME),
        )
    return rows.select(
        *values,
        F.lit(int(consistent_point)).cast("long").alias(START_LSN),
        F.lit(started_at).cast("timestamp").alias(START_AT),
        F.lit(None).cast("long").alias(END_LSN),
        F.lit(None).cast("timestamp").alias(END_AT),
        F.lit(True).alias(IS_CURRENT),
        F.lit("S").alias(START_OP),
        F.lit(None).cast("string").alias(END_OP),
    )


def remove_tables(layout: LakeLayout, tables: Sequence[LakeTable]) -> None:
    """Remove the Delta tables of an unfinished snapshot (their folders)."""
    for table in tables:
        kinds: tuple[TableKind, ...] = ("mirror", "history", "changelog")
        for kind in kinds:
            path: Path = table.path(layout, kind)
            if path.exists():
                shutil.rmtree(path)
                log.info("removed %s %s of an unfinished snapshot", table.table_id, kind)


def _activate(spark: Any) -> None:
    """Make ``spark`` the JVM's active session on this thread. Spark looks Python data sources
    (``pgcdc_lake_files``) up in the active session, which a thread other than the one that
    created the session (py4j gives each Python thread its own JVM thread) does not have: the
    write would fail with DATA_SOURCE_NOT_FOUND. Spark Connect sessions have no JVM here."""
    jsession = getattr(spark, "_jsparkSession", None)
    jvm = getattr(spark, "_jvm", None)
    if jsession is not None and jvm is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)


def write_snapshot(
    snapshot_df: Any,
    layout: LakeLayout,
    tables: Sequence[LakeTable],
    table_columns: dict[str, str],
    *,
    consistent_point: Lsn,
    started_at: datetime,
    app_id: str,
    generation: int,
    on_progress: Callable[[str | None, int], None] | None = None,
) -> SnapshotResult:
    """Copy every table of ``snapshot_df`` (the source's batch reader) into the lake.

    ``on_progress`` (progress displays) is called with ``(None, rows read)`` once the copy is
    read, then with ``(table id, mirror rows)`` as each table is written."""
    from pyspark import StorageLevel
    from pyspark.sql.pandas.types import to_arrow_schema

    result = SnapshotResult()
    started = time.monotonic()
    _activate(snapshot_df.sparkSession)
    # several Delta tables are written from one read of the source: keep it on the executors'
    # disks. One (a single table's mirror) is written straight from the source, read once.
    single = sum(len(table.kinds()) for table in tables) == 1
    df = snapshot_df if single else snapshot_df.persist(StorageLevel.DISK_ONLY)

    def read_done(total: int) -> None:
        log.info("snapshot at %s: %s rows read from the source", consistent_point, total)
        if on_progress is not None:
            on_progress(None, total)

    try:
        if not single:
            read_done(int(df.count()))
        for table in tables:
            column = table_columns[table.table_id]
            if column not in df.columns:
                raise RuntimeError(
                    f"the snapshot has no column for {table.table_id}: is it published?"
                )
            for kind in table.kinds():
                target = DeltaTarget(table.path(layout, kind))
                rows = snapshot_rows(
                    df,
                    table,
                    column,
                    kind,
                    consistent_point=consistent_point,
                    started_at=started_at,
                )
                schema = nullable_schema(to_arrow_schema(rows.schema, timezone="UTC"))
                write_delta_files(
                    rows,
                    target,
                    schema,
                    app_id=app_id,
                    version=generation,
                    metadata={"snapshot": generation, "consistent_point": str(consistent_point)},
                    tag=f"s{generation}",
                )
                count = written_rows(target)
                if kind == "mirror":
                    result.rows[table.table_id] = count
                log.info("snapshot of %s %s: %s rows", table.table_id, kind, count)
                if single:  # the copy was read as it was written
                    read_done(count)
            if on_progress is not None:
                on_progress(table.table_id, result.rows.get(table.table_id, 0))
    finally:
        if not single:
            df.unpersist()
    result.seconds = time.monotonic() - started
    return result
