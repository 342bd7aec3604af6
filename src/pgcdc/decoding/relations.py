"""The relation and type cache: what Relation and Type messages said, as objects plugins use.

pgoutput describes a table with a Relation message before the first change to it, and again
whenever its definition may have changed (after a reconnect, an ALTER TABLE, a publication
change). ``RelationCache`` turns those messages into ``RelationInfo`` objects (namespace, name,
replica identity, columns with their type names, key columns) and keeps the current one per
relation id.

Type names: built-in types (OID < 10000) come from the generated table of
``pgcdc.protocol.values`` without any catalog query; other types from the registry when a layer
loaded them there, from pgoutput Type messages (which precede a Relation that uses a non-built-in
type), or from an optional ``type_lookup(oid)`` hook (e.g. a catalog query); else None.

A changed definition of a relation is reported to plugins as a ``SchemaChange`` (columns added,
dropped or retyped, key or replica identity changed, table renamed): see
``pgcdc.decoding.plugin.OutputPlugin.schema_change``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgcdc.protocol.messages import Relation, Type

if TYPE_CHECKING:
    from pgcdc.protocol.values.registry import TypeRegistry

__all__ = ["ColumnInfo", "RelationCache", "RelationInfo", "SchemaChange", "TypeLookup"]

#: A hook that names a type the stream did not describe: ``type_lookup(oid) -> name or None``.
TypeLookup = Callable[[int], str | None]

_REPLICA_IDENTITIES = {"d": "default", "n": "nothing", "f": "full", "i": "index"}


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column of a relation as pgoutput publishes it.

    ``type_name`` is ``pg_type.typname`` for types in pg_catalog (``int4``, ``text``) and
    ``namespace.typname`` for others (``public.mood``); None when no source knew the type.
    ``is_key`` marks the columns of the replica identity (primary key or chosen index; every
    column with REPLICA IDENTITY FULL).
    """

    name: str
    type_id: int
    type_modifier: int
    type_name: str | None
    is_key: bool


@dataclass(frozen=True, slots=True)
class RelationInfo:
    """A published table: the consumer-facing form of a Relation message.

    ``replica_identity`` is ``relreplident``: 'd' default (primary key), 'n' nothing, 'f' full,
    'i' index. Tuples of changes to this relation have one value per column, in this order.
    """

    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[ColumnInfo, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {c.name: i for i, c in enumerate(self.columns)})

    @property
    def qualified_name(self) -> str:
        """``namespace.name``."""
        return f"{self.namespace}.{self.name}"

    @property
    def key_columns(self) -> tuple[ColumnInfo, ...]:
        """The replica identity columns."""
        return tuple(c for c in self.columns if c.is_key)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column_index(self, name: str) -> int:
        """Position of column ``name`` in this relation's tuples."""
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(
                f"relation {self.qualified_name} has no column {name!r}; "
                f"its columns are {', '.join(self._index) or '(none)'}"
            ) from None

    def column(self, name: str) -> ColumnInfo:
        return self.columns[self.column_index(name)]

    def __contains__(self, name: object) -> bool:
        return name in self._index


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """A relation's definition changed between two Relation messages.

    Columns are matched by name (pgoutput sends no attribute numbers), so a renamed column is
    reported as one dropped and one added column. ``retyped`` pairs a column's old and new
    description when its type or type modifier changed.
    """

    old: RelationInfo
    new: RelationInfo
    added: tuple[ColumnInfo, ...]
    dropped: tuple[ColumnInfo, ...]
    retyped: tuple[tuple[ColumnInfo, ColumnInfo], ...]

    @classmethod
    def between(cls, old: RelationInfo, new: RelationInfo) -> SchemaChange:
        old_cols = {c.name: c for c in old.columns}
        new_cols = {c.name: c for c in new.columns}
        return cls(
            old=old,
            new=new,
            added=tuple(c for c in new.columns if c.name not in old_cols),
            dropped=tuple(c for c in old.columns if c.name not in new_cols),
            retyped=tuple(
                (old_cols[c.name], c)
                for c in new.columns
                if c.name in old_cols
                and (old_cols[c.name].type_id, old_cols[c.name].type_modifier)
                != (c.type_id, c.type_modifier)
            ),
        )

    @property
    def relation_id(self) -> int:
        return self.new.relation_id

    @property
    def renamed(self) -> bool:
        """The table's name or schema changed."""
        return (self.old.namespace, self.old.name) != (self.new.namespace, self.new.name)

    @property
    def key_changed(self) -> bool:
        """The set of replica identity columns changed."""
        return {c.name for c in self.old.key_columns} != {c.name for c in self.new.key_columns}

    @property
    def replica_identity_changed(self) -> bool:
        return self.old.replica_identity != self.new.replica_identity

    @property
    def columns_changed(self) -> bool:
        """Columns were added, dropped, retyped or reordered."""
        return bool(self.added or self.dropped or self.retyped) or (
            self.old.column_names != self.new.column_names
        )

    def describe(self) -> str:
        """A one-line summary for logs (names only, never values)."""
        parts = []
        if self.renamed:
            parts.append(f"renamed from {self.old.qualified_name}")
        if self.added:
            parts.append("added " + ", ".join(c.name for c in self.added))
        if self.dropped:
            parts.append("dropped " + ", ".join(c.name for c in self.dropped))
        if self.retyped:
            parts.append(
                "retyped "
                + ", ".join(f"{o.name} {o.type_name}->{n.type_name}" for o, n in self.retyped)
            )
        if self.key_changed:
            parts.append("key " + ",".join(c.name for c in self.new.key_columns))
        if self.replica_identity_changed:
            ident = _REPLICA_IDENTITIES.get(self.new.replica_identity, self.new.replica_identity)
            parts.append(f"replica identity {ident}")
        if not parts and self.old.column_names != self.new.column_names:
            parts.append("columns reordered")
        return f"{self.new.qualified_name}: " + ("; ".join(parts) or "definition changed")


def _default_registry() -> TypeRegistry | None:
    try:
        from pgcdc.protocol.values.registry import DEFAULT_REGISTRY
    except ImportError:  # pragma: no cover - the codec's values package is part of the project
        return None
    return DEFAULT_REGISTRY


class RelationCache:
    """Current ``RelationInfo`` per relation id, and type names per type OID.

    ``registry`` is a ``pgcdc.protocol.values.registry.TypeRegistry`` (default: the built-in
    types); ``type_lookup`` an optional hook for types nothing else names.
    """

    __slots__ = ("_lookup_cache", "_relations", "_stream_types", "registry", "type_lookup")

    def __init__(
        self, registry: TypeRegistry | None = None, type_lookup: TypeLookup | None = None
    ) -> None:
        self.registry = registry if registry is not None else _default_registry()
        self.type_lookup = type_lookup
        self._relations: dict[int, RelationInfo] = {}
        self._stream_types: dict[int, str] = {}
        self._lookup_cache: dict[int, str | None] = {}

    # -- types ---------------------------------------------------------------------------
    def add_type(self, message: Type) -> None:
        """Remember the name a Type message gave an OID (pg_catalog is sent as '')."""
        if message.namespace in ("", "pg_catalog"):
            self._stream_types[message.type_id] = message.name
        else:
            self._stream_types[message.type_id] = f"{message.namespace}.{message.name}"

    def type_name(self, oid: int) -> str | None:
        """The name of type ``oid``: registry, then Type messages, then the lookup hook."""
        if self.registry is not None:
            info = self.registry.get(oid)
            if info is not None:
                if info.namespace == "pg_catalog":
                    return info.name
                return f"{info.namespace}.{info.name}"
        name = self._stream_types.get(oid)
        if name is not None:
            return name
        if self.type_lookup is None:
            return None
        if oid not in self._lookup_cache:
            self._lookup_cache[oid] = self.type_lookup(oid)
        return self._lookup_cache[oid]

    # -- relations -----------------------------------------------------------------------
    def build(self, message: Relation) -> RelationInfo:
        """The ``RelationInfo`` for a Relation message, without storing it."""
        return RelationInfo(
            relation_id=message.relation_id,
            namespace=message.namespace,
            name=message.name,
            replica_identity=message.replica_identity,
            columns=tuple(
                ColumnInfo(
                    name=c.name,
                    type_id=c.type_id,
                    type_modifier=c.type_modifier,
                    type_name=self.type_name(c.type_id),
                    is_key=c.is_key,
                )
                for c in message.columns
            ),
        )

    def apply(self, message: Relation) -> RelationInfo:
        """Build and store the definition a Relation message gives; returns it."""
        info = self.build(message)
        self.store(info)
        return info

    def store(self, info: RelationInfo) -> None:
        current = self._relations.get(info.relation_id)
        if current != info:
            self._relations[info.relation_id] = info

    def get(self, relation_id: int) -> RelationInfo | None:
        return self._relations.get(relation_id)

    def __getitem__(self, relation_id: int) -> RelationInfo:
        try:
            return self._relations[relation_id]
        except KeyError:
            raise KeyError(
                f"no Relation message has described relation id {relation_id} yet"
            ) from None

    def __contains__(self, relation_id: object) -> bool:
        return relation_id in self._relations

    def __iter__(self) -> Iterator[RelationInfo]:
        return iter(list(self._relations.values()))

    def __len__(self) -> int:
        return len(self._relations)

    def by_name(self, namespace: str, name: str) -> RelationInfo | None:
        """The current definition of ``namespace.name``, if a Relation message described it."""
        for info in self._relations.values():
            if info.namespace == namespace and info.name == name:
                return info
        return None
