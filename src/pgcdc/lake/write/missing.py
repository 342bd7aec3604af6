"""The values existing rows read in a column added to the source: PostgreSQL keeps a constant
``ADD COLUMN ... DEFAULT`` in the catalog (``pg_attribute.attmissingval``) instead of writing
it into the rows, and logical replication never sends it; the batch writer gives the lake's
rows written before the column that value, so that they read what PostgreSQL's do."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from pgcdc.lake.results import PipelineError
from pgcdc.lake.store.tables import LakeTable
from pgcdc.replication import source_catalog
from pgcdc.replication.database import connect_sql

__all__ = ["missing_values"]

log = logging.getLogger("pgcdc.lake")


def missing_values(
    dsn: str, table: LakeTable, columns: Mapping[str, pa.DataType]
) -> dict[str, Any]:
    """The values PostgreSQL gives existing rows in ``columns`` without storing them (a
    constant ``ADD COLUMN ... DEFAULT``: ``pg_attribute.attmissingval``, or the constant default
    a later table rewrite wrote into the rows), as Python values for the lake's Arrow types:
    decoded from the value's text as the stream's rows are, so that rows already in the lake and
    rows still in the stream read the same. Columns without one, or whose value does not
    convert, are left out; a column whose value the catalog no longer tells stops the pipeline
    (``source_catalog.unknown_missing_value``).
    """
    if not columns:
        return {}
    from pgcdc.spark.catalog import load_catalog
    from pgcdc.spark.schema import missing_array, registry_for

    catalog = load_catalog(dsn, tables=[(table.schema, table.name)])
    source = catalog.table(table.schema, table.name)
    registry = registry_for(catalog)
    known = {name: source.column(name) for name in columns} if source is not None else {}
    without = [name for name, column in known.items() if column and column.missing is None]
    if without and source is not None:  # one connection for them all
        with connect_sql(dsn) as conn:
            for name in without:
                unknown = source_catalog.unknown_missing_value(conn, source.relid, name)
                if unknown is not None:
                    raise _unknown_value(table, name, unknown)
    found: dict[str, Any] = {}
    for name, column in known.items():
        if column is None or column.missing is None:
            continue
        arrow = columns[name]
        read = dataclasses.replace(column, as_text=name in table.text_columns)
        try:
            array = missing_array(read, registry, arrow)
            value = None if array is None else array[0].as_py()
            pa.scalar(value, type=arrow)
        except (TypeError, ValueError, ArithmeticError, pa.ArrowException):
            log.warning(
                "%s: existing rows' value of added column %s cannot be copied to the lake "
                "(they read NULL there)",
                table.table_id,
                name,
            )
            continue
        if value is not None:
            found[name] = value
    return found


def _unknown_value(table: LakeTable, name: str, unknown: source_catalog.UnknownValue) -> Exception:
    """The error for an added column whose value in the rows written before it the lake cannot
    give them (see ``source_catalog.unknown_missing_value``)."""

    default = (
        f"DEFAULT {unknown.default}" if unknown.default is not None else "GENERATED AS IDENTITY"
    )
    if unknown.reason == "row by row":
        what = (
            f"{table.table_id} was rewritten when column {name!r} was added: its default "
            f"({default}) is computed row by row (a volatile function, serial, identity, or a "
            "domain with constraints), and logical replication sends none of the values "
            "PostgreSQL wrote, so the lake's existing rows would read NULL there"
        )
        avoid = "add the column without a default, then SET DEFAULT and UPDATE the rows in batches"
    elif unknown.reason == "computed once":
        what = (
            f"{table.table_id} was rewritten (VACUUM FULL, CLUSTER or an ALTER TABLE such as a "
            f"type change) after column {name!r} was added and before pgcdc read the addition: "
            "the rewrite wrote into the rows the value PostgreSQL had kept for those written "
            "before the column, and removed it from the catalog; the column's default "
            f"({default}) is not a literal of its type but was computed when the column was "
            "added, so the lake cannot give those rows PostgreSQL's value"
        )
        avoid = "let pgcdc apply an ADD COLUMN before rewriting the table"
    else:
        what = (
            f"column {name!r} of {table.table_id} had its type changed, rewriting the table, "
            "before pgcdc read the column's addition: ALTER COLUMN TYPE stored its default "
            f"({default}) again, and the catalog no longer tells whether rows written before "
            "the column was added read that default or NULL"
        )
        avoid = "let pgcdc apply an ADD COLUMN before changing the column's type"
    return PipelineError(
        f"{what}. Fix: copy the table again: leave it out of [[tables]] for one run and add it "
        "back (it is copied anew; the other tables are not touched); to avoid it, "
        f"{avoid}"
    )
