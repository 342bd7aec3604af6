"""What the source reads from PostgreSQL's catalog: the published tables, their columns, types.

``load_catalog`` runs when a DataFrame is defined (``DataSource.schema()``): it finds the tables
of the publications (or the tables named in the options), each with its published columns in
``attnum`` order (type OID, type modifier, ``format_type`` text, replica identity key flag), the
row filter that applies to its initial copy, and the user-defined types those columns use (for
the ``TypeRegistry`` of the decoders). The result, a ``SourceCatalog``, is a frozen, picklable
value: Spark ships it, inside the data source object, to the worker that runs the stream's
driver-side methods and to every executor.

``current_table`` re-reads one relation when the stream's definition of it differs from the
catalog the query started with, to tell a real schema change from a change since undone.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgcdc.protocol.filter_sql import RowFilterSQL
from pgcdc.protocol.values import TypeInfo, fetch_types
from pgcdc.spark.errors import OptionError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CatalogColumn",
    "CatalogTable",
    "SourceCatalog",
    "current_table",
    "load_catalog",
    "relation_scope",
]

log = logging.getLogger("pgcdc.spark")


@dataclass(frozen=True, slots=True)
class CatalogColumn:
    """One published column."""

    name: str
    type_oid: int
    type_modifier: int
    type_name: str  # format_type(atttypid, atttypmod)
    ndims: int
    key: bool  # flagged as part of the replica identity in Relation messages
    #: the value rows written before the column was added read (``ADD COLUMN ... DEFAULT
    #: <constant>``: ``pg_attribute.attmissingval``), in the type's text form; None: NULL
    missing: str | None = None
    #: read as the text its type's output function prints (option ``textColumns``), whatever
    #: the type: for values no typed column holds (NaN in numeric(p,s), 2-D arrays, 24:00)
    as_text: bool = False
    #: pg_attribute.attnum when the catalog was read (0: not known)
    attnum: int = 0


@dataclass(frozen=True, slots=True)
class CatalogTable:
    """One published table (a partition root when the publication publishes via the root)."""

    relid: int
    schema: str
    name: str
    replica_identity: str  # relreplident: d, n, f, i
    columns: tuple[CatalogColumn, ...]
    # for the initial copy: the OR of the filters that apply, as pgcdc.filters printed them
    row_filter: RowFilterSQL | None = None
    pages: int = 0  # pg_relation_size / block size when loaded (snapshot planning)
    size_bytes: int = 0
    relkind: str = "r"  # 'r' table, 'p' partitioned table (published via its root)
    #: (former name, name) of columns renamed since the query's changes began (option
    #: ``renamedColumns``), oldest first: a Relation from before a rename names the former
    renamed: tuple[tuple[str, str], ...] = ()

    @property
    def qualified(self) -> str:
        """``schema.table`` as the source writes it into ``_table_id``."""
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> CatalogColumn | None:
        for column in self.columns:
            if column.name == name:
                return column
        return None

    def current_name(self, name: str) -> str:
        """The name of the column a Relation calls ``name``: its name now when ``name`` is a
        former name of it (renames followed in order), else ``name``."""
        for former, now in self.renamed:
            if name == former and self.column(name) is None:
                name = now
        return name


@dataclass(frozen=True, slots=True)
class SourceCatalog:
    """The tables of one source, and the user types their columns use."""

    tables: tuple[CatalogTable, ...]
    types: tuple[TypeInfo, ...]
    server_version: int
    publications: tuple[str, ...] = ()
    database: str = ""
    block_size: int = 8192
    #: published tables the query leaves out (option ``skipTables``)
    skipped: tuple[CatalogTable, ...] = ()

    def table(self, schema: str, name: str) -> CatalogTable | None:
        for table in self.tables:
            if table.schema == schema and table.name == name:
                return table
        return None

    def without(self, names: Collection[tuple[str, str]]) -> SourceCatalog:
        """The catalog with the tables of ``names`` (schema, table) left out and noted as
        skipped; names it does not have are ignored (a table no longer published, say)."""
        wanted = set(names)
        if not wanted:
            return self
        gone = [t for t in self.tables if (t.schema, t.name) in wanted]
        return dataclasses.replace(
            self,
            tables=tuple(t for t in self.tables if (t.schema, t.name) not in wanted),
            skipped=self.skipped + tuple(gone),
        )

    def skips(self, relid: int, schema: str, name: str) -> bool:
        """Whether the query leaves out the rows of this relation (by OID or by name)."""
        return any(t.relid == relid or (t.schema, t.name) == (schema, name) for t in self.skipped)


def _connect(dsn: str, connect_timeout: float) -> psycopg.Connection[Any]:
    """A SQL connection (the replication layer, imported here: the executors' Python workers
    import this module for its dataclasses, and need neither psycopg nor psycopg2)."""
    from pgcdc.replication.database import connect_sql

    return connect_sql(dsn, connect_timeout=connect_timeout)


def _check_server(conn: psycopg.Connection[Any]) -> tuple[int, str, int]:
    from pgcdc.replication import source_catalog  # on the driver only: see ``_connect``

    facts = source_catalog.server_facts(conn)
    if facts.encoding.upper() not in ("UTF8", "SQL_ASCII"):
        raise OptionError(
            f"database {conn.info.dbname!r} uses encoding {facts.encoding}; the pgcdc Spark "
            "source decodes UTF-8 text only",
            "use a UTF-8 database (CREATE DATABASE ... ENCODING 'UTF8')",
        )
    return facts.version, conn.info.dbname, facts.block_size


def _or_filters(filters: Sequence[RowFilterSQL | None]) -> RowFilterSQL | None:
    """The initial-copy filter of a table published by several publications (tablesync.c):
    none at all if any publication publishes it unfiltered, else the OR of the filters."""
    if not filters or any(f is None for f in filters):
        return None
    return RowFilterSQL.any_of([f for f in filters if f is not None])


def _published_filter(table: str, text: str | None) -> RowFilterSQL | None:
    """A publication's row filter as the server prints it, parsed and printed back by
    ``pgcdc.filters``: the copy query never carries text that was not parsed."""
    if text is None:
        return None
    from pgcdc.filters import RowFilter, RowFilterError  # on the driver only

    try:
        return RowFilter.parse(text).sql()
    except RowFilterError as exc:
        raise OptionError(
            f"the publications' row filter of {table} ({text}) is outside what pgcdc parses, "
            f"and the initial copy only sends SQL pgcdc has parsed: {exc}",
            "publish the table with a filter of columns, constants, operators and built-in "
            "functions (or without one), or read it with the 'tables' option",
        ) from None


def _mark_text_columns(
    tables: list[CatalogTable], text_columns: Mapping[tuple[str, str], Collection[str]]
) -> list[CatalogTable]:
    """``tables`` with the columns named in ``text_columns`` marked ``as_text``; names that are
    not a table read or one of its columns are refused."""
    by_name = {(t.schema, t.name): t for t in tables}
    for (schema, name), columns in text_columns.items():
        table = by_name.get((schema, name))
        if table is None:
            raise OptionError(
                f"textColumns names table {schema}.{name}, which is not one of the tables read",
                "fix the table name (schema.table, case-sensitive) in textColumns",
            )
        unknown = sorted(set(columns) - {c.name for c in table.columns})
        if unknown:
            raise OptionError(
                f"textColumns names column(s) {', '.join(repr(c) for c in unknown)} of "
                f"{schema}.{name}, which it does not have (or does not publish)",
                "fix the column names (case-sensitive) in textColumns",
            )
        by_name[(schema, name)] = dataclasses.replace(
            table,
            columns=tuple(
                dataclasses.replace(c, as_text=True) if c.name in columns else c
                for c in table.columns
            ),
        )
    return [by_name[(t.schema, t.name)] for t in tables]


def load_catalog(
    dsn: str,
    *,
    publications: Sequence[str] = (),
    tables: Sequence[tuple[str, str]] = (),
    extra_filters: dict[tuple[str, str], list[RowFilterSQL]] | None = None,
    text_columns: Mapping[tuple[str, str], Collection[str]] | None = None,
    connect_timeout: float = 10.0,
) -> SourceCatalog:
    """The tables of ``publications`` (their published columns and combined row filters), or the
    named ``tables`` (all their columns), plus the user types they use.

    ``extra_filters`` adds row filters per table, OR-combined with the publications' ones as if
    each came from one more publication. ``text_columns`` names, per table, the columns read as
    their type's text (``CatalogColumn.as_text``).
    """
    if not publications and not tables:
        raise OptionError(
            "the pgcdc source needs the tables to read",
            "set the option 'publications' (stream and snapshot) or 'tables' (snapshot)",
        )
    import psycopg  # on the driver only: see ``_connect``

    from pgcdc.replication import source_catalog

    extra = extra_filters or {}
    conn = _connect(dsn, connect_timeout)
    try:
        version, database, block_size = _check_server(conn)
        wanted: dict[tuple[str, str], tuple[set[str] | None, list[RowFilterSQL | None]]] = {}
        if publications:
            found = source_catalog.existing_publications(conn, publications)
            missing = [p for p in publications if p not in found]
            if missing:
                raise OptionError(
                    f"publication(s) {', '.join(repr(m) for m in missing)} do not exist in "
                    f"database {database!r}",
                    "create them (pgcdc.replication.create_publication) or fix the "
                    "'publications' option",
                )
            for schema, name, attnames, rowfilter in source_catalog.published_tables(
                conn, publications, version
            ):
                columns, filters = wanted.setdefault((schema, name), (set(), []))
                if attnames is None:
                    wanted[(schema, name)] = (None, filters)
                elif columns is not None:
                    columns.update(attnames)
                filters.append(_published_filter(f"{schema}.{name}", rowfilter))
        for schema, name in tables:
            if (schema, name) not in wanted:
                wanted[(schema, name)] = (None, [])
            elif publications:
                raise OptionError(
                    f"table {schema}.{name} is named in 'tables' and also published",
                    "use either 'publications' or 'tables'",
                )
        keys = sorted(wanted)
        relations = {(r.schema, r.name): r for r in source_catalog.relations_named(conn, keys)}
        unknown = [f"{s}.{n}" for s, n in keys if (s, n) not in relations]
        if unknown:
            raise OptionError(
                f"table(s) {', '.join(unknown)} do not exist in database {database!r}",
                "fix the table names (schema.table, case-sensitive)",
            )
        for (schema, name), spec in extra.items():
            if (schema, name) not in wanted:
                # rowFilter.<table> option keys arrive lower-cased: match case-insensitively
                matches = [
                    k
                    for k in wanted
                    if (k[0].lower(), k[1].lower()) == (schema.lower(), name.lower())
                ]
                if len(matches) == 1:
                    wanted[matches[0]][1].extend(spec)
                    continue
                raise OptionError(
                    f"a row filter is given for {schema}.{name}, which is not (exactly) one of "
                    "the tables read",
                    "fix the table name of the rowFilter option; for names that differ only in "
                    'case use the option rowFilters={"Schema.Table": "..."}',
                )
            wanted[(schema, name)][1].extend(spec)
        relids = [relations[k].relid for k in keys]
        names_by_id = {row.relid: k for k, row in relations.items()}
        by_rel: dict[int, list[CatalogColumn]] = {r: [] for r in relids}
        missing_values = (
            source_catalog.missing_value_texts(conn, relids) if version >= 110000 else {}
        )
        for (
            relid,
            attname,
            typid,
            typmod,
            ndims,
            typname,
            key,
            generated,
            attnum,
        ) in source_catalog.read_columns(conn, relids):
            published = wanted[names_by_id[relid]][0]
            if published is not None:
                if attname not in published:
                    continue
            elif generated:
                continue  # generated columns are published only when listed (or PG 18 option)
            by_rel[int(relid)].append(
                CatalogColumn(
                    str(attname),
                    int(typid),
                    int(typmod),
                    str(typname),
                    int(ndims),
                    bool(key),
                    missing_values.get((int(relid), str(attname))),
                    attnum=int(attnum),
                )
            )
        result: list[CatalogTable] = []
        for table_key in keys:
            relid, schema, name, replident, kind, size = relations[table_key]
            size = int(size or 0)
            filters = wanted[table_key][1]
            result.append(
                CatalogTable(
                    relid=int(relid),
                    schema=schema,
                    name=name,
                    replica_identity=replident,
                    columns=tuple(by_rel[int(relid)]),
                    row_filter=_or_filters(filters),
                    pages=-(-int(size or 0) // block_size),
                    size_bytes=int(size or 0),
                    relkind=str(kind),
                )
            )
        result = _mark_text_columns(result, text_columns or {})
        types = _user_types(conn, result)
    except psycopg.Error as exc:
        raise OptionError(
            f"could not read the catalog of {conn.info.dbname!r}: {exc}",
            "check the connection string's privileges (the role needs to read pg_catalog and "
            "the tables)",
        ) from None
    finally:
        conn.close()
    log.info(
        "catalog of %s: %d tables (%d columns), %d user types",
        database,
        len(result),
        sum(len(t.columns) for t in result),
        len(types),
    )
    return SourceCatalog(
        tables=tuple(result),
        types=types,
        server_version=version,
        publications=tuple(publications),
        database=database,
        block_size=block_size,
    )


def _user_types(
    conn: psycopg.Connection[Any], tables: Iterable[CatalogTable]
) -> tuple[TypeInfo, ...]:
    """The user types (oid >= 10000) the columns use, with their element and base types."""
    wanted = {c.type_oid for t in tables for c in t.columns if c.type_oid >= 10000}
    if not wanted:
        return ()
    every = {info.oid: info for info in fetch_types(conn)}
    keep: dict[int, TypeInfo] = {}
    todo = list(wanted)
    while todo:
        oid = todo.pop()
        info = every.get(oid)
        if info is None or oid in keep:
            continue
        keep[oid] = info
        todo.extend(o for o in (info.element_oid, info.base_oid) if o >= 10000)
    return tuple(sorted(keep.values(), key=lambda t: t.oid))


def current_table(
    dsn: str, relid: int, publications: Sequence[str], *, connect_timeout: float = 10.0
) -> CatalogTable | None:
    """The relation's current published definition, or None if it is not published any more."""
    from pgcdc.replication import source_catalog  # on the driver only: see ``_connect``

    conn = _connect(dsn, connect_timeout)
    try:
        name = source_catalog.relation_name(conn, relid)
    finally:
        conn.close()
    if name is None:
        return None
    catalog = load_catalog(dsn, publications=publications, connect_timeout=connect_timeout)
    for table in catalog.tables:
        if table.relid == relid:
            return table
    return None


def relation_scope(relkind: str) -> psycopg.sql.SQL:
    """``ONLY`` for a plain table, as PostgreSQL's tablesync copies it: an inheritance child's
    rows are its own table's (the stream sends their changes under the child). A partitioned
    table published via its root reads its partitions."""
    from psycopg import sql

    return sql.SQL("ONLY ") if relkind == "r" else sql.SQL("")
