"""A table copied anew lands over its Delta tables: each moves in one commit.

``pgcdc resync`` (or a parked table's automatic resync, or a table added back after it was
removed) copies a table in a snapshot exported at LSN X while the stream runs. Its Delta
tables stay as they were until the copy lands, and each then moves in **one** commit, so a
reader sees the old rows or the copy's, never an empty or half-copied table:

* the **mirror**: the copy's files replace every file it had (``snapshot.write_snapshot`` with
  ``replace``: the copy's files were written into its folder under its own column mapping, and
  the commit removes the old files and adds the new ones);
* the **history** (``land_history``): every version current until then ends at X with
  ``__end_op`` 'S', and each row of the copy starts a version at X with ``__start_op`` 'S' (one
  MERGE: the versions of keys the copy no longer has end there too);
* the **changelog** (``land_changelog``): the copy's rows are appended with ``__op`` 'S' at X, as
  the initial copy's are (a reader rebuilding the table from the changelog starts again from
  the newest group of 'S' rows).

History and changelog rows are the landed mirror's, so all three hold the same copy. Each
commit carries the application transaction ``(added app id, attempt)``: a landing cut short
is finished by the next start, which skips the Delta tables that hold it.

When the copy's columns cannot take the mirror's place in its schema (a column's type changed
other than the lake can widen: ``snapshot.Incompatible``), the copy is written into a Delta
table of its own (``_pgcdc/landing/``) and each Delta table is overwritten from it with its new
schema, in one commit each (``overwrite``): the history and changelog then start again from
the copy (their earlier versions stay readable by time travel until a vacuum removes them).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pgcdc.lake.store.delta import append_rows, quote_name, table_schema, tagged, user_metadata
from pgcdc.lake.store.tables import (
    CL_COMMIT_LSN,
    CL_COMMIT_LSN_TEXT,
    CL_COMMIT_TIME,
    CL_END_LSN,
    COMMIT_LSN,
    COMMIT_TIME,
    END_AT,
    END_LSN,
    END_OP,
    IS_CURRENT,
    OLD,
    OLD_KIND,
    OP,
    POSITION,
    START_AT,
    START_LSN,
    START_OP,
    UNCHANGED,
    XID,
    TableKind,
)
from pgcdc.lsn import Lsn

__all__ = ["copy_rows", "land_changelog", "land_history", "overwrite"]

log = logging.getLogger("pgcdc.lake")

#: the mirror's own columns: not the source's
_MIRROR_ONLY = (COMMIT_LSN, COMMIT_TIME)


def copy_rows(
    mirror: Any, kind: TableKind, target: Any, *, point: Lsn, started_at: datetime
) -> Any:
    """The rows of a ``kind`` Delta table for the copy whose mirror rows are ``mirror`` (a
    Spark DataFrame), in the columns of ``target`` (a ``StructType``: the Delta table's
    schema): the source's columns as the mirror holds them, the copy's as 'S' rows at
    ``point`` (``started_at``: their time), NULL for a column the mirror lacks."""
    from pyspark.sql import functions as F

    have = set(mirror.columns) - set(_MIRROR_ONLY)
    at = F.lit(started_at).cast("timestamp")
    lsn = F.lit(int(point)).cast("long")
    fixed: dict[str, Any] = {}
    if kind == "mirror":
        fixed = {COMMIT_LSN: lsn, COMMIT_TIME: at}
    elif kind == "history":
        fixed = {
            START_LSN: lsn,
            START_AT: at,
            END_LSN: F.lit(None),
            END_AT: F.lit(None),
            IS_CURRENT: F.lit(True),
            START_OP: F.lit("S"),
            END_OP: F.lit(None),
        }
    else:
        fixed = {
            OP: F.lit("S"),
            CL_COMMIT_LSN: lsn,
            CL_COMMIT_LSN_TEXT: F.lit(str(point)),
            CL_END_LSN: lsn,
            POSITION: F.lit(-1),
            XID: F.lit(None),
            CL_COMMIT_TIME: at,
            OLD_KIND: F.lit(None),
            OLD: F.lit(None),
            UNCHANGED: F.array(),
        }
    columns = []
    for field in target.fields:
        if field.name in fixed:
            value = fixed[field.name]
        elif field.name in have:
            value = F.col(quote_name(field.name))
        else:
            value = F.lit(None)
        columns.append(value.cast(field.dataType).alias(field.name))
    return mirror.select(*columns)


def land_history(
    spark: Any,
    history: str,
    mirror: Any,
    *,
    point: Lsn,
    started_at: datetime,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
) -> None:
    """End every current version of the history at ``history`` at ``point`` ('S') and add the
    copy's rows (its landed mirror's, ``mirror``) as versions starting there, in one MERGE
    commit tagged ``(app_id, version)`` (skipped by Delta when the history holds it)."""
    from delta.tables import DeltaTable
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    target = table_schema(spark, history)
    rows = copy_rows(mirror, "history", target, point=point, started_at=started_at)
    ended: dict[str, str | Column] = {
        quote_name(END_LSN): F.lit(int(point)).cast("long"),
        quote_name(END_AT): F.lit(started_at).cast("timestamp"),
        quote_name(IS_CURRENT): F.lit(False),
        quote_name(END_OP): F.lit("S"),
    }
    with tagged(spark, app_id, version, metadata):
        (
            DeltaTable.forPath(spark, history)
            .alias("t")
            .merge(rows.alias("s"), "false")
            .whenNotMatchedBySourceUpdate(condition=f"t.{quote_name(IS_CURRENT)}", set=ended)
            .whenNotMatchedInsertAll()
            .execute()
        )


def land_changelog(
    spark: Any,
    changelog: str,
    mirror: Any,
    *,
    point: Lsn,
    started_at: datetime,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
) -> None:
    """Append the copy's rows (its landed mirror's) to the changelog at ``changelog`` as 'S'
    rows at ``point``, in one commit tagged ``(app_id, version)``."""
    target = table_schema(spark, changelog)
    rows = copy_rows(mirror, "changelog", target, point=point, started_at=started_at)
    append_rows(spark, changelog, rows, app_id=app_id, version=version, metadata=metadata)


def overwrite(
    spark: Any,
    path: str,
    rows: Any,
    *,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
) -> None:
    """Replace every row of the Delta table at ``path`` with ``rows``, in their schema, in one
    commit tagged ``(app_id, version)`` (Delta's overwrite with a new schema: column mapping
    gives changed columns new physical names; earlier versions stay readable until a vacuum)."""
    (
        rows.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .option("txnAppId", app_id)
        .option("txnVersion", str(int(version)))
        .option("userMetadata", user_metadata(metadata))
        .save(path)
    )
