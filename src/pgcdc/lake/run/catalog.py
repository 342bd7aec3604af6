"""What the source database says about the configured tables, checked before anything is created.

``plan_source`` resolves the ``[[tables]]`` names and patterns against the catalog, finds each
table's key (primary key, replica identity index, or every column under REPLICA IDENTITY FULL),
and tries the publication in a transaction that is always rolled back, so the server itself
validates every row filter and reports exactly which tables the publication will publish (with
``publish_via_partition_root`` that is the root, else the partitions) and their filters as it
prints them. Row filters are also checked against the replica identity with
``pgcdc.filters`` (PostgreSQL only checks that when an UPDATE or DELETE runs, so a bad filter
would make the source's own writes fail). Every problem is a ``ConfigError`` naming the key.

``plan_source`` leaves nothing behind, whatever the configuration says: all of it runs in one
transaction that is always rolled back (the dry runs are savepoints inside it), each filter
reaches the server only as ``pgcdc.filters`` prints it back from its parse tree (one
expression), and CREATE PUBLICATION goes through the extended protocol, which runs one
statement. The filters the server prints for the publication are parsed and printed back the
same way before any query uses them.

``ensure_publication`` then creates the publication for real (first start), or makes the
publication pgcdc created publish the tables the configuration adds or removes since
(``plan_source(..., managed=True)``: ``ALTER PUBLICATION ... ADD TABLE`` / ``DROP TABLE``).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgcdc.filters import ReplicaIdentityError, RowFilter, RowFilterError
from pgcdc.lake.config import ConfigError, PipelineConfig, TableSettings
from pgcdc.lake.store.tables import LakeTable, case_clashes, reserved_column
from pgcdc.protocol.messages import Column, Relation
from pgcdc.replication import (
    PublicationInfo,
    PublicationTable,
    PublishedTable,
    ReplicationError,
    ReplicationPermissionError,
    RowFilterSQL,
    alter_publication_tables,
    create_publication,
    publication_info,
    source_catalog,
)
from pgcdc.replication.database import connect_sql

__all__ = [
    "SourceColumn",
    "SourcePlan",
    "SourceTable",
    "ensure_publication",
    "plan_source",
    "source_columns",
]

log = logging.getLogger("pgcdc.lake")


@dataclass(frozen=True, slots=True)
class SourceColumn:
    name: str
    type_oid: int
    type_modifier: int
    not_null: bool
    generated: bool


@dataclass(frozen=True, slots=True)
class SourceTable:
    """A table of the source database with what the lake needs to know about it."""

    oid: int
    schema: str
    name: str
    relkind: str  # 'r' table, 'p' partitioned table
    replica_identity: str  # 'd' default, 'i' index, 'f' full, 'n' nothing
    columns: tuple[SourceColumn, ...]
    primary_key: tuple[str, ...]
    identity_index: tuple[str, ...]

    @property
    def table_id(self) -> str:
        return f"{self.schema}.{self.name}"

    def identity_columns(self) -> tuple[str, ...]:
        """The columns of the replica identity (what a delete's old key carries)."""
        if self.replica_identity == "d":
            return self.primary_key
        if self.replica_identity == "i":
            return self.identity_index
        if self.replica_identity == "f":
            return tuple(c.name for c in self.columns if not c.generated)
        return ()

    def keys(self) -> tuple[str, ...]:
        """The lake's key: the replica identity, or the primary key under FULL if there is one."""
        if self.replica_identity == "f" and self.primary_key:
            return self.primary_key
        return self.identity_columns()

    def relation(self) -> Relation:
        """The table as a pgoutput Relation message would describe it (for filter binding)."""
        identity = set(self.identity_columns())
        return Relation(
            xid=None,
            relation_id=self.oid,
            namespace=self.schema,
            name=self.name,
            replica_identity=self.replica_identity,
            columns=tuple(
                Column(1 if c.name in identity else 0, c.name, c.type_oid, c.type_modifier)
                for c in self.columns
                if not c.generated
            ),
        )


@dataclass(frozen=True, slots=True)
class SourcePlan:
    """The tables the pipeline mirrors and the publication that carries them."""

    tables: tuple[LakeTable, ...]
    source_tables: tuple[SourceTable, ...]
    publication_exists: bool
    publication_tables: tuple[PublicationTable, ...]  # what CREATE PUBLICATION lists
    via_partition_root: bool
    #: what ensure_publication adds to and drops from the existing publication (one pgcdc
    #: created: ``plan_source(..., managed=True)``) so that it publishes the configured tables
    publication_add: tuple[PublicationTable, ...] = ()
    publication_drop: tuple[PublicationTable, ...] = ()

    def table(self, table_id: str) -> LakeTable:
        for t in self.tables:
            if t.table_id == table_id:
                return t
        raise KeyError(table_id)


def _catalog(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], SourceTable]:
    tables = source_catalog.user_tables(conn)
    oids = [t.oid for t in tables]
    columns: dict[int, list[SourceColumn]] = {}
    for c in source_catalog.table_columns(conn, oids):
        columns.setdefault(c.relid, []).append(
            SourceColumn(c.name, c.type_oid, c.typmod, c.not_null, c.generated)
        )
    pkeys: dict[int, tuple[str, ...]] = {}
    idents: dict[int, tuple[str, ...]] = {}
    for index in source_catalog.key_indexes(conn, oids):
        # a DEFERRABLE key is unique only at commit: within a transaction two rows may hold one
        # key value (a swap of keys by one UPDATE), which a per-key mirror cannot follow; such
        # a table (REPLICA IDENTITY FULL: the key cannot identify rows) is mirrored as a multiset
        if index.primary and not index.deferrable:
            pkeys[index.relid] = index.columns
        if index.replica_identity:
            idents[index.relid] = index.columns
    return {
        (t.schema, t.name): SourceTable(
            oid=t.oid,
            schema=t.schema,
            name=t.name,
            relkind=t.relkind,
            replica_identity=t.replica_identity,
            columns=tuple(columns.get(t.oid, ())),
            primary_key=pkeys.get(t.oid, ()),
            identity_index=idents.get(t.oid, ()),
        )
        for t in tables
    }


class _DropRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Drop the replication layer's "created publication" log lines of a dry run."""
    logger = logging.getLogger(logger_name)
    drop = _DropRecords()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _try_publication(
    conn: psycopg.Connection[Any],
    name: str,
    tables: Sequence[PublicationTable],
    via_root: bool,
) -> PublicationInfo:
    """Create the publication in a transaction that is rolled back; what it would publish."""
    # a savepoint inside plan_source's transaction, itself always rolled back
    with _quiet("pgcdc.replication"), conn.transaction(force_rollback=True):
        create_publication(conn, name, tables=tables, via_partition_root=via_root)
        info = publication_info(conn, name)
    assert info is not None
    return info


def _check_filter(
    conn: psycopg.Connection[Any],
    key: str,
    table: SourceTable,
    spec: PublicationTable,
    via_root: bool,
) -> list[tuple[str, str]]:
    """Server-side and replica-identity checks of one table's row filter."""
    problems: list[tuple[str, str]] = []
    try:
        _try_publication(conn, _dry_run_name(), [spec], via_root)
    except ReplicationError as exc:
        problems.append((key, f"PostgreSQL refuses the filter for {table.table_id}: {exc}"))
        return problems
    relation = table.relation()
    assert spec.where is not None
    try:
        # the rendered SQL parses back to the same tree: bind what the server was given
        RowFilter.parse(spec.where.text).bind(relation, publishes_update_or_delete=True)
    except ReplicaIdentityError as exc:
        problems.append((key, f"table {table.table_id}: {exc}"))
    except RowFilterError:
        pass  # the server evaluates the filter; client-side support does not matter here
    return problems


def _dry_run_name() -> str:
    """A publication name for a rolled-back dry run that no other publication has (one left by
    an older pgcdc, or another --check running now, would otherwise fail it)."""
    return f"pgcdc_check_{secrets.token_hex(8)}"


def _published_filter(published: PublishedTable) -> RowFilterSQL | None:
    """The row filter the server prints for a published table, parsed and printed back (the
    form the snapshot and verification queries use); RowFilterError if pgcdc cannot parse it."""
    if published.row_filter is None:
        return None
    return RowFilter.parse(published.row_filter).sql()


def _settings_for(
    config: PipelineConfig,
    conn: psycopg.Connection[Any],
    table: SourceTable,
) -> tuple[int, TableSettings] | None:
    found = config.table_settings(table.schema, table.name)
    if found is not None:
        return found
    for schema, name in source_catalog.partition_ancestors(conn, table.oid):
        found = config.table_settings(schema, name)
        if found is not None:
            return found
    return None


def _text_columns(
    table: SourceTable,
    found: tuple[int, TableSettings] | None,
    used: set[tuple[int, str]],
) -> tuple[str, ...]:
    """The entry's ``text_columns`` the table has, noted in ``used``. A generated column is
    left for ``_text_column_problems`` to name: the stream does not carry it."""
    if found is None:
        return ()
    index, settings = found
    have = {c.name for c in table.columns if not c.generated}
    columns = tuple(c for c in settings.text_columns if c in have)
    used.update((index, c) for c in columns)
    return columns


def _text_column_problems(
    config: PipelineConfig, entries: Iterable[int], used: set[tuple[int, str]]
) -> list[tuple[str, str]]:
    """A ``text_columns`` name found in no table its entry mirrors (a typo, or a column
    dropped since) is refused, rather than silently mapping nothing."""
    problems = []
    for index in sorted(set(entries)):
        entry = config.tables[index]
        for column in entry.text_columns:
            if (index, column) not in used:
                what = "the table" if not entry.is_pattern else "any table the pattern matches"
                problems.append(
                    (
                        f"tables[{index}].text_columns",
                        f"{column!r} is not a column of {what} ({entry.name}) that the stream "
                        "carries (generated columns are not sent): fix or remove the name "
                        "(case-sensitive)",
                    )
                )
    return problems


def _alike_problems(tables: Sequence[LakeTable]) -> list[tuple[str, str]]:
    """Tables whose ``schema.table`` reads alike (schema ``a.b`` table ``c``, and schema ``a``
    table ``b.c``) are refused: the lake's state, its batches and the source's ``_table_id``
    name a table so, and would mix them (the copy failed on it, every start)."""
    by_id: dict[str, list[LakeTable]] = {}
    for table in tables:
        by_id.setdefault(table.table_id, []).append(table)
    problems = []
    for table_id, alike in sorted(by_id.items()):
        if len(alike) > 1:
            names = " and ".join(sql.Identifier(t.schema, t.name).as_string() for t in alike)
            key = alike[-1].config_key or ""
            problems.append(
                (
                    f"{key}.name" if key.startswith("tables[") else "tables",
                    f"tables {names} both read {table_id!r} as schema.table, which the lake "
                    "names each table by: rename one (a schema or table name without dots), "
                    "or mirror them in two pipelines",
                )
            )
    return problems


def _same_tables(a: PublicationInfo, b: PublicationInfo) -> bool:
    def norm(info: PublicationInfo) -> set[tuple[str, str, str | None, tuple[str, ...]]]:
        return {(t.schema, t.name, t.row_filter, t.columns) for t in info.tables}

    return norm(a) == norm(b) and a.via_partition_root == b.via_partition_root


def _table_changes(
    existing: PublicationInfo, wanted: PublicationInfo, specs: Sequence[PublicationTable]
) -> tuple[tuple[PublicationTable, ...], tuple[PublicationTable, ...]] | None:
    """The tables to add to and drop from the ``existing`` publication (a list of tables) so
    that it publishes what ``wanted`` (the dry run of ``specs``) does; None when more than
    whole tables differs (a kept table's row filter or columns, via_partition_root, a
    publication of schemas or of all tables): that is not changed in place."""
    if existing.all_tables or existing.schemas:
        return None
    if existing.via_partition_root != wanted.via_partition_root:
        return None
    before = {(t.schema, t.name): t for t in existing.tables}
    after = {(t.schema, t.name): t for t in wanted.tables}
    if any(before[key] != after[key] for key in before.keys() & after.keys()):
        return None
    listed = set(existing.listed_tables)
    named = {(spec.schema or "public", spec.name) for spec in specs}
    add = tuple(spec for spec in specs if (spec.schema or "public", spec.name) not in listed)
    drop = tuple(PublicationTable(name, schema=schema) for schema, name in sorted(listed - named))
    return add, drop


def _published_as_configured(
    existing: PublicationInfo, specs: Sequence[PublicationTable], via_root: bool
) -> PublicationInfo:
    """``existing`` if it publishes the configured tables (row filters present where configured,
    compared by presence only: without the dry run the server cannot print them), else the
    ConfigError of a different publication."""
    published = {(t.schema, t.name): t.row_filter is not None for t in existing.tables}
    configured = {(t.schema or "public", t.name): t.where is not None for t in specs}
    if published != configured or existing.via_partition_root != via_root:
        raise ConfigError(
            [
                (
                    "source.publication",
                    f"publication {existing.name!r} exists but publishes other tables, row "
                    "filters or via_partition_root than [[tables]] asks for (and this role may "
                    "not create publications to compare them exactly): drop it so pgcdc creates "
                    "it, or make [[tables]] match it",
                )
            ]
        )
    if any(configured.values()):
        log.warning(
            "publication %s: this role may not create publications, so the row filters of "
            "[[tables]] are not compared with the publication's; the publication's apply",
            existing.name,
        )
    return existing


def _replication_problems(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """The connecting role's lack of the REPLICATION attribute (the slot needs it), if so."""
    role = source_catalog.replication_role(conn)
    if role is None or role[1]:
        return []
    user = role[0]
    return [
        (
            "source.dsn",
            f"role {user!r} lacks the REPLICATION attribute a logical replication slot "
            f"needs: ALTER ROLE {sql.Identifier(user).as_string(conn)} REPLICATION, or "
            "connect as a role that has it",
        )
    ]


def _select_problems(
    conn: psycopg.Connection[Any], tables: Sequence[SourceTable]
) -> list[tuple[str, str]]:
    """The published tables the connecting role may not SELECT from (the initial copy)."""
    problems: list[tuple[str, str]] = []
    user = source_catalog.current_user(conn)
    allowed = source_catalog.select_privileges(conn, [t.oid for t in tables])
    for table in (t for t in tables if not allowed.get(t.oid, True)):
        name = sql.Identifier(table.schema, table.name).as_string(conn)
        problems.append(
            (
                "source.dsn",
                f"permission denied: role {user!r} may not SELECT from {table.table_id} (the "
                f"initial copy reads it): GRANT SELECT ON {name} TO "
                f"{sql.Identifier(user).as_string(conn)}",
            )
        )
    return problems


def plan_source(dsn: str, config: PipelineConfig, *, managed: bool = False) -> SourcePlan:
    """Resolve the configuration against the source database; creates nothing (one
    transaction, always rolled back). ``managed``: pgcdc created the existing publication
    (the lake's state says so), so tables the configuration adds or removes since are
    planned as changes to it (``SourcePlan.publication_add`` / ``publication_drop``) rather
    than refused."""
    with (
        connect_sql(dsn, connect_timeout=config.source.connect_timeout) as conn,
        conn.transaction(force_rollback=True),
    ):
        return _plan(conn, config, managed)


def _plan(conn: psycopg.Connection[Any], config: PipelineConfig, managed: bool) -> SourcePlan:
    # a role without REPLICATION is told so whatever else stops the plan (a publication it
    # may not create, a table it may not read): fixing the others alone would not do
    role = _replication_problems(conn)
    try:
        plan = _plan_tables(conn, config, managed)
    except ConfigError as exc:
        raise ConfigError([*role, *exc.problems], source=exc.source) from None
    if role:
        raise ConfigError(role)
    return plan


def _plan_tables(
    conn: psycopg.Connection[Any], config: PipelineConfig, managed: bool
) -> SourcePlan:
    catalog = _catalog(conn)
    problems: list[tuple[str, str]] = []
    specs: list[PublicationTable] = []
    chosen: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(config.tables):
        matched = sorted(key for key in catalog if entry.matches(*key))
        if not matched:
            what = "matches no table" if entry.is_pattern else "names no table"
            problems.append((f"tables[{i}].name", f"{entry.name!r} {what} in the source database"))
            continue
        for key in matched:
            try:
                found = config.table_settings(*key)
            except ConfigError as exc:
                problems.extend(exc.problems)
                continue
            if found is None or found[0] != i or key in chosen:
                continue
            chosen[key] = i
    if problems:
        raise ConfigError(problems)
    for key, i in sorted(chosen.items()):
        entry = config.tables[i]
        table = catalog[key]
        spec = PublicationTable(key[1], schema=key[0], where=entry.combined_filter())
        if spec.where is not None:
            problems.extend(
                _check_filter(
                    conn,
                    f"tables[{i}].row_filter",
                    table,
                    spec,
                    config.source.via_partition_root,
                )
            )
        specs.append(spec)
    if problems:
        raise ConfigError(problems)

    name = config.source.publication
    existing = publication_info(conn, name)
    if existing is None and not specs:
        raise ConfigError(
            [
                (
                    "tables",
                    f"no tables configured and publication {name!r} does not exist: list the "
                    "tables to mirror in [[tables]] entries",
                )
            ]
        )
    try:
        wanted = (
            _try_publication(
                conn,
                name if existing is None else _dry_run_name(),
                specs,
                config.source.via_partition_root,
            )
            if specs
            else existing
        )
    except ReplicationPermissionError as exc:
        if existing is None:
            raise ConfigError([("tables", f"PostgreSQL refuses the publication: {exc}")]) from None
        # a role that may not create publications (REPLICATION and SELECT are all a running
        # pipeline needs) checks the existing publication's table list without the dry run
        wanted = _published_as_configured(existing, specs, config.source.via_partition_root)
    except ReplicationError as exc:
        raise ConfigError([("tables", f"PostgreSQL refuses the publication: {exc}")]) from None
    assert wanted is not None
    changes: tuple[tuple[PublicationTable, ...], tuple[PublicationTable, ...]] = ((), ())
    if existing is not None:
        differs = not _same_tables(existing, wanted)
        changed = _table_changes(existing, wanted, specs) if differs and managed else None
        if changed is not None:
            changes = changed
        elif differs and managed:
            raise ConfigError(
                [
                    (
                        "tables",
                        f"publication {name!r} (pgcdc created it) publishes other row filters "
                        "or via_partition_root for the tables it keeps than [[tables]] asks "
                        "for: the pipeline follows tables added and removed, not a filter "
                        "changed under a mirror (which holds the rows of the old one). Restore "
                        "the filter; or remove the table from [[tables]] for one run and add it "
                        "back with the new filter (it is copied again)",
                    )
                ]
            )
        elif differs:
            raise ConfigError(
                [
                    (
                        "source.publication",
                        f"publication {name!r} exists but publishes other tables, row filters "
                        "or via_partition_root than [[tables]] asks for: drop it "
                        f"(DROP PUBLICATION {name}) so pgcdc creates it, or make [[tables]] "
                        "match it",
                    )
                ]
            )
        missing_ops = {"insert", "update", "delete"} - set(existing.publish)
        if missing_ops:
            raise ConfigError(
                [
                    (
                        "source.publication",
                        f"publication {name!r} does not publish {', '.join(sorted(missing_ops))}:"
                        " a mirror needs inserts, updates and deletes",
                    )
                ]
            )
        if "truncate" not in existing.publish:
            log.warning(
                "publication %s does not publish TRUNCATE: truncates are not mirrored", name
            )
        if changed is None:
            wanted = existing
    lake_tables: list[LakeTable] = []
    source_tables: list[SourceTable] = []
    used: set[tuple[int, str]] = set()  # (entry, column) of text_columns found in a table
    for published in wanted.tables:
        known = catalog.get((published.schema, published.name))
        if known is None:  # pragma: no cover - published tables are in the catalog
            continue
        table = known
        found = _settings_for(config, conn, table)
        key_name = f"tables[{found[0]}]" if found else f"source.publication ({name})"
        settings = found[1] if found else None
        keys = table.keys()
        if not keys:
            problems.append(
                (
                    f"{key_name}.name",
                    f"table {table.table_id} has no primary key and REPLICA IDENTITY "
                    f"{'NOTHING' if table.replica_identity == 'n' else 'DEFAULT'}: its rows "
                    "cannot be identified (and UPDATE/DELETE on it fail once published); add a "
                    f"primary key or ALTER TABLE {table.table_id} REPLICA IDENTITY FULL",
                )
            )
            continue
        clash = sorted(c.name for c in table.columns if reserved_column(c.name))
        if clash:
            problems.append(
                (
                    f"{key_name}.name",
                    f"table {table.table_id} has column(s) {', '.join(clash)}, names pgcdc "
                    "reserves for its metadata columns (and the __pgcdc prefix), in any case: "
                    "rename them or leave the table out",
                )
            )
            continue
        twins = case_clashes([c.name for c in table.columns])
        if twins:
            problems.append(
                (
                    f"{key_name}.name",
                    f"table {table.table_id} has columns whose names differ only in case ("
                    + "; ".join(", ".join(group) for group in twins)
                    + "), which Spark cannot tell apart: rename one of each, or leave the table "
                    "out",
                )
            )
            continue
        try:
            _published_filter(published)
        except RowFilterError as exc:
            problems.append(
                (
                    f"{key_name}.row_filter" if found else key_name,
                    f"the row filter of {table.table_id} in publication {name!r} "
                    f"({published.row_filter}) is outside what pgcdc parses, and pgcdc only "
                    f"sends SQL it has parsed (the initial copy applies the filter): {exc}",
                )
            )
            continue
        lake_tables.append(
            LakeTable(
                schema=table.schema,
                name=table.name,
                keys=keys,
                replica_identity=table.replica_identity,
                multiset=table.replica_identity == "f" and not table.primary_key,
                row_filter=published.row_filter,
                history=config.history_for(settings),
                changelog=config.changelog_for(settings),
                config_key=key_name,
                relkind=table.relkind,
                text_columns=_text_columns(table, found, used),
            )
        )
        source_tables.append(table)
    if not problems:  # a table left out for another problem used none of its text_columns
        problems.extend(_text_column_problems(config, chosen.values(), used))
    problems.extend(_alike_problems(lake_tables))
    problems.extend(_select_problems(conn, source_tables))
    if problems:
        raise ConfigError(problems)
    if not lake_tables:
        raise ConfigError([("tables", f"publication {name!r} publishes no table")])
    return SourcePlan(
        tables=tuple(lake_tables),
        source_tables=tuple(source_tables),
        publication_exists=existing is not None,
        publication_tables=tuple(specs),
        via_partition_root=config.source.via_partition_root,
        publication_add=changes[0],
        publication_drop=changes[1],
    )


def source_columns(dsn: str, table: LakeTable) -> dict[str, int]:
    """The table's current (not generated) columns, in order, with their attnum."""
    with connect_sql(dsn) as conn:
        return source_catalog.current_columns(conn, table.schema, table.name)


def ensure_publication(dsn: str, config: PipelineConfig, plan: SourcePlan) -> bool:
    """Create the planned publication unless it already exists, else add and drop the tables
    the plan changes in it (one transaction); whether it was created."""
    if plan.publication_exists:
        alter_publication_tables(
            dsn,
            config.source.publication,
            add=plan.publication_add,
            drop=plan.publication_drop,
        )
        return False
    create_publication(
        dsn,
        config.source.publication,
        tables=plan.publication_tables,
        via_partition_root=plan.via_partition_root,
    )
    return True
