"""What the codec knows about PostgreSQL data types: ``TypeInfo`` rows and the ``TypeRegistry``.

Every built-in type (oid < 10000) comes from the generated table in ``oids.py``; user types
(enums, domains, arrays of them, composites, ranges, extension types) are added with
``TypeRegistry.add`` by the layers that read the catalog or pgoutput Type messages, or loaded in
one query with ``TypeRegistry.load(conn)``. Conversion code asks ``get(oid)`` and follows
domains to their base type with ``resolve(oid)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from pgcdc.protocol.values.oids import BUILTIN_TYPES

__all__ = [
    "BUILTIN_RANGES",
    "DEFAULT_REGISTRY",
    "FIRST_USER_OID",
    "PG_TYPE_QUERY",
    "Kind",
    "TypeInfo",
    "TypeRegistry",
    "fetch_types",
]

Kind: TypeAlias = Literal[
    "base", "array", "enum", "domain", "composite", "range", "multirange", "pseudo"
]

#: pg_type.typtype -> TypeInfo.kind ('b' rows whose element points back at them are arrays).
TYPTYPE_KINDS: dict[str, Kind] = {
    "b": "base",
    "c": "composite",
    "d": "domain",
    "e": "enum",
    "p": "pseudo",
    "r": "range",
    "m": "multirange",
}

#: Types with a smaller OID are built in (PostgreSQL's FirstGenbkiObjectId).
FIRST_USER_OID = 10000

#: The catalog query behind ``fetch_types``: one row per type, in TypeInfo field order.
PG_TYPE_QUERY = """
SELECT t.oid::int, t.typname::text, n.nspname::text, t.typtype::text,
       CASE WHEN t.typelem <> 0 AND e.typarray = t.oid THEN t.typelem::int ELSE 0 END,
       t.typbasetype::int, t.typarray::int, t.typdelim::text, t.typtypmod,
       COALESCE(r.rngsubtype::int, m.rngtypid::int, 0)
FROM pg_catalog.pg_type t
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
LEFT JOIN pg_catalog.pg_type e ON e.oid = t.typelem
LEFT JOIN pg_catalog.pg_range r ON r.rngtypid = t.oid
LEFT JOIN pg_catalog.pg_range m ON m.rngmultitypid = t.oid
WHERE t.oid::int8 >= %(min_oid)s AND t.oid::int8 < %(max_oid)s
ORDER BY t.oid
"""

_MAX_DOMAIN_DEPTH = 64


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """One PostgreSQL data type, as pg_type describes it.

    ``element_oid`` is the element type of an array (0 otherwise), ``base_oid`` the type a domain
    is over (0 otherwise), ``array_oid`` the type's array type (0 if none), ``delimiter`` the
    element separator in the text form of its arrays (',' for all but box), and
    ``type_modifier`` a domain's typmod on its base type (``numeric(10,2)``; -1 if none),
    ``subtype_oid`` a range's bound type or a multirange's range type (0 for other types).
    """

    oid: int
    name: str
    namespace: str = "pg_catalog"
    kind: Kind = "base"
    element_oid: int = 0
    base_oid: int = 0
    array_oid: int = 0
    delimiter: str = ","
    type_modifier: int = -1
    subtype_oid: int = 0

    @property
    def qualified_name(self) -> str:
        """``namespace.name``, for messages."""
        return f"{self.namespace}.{self.name}"


#: pg_range of the built-in ranges and multiranges: (range, bound type, multirange)
BUILTIN_RANGES: tuple[tuple[int, int, int], ...] = (
    (3904, 23, 4451),  # int4range, int4, int4multirange
    (3906, 1700, 4532),  # numrange, numeric, nummultirange
    (3908, 1114, 4533),  # tsrange, timestamp, tsmultirange
    (3910, 1184, 4534),  # tstzrange, timestamptz, tstzmultirange
    (3912, 1082, 4535),  # daterange, date, datemultirange
    (3926, 20, 4536),  # int8range, int8, int8multirange
)
_SUBTYPES = {r: b for r, b, _ in BUILTIN_RANGES} | {m: r for r, _, m in BUILTIN_RANGES}

_BUILTINS: dict[int, TypeInfo] = {
    row[0]: TypeInfo(
        row[0],
        row[1],
        row[2],
        row[3],  # type: ignore[arg-type]
        *row[4:],
        subtype_oid=_SUBTYPES.get(row[0], 0),
    )
    for row in BUILTIN_TYPES
}


def fetch_types(conn: Any, min_oid: int = FIRST_USER_OID, max_oid: int = 2**32) -> list[TypeInfo]:
    """Every pg_type row with ``min_oid <= oid < max_oid`` of a psycopg 3 connection's database."""
    rows = conn.execute(PG_TYPE_QUERY, {"min_oid": min_oid, "max_oid": max_oid}).fetchall()
    types = []
    for oid, name, nsp, typtype, elem, base, array, delim, typmod, subtype in rows:
        kind: Kind = "array" if elem else TYPTYPE_KINDS.get(typtype, "base")
        types.append(TypeInfo(oid, name, nsp, kind, elem, base, array, delim, typmod, subtype))
    return types


class TypeRegistry:
    """Every built-in type plus the user types added to it, by OID.

    Converters built for a type are cached here (``cache``); ``add`` clears the cache, so a
    user type added after its first use is picked up. A registry is cheap: the built-in table is
    shared, only added types are stored per registry.
    """

    __slots__ = ("_added", "cache")

    def __init__(self, types: Iterable[TypeInfo] = ()) -> None:
        self._added: dict[int, TypeInfo] = {}
        #: Conversion plans of ``pgcdc.protocol.values.adapt``, keyed by (oid, purpose).
        self.cache: dict[object, object] = {}
        for info in types:
            self.add(info)

    def add(self, info: TypeInfo) -> None:
        """Add (or replace) a type."""
        if not isinstance(info, TypeInfo):
            raise TypeError(f"TypeRegistry.add takes a TypeInfo, not {type(info).__name__}")
        self._added[info.oid] = info
        self.cache.clear()

    def get(self, oid: int) -> TypeInfo | None:
        """The type with this OID, or None when unknown."""
        info = self._added.get(oid)
        return info if info is not None else _BUILTINS.get(oid)

    def resolve(self, oid: int) -> TypeInfo | None:
        """The type with this OID, or for a domain the (non-domain) type it is ultimately over.

        None when the type, or a type in the domain chain, is unknown.
        """
        info = self.get(oid)
        depth = 0
        while info is not None and info.kind == "domain":
            depth += 1
            if depth > _MAX_DOMAIN_DEPTH:
                return None
            info = self.get(info.base_oid)
        return info

    def domain_type_modifier(self, oid: int) -> int:
        """The typmod a domain chain imposes on its base type (-1 if none or not a domain)."""
        info = self.get(oid)
        depth = 0
        while info is not None and info.kind == "domain" and depth <= _MAX_DOMAIN_DEPTH:
            if info.type_modifier != -1:
                return info.type_modifier
            info = self.get(info.base_oid)
            depth += 1
        return -1

    def load(self, conn: Any) -> int:
        """Add every user type (oid >= 10000) of a live psycopg 3 connection's database.

        Returns how many types were added. Enums, domains, composites, ranges and arrays of all
        of them are loaded; built-in types are never touched.
        """
        types = fetch_types(conn, FIRST_USER_OID)
        for info in types:
            self._added[info.oid] = info
        self.cache.clear()
        return len(types)

    def __contains__(self, oid: object) -> bool:
        return isinstance(oid, int) and self.get(oid) is not None

    def __iter__(self) -> Iterator[TypeInfo]:
        merged = dict(_BUILTINS)
        merged.update(self._added)
        return iter(sorted(merged.values(), key=lambda t: t.oid))

    def __len__(self) -> int:
        return len(_BUILTINS.keys() | self._added.keys())

    def __repr__(self) -> str:
        return f"TypeRegistry({len(self._added)} user types)"


#: The registry used when none is given: built-in types only, unless types are added to it.
DEFAULT_REGISTRY = TypeRegistry()
