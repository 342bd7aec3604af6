"""Publications: which tables (and which rows and columns of them) a slot's stream carries.

``create_publication`` covers the three kinds (a list of tables, ``FOR ALL TABLES``,
``FOR TABLES IN SCHEMA``) and the publish options; ``alter_publication_tables`` adds tables to
a list and drops tables from it. Each listed table may carry a row filter
(``WHERE`` expression) and a column list (PostgreSQL 15+). ``publication_info`` reads back what a
publication covers, with each table's effective columns and row filter.

Every identifier goes through ``psycopg.sql.Identifier``, so names with quotes, spaces and any
Unicode work. A row filter is never text as written: it is a ``RowFilterSQL``, which only
``pgcdc.filters`` makes, by printing its own parse tree back (one expression, identifiers quoted,
constants as literals: ``RowFilter.parse(text).sql()``). The statement is sent with the extended
query protocol, where the server refuses more than one statement whatever the text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import psycopg
from psycopg import sql

from pgcdc.protocol.filter_sql import RowFilterSQL
from pgcdc.replication.database import Connectable, raise_sql_error, server_name, sql_connection
from pgcdc.replication.errors import (
    PublicationExistsError,
    PublicationNotFoundError,
    UnsupportedOptionError,
)

__all__ = [
    "PUBLISH_ALL",
    "PublicationInfo",
    "PublicationTable",
    "PublishOperation",
    "PublishedTable",
    "RowFilterSQL",
    "alter_publication_tables",
    "check_publication_name",
    "create_publication",
    "drop_publication",
    "missing_publications",
    "publication_info",
]

log = logging.getLogger("pgcdc.replication")

PublishOperation: TypeAlias = Literal["insert", "update", "delete", "truncate"]
PUBLISH_ALL: frozenset[PublishOperation] = frozenset(("insert", "update", "delete", "truncate"))
_PUBLISH_ORDER: tuple[PublishOperation, ...] = ("insert", "update", "delete", "truncate")
_PUBLICATION_NAME = re.compile(r"[a-z0-9_]{1,63}")


def check_publication_name(name: str) -> str:
    """``name`` if it is a publication name a configuration may give, else ValueError saying
    why: the rule of slot names (``check_slot_name``), so that the name reads the same bare,
    quoted and in pgoutput's ``publication_names`` list. ``create_publication`` itself takes
    any name (it always quotes)."""
    if not isinstance(name, str) or not _PUBLICATION_NAME.fullmatch(name):
        raise ValueError(
            f"invalid publication name {name!r}: publication names are 1 to 63 characters, "
            "lower-case letters, digits and underscores only"
        )
    return name


@dataclass(frozen=True, slots=True)
class PublicationTable:
    """A table to publish.

    ``schema`` None leaves the name unqualified (resolved through ``search_path``). ``where`` is
    a row filter, a boolean expression over the table's columns as ``pgcdc.filters`` renders it
    (``RowFilter.parse(text).sql()``; PostgreSQL 15+; for UPDATE and DELETE it may only use
    replica identity columns); a ``str`` is refused, so raw text cannot reach the statement.
    ``columns`` restricts the published columns (PostgreSQL 15+; it must include the replica
    identity).
    """

    name: str
    schema: str | None = None
    where: RowFilterSQL | None = None
    columns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a PublicationTable needs a table name")
        given: object = self.columns
        if self.columns is not None:
            if isinstance(given, str):
                raise TypeError(
                    f"columns must be a tuple of column names, not the string {self.columns!r}"
                )
            object.__setattr__(self, "columns", tuple(self.columns))
            if not self.columns:
                raise ValueError(f"empty column list for table {self.name!r}: omit it instead")
        where: object = self.where
        if where is not None and not isinstance(where, RowFilterSQL):
            raise TypeError(
                f"the row filter of table {self.name!r} must be a RowFilterSQL rendered by "
                f"pgcdc.filters (RowFilter.parse(text).sql()), not {type(where).__name__}: "
                "text is never pasted into CREATE PUBLICATION"
            )

    def identifier(self) -> sql.Identifier:
        return (
            sql.Identifier(self.name)
            if self.schema is None
            else sql.Identifier(self.schema, self.name)
        )

    def clause(self) -> sql.Composable:
        parts: list[sql.Composable] = [self.identifier()]
        if self.columns is not None:
            parts.append(
                sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in self.columns))
            )
        if self.where is not None:
            # printed by pgcdc.filters from its parse tree (see RowFilterSQL), not text as given
            parts.append(sql.SQL("WHERE ({})").format(sql.SQL(self.where.text)))
        return sql.SQL(" ").join(parts)


TableSpec: TypeAlias = "PublicationTable | str | tuple[str, str]"


def _table(spec: TableSpec) -> PublicationTable:
    if isinstance(spec, PublicationTable):
        return spec
    if isinstance(spec, str):
        return PublicationTable(spec)
    if isinstance(spec, tuple) and len(spec) == 2:
        return PublicationTable(spec[1], schema=spec[0])
    raise TypeError(
        f"a publication table is a PublicationTable, a table name or a (schema, table) tuple, "
        f"not {spec!r}"
    )


@dataclass(frozen=True, slots=True)
class PublishedTable:
    """A table a publication covers: its published columns and its row filter, if any."""

    schema: str
    name: str
    columns: tuple[str, ...]
    column_list: bool  # whether an explicit column list restricts ``columns``
    row_filter: str | None


@dataclass(frozen=True, slots=True)
class PublicationInfo:
    """What ``pg_publication``, ``pg_publication_tables`` and friends say about a publication."""

    name: str
    all_tables: bool
    publish: frozenset[PublishOperation]
    via_partition_root: bool
    tables: tuple[PublishedTable, ...]  # every table covered, however (list, schema, all)
    listed_tables: tuple[tuple[str, str], ...]  # tables named with FOR TABLE
    schemas: tuple[str, ...]  # FOR TABLES IN SCHEMA
    generated_columns: str | None = None  # 'none' or 'stored' (PostgreSQL 18+)


def create_publication(
    target: Connectable,
    name: str,
    *,
    tables: Sequence[TableSpec] = (),
    schemas: Sequence[str] = (),
    all_tables: bool = False,
    publish: Iterable[PublishOperation] | None = None,
    via_partition_root: bool | None = None,
) -> None:
    """CREATE PUBLICATION for a list of tables and/or schemas, or for all tables.

    ``publish`` (default: all four operations) chooses which operations are published;
    ``via_partition_root`` publishes partitions' changes as their root table's.
    """
    specs = [_table(t) for t in tables]
    schema_list = list(schemas)
    if isinstance(schemas, str):
        raise TypeError(f"schemas must be a sequence of names, not the string {schemas!r}")
    if all_tables and (specs or schema_list):
        raise ValueError("all_tables=True cannot be combined with tables or schemas")
    if not all_tables and not specs and not schema_list:
        raise ValueError(
            "a publication needs tables, schemas or all_tables=True (an empty publication "
            "would publish nothing)"
        )
    ops: list[PublishOperation] | None = None
    if publish is not None:
        if isinstance(publish, str):
            raise TypeError(f"publish must be a collection of operations, not {publish!r}")
        wanted = set(publish)
        unknown = wanted - PUBLISH_ALL
        if unknown:
            raise ValueError(
                f"unknown publish operation(s) {sorted(unknown)}; "
                "choose from insert, update, delete, truncate"
            )
        ops = [op for op in _PUBLISH_ORDER if op in wanted]
    with sql_connection(target) as conn:
        _check_server_takes(conn, specs, bool(schema_list))
        if all_tables:
            what: sql.Composable = sql.SQL("FOR ALL TABLES")
        else:
            objects: list[sql.Composable] = []
            if specs:
                objects.append(
                    sql.SQL("TABLE {}").format(sql.SQL(", ").join(t.clause() for t in specs))
                )
            if schema_list:
                objects.append(
                    sql.SQL("TABLES IN SCHEMA {}").format(
                        sql.SQL(", ").join(sql.Identifier(s) for s in schema_list)
                    )
                )
            what = sql.SQL("FOR {}").format(sql.SQL(", ").join(objects))
        with_options: list[sql.Composable] = []
        if ops is not None:
            with_options.append(sql.SQL("publish = {}").format(sql.Literal(", ".join(ops))))
        if via_partition_root is not None:
            with_options.append(
                sql.SQL("publish_via_partition_root = {}").format(
                    sql.SQL("true" if via_partition_root else "false")
                )
            )
        query = sql.SQL("CREATE PUBLICATION {} {}").format(sql.Identifier(name), what)
        if with_options:
            query = sql.SQL("{} WITH ({})").format(query, sql.SQL(", ").join(with_options))
        try:
            _execute(conn, query)
        except psycopg.errors.DuplicateObject:
            raise PublicationExistsError(
                f"publication {name!r} already exists on {server_name(conn)}",
                "use it as it is, drop it first (drop_publication), or choose another name",
            ) from None
        except psycopg.Error as exc:
            raise_sql_error(exc, conn)
    log.info(
        "created publication %s (%s tables, %s schemas, all_tables=%s)",
        name,
        len(specs),
        len(schema_list),
        all_tables,
    )


def _check_server_takes(
    conn: psycopg.Connection[Any], specs: Sequence[PublicationTable], schemas: bool
) -> None:
    """Refuse what the server's version cannot publish, naming it."""
    major = conn.info.server_version // 10000
    if major < 15 and (schemas or any(t.where is not None or t.columns is not None for t in specs)):
        raise UnsupportedOptionError(
            f"row filters, column lists and TABLES IN SCHEMA need PostgreSQL 15 or later; "
            f"{server_name(conn)} runs {major}",
            "publish whole tables on this server",
        )


def _execute(conn: psycopg.Connection[Any], query: sql.Composed) -> None:
    # binary: the extended query protocol, in which the server runs exactly one statement (a
    # second one is an error, not executed): a second line of defence
    conn.execute(query, binary=True)


def alter_publication_tables(
    target: Connectable,
    name: str,
    *,
    add: Sequence[TableSpec] = (),
    drop: Sequence[TableSpec] = (),
) -> None:
    """``ALTER PUBLICATION ... ADD TABLE`` (each table with its row filter and column list)
    and ``... DROP TABLE``, in one transaction: the publication gains and loses those tables
    together, or nothing changes."""
    adds = [_table(t) for t in add]
    drops = [_table(t) for t in drop]
    if not adds and not drops:
        return
    with sql_connection(target) as conn:
        _check_server_takes(conn, adds, False)
        publication = sql.Identifier(name)
        try:
            with conn.transaction():
                if adds:
                    _execute(
                        conn,
                        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                            publication, sql.SQL(", ").join(t.clause() for t in adds)
                        ),
                    )
                if drops:
                    _execute(
                        conn,
                        sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                            publication, sql.SQL(", ").join(t.identifier() for t in drops)
                        ),
                    )
        except psycopg.errors.UndefinedObject:
            raise PublicationNotFoundError(
                f"publication {name!r} does not exist on {server_name(conn)}",
                "check the name (publication_info)",
            ) from None
        except psycopg.Error as exc:
            raise_sql_error(exc, conn)
    log.info(
        "publication %s: added %s tables, dropped %s",
        name,
        len(adds),
        len(drops),
        extra={"publication": name, "added": len(adds), "dropped": len(drops)},
    )


def drop_publication(target: Connectable, name: str, *, missing_ok: bool = False) -> bool:
    """DROP PUBLICATION; whether there was one to drop."""
    with sql_connection(target) as conn:
        try:
            conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))
        except psycopg.errors.UndefinedObject:
            if missing_ok:
                return False
            raise PublicationNotFoundError(
                f"publication {name!r} does not exist on {server_name(conn)}",
                "check the name (publication_info), or pass missing_ok=True",
            ) from None
        except psycopg.Error as exc:
            raise_sql_error(exc, conn)
    log.info("dropped publication %s", name)
    return True


def missing_publications(target: Connectable, names: Iterable[str]) -> list[str]:
    """Those of ``names`` that are not publications of the database."""
    wanted = list(dict.fromkeys(names))
    with sql_connection(target) as conn:
        try:
            rows = conn.execute(
                "SELECT pubname::text FROM pg_publication WHERE pubname = ANY(%s::text[])",
                (wanted,),
            ).fetchall()
        except psycopg.Error as exc:
            raise_sql_error(exc, conn)
    found = {row[0] for row in rows}
    return [n for n in wanted if n not in found]


_GENCOLS = {"n": "none", "s": "stored"}


def publication_info(target: Connectable, name: str) -> PublicationInfo | None:
    """What the publication covers, or None if there is no such publication."""
    with sql_connection(target) as conn:
        try:
            row = conn.execute(
                "SELECT p.oid, to_jsonb(p) FROM pg_publication p WHERE p.pubname = %s", (name,)
            ).fetchone()
            if row is None:
                return None
            oid, pub = row
            tables = conn.execute(
                "SELECT t.schemaname::text, t.tablename::text, t.attnames::text[], t.rowfilter, "
                "r.prattrs IS NOT NULL "
                "FROM pg_publication_tables t LEFT JOIN ("
                "  SELECT n.nspname, c.relname, pr.prattrs FROM pg_publication_rel pr"
                "  JOIN pg_class c ON c.oid = pr.prrelid"
                "  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE pr.prpubid = %s"
                ") r ON r.nspname = t.schemaname AND r.relname = t.tablename "
                "WHERE t.pubname = %s ORDER BY 1, 2",
                (oid, name),
            ).fetchall()
            listed = conn.execute(
                "SELECT n.nspname::text, c.relname::text FROM pg_publication_rel pr "
                "JOIN pg_class c ON c.oid = pr.prrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE pr.prpubid = %s ORDER BY 1, 2",
                (oid,),
            ).fetchall()
            schemas = conn.execute(
                "SELECT n.nspname::text FROM pg_publication_namespace pn "
                "JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE pn.pnpubid = %s ORDER BY 1",
                (oid,),
            ).fetchall()
        except psycopg.Error as exc:
            raise_sql_error(exc, conn)
    publish = frozenset(op for op in _PUBLISH_ORDER if pub.get(f"pub{op}"))
    return PublicationInfo(
        name=name,
        all_tables=bool(pub["puballtables"]),
        publish=publish,
        via_partition_root=bool(pub.get("pubviaroot")),
        tables=tuple(
            PublishedTable(
                schema=schema,
                name=table,
                columns=tuple(attnames or ()),
                column_list=bool(has_list),
                row_filter=rowfilter,
            )
            for schema, table, attnames, rowfilter, has_list in tables
        ),
        listed_tables=tuple((schema, table) for schema, table in listed),
        schemas=tuple(s for (s,) in schemas),
        generated_columns=_GENCOLS.get(pub.get("pubgencols") or "", pub.get("pubgencols")),
    )
