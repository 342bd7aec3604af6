"""The history (SCD type 2): one row per version of each key, with its validity.

A version starts at the commit of the transaction that wrote it (``__start_lsn``,
``__start_at``; ``__start_op`` 'I' if the transaction inserted the key, 'U' if it updated it,
'S' for rows of the initial snapshot) and ends at the commit of the next transaction that changed
or deleted the key or truncated the table (``__end_lsn``, ``__end_at``, ``__end_op`` 'U', 'D' or
'T'); the current version has ``__end_lsn`` NULL and ``__is_current`` true. A deleted key has
no current version. Several changes of one key in one transaction make one version (the
transaction's final state), so the history does not depend on how changes were batched.

Per micro-batch and table (Spark): events (key changes split, unchanged TOAST resolved) are
collapsed per key and transaction; each surviving state becomes a version row whose end is the
key's next transaction in the batch or the next TRUNCATE, whichever comes first; changes in a
transaction before a TRUNCATE in the same transaction never existed for readers and are dropped.
Per key, one *close* row ends the version current before the batch. Then one MERGE of Delta's
Spark connector in one commit (tagged with the batch's application transaction): close rows
update the matching current version (with deletion vectors: the closed version is written anew
and the old row marked), version rows are inserted, and with a TRUNCATE in the batch every other
current version is closed at the first TRUNCATE.

An unchanged TOAST value that no earlier change of the batch carried is taken from the key's
row in the mirror as it was before the batch (the key's current version holds the same values):
the batch pins that version of the mirror before it writes, so the history and the mirror can
be written at the same time.
A table without a key has a version per copy of its values (``pgcdc.lake.write.multiset``), keyed by
``__row_id``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pgcdc.lake.store.delta import append_rows, tagged
from pgcdc.lake.store.tables import (
    END_AT,
    END_LSN,
    END_OP,
    IS_CURRENT,
    START_AT,
    START_LSN,
    START_OP,
    LakeTable,
)
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
    value_column,
)
from pgcdc.lake.write.mirror import SRC, TGT, key_condition
from pgcdc.lake.write.schema_evolution import Defaults, evolve
from pgcdc.lake.write.toast import (
    KEEP_PREFIX,
    ROOT_PREFIX,
    fill_from_stored,
    keep_flag,
    root_column,
)

__all__ = ["ACTION", "history_rows", "history_schema", "merge_history"]

log = logging.getLogger("pgcdc.lake")

ACTION = "__pgcdc_action"


def _history_fields() -> tuple[tuple[str, Any], ...]:
    from pyspark.sql import types as T

    return (
        (START_LSN, T.LongType()),
        (START_AT, T.TimestampType()),
        (END_LSN, T.LongType()),
        (END_AT, T.TimestampType()),
        (IS_CURRENT, T.BooleanType()),
        (START_OP, T.StringType()),
        (END_OP, T.StringType()),
    )


def _live_events(resolved: Any, overview: TableOverview) -> Any:
    """The events that make versions: not those a TRUNCATE later in their own commit voids."""
    from pyspark.sql import functions as F

    voided = None
    for t in overview.truncates:
        cond = (F.col(EV_LSN) == F.lit(t.lsn)) & (F.col(EV_POS) < F.lit(t.position))
        voided = cond if voided is None else voided | cond
    return resolved if voided is None else resolved.where(~voided)


def history_rows(
    resolved: Any, table: LakeTable, columns: Sequence[str], overview: TableOverview
) -> Any:
    """The MERGE source (a Spark DataFrame) of version rows and close rows."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    events = _live_events(resolved, overview)
    truncates = overview.truncates

    payload = [c for c in events.columns if c not in (EV_KEY, EV_LSN)]
    collapsed = events.groupBy(EV_KEY, EV_LSN).agg(
        F.max_by(F.struct(*[F.col(c) for c in payload]), EV_SEQ).alias("r"),
        F.min_by(F.col(EV_OP), EV_SEQ).alias("first_op"),
    )
    # how the transaction ends the key's version before it: 'D' if it deleted the key, first
    # (deleted and wrote it again) or last (updated, then deleted it: no version follows)
    ends = (
        F.when((F.col("first_op") == "D") | (F.col("r").getField(EV_OP) == "D"), "D")
        .otherwise("U")
        .alias("ends")
    )
    collapsed = collapsed.select("*", ends)
    by_key = Window.partitionBy(EV_KEY).orderBy(EV_LSN)
    r = F.col("r")
    lsn = F.col(EV_LSN)
    stepped = collapsed.select(
        F.col(EV_KEY),
        lsn,
        r,
        F.col("first_op"),
        F.lead(lsn).over(by_key).alias("next_lsn"),
        F.lead(r.getField(EV_TIME)).over(by_key).alias("next_time"),
        F.col("ends"),
        F.lead(F.col("ends")).over(by_key).alias("next_ends"),
        F.row_number().over(by_key).alias("n"),
    )

    trunc_lsn: Any = F.lit(None).cast("long")
    trunc_time: Any = F.lit(None).cast("timestamp")
    if truncates:
        lsn_case = None
        time_case = None
        for t in truncates:  # the first TRUNCATE after the version's commit
            when = lsn < F.lit(t.lsn)
            at = F.lit(t.commit_time).cast("timestamp")
            lsn_case = (
                F.when(when, F.lit(t.lsn)) if lsn_case is None else lsn_case.when(when, t.lsn)
            )
            time_case = F.when(when, at) if time_case is None else time_case.when(when, at)
        assert lsn_case is not None and time_case is not None
        trunc_lsn, trunc_time = lsn_case, time_case

    next_lsn = F.col("next_lsn")
    by_trunc = trunc_lsn.isNotNull() & (next_lsn.isNull() | (trunc_lsn <= next_lsn))
    end_lsn = F.when(by_trunc, trunc_lsn).otherwise(next_lsn)
    version_cols = []
    for i, name in enumerate(columns):
        if name in table.row_keys:  # the value, not the key: grouping made a float's -0 read 0
            key = F.col(EV_KEY).getField(name)
            version_cols.append(F.coalesce(r.getField(value_column(i)), key).alias(name))
        else:
            version_cols.append(r.getField(value_column(i)).alias(name))
    keeps = [
        i
        for i, name in enumerate(columns)
        if name in overview.unchanged_columns and name not in table.row_keys
    ]
    versions = stepped.where(r.getField(EV_OP) != "D").select(
        *version_cols,
        lsn.alias(START_LSN),
        r.getField(EV_TIME).alias(START_AT),
        end_lsn.alias(END_LSN),
        F.when(by_trunc, trunc_time).otherwise(F.col("next_time")).alias(END_AT),
        end_lsn.isNull().alias(IS_CURRENT),
        F.when(F.col("first_op") == "I", "I").otherwise("U").alias(START_OP),
        F.when(by_trunc, "T")
        .when(next_lsn.isNull(), F.lit(None).cast("string"))
        .otherwise(F.col("next_ends"))
        .alias(END_OP),
        F.lit("insert").alias(ACTION),
        *[r.getField(keep_column(i)).alias(keep_flag(i)) for i in keeps],
        *[
            r.getField(EV_ROOT).getField(k).alias(root_column(j))
            for j, k in enumerate(table.row_keys)
            if keeps
        ],
    )

    first_trunc = truncates[0] if truncates else None
    if first_trunc is not None:
        close_by_trunc = lsn >= F.lit(first_trunc.lsn)
        close_lsn = F.when(close_by_trunc, F.lit(first_trunc.lsn)).otherwise(lsn)
        close_at = F.when(
            close_by_trunc, F.lit(first_trunc.commit_time).cast("timestamp")
        ).otherwise(r.getField(EV_TIME))
        close_op = F.when(close_by_trunc, "T").otherwise(F.col("ends"))
    else:
        close_lsn = lsn
        close_at = r.getField(EV_TIME)
        close_op = F.col("ends")
    close_cols = []
    for name in columns:
        if name in table.row_keys:
            close_cols.append(F.col(EV_KEY).getField(name).alias(name))
        else:
            close_cols.append(F.lit(None).alias(name))
    closes = stepped.where(F.col("n") == 1).select(
        *close_cols,
        F.lit(None).cast("long").alias(START_LSN),
        F.lit(None).cast("timestamp").alias(START_AT),
        close_lsn.alias(END_LSN),
        close_at.alias(END_AT),
        F.lit(False).alias(IS_CURRENT),
        F.lit(None).cast("string").alias(START_OP),
        close_op.alias(END_OP),
        F.lit("close").alias(ACTION),
        *[F.lit(False).alias(keep_flag(i)) for i in keeps],
        *[
            F.col(EV_KEY).getField(k).alias(root_column(j))
            for j, k in enumerate(table.row_keys)
            if keeps
        ],
    )
    return versions.unionByName(closes, allowMissingColumns=False)


def history_schema(rows: Any, columns: Sequence[str]) -> Any:
    """The history's schema (Spark) for a MERGE source of ``history_rows``."""
    from pyspark.sql import types as T

    fields = [T.StructField(c, rows.schema[c].dataType, True) for c in columns]
    fields += [T.StructField(name, dtype, True) for name, dtype in _history_fields()]
    return T.StructType(fields)


def merge_history(
    spark: Any,
    path: str,
    rows: Any,
    table: LakeTable,
    columns: Sequence[str],
    *,
    stored: Any | None,
    overview: TableOverview,
    inserts_only: bool = False,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
    defaults: Defaults | None = None,
) -> None:
    """Apply a batch's ``history_rows`` (a Spark DataFrame) to the history table in one commit,
    with Delta's MERGE on the executors; unchanged values come from ``stored`` (a Spark
    DataFrame of the mirror as it was before the batch; None when there was none).
    ``inserts_only`` (the batch only inserted rows of the table): every row is a new version
    of a key without one, appended."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    keys = table.row_keys
    evolve(
        spark,
        path,
        history_schema(rows, columns),
        drop_missing=False,
        what=f"{table.table_id} history",
        stats_columns=table.stats_columns("history"),
        defaults=defaults,
    )
    if inserts_only:
        versions = rows.where(F.col(ACTION) == "insert").drop(
            ACTION, *[c for c in rows.columns if c.startswith((KEEP_PREFIX, ROOT_PREFIX))]
        )
        append_rows(spark, path, versions, app_id=app_id, version=version, metadata=metadata)
        return
    if any(c.startswith(KEEP_PREFIX) for c in rows.columns):
        rows = fill_from_stored(rows, stored, keys, columns, foreign_only=False)
    rows = rows.drop(*[c for c in rows.columns if c.startswith((KEEP_PREFIX, ROOT_PREFIX))])
    # computed once: the MERGE reads its source in each of its passes
    rows = rows.localCheckpoint(eager=True)

    def src(name: str) -> Any:
        return F.col(f"{SRC}.{quote_column(name)}")

    current = F.col(f"{TGT}.{quote_column(IS_CURRENT)}")
    condition = (src(ACTION) == "close") & current & key_condition(keys)
    closing = {
        quote_column(END_LSN): src(END_LSN),
        quote_column(END_AT): src(END_AT),
        quote_column(END_OP): src(END_OP),
        quote_column(IS_CURRENT): F.lit(False),
    }
    inserts = {quote_column(n): src(n) for n in rows.columns if n != ACTION}
    merger = (
        DeltaTable.forPath(spark, path)
        .alias(TGT)
        .merge(rows.alias(SRC), condition)
        .whenMatchedUpdate(set=closing)
        .whenNotMatchedInsert(condition=src(ACTION) == "insert", values=inserts)
    )
    first = overview.truncates[0] if overview.truncates else None
    if first is not None:
        merger = merger.whenNotMatchedBySourceUpdate(
            condition=current,
            set={
                quote_column(END_LSN): F.lit(first.lsn).cast("long"),
                quote_column(END_AT): F.lit(first.commit_time).cast("timestamp"),
                quote_column(END_OP): F.lit("T"),
                quote_column(IS_CURRENT): F.lit(False),
            },
        )
    with tagged(spark, app_id, version, metadata):
        merger.execute()
