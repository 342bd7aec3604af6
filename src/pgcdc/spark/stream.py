"""The stream reader: ``spark.readStream.format("pgcdc")`` as a ``DataSourceStreamReader``.

Driver side (one long-lived Python worker per query runs ``initialOffset``, ``latestOffset``,
``partitions``, ``commit``, ...): on first use it starts the ``Receiver`` (the slot, streamed
into a local spool and indexed) and the ``DataEndpoint`` (serves spool ranges to executors).

Offsets are ``{"lsn": <commit LSN of the batch's last transaction>, "end_lsn": <its end LSN>}``
as ``X/XXXXXXXX`` text; a batch is every indexed transaction with ``start.lsn < commit LSN <=
end.lsn``, so it never splits a transaction. The initial offset is one below the slot's
confirmed position (or ``startLsn``): the slot streams transactions committing at or after it.

Exactly once: the slot is confirmed (with ``end_lsn``) only for batches Spark has committed:
in ``commit(end)``, and in ``latestOffset(start)``, which Spark calls only after writing the
commit log of the batch ending at ``start`` (Spark calls ``commit`` for a batch only when it
plans the next batch with data, which may never come: Trigger.AvailableNow, an idle stream).
The acknowledgement is sent before the method returns (Spark may kill the reader process at any
moment after). A restarted query re-reads from the slot, which is never ahead of Spark's last
committed batch, so an uncommitted batch (planned in Spark's offset log) is read again from the
same transactions, decoded from the same pgoutput messages: the same rows, in the same order,
with the same positions. ``partitions`` waits for the receiver to reach the batch's end first;
transactions at or below the start offset (sent again because the slot lagged) are skipped.

While the ``pauseFile`` option's file exists, ``latestOffset`` plans no batch (after confirming
the last committed one): a pipeline stopping between batches creates it, waits until no trigger
is active and stops the query, even when batches follow each other without a pause.

Read limits (Spark 4.2+): ``ReadMaxRows`` (``maxChangesPerTrigger``), ``ReadMaxBytes``
(``maxBytesPerTrigger``), ``ReadMinRows`` (``minChangesPerTrigger``, at most
``maxTriggerDelay`` late) and ``ReadAllAvailable``; every batch holds at least one whole
transaction. ``Trigger.AvailableNow``: ``prepareForTriggerAvailableNow`` records the server's
current WAL flush position; batches then only take transactions whose commit ends before it, and
``latestOffset`` waits until the receiver has reached it (or, with a row or byte limit, until
the next batch is full: it then runs while the rest is received), so the query stops exactly
when everything committed before the trigger has been processed.

Executor side (``read``): fetches the partition's ranges from the endpoint and decodes them
with ``pgcdc.spark.decode``.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pgcdc.lsn import Lsn
from pgcdc.protocol.decoder import Decoder
from pgcdc.protocol.message_types import MessageType, peek
from pgcdc.protocol.messages import Relation
from pgcdc.spark.catalog import CatalogTable, SourceCatalog, current_table
from pgcdc.spark.decode import ChangeDecoder, Label, decode_transactions
from pgcdc.spark.diagnostics import worker_logging
from pgcdc.spark.drift import Verdict, find_table, judge, mismatch, normalize
from pgcdc.spark.endpoint import DataEndpoint, fetch_messages
from pgcdc.spark.errors import OptionError, ReplayError, SparkSourceError
from pgcdc.spark.index import Definitions, TxnEntry
from pgcdc.spark.options import StreamSettings
from pgcdc.spark.schema import codec_knows, registry_for
from pgcdc.spark.spool import RECORD_HEADER

# The driver-side parts (the receiver, the slot and SQL helpers) import the replication layer
# where they run: the executors' Python workers import this module too, and importing psycopg
# and psycopg2 there took a tenth of a second or more of each worker's start.

__all__ = [
    "MIN_SPLIT_BYTES",
    "PgcdcStreamReader",
    "StreamPartition",
    "make_offset",
    "parse_offset",
    "partition_target",
]

log = logging.getLogger("pgcdc.spark")


#: ``minPartitions`` never makes an input partition smaller than this (bytes of pgoutput)
MIN_SPLIT_BYTES = 1 << 20


def partition_target(total: int, partition_bytes: int, min_partitions: int) -> int:
    """Bytes of pgoutput per input partition for a batch of ``total`` bytes: at most
    ``partition_bytes``, and small enough for ``min_partitions`` partitions, but not split
    below ``MIN_SPLIT_BYTES`` for them (a partition is closed once it reaches the target;
    transactions are never split, so a batch of one large transaction is still one
    partition)."""
    if min_partitions <= 1:
        return partition_bytes
    share = -(-total // min_partitions)
    return min(partition_bytes, max(share, MIN_SPLIT_BYTES))


def make_offset(commit_lsn: int, end_lsn: int) -> dict[str, str]:
    return {"lsn": str(Lsn(commit_lsn)), "end_lsn": str(Lsn(end_lsn))}


def parse_offset(offset: dict[str, Any]) -> tuple[Lsn, Lsn]:
    """``(commit_lsn, end_lsn)`` of an offset."""
    try:
        return Lsn.parse(str(offset["lsn"])), Lsn.parse(str(offset["end_lsn"]))
    except (KeyError, TypeError, ValueError):
        raise ReplayError(
            f"{offset!r} is not a pgcdc offset",
            "the checkpoint belongs to another source; use a new checkpoint location",
        ) from None


@dataclass(frozen=True, slots=True)
class StreamPartition(InputPartition):
    """What one executor task reads: whole transactions, and how to reach their data."""

    host: str
    port: int
    token: bytes
    proto_version: int
    transactions: tuple[TxnEntry, ...]
    definitions: tuple[bytes, ...]  # Type, then Relation messages in effect before the first
    verdicts: tuple[tuple[Relation, Verdict], ...]
    chunk_bytes: int


class _Runtime:
    """The driver-side state of one streaming query."""

    def __init__(self, settings: StreamSettings, catalog: SourceCatalog) -> None:
        from pgcdc.spark.receiver import Receiver, ReceiverSettings

        registry = registry_for(catalog)
        if settings.binary == "auto":
            # the skipped tables' too: their values are decoded (as text) before being dropped
            binary = all(
                codec_knows(c.type_oid, registry)
                for t in catalog.tables + catalog.skipped
                for c in t.columns
            )
        else:
            binary = settings.binary == "true"
        self.receiver = Receiver(
            ReceiverSettings(
                dsn=settings.dsn,
                slot=settings.slot,
                publications=settings.publications,
                binary=binary,
                spool_dir=settings.spool_dir,
                segment_bytes=settings.segment_bytes,
                receive_timeout=settings.receive_timeout,
                slot_wait=settings.slot_wait,
            )
        )
        self.endpoint = DataEndpoint(
            self.receiver.spool,
            bind_host=settings.bind_host,
            port=settings.port,
            advertise=settings.driver_host,
        )
        self._closed = False
        atexit.register(self.close)
        self._sigterm = _exit_on_sigterm()
        try:
            self.receiver.start()
            self.receiver.wait_connected(settings.slot_wait + 30)
        except BaseException:
            self.close()
            raise
        self.target: int | None = None  # Trigger.AvailableNow's WAL position
        self.last_batch = time.monotonic()
        log.info(
            "pgcdc stream on slot %s started (binary=%s, proto_version %d)",
            settings.slot,
            binary,
            self.receiver.proto_version,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._sigterm is not None and signal.getsignal(signal.SIGTERM) is self._sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.receiver.stop()
        self.endpoint.close()


def _exit_on_sigterm() -> Callable[[int, object], None] | None:
    """Spark ends the reader process with SIGTERM when the query stops, without calling
    ``stop()``: turn the signal into SystemExit so that the spool is deleted and the session
    closed (acknowledgements were sent already). Only where nobody handles SIGTERM yet; returns
    the handler installed."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    return handler


class PgcdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module doc."""

    def __init__(self, settings: StreamSettings, catalog: SourceCatalog, schema: StructType):
        self.settings = settings
        self.catalog = catalog
        self.schema = schema
        self._runtime: _Runtime | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_runtime"] = None  # driver-side threads and sockets never travel
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- driver side -----------------------------------------------------------------------
    def _rt(self) -> _Runtime:
        if self._runtime is None:
            self._runtime = _Runtime(self.settings, self.catalog)
        self._runtime.receiver.raise_if_failed()
        return self._runtime

    def initialOffset(self) -> dict[str, str]:
        start = self.settings.start_lsn
        if start is None:
            from pgcdc.replication import slot_info
            from pgcdc.replication.database import connect_sql

            with connect_sql(self.settings.dsn) as conn:
                info = slot_info(conn, self.settings.slot)
            if info is None or info.confirmed_flush_lsn is None:
                raise OptionError(
                    f"replication slot {self.settings.slot!r} does not exist (or is not a "
                    "logical slot)",
                    "create it (pgcdc.replication.create_slot_with_snapshot) or fix 'slot'",
                )
            start = info.confirmed_flush_lsn
        self._rt()  # start receiving now: the first batch comes sooner
        log.info("initial offset: transactions committing at or after %s", start)
        return make_offset(max(int(start) - 1, 0), int(start))

    def getDefaultReadLimit(self) -> ReadLimit:
        settings = self.settings
        if settings.max_rows is not None:
            return ReadMaxRows(settings.max_rows)
        if settings.max_bytes is not None:
            return ReadMaxBytes(settings.max_bytes)
        if settings.min_rows is not None:
            return ReadMinRows(settings.min_rows)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        from pgcdc.replication.database import connect_sql

        rt = self._rt()
        with connect_sql(self.settings.dsn) as conn:
            row = conn.execute(
                "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() "
                "THEN pg_catalog.pg_last_wal_replay_lsn() "
                "ELSE pg_catalog.pg_current_wal_flush_lsn() END::text"
            ).fetchone()
        assert row is not None
        rt.target = int(Lsn.parse(str(row[0])))
        log.info("Trigger.AvailableNow: reading transactions committed before %s", Lsn(rt.target))

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None, int | None]:
        if isinstance(limit, ReadAllAvailable):
            return None, None, None
        settings = self.settings
        max_rows, max_bytes, min_rows = settings.max_rows, settings.max_bytes, settings.min_rows
        if isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows if max_rows is None else min(max_rows, limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes if max_bytes is None else min(max_bytes, limit.max_bytes)
        elif isinstance(limit, ReadMinRows):
            min_rows = limit.min_rows
        return max_rows, max_bytes, min_rows

    def _wait_for_target(
        self, rt: _Runtime, start_lsn: int, max_rows: int | None, max_bytes: int | None
    ) -> None:
        """Wait until the receiver has reached Trigger.AvailableNow's target, or until the
        batch after ``start_lsn`` is full (cut by ``max_rows`` or ``max_bytes``; such a batch
        is final, so it can run while the rest is still being received)."""
        receiver = rt.receiver
        target = rt.target
        assert target is not None
        deadline = time.monotonic() + self.settings.available_now_timeout
        limited = max_rows is not None or max_bytes is not None
        indexed = -1
        with receiver.changed:
            while receiver.progress < target:
                receiver.raise_if_failed()
                index = receiver.index
                if limited and len(index) != indexed:  # a transaction was indexed
                    indexed = len(index)
                    _, stop, _, _ = index.select(
                        start_lsn, max_rows=max_rows, max_bytes=max_bytes, end_lsn_limit=target
                    )
                    if index.limited(stop, target):
                        return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SparkSourceError(
                        f"Trigger.AvailableNow: the stream did not reach {Lsn(target)} within "
                        f"{self.settings.available_now_timeout:g}s (at {Lsn(receiver.progress)})",
                        "raise availableNowTimeout, or check the server and the slot",
                    )
                receiver.changed.wait(min(remaining, 1.0))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        rt = self._rt()
        receiver = rt.receiver
        start_lsn, start_end = parse_offset(start)
        # Spark asks for the next batch only once the batch ending at ``start`` is committed
        # (its commit log written): acknowledge it now, since Spark calls commit() for a batch
        # only when it plans the next one with data, which may never come (AvailableNow)
        receiver.confirm_through(start_end, start_lsn)
        pause = self.settings.pause_file
        if pause is not None and os.path.exists(pause):
            return start  # a stop between batches: plan none (the previous one is confirmed)
        max_rows, max_bytes, min_rows = self._limits(limit)
        target = rt.target
        if target is not None:
            self._wait_for_target(rt, start_lsn, max_rows, max_bytes)
            min_rows = None
        index = receiver.index
        with receiver.changed:
            if target is None and not index.available(start_lsn)[1]:
                receiver.changed.wait(self.settings.idle_wait)  # no busy polling while idle
            receiver.raise_if_failed()
            if min_rows is not None:
                rows, _ = index.available(start_lsn)
                waited = time.monotonic() - rt.last_batch
                if rows < min_rows and waited < self.settings.max_trigger_delay:
                    return start
            first, stop, rows, nbytes = index.select(
                start_lsn, max_rows=max_rows, max_bytes=max_bytes, end_lsn_limit=target
            )
            if stop == first:
                return start
            offset = make_offset(index.commit_lsn(stop - 1), index.end_lsn(stop - 1))
        rt.last_batch = time.monotonic()
        log.info(
            "batch after %s: %d transactions, %d rows, %d bytes, up to %s",
            start_lsn,
            stop - first,
            rows,
            nbytes,
            offset["lsn"],
        )
        return offset

    def reportLatestOffset(self) -> dict[str, Any] | None:
        rt = self._runtime
        if rt is None:
            return None
        index = rt.receiver.index
        with rt.receiver.lock:
            if not len(index):
                return None
            return make_offset(index.commit_lsn(len(index) - 1), index.end_lsn(len(index) - 1))

    def _verdicts(
        self, relations: Sequence[Relation], cache: dict[int, CatalogTable | None]
    ) -> dict[Relation, Verdict]:
        tables = {t.relid: t for t in self.catalog.tables}
        verdicts: dict[Relation, Verdict] = {}
        for relation in relations:
            key = normalize(relation)
            if key in verdicts:
                continue
            if self.catalog.skips(key.relation_id, key.namespace, key.name):
                verdicts[key] = Verdict(f"{key.namespace}.{key.name}", None)  # rows dropped
                continue
            table = find_table(key, tables)
            if not mismatch(key, table):
                continue
            if key.relation_id not in cache:
                cache[key.relation_id] = current_table(
                    self.settings.dsn, key.relation_id, self.settings.publications
                )
            verdict = judge(key, table, cache[key.relation_id])
            verdicts[key] = verdict
            log.info(
                "stream describes %s differently from the query's schema: %s",
                verdict.table,
                verdict.changed or "no longer in the catalog, ignored",
            )
        return verdicts

    def _decode_definitions(self, payloads: Sequence[bytes], proto: int) -> list[Relation]:
        decoder = Decoder(proto)
        found = []
        for payload in payloads:
            if peek(payload, in_stream=False).kind == MessageType.RELATION:
                message = decoder.decode(payload)
                assert isinstance(message, Relation)
                found.append(message)
        return found

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        start_lsn, _ = parse_offset(start)
        end_lsn, end_end = parse_offset(end)
        if end_lsn <= start_lsn:
            return []
        rt = self._rt()
        receiver = rt.receiver
        index = receiver.index
        deadline = time.monotonic() + self.settings.replay_timeout
        with receiver.changed:
            while index.find(end_lsn) is None:
                receiver.raise_if_failed()
                if end_lsn <= receiver.skipped_through:
                    raise ReplayError(
                        f"the batch ending at transaction {end_lsn} was committed already",
                        "report this as a pgcdc bug: Spark plans committed batches only once",
                    )
                if receiver.progress >= end_end or index.last_commit_lsn > end_lsn:
                    raise ReplayError(
                        f"the batch ending at transaction {end_lsn} cannot be read again: the "
                        f"stream passed {Lsn(receiver.progress)} without it (the publication or "
                        "the slot changed since the batch was planned)",
                        "start the query on a new checkpoint, after copying the tables again",
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ReplayError(
                        f"the stream did not reach transaction {end_lsn} within "
                        f"{self.settings.replay_timeout:g}s (at {Lsn(receiver.progress)})",
                        "raise replayTimeout, or check the server and the slot",
                    )
                receiver.changed.wait(min(remaining, 1.0))
            first = index.after(start_lsn)
            stop = index.find(end_lsn)
            assert stop is not None
            stop += 1
            batch = [index.entry(i) for i in range(first, stop)]
            target = partition_target(
                sum(entry.spool_bytes for entry in batch),
                self.settings.partition_bytes,
                self.settings.min_partitions,
            )
            groups: list[tuple[list[TxnEntry], Definitions]] = []
            inline: list[bytes] = []
            size = 0
            for i, entry in enumerate(batch, start=first):
                inline.extend(index.inline_relations(i))
                if not groups or size >= target:
                    groups.append(([], index.definitions_before(i)))
                    size = 0
                groups[-1][0].append(entry)
                size += entry.spool_bytes
        proto = receiver.proto_version
        relations = self._decode_definitions(inline, proto)
        for _, definitions in groups:
            relations += self._decode_definitions(list(definitions.values()), proto)
        verdicts = tuple(self._verdicts(relations, {}).items())
        partitions: list[InputPartition] = []
        for entries, definitions in groups:
            ordered = sorted(definitions.items(), key=lambda item: (item[0][0] != "Y", item[0][1]))
            partitions.append(
                StreamPartition(
                    host=rt.endpoint.host,
                    port=rt.endpoint.port,
                    token=rt.endpoint.token,
                    proto_version=proto,
                    transactions=tuple(entries),
                    definitions=tuple(payload for _, payload in ordered),
                    verdicts=verdicts,
                    chunk_bytes=self.settings.chunk_bytes,
                )
            )
        log.info(
            "planned %d transactions after %s up to %s in %d partitions",
            stop - first,
            start_lsn,
            end_lsn,
            len(partitions),
        )
        return partitions

    def commit(self, end: dict[str, Any]) -> None:
        commit_lsn, end_lsn = parse_offset(end)
        rt = self._rt()
        rt.receiver.confirm_through(end_lsn, commit_lsn)
        log.info("batch up to %s committed by Spark: confirming %s", commit_lsn, end_lsn)

    def stop(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    # -- executor side ---------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, StreamPartition):
            raise SparkSourceError(f"unexpected partition {partition!r}", "report a pgcdc bug")
        worker_logging()
        decoder = ChangeDecoder(
            self.catalog, self.schema, partition.proto_version, dict(partition.verdicts)
        )
        decoder.prelude(partition.definitions)
        ranges = [r for entry in partition.transactions for r in entry.ranges]
        stream = fetch_messages(partition.host, partition.port, partition.token, ranges)

        def messages(entry: TxnEntry) -> Iterator[bytes]:
            remaining = entry.spool_bytes
            while remaining > 0:
                message = next(stream, None)
                if message is None:
                    raise SparkSourceError(
                        f"the data endpoint sent less than transaction {Lsn(entry.commit_lsn)} "
                        "needs",
                        "report this as a pgcdc bug",
                    )
                remaining -= RECORD_HEADER.size + len(message)
                yield message

        transactions = (
            (
                Label(entry.commit_lsn, entry.end_lsn, entry.commit_time, entry.xid),
                entry.streamed,
                entry.xid,
                messages(entry),
            )
            for entry in partition.transactions
        )
        try:
            yield from decode_transactions(decoder, transactions, chunk_bytes=partition.chunk_bytes)
        finally:
            stream.close()
