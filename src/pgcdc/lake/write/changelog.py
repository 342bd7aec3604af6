"""The changelog: every change, appended with its metadata.

One row per change the source sent (a key-changing update is one row), TRUNCATEs included (one
row per truncated table with every column NULL), rows of the initial snapshot with ``__op`` 'S'.
Columns: the table's columns holding the new image (NULL for deletes; an unchanged TOAST value
is NULL and its column is listed in ``__unchanged``), then ``__op`` ('I', 'U', 'D', 'T', 'S'),
``__commit_lsn``, ``__commit_lsn_text``, ``__end_lsn``, ``__position`` (within the
transaction), ``__xid``, ``__commit_time``, ``__old_kind`` ('K' key or 'O' full old row, NULL
when none was sent) and ``__old`` (a struct of the old image's columns). Order by
``(__commit_lsn, __position)`` to replay.

Each batch is one append commit of Delta's Spark writer, tagged with the batch's application
transaction (``txnAppId``/``txnVersion``: a replayed batch's append is skipped).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pgcdc.lake.store.delta import append_rows
from pgcdc.lake.store.tables import (
    CL_COMMIT_LSN,
    CL_COMMIT_LSN_TEXT,
    CL_COMMIT_TIME,
    CL_END_LSN,
    OLD,
    OLD_KIND,
    OP,
    POSITION,
    UNCHANGED,
    XID,
    LakeTable,
)
from pgcdc.lake.write.changes import image_columns, lake_image, quote_column
from pgcdc.lake.write.schema_evolution import Defaults, Images, evolve

__all__ = ["append_changelog", "changelog_columns", "changelog_rows"]

log = logging.getLogger("pgcdc.lake")


def _new_images() -> Any:
    """Which changelog rows hold a new image: inserts, updates and snapshot rows."""
    from pyspark.sql import functions as F

    return F.col(OP).isin("I", "U", "S")


#: the changelog's row images, which an added column's missing value goes in
IMAGES = Images(rows=_new_images, old=(OLD, OLD_KIND))


def changelog_columns(df: Any, column: str, columns: Sequence[str]) -> list[Any]:
    """A changelog row's columns (Spark Columns) from a source row of the table whose struct
    column is ``column``."""
    from pyspark.sql import functions as F

    s = F.col(quote_column(column))
    image_type, _ = image_columns(df, column)
    new = lake_image(s.getField("new"), image_type)
    old = lake_image(s.getField("old"), image_type)
    old_kind = s.getField("old_kind")
    return [
        *[new.getField(c).alias(c) for c in columns],
        F.col("_op").alias(OP),
        F.col("_commit_lsn").alias(CL_COMMIT_LSN),
        F.col("_commit_lsn_text").alias(CL_COMMIT_LSN_TEXT),
        F.col("_end_lsn").alias(CL_END_LSN),
        F.col("_position").cast("long").alias(POSITION),
        F.col("_xid").alias(XID),
        F.col("_commit_time").alias(CL_COMMIT_TIME),
        old_kind.alias(OLD_KIND),
        F.when(old_kind.isNotNull(), old).alias(OLD),
        F.coalesce(s.getField("unchanged"), F.array().cast("array<string>")).alias(UNCHANGED),
    ]


def changelog_rows(df: Any, table: LakeTable, column: str, columns: Sequence[str]) -> Any:
    """The table's rows of the batch as changelog rows (a Spark DataFrame)."""
    from pyspark.sql import functions as F

    return df.where(F.col("_table_id") == table.table_id).select(
        *changelog_columns(df, column, columns)
    )


def append_changelog(
    spark: Any,
    path: str,
    rows: Any,
    table: LakeTable,
    *,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
    defaults: Defaults | None = None,
) -> None:
    """Append a batch's changelog rows (a Spark DataFrame) in one commit."""

    evolve(
        spark,
        path,
        rows.schema,
        drop_missing=False,
        what=f"{table.table_id} changelog",
        stats_columns=table.stats_columns("changelog"),
        defaults=defaults,
        images=IMAGES,
    )
    append_rows(spark, path, rows, app_id=app_id, version=version, metadata=metadata)
