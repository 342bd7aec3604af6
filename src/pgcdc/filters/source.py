"""Client-side row filtering of a replication source, as server-side filters would have done.

``FilteredSource`` wraps a ``pgcdc.replication.ReplicationSession`` or ``SqlSlotReader``: every
change message passes through a ``StreamFilter`` (UPDATE transformation included) and is
re-encoded, so the consumer (``pgcdc.decoding.run``) sees the stream pgoutput would have sent
for a publication carrying the same row filters. Transactions whose changes are all filtered
out arrive empty and print as nothing, as with server-side filters.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any, Protocol

import psycopg

from pgcdc.filters.rowfilter import RowFilter
from pgcdc.filters.rules import column_collations
from pgcdc.filters.stream import StreamFilter
from pgcdc.lsn import Lsn
from pgcdc.protocol import MAX_PROTO_VERSION, Column, Decoder, Encoder, Relation
from pgcdc.protocol.message_types import CHANGES, MessageType
from pgcdc.replication import Reconnected, WalData

__all__ = ["FilteredSource", "check_filters", "relation_from_catalog"]

_CHANGE_CODES = CHANGES | {MessageType.RELATION}


class _Source(Protocol):
    def events(self) -> Iterator[Any]: ...
    def confirm(self, lsn: Lsn) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> None: ...


class FilteredSource:
    """A replication source whose change messages pass through ``stream_filter``.

    Everything else (confirm, request_status, positions) is the wrapped source's.
    """

    def __init__(self, source: _Source, stream_filter: StreamFilter) -> None:
        self.source = source
        self.filter = stream_filter
        self._decoder = Decoder(MAX_PROTO_VERSION)
        self._encoder = Encoder(MAX_PROTO_VERSION)
        #: changes dropped and transformed so far (for logs)
        self.dropped = 0
        self.transformed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def __enter__(self) -> FilteredSource:
        self.source.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.source.__exit__(exc_type, exc, tb)

    def confirm(self, lsn: Lsn) -> None:
        self.source.confirm(lsn)

    def events(self) -> Iterator[Any]:
        decoder, encoder = self._decoder, self._encoder
        for event in self.source.events():
            if isinstance(event, Reconnected):
                decoder.reset()
                yield event
                continue
            if not isinstance(event, WalData):
                yield event
                continue
            payload = event.payload
            message = decoder.decode(payload)  # every message, to follow the stream state
            if not payload or payload[0] not in _CHANGE_CODES:
                yield event
                continue
            result = self.filter.apply(message)
            if result is None:
                self.dropped += 1
                continue
            if result is message:
                yield event
                continue
            self.transformed += 1
            yield WalData(event.data_start, event.wal_end, encoder.encode(result))


_RELATION_QUERY = """
SELECT c.oid::int, c.relreplident::text,
       coalesce(ri.indkey::int2[], '{}') AS key_columns
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN LATERAL (
    SELECT i.indkey FROM pg_catalog.pg_index i
    WHERE i.indrelid = c.oid
      AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))
    LIMIT 1
) ri ON true
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""

_COLUMNS_QUERY = """
SELECT a.attnum::int, a.attname::text, a.atttypid::int, a.atttypmod
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""


def relation_from_catalog(conn: psycopg.Connection[Any], namespace: str, name: str) -> Relation:
    """The Relation message pgoutput would send for a table now, built from the catalog."""
    row = conn.execute(_RELATION_QUERY, (namespace, name)).fetchone()
    if row is None:
        raise LookupError(
            f"table {namespace}.{name} does not exist (or is not a table): check the name in "
            "the row filter"
        )
    relid, ident, key_columns = row
    keys = set(key_columns or ())
    columns = tuple(
        Column(
            flags=1 if (ident == "f" or attnum in keys) else 0,
            name=attname,
            type_id=typid,
            type_modifier=typmod,
        )
        for attnum, attname, typid, typmod in conn.execute(_COLUMNS_QUERY, (relid,))
    )
    return Relation(None, relid, namespace, name, ident, columns)


def check_filters(
    conn: psycopg.Connection[Any],
    filters: dict[str, list[str]],
    *,
    collation: str,
    registry: Any = None,
) -> None:
    """Bind every filter to its table as it is now, so bad filters fail before streaming.

    Raises the filter's error (``RowFilterError`` subclasses, with PostgreSQL's wording) or
    LookupError for a table that does not exist. A filter on columns outside the replica
    identity passes, as CREATE PUBLICATION accepts it: like the server, which then refuses
    the table's UPDATE and DELETE statements, StreamFilter fails at the first UPDATE or DELETE
    of the table (an insert-only table's filter just works).
    """
    for table, exprs in filters.items():
        namespace, _, name = table.partition(".")
        relation = relation_from_catalog(conn, namespace, name)
        collations = column_collations(conn, namespace, name)
        for expr in exprs:
            RowFilter.parse(expr).bind(
                relation,
                registry,
                publishes_update_or_delete=False,
                collation=collation,
                column_collations=collations,
            )
