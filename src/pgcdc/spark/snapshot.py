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
with the ``rowFilter.<table>`` options. Each one, the server's printed filters too, is parsed by
``pgcdc.filters`` on the driver and only its printed-back parse tree goes into the query.

Rows come out in the stream's schema: ``_op`` 'I', ``_commit_lsn`` and ``_end_lsn`` the
consistent point, ``_position`` -1 (before any streamed change at the same LSN), ``_xid`` and
``_commit_time`` null. The COPY's tuples are decoded by the stream's columnar decoder
(``ColumnarDecoder.decode_copy``: the COPY binary format and pgoutput's binary values are both
the types' send functions), so both give exactly the same types and values. PostgreSQL sends
each tuple in a CopyData message of its own: psycopg2's C copy loop hands each one to
``CopyTuples.write`` (``pgcdc.replication.copy``), which only collects them, and they are framed
and decoded vectorised about 16 MB at a time; the row count is checked against the COPY's.
Columns of types the codec does not know are copied as text.

``PgcdcSnapshotReader.copy`` hands a partition's record batches to a callback as they are
decoded (the lake's copy tasks write them to Parquet there); ``read``, the Data Source API's
generator, runs ``copy`` in a thread a few batches ahead.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pyarrow as pa
from psycopg import sql
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pgcdc.lsn import Lsn
from pgcdc.protocol.encoder import Encoder
from pgcdc.protocol.errors import CopyFormatError
from pgcdc.protocol.filter_sql import RowFilterSQL
from pgcdc.protocol.messages import Column, Relation
from pgcdc.protocol.values import TypeRegistry
from pgcdc.replication import slot_info
from pgcdc.replication.copy import CopyConnection, StatementError
from pgcdc.replication.database import (
    UNLIMITED_TRANSACTION,
    connect_sql,
    with_codec_settings,
    without_time_limits,
)
from pgcdc.spark.catalog import CatalogTable, SourceCatalog, relation_scope
from pgcdc.spark.decode import ChangeDecoder, Label
from pgcdc.spark.diagnostics import worker_logging
from pgcdc.spark.errors import CopyAgain, OptionError, SparkSourceError, unreadable_value
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


def _partition_pages(partition: SnapshotPartition, pages: int) -> int:
    """The pages of ``partition``'s range in a table of ``pages`` pages (as planned)."""
    first = partition.first_page or 0
    stop = pages if partition.stop_page is None else partition.stop_page
    return max(stop - first, 0)


def render_filter(text: str) -> RowFilterSQL:
    """A user's row filter, parsed and printed back by ``pgcdc.filters``: the copy query
    carries that rendering, never the text."""
    from pgcdc.filters import RowFilter, RowFilterError  # on the driver only

    try:
        return RowFilter.parse(text).sql()
    except RowFilterError as exc:
        raise OptionError(
            f"row filter {text!r} is not a valid publication row filter: {exc}",
            "write an SQL boolean expression over the table's columns, as in "
            "CREATE PUBLICATION ... WHERE (...)",
        ) from None


class CopyTuples(Generic[_T]):
    """A ``COPY ... TO STDOUT (FORMAT binary)`` stream, decoded about ``chunk_bytes`` at a time.

    ``write`` takes each CopyData message's bytes as it comes (``CopyConnection.copy_out`` calls
    it from C for every message: it only collects), ``close`` ends the stream. ``decode`` gets
    lists of whole tuples (``ColumnarDecoder.decode_copy``'s input) and raises
    ``CopyFormatError`` for an element that is not exactly one tuple; its results go to
    ``emit``. The file header is checked and cut off the first block, the trailer checked and
    dropped.

    PostgreSQL sends every tuple in a CopyData message of its own, so the blocks go to
    ``decode`` as they come; ``decode`` checks each one (vectorised). Should they not be one
    tuple each (another server, a proxy), the blocks are cut into tuples here, one at a time,
    from that list on.
    """

    __slots__ = (
        "_aligned",
        "_chunk_bytes",
        "_decode",
        "_done",
        "_emit",
        "_ended",
        "_header",
        "_ncols",
        "_pending",
        "_rest",
        "_size",
        "_started",
    )

    def __init__(
        self,
        ncols: int,
        decode: Callable[[list[bytes]], _T],
        emit: Callable[[_T], object],
        *,
        chunk_bytes: int = 16 << 20,
    ) -> None:
        self._ncols = ncols
        self._decode = decode
        self._emit = emit
        self._chunk_bytes = chunk_bytes
        self._pending: list[bytes] = []
        self._size = 0
        self._header = b""
        self._started = False
        self._aligned = True
        self._done = 0  # tuples decoded
        self._ended = False
        self._rest = b""

    def write(self, block: bytes) -> None:
        self._pending.append(block)
        self._size += len(block)
        if self._size >= self._chunk_bytes:
            self._flush()

    def close(self) -> None:
        self._flush()
        if not self._ended:
            raise SparkSourceError(
                "COPY ended without its trailer"
                + (" (in the middle of a tuple)" if self._rest else ""),
                "see the server log; copy again",
            )

    def _flush(self) -> None:
        pending, self._pending, self._size = self._pending, [], 0
        if not self._started:
            pending = self._after_header(pending)
        if pending:
            self._chunk(pending)

    def _after_header(self, blocks: list[bytes]) -> list[bytes]:
        """``blocks`` without the file header, once it is complete (kept until then)."""
        for i, block in enumerate(blocks):
            self._header += block
            if len(self._header) < _HEADER.size:
                continue
            signature, _flags, extension = _HEADER.unpack_from(self._header)
            if signature != _SIGNATURE:
                raise SparkSourceError("COPY did not return its binary format", "report a bug")
            if len(self._header) < _HEADER.size + extension:
                continue
            first = self._header[_HEADER.size + extension :]
            self._started = True
            self._header = b""
            return ([first] if first else []) + blocks[i + 1 :]
        return []

    def _chunk(self, chunk: list[bytes]) -> None:
        if self._ended:
            if any(chunk):
                raise SparkSourceError("COPY sent data after its trailer", "report a bug")
            return
        if self._aligned:
            body = chunk
            if chunk[-1] == _TRAILER:  # in whole tuples, only the trailer is this
                body = chunk[:-1]
            try:
                results = [self._decode(body)] if body else []
            except CopyFormatError as exc:
                # blocks that are not one tuple each, or a bad value (which the sequential
                # path then reports)
                log.debug("COPY blocks refused (%s): cutting them into tuples one by one", exc)
                self._aligned = False
            else:
                self._ended = body is not chunk
                self._done += len(body)
                for result in results:
                    self._emit(result)
                return
        data = self._rest + b"".join(chunk)
        tuples, used, self._ended = split_copy_tuples(data, self._ncols)
        left = data[used:]
        if self._ended and left:
            raise SparkSourceError("COPY sent data after its trailer", "report a bug")
        self._rest = left
        if tuples:
            try:
                decoded = self._decode(tuples)
            except CopyFormatError as exc:  # numbered from the start of the COPY
                raise CopyFormatError(
                    self._done + exc.row, exc.offset, exc.reason, exc.column
                ) from None
            self._done += len(tuples)
            self._emit(decoded)


def copy_tuples(
    blocks: Iterable[bytes],
    ncols: int,
    decode: Callable[[list[bytes]], _T],
    *,
    chunk_bytes: int = 16 << 20,
) -> Iterator[_T]:
    """``CopyTuples`` over an iterable of blocks: the decoded chunks, as they come."""
    results: list[_T] = []
    tuples = CopyTuples(ncols, decode, results.append, chunk_bytes=chunk_bytes)
    for block in blocks:
        tuples.write(block)
        if results:
            yield from results
            results.clear()
    tuples.close()
    yield from results


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
    pgcdc cannot read the type's binary form. A column read as text whose binary form pgcdc
    reads is not cast: the stream's renderer prints it (``::text`` trims a char(n), and adds
    an inet's netmask, where the output function does not)."""
    casts = {}
    for i, column in enumerate(table.columns):
        if codec_knows(column.type_oid, registry):
            continue
        info = registry.resolve(column.type_oid)
        array = info is not None and info.kind == "array" and not column.as_text
        casts[i] = "text[]" if array else "text"
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
        # a RowFilterSQL: printed by pgcdc.filters from its parse tree, not text as given
        conditions.append(sql.SQL("({})").format(sql.SQL(table.row_filter.text)))
    where = (
        sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(conditions))
        if conditions
        else sql.SQL("")
    )
    return sql.SQL("COPY (SELECT {} FROM {}{}{}) TO STDOUT (FORMAT binary)").format(
        _select_list(table, registry),
        relation_scope(table.relkind),
        sql.Identifier(table.schema, table.name),
        where,
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
        result: list[SnapshotPartition] = []
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
        # largest first: Spark starts tasks in partition order, so a large table's ranges at
        # the end would leave the other cores idle while they run (a stable sort keeps each
        # table's ranges in page order)
        sizes = {t.relid: max(t.pages, 1) for t in self.catalog.tables}
        result.sort(key=lambda p: -_partition_pages(p, sizes[p.relid]))
        log.info(
            "snapshot of %d tables in %d partitions (snapshot %s, consistent point %s)",
            len(self.catalog.tables),
            len(result),
            settings.snapshot,
            self.consistent_point,
        )
        return result

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's record batches (the Data Source API's read): ``copy`` in a thread,
        at most two batches ahead of the caller; closing the generator stops the copy."""
        yield from _generate(lambda emit: self.copy(partition, emit))

    def copy(self, partition: InputPartition, emit: Callable[[pa.RecordBatch], object]) -> int:
        """Copy one partition, handing ``emit`` its record batches as they are decoded (about
        16 MB of tuples each); the number of rows. An exception raised by ``emit`` ends the
        copy and propagates."""
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
            return 0
        label = Label(int(self.consistent_point), int(self.consistent_point), None, None)
        query = copy_query(table, partition, registry)
        texts = text_columns(table, registry)
        rows = 0

        def decode(tuples: list[bytes]) -> pa.RecordBatch | None:
            return decoder.decode_copy(table.relid, tuples, label, texts)

        def counted(batch: pa.RecordBatch | None) -> None:
            nonlocal rows
            if batch is not None:
                rows += batch.num_rows
                emit(batch)

        # text-form columns (types the codec has no binary reader for) print as it reads them
        dsn = without_time_limits(with_codec_settings(self.settings.dsn))
        with CopyConnection(dsn) as conn:
            try:
                conn.execute(UNLIMITED_TRANSACTION)
                conn.execute("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if self.settings.snapshot:
                    conn.execute(
                        sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                            sql.Literal(self.settings.snapshot)
                        )
                    )
                    _check_not_rewritten(conn, table, partition, self.settings.dsn)
                _check_same_columns(conn, table)
                tuples = CopyTuples(len(table.columns), decode, counted)
                sent = conn.copy_out(query, tuples.write)
                tuples.close()
                if sent >= 0 and sent != rows:
                    raise SparkSourceError(
                        f"COPY of {table.qualified} sent {sent} rows but {rows} were read",
                        "report a bug",
                    )
                conn.execute("COMMIT")
            except StatementError as exc:
                raise _copy_error(exc, table, self.settings) from None
            except CopyFormatError as exc:
                if exc.column is not None:
                    raise unreadable_value(exc.column, exc.reason) from None
                raise SparkSourceError(
                    f"copying {table.qualified}: {exc}", "report a bug in pgcdc"
                ) from None
        log.info(
            "snapshot partition %d/%d of %s copied",
            partition.part + 1,
            partition.parts,
            table.qualified,
        )
        return rows


class _Stopped(Exception):
    """The consumer of ``_generate`` went away: ends the producer's run."""


def _generate(run: Callable[[Callable[[_T], None]], object], ahead: int = 2) -> Iterator[_T]:
    """What ``run`` hands its callback, as a generator: ``run`` runs in a thread, at most
    ``ahead`` items ahead of the caller; its exception is raised here; closing the generator
    makes the callback raise (so ``run`` ends) and waits for the thread."""
    items: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def put(item: tuple[bool, Any]) -> None:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stopped

    def produce() -> None:
        try:
            run(lambda item: put((False, item)))
        except _Stopped:
            return
        except BaseException as exc:
            with contextlib.suppress(_Stopped):
                put((True, exc))
            return
        with contextlib.suppress(_Stopped):
            put((True, None))

    thread = threading.Thread(target=produce, name="pgcdc-snapshot-copy", daemon=True)
    thread.start()
    try:
        while True:
            done, value = items.get()
            if not done:
                yield value
                continue
            if value is not None:
                raise value
            return
    finally:
        stop.set()
        thread.join()


#: Heap files (of the table, or of its partitions) replaced since the snapshot: pg_class as the
#: snapshot sees it against the current catalog (pg_relation_filenode)
_REWRITTEN_SQL = sql.SQL(
    "SELECT count(*) FROM pg_catalog.pg_class c WHERE (c.oid = {relid}::oid OR c.oid IN "
    "(SELECT relid FROM pg_catalog.pg_partition_tree({relid}::oid::regclass))) "
    "AND c.relfilenode <> 0 "
    "AND pg_catalog.pg_relation_filenode(c.oid) IS DISTINCT FROM c.relfilenode"
)


#: The columns of the table and its partitions, by a recursive walk of pg_inherits, which
#: locks nothing (pg_partition_tree locks every partition: on a second connection that waited
#: for a TRUNCATE of one, which waited for this copy, which waited for it)
_COLUMNS_SQL = sql.SQL(
    "WITH RECURSIVE tree(relid) AS (SELECT {relid}::oid UNION "
    "SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.relid) "
    "SELECT a.attrelid::bigint, a.attnum, a.atttypid::bigint, a.atttypmod, a.attisdropped "
    "FROM pg_catalog.pg_attribute a JOIN tree ON a.attrelid = tree.relid WHERE a.attnum > 0 "
    "ORDER BY 1, 2"
)


def _check_not_rewritten(
    conn: CopyConnection, table: CatalogTable, partition: SnapshotPartition, dsn: str
) -> None:
    """Fail with ``CopyAgain`` where a heap replaced after the snapshot (the table's or a
    partition's) would make this copy miss or double rows; the lock keeps it from happening
    later, until this range's copy ends.

    * A column change (``ALTER TABLE ... TYPE``, a volatile ``DEFAULT``) gives every row a new
      xmin: the snapshot sees the table empty, and the stream carries none of them. The columns
      as the snapshot sees them are compared with the current catalog, read on a new
      connection while this transaction holds the lock.
    * ``VACUUM FULL`` and ``CLUSTER`` keep the rows visible but move them: one range reads
      them whole, but the page ranges read before and after the move miss some and read
      others twice.
    * ``TRUNCATE`` leaves no row the snapshot sees: copying it through is right, as the
      streamed TRUNCATE (after the consistent point) removes the rows other ranges copied.
      pg_repack looks the same from here and cannot be told apart (see the README).
    """
    name = sql.Identifier(table.schema, table.name)
    scope = relation_scope(table.relkind)  # not an inheritance parent's children
    conn.execute(sql.SQL("LOCK TABLE {}{} IN ACCESS SHARE MODE").format(scope, name))
    relid = sql.Literal(table.relid)
    ((rewritten,),) = conn.execute(_REWRITTEN_SQL.format(relid=relid))
    if not rewritten:
        return
    then = [tuple(row) for row in conn.execute(_COLUMNS_SQL.format(relid=relid))]
    with CopyConnection(without_time_limits(dsn)) as current:
        now = [tuple(row) for row in current.execute(_COLUMNS_SQL.format(relid=relid))]
    if then != now:
        raise CopyAgain(
            f"{table.qualified} was rewritten by a column change (ALTER TABLE changing a "
            "column's type or adding one with a volatile default) after the snapshot was "
            "taken: a copy in that snapshot would miss its rows",
            "copy again with a new snapshot (pgcdc run does so on its next start); avoid such "
            "DDL while the initial copy runs",
        )
    ranged = partition.first_page is not None or partition.stop_page is not None
    if ranged:
        visible = sql.SQL("SELECT EXISTS (SELECT 1 FROM {}{})").format(scope, name)
        ((moved,),) = conn.execute(visible)
        if moved:
            raise CopyAgain(
                f"{table.qualified} was rewritten after the snapshot was taken (VACUUM FULL or "
                "CLUSTER): its rows moved between the page ranges the copy reads, so it would "
                "miss some and read others twice",
                "copy again with a new snapshot (pgcdc run does so on its next start); avoid "
                "VACUUM FULL and CLUSTER of published tables while the initial copy runs",
            )
    log.info(
        "%s was rewritten without column changes (TRUNCATE%s) after the snapshot: copying it "
        "as the snapshot sees it",
        table.qualified,
        "" if ranged else ", VACUUM FULL, CLUSTER",
    )


def _check_same_columns(conn: CopyConnection, table: CatalogTable) -> None:
    """Fail with ``CopyAgain`` when a column name no longer names the column the catalog was
    read with (renamed since, say two names swapped): the COPY selects by name and reads
    binary values by the catalog's types, so it would put one column's values under the other
    (an int4 and a float4 have the same width). Its lock keeps the names until the COPY ends."""
    known = [c for c in table.columns if c.attnum]
    if not known:
        return
    probe = sql.SQL("SELECT {} FROM {}{} WHERE false").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in known),
        relation_scope(table.relkind),
        sql.Identifier(table.schema, table.name),
    )
    found = conn.result_columns(probe)
    expected = [(table.relid, c.attnum) for c in known]
    if found != expected:
        raise CopyAgain(
            f"columns of {table.qualified} were renamed (or dropped and added again) after "
            "the query read the catalog: a copy by their names would read other columns",
            "copy again with a new snapshot (pgcdc run does so on its next start); avoid "
            "renaming columns of published tables while the initial copy runs",
        )


#: SQLSTATEs of a COPY whose columns changed since the snapshot: undefined_column,
#: datatype_mismatch
_COLUMNS_CHANGED = frozenset({"42703", "42804"})


def _copy_error(exc: StatementError, table: CatalogTable, settings: SnapshotSettings) -> Exception:
    text = exc.cause
    if exc.sqlstate in _COLUMNS_CHANGED:
        return CopyAgain(
            f"{table.qualified} changed its columns during the initial copy ({text})",
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
