"""From the Spark source's DataFrame to per-table change events, in Spark.

The source gives one DataFrame for all published tables (``pgcdc.spark``): metadata columns
(``_table_id``, ``_op``, ``_commit_lsn``, ``_position``, ``_commit_time``, ...) and per table
one struct column with ``new``, ``old``, ``old_kind`` and ``unchanged``. This module turns the
rows of one table into *events*, the shape the mirror, history and changelog builders share:

* one event per change, in LSN order ``__seq = (commit LSN, position, sub)``;
* ``__key``: a struct of the table's key columns, taken from the new image for inserts and
  updates and from the old image (``'K'`` key or ``'O'`` full row) for deletes;
* an update that changes the key becomes two events: a delete of the old key (sub 0) and an
  upsert of the new key (sub 1);
* TRUNCATE rows are not events: ``BatchOverview`` lists them per table (there are few);
* ``resolve_unchanged`` fills a column whose new value was unchanged TOAST from the latest
  earlier event of the same key in the batch that carried a value, and says for which rows no
  event did (then the value stored in the lake table is the right one).

``batch_overview`` is one small Spark job per batch: per table, change counts per operation,
the LSN range, the truncates and the columns that arrived as unchanged TOAST.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from pgcdc.lake.store.tables import LakeTable

__all__ = [
    "EV_KEY",
    "EV_LSN",
    "EV_NEW",
    "EV_OP",
    "EV_POS",
    "EV_SEQ",
    "EV_SUB",
    "EV_TIME",
    "EV_UNCHANGED",
    "BatchOverview",
    "TableOverview",
    "Truncate",
    "batch_overview",
    "event_array",
    "expressions",
    "image_columns",
    "lake_image",
    "lake_type",
    "quote_column",
    "resolve_unchanged",
    "table_events",
    "value_column",
]

_T = TypeVar("_T")

EV_OP = "__ev_op"
EV_LSN = "__ev_lsn"
EV_POS = "__ev_pos"
EV_SUB = "__ev_sub"
EV_SEQ = "__ev_seq"
EV_TIME = "__ev_time"
EV_KEY = "__ev_key"
EV_NEW = "__ev_new"
EV_UNCHANGED = "__ev_unchanged"


#: Column expressions per Spark context (or Connect session; weakly held) and key; see
#: ``expressions``
_EXPRESSIONS: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = weakref.WeakKeyDictionary()


def _expressions_owner(df: Any) -> Any:
    """What ``df``'s Column expressions stay valid with: its SparkContext (the JVM's columns),
    not its SparkSession, since ``foreachBatch`` hands every micro-batch a new Python session
    object wrapping the stream's JVM session (a cache per session object never hit). Spark
    Connect has no SparkContext: its session."""
    session = df.sparkSession
    try:
        return session.sparkContext
    except Exception:  # Spark Connect: PySparkNotImplementedError
        return session


def expressions(df: Any, key: Hashable, build: Callable[[], _T]) -> _T:
    """``build()``, made once per Spark context and ``key``: the Column expressions of a
    table's batches depend only on its schema and a few flags (they are unresolved: each query
    resolves them with its own session), and building them costs a py4j round trip per
    function call (for a small batch of a ten-column table, more than half of the batch's
    time on the driver). ``key`` must hold everything ``build`` depends on."""
    try:
        cache = _EXPRESSIONS.setdefault(_expressions_owner(df), {})
    except TypeError:  # an owner that cannot be weakly referenced: build every time
        return build()
    if key not in cache:
        cache[key] = build()
    return cast("_T", cache[key])


def quote_column(name: str) -> str:
    """A column name for ``F.col``, quoted so dots and backticks in it are literal."""
    return "`" + name.replace("`", "``") + "`"


def value_column(index: int) -> str:
    """Name of the resolved value of the table's column number ``index`` (0-based)."""
    return f"__ev_v{index}"


def keep_column(index: int) -> str:
    """Name of the flag: no event of the batch carried column ``index``'s value."""
    return f"__ev_keep{index}"


@dataclass(frozen=True, slots=True)
class Truncate:
    lsn: int
    position: int
    commit_time: datetime | None


@dataclass(frozen=True, slots=True)
class TableOverview:
    """What one micro-batch holds for one table."""

    table_id: str
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    truncates: tuple[Truncate, ...] = ()
    min_lsn: int | None = None
    max_lsn: int | None = None
    unchanged_columns: frozenset[str] = field(default_factory=frozenset)
    # updates with an old image and unchanged TOAST values (key changes among them)
    old_with_unchanged: int = 0
    #: the newest commit time among the table's changes in the batch
    max_commit_time: datetime | None = None

    @property
    def changes(self) -> int:
        return self.inserts + self.updates + self.deletes + len(self.truncates)

    @property
    def last_truncate(self) -> Truncate | None:
        return self.truncates[-1] if self.truncates else None


@dataclass(frozen=True, slots=True)
class BatchOverview:
    tables: dict[str, TableOverview]

    @property
    def changes(self) -> int:
        return sum(t.changes for t in self.tables.values())

    @property
    def min_lsn(self) -> int | None:
        values = [t.min_lsn for t in self.tables.values() if t.min_lsn is not None]
        return min(values) if values else None

    @property
    def max_lsn(self) -> int | None:
        values = [t.max_lsn for t in self.tables.values() if t.max_lsn is not None]
        return max(values) if values else None


def batch_overview(df: Any, table_columns: dict[str, str]) -> BatchOverview:
    """Counts, LSN range, truncates and unchanged-TOAST columns per table (one Spark job).

    ``table_columns`` maps ``schema.table`` to the name of its struct column.
    """
    known = tuple(name for name in table_columns.values() if name in df.columns)
    aggregates = expressions(
        df, ("overview", known, df.schema.json()), lambda: _overview_aggregates(df, known)
    )
    rows = df.groupBy("_table_id").agg(*aggregates).collect()
    tables: dict[str, TableOverview] = {}
    for row in rows:
        truncates = sorted(
            (Truncate(int(t[0]), int(t[1]), t[2]) for t in row["t"]),
            key=lambda t: (t.lsn, t.position),
        )
        tables[row["_table_id"]] = TableOverview(
            table_id=row["_table_id"],
            inserts=int(row["i"]),
            updates=int(row["u"]),
            deletes=int(row["d"]),
            truncates=tuple(truncates),
            min_lsn=row["lo"],
            max_lsn=row["hi"],
            unchanged_columns=frozenset(row["c"] or ()),
            old_with_unchanged=int(row["ou"]),
            max_commit_time=utc_moment(row["ct"]),
        )
    return BatchOverview(tables)


def utc_moment(moment: Any) -> Any:
    """A timestamp Spark collected, as an aware UTC datetime: Spark's come back naive, in UTC
    (pgcdc's sessions run in UTC); anything else is returned as it is."""
    if isinstance(moment, datetime) and moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment


def _overview_aggregates(df: Any, known: Sequence[str]) -> list[Any]:
    """``batch_overview``'s aggregate columns for a source with these table struct columns."""
    from pyspark.sql import functions as F

    unchanged = (
        F.coalesce(*[F.col(quote_column(c)).getField("unchanged") for c in known])
        if known
        else F.lit(None).cast("array<string>")
    )
    old_unchanged = (
        F.coalesce(
            *[
                F.when(
                    F.col(quote_column(c)).getField("old").isNotNull()
                    & (F.size(F.col(quote_column(c)).getField("unchanged")) > 0),
                    F.lit(1),
                )
                for c in known
            ]
        )
        if known
        else F.lit(None)
    )
    op = F.col("_op")
    # only the rows that have unchanged values: collect_list skips the nulls
    unchanged_lists = F.collect_list(F.when(F.size(unchanged) > 0, unchanged))
    return [
        F.sum(F.when(op == "I", 1).otherwise(0)).alias("i"),
        F.sum(F.when(op == "U", 1).otherwise(0)).alias("u"),
        F.sum(F.when(op == "D", 1).otherwise(0)).alias("d"),
        F.sum(F.when((op == "U") & old_unchanged.isNotNull(), 1).otherwise(0)).alias("ou"),
        F.min("_commit_lsn").alias("lo"),
        F.max("_commit_lsn").alias("hi"),
        F.max("_commit_time").alias("ct"),
        F.collect_list(
            F.when(op == "T", F.struct("_commit_lsn", "_position", "_commit_time"))
        ).alias("t"),
        F.array_distinct(F.flatten(unchanged_lists)).alias("c"),
    ]


def lake_type(dtype: Any) -> Any:
    """The Spark type a value is stored as in Delta: ``dtype`` with the types Delta has no
    equivalent for replaced (TIME -> string 'HH:MM:SS[.ffffff]', VARIANT -> JSON string)."""
    from pyspark.sql import types as T

    name = type(dtype).__name__
    if name in ("TimeType", "VariantType"):
        return T.StringType()
    if isinstance(dtype, T.StructType):
        return T.StructType(
            [T.StructField(f.name, lake_type(f.dataType), True, f.metadata) for f in dtype.fields]
        )
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(lake_type(dtype.elementType), True)
    if isinstance(dtype, T.MapType):
        return T.MapType(lake_type(dtype.keyType), lake_type(dtype.valueType), True)
    return dtype


def needs_cast(dtype: Any) -> bool:
    return bool(lake_type(dtype) != dtype)


def image_columns(df: Any, column: str) -> tuple[Any, list[str]]:
    """The Spark type of a table's images (its ``new`` struct) and its column names."""
    struct = df.schema[column].dataType
    image = struct["new"].dataType
    return image, list(image.fieldNames())


def lake_image(image: Any, dtype: Any) -> Any:
    """An image column cast to ``lake_type`` where Delta needs it."""
    target = lake_type(dtype)
    return image if target == dtype else image.cast(target)


def table_events(df: Any, table: LakeTable, column: str, columns: Sequence[str]) -> Any:
    """The table's changes (not truncates) as events, key changes split in two.

    ``column`` is the table's struct column; ``columns`` the table's column names (the fields
    of its ``new`` struct).
    """
    key = ("events", table.table_id, table.keys, column, df.schema[column].dataType.json())
    where, exploded, events = expressions(df, key, lambda: _event_expressions(df, table, column))
    return df.where(where).select(*exploded).select(*events)


def event_array(df: Any, table: LakeTable, column: str) -> Any:
    """Per source row of ``table`` (not a TRUNCATE), its events as an array of
    ``struct(op, key, sub, new)`` (a Spark Column): one event, or two for an update that
    changed the key (a delete of the old key, sub 0, and an upsert of the new one, sub 1).
    ``new`` is the lake's image (``lake_image``), NULL for a delete."""
    from pyspark.sql import functions as F

    s = F.col(quote_column(column))
    image_type, _ = image_columns(df, column)
    new = lake_image(s.getField("new"), image_type)
    old = lake_image(s.getField("old"), image_type)
    unchanged = F.coalesce(s.getField("unchanged"), F.array().cast("array<string>"))

    def key_of(image: Any, fallback: Any | None = None) -> Any:
        parts = []
        for k in table.keys:
            value = image.getField(k)
            if fallback is not None:  # an unchanged-TOAST key column: take the old key's value
                value = F.when(F.array_contains(unchanged, k), fallback.getField(k)).otherwise(
                    value
                )
            parts.append(value.alias(k))
        return F.struct(*parts)

    new_key = key_of(new, old)
    old_key = key_of(old)
    op = F.col("_op")
    key_changed = (op == "U") & old.isNotNull() & ~old_key.eqNullSafe(new_key)

    def event(kind: str, key: Any, sub: int, with_new: bool) -> Any:
        return F.struct(
            F.lit(kind).alias("op"),
            key.alias("key"),
            F.lit(sub).alias("sub"),
            (new if with_new else F.when(F.lit(False), new)).alias("new"),
        )

    split = F.array(
        event("D", old_key, 0, False),
        event("U", new_key, 1, True),
    )
    single = F.array(
        F.struct(
            op.alias("op"),
            F.when(op == "D", old_key).otherwise(new_key).alias("key"),
            F.lit(0).alias("sub"),
            F.when(op != "D", new).alias("new"),
        )
    )
    return F.when(key_changed, split).otherwise(single)


def _event_expressions(df: Any, table: LakeTable, column: str) -> tuple[Any, list[Any], list[Any]]:
    """``table_events``' filter and its two projections (rows exploded, then events)."""
    from pyspark.sql import functions as F

    s = F.col(quote_column(column))
    unchanged = F.coalesce(s.getField("unchanged"), F.array().cast("array<string>"))
    op = F.col("_op")
    where = (F.col("_table_id") == table.table_id) & (op != "T")
    exploded = [
        F.col("_commit_lsn").alias(EV_LSN),
        F.col("_position").alias(EV_POS),
        F.col("_commit_time").alias(EV_TIME),
        unchanged.alias(EV_UNCHANGED),
        F.explode(event_array(df, table, column)).alias("__ev"),
    ]
    ev = F.col("__ev")
    events = [
        ev.getField("op").alias(EV_OP),
        F.col(EV_LSN),
        F.col(EV_POS),
        ev.getField("sub").alias(EV_SUB),
        F.struct(F.col(EV_LSN), F.col(EV_POS), ev.getField("sub")).alias(EV_SEQ),
        F.col(EV_TIME),
        ev.getField("key").alias(EV_KEY),
        ev.getField("new").alias(EV_NEW),
        F.when(ev.getField("op") == "D", F.array().cast("array<string>"))
        .otherwise(F.col(EV_UNCHANGED))
        .alias(EV_UNCHANGED),
    ]
    return where, exploded, events


def carries(name: str) -> Any:
    """Whether an event carries column ``name``'s value (not a delete, not unchanged TOAST)."""
    from pyspark.sql import functions as F

    return (F.col(EV_OP) != "D") & ~F.array_contains(F.col(EV_UNCHANGED), name)


EV_SEGMENT = "__ev_segment"
EV_PARENT = "__ev_parent"
EV_ROOT = "__ev_root"

#: More key changes of one row in one batch than 2**this are not resolved (never seen).
_MAX_JUMPS = 16


def resolve_unchanged(
    events: Any,
    columns: Sequence[str],
    unchanged: frozenset[str],
    keys: Sequence[str],
    *,
    rekeyed: bool = True,
) -> Any:
    """Events with the values they leave in the row: ``value_column(i)`` per table column,
    ``keep_column(i)`` true where it is unknown in the batch, and ``__ev_root``: the key whose
    row as stored before the batch holds the unknown values.

    A column that arrived as unchanged TOAST keeps the value the row had. Within the batch the
    row's history is a *segment*: the events of one key from an insert, or from the upsert half
    of a key-changing update, up to the next such start. Inside a segment the value is the
    latest one an event carried. A segment started by a key change inherits the old key's
    values at that point (the delete half of the same change); a segment with no start in the
    batch belongs to a row stored before the batch, under its own key. Inheritance chains
    (a row whose key changes twice in a batch) are followed by pointer jumping: each round, an
    event still inheriting takes the missing values, the parent and the root of its parent.
    Columns not in ``unchanged`` are taken from the event as they are. ``rekeyed`` False (no
    update with an old image carried unchanged TOAST values) skips the inheritance rounds.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not unchanged:

        def plain() -> list[Any]:
            out = [F.col(c) for c in events.columns]
            for i, name in enumerate(columns):
                out.append(F.col(EV_NEW).getField(name).alias(value_column(i)))
                out.append(F.lit(False).alias(keep_column(i)))
            out.append(F.col(EV_KEY).alias(EV_ROOT))
            return out

        key = ("resolved", tuple(events.columns), tuple(columns))
        return events.select(*expressions(events, key, plain))

    start = (F.col(EV_OP) == "I") | (F.col(EV_SUB) == 1)
    running = Window.partitionBy(EV_KEY).orderBy(EV_SEQ)
    events = events.withColumn(
        EV_SEGMENT,
        F.sum(start.cast("int")).over(
            running.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        ),
    )
    segment = (
        Window.partitionBy(EV_KEY, EV_SEGMENT)
        .orderBy(EV_SEQ)
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    first = F.first(
        F.struct(
            F.col(EV_OP).alias("op"),
            F.col(EV_SUB).alias("sub"),
            F.col(EV_LSN).alias("lsn"),
            F.col(EV_POS).alias("pos"),
        )
    ).over(segment)
    out = [F.col(c) for c in events.columns if c != EV_SEGMENT]
    tracked: list[int] = []
    for i, name in enumerate(columns):
        value = F.col(EV_NEW).getField(name)
        if name in unchanged:
            carried = F.last(F.when(carries(name), F.struct(value.alias("v"))), ignorenulls=True)
            resolved = carried.over(segment)
            out.append(resolved.getField("v").alias(value_column(i)))
            out.append(resolved.isNull().alias(keep_column(i)))
            tracked.append(i)
        else:
            out.append(value.alias(value_column(i)))
            out.append(F.lit(False).alias(keep_column(i)))
    inherited = (F.col(EV_SEGMENT) > 0) & (first.getField("sub") == 1)
    out.append(
        F.when(
            inherited,
            F.struct(first.getField("lsn").alias("lsn"), first.getField("pos").alias("pos")),
        ).alias(EV_PARENT)
    )
    out.append(F.when(~inherited, F.col(EV_KEY)).alias(EV_ROOT))
    resolved_events = events.select(*out)

    def missing(df: Any) -> Any:
        any_keep = None
        for i in tracked:
            cond = F.col(keep_column(i))
            any_keep = cond if any_keep is None else any_keep | cond
        assert any_keep is not None
        return df.where(F.col(EV_ROOT).isNull() & F.col(EV_PARENT).isNotNull() & any_keep)

    for _ in range(_MAX_JUMPS):
        if not rekeyed or missing(resolved_events).isEmpty():
            break
        # the delete half of each key change, as it stands after the previous round
        parents = resolved_events.where((F.col(EV_SUB) == 0) & (F.col(EV_OP) == "D")).select(
            F.col(EV_LSN).alias("__p_lsn"),
            F.col(EV_POS).alias("__p_pos"),
            F.col(EV_PARENT).alias("__p_parent"),
            F.col(EV_ROOT).alias("__p_root"),
            *[F.col(value_column(i)).alias(f"__p_v{i}") for i in tracked],
            *[F.col(keep_column(i)).alias(f"__p_k{i}") for i in tracked],
        )
        joined = resolved_events.join(
            parents,
            (F.col(EV_ROOT).isNull())
            & (F.col(EV_PARENT).getField("lsn") == F.col("__p_lsn"))
            & (F.col(EV_PARENT).getField("pos") == F.col("__p_pos")),
            "left",
        )
        pending = F.col(EV_ROOT).isNull() & F.col("__p_lsn").isNotNull()
        step = []
        for c in resolved_events.columns:
            index = _tracked_index(c, tracked)
            if c == EV_ROOT:
                step.append(F.when(pending, F.col("__p_root")).otherwise(F.col(c)).alias(c))
            elif c == EV_PARENT:
                step.append(F.when(pending, F.col("__p_parent")).otherwise(F.col(c)).alias(c))
            elif index is not None and c == value_column(index):
                take = pending & F.col(keep_column(index))
                step.append(F.when(take, F.col(f"__p_v{index}")).otherwise(F.col(c)).alias(c))
            elif index is not None and c == keep_column(index):
                step.append(
                    F.when(pending, F.col(c) & F.col(f"__p_k{index}")).otherwise(F.col(c)).alias(c)
                )
            else:
                step.append(F.col(c))
        resolved_events = joined.select(*step).localCheckpoint(eager=True)
    else:  # pragma: no cover - needs a row re-keyed 65536 times in one batch
        raise RuntimeError("unchanged TOAST values could not be resolved (key change chain)")
    # inheriting events that needed nothing from the parent: their own key is as good as any
    return resolved_events.withColumn(EV_ROOT, F.coalesce(F.col(EV_ROOT), F.col(EV_KEY))).drop(
        EV_PARENT
    )


def _tracked_index(column: str, tracked: Sequence[int]) -> int | None:
    for i in tracked:
        if column in (value_column(i), keep_column(i)):
            return i
    return None
