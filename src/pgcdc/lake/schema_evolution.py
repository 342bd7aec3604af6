"""Keep a Delta table's schema in step with its source table's columns.

The Spark source's schema follows the source catalog (``pgcdc.spark.SchemaChanged`` restarts
the query when a Relation message shows a change). Before writing a batch, ``evolve`` compares
the Delta table's schema with the batch's:

* added columns are added (``ALTER TABLE ADD COLUMNS``; existing rows read NULL), or, when
  PostgreSQL gave existing rows a value without writing it to the WAL (``ADD COLUMN ...
  DEFAULT <constant>``, the column's ``attmissingval``), the table is rewritten with that value
  in every stored image: every row of the mirror, every version of the history, the changelog's
  new images and whole old images. Every stored image was written before the column was
  added, and PostgreSQL reads such a row with the missing value; the stream's rows written
  before it do the same (``pgcdc.spark``), so an image reads the same whichever batch it came
  in;
* a column whose type changed (widened ``int`` -> ``bigint``, ``numeric(10,2)`` ->
  ``numeric(12,2)``, ``varchar`` -> ``text`` ...; or any other type change PostgreSQL's
  ``ALTER COLUMN TYPE`` made) is rewritten: the table is read, the column cast to the new
  type, and written back in one overwrite commit (PostgreSQL itself rewrites the table and
  sends no changes for it); a value that does not fit fails with an error naming the table and
  column;
* dropped columns are removed from the mirror (one overwrite commit) so its columns are the
  source's, and kept in the history and changelog (old versions keep their values, new rows
  carry NULL).

Schema commits do not carry an application transaction: they are idempotent by construction
(evolving an evolved table changes nothing), and the data commit that follows carries it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Field, write_deltalake

from pgcdc.lake.writer import DeltaTarget, nullable_schema, nullable_type

__all__ = [
    "Defaults",
    "Images",
    "SchemaChange",
    "SchemaEvolutionError",
    "evolve",
    "plan_change",
]

log = logging.getLogger("pgcdc.lake")


class SchemaEvolutionError(RuntimeError):
    """A Delta table cannot follow its source table's schema change."""


class SchemaChange:
    """The difference between a Delta table's schema and the wanted one."""

    __slots__ = ("added", "changed", "dropped")

    def __init__(self, added: list[pa.Field], changed: list[pa.Field], dropped: list[str]) -> None:
        self.added = added
        self.changed = changed
        self.dropped = dropped

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.dropped)

    def describe(self) -> str:
        parts = []
        if self.added:
            parts.append("added " + ", ".join(f.name for f in self.added))
        if self.changed:
            parts.append("retyped " + ", ".join(f"{f.name} to {f.type}" for f in self.changed))
        if self.dropped:
            parts.append("dropped " + ", ".join(self.dropped))
        return "; ".join(parts)


def plan_change(current: pa.Schema, wanted: pa.Schema, *, drop_missing: bool) -> SchemaChange:
    wanted = nullable_schema(wanted)
    have = {f.name: nullable_type(f.type) for f in current}
    names = set(wanted.names)
    added = [f for f in wanted if f.name not in have]
    changed = [f for f in wanted if f.name in have and have[f.name] != f.type]
    dropped = [f.name for f in current if f.name not in names] if drop_missing else []
    return SchemaChange(added, changed, dropped)


#: Resolves the values existing rows have in added columns (PostgreSQL's "fast default",
#: ``pg_attribute.attmissingval``): column name -> value, for the columns that have one.
Defaults = Callable[[Mapping[str, pa.DataType]], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Images:
    """Where a table's stored rows hold row images, for ``evolve``'s defaults: ``rows``
    gives the rows whose columns are a row image (None: every row); ``old`` names a struct
    column of old images and the column telling which of them are whole rows ('O')."""

    rows: Callable[[pa.Table], pa.Array] | None = None
    old: tuple[str, str] | None = None


def evolve(
    target: DeltaTarget,
    wanted: pa.Schema,
    *,
    drop_missing: bool,
    what: str,
    defaults: Defaults | None = None,
    images: Images = Images(),
) -> DeltaTable:
    """Create the table with ``wanted`` or bring its schema to it; the (re)loaded table.

    ``what`` names the table in logs and errors (``shop.orders history``). ``defaults`` gives
    the value existing rows have in an added column (``ALTER TABLE ... ADD COLUMN ... DEFAULT``
    sets it without writing any change to the WAL); ``images`` says which stored values are
    row images that take it (default: every row).
    """
    wanted = nullable_schema(wanted)
    table = target.table()
    if table is None:
        DeltaTable.create(target.uri, wanted, mode="ignore")
        log.info("created Delta table for %s at %s", what, target.path)
        created = target.table()
        assert created is not None
        return created
    current = pa.schema(table.schema().to_arrow())
    change = plan_change(current, wanted, drop_missing=drop_missing)
    if not change:
        return table
    fill: dict[str, Any] = {}
    if change.added and defaults is not None:
        fill = dict(defaults({f.name: f.type for f in change.added}))
    if change.changed or change.dropped or fill:
        _rewrite(target, current, wanted, change, what=what, fill=fill, images=images)
    else:
        table.alter.add_columns(
            [Field.from_arrow(pa.field(f.name, f.type, True)) for f in change.added],
            commit_properties=CommitProperties(
                custom_metadata={"pgcdc": {"operation": "add columns"}}
            ),
        )
    log.info("schema of %s evolved: %s", what, change.describe())
    evolved = target.table()
    assert evolved is not None
    return evolved


def _rewrite(
    target: DeltaTarget,
    current: pa.Schema,
    wanted: pa.Schema,
    change: SchemaChange,
    *,
    what: str,
    fill: Mapping[str, Any] | None = None,
    images: Images = Images(),
) -> None:
    data = target.read()
    where = None
    if fill and images.rows is not None:
        where = pc.fill_null(images.rows(data), False)
    wanted_types = {f.name: f.type for f in wanted}
    order = list(wanted.names) + [
        n for n in current.names if n not in wanted_types and n not in change.dropped
    ]
    arrays: list[pa.ChunkedArray] = []
    fields: list[pa.Field] = []
    for name in order:
        if name in wanted_types:
            typ = wanted_types[name]
        else:
            typ = nullable_type(current.field(name).type)
        if name in data.column_names:
            column = data.column(name)
            if column.type != typ:
                try:
                    column = column.cast(typ, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise SchemaEvolutionError(
                        f"cannot change column {name!r} of {what} from {column.type} to {typ}: "
                        "stored values do not convert (the source's ALTER COLUMN TYPE changed "
                        "them in a way the lake cannot follow); copy the table again into a "
                        "new lake"
                    ) from None
        elif fill and name in fill:
            value = pa.scalar(fill[name], type=typ)
            filled = pa.repeat(value, data.num_rows)
            if where is not None:
                filled = pc.if_else(where, filled, pa.nulls(data.num_rows, typ))
            column = pa.chunked_array([filled], type=typ)
        else:
            column = pa.chunked_array([pa.nulls(data.num_rows, typ)], type=typ)
        if fill and images.old is not None and name == images.old[0]:
            column = _fill_old_images(column, data.column(images.old[1]), fill)
        arrays.append(column)
        fields.append(pa.field(name, typ, True))
    # one chunk per column: delta-rs panics (and aborts the process) on a nested column
    # whose chunks are cut differently from the other columns' (an added column is one chunk)
    rewritten = pa.Table.from_arrays(arrays, schema=pa.schema(fields)).combine_chunks()
    del data, arrays
    write_deltalake(
        target.uri,
        rewritten,
        mode="overwrite",
        schema_mode="overwrite",
        commit_properties=CommitProperties(
            custom_metadata={"pgcdc": {"operation": "schema change", "change": change.describe()}}
        ),
    )
    log.info("rewrote %s (%s rows) for a schema change", what, rewritten.num_rows)


def _fill_old_images(
    old: pa.ChunkedArray, kinds: pa.ChunkedArray, fill: Mapping[str, Any]
) -> pa.ChunkedArray:
    """A struct column of old images with ``fill``'s values in its added fields where the image
    is the whole old row ('O'; a key image holds only the key columns)."""
    if not pa.types.is_struct(old.type):
        return old
    pairs = pa.Table.from_arrays([old, kinds], names=["old", "kind"]).to_batches()
    chunks = []
    for batch in pairs:
        struct = batch.column(0)
        whole = pc.fill_null(pc.equal(batch.column(1), "O"), False)
        children = []
        for i, field in enumerate(struct.type):
            child = struct.field(i)
            if field.name in fill:
                value = pa.repeat(pa.scalar(fill[field.name], type=field.type), len(struct))
                child = pc.if_else(whole, value, child)
            children.append(child)
        chunks.append(
            pa.StructArray.from_arrays(children, fields=list(struct.type), mask=struct.is_null())
        )
    return pa.chunked_array(chunks, type=old.type)
