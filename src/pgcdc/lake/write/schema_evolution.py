"""Keep a Delta table's schema in step with its source table's columns (Delta's Spark writer).

The Spark source's schema follows the source catalog (``pgcdc.spark.SchemaChanged`` restarts
the query when a Relation message shows a change). Before writing a batch, ``evolve`` compares
the Delta table's schema with the batch's:

* added columns are added (an empty append with ``mergeSchema``: a metadata-only commit;
  existing rows read NULL), or, when PostgreSQL gave existing rows a value without writing it
  to the WAL (``ADD COLUMN ... DEFAULT <constant>``, the column's ``attmissingval``, or that
  constant default once a later table rewrite wrote it into the rows), the table
  is rewritten with that value in every stored image: every row of the mirror, every version of
  the history, the changelog's new images and whole old images. Every stored image was written
  before the column was added, and PostgreSQL reads such a row with the missing value; the
  stream's rows written before it do the same (``pgcdc.spark``), so an image reads the same
  whichever batch it came in;
* a column whose type changed (widened ``int`` -> ``bigint``, ``numeric(10,2)`` ->
  ``numeric(12,2)``, ``varchar`` -> ``text`` ...; or any other type change PostgreSQL's
  ``ALTER COLUMN TYPE`` made) is rewritten: the table is read, the column cast to the new type,
  and written back in one overwrite commit (PostgreSQL itself rewrites the table and sends no
  changes for it; Delta's own type widening would need readers that know that table feature,
  which delta-rs does not); a value that does not fit fails with an error naming the table and
  column;
* dropped columns are removed from the mirror (one overwrite commit) so its columns are the
  source's, and kept in the history and changelog (old versions keep their values, new rows
  carry NULL).

Schema commits do not carry an application transaction: they are idempotent by construction
(evolving an evolved table changes nothing), and the data commit that follows carries it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgcdc.errors import PgcdcError
from pgcdc.lake.store.delta import (
    conform,
    create_table,
    grows,
    is_delta_table,
    plain_type,
    table_schema,
    user_metadata,
)
from pgcdc.lake.write.changes import quote_column

__all__ = [
    "Defaults",
    "Images",
    "SchemaChange",
    "SchemaEvolutionError",
    "conform",
    "evolve",
    "grows",
    "plain_type",
    "plan_change",
]

log = logging.getLogger("pgcdc.lake")


class SchemaEvolutionError(PgcdcError, RuntimeError):
    """A Delta table cannot follow its source table's schema change."""


class SchemaChange:
    """The difference between a Delta table's schema and the wanted one."""

    __slots__ = ("added", "changed", "dropped", "grown")

    def __init__(
        self, added: list[Any], changed: list[Any], dropped: list[str], grown: list[Any]
    ) -> None:
        self.added = added  # StructFields
        self.changed = changed  # StructFields, in their new type
        self.dropped = dropped
        self.grown = grown  # StructFields whose structs gained fields, in their new type

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.dropped or self.grown)

    def describe(self) -> str:
        parts = []
        if self.added:
            parts.append("added " + ", ".join(f.name for f in self.added))
        if self.grown:
            parts.append("added fields to " + ", ".join(f.name for f in self.grown))
        if self.changed:
            parts.append(
                "retyped "
                + ", ".join(f"{f.name} to {f.dataType.simpleString()}" for f in self.changed)
            )
        if self.dropped:
            parts.append("dropped " + ", ".join(self.dropped))
        return "; ".join(parts)


def plan_change(current: Any, wanted: Any, *, drop_missing: bool) -> SchemaChange:
    """What turns schema ``current`` into ``wanted`` (Spark ``StructType``s)."""
    have = {f.name: plain_type(f.dataType) for f in current.fields}
    names = {f.name for f in wanted.fields}
    added = [f for f in wanted.fields if f.name not in have]
    differ = [f for f in wanted.fields if f.name in have and have[f.name] != plain_type(f.dataType)]
    grown = [f for f in differ if grows(have[f.name], f.dataType)]
    changed = [f for f in differ if f not in grown]
    dropped = [f.name for f in current.fields if f.name not in names] if drop_missing else []
    return SchemaChange(added, changed, dropped, grown)


#: Resolves the values existing rows have in added columns (PostgreSQL's "fast default",
#: ``pg_attribute.attmissingval``): column name -> value, for the columns that have one; it is
#: given the columns' Arrow types.
Defaults = Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Images:
    """Where a table's stored rows hold row images, for ``evolve``'s defaults: ``rows`` gives
    the condition (a Spark Column) of the rows whose columns are a row image (None: every
    row); ``old`` names a struct column of old images and the column telling which of them
    are whole rows ('O')."""

    rows: Callable[[], Any] | None = None
    old: tuple[str, str] | None = None


def evolve(
    spark: Any,
    path: Path | str,
    wanted: Any,
    *,
    drop_missing: bool,
    what: str,
    stats_columns: Sequence[str] = (),
    defaults: Defaults | None = None,
    images: Images = Images(),
    current: Any | None = None,
) -> bool:
    """Create the table with ``wanted`` (a Spark ``StructType``) or bring its schema to it;
    whether anything changed. ``what`` names the table in logs and errors
    (``shop.orders history``); ``stats_columns``: see ``delta.create_table``. ``defaults``
    gives the value existing rows have in an added column; ``images`` says which stored values
    are row images that take it (default: every row). ``current``: the table's schema, when
    the caller has it from the table's latest snapshot (a table exists then)."""
    from pyspark.sql import types as T

    wanted = T.StructType([T.StructField(f.name, plain_type(f.dataType), True) for f in wanted])
    if current is None:
        if not is_delta_table(spark, path):
            return create_table(spark, path, wanted, stats_columns=stats_columns, what=what)
        current = table_schema(spark, path)
    change = plan_change(current, wanted, drop_missing=drop_missing)
    if not change:
        return False
    fill: dict[str, Any] = {}
    if change.added and defaults is not None:
        from pyspark.sql.pandas.types import to_arrow_type

        fill = dict(defaults({f.name: to_arrow_type(f.dataType) for f in change.added}))
    if change.changed or change.dropped or fill:
        _rewrite(spark, path, current, wanted, change, what=what, fill=fill, images=images)
    else:
        # an empty append whose schema has the new columns and struct fields: Delta adds them
        # (metadata only)
        grown = {f.name: f.dataType for f in change.grown}
        schema = T.StructType(
            [
                *[T.StructField(f.name, grown.get(f.name, f.dataType), True) for f in current],
                *[T.StructField(f.name, f.dataType, True) for f in change.added],
            ]
        )
        (
            spark.createDataFrame([], schema)
            .write.format("delta")
            .mode("append")
            .option("mergeSchema", "true")
            .option("userMetadata", user_metadata({"operation": "add columns"}))
            .save(str(path))
        )
    log.info("schema of %s evolved: %s", what, change.describe())
    return True


def _rewrite(
    spark: Any,
    path: Path | str,
    current: Any,
    wanted: Any,
    change: SchemaChange,
    *,
    what: str,
    fill: Mapping[str, Any],
    images: Images,
) -> None:
    from pyspark.sql import functions as F

    data = spark.read.format("delta").load(str(path))
    wanted_types = {f.name: f.dataType for f in wanted.fields}
    kept = [
        f for f in current.fields if f.name not in wanted_types and f.name not in change.dropped
    ]
    if fill:
        values = _fill_row(spark, fill, wanted_types)
        data = data.crossJoin(F.broadcast(values))
    where = images.rows() if (fill and images.rows is not None) else None
    columns = []
    for name, dtype in [*wanted_types.items(), *[(f.name, f.dataType) for f in kept]]:
        if name in current.fieldNames():
            column = conform(F.col(quote_column(name)), current[name].dataType, dtype)
        elif name in fill:
            column = F.col(quote_column(_fill_name(name)))
            if where is not None:
                column = F.when(where, column)
        else:
            column = F.lit(None).cast(dtype)
        if fill and images.old is not None and name == images.old[0]:
            column = _fill_old_images(column, dtype, images.old[1], fill)
        columns.append(column.cast(dtype).alias(name) if name in fill else column.alias(name))
    rewritten = data.select(*columns)
    try:
        (
            rewritten.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option(
                "userMetadata",
                user_metadata({"operation": "schema change", "change": change.describe()}),
            )
            .save(str(path))
        )
    except Exception as exc:
        if "CAST" in str(exc).upper() and change.changed:
            raise SchemaEvolutionError(
                f"cannot change {', '.join(f.name for f in change.changed)} of {what} to the "
                "source's new type: stored values do not convert (the source's ALTER COLUMN "
                "TYPE changed them in a way the lake cannot follow); copy the table again into "
                "a new lake"
            ) from exc
        raise
    log.info("rewrote %s for a schema change (%s)", what, change.describe())


def _fill_name(name: str) -> str:
    return f"__pgcdc_fill_{name}"


def _fill_row(spark: Any, fill: Mapping[str, Any], types: Mapping[str, Any]) -> Any:
    """A one-row DataFrame of the fill values, each in its column's type (built through Arrow,
    so nested values convert as the stream's do)."""
    import pyarrow as pa
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    names = list(fill)
    arrays = [pa.array([fill[n]], type=to_arrow_type(types[n])) for n in names]
    table = pa.Table.from_arrays(arrays, names=[_fill_name(n) for n in names])
    schema = T.StructType([T.StructField(_fill_name(n), types[n], True) for n in names])
    return spark.createDataFrame(table, schema=schema)


def _fill_old_images(column: Any, dtype: Any, kind_column: str, fill: Mapping[str, Any]) -> Any:
    """A struct column of old images with ``fill``'s values in its added fields where the image
    is the whole old row ('O'; a key image holds only the key columns)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not isinstance(dtype, T.StructType):
        return column
    whole = F.col(quote_column(kind_column)) == "O"
    for field in dtype.fields:
        if field.name in fill:
            value = F.when(whole, F.col(quote_column(_fill_name(field.name))))
            column = column.withField(quote_column(field.name), value.cast(field.dataType))
    return column
