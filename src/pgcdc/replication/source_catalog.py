"""What pgcdc reads of a source database's system catalogs: every query of its tables, columns,
keys, types' missing values and privileges, in one place, each returning plain typed rows.

The Spark source's catalog (``pgcdc.spark.catalog``), the pipeline's plan and column checks
(``pgcdc.lake.run.catalog``) and its start (``pgcdc.lake.run.bootstrap``) build their own views from
these rows. Publications and slots are read by their own modules (``publication``, ``slot``);
the initial copy's checks inside its exported snapshot run on the copy's own connection
(``pgcdc.spark.snapshot``). Every function takes an open psycopg 3 connection; names reach the
server as parameters or ``sql.Identifier``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

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
    "UnknownValue",
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
    "unknown_missing_value",
    "user_tables",
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


@contextmanager
def _codec_output(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The session under ``_MISSING_SETTINGS`` (a default's printed constants and the values'
    text are read under them), reset afterwards."""
    for name, value in _MISSING_SETTINGS:
        conn.execute("SELECT pg_catalog.set_config(%s, %s, false)", (name, value))
    try:
        yield
    finally:
        conn.execute("RESET ALL")


def missing_value_texts(
    conn: psycopg.Connection[Any], relids: Sequence[int]
) -> dict[tuple[int, str], str]:
    """(relid, column) -> the text of the value that rows written before the column was added
    read (``attmissingval``; ``array_to_string`` of the one-element array is its element's
    output text, arrays included), under the output settings the codec reads. A column whose
    value a table rewrite wrote into the rows and removed from the catalog has its constant
    default's (see ``unknown_missing_value``)."""
    with _codec_output(conn):
        rows = conn.execute(
            "SELECT a.attrelid::int8, a.attname::text, "
            "pg_catalog.array_to_string(a.attmissingval, ',') "
            "FROM pg_catalog.pg_attribute a WHERE a.attrelid = ANY(%s::oid[]) "
            "AND a.attnum > 0 AND NOT a.attisdropped AND a.atthasmissing "
            "AND a.attmissingval::text <> '{NULL}'",
            (list(relids),),
        ).fetchall()
        texts = {(int(r), str(n)): str(text) for r, n, text in rows if text is not None}
        for default in _defaults_without_missing(conn, relids):
            if _written_into_rows(default):
                text = _constant_text(conn, default)
                if text is not None:
                    texts[(default.relid, default.name)] = text
        return texts


class UnknownValue(NamedTuple):
    """Why the value that rows written before a column was added read is not in the catalog
    any more, and the column's default as PostgreSQL prints it (None: an identity)."""

    #: the ``ADD COLUMN`` computed its default row by row, rewriting the table; a table rewrite
    #: removed the value the default gave them once, and that default is not a constant; an
    #: ``ALTER COLUMN ... TYPE`` stored the default again as it rewrote the table, so whether
    #: the rows read it or NULL is not told
    reason: Literal["row by row", "computed once", "stored again"]
    default: str | None


class _Default(NamedTuple):
    """A column without a missing value (``attmissingval``) that has a default or is an
    identity, with the catalog facts that tell what the rows written before it was added read
    (see ``unknown_missing_value``)."""

    relid: int
    schema: str
    table: str
    name: str
    type_oid: int
    typmod: int
    identity: bool
    #: the default as PostgreSQL prints it (None: an identity without one)
    expression: str | None
    #: computed row by row by an ``ADD COLUMN``: a volatile function (``nextval`` of serial
    #: too), or the column's type a domain with constraints
    row_by_row: bool
    #: the table's heap is newer than the default: its relfilenode, an OID, was allocated after
    #: the default's OID, by a rewrite (or a TRUNCATE) after the default was stored (OIDs
    #: come from one counter; after it wraps around, at 2^32, a newer heap can read older)
    rewritten_since: bool
    #: the transactions that last wrote the column's, the table's and the default's catalog rows
    column_xmin: str
    table_xmin: str
    default_xmin: str | None


_DEFAULTS_SQL = (
    "SELECT c.oid::int8, n.nspname::text, c.relname::text, a.attname::text, a.atttypid::int8, "
    "a.atttypmod, a.attidentity <> '', pg_catalog.pg_get_expr(d.adbin, d.adrelid), "
    " EXISTS (SELECT 1 FROM pg_catalog.regexp_matches(d.adbin::text, "
    "  ':(?:funcid|opfuncid) ([0-9]+)', 'g') f "
    "  JOIN pg_catalog.pg_proc p ON p.oid = f[1]::oid WHERE p.provolatile = 'v') "
    " OR EXISTS (WITH RECURSIVE base(oid) AS (SELECT a.atttypid UNION "
    "  SELECT t.typbasetype FROM pg_catalog.pg_type t JOIN base b ON t.oid = b.oid "
    "  WHERE t.typtype = 'd') "
    "  SELECT 1 FROM base b JOIN pg_catalog.pg_type t ON t.oid = b.oid WHERE t.typtype = 'd' "
    "  AND (t.typnotnull OR EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k "
    "  WHERE k.contypid = t.oid))), "
    "COALESCE(c.relfilenode::int8 > d.oid::int8, false), "
    "a.xmin::text, c.xmin::text, d.xmin::text "
    "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    "WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped "
    "AND a.attgenerated = '' AND NOT a.atthasmissing AND (a.atthasdef OR a.attidentity <> '') "
    "AND (%s::text IS NULL OR a.attname = %s::text) ORDER BY a.attrelid, a.attnum"
)


def _defaults_without_missing(
    conn: psycopg.Connection[Any], relids: Sequence[int], column: str | None = None
) -> list[_Default]:
    rows = conn.execute(_DEFAULTS_SQL, (list(relids), column, column)).fetchall()
    return [
        _Default(int(r), s, t, a, int(ty), int(m), bool(i), e, bool(v), bool(w), xa, xc, xd)
        for r, s, t, a, ty, m, i, e, v, w, xa, xc, xd in rows
    ]


def _written_into_rows(default: _Default) -> bool:
    """Whether a table rewrite (``VACUUM FULL``, ``CLUSTER``, an ``ALTER TABLE`` that rewrites)
    wrote the column's missing value into the rows and removed it from the catalog, the value
    being its default: a default computed once (not row by row), the table rewritten since it
    was stored, and the column's catalog row written since too (a rewrite clears
    ``attmissingval`` there; a default set later by ``SET DEFAULT`` writes both rows at once,
    and gave the rows written before nothing). The catalog keeps no history: a default
    changed before the rewrite, or a later change of the column's row (``SET NOT NULL``) after
    a ``SET DEFAULT``, reads the same."""
    return (
        default.expression is not None
        and not default.identity
        and not default.row_by_row
        and default.rewritten_since
        and default.column_xmin != default.default_xmin
    )


#: A default PostgreSQL prints as one constant: a bare number or boolean, or a quoted literal
#: with its type (a constant of the column's type, or a number given to a numeric column)
_BARE = re.compile(r"[0-9]+(?:\.[0-9]+)?|true|false")
_QUOTED = re.compile(r"'((?:[^']|'')*)'::(.+)", re.DOTALL)
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_NUMBER_TYPES = frozenset({"integer", "bigint", "numeric"})

_TYPE_NAMES_SQL = (
    "WITH RECURSIVE base(oid, typmod) AS (SELECT %s::oid, %s::int UNION "
    " SELECT t.typbasetype, t.typtypmod FROM pg_catalog.pg_type t JOIN base b ON t.oid = b.oid "
    " WHERE t.typtype = 'd') "
    "SELECT pg_catalog.format_type(oid, NULL) FROM base "
    "UNION SELECT pg_catalog.format_type(oid, -1) FROM base "
    "UNION SELECT pg_catalog.format_type(oid, typmod) FROM base"
)


def _constant_text(conn: psycopg.Connection[Any], default: _Default) -> str | None:
    """The text of the column's value when its default is one constant, read as the column's
    type reads it (a char(n) padded, a numeric rounded to its scale), under the codec's output
    settings; None when the default is anything else (an expression, a function such as
    ``now()``), or its constant does not read as the column's type."""
    import psycopg
    from psycopg import sql

    expression = (default.expression or "").strip()
    quoted = _QUOTED.fullmatch(expression)
    if quoted is not None:
        text, type_name = quoted.group(1).replace("''", "'"), quoted.group(2)
        names = {
            str(n) for (n,) in conn.execute(_TYPE_NAMES_SQL, (default.type_oid, default.typmod))
        }
        if type_name not in names and not (type_name in _NUMBER_TYPES and _NUMBER.fullmatch(text)):
            return None
    elif _BARE.fullmatch(expression):
        text = expression
    else:
        return None
    # the column's own input function, with its typmod and domain, reads the constant, and its
    # output function prints it (format's %s; a cast to text is not always that: a boolean's
    # reads 'true', a char(n)'s loses its padding); the text reaches the server as a literal,
    # the names as identifiers
    query = sql.SQL(
        "SELECT pg_catalog.format('%s', (pg_catalog.json_populate_record(NULL::{table}, "
        "pg_catalog.json_build_object({key}::text, {text}::text))).{column})"
    ).format(
        table=sql.Identifier(default.schema, default.table),
        key=sql.Literal(default.name),
        text=sql.Literal(text),
        column=sql.Identifier(default.name),
    )
    try:
        with conn.transaction():
            row = conn.execute(query).fetchone()
    except psycopg.Error:
        return None
    return None if row is None or row[0] is None else str(row[0])


def _written_by(conn: psycopg.Connection[Any], default: _Default, xid: str | None) -> bool:
    """Whether rows of the table written by transaction ``xid`` are still there (reads the
    table until the first one)."""
    from psycopg import sql

    if xid is None:
        return False
    # no parameters: psycopg would read a '%' in the table's name as one
    row = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} t WHERE t.xmin = {}::xid)").format(
            sql.Identifier(default.schema, default.table), sql.Literal(xid)
        )
    ).fetchone()
    return bool(row and row[0])


def unknown_missing_value(
    conn: psycopg.Connection[Any], relid: int, column: str
) -> UnknownValue | None:
    """Why the value rows written before ``column`` was added read cannot be told, when
    PostgreSQL keeps none for them (no ``attmissingval``); None when it can: NULL, or the
    constant ``missing_value_texts`` gives.

    * An ``ADD COLUMN`` whose default is computed row by row (a volatile function, serial, an
      identity, a domain with constraints) rewrites the table in its transaction, and logical
      decoding sends none of the rows it wrote: rows written by the transaction that stored
      the default (the identity's column) are still there ("row by row"). Without such rows
      the default was set later (``SET DEFAULT``): the rows read NULL.
    * A default computed once (a constant, ``now()``) is kept in ``attmissingval``, which a
      later table rewrite writes into the rows and clears (``_written_into_rows``): a constant
      is followed; anything else was computed when the column was added and is lost
      ("computed once").
    * ``ALTER COLUMN ... TYPE`` stores the column's default again in the transaction that
      rewrites the table: the catalog then tells neither when the default was given nor
      whether a value was kept ("stored again").

    Reads the table (until the first row the transaction wrote) only for the first and last.
    """
    with _codec_output(conn):
        found = _defaults_without_missing(conn, [relid], column)
        if not found:
            return None
        (default,) = found
        if default.identity or default.row_by_row:
            xid = default.column_xmin if default.expression is None else default.default_xmin
            return (
                UnknownValue("row by row", default.expression)
                if _written_by(conn, default, xid)
                else None
            )
        if _written_into_rows(default):
            if _constant_text(conn, default) is None:
                return UnknownValue("computed once", default.expression)
            return None
        if (
            default.rewritten_since
            and default.column_xmin == default.default_xmin == default.table_xmin
            and _written_by(conn, default, default.default_xmin)
        ):
            return UnknownValue("stored again", default.expression)
        return None


def relation_name(conn: psycopg.Connection[Any], relid: int) -> tuple[str, str] | None:
    """The (schema, name) of a relation OID, None when there is no such relation."""
    row = conn.execute(
        "SELECT n.nspname::text, c.relname::text FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
        (relid,),
    ).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))
