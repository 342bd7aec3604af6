"""Which filter applies to which table and action: several publications combined the way
pgoutput combines them (pgoutput_row_filter_init), from a client-side configuration or from
the server's publication catalog.

For one table, pgoutput builds one expression per action (insert, update, delete) from the
publications that publish that action: the OR of their filters, unless one of them has no
filter (or is FOR ALL TABLES, or FOR TABLES IN SCHEMA of the table's schema), which makes the
action unfiltered. TRUNCATE is never filtered. A table is named as it appears in the stream:
with publish_via_partition_root a partition's changes carry the root's name and the root's
filters apply; otherwise the partition's own (a partition published only through its parent
is then unfiltered). ``load_publications`` reproduces get_rel_sync_entry for that.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias

from pgcdc.filters.rowfilter import RowFilter
from pgcdc.filters.validate import ColumnCollations

__all__ = [
    "ACTIONS",
    "Action",
    "FilterSet",
    "Publication",
    "PublishedFilter",
    "TableRule",
    "load_publications",
]

Action: TypeAlias = Literal["insert", "update", "delete"]
ACTIONS: tuple[Action, ...] = ("insert", "update", "delete")
_ALL_ACTIONS = frozenset({"insert", "update", "delete", "truncate"})


@dataclass(frozen=True, slots=True)
class PublishedFilter:
    """One publication's filter for a table; ``publishes_update_or_delete`` decides whether it
    must stay within the replica identity."""

    filter: RowFilter
    publishes_update_or_delete: bool


@dataclass(frozen=True, slots=True)
class TableRule:
    """The filters of one table as it appears in the stream (``schema.table``).

    ``actions``: what the publications publish for it (insert, update, delete, truncate).
    ``filters[action]``: the filters OR-ed for that action; an action published but absent
    from ``filters`` is unfiltered.
    """

    table: str
    actions: frozenset[str]
    filters: Mapping[Action, tuple[PublishedFilter, ...]] = field(default_factory=dict)
    #: the table's columns declared with a collation of their own (``column_collations``)
    collations: ColumnCollations = field(default_factory=dict)

    def is_filtered(self) -> bool:
        return bool(self.filters)


@dataclass(frozen=True, slots=True)
class Publication:
    """A publication as the client models it: the tables it publishes (``schema.table`` ->
    filter or None) and its actions. ``all_tables`` and ``schemas`` publish more tables
    without filters, as FOR ALL TABLES and FOR TABLES IN SCHEMA do."""

    name: str
    tables: Mapping[str, RowFilter | None] = field(default_factory=dict)
    actions: frozenset[str] = _ALL_ACTIONS
    all_tables: bool = False
    schemas: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = set(self.actions) - _ALL_ACTIONS
        if unknown:
            raise ValueError(
                f"publication {self.name!r}: unknown actions {sorted(unknown)}; use insert, "
                "update, delete, truncate"
            )


def _qualify(table: str) -> str:
    if "." not in table:
        raise ValueError(
            f"table {table!r} must be qualified as schema.table (for example public.{table})"
        )
    return table


def combine(table: str, publications: Sequence[tuple[Publication, RowFilter | None]]) -> TableRule:
    """pgoutput_row_filter_init for one table: ``publications`` are those publishing it, each
    with its filter for the table (None: unfiltered, also for FOR ALL TABLES / IN SCHEMA)."""
    actions: set[str] = set()
    unfiltered: set[str] = set()
    nodes: dict[Action, list[PublishedFilter]] = {a: [] for a in ACTIONS}
    for pub, flt in publications:
        actions |= pub.actions
        if flt is None:
            unfiltered |= pub.actions
            continue
        pubs_ud = bool(pub.actions & {"update", "delete"})
        for action in ACTIONS:
            if action in pub.actions and action not in unfiltered:
                nodes[action].append(PublishedFilter(flt, pubs_ud))
    filters = {a: tuple(v) for a, v in nodes.items() if v and a not in unfiltered}
    return TableRule(table, frozenset(actions), filters)


class FilterSet:
    """Row filters per table (``schema.table`` as the stream names it) and action."""

    __slots__ = ("_rules",)

    def __init__(self, rules: Iterable[TableRule] = ()) -> None:
        self._rules: dict[str, TableRule] = {}
        for rule in rules:
            self._rules[_qualify(rule.table)] = rule

    @classmethod
    def from_publications(cls, publications: Sequence[Publication]) -> FilterSet:
        """The rules for every table named by ``publications`` (in publication order)."""
        tables: list[str] = []
        for pub in publications:
            for table in pub.tables:
                if _qualify(table) not in tables:
                    tables.append(table)
        rules = []
        for table in tables:
            schema = table.split(".", 1)[0]
            members: list[tuple[Publication, RowFilter | None]] = []
            for pub in publications:
                if pub.all_tables or schema in pub.schemas:
                    members.append((pub, None))
                elif table in pub.tables:
                    members.append((pub, pub.tables[table]))
            rules.append(combine(table, members))
        return cls(rules)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, str | RowFilter | Sequence[str | RowFilter]],
        actions: Iterable[str] = ACTIONS,
    ) -> FilterSet:
        """Filters from a client configuration: ``schema.table`` -> one or more expressions,
        each treated as one publication of ``actions`` (several expressions are OR-ed)."""
        action_set = frozenset(actions)
        publications: list[Publication] = []
        for table, value in config.items():
            items = [value] if isinstance(value, str | RowFilter) else list(value)
            if not items:
                raise ValueError(f"no filter expressions given for {table}")
            for i, item in enumerate(items):
                flt = item if isinstance(item, RowFilter) else RowFilter.parse(item)
                publications.append(Publication(f"{table}#{i}", {table: flt}, action_set))
        return cls.from_publications(publications)

    @classmethod
    def from_catalog(cls, conn: Any, publication_names: Sequence[str]) -> FilterSet:
        """The filters of the server's publications (see ``load_publications``)."""
        return load_publications(conn, publication_names)

    def with_column_collations(self, conn: Any) -> FilterSet:
        """These rules with their tables' column collations read from the catalog (a psycopg
        3 connection): text compares and maps case under a column's own collation, and the
        filters refuse what they cannot evaluate exactly under it."""

        def read(rule: TableRule) -> TableRule:
            namespace, _, name = rule.table.partition(".")
            return replace(rule, collations=column_collations(conn, namespace, name))

        return FilterSet(read(r) if r.is_filtered() else r for r in self._rules.values())

    def rule(self, namespace: str, name: str) -> TableRule | None:
        """The rule of a table, or None when no filter configuration names it."""
        return self._rules.get(f"{namespace}.{name}")

    def __iter__(self) -> Any:
        return iter(self._rules.values())

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"FilterSet({sorted(self._rules)})"


# -- the server's publication catalog -----------------------------------------------------------

_PUBLICATIONS_SQL = """
SELECT p.pubname::text, p.oid::int8, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete,
       p.pubtruncate, p.pubviaroot
FROM pg_catalog.pg_publication p WHERE p.pubname = ANY(%s)"""

_PUBLICATION_RELS_SQL = """
SELECT pr.prpubid::int8, pr.prrelid::int8, pg_catalog.pg_get_expr(pr.prqual, pr.prrelid)
FROM pg_catalog.pg_publication_rel pr WHERE pr.prpubid = ANY(%s)"""

_PUBLICATION_SCHEMAS_SQL = """
SELECT pn.pnpubid::int8, pn.pnnspid::int8
FROM pg_catalog.pg_publication_namespace pn WHERE pn.pnpubid = ANY(%s)"""

_RELATIONS_SQL = """
SELECT c.oid::int8, n.oid::int8, n.nspname::text, c.relname::text, c.relkind::text,
       c.relispartition,
       ARRAY(SELECT a.relid::int8 FROM pg_catalog.pg_partition_ancestors(c.oid) AS a(relid)
             WHERE a.relid <> c.oid)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_toast%'"""


@dataclass(frozen=True, slots=True)
class _Pub:
    name: str
    oid: int
    all_tables: bool
    actions: frozenset[str]
    via_root: bool


@dataclass(frozen=True, slots=True)
class _Rel:
    oid: int
    namespace_oid: int
    namespace: str
    name: str
    kind: str
    is_partition: bool
    ancestors: tuple[int, ...]  # immediate parent first, root last


_COLLATIONS_QUERY = """
SELECT a.attname::text, l.collname::text, n.nspname::text
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_collation l ON l.oid = a.attcollation
JOIN pg_catalog.pg_namespace n ON n.oid = l.collnamespace
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
JOIN pg_catalog.pg_namespace cn ON cn.oid = c.relnamespace
WHERE cn.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attcollation <> 100
"""


def column_collations(conn: Any, namespace: str, name: str) -> ColumnCollations:
    """The table's columns declared with a collation other than the database's default (a
    filter compares and maps their text under it, as the server does)."""
    rows = conn.execute(_COLLATIONS_QUERY, (namespace, name)).fetchall()
    return {column: (collation, schema) for column, collation, schema in rows}


def load_publications(conn: Any, names: Sequence[str]) -> FilterSet:
    """The FilterSet a walsender streaming ``names`` (pgoutput's publication_names, in that
    order) would apply, read from a psycopg 3 connection (PostgreSQL 15+).

    Filters are read with pg_get_expr in a session set to DateStyle ISO, TimeZone UTC and
    extra_float_digits 3, so constants print unambiguously. Raises LookupError for a
    publication that does not exist (the walsender would fail the same way).
    """
    if not names:
        raise ValueError("no publication names given")
    with conn.transaction():
        for setting, value in (
            ("DateStyle", "ISO, MDY"),
            ("TimeZone", "UTC"),
            ("extra_float_digits", "3"),
            ("IntervalStyle", "postgres"),
        ):
            conn.execute("SELECT pg_catalog.set_config(%s, %s, true)", (setting, value))
        pub_rows = conn.execute(_PUBLICATIONS_SQL, (list(names),)).fetchall()
        by_name = {row[0]: row for row in pub_rows}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise LookupError(f'publication "{missing[0]}" does not exist')
        pubs = []
        for pub_name in names:
            _, oid, all_tables, ins, upd, dele, trunc, via_root = by_name[pub_name]
            actions = {
                a for a, on in zip(("insert", "update", "delete", "truncate"),
                                   (ins, upd, dele, trunc), strict=True) if on
            }  # fmt: skip
            pubs.append(_Pub(pub_name, oid, all_tables, frozenset(actions), via_root))
        oids = [p.oid for p in pubs]
        rel_rows = conn.execute(_PUBLICATION_RELS_SQL, (oids,)).fetchall()
        schema_rows = conn.execute(_PUBLICATION_SCHEMAS_SQL, (oids,)).fetchall()
        relations = {
            row[0]: _Rel(row[0], row[1], row[2], row[3], row[4], row[5], tuple(row[6]))
            for row in conn.execute(_RELATIONS_SQL).fetchall()
        }
    quals: dict[tuple[int, int], str | None] = {(r[1], r[0]): r[2] for r in rel_rows}
    schemas = {(r[0], r[1]) for r in schema_rows}
    return _simulate(pubs, relations, quals, schemas).with_column_collations(conn)


def _simulate(
    pubs: list[_Pub],
    relations: dict[int, _Rel],
    quals: dict[tuple[int, int], str | None],
    schemas: set[tuple[int, int]],
) -> FilterSet:
    def in_pub(relid: int, pub: _Pub) -> bool:
        rel = relations.get(relid)
        return (relid, pub.oid) in quals or (
            rel is not None and (pub.oid, rel.namespace_oid) in schemas
        )

    def topmost_ancestor(rel: _Rel, pub: _Pub) -> tuple[int, int]:
        topmost, level = 0, 0
        for i, ancestor in enumerate(rel.ancestors, start=1):
            if in_pub(ancestor, pub):
                topmost, level = ancestor, i
        return topmost, level

    parsed: dict[str, RowFilter] = {}
    rules: dict[str, TableRule] = {}
    any_all_tables = any(p.all_tables for p in pubs)
    for rel in relations.values():
        if not any_all_tables and not any(
            in_pub(rel.oid, p) or any(in_pub(a, p) for a in rel.ancestors) for p in pubs
        ):
            continue
        publish_as = rel.oid
        publish_level = 0
        actions: set[str] = set()
        members: list[_Pub] = []
        for pub in pubs:
            publish = False
            pub_relid = rel.oid
            level = 0
            if pub.all_tables:
                publish = True
                if pub.via_root and rel.is_partition:
                    pub_relid = rel.ancestors[-1]
                    level = len(rel.ancestors)
            if not publish:
                ancestor_published = False
                if rel.is_partition:
                    ancestor, alevel = topmost_ancestor(rel, pub)
                    if ancestor:
                        ancestor_published = True
                        if pub.via_root:
                            pub_relid, level = ancestor, alevel
                publish = in_pub(rel.oid, pub) or ancestor_published
            if not publish or (rel.kind == "p" and not pub.via_root):
                continue
            actions |= pub.actions
            if publish_level > level:
                continue
            if publish_level < level:
                publish_as, publish_level, members = pub_relid, level, []
            members.append(pub)
        if not actions:
            continue
        target = relations[publish_as]
        table = f"{target.namespace}.{target.name}"
        entries: list[tuple[Publication, RowFilter | None]] = []
        for pub in members:
            flt: RowFilter | None = None
            if not pub.all_tables and (pub.oid, target.namespace_oid) not in schemas:
                text = quals.get((publish_as, pub.oid))
                if text is not None:
                    flt = parsed.get(text)
                    if flt is None:
                        flt = parsed[text] = RowFilter.parse(text)
            entries.append((Publication(pub.name, actions=pub.actions), flt))
        rule = combine(table, entries)
        rule = TableRule(table, frozenset(actions), rule.filters)
        previous = rules.get(table)
        if previous is None or (not previous.filters and rule.filters):
            rules[table] = rule
    return FilterSet(rules.values())
