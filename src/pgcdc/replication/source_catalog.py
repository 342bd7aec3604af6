"""What pgcdc reads of a source database's system catalogs: every query of its tables, columns,
keys, types' missing values and privileges, in one place, each returning plain typed rows.

The Spark source's catalog (``pgcdc.spark.catalog``), the pipeline's plan and column checks
(``pgcdc.lake.catalog``) and its start (``pgcdc.lake.bootstrap``) build their own views from
these rows. Publications and slots are read by their own modules (``publication``, ``slot``);
the initial copy's checks inside its exported snapshot run on the copy's own connection
(``pgcdc.spark.snapshot``). Every function takes an open psycopg 3 connection; names reach the
server as parameters or ``sql.Identifier``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from pgcdc.replication.database import CODEC_OUTPUT_SETTINGS

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "KeyIndex",
    "PublishedRow",
    "ReadColumn",
    "RelationRow",
    "ServerFacts",
    "TableColumn",
    "TableShape",
    "UserTable",
    "current_columns",
    "current_user",
    "existing_publications",
    "key_indexes",
    "missing_value_texts",
    "partition_ancestors",
    "published_tables",
    "read_columns",
    "relation_name",
    "relations_named",
    "replication_role",
    "select_privileges",
    "server_facts",
    "server_identity",
    "table_columns",
    "table_shape",
    "user_tables",
    "written_when_added",
]

# -- the server --------------------------------------------------------------------------------


class ServerFacts(NamedTuple):
    version: int  # server_version_num
    encoding: str
    block_size: int


def server_facts(conn: psycopg.Connection[Any]) -> ServerFacts:
    """The server's version, the database's encoding and the block size."""
    row = conn.execute(
        "SELECT current_setting('server_version_num')::int, "
        "pg_catalog.pg_encoding_to_char(d.encoding), current_setting('block_size')::int "
        "FROM pg_catalog.pg_database d WHERE d.datname = current_database()"
    ).fetchone()
    assert row is not None
    return ServerFacts(int(row[0]), str(row[1]), int(row[2]))


def server_identity(conn: psycopg.Connection[Any]) -> tuple[str, str]:
    """The server's system identifier and the database's name: what a lake mirrors."""
    row = conn.execute(
        "SELECT system_identifier::text, current_database()::text FROM pg_control_system()"
    ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def current_user(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_user::text").fetchone()
    return str(row[0]) if row is not None else "?"


def replication_role(conn: psycopg.Connection[Any]) -> tuple[str, bool] | None:
    """The connecting role and whether it may use replication (REPLICATION or superuser)."""
    row = conn.execute(
        "SELECT current_user::text, rolreplication OR rolsuper FROM pg_catalog.pg_roles "
        "WHERE rolname = current_user"
    ).fetchone()
    return None if row is None else (str(row[0]), bool(row[1]))


def select_privileges(conn: psycopg.Connection[Any], oids: Sequence[int]) -> dict[int, bool]:
    """Per table OID, whether the connecting role may SELECT from it."""
    rows = conn.execute(
        "SELECT o, has_table_privilege(o::oid, 'SELECT') FROM unnest(%s::bigint[]) o",
        (list(oids),),
    ).fetchall()
    return {int(oid): bool(allowed) for oid, allowed in rows}


# -- tables, as the pipeline plans them ------------------------------------------------------


class UserTable(NamedTuple):
    oid: int
    schema: str
    name: str
    relkind: str  # 'r' table, 'p' partitioned table
    replica_identity: str  # relreplident: 'd', 'i', 'f', 'n'
    is_partition: bool


class TableColumn(NamedTuple):
    relid: int
    name: str
    type_oid: int
    typmod: int
    not_null: bool
    generated: bool


class KeyIndex(NamedTuple):
    relid: int
    primary: bool
    replica_identity: bool
    columns: tuple[str, ...]
    #: DEFERRABLE: unique only at commit, not after each statement
    deferrable: bool = False


def user_tables(conn: psycopg.Connection[Any]) -> list[UserTable]:
    """Every ordinary and partitioned table outside the system schemas."""
    rows = conn.execute(
        "SELECT c.oid::bigint, n.nspname::text, c.relname::text, c.relkind::text, "
        "c.relreplident::text, c.relispartition "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "AND n.nspname !~ '^pg_(toast|temp_)'"
    ).fetchall()
    return [UserTable(int(o), s, n, k, i, bool(p)) for o, s, n, k, i, p in rows]


def table_columns(conn: psycopg.Connection[Any], oids: Sequence[int]) -> list[TableColumn]:
    """The live columns of the tables, in each table's order."""
    rows = conn.execute(
        "SELECT a.attrelid::bigint, a.attname::text, a.atttypid::bigint, a.atttypmod, "
        "a.attnotnull, a.attgenerated::text "
        "FROM pg_catalog.pg_attribute a "
        "WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attrelid, a.attnum",
        (list(oids),),
    ).fetchall()
    return [TableColumn(int(r), n, int(t), int(m), bool(nn), bool(g)) for r, n, t, m, nn, g in rows]


def key_indexes(conn: psycopg.Connection[Any], oids: Sequence[int]) -> list[KeyIndex]:
    """The primary key and replica identity indexes of the tables, with their columns."""
    rows = conn.execute(
        "SELECT i.indrelid::bigint, i.indisprimary, i.indisreplident, "
        "ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord) "
        "      JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid "
        "      AND a.attnum = k.attnum ORDER BY k.ord), NOT i.indimmediate "
        "FROM pg_catalog.pg_index i "
        "WHERE i.indrelid = ANY(%s::oid[]) AND (i.indisprimary OR i.indisreplident)",
        (list(oids),),
    ).fetchall()
    return [KeyIndex(int(r), bool(p), bool(i), tuple(n), bool(d)) for r, p, i, n, d in rows]


def partition_ancestors(conn: psycopg.Connection[Any], oid: int) -> list[tuple[str, str]]:
    """The (schema, name) of the partitioned tables above a partition, nearest first."""
    rows = conn.execute(
        "SELECT n.nspname::text, c.relname::text "
        "FROM pg_catalog.pg_partition_ancestors(%s::oid) a "
        "JOIN pg_catalog.pg_class c ON c.oid = a.relid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE a.relid <> %s::oid",
        (oid, oid),
    ).fetchall()
    return [(str(s), str(n)) for s, n in rows]


def current_columns(conn: psycopg.Connection[Any], schema: str, name: str) -> dict[str, int]:
    """The table's current columns that are not generated, in order, with their attnum (a
    column dropped and added again under its name gets a new one)."""
    from psycopg import sql

    rows = conn.execute(
        "SELECT a.attname::text, a.attnum::int FROM pg_catalog.pg_attribute a "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "AND a.attgenerated = '' ORDER BY a.attnum",
        (sql.Identifier(schema, name).as_string(conn),),
    ).fetchall()
    return {str(n): int(k) for n, k in rows}


class TableShape(NamedTuple):
    """What a table is, beyond its name: the lake follows it while these stay (``oid``: a
    table dropped and created again under its name has another; ``columns``: name ->
    (attnum, type OID, typmod) of the columns that are not generated)."""

    oid: int
    columns: dict[str, tuple[int, int, int]]


def table_shape(conn: psycopg.Connection[Any], schema: str, name: str) -> TableShape | None:
    """The table's shape now; None when no table has the name (renamed or dropped)."""
    rows = conn.execute(
        "SELECT c.oid::int8, a.attname::text, a.attnum::int, a.atttypid::int8, a.atttypmod "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
        "AND NOT a.attisdropped AND a.attgenerated = '' "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p') ORDER BY a.attnum",
        (schema, name),
    ).fetchall()
    if not rows:
        return None
    columns = {str(a): (int(k), int(t), int(m)) for _, a, k, t, m in rows if a is not None}
    return TableShape(int(rows[0][0]), columns)


def written_when_added(conn: psycopg.Connection[Any], schema: str, name: str, column: str) -> bool:
    """Whether the transaction that added ``column`` (or last set its default) also wrote rows of
    the table that are still there: an ``ADD COLUMN`` whose default is computed row by row (a
    volatile function, serial, identity, a domain with constraints) rewrites the table in that
    transaction, and logical decoding sends none of the rows it wrote. A column added without
    a default, or given one later, has no such rows. Reads the table (until the first such row:
    after a rewrite, at once)."""
    from psycopg import sql

    # no parameters beside the identifier: psycopg would read a '%' in the table's name as one
    rel = sql.Literal(sql.Identifier(schema, name).as_string(conn))
    row = conn.execute(
        sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM {table} t WHERE t.xmin IN ("
            " SELECT a.xmin FROM pg_catalog.pg_attribute a"
            " WHERE a.attrelid = {rel}::regclass AND a.attname = {col}"
            " AND (a.atthasdef OR a.attidentity <> '')"
            " UNION ALL SELECT d.xmin FROM pg_catalog.pg_attrdef d"
            " JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
            " WHERE a.attrelid = {rel}::regclass AND a.attname = {col}))"
        ).format(table=sql.Identifier(schema, name), rel=rel, col=sql.Literal(column))
    ).fetchone()
    return bool(row and row[0])


# -- tables, as the Spark source reads them ----------------------------------------------------


class PublishedRow(NamedTuple):
    schema: str
    name: str
    #: the published columns (None before PostgreSQL 15: all of them)
    columns: list[str] | None
    #: the row filter as the server prints it (None without one, and before 15)
    row_filter: str | None


class RelationRow(NamedTuple):
    relid: int
    schema: str
    name: str
    replica_identity: str
    relkind: str
    size_bytes: int


class ReadColumn(NamedTuple):
    relid: int
    name: str
    type_oid: int
    typmod: int
    ndims: int
    type_name: str
    #: part of the replica identity (every column of a REPLICA IDENTITY FULL table)
    is_key: bool
    generated: bool
    attnum: int


def existing_publications(conn: psycopg.Connection[Any], names: Sequence[str]) -> set[str]:
    """Those of ``names`` that are publications of the database."""
    rows = conn.execute(
        "SELECT pubname::text FROM pg_catalog.pg_publication WHERE pubname = ANY(%s::text[])",
        (list(names),),
    ).fetchall()
    return {str(r[0]) for r in rows}


_PUBLISHED = (
    "SELECT t.schemaname::text, t.tablename::text, t.attnames::text[], t.rowfilter "
    "FROM pg_catalog.pg_publication_tables t WHERE t.pubname = ANY(%s::text[]) ORDER BY 1, 2"
)
_PUBLISHED_BEFORE_15 = (
    "SELECT t.schemaname::text, t.tablename::text, NULL::text[], NULL::text "
    "FROM pg_catalog.pg_publication_tables t WHERE t.pubname = ANY(%s::text[]) ORDER BY 1, 2"
)


def published_tables(
    conn: psycopg.Connection[Any], publications: Sequence[str], server_version: int
) -> list[PublishedRow]:
    """The tables the publications publish, one row per (publication, table)."""
    query = _PUBLISHED if server_version >= 150000 else _PUBLISHED_BEFORE_15
    rows = conn.execute(query, (list(publications),)).fetchall()
    return [PublishedRow(str(s), str(n), a, f) for s, n, a, f in rows]


def relations_named(
    conn: psycopg.Connection[Any], names: Sequence[tuple[str, str]]
) -> list[RelationRow]:
    """The relations of the (schema, name) pairs that exist, with their size on disk."""
    rows = conn.execute(
        "SELECT c.oid::int8, n.nspname::text, c.relname::text, c.relreplident::text, "
        "c.relkind::text, pg_catalog.pg_relation_size(c.oid) "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([s for s, _ in names], [n for _, n in names]),
    ).fetchall()
    return [RelationRow(int(o), s, n, i, k, int(size or 0)) for o, s, n, i, k, size in rows]


def read_columns(conn: psycopg.Connection[Any], relids: Sequence[int]) -> list[ReadColumn]:
    """The live columns of the relations, in each one's order, with what decoding needs."""
    rows = conn.execute(
        "SELECT a.attrelid::int8, a.attname::text, a.atttypid::int8, a.atttypmod, a.attndims, "
        "pg_catalog.format_type(a.atttypid, a.atttypmod), "
        "c.relreplident = 'f' OR COALESCE(a.attnum = ANY(i.indkey::int2[]), false), "
        "a.attgenerated::text, a.attnum::int "
        "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
        # as pgoutput flags them: a deferrable primary key is no replica identity
        "LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND i.indimmediate AND ("
        "  (c.relreplident = 'd' AND i.indisprimary) "
        "  OR (c.relreplident = 'i' AND i.indisreplident)) "
        "WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attrelid, a.attnum",
        (list(relids),),
    ).fetchall()
    return [
        ReadColumn(int(r), str(n), int(t), int(m), int(d), str(tn), bool(k), bool(g), int(a))
        for r, n, t, m, d, tn, k, g, a in rows
    ]


#: The output settings the codec reads a missing value's text with: those of the connections
#: it decodes text from, and bytea in hex
_MISSING_SETTINGS = CODEC_OUTPUT_SETTINGS


def missing_value_texts(
    conn: psycopg.Connection[Any], relids: Sequence[int]
) -> dict[tuple[int, str], str]:
    """(relid, column) -> the text of the value that rows written before the column was added
    read (``attmissingval``; ``array_to_string`` of the one-element array is its element's
    output text, arrays included), under the output settings the codec reads."""
    for name, value in _MISSING_SETTINGS:
        conn.execute("SELECT pg_catalog.set_config(%s, %s, false)", (name, value))
    try:
        rows = conn.execute(
            "SELECT a.attrelid::int8, a.attname::text, "
            "pg_catalog.array_to_string(a.attmissingval, ',') "
            "FROM pg_catalog.pg_attribute a WHERE a.attrelid = ANY(%s::oid[]) "
            "AND a.attnum > 0 AND NOT a.attisdropped AND a.atthasmissing "
            "AND a.attmissingval::text <> '{NULL}'",
            (list(relids),),
        ).fetchall()
        return {(int(r), str(n)): str(text) for r, n, text in rows if text is not None}
    finally:
        conn.execute("RESET ALL")


def relation_name(conn: psycopg.Connection[Any], relid: int) -> tuple[str, str] | None:
    """The (schema, name) of a relation OID, None when there is no such relation."""
    row = conn.execute(
        "SELECT n.nspname::text, c.relname::text FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
        (relid,),
    ).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))
