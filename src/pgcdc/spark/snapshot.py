"""The snapshot reader: ``spark.read.format("pgcdc")`` copies tables in parallel, consistently.

Every table is split into ranges of heap pages (by its current size: ``partitionsPerTable``, or
one partition per ``targetPartitionBytes``; the last range is open-ended, so rows on pages added
since planning are not missed). Each executor task opens its own connection and transaction
(``REPEATABLE READ, READ ONLY``), imports the snapshot the slot exported when it was created
(``SET TRANSACTION SNAPSHOT``), and copies its range:
``COPY (SELECT <published columns> FROM t WHERE ctid >= '(a,0)' AND ctid < '(b,0)' AND
(<row filter>)) TO STDOUT (FORMAT binary)``. All tasks therefore see the database exactly as of
the slot's consistent point: together with the stream, which starts at that point, there is no
gap and no duplicate.

Row filter: the OR of the filters of the publications that publish the table (none if one of
them publishes it unfiltered, as the initial synchronisation of a subscription does), OR-ed
with the ``rowFilter.<table>`` options.

Rows come out in the stream's schema: ``_op`` 'I', ``_commit_lsn`` and ``_end_lsn`` the
consistent point, ``_position`` -1 (before any streamed change at the same LSN), ``_xid`` and
``_commit_time`` null. Each COPY row becomes a pgoutput Insert message with binary values (the
COPY binary format and pgoutput's binary values are both the types' send functions), decoded by
the same columnar decoder as the stream, so both give exactly the same types and values.
Columns of types the codec does not know are copied as text.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pgcdc.lsn import Lsn
from pgcdc.protocol.encoder import Encoder
from pgcdc.protocol.messages import Column, Relation
from pgcdc.protocol.values import TypeRegistry
from pgcdc.replication import slot_info
from pgcdc.replication.database import connect_sql
from pgcdc.spark.catalog import CatalogTable, SourceCatalog
from pgcdc.spark.decode import ChangeDecoder, Label, decode_transactions
from pgcdc.spark.diagnostics import worker_logging
from pgcdc.spark.errors import (
    COLUMNS_CHANGED_MARKER,
    REWRITTEN_MARKER,
    OptionError,
    SparkSourceError,
)
from pgcdc.spark.options import SnapshotSettings
from pgcdc.spark.schema import codec_knows, registry_for

__all__ = ["PgcdcSnapshotReader", "SnapshotPartition", "copy_messages", "render_filter"]

log = logging.getLogger("pgcdc.spark")

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = struct.Struct("!11sii")
_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_NULL = b"n"
_BINARY = b"b"
_TEXT = b"t"


@dataclass(frozen=True, slots=True)
class SnapshotPartition(InputPartition):
    """One page range of one table."""

    relid: int
    first_page: int | None  # None: from the start
    stop_page: int | None  # None: to the end
    part: int
    parts: int


def render_filter(text: str) -> str:
    """A user's row filter, checked and printed by ``pgcdc.filters`` (when available)."""
    try:
        from pgcdc.filters import RowFilter, RowFilterError
    except ImportError:  # pragma: no cover - the filters package is part of pgcdc
        return text
    try:
        return RowFilter.parse(text).to_sql()
    except RowFilterError as exc:
        raise OptionError(
            f"row filter {text!r} is not a valid publication row filter: {exc}",
            "write an SQL boolean expression over the table's columns, as in "
            "CREATE PUBLICATION ... WHERE (...)",
        ) from None


def copy_messages(
    blocks: Iterable[bytes | memoryview],
    relid: int,
    ncols: int,
    text_columns: Collection[int] = (),
) -> Iterator[bytes]:
    """pgoutput Insert messages (binary values) from a ``COPY ... (FORMAT binary)`` stream.

    ``text_columns``: the (0-based) columns the COPY casts to ``text`` (types pgcdc only reads
    as text): text's binary form is its text, so they become text-format ('t') values."""
    prefix = b"I" + relid.to_bytes(4, "big") + b"N" + ncols.to_bytes(2, "big")
    kinds = [_TEXT if i in text_columns else _BINARY for i in range(ncols)]
    buffer = bytearray()
    position = 0
    started = False
    unpack16 = _I16.unpack_from
    unpack32 = _I32.unpack_from
    finished = False
    for block in blocks:
        if finished:
            continue  # drain the stream to its end, so that the COPY completes
        buffer += block
        if not started:
            if len(buffer) < _HEADER.size:
                continue
            signature, _flags, extension = _HEADER.unpack_from(buffer)
            if signature != _SIGNATURE:
                raise SparkSourceError("COPY did not return its binary format", "report a bug")
            if len(buffer) < _HEADER.size + extension:
                continue
            position = _HEADER.size + extension
            started = True
        size = len(buffer)
        while size - position >= 2:
            (count,) = unpack16(buffer, position)
            if count == -1:
                finished = True
                break
            if count != ncols:
                raise SparkSourceError(
                    f"COPY returned a row of {count} columns, expected {ncols}", "report a bug"
                )
            at = position + 2
            parts = [prefix]
            complete = True
            for kind in kinds:
                if at + 4 > size:
                    complete = False
                    break
                (length,) = unpack32(buffer, at)
                if length < 0:
                    parts.append(_NULL)
                    at += 4
                    continue
                stop = at + 4 + length
                if stop > size:
                    complete = False
                    break
                parts.append(kind)
                parts.append(bytes(buffer[at:stop]))
                at = stop
            if not complete:
                break
            yield b"".join(parts)
            position = at
        del buffer[:position]
        position = 0


def _text_casts(table: CatalogTable, registry: TypeRegistry) -> dict[int, str]:
    """The columns (by position) the COPY casts: to ``text``, or ``text[]`` for arrays, where
    pgcdc cannot read the type's binary form."""
    casts = {}
    for i, column in enumerate(table.columns):
        if codec_knows(column.type_oid, registry):
            continue
        info = registry.resolve(column.type_oid)
        casts[i] = "text[]" if info is not None and info.kind == "array" else "text"
    return casts


def text_columns(table: CatalogTable, registry: TypeRegistry) -> frozenset[int]:
    """The columns whose COPY value is plain text (``copy_messages``' ``text_columns``)."""
    return frozenset(i for i, cast in _text_casts(table, registry).items() if cast == "text")


def _select_list(table: CatalogTable, registry: TypeRegistry) -> sql.Composable:
    casts = _text_casts(table, registry)
    items: list[sql.Composable] = []
    for i, column in enumerate(table.columns):
        ident = sql.Identifier(column.name)
        if i in casts:
            items.append(sql.SQL("{}::{}").format(ident, sql.SQL(casts[i])))
        else:
            items.append(ident)
    return sql.SQL(", ").join(items) if items else sql.SQL("")


def copy_query(
    table: CatalogTable, partition: SnapshotPartition, registry: TypeRegistry
) -> sql.Composed:
    conditions: list[sql.Composable] = []
    if partition.first_page is not None:
        conditions.append(
            sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({partition.first_page},0)"))
        )
    if partition.stop_page is not None:
        conditions.append(
            sql.SQL("ctid < {}::tid").format(sql.Literal(f"({partition.stop_page},0)"))
        )
    if table.row_filter is not None:
        conditions.append(sql.SQL("({})").format(sql.SQL(table.row_filter)))
    where = (
        sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(conditions))
        if conditions
        else sql.SQL("")
    )
    return sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT (FORMAT binary)").format(
        _select_list(table, registry), sql.Identifier(table.schema, table.name), where
    )


class PgcdcSnapshotReader(DataSourceReader):
    """See the module doc."""

    def __init__(
        self,
        settings: SnapshotSettings,
        catalog: SourceCatalog,
        schema: StructType,
        consistent_point: Lsn,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.schema = schema
        self.consistent_point = consistent_point

    @staticmethod
    def resolve_consistent_point(settings: SnapshotSettings) -> Lsn:
        if settings.consistent_point is not None:
            return settings.consistent_point
        if settings.slot:
            with connect_sql(settings.dsn) as conn:
                info = slot_info(conn, settings.slot)
            if info is None or info.confirmed_flush_lsn is None:
                raise OptionError(
                    f"replication slot {settings.slot!r} does not exist",
                    "fix the 'slot' option, or give consistentPoint",
                )
            return info.confirmed_flush_lsn
        with connect_sql(settings.dsn) as conn:
            row = conn.execute("SELECT pg_catalog.pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(str(row[0]))

    def partitions(self) -> Sequence[InputPartition]:
        settings = self.settings
        result: list[InputPartition] = []
        for table in self.catalog.tables:
            pages = table.pages
            if settings.partitions_per_table is not None:
                count = settings.partitions_per_table
            else:
                count = -(-table.size_bytes // settings.target_partition_bytes)
            count = max(1, min(count, pages))
            if count == 1:
                result.append(SnapshotPartition(table.relid, None, None, 0, 1))
                continue
            step = -(-pages // count)
            bounds = list(range(0, pages, step))
            count = len(bounds)
            for k, first in enumerate(bounds):
                stop = bounds[k + 1] if k + 1 < count else None
                result.append(SnapshotPartition(table.relid, first if k else None, stop, k, count))
        log.info(
            "snapshot of %d tables in %d partitions (snapshot %s, consistent point %s)",
            len(self.catalog.tables),
            len(result),
            settings.snapshot,
            self.consistent_point,
        )
        return result

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SnapshotPartition):
            raise SparkSourceError(f"unexpected partition {partition!r}", "report a pgcdc bug")
        worker_logging()
        table = next(t for t in self.catalog.tables if t.relid == partition.relid)
        registry = registry_for(self.catalog)
        decoder = ChangeDecoder(self.catalog, self.schema, 1, fixed_position=-1)
        relation = Relation(
            None,
            table.relid,
            table.schema,
            table.name,
            table.replica_identity,
            tuple(
                Column(1 if c.key else 0, c.name, c.type_oid, c.type_modifier)
                for c in table.columns
            ),
        )
        decoder.prelude([Encoder(1).encode(relation)])
        if not table.columns:
            return
        label = Label(int(self.consistent_point), int(self.consistent_point), None, None)
        query = copy_query(table, partition, registry)
        with connect_sql(self.settings.dsn) as conn:
            try:
                conn.execute("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if self.settings.snapshot:
                    conn.execute(
                        sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                            sql.Literal(self.settings.snapshot)
                        )
                    )
                    _check_not_rewritten(conn, table, self.settings.dsn)
                with conn.cursor().copy(query) as copy:
                    messages = copy_messages(
                        _blocks(copy),
                        table.relid,
                        len(table.columns),
                        text_columns(table, registry),
                    )
                    yield from decode_transactions(decoder, [(label, False, 0, messages)])
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                raise _copy_error(exc, table, self.settings) from None
        log.info(
            "snapshot partition %d/%d of %s copied",
            partition.part + 1,
            partition.parts,
            table.qualified,
        )


#: Heap files (of the table, or of its partitions) replaced since the snapshot: pg_class as the
#: snapshot sees it against the current catalog (pg_relation_filenode)
_REWRITTEN_SQL = sql.SQL(
    "SELECT count(*) FROM pg_catalog.pg_class c WHERE (c.oid = {relid}::oid OR c.oid IN "
    "(SELECT relid FROM pg_catalog.pg_partition_tree({relid}::oid::regclass))) "
    "AND c.relfilenode <> 0 "
    "AND pg_catalog.pg_relation_filenode(c.oid) IS DISTINCT FROM c.relfilenode"
)


#: The columns of the table and its partitions (as the query's snapshot sees the catalog)
_COLUMNS_SQL = sql.SQL(
    "SELECT a.attrelid::bigint, a.attnum, a.atttypid::bigint, a.atttypmod, a.attisdropped "
    "FROM pg_catalog.pg_attribute a WHERE a.attnum > 0 AND (a.attrelid = {relid}::oid OR "
    "a.attrelid IN (SELECT relid FROM pg_catalog.pg_partition_tree({relid}::oid::regclass))) "
    "ORDER BY 1, 2"
)


def _check_not_rewritten(conn: psycopg.Connection[Any], table: CatalogTable, dsn: str) -> None:
    """Fail if the table was rewritten by a column change (``ALTER TABLE ... TYPE``, a volatile
    ``DEFAULT``) after the snapshot: its rows would look deleted to the snapshot, the stream
    carries no changes for them, and a copy would silently miss them. The lock keeps it from
    happening later, until this range's copy ends.

    A rewrite that leaves the columns as they were is safe to copy through: ``TRUNCATE``
    (the rows the snapshot no longer sees are exactly those the streamed TRUNCATE, which comes
    after the consistent point, removes), ``VACUUM FULL``, ``CLUSTER`` and ``SET TABLESPACE``
    (they keep every row's visibility). The columns as the snapshot sees them are compared with
    the current catalog, read on a new connection while this transaction holds the lock.
    """
    name = sql.Identifier(table.schema, table.name)
    conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(name))
    relid = sql.Literal(table.relid)
    row = conn.execute(_REWRITTEN_SQL.format(relid=relid)).fetchone()
    if row is None or not row[0]:
        return
    then = conn.execute(_COLUMNS_SQL.format(relid=relid)).fetchall()
    with connect_sql(dsn) as current:
        now = current.execute(_COLUMNS_SQL.format(relid=relid)).fetchall()
    if then == now:
        log.info(
            "%s was rewritten without column changes (TRUNCATE, VACUUM FULL, CLUSTER) after "
            "the snapshot: copying it as the snapshot sees it",
            table.qualified,
        )
        return
    raise SparkSourceError(
        f"{table.qualified} {REWRITTEN_MARKER} (ALTER TABLE changing a column's "
        "type or adding one with a volatile default) after the snapshot was taken: a copy in "
        "that snapshot would miss its rows",
        "copy again with a new snapshot (pgcdc run does so on its next start); avoid such DDL "
        "while the initial copy runs",
    )


def _blocks(copy: Any) -> Iterator[bytes]:
    for block in copy:
        yield bytes(block)


def _copy_error(exc: psycopg.Error, table: CatalogTable, settings: SnapshotSettings) -> Exception:
    text = str(exc).strip()
    if isinstance(exc, psycopg.errors.UndefinedColumn | psycopg.errors.DatatypeMismatch):
        return SparkSourceError(
            f"{table.qualified} {COLUMNS_CHANGED_MARKER} ({text})",
            "copy again with a new snapshot (pgcdc run does so by itself); avoid such DDL "
            "while the initial copy runs",
        )
    if settings.snapshot and "snapshot" in text.lower():
        return SparkSourceError(
            f"cannot import snapshot {settings.snapshot!r} to copy {table.qualified}: {text}",
            "keep the ExportedSnapshot (its replication connection) open, idle, until the whole "
            "snapshot read is finished",
        )
    return SparkSourceError(f"copying {table.qualified} failed: {text}", "see the server log")
