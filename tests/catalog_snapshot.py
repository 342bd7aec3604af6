"""What a database holds, to compare before and after something that must change nothing (or
exactly one publication): relations, namespaces, functions, publications and their tables,
replication slots, roles, and the row count of every ordinary table.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

_QUERIES = {
    "pg_class": "SELECT c.oid::bigint, n.nspname::text, c.relname::text, c.relkind::text "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace",
    "pg_namespace": "SELECT oid::bigint, nspname::text FROM pg_namespace",
    "pg_proc": "SELECT oid::bigint, proname::text FROM pg_proc",
    "pg_publication": "SELECT oid::bigint, pubname::text, puballtables, pubinsert, pubupdate, "
    "pubdelete, pubtruncate FROM pg_publication",
    "pg_publication_rel": "SELECT prpubid::bigint, prrelid::bigint, "
    "pg_get_expr(prqual, prrelid) FROM pg_publication_rel",
    "pg_publication_namespace": "SELECT pnpubid::bigint, pnnspid::bigint "
    "FROM pg_publication_namespace",
    "pg_replication_slots": "SELECT slot_name::text, database::text FROM pg_replication_slots",
    "pg_roles": "SELECT rolname::text, rolsuper FROM pg_roles",
}

Snapshot = dict[str, list[tuple[Any, ...]]]


def catalog_snapshot(conn: psycopg.Connection[Any]) -> Snapshot:
    """The catalog rows of ``_QUERIES`` (sorted) and ``rows:<schema>.<table>`` counts."""
    found: Snapshot = {}
    for name, query in _QUERIES.items():
        found[name] = sorted(conn.execute(query).fetchall(), key=repr)
    tables = conn.execute(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' "
        "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "AND n.nspname !~ '^pg_(toast|temp_)'"
    ).fetchall()
    for schema, table in tables:
        count = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))
        ).fetchone()
        found[f"rows:{schema}.{table}"] = [(count[0] if count else None,)]
    return found


def changes(before: Snapshot, after: Snapshot) -> dict[str, tuple[list[Any], list[Any]]]:
    """Per key, the rows only ``before`` has and the rows only ``after`` has (empty: equal)."""
    out: dict[str, tuple[list[Any], list[Any]]] = {}
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, []), after.get(key, [])
        gone = [r for r in old if r not in new]
        added = [r for r in new if r not in old]
        if gone or added:
            out[key] = (gone, added)
    return out
