"""Reading a slot through the SQL interface instead of a replication connection.

``SqlSlotReader`` has the session's ``events()`` / ``confirm()`` interface and options, but polls
``pg_logical_slot_peek_binary_changes(slot, NULL, upto_nchanges, options...)`` on an ordinary
connection and moves the slot with ``pg_replication_slot_advance(slot, lsn)`` on ``confirm()``.
It needs no replication connection (and no ``max_wal_senders``), at the price of re-decoding
from the slot's position on every poll.

A peek always starts again at the slot's confirmed position, so the reader must skip what it
already delivered, and it must never yield the same row twice. Row LSNs cannot identify rows:
several rows share one (a Begin, the Relation and the first change it precedes; every row of a
multi-row insert; a Commit and the next transaction's first change), and they are not even
monotonic (transactions arrive in commit order, carrying the LSNs of their changes, and a
streamed transaction's blocks interleave with other commits). Two mechanisms do it instead:

* Between two moves of the slot, a peek is deterministic: the same WAL decoded from the same
  position gives the same rows, so the first ``skip`` rows are exactly those seen before.
* A peek returns whole units (a transaction, a prepared transaction, a streamed block, a
  non-transactional message...), each ending at one WAL record: its commit, prepare or message
  record. Those records' positions (start or end, as the messages carry them; an end sorts
  before an equal start) increase in delivery order,
  so after the slot moves a unit is known to be delivered when its position is at or below the
  last delivered one; a streamed block is, when its transaction's end was delivered. The slot is
  only moved while no streamed transaction is half delivered.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn

import psycopg

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    MAX_PROTO_VERSION,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Decoder,
    Message,
    MessageType,
    Prepare,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
)
from pgcdc.replication.database import connect_sql, raise_sql_error
from pgcdc.replication.errors import (
    PublicationNotFoundError,
    ReconnectGaveUpError,
    ReplicationError,
    ServerUnreachableError,
    describe_server,
)
from pgcdc.replication.events import Idle, Reconnected, ReplicationEvent, WalData
from pgcdc.replication.failures import Doing
from pgcdc.replication.options import ResolvedOptions, StreamOptions, resolve_options
from pgcdc.replication.publication import missing_publications
from pgcdc.replication.reconnect import Backoff, ReconnectPolicy
from pgcdc.replication.slot import ACTIVE_WAIT_SECONDS, check_slot_name, require_usable_slot

__all__ = ["SqlSlotReader"]

log = logging.getLogger("pgcdc.replication")

_PEEK = (
    "SELECT lsn::text, xid::text, data "
    "FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, VARIADIC %s::text[])"
)
_WAL_POSITIONS = "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text"
_ADVANCE = "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)"

#: a unit's first message -> the message that ends it
_UNIT_ENDS: dict[int, int] = {
    MessageType.BEGIN: MessageType.COMMIT,
    MessageType.BEGIN_PREPARE: MessageType.PREPARE,
    MessageType.STREAM_START: MessageType.STREAM_STOP,
}


@dataclass(frozen=True, slots=True)
class _Unit:
    """A run of rows that the server always emits together."""

    start: int
    stop: int  # exclusive
    kind: str  # 'txn', 'prepare', 'chunk', 'stream_end', 'stream_abort', 'single'
    xid: int | None
    key: tuple[int, int] | None  # position of the record that ended the unit, for ordering


def _group(rows: list[tuple[Lsn, int, bytes]]) -> tuple[list[_Unit], int]:
    """Split rows into units; also how many rows they cover (an incomplete tail is left out).
    Only the messages that begin or end a unit are decoded (outside any stream: none of them
    carries a streamed Xid)."""
    decode = Decoder(MAX_PROTO_VERSION).decode
    units: list[_Unit] = []
    i = 0
    n = len(rows)
    while i < n:
        data = rows[i][2]
        kind = data[0] if data else -1
        end_kind = _UNIT_ENDS.get(kind)
        if end_kind is not None:
            j = i + 1
            while j < n and rows[j][2][0] != end_kind:
                j += 1
            if j == n:
                break  # incomplete: peek again later (does not happen: peeks end on units)
            first, end = decode(data), decode(rows[j][2])
            if isinstance(first, Begin) and isinstance(end, Commit):
                units.append(_Unit(i, j + 1, "txn", first.xid, (end.commit_lsn, 1)))
            elif isinstance(first, BeginPrepare) and isinstance(end, Prepare):
                units.append(_Unit(i, j + 1, "prepare", first.xid, (end.prepare_lsn, 1)))
            else:
                assert isinstance(first, StreamStart)
                units.append(_Unit(i, j + 1, "chunk", first.xid, None))
            i = j + 1
            continue
        message = decode(data) if kind in _SINGLE else None
        if isinstance(message, StreamCommit):
            units.append(_Unit(i, i + 1, "stream_end", message.xid, (message.commit_lsn, 1)))
        elif isinstance(message, StreamPrepare):
            units.append(_Unit(i, i + 1, "stream_end", message.xid, (message.prepare_lsn, 1)))
        elif isinstance(message, StreamAbort):
            whole = message.xid == message.subxid
            units.append(
                _Unit(i, i + 1, "stream_abort" if whole else "sub_abort", message.xid, None)
            )
        elif isinstance(message, CommitPrepared):
            units.append(_Unit(i, i + 1, "single", message.xid, (message.commit_lsn, 1)))
        elif isinstance(message, RollbackPrepared):  # its end position: sorts before a start
            key = (message.rollback_end_lsn, 0)
            units.append(_Unit(i, i + 1, "single", message.xid, key))
        elif isinstance(message, Message):  # non-transactional: the end of its record
            units.append(_Unit(i, i + 1, "single", None, (message.lsn, 0)))
        else:  # nothing else appears outside a unit; keep it ordered by its row's position
            units.append(_Unit(i, i + 1, "single", None, (int(rows[i][0]), 1)))
        i += 1
    return units, i


#: the messages that are a unit of their own, decoded for their Xid and position
_SINGLE: frozenset[int] = frozenset(
    {
        MessageType.STREAM_COMMIT,
        MessageType.STREAM_PREPARE,
        MessageType.STREAM_ABORT,
        MessageType.COMMIT_PREPARED,
        MessageType.ROLLBACK_PREPARED,
        MessageType.MESSAGE,
    }
)


class SqlSlotReader:
    """A slot read through ``pg_logical_slot_peek_binary_changes``; see the module docstring.

    ``batch_size`` is ``upto_nchanges`` for one peek beyond what was already seen (the server
    completes the transaction it is in, so a peek may return more). ``Idle.server_wal_end`` is
    a WAL position up to which every change has been read, and is acknowledged (the slot is
    advanced to it) while nothing delivered is unconfirmed. After ``Reconnected``, complete
    transactions already delivered are not delivered again (unlike the replication session);
    a streamed transaction still open is, from its first block.
    """

    def __init__(
        self,
        dsn: str,
        slot: str,
        options: StreamOptions,
        *,
        reconnect: ReconnectPolicy | None = None,
        poll_interval: float = 1.0,
        batch_size: int = 1000,
        connect_timeout: float = 10.0,
        acknowledge: bool = True,
        slot_wait: float = ACTIVE_WAIT_SECONDS,
    ) -> None:
        check_slot_name(slot)
        if not isinstance(options, StreamOptions):
            raise TypeError(f"options must be a StreamOptions, not {type(options).__name__}")
        if not poll_interval > 0 or not connect_timeout > 0:
            raise ValueError("poll_interval and connect_timeout must be positive seconds")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
        self.dsn = dsn
        self.slot = slot
        self.options = options
        self.reconnect = reconnect if reconnect is not None else ReconnectPolicy()
        self.poll_interval = float(poll_interval)
        self.batch_size = batch_size
        self.connect_timeout = float(connect_timeout)
        #: seconds to wait at start for the slot's previous walsender to release it
        self.slot_wait = float(slot_wait)
        #: False: never advance the slot (``--no-ack``); confirm() only tracks progress locally
        self.acknowledge = acknowledge
        self.server = describe_server(dsn)
        self.proto_version = 0
        self.server_version = 0
        self.reconnects = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._resolved: ResolvedOptions | None = None
        self._closed = False
        self._started = False
        # the slot's position as of the last move, and rows of the peek from it seen so far
        self._base = Lsn(0)
        self._skip = 0
        # what was delivered: the last unit-ending position, the finished transactions (xid ->
        # position), the streamed transactions with blocks delivered but no end yet
        self._last_key: tuple[int, int] = (-1, -1)
        self._ended: dict[int, int] = {}
        self._open_streams: set[int] = set()
        self._queue: deque[WalData] = deque()
        self._max_yielded = Lsn(0)
        self._confirmed = Lsn(0)
        self._server_wal_end = Lsn(0)
        self._last_event = 0.0
        self._poll_now = False
        self._outage: Backoff | None = None
        self._outage_cause: ReplicationError | None = None
        #: counters: rows delivered, rows re-read and skipped, slot moves put off
        self.rows_read = 0
        self.rows_skipped = 0
        self.advances_deferred = 0

    # -- public state ---------------------------------------------------------------------
    @property
    def confirmed_lsn(self) -> Lsn:
        """The slot's position as last moved (``confirmed_flush_lsn``)."""
        return self._base

    @property
    def server_wal_end(self) -> Lsn:
        return self._server_wal_end

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> SqlSlotReader:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> None:
        if self._closed:
            raise ReplicationError(
                f"the SQL slot reader for slot {self.slot!r} is closed",
                "create a new SqlSlotReader",
            )
        if self._started:
            return
        self._open(first=True)
        self._started = True

    def close(self) -> None:
        self._closed = True
        if self._conn is not None and not self._conn.closed:
            try:
                self._advance(self._confirmed)
            except ReplicationError as error:
                log.warning("could not advance slot %s on close: %s", self.slot, error.cause)
            except psycopg.Error as exc:
                log.warning("could not advance slot %s on close: %s", self.slot, exc.sqlstate)
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            log.info(
                "closed SQL slot reader on slot %s (slot at %s, %d rows read, %d skipped)",
                self.slot,
                self._base,
                self.rows_read,
                self.rows_skipped,
            )

    # -- consumer API ---------------------------------------------------------------------
    def confirm(self, lsn: Lsn) -> None:
        """Everything up to ``lsn`` is durable: advance the slot to it.

        The slot moves (``pg_replication_slot_advance``) before the next peek, in the thread
        that iterates ``events()``, or on ``close()``; while a streamed transaction is half
        delivered it waits until that transaction's end has been. ``confirm()`` itself runs no
        SQL, so it may be called from another thread.
        """
        given: object = lsn
        if isinstance(given, bool) or not isinstance(given, int):
            raise TypeError(f"confirm() takes an Lsn, not {type(given).__name__}")
        limit = max(self._max_yielded, self._server_wal_end, self._base)
        if lsn > limit:
            raise ValueError(
                f"confirm({Lsn(lsn)}) is beyond anything delivered (up to {limit}); confirm "
                "the end_lsn of a Commit you received"
            )
        if lsn > self._confirmed:
            self._confirmed = Lsn(lsn)

    def request_status(self) -> None:
        """Poll the slot at once on the next iteration instead of waiting."""
        self._poll_now = True

    def events(self) -> Iterator[ReplicationEvent]:
        self.connect()
        clock = time.monotonic
        while not self._closed:
            queue = self._queue
            while queue:
                row = queue.popleft()
                self._max_yielded = max(self._max_yielded, row.data_start)
                self._last_event = clock()
                yield row
                if self._is_closed():
                    return
            if self._conn is None:
                self._reconnect()
                yield Reconnected(self._base)
                continue
            try:
                got = self._fetch()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                self._lose(exc)
                continue
            if got:
                continue
            now = clock()
            if now - self._last_event >= self.poll_interval:
                self._last_event = now
                yield Idle(self._server_wal_end)
                continue
            if self._poll_now:
                self._poll_now = False
                continue
            time.sleep(max(self._last_event + self.poll_interval - now, 0.0))

    # -- internals ------------------------------------------------------------------------
    def _is_closed(self) -> bool:
        return self._closed

    @property
    def _pending(self) -> bool:
        return bool(self._open_streams or self._queue or self._max_yielded > self._confirmed)

    def _advance(self, target: Lsn) -> None:
        """Move the slot to ``target`` if that is ahead and no streamed transaction is open."""
        conn = self._conn
        if conn is None or target <= self._base or not self.acknowledge:
            return
        if self._open_streams:
            self.advances_deferred += 1
            log.debug(
                "slot %s: not advancing to %s while %d streamed transaction(s) are open",
                self.slot,
                target,
                len(self._open_streams),
            )
            return
        try:
            row = conn.execute(_ADVANCE, (self.slot, str(target))).fetchone()
        except psycopg.Error as exc:
            self._failed(exc, conn)
        assert row is not None
        moved = Lsn.parse(row[0])
        log.debug("advanced slot %s from %s to %s", self.slot, self._base, moved)
        if moved != self._base:
            self._base = moved
            self._skip = 0  # the next peek starts from the new position
            self._ended = {x: pos for x, pos in self._ended.items() if pos >= moved}

    def _fetch(self) -> bool:
        """One peek; whether it got anywhere (queued new rows or skipped old ones)."""
        conn = self._conn
        resolved = self._resolved
        assert conn is not None and resolved is not None
        self._advance(self._confirmed)
        try:
            insert_lsn, flush_lsn = conn.execute(_WAL_POSITIONS).fetchone() or ("0/0", "0/0")
            rows = conn.execute(
                _PEEK, (self.slot, self._skip + self.batch_size, resolved.flat())
            ).fetchall()
        except psycopg.Error as exc:
            self._failed(exc, conn)
        fresh = [
            (Lsn.parse(lsn), int(xid or 0), bytes(data)) for lsn, xid, data in rows[self._skip :]
        ]
        units, covered = _group(fresh)
        self._skip += covered
        queued = 0
        for unit in units:
            if self._seen(unit):
                self.rows_skipped += unit.stop - unit.start
                continue
            self._note(unit, fresh)
            for lsn, _xid, data in fresh[unit.start : unit.stop]:
                self._queue.append(WalData(lsn, lsn, data))
            queued += unit.stop - unit.start
        self.rows_read += queued
        if queued:
            log.debug(
                "slot %s: %d new rows (%d units) from a peek of %d",
                self.slot,
                queued,
                len(units),
                len(rows),
            )
            return True
        if covered:
            return True  # only rows delivered before the slot moved: peek again at once
        # nothing new: the peek decoded all the WAL up to where it began; when the insert and
        # flush positions agreed before it, that position is a record boundary read in full
        if insert_lsn == flush_lsn:
            position = Lsn.parse(flush_lsn)
            self._server_wal_end = max(self._server_wal_end, position)
            if not self._pending and position > self._base:
                self._advance(position)
        return False

    def _seen(self, unit: _Unit) -> bool:
        """Whether the unit was already delivered (before the slot last moved)."""
        if unit.kind in ("chunk", "sub_abort", "stream_abort"):
            return unit.xid in self._ended
        assert unit.key is not None
        return unit.key <= self._last_key

    def _note(self, unit: _Unit, rows: list[tuple[Lsn, int, bytes]]) -> None:
        kind = unit.kind
        xid = unit.xid
        if kind == "chunk":
            assert xid is not None
            self._open_streams.add(xid)
            return
        if kind == "sub_abort":
            return
        if kind == "stream_abort":
            assert xid is not None
            self._open_streams.discard(xid)
            self._ended[xid] = int(rows[unit.start][0])
            return
        assert unit.key is not None
        self._last_key = max(self._last_key, unit.key)
        if xid is not None and kind in ("txn", "prepare", "stream_end"):
            self._open_streams.discard(xid)
            self._ended[xid] = unit.key[0]

    def _failed(self, exc: psycopg.Error, conn: psycopg.Connection[Any]) -> NoReturn:
        """Raise the error of a peek or an advance (a connection's own error as it is, for
        ``_lose``). The slot is not held between two calls, so it may have been dropped or
        invalidated meanwhile: where the SQLSTATE does not say whether the slot or a
        publication is missing (42704 for both), or why the slot cannot be used (55000), the
        catalog says, not the message (in the server's language)."""
        if exc.sqlstate in ("42704", "55000"):
            # raises what it finds wrong with the slot (missing, invalidated, ...)
            with contextlib.suppress(ServerUnreachableError):  # then the SQLSTATE decides
                require_usable_slot(conn, self.slot, allow_active=True)
            if exc.sqlstate == "42704":  # the slot is there: a publication is not
                raise_sql_error(exc, conn, slot=self.slot, doing=Doing.DECODE)
        elif isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            raise exc
        raise_sql_error(exc, conn, slot=self.slot, doing=Doing.SLOT)

    def _lose(self, exc: psycopg.Error) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        try:
            raise_sql_error(exc, self.dsn, slot=self.slot, doing=Doing.SLOT)
        except ServerUnreachableError as error:
            log.warning(
                "SQL connection to %s for slot %s lost (slot at %s): %s",
                self.server,
                self.slot,
                self._base,
                error.cause,
            )
            self._outage = Backoff(self.reconnect)
            self._outage_cause = error
        except ReplicationError:
            self._closed = True
            raise

    def _reconnect(self) -> None:
        backoff = self._outage or Backoff(self.reconnect)
        cause = self._outage_cause
        while True:
            delay = backoff.next_delay()
            if delay is None:
                self._closed = True
                raise ReconnectGaveUpError(
                    f"gave up reconnecting to {self.server} for slot {self.slot!r} after "
                    f"{backoff.attempts} attempt(s) in {backoff.elapsed():.1f}s (policy: "
                    f"{self.reconnect.describe()}); last cause: "
                    f"{cause.cause if cause else 'unknown'}",
                    "bring the server back or fix the cause above, then read again: the slot "
                    f"still holds position {self._base}",
                ) from None
            time.sleep(delay)
            try:
                self._open(first=False)
            except ServerUnreachableError as error:
                cause = error
                log.info("reconnect attempt %d failed: %s", backoff.attempts, error.cause)
                continue
            except BaseException:
                self._closed = True
                raise
            self.reconnects += 1
            self._outage = None
            self._outage_cause = None
            log.info(
                "reconnected to %s, reading slot %s from %s", self.server, self.slot, self._base
            )
            return

    def _open(self, *, first: bool) -> None:
        conn = connect_sql(self.dsn, connect_timeout=self.connect_timeout)
        try:
            self.server_version = conn.info.server_version
            self._resolved = resolve_options(self.options, self.server_version)
            self.proto_version = self._resolved.proto_version
            info = require_usable_slot(conn, self.slot, active_wait=self.slot_wait)
            missing = missing_publications(conn, self.options.publication_names)
            if missing:
                raise PublicationNotFoundError(
                    f"publication(s) {', '.join(repr(m) for m in missing)} do not exist in "
                    f"{self.server}",
                    "create them (pgcdc.replication.create_publication) in the slot's "
                    "database, or fix publication_names",
                )
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._base = info.confirmed_flush_lsn or Lsn(0)
        self._server_wal_end = max(self._server_wal_end, self._base)
        if first:
            self._confirmed = self._base
        self._skip = 0
        # a new connection: streamed transactions in flight start over (see Reconnected)
        self._open_streams.clear()
        self._last_event = time.monotonic()
        log.info(
            "reading slot %s on %s through SQL from %s (proto_version %d, publications %s)",
            self.slot,
            self.server,
            self._base,
            self.proto_version,
            ",".join(self.options.publication_names),
        )
