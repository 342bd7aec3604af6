"""The mirror (SCD type 1): one row per key, as the source table has it.

Per micro-batch and table (Spark):

1. events (``changes.table_events``), key-changing updates split into delete + upsert;
2. a TRUNCATE voids every earlier event of the batch for the table (only the events after the
   last TRUNCATE are kept) and empties the table;
3. unchanged TOAST values are taken from the latest earlier event of the key in the batch;
4. per key, the last event by ``(commit LSN, position)`` wins: a delete removes the row, an
   insert or update writes it.

Then one MERGE of Delta's Spark connector, run on the executors, in a single commit tagged
with the batch's application transaction: delete matched keys whose last event is a delete;
update matched rows (a column no event of the batch carried keeps its stored value:
``CASE WHEN keep THEN target ELSE source``); insert the others; and, if the batch truncated the
table, delete every row no event of the batch wrote (``WHEN NOT MATCHED BY SOURCE``), so the
emptying and the changes after it are one commit. With deletion vectors, the MERGE writes the
rows it changed and marks the ones they replace; it rewrites no other row. Its condition also
bounds the target's first key column by the batch's key range, so Delta skips the files whose
statistics lie outside it.

A table without a key is mirrored copy by copy (``pgcdc.lake.write.multiset``): its key is then
``__row_id``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pgcdc.lake.store.delta import append_rows, tagged
from pgcdc.lake.store.tables import COMMIT_LSN, COMMIT_TIME, LakeTable
from pgcdc.lake.write.changes import (
    EV_KEY,
    EV_LSN,
    EV_OP,
    EV_POS,
    EV_ROOT,
    EV_SEQ,
    EV_TIME,
    TableOverview,
    keep_column,
    quote_column,
    utc_moment,
    value_column,
)
from pgcdc.lake.write.schema_evolution import Defaults, evolve
from pgcdc.lake.write.toast import ROOT_PREFIX, fill_from_stored, keep_flag, root_column

__all__ = [
    "OP_COLUMN",
    "SRC",
    "TGT",
    "key_condition",
    "merge_mirror",
    "mirror_rows",
    "summarize",
]

log = logging.getLogger("pgcdc.lake")

OP_COLUMN = "__pgcdc_op"
#: MERGE aliases of the source and the target: no source column can have these names
SRC = "__pgcdc_src"
TGT = "__pgcdc_tgt"


def after_truncate(overview: TableOverview) -> Any | None:
    """Condition keeping the events after the batch's last TRUNCATE of the table, if any."""
    from pyspark.sql import functions as F

    last = overview.last_truncate
    if last is None:
        return None
    return (F.col(EV_LSN) > F.lit(last.lsn)) | (
        (F.col(EV_LSN) == F.lit(last.lsn)) & (F.col(EV_POS) > F.lit(last.position))
    )


def _mirror_columns(
    field: Callable[[str], Any], table: LakeTable, columns: Sequence[str], overview: TableOverview
) -> list[Any]:
    """The MERGE source's columns, from an event's columns (``field(name)``)."""
    from pyspark.sql import functions as F

    keys = table.row_keys
    out = []
    for i, name in enumerate(columns):
        if name in keys:  # the value, not the key: grouping made a float's -0 read 0
            grouped = F.col(EV_KEY).getField(name)
            out.append(F.coalesce(field(value_column(i)), grouped).alias(name))
        else:
            out.append(field(value_column(i)).alias(name))
    out.append(field(EV_LSN).alias(COMMIT_LSN))
    out.append(field(EV_TIME).alias(COMMIT_TIME))
    out.append(F.when(field(EV_OP) == "D", "D").otherwise("U").alias(OP_COLUMN))
    if any(name in overview.unchanged_columns for name in columns if name not in keys):
        for i, name in enumerate(columns):
            if name in overview.unchanged_columns and name not in keys:
                out.append(field(keep_column(i)).alias(keep_flag(i)))
        for j, key in enumerate(keys):
            out.append(field(EV_ROOT).getField(key).alias(root_column(j)))
    return out


def _events_after_truncate(resolved: Any, overview: TableOverview) -> Any:
    keep = after_truncate(overview)
    return resolved if keep is None else resolved.where(keep)


def mirror_rows(
    resolved: Any, table: LakeTable, columns: Sequence[str], overview: TableOverview
) -> Any:
    """The MERGE source (a Spark DataFrame): per key its final state in the batch.

    Columns: the table's columns, ``__commit_lsn``, ``__commit_time``, ``__pgcdc_op`` ('D' or
    'U') and ``__pgcdc_keep_<i>`` for each column that arrived as unchanged TOAST.
    """
    from pyspark.sql import functions as F

    events = _events_after_truncate(resolved, overview)
    if inserted_only(overview):  # each key once: nothing to reduce, no shuffle
        return events.select(*_mirror_columns(F.col, table, columns, overview))
    last = events.groupBy(EV_KEY).agg(
        F.max_by(F.struct(*[F.col(c) for c in events.columns if c != EV_KEY]), EV_SEQ).alias("r")
    )
    r = F.col("r")
    return last.select(*_mirror_columns(r.getField, table, columns, overview))


def inserted_only(overview: TableOverview) -> bool:
    """Whether the batch only inserted rows of the table: their keys are new (the source's key
    is unique, and the mirror held the source's rows before the batch), each once."""
    return not (overview.updates or overview.deletes or overview.truncates)


def key_condition(keys: Sequence[str]) -> Any:
    """The MERGE condition matching a source row to the stored row of the same key."""
    from pyspark.sql import functions as F

    condition: Any = None
    for k in keys:
        cond = F.col(f"{TGT}.{quote_column(k)}") == F.col(f"{SRC}.{quote_column(k)}")
        condition = cond if condition is None else condition & cond
    return condition


def _ranged(dtype: Any) -> bool:
    """Whether Delta's file statistics keep the order of a key of this type."""
    from pyspark.sql import types as T

    return isinstance(
        dtype,
        (
            T.ByteType,
            T.ShortType,
            T.IntegerType,
            T.LongType,
            T.DecimalType,
            T.StringType,
            T.DateType,
        ),
    )


def summarize(rows: Any, keys: Sequence[str]) -> tuple[Any | None, datetime | None]:
    """One Spark job over a batch's mirror rows: a condition on the target's first key column,
    within the range of the rows' keys (None when its type has no such order in Delta's file
    statistics, or the rows have no key), and the newest commit time among the rows. Delta
    skips the files whose statistics lie outside the range: a batch of new keys above the
    stored ones (a bulk load, increasing ids) reads none of the table."""
    from pyspark.sql import functions as F

    first = keys[0]
    ranged = _ranged(rows.schema[first].dataType) and OP_COLUMN in rows.columns
    column = F.col(quote_column(first))
    aggregates = [F.max(F.col(COMMIT_TIME))]
    if ranged:
        aggregates += [F.min(column), F.max(column)]
    summary = rows.agg(*aggregates).first()
    newest = utc_moment(summary[0])
    if not ranged or summary[1] is None or summary[2] is None:
        return None, newest
    target = F.col(f"{TGT}.{quote_column(first)}")
    return (target >= F.lit(summary[1])) & (target <= F.lit(summary[2])), newest


def mirror_schema(rows: Any, columns: Sequence[str]) -> Any:
    """The mirror's schema (Spark) for a MERGE source of ``mirror_rows``."""
    from pyspark.sql import types as T

    fields = [T.StructField(c, rows.schema[c].dataType, True) for c in columns]
    fields.append(T.StructField(COMMIT_LSN, T.LongType(), True))
    fields.append(T.StructField(COMMIT_TIME, T.TimestampType(), True))
    return T.StructType(fields)


def merge_mirror(
    spark: Any,
    path: str,
    rows: Any,
    table: LakeTable,
    columns: Sequence[str],
    *,
    truncated: bool,
    inserts_only: bool = False,
    newest: datetime | None = None,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
    defaults: Defaults | None = None,
) -> datetime | None:
    """Apply a batch's ``mirror_rows`` (a Spark DataFrame) to the mirror in one commit, with
    Delta's MERGE on the executors; the newest commit time among the rows.

    ``inserts_only``: the batch holds only INSERTs of the table (``inserted_only``): the rows
    are appended in one job, without reading the table, and ``newest`` (the batch overview's)
    is returned."""
    keys = table.row_keys
    evolve(
        spark,
        path,
        mirror_schema(rows, columns),
        drop_missing=True,
        what=f"{table.table_id} mirror",
        stats_columns=table.stats_columns("mirror"),
        defaults=defaults,
    )
    if inserts_only:
        rows = rows.select(*[quote_column(c) for c in (*columns, COMMIT_LSN, COMMIT_TIME)])
        append_rows(spark, path, rows, app_id=app_id, version=version, metadata=metadata)
        return newest
    stored = spark.read.format("delta").load(path)
    rows = fill_from_stored(rows, stored, keys, columns, foreign_only=True)
    rows = rows.drop(*[c for c in rows.columns if c.startswith(ROOT_PREFIX)])
    # computed once: the summary and each pass of the MERGE read it
    rows = rows.localCheckpoint(eager=True)
    return _merge(
        spark,
        path,
        rows,
        keys=keys,
        columns=columns,
        truncated=truncated,
        app_id=app_id,
        version=version,
        metadata=metadata,
    )


def _merge(
    spark: Any,
    path: str,
    rows: Any,
    *,
    keys: Sequence[str],
    columns: Sequence[str],
    truncated: bool,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
) -> datetime | None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    def src(name: str) -> Any:
        return F.col(f"{SRC}.{quote_column(name)}")

    def tgt(name: str) -> Any:
        return F.col(f"{TGT}.{quote_column(name)}")

    updates: dict[str, Any] = {}
    for i, name in enumerate(columns):
        flag = keep_flag(i)
        # Keys too: equal keys can be different values (a float's 0 and -0).
        if name in keys or flag not in rows.columns:
            updates[quote_column(name)] = src(name)
        else:
            updates[quote_column(name)] = F.when(src(flag), tgt(name)).otherwise(src(name))
    for name in (COMMIT_LSN, COMMIT_TIME):
        updates[quote_column(name)] = src(name)
    inserts = {quote_column(n): src(n) for n in [*columns, COMMIT_LSN, COMMIT_TIME]}
    condition = key_condition(keys)
    bounds, newest = summarize(rows, keys)
    if bounds is not None and not truncated:  # a TRUNCATE reads every row anyway
        condition = condition & bounds
    deleted = src(OP_COLUMN) == "D"
    merger = (
        DeltaTable.forPath(spark, path)
        .alias(TGT)
        .merge(rows.alias(SRC), condition)
        .whenMatchedDelete(condition=deleted)
        .whenMatchedUpdate(condition=~deleted, set=updates)
        .whenNotMatchedInsert(condition=~deleted, values=inserts)
    )
    if truncated:
        merger = merger.whenNotMatchedBySourceDelete()
    with tagged(spark, app_id, version, metadata):
        merger.execute()
    return newest
