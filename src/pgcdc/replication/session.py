"""The replication session: stream a logical slot's pgoutput messages, report progress, reconnect.

``ReplicationSession`` connects to a slot over a replication connection (``transport``), yields
every pgoutput message as ``WalData``, an ``Idle`` tick when nothing arrived for
``poll_interval`` seconds, and ``Reconnected`` after it re-established a dropped connection.

Progress (standby status updates) follows ``FeedbackTracker``'s rule: write = last received,
flush = apply = last ``confirm()``-ed, never advanced on receipt alone; while nothing received is
unconfirmed, the server's WAL end is acknowledged, so an idle or fully filtered slot does not
keep WAL. A status goes out at least every ``status_interval`` seconds; while nothing is pending
it asks the server for a keepalive, whose WAL end the next status acknowledges. Keepalives that
request a reply are answered at once by the transport (inside its ``read``), as long as the
consumer keeps iterating: a consumer that blocks for longer than the server's
``wal_sender_timeout`` between two events gets disconnected (and the session reconnects).

A server shutting down (``pg_ctl stop``/``restart``, fast or smart) keeps each walsender until
its client reports everything sent as flushed, asking for a reply again and again (walsender.c,
``WalSndDone``), however long that takes: a client that answers is never timed out. While
nothing received is unconfirmed, the session's answer acknowledges the server's WAL end and the
walsender exits. Otherwise confirming would acknowledge changes the consumer has not made
durable; so when such a request comes while something is unconfirmed, the session checks with
an ordinary connection that the server refuses it as shutting down, sends the confirmed
position one last time and closes the replication connection (the walsender then exits at
once); it reconnects as after any lost connection, and the unconfirmed transactions come again.

After a dropped connection or a server restart the session reconnects with exponential backoff
(``ReconnectPolicy``), resumes from the last confirmed position, and yields ``Reconnected``
before anything else. The server then resends every transaction that commits after that
position, including ones already delivered but not yet confirmed: the session does not
deduplicate, its consumer skips them by commit LSN. When the policy is exhausted it raises
``ReconnectGaveUpError`` naming the server and the last cause; a slot dropped while the session
streamed (``pgcdc drop --force``) ends it with a ``SlotNotFoundError`` saying so.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from types import TracebackType

from psycopg import sql

from pgcdc.lsn import Lsn
from pgcdc.replication.database import connect_sql
from pgcdc.replication.errors import (
    ConnectionLostError,
    PublicationNotFoundError,
    ReconnectGaveUpError,
    ReplicationError,
    ServerUnreachableError,
    SlotActiveError,
    SlotNotFoundError,
    describe_server,
    dsn_user,
)
from pgcdc.replication.events import Idle, Reconnected, ReplicationEvent
from pgcdc.replication.failures import classify, doing_in_phase, sqlstate_of
from pgcdc.replication.feedback import FeedbackTracker
from pgcdc.replication.options import ResolvedOptions, StreamOptions, resolve_options
from pgcdc.replication.publication import missing_publications
from pgcdc.replication.reconnect import Backoff, ReconnectPolicy
from pgcdc.replication.slot import ACTIVE_WAIT_SECONDS, check_slot_name, require_usable_slot
from pgcdc.replication.transport import (
    LibpqTransport,
    ReplicationTransport,
    TransportError,
    TransportFactory,
    open_pgconn,
)

__all__ = ["ReplicationSession"]

log = logging.getLogger("pgcdc.replication")


class _Retry(Exception):
    """A connection attempt failed in a way a later attempt may not."""

    def __init__(self, error: ReplicationError) -> None:
        super().__init__(str(error))
        self.error = error


class ReplicationSession:
    """One consumer of one logical slot over a replication connection.

    ``start_lsn`` None starts at the slot's ``confirmed_flush_lsn``; a later position skips
    transactions that committed before it. ``temporary_slot`` creates the slot, as a temporary
    one, on the session's own connection; it dies with that connection, so such a session
    cannot reconnect (it raises ``ConnectionLostError``). With ``acknowledge=False`` the session
    never reports a flush position: the slot stays where it was, whatever is confirmed.
    ``receive_timeout``: with nothing at all from the server for half of it the session asks
    for a keepalive, after all of it the connection counts as lost. ``slot_wait``: seconds to
    wait at the start for a slot still held by a walsender (a consumer that just stopped) before
    raising ``SlotActiveError``.

    Use as a context manager (or call ``connect()`` and ``close()``), iterate ``events()`` and
    ``confirm()`` what has been made durable. ``confirm()`` may be called from another thread;
    everything else belongs to the thread that iterates.
    """

    def __init__(
        self,
        dsn: str,
        slot: str,
        options: StreamOptions,
        *,
        start_lsn: Lsn | None = None,
        reconnect: ReconnectPolicy | None = None,
        status_interval: float = 10.0,
        poll_interval: float = 1.0,
        receive_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        temporary_slot: bool = False,
        acknowledge: bool = True,
        transport_factory: TransportFactory = LibpqTransport,
        slot_wait: float = ACTIVE_WAIT_SECONDS,
    ) -> None:
        check_slot_name(slot)
        if not isinstance(options, StreamOptions):
            raise TypeError(f"options must be a StreamOptions, not {type(options).__name__}")
        for label, value in (
            ("status_interval", status_interval),
            ("poll_interval", poll_interval),
            ("receive_timeout", receive_timeout),
            ("connect_timeout", connect_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{label} must be a positive number of seconds, not {value!r}")
        self.dsn = dsn
        self.slot = slot
        self.options = options
        self.start_lsn = Lsn(start_lsn) if start_lsn is not None else None
        self.reconnect = reconnect if reconnect is not None else ReconnectPolicy()
        self.status_interval = float(status_interval)
        self.poll_interval = float(poll_interval)
        self.receive_timeout = float(receive_timeout)
        self.connect_timeout = float(connect_timeout)
        self.temporary_slot = temporary_slot
        #: seconds to wait at start for the slot's previous walsender to release it
        self.slot_wait = float(slot_wait)
        #: False: report no flush position ever, so the slot stays where it was (``--no-ack``)
        self.acknowledge = acknowledge
        self._factory = transport_factory
        self.server = describe_server(dsn)
        self._user = dsn_user(dsn)
        #: pgoutput protocol version in use (resolved when connecting)
        self.proto_version = 0
        #: the server's server_version_num (known after connecting)
        self.server_version = 0
        #: how many times the session reconnected
        self.reconnects = 0
        self._resolved: ResolvedOptions | None = None
        self._transport: ReplicationTransport | None = None
        self._tracker: FeedbackTracker | None = None
        self._closed = False
        self._outage: Backoff | None = None
        self._outage_cause: ReplicationError | None = None
        self._next_status = 0.0
        self._last_event = 0.0
        self._last_io = 0.0
        self._pinged = False
        self._received = 0
        self._last_data_end = Lsn(0)
        self._replies = 0  # the transport's reply_requests, as last seen
        self._next_probe = 0.0

    # -- public state ---------------------------------------------------------------------
    @property
    def server_wal_end(self) -> Lsn:
        """The latest walsender position known: everything before it was sent."""
        return self._tracker.server_wal_end if self._tracker else Lsn(0)

    @property
    def confirmed_lsn(self) -> Lsn:
        """The latest position sent to the server as flushed."""
        return self._tracker.reported_flush if self._tracker else Lsn(0)

    @property
    def received_lsn(self) -> Lsn:
        """The highest dataStart received."""
        return self._tracker.received if self._tracker else Lsn(0)

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._transport.closed

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> ReplicationSession:
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
        """Connect and start streaming (``events()`` does it on first use, too)."""
        if self._closed:
            raise ReplicationError(
                f"the replication session for slot {self.slot!r} is closed",
                "create a new ReplicationSession",
            )
        if self._tracker is not None:
            return
        try:
            self._open(first=True)
        except _Retry as retry:
            raise retry.error from None

    def close(self) -> None:
        """Report the final positions and close the connection. Idempotent."""
        self._closed = True
        transport = self._transport
        self._transport = None
        if transport is None:
            return
        if self._tracker is not None and not transport.closed:
            with contextlib.suppress(TransportError):
                self._send_status(transport, reply=False)
        transport.close()
        log.info(
            "closed replication session on slot %s (%d messages, confirmed %s, received %s)",
            self.slot,
            self._received,
            self.confirmed_lsn,
            self.received_lsn,
        )

    # -- consumer API ---------------------------------------------------------------------
    def confirm(self, lsn: Lsn) -> None:
        """Everything up to ``lsn`` is durable: report it as flushed/applied from now on.

        Confirm a Commit's ``end_lsn`` (the position the server resumes after). Confirming a
        position does not send a status update by itself: the next periodic one (or
        ``request_status()``) carries it.
        """
        if self._tracker is None:
            raise ReplicationError(
                "confirm() before the session connected", "iterate events() or call connect()"
            )
        self._tracker.confirm(lsn)

    def request_status(self, *, reply: bool = True) -> None:
        """Send a status update now; with ``reply``, ask the server for an immediate keepalive.

        The keepalive is answered with the positions of this status, like every keepalive;
        its WAL end is reported as flushed only by a later status, and only while nothing
        received is unconfirmed (``FeedbackTracker``).
        """
        transport = self._transport
        if transport is None or self._tracker is None:
            return
        try:
            self._send_status(transport, reply=reply)
        except TransportError as exc:
            self._lose(exc)

    def events(self) -> Iterator[ReplicationEvent]:
        """WAL data, idle ticks and reconnect notices, until ``close()``."""
        self.connect()
        clock = time.monotonic
        poll = self.poll_interval
        half_timeout = self.receive_timeout / 2
        while not self._closed:
            transport = self._transport
            tracker = self._tracker
            assert tracker is not None
            if transport is None:
                self._reconnect()
                yield Reconnected(self._resume_lsn())
                continue
            try:
                msg = transport.read()
            except TransportError as exc:
                self._lose(exc)
                continue
            now = clock()
            if msg is not None:
                tracker.received = max(tracker.received, msg.data_start)
                self._last_data_end = msg.wal_end
                self._received += 1
                self._last_event = now
                self._last_io = now
                if now >= self._next_status:
                    self._status_or_lose(transport, reply=False)
                yield msg
                continue
            if transport.closed:  # the driver noticed the connection is gone, quietly
                self._lose(
                    TransportError(
                        "the server closed the connection", sqlstate=None, phase="stream", lost=True
                    )
                )
                continue
            replies = transport.reply_requests
            if replies != self._replies:
                self._replies = replies
                if tracker.pending and now >= self._next_probe:
                    self._next_probe = now + 1.0  # a shutting-down server asks thousands a second
                    if self._server_shutting_down():
                        self._leave_shutdown(transport)
                        continue
            wal_end = transport.wal_end
            if wal_end > tracker.server_wal_end:
                tracker.note_wal_end(wal_end)
                if wal_end != self._last_data_end:
                    # a keepalive moved the WAL end: report it as written at once (a walsender
                    # shutting down waits for that; the transport's reply repeats older values)
                    self._status_or_lose(transport, reply=False)
                    continue
            if now >= self._next_status:
                # while nothing is pending, ask for a keepalive: its WAL end gets acknowledged
                self._status_or_lose(transport, reply=not tracker.pending)
                continue
            if now - self._last_event >= poll:
                self._last_event = now
                if not tracker.pending and tracker.server_wal_end > tracker.reported_flush:
                    self._status_or_lose(transport, reply=False)
                yield Idle(tracker.server_wal_end)
                continue
            silent = now - self._last_io
            if silent >= self.receive_timeout:
                self._lose(
                    TransportError(
                        f"nothing received from the server for {silent:.0f}s "
                        f"(receive_timeout {self.receive_timeout:g}s)",
                        sqlstate=None,
                        phase="stream",
                        lost=True,
                    )
                )
                continue
            if silent >= half_timeout and not self._pinged:
                self._pinged = True
                self._status_or_lose(transport, reply=True)
                continue
            wake = min(self._last_event + poll, self._next_status, self._last_io + half_timeout)
            if self._pinged:
                wake = min(wake, self._last_io + self.receive_timeout)
            try:
                readable = transport.wait(max(wake - now, 0.0))
            except TransportError as exc:
                self._lose(exc)
                continue
            if readable:
                self._last_io = clock()
                self._pinged = False

    # -- internals ------------------------------------------------------------------------
    def _server_shutting_down(self) -> bool:
        """Whether the server refuses a new connection as shutting down (a walsender asking
        for replies while its client has something unconfirmed may also just have heard
        nothing for half of ``wal_sender_timeout``)."""
        try:
            conn = open_pgconn(self.dsn, connect_timeout=self.connect_timeout)
        except TransportError as exc:
            # cannot_connect_now: starting up, in recovery or shutting down, and it was up a
            # moment ago (the message is in the server's language)
            return sqlstate_of(exc.message, exc.sqlstate) == "57P03"
        conn.finish()
        return False

    def _leave_shutdown(self, transport: ReplicationTransport) -> None:
        """Close the connection to a server that is shutting down and waits for this session
        to confirm what it received: that is not durable yet, so it is not confirmed; the
        walsender exits when the connection closes, and the session reconnects."""
        tracker = self._tracker
        assert tracker is not None
        log.warning(
            "%s is shutting down and waits for slot %s to be confirmed up to %s; confirmed is "
            "%s: closing the replication connection rather than confirming changes not yet "
            "durable (they are sent again after reconnecting)",
            self.server,
            self.slot,
            tracker.server_wal_end,
            tracker.confirmed,
        )
        with contextlib.suppress(TransportError):
            self._send_status(transport, reply=False)  # what is confirmed, and no more
        self._lose(
            TransportError(
                "the database system is shutting down (the connection was closed by pgcdc, "
                "which has not made everything it received durable yet)",
                sqlstate="57P03",
                phase="stream",
                lost=True,
            )
        )

    def _resume_lsn(self) -> Lsn:
        tracker = self._tracker
        assert tracker is not None
        return max(tracker.confirmed, tracker.reported_flush)

    def _send_status(self, transport: ReplicationTransport, *, reply: bool) -> None:
        tracker = self._tracker
        assert tracker is not None
        write, flush, apply = tracker.positions()
        transport.send_status(write, flush, apply, reply=reply)
        if flush > tracker.reported_flush:
            log.debug(
                "slot %s: reported write %s flush %s apply %s%s",
                self.slot,
                write,
                flush,
                apply,
                " (acknowledging the server's WAL end)" if not tracker.pending else "",
            )
        tracker.reported(flush)
        self._next_status = time.monotonic() + self.status_interval

    def _status_or_lose(self, transport: ReplicationTransport, *, reply: bool) -> None:
        try:
            self._send_status(transport, reply=reply)
        except TransportError as exc:
            self._lose(exc)

    def _failure(self, exc: TransportError, *, reconnecting: bool) -> tuple[ReplicationError, bool]:
        failure = classify(
            exc.message,
            exc.sqlstate,
            server=self.server,
            slot=self.slot,
            user=self._user,
            lost=exc.lost,
            doing=doing_in_phase(exc.phase),
        )
        transient = failure.transient or (
            reconnecting and isinstance(failure.error, SlotActiveError)
        )
        return failure.error, transient

    def _lose(self, exc: TransportError) -> None:
        """The connection failed while streaming: prepare a reconnect, or raise."""
        transport = self._transport
        self._transport = None
        if transport is not None:
            transport.close()
        error, transient = self._failure(exc, reconnecting=False)
        if self._closed:
            return
        if not transient:
            self._closed = True
            raise error from None
        if self.temporary_slot:
            self._closed = True
            raise ConnectionLostError(
                f"lost the connection to {self.server} ({exc.message}); the temporary slot "
                f"{self.slot!r} was dropped with it, so the stream cannot resume",
                "use a permanent slot (create_slot) for a session that must survive disconnects",
            ) from None
        log.warning(
            "replication connection to %s for slot %s lost at received %s / confirmed %s: %s",
            self.server,
            self.slot,
            self.received_lsn,
            self._resume_lsn(),
            exc.message,
        )
        self._outage = Backoff(self.reconnect)
        self._outage_cause = error

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
                    "bring the server back or fix the cause above, then start a new session: "
                    f"the slot still holds position {self._resume_lsn()}, where it resumes",
                ) from None
            log.info(
                "reconnecting to %s for slot %s in %.2fs (attempt %d)",
                self.server,
                self.slot,
                delay,
                backoff.attempts,
            )
            time.sleep(delay)
            try:
                self._open(first=False)
            except _Retry as retry:
                cause = retry.error
                log.info("reconnect attempt %d failed: %s", backoff.attempts, retry.error.cause)
                continue
            except SlotNotFoundError as exc:
                self._closed = True
                raise self._slot_dropped(exc) from None
            except BaseException:
                self._closed = True  # not worth retrying (a missing slot, a lost privilege...)
                raise
            self.reconnects += 1
            self._outage = None
            self._outage_cause = None
            log.info(
                "reconnected to %s, streaming slot %s from %s (reconnect #%d)",
                self.server,
                self.slot,
                self._resume_lsn(),
                self.reconnects,
            )
            return

    def _slot_dropped(self, exc: SlotNotFoundError) -> SlotNotFoundError:
        """The error for a slot dropped while this session streamed from it: creating it again
        (the fix for a slot that never existed) would resume at the server's current position,
        silently skipping what this session had not confirmed."""
        resume = self._resume_lsn()
        return SlotNotFoundError(
            f"replication slot {self.slot!r} was dropped on {self.server} while this session "
            f"streamed from it (confirmed up to {resume})",
            f"the changes after {resume} cannot be streamed any more; a new slot would start "
            "at the server's current position, so whatever this stream feeds must start over "
            "from a new copy of the data",
        )

    def _preflight(self, *, first: bool) -> Lsn | None:
        """Check the slot and publications with ordinary SQL; the slot's confirmed position."""
        try:
            conn = connect_sql(self.dsn, connect_timeout=self.connect_timeout)
        except ServerUnreachableError as error:
            raise _Retry(error) from None
        try:
            self.server_version = conn.info.server_version
            self._resolved = resolve_options(self.options, self.server_version)
            self.proto_version = self._resolved.proto_version
            position: Lsn | None = None
            if not self.temporary_slot:
                info = require_usable_slot(
                    conn,
                    self.slot,
                    allow_active=not first,
                    active_wait=self.slot_wait if first else 0.0,
                )
                position = info.confirmed_flush_lsn
            missing = missing_publications(conn, self.options.publication_names)
            if missing:
                raise PublicationNotFoundError(
                    f"publication(s) {', '.join(repr(m) for m in missing)} do not exist in "
                    f"{self.server}",
                    "create them (pgcdc.replication.create_publication) in the slot's "
                    "database, or fix publication_names",
                )
            return position
        except ServerUnreachableError as error:
            raise _Retry(error) from None
        finally:
            conn.close()

    def _open(self, *, first: bool) -> None:
        if not first and self.temporary_slot:
            raise ConnectionLostError(
                f"the temporary slot {self.slot!r} died with its connection", "use a permanent slot"
            )
        slot_position = self._preflight(first=first)
        resolved = self._resolved
        assert resolved is not None
        try:
            transport = self._factory(self.dsn, connect_timeout=self.connect_timeout)
        except TransportError as exc:
            error, transient = self._failure(exc, reconnecting=not first)
            if transient:
                raise _Retry(error) from None
            raise error from None
        try:
            if self.temporary_slot:
                slot_position = self._create_temporary_slot(transport)
            if self._tracker is None:
                start = max(self.start_lsn or Lsn(0), slot_position or Lsn(0))
                self._tracker = FeedbackTracker(start, acknowledge=self.acknowledge)
            resume = self._resume_lsn()
            transport.start(self.slot, resume, resolved.pairs, self.status_interval)
            # prime the transport's positions (it answers keepalives with them)
            self._send_status(transport, reply=False)
        except TransportError as exc:
            transport.close()
            error, transient = self._failure(exc, reconnecting=not first)
            if transient:
                raise _Retry(error) from None
            raise error from None
        except BaseException:
            transport.close()
            raise
        self._transport = transport
        self._replies = transport.reply_requests
        now = time.monotonic()
        self._last_event = now
        self._last_io = now
        self._pinged = False
        log.info(
            "streaming slot %s on %s from %s (proto_version %d, publications %s, "
            "server_version %d)",
            self.slot,
            self.server,
            resume,
            self.proto_version,
            ",".join(self.options.publication_names),
            self.server_version,
        )

    def _create_temporary_slot(self, transport: ReplicationTransport) -> Lsn:
        options = [sql.SQL("SNAPSHOT 'nothing'")]
        if self.options.two_phase:
            options.append(sql.SQL("TWO_PHASE true"))
        command = sql.SQL("CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput ({})").format(
            sql.Identifier(self.slot), sql.SQL(", ").join(options)
        )
        rows = transport.command(command.as_string())
        position = Lsn.parse(str(rows[0][1]))
        log.info("created temporary replication slot %s at %s", self.slot, position)
        return position
