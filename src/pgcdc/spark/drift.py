"""Schema drift: a Relation message that does not fit the query's schema, and what to do.

The query's schema is fixed when its DataFrame is defined. When the stream later describes a
table differently (``mismatch``), the planner asks the current catalog (``judge``):

* the catalog confirms the difference (a column was added or retyped, a table is newly
  published or was renamed): the batch fails with ``SchemaChanged``; a restarted query reads the
  new schema and the batch again;
* the catalog does not (the column or table was dropped again since): what differs is ignored
  (extra columns are left out, rows of a table the query does not have are dropped); columns
  the query has but the message lacks read null.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from pgcdc.protocol.messages import Relation
from pgcdc.spark.catalog import CatalogTable, SourceCatalog

__all__ = ["Verdict", "find_table", "judge", "mismatch", "normalize"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with rows described by a mismatching Relation message."""

    table: str  # schema.table as the stream names it
    changed: str | None  # the confirmed change (raise SchemaChanged), None to ignore


def normalize(relation: Relation) -> Relation:
    """The relation as sent outside a streamed block (no xid), to compare and look up."""
    return relation if relation.xid is None else dataclasses.replace(relation, xid=None)


def find_table(relation: Relation, tables: Mapping[int, CatalogTable]) -> CatalogTable | None:
    """The query's table for a Relation: by OID, else by name."""
    table = tables.get(relation.relation_id)
    if table is not None:
        return table
    for candidate in tables.values():
        if candidate.schema == relation.namespace and candidate.name == relation.name:
            return candidate
    return None


def mismatch(relation: Relation, table: CatalogTable | None) -> bool:
    """Whether the Relation describes something the query's table does not match."""
    if table is None:
        return True
    if (table.schema, table.name) != (relation.namespace, relation.name):
        return True
    for column in relation.columns:
        known = table.column(column.name)
        if known is None:
            return True
        if known.type_oid != column.type_id or known.type_modifier != column.type_modifier:
            return True
        if known.key != bool(column.flags & 1):  # the replica identity moved
            return True
    return False


def _type_text(table: CatalogTable | None, name: str, type_id: int) -> str:
    column = table.column(name) if table is not None else None
    return column.type_name if column is not None else f"type OID {type_id}"


def judge(relation: Relation, table: CatalogTable | None, current: CatalogTable | None) -> Verdict:
    """The verdict for a mismatching Relation, given the query's table and the current one."""
    name = f"{relation.namespace}.{relation.name}"
    confirmed = current is not None and (current.schema, current.name) == (
        relation.namespace,
        relation.name,
    )
    if table is None:
        if confirmed:
            assert current is not None
            columns = ", ".join(f"{c.name} {c.type_name}" for c in current.columns)
            return Verdict(name, f"the table is now published ({columns}), the query lacks it")
        return Verdict(name, None)
    if (table.schema, table.name) != (relation.namespace, relation.name):
        if confirmed:
            return Verdict(name, f"renamed from {table.qualified}")
        return Verdict(name, None)
    changes = []
    keys = [c.name for c in relation.columns if c.flags & 1]
    if (
        current is not None
        and [c.name for c in table.columns if c.key] != keys
        and [c.name for c in current.columns if c.key] == keys
    ):
        changes.append(f"replica identity now ({', '.join(keys)})")
    for column in relation.columns:
        known = table.column(column.name)
        now = current.column(column.name) if current is not None else None
        if known is None:
            if now is not None:
                changes.append(f"column {column.name!r} added ({now.type_name})")
            continue
        retyped = known.type_oid != column.type_id or known.type_modifier != column.type_modifier
        if (
            retyped
            and now is not None
            and now.type_oid == column.type_id
            and now.type_modifier == column.type_modifier
        ):
            changes.append(
                f"column {column.name!r} retyped from {known.type_name} to {now.type_name}"
            )
    return Verdict(name, "; ".join(changes) if changes else None)


def relations_by_oid(catalog: SourceCatalog) -> dict[int, CatalogTable]:
    return {table.relid: table for table in catalog.tables}
