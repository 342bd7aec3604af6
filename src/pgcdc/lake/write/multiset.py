"""Tables without a key: the source's rows as a multiset, one lake row per copy.

A table with REPLICA IDENTITY FULL and no primary key may hold identical rows, and PostgreSQL's
own subscriber applies its changes copy by copy: an INSERT adds one row, a DELETE (whose old
image is the whole row) removes one row equal to it, an UPDATE replaces one. So does the lake:
each row of the mirror (and each version in the history) carries ``__row_id``, which copy of
its values it is, and the batch's events are turned into events of row ids, which the keyed
machinery (``pgcdc.lake.write.mirror``, ``pgcdc.lake.write.history``) then applies as for any key.

Row ids: ``S<partition>-<row>`` for the initial copy's rows, ``<commit LSN>-<position>-1`` (hex)
for a row an INSERT or an UPDATE wrote. An UPDATE removes one copy of the old values and
writes a new copy of the new ones (as a key-changing update does in a keyed table: the old
version ends with 'D', the new one starts with 'U').

Which copy a removal takes (``assign_rows``), per value and per stretch of the batch between
TRUNCATEs, in LSN order: the copy written most recently in the batch and still there, else a
copy stored before the batch, the one with the smallest row id first. A running sum over the
value's events (+1 for a write, -1 for a removal) tells both: a removal that takes the sum to a
new low (below zero and below every earlier sum) takes the n-th stored copy (n = minus the
sum); any other removal at sum s takes the last write before it that reached sum s + 1 (the
writes and removals of one value nest like a stack). Stored copies are read from the mirror as
it was before the batch (its version pinned when the batch starts, or the one before the
batch's own mirror commit when a replay finds it there), so the history and the mirror, and
a replay, read the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgcdc.lake.store.tables import ROW_ID, LakeTable
from pgcdc.lake.write.changes import (
    EV_KEY,
    EV_LSN,
    EV_NEW,
    EV_OP,
    EV_POS,
    EV_SEQ,
    EV_SUB,
    EV_TIME,
    EV_UNCHANGED,
    TableOverview,
    quote_column,
)

__all__ = ["assign_rows", "snapshot_row_id", "stream_row_id"]

_PUSH = "__ms_push"
_SEGMENT = "__ms_segment"
_SUM = "__ms_sum"
_VALUE = "__ms_value"
_RANK = "__ms_rank"
_ID = "__ms_id"


def snapshot_row_id(partition: int, row: int) -> str:
    """The row id of the initial copy's ``row``-th row (0-based) of copy task ``partition``."""
    return f"S{partition}-{row}"


def stream_row_id(lsn: Any, position: Any) -> Any:
    """The row id (a Spark expression) of the copy an INSERT or UPDATE at (commit LSN,
    position) writes."""
    from pyspark.sql import functions as F

    return F.format_string("%016X-%08X-1", lsn, position)


def _segment(overview: TableOverview) -> Any:
    """How many of the batch's TRUNCATEs of the table come before an event."""
    from pyspark.sql import functions as F

    count: Any = F.lit(0)
    for t in overview.truncates:
        after = (F.col(EV_LSN) > F.lit(t.lsn)) | (
            (F.col(EV_LSN) == F.lit(t.lsn)) & (F.col(EV_POS) > F.lit(t.position))
        )
        count = count + F.when(after, 1).otherwise(0)
    return count


def assign_rows(
    events: Any,
    table: LakeTable,
    columns: Sequence[str],
    overview: TableOverview,
    stored: Any | None,
) -> Any:
    """``events`` (``changes.table_events`` of a table without a key, whose key is every
    column) as events of row ids: key ``struct(__row_id)``, new image with every column of
    ``columns`` and ``__row_id``, no unchanged values. ``stored``: the mirror as stored before
    the batch (a Spark DataFrame; None when there is none)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    key_type = events.schema[EV_KEY].dataType
    has_map = any(isinstance(f.dataType, T.MapType) for f in key_type.fields)
    value = F.to_json(F.col(EV_KEY)) if has_map else F.col(EV_KEY)
    op = F.col(EV_OP)
    # an UPDATE that kept every value is one event: a removal and a write of the same value
    moves = F.when(
        (op == "U") & (F.col(EV_SUB) == 0),
        F.array(F.lit(False), F.lit(True)),
    ).otherwise(F.array(op != "D"))
    exploded = events.select(
        *[F.col(quote_column(c)) for c in events.columns if c not in (EV_SUB, EV_SEQ)],
        F.posexplode(moves).alias("__ms_n", _PUSH),
        F.col(EV_SUB).alias("__ms_sub"),
    ).select(
        *[F.col(quote_column(c)) for c in events.columns if c not in (EV_SUB, EV_SEQ)],
        F.col(_PUSH),
        F.when(F.col("__ms_n") == 1, F.lit(1)).otherwise(F.col("__ms_sub")).alias(EV_SUB),
        value.alias(_VALUE),
        _segment(overview).alias(_SEGMENT),
    )
    order = [F.col(EV_LSN), F.col(EV_POS), F.col(EV_SUB), F.col(_PUSH)]
    by_value = Window.partitionBy(_VALUE, _SEGMENT).orderBy(*order)
    sign = F.when(F.col(_PUSH), 1).otherwise(-1)
    summed = exploded.withColumn(
        _SUM, F.sum(sign).over(by_value.rowsBetween(Window.unboundedPreceding, 0))
    )
    lowest_before = F.min(_SUM).over(by_value.rowsBetween(Window.unboundedPreceding, -1))
    s = F.col(_SUM)
    takes_stored = (
        ~F.col(_PUSH)
        & (F.col(_SEGMENT) == 0)
        & (s < F.least(F.lit(0), F.coalesce(lowest_before, F.lit(0))))
    )
    fresh = stream_row_id(F.col(EV_LSN), F.col(EV_POS))
    level = F.when(F.col(_PUSH), s).otherwise(s + 1)
    by_level = (
        Window.partitionBy(_VALUE, _SEGMENT, level.alias("__ms_level"))
        .orderBy(*order)
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    taken = F.last(F.when(F.col(_PUSH), fresh), ignorenulls=True).over(by_level)
    marked = summed.select(
        *[F.col(quote_column(c)) for c in summed.columns],
        F.when(takes_stored, -s).alias(_RANK),
        F.when(F.col(_PUSH), fresh).when(~takes_stored, taken).alias(_ID),
    )
    if stored is not None and ROW_ID in stored.columns:
        marked = _take_stored(marked, table, stored, has_map)
    new_fields = [
        (F.col(EV_KEY).getField(c) if c in table.keys else F.col(EV_NEW).getField(c)).alias(c)
        for c in columns
        if c != ROW_ID
    ]
    row = F.col(_ID)
    return marked.select(
        F.when(F.col(_PUSH), op).otherwise(F.lit("D")).alias(EV_OP),
        F.col(EV_LSN),
        F.col(EV_POS),
        F.col(EV_SUB),
        F.struct(F.col(EV_LSN), F.col(EV_POS), F.col(EV_SUB)).alias(EV_SEQ),
        F.col(EV_TIME),
        F.struct(row.alias(ROW_ID)).alias(EV_KEY),
        F.when(F.col(_PUSH), F.struct(*new_fields, row.alias(ROW_ID))).alias(EV_NEW),
        F.array().cast("array<string>").alias(EV_UNCHANGED),
    )


def _take_stored(marked: Any, table: LakeTable, stored: Any, has_map: bool) -> Any:
    """``marked`` with the row ids of the stored copies its removals take (``_RANK``-th copy of
    the value, by row id)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = list(table.keys)
    key_type = marked.schema[EV_KEY].dataType
    # the stored values in the events' types (the same unless a column was retyped since)
    stored = stored.select(
        *[F.col(quote_column(k)).cast(key_type[k].dataType).alias(k) for k in keys],
        F.col(ROW_ID),
    )
    wanted = (
        marked.where(F.col(_RANK).isNotNull())
        .select(*[F.col(EV_KEY).getField(k).alias(f"__ms_k{i}") for i, k in enumerate(keys)])
        .distinct()
    )
    match = None
    for i, k in enumerate(keys):
        cond = F.col(quote_column(k)).eqNullSafe(F.col(f"__ms_k{i}"))
        match = cond if match is None else match & cond
    copies = stored.join(F.broadcast(wanted), match, "left_semi")
    stored_value = F.struct(*[F.col(quote_column(k)).alias(k) for k in keys])
    stored_value = F.to_json(stored_value) if has_map else stored_value
    ranked = copies.select(
        stored_value.alias("__ms_svalue"),
        F.row_number()
        .over(Window.partitionBy(stored_value).orderBy(F.col(ROW_ID)))
        .alias("__ms_srank"),
        F.col(ROW_ID).alias("__ms_sid"),
    )
    joined = marked.join(
        ranked,
        (F.col(_RANK).isNotNull())
        & (F.col(_VALUE).eqNullSafe(F.col("__ms_svalue")))
        & (F.col(_RANK) == F.col("__ms_srank")),
        "left",
    )
    return joined.select(
        *[F.col(quote_column(c)) for c in marked.columns if c != _ID],
        F.coalesce(F.col(_ID), F.col("__ms_sid")).alias(_ID),
    )
