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
``_commit_time`` null. The COPY's tuples are decoded by the stream's columnar decoder
(``ColumnarDecoder.decode_copy``: the COPY binary format and pgoutput's binary values are both
the types' send functions), so both give exactly the same types and values. PostgreSQL sends
each tuple in a CopyData message of its own, so tuples are framed vectorised, many at once
(``copy_tuples``), and the row count is checked against the COPY's. Columns of types the codec
does not know are copied as text.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import pyarrow as pa
from psycopg import sql
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pgcdc.lsn import Lsn
from pgcdc.protocol.encoder import Encoder
from pgcdc.protocol.errors import CopyFormatError
from pgcdc.protocol.messages import Column, Relation
from pgcdc.protocol.values import TypeRegistry
from pgcdc.replication import slot_info
from pgcdc.replication.database import connect_sql
from pgcdc.spark.catalog import CatalogTable, SourceCatalog
from pgcdc.spark.decode import ChangeDecoder, Label
from pgcdc.spark.diagnostics import worker_logging
from pgcdc.spark.errors import (
    COLUMNS_CHANGED_MARKER,
    REWRITTEN_MARKER,
    OptionError,
    SparkSourceError,
)
from pgcdc.spark.options import SnapshotSettings
from pgcdc.spark.schema import codec_knows, registry_for

__all__ = [
    "PgcdcSnapshotReader",
    "SnapshotPartition",
    "copy_tuples",
    "render_filter",
    "split_copy_tuples",
]

log = logging.getLogger("pgcdc.spark")

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = struct.Struct("!11sii")
_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_TRAILER = b"\xff\xff"
_T = TypeVar("_T")


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


def copy_tuples(
    blocks: Iterable[bytes],
    ncols: int,
    decode: Callable[[list[bytes]], _T],
    *,
    chunk_bytes: int = 16 << 20,
) -> Iterator[_T]:
    """Decode a ``COPY ... TO STDOUT (FORMAT binary)`` stream, about ``chunk_bytes`` at a time.

    ``decode`` gets lists of whole tuples (``ColumnarDecoder.decode_copy``'s input) and raises
    ``CopyFormatError`` for an element that is not exactly one tuple. The file header is checked
    and cut off the first block, the trailer checked and dropped.

    PostgreSQL sends every tuple in a CopyData message of its own, and the connection gives one
    message per block, so the blocks go to ``decode`` as they come; ``decode`` checks each one
    (vectorised). Should they not be one tuple each (another server, a proxy), the blocks are
    cut into tuples here, one at a time, from that list on.
    """
    pending: list[bytes] = []
    size = 0
    header = b""
    started = False
    aligned = True
    done = 0  # tuples decoded
    ended = False
    rest = b""

    def emit(chunk: list[bytes]) -> Iterator[_T]:
        nonlocal aligned, ended, rest, done
        if ended:
            if any(chunk):
                raise SparkSourceError("COPY sent data after its trailer", "report a bug")
            return
        if aligned:
            body = chunk
            if chunk and chunk[-1] == _TRAILER:  # in whole tuples, only the trailer is this
                body = chunk[:-1]
            try:
                results = [decode(body)] if body else []
            except CopyFormatError as exc:
                # blocks that are not one tuple each, or a bad value (which the sequential
                # path then reports)
                log.debug("COPY blocks refused (%s): cutting them into tuples one by one", exc)
                aligned = False
            else:
                ended = body is not chunk
                done += len(body)
                yield from results
                return
        data = rest + b"".join(chunk)
        tuples, used, ended = split_copy_tuples(data, ncols)
        data_left = data[used:]
        if ended and data_left:
            raise SparkSourceError("COPY sent data after its trailer", "report a bug")
        rest = data_left
        if tuples:
            try:
                result = decode(tuples)
            except CopyFormatError as exc:  # numbered from the start of the COPY
                raise CopyFormatError(done + exc.row, exc.offset, exc.reason) from None
            done += len(tuples)
            yield result

    for received in blocks:
        block = received
        if not started:
            header += received
            if len(header) < _HEADER.size:
                continue
            signature, _flags, extension = _HEADER.unpack_from(header)
            if signature != _SIGNATURE:
                raise SparkSourceError("COPY did not return its binary format", "report a bug")
            if len(header) < _HEADER.size + extension:
                continue
            block = header[_HEADER.size + extension :]
            started = True
            if not block:
                continue
        pending.append(block)
        size += len(block)
        if size >= chunk_bytes:
            yield from emit(pending)
            pending, size = [], 0
    yield from emit(pending)
    if not ended:
        raise SparkSourceError(
            "COPY ended without its trailer" + (" (in the middle of a tuple)" if rest else ""),
            "see the server log; copy again",
        )


def split_copy_tuples(data: bytes, ncols: int) -> tuple[list[bytes], int, bool]:
    """The whole tuples at the start of ``data`` (COPY binary tuples, one after the other), how
    many bytes they (and the trailer) take, and whether the trailer was reached."""
    tuples: list[bytes] = []
    position = 0
    size = len(data)
    unpack16 = _I16.unpack_from
    unpack32 = _I32.unpack_from
    while size - position >= 2:
        (count,) = unpack16(data, position)
        if count == -1:
            return tuples, position + 2, True
        if count != ncols:
            raise SparkSourceError(
                f"COPY returned a row of {count} columns, expected {ncols}", "report a bug"
            )
        at = position + 2
        for _ in range(ncols):
            if at + 4 > size:
                return tuples, position, False
            (length,) = unpack32(data, at)
            at += 4 + max(length, 0)
        if at > size:
            return tuples, position, False
        tuples.append(data[position:at])
        position = at
    return tuples, position, False


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
    """The columns whose COPY value is plain text (``text_columns`` of
    ``ColumnarDecoder.decode_copy``)."""
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
                texts = text_columns(table, registry)
                rows = 0
                with conn.cursor() as cursor:
                    with cursor.copy(query) as copy:
                        for batch in copy_tuples(
                            _blocks(copy),
                            len(table.columns),
                            lambda tuples: decoder.decode_copy(table.relid, tuples, label, texts),
                        ):
                            if batch is not None:
                                rows += batch.num_rows
                                yield batch
                    if cursor.rowcount >= 0 and cursor.rowcount != rows:
                        raise SparkSourceError(
                            f"COPY of {table.qualified} sent {cursor.rowcount} rows but "
                            f"{rows} were read",
                            "report a bug",
                        )
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                raise _copy_error(exc, table, self.settings) from None
            except CopyFormatError as exc:
                raise SparkSourceError(
                    f"copying {table.qualified}: {exc}", "report a bug in pgcdc"
                ) from None
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
