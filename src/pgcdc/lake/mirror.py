"""The mirror (SCD type 1): one row per key, as the source table has it.

Per micro-batch and table (Spark):

1. events (``changes.table_events``), key-changing updates split into delete + upsert;
2. a TRUNCATE voids every earlier event of the batch for the table (only the events after the
   last TRUNCATE are kept) and empties the table;
3. unchanged TOAST values are taken from the latest earlier event of the key in the batch;
4. per key, the last event by ``(commit LSN, position)`` wins: a delete removes the row, an
   insert or update writes it.

Then one delta-rs MERGE, in a single commit tagged with the batch's application transaction:
delete matched keys whose last event is a delete; update matched rows (a column no event of the
batch carried keeps its stored value: ``CASE WHEN keep THEN target ELSE source``); insert the
others; and, if the batch truncated the table, delete every row no event of the batch wrote
(``WHEN NOT MATCHED BY SOURCE``), so the emptying and the changes after it are one commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from pgcdc.lake.changes import (
    EV_KEY,
    EV_LSN,
    EV_OP,
    EV_POS,
    EV_ROOT,
    EV_SEQ,
    EV_SUB,
    EV_TIME,
    TableOverview,
    event_keys,
    expressions,
    keep_column,
    value_column,
)
from pgcdc.lake.schema_evolution import Defaults, evolve
from pgcdc.lake.tables import COMMIT_LSN, COMMIT_TIME, LakeTable
from pgcdc.lake.toast import KEEP_PREFIX, ROOT_PREFIX, fill_from_stored, keep_flag, root_column
from pgcdc.lake.writer import (
    MERGE_OPTIONS,
    Chunk,
    DeltaTarget,
    cast_to,
    commit_properties,
    execute_merge,
)

__all__ = [
    "OP_COLUMN",
    "SRC",
    "TGT",
    "last_per_key",
    "merge_mirror",
    "mirror_events",
    "mirror_keys",
    "mirror_rows",
    "reducible_keys",
    "sql_name",
]

log = logging.getLogger("pgcdc.lake")

OP_COLUMN = "__pgcdc_op"
#: MERGE aliases of the source and the target: no source column can have these names
SRC = "__pgcdc_src"
TGT = "__pgcdc_tgt"


def sql_name(name: str) -> str:
    """A column name quoted for delta-rs (DataFusion) expressions."""
    return "`" + name.replace("`", "``") + "`"


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

    out = []
    for i, name in enumerate(columns):
        if name in table.keys:
            out.append(F.col(EV_KEY).getField(name).alias(name))
        else:
            out.append(field(value_column(i)).alias(name))
    out.append(field(EV_LSN).alias(COMMIT_LSN))
    out.append(field(EV_TIME).alias(COMMIT_TIME))
    out.append(F.when(field(EV_OP) == "D", "D").otherwise("U").alias(OP_COLUMN))
    if any(name in overview.unchanged_columns for name in columns if name not in table.keys):
        for i, name in enumerate(columns):
            if name in overview.unchanged_columns and name not in table.keys:
                out.append(field(keep_column(i)).alias(keep_flag(i)))
        for j, key in enumerate(table.keys):
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
    last = events.groupBy(EV_KEY).agg(
        F.max_by(F.struct(*[F.col(c) for c in events.columns if c != EV_KEY]), EV_SEQ).alias("r")
    )
    r = F.col("r")
    return last.select(*_mirror_columns(r.getField, table, columns, overview))


def mirror_keys(resolved: Any, table: LakeTable, overview: TableOverview) -> Any:
    """The key columns of ``mirror_rows``' rows, a row per event (a Spark DataFrame): the same
    distinct keys, without grouping every event's values, for ``range_chunks``' boundaries
    (where the rows have no root columns: a row's root is its last event's)."""
    return event_keys(_events_after_truncate(resolved, overview), table)


#: the event order of ``mirror_events`` rows, dropped by ``last_per_key``
SEQ_POSITION = "__pgcdc_seq_position"
SEQ_SUB = "__pgcdc_seq_sub"


def mirror_events(
    resolved: Any, table: LakeTable, columns: Sequence[str], overview: TableOverview
) -> Any:
    """``mirror_rows`` before its per-key reduction (a Spark DataFrame): a row per event, with
    ``__pgcdc_seq_position`` and ``__pgcdc_seq_sub`` beside ``__commit_lsn`` for its order.
    ``last_per_key`` reduces it on the driver, with no shuffle and no sort in Spark; for a
    batch committed in one piece that is cheaper than ``mirror_rows``' aggregation."""
    from pyspark.sql import functions as F

    def build() -> list[Any]:
        out = _mirror_columns(F.col, table, columns, overview)
        out.append(F.col(EV_POS).alias(SEQ_POSITION))
        out.append(F.col(EV_SUB).alias(SEQ_SUB))
        return out

    key = ("mirror", table.table_id, table.keys, tuple(columns), overview.unchanged_columns)
    events = _events_after_truncate(resolved, overview)
    return events.select(*expressions(resolved, key, build))


def reducible_keys(events: Any, table: LakeTable) -> bool:
    """Whether ``last_per_key`` groups ``mirror_events``' keys exactly as Spark's ``GROUP BY``
    does: only for key types compared by value (text, binary, integers, decimals, booleans,
    dates, timestamps), not floating point (Spark makes NaNs and -0.0 equal) or nested types."""
    from pyspark.sql import types as T

    exact = (
        T.StringType,
        T.BinaryType,
        T.BooleanType,
        T.ByteType,
        T.ShortType,
        T.IntegerType,
        T.LongType,
        T.DecimalType,
        T.DateType,
        T.TimestampType,
        T.TimestampNTZType,
    )
    return all(isinstance(events.schema[k].dataType, exact) for k in table.keys)


def last_per_key(events: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``mirror_events`` collected as Arrow, reduced to the MERGE source ``mirror_rows`` gives:
    per key (NULL equal to NULL, as in ``GROUP BY``), its last event by (commit LSN, position,
    sub), in no particular order. When every key has a single event (a batch of inserts, say),
    that is ``events`` itself, without a copy."""
    import pyarrow.compute as pc

    order = pc.sort_indices(
        events,
        sort_keys=[(COMMIT_LSN, "ascending"), (SEQ_POSITION, "ascending"), (SEQ_SUB, "ascending")],
    )
    # the keys alone in event order, numbered: a key's highest number is its last event
    index = "__pgcdc_index"
    numbered = (
        events.select(list(keys))
        .take(order)
        .append_column(index, pa.array(np.arange(events.num_rows, dtype=np.int64)))
    )
    last = numbered.group_by(list(keys), use_threads=False).aggregate([(index, "max")])
    if last.num_rows == events.num_rows:
        return events.drop_columns([SEQ_POSITION, SEQ_SUB])
    positions = np.sort(last.column(f"{index}_max").to_numpy())
    rows = order.to_numpy()[positions]  # one copy of the kept rows, none of the others
    return events.take(rows).drop_columns([SEQ_POSITION, SEQ_SUB])


def key_match(table: LakeTable) -> str:
    """The MERGE condition matching a source row to the stored row of the same key (NULL keys
    match NULL under REPLICA IDENTITY FULL, whose key may be every column)."""
    op = "IS NOT DISTINCT FROM" if table.replica_identity == "f" else "="
    return " AND ".join(f"({TGT}.{sql_name(k)} {op} {SRC}.{sql_name(k)})" for k in table.keys)


def mirror_schema(source_schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """The mirror's schema for a MERGE source of ``mirror_rows``."""
    fields = [source_schema.field(c) for c in columns]
    fields.append(pa.field(COMMIT_LSN, pa.int64()))
    fields.append(pa.field(COMMIT_TIME, pa.timestamp("us", tz="UTC")))
    return pa.schema(fields)


def merge_mirror(
    target: DeltaTarget,
    source: pa.Table,
    table: LakeTable,
    columns: Sequence[str],
    *,
    truncated: bool,
    app_id: str,
    version: int,
    metadata: dict[str, Any] | None = None,
    chunk: Chunk | None = None,
    defaults: Defaults | None = None,
) -> dict[str, Any]:
    """Apply a batch's ``mirror_rows`` to the mirror in one commit; the MERGE metrics."""
    what = f"{table.table_id} mirror"
    delta = evolve(
        target,
        mirror_schema(source.schema, columns),
        drop_missing=True,
        what=what,
        defaults=defaults,
    )
    target_schema = pa.schema(delta.schema().to_arrow())
    source = cast_to(source, target_schema)
    source = fill_from_stored(target, source, table, columns, current_only=False, foreign_only=True)
    source = source.drop_columns([n for n in source.column_names if n.startswith(ROOT_PREFIX)])
    keep = {name for name in source.column_names if name.startswith(KEEP_PREFIX)}
    updates: dict[str, str] = {}
    for i, name in enumerate(columns):
        if name in table.keys:
            continue
        flag = keep_flag(i)
        if flag in keep:
            column = sql_name(name)
            updates[column] = (
                f"CASE WHEN {SRC}.{sql_name(flag)} THEN {TGT}.{column} ELSE {SRC}.{column} END"
            )
        else:
            updates[sql_name(name)] = f"{SRC}.{sql_name(name)}"
    for name in (COMMIT_LSN, COMMIT_TIME):
        updates[sql_name(name)] = f"{SRC}.{sql_name(name)}"
    inserts = {
        sql_name(name): f"{SRC}.{sql_name(name)}" for name in [*columns, COMMIT_LSN, COMMIT_TIME]
    }
    props = commit_properties(app_id, version, metadata, chunk=chunk)
    merger = (
        delta.merge(
            source,
            predicate=key_match(table),
            source_alias=SRC,
            target_alias=TGT,
            commit_properties=props,
            **MERGE_OPTIONS,
        )
        .when_matched_delete(predicate=f"{SRC}.{OP_COLUMN} = 'D'")
        .when_matched_update(updates=updates, predicate=f"{SRC}.{OP_COLUMN} <> 'D'")
        .when_not_matched_insert(updates=inserts, predicate=f"{SRC}.{OP_COLUMN} <> 'D'")
    )
    if truncated:
        merger = merger.when_not_matched_by_source_delete()
    metrics = execute_merge(delta, merger, app_id, version, props)
    log.debug("mirror %s: %s", table.table_id, metrics)
    return metrics
