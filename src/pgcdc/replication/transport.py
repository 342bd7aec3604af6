"""The wire: one logical replication connection, behind a small interface.

``ReplicationTransport`` is everything the session needs from a replication connection: run a
replication command, start streaming, read one message without blocking, wait for the socket,
send a standby status update. ``LibpqTransport`` implements it on libpq through psycopg 3's
``pq`` wrapper: the COPY BOTH stream of the streaming replication protocol, its XLogData
('w') and primary keepalive ('k') messages parsed here, and standby status updates ('r') built
here. Driver errors leave this module as ``TransportError`` (SQLSTATE and scrubbed message),
which ``pgcdc.replication.failures`` turns into ``ReplicationError`` subclasses.

A keepalive that asks for a reply is answered inside ``read`` with exactly the positions of the
last status the session sent, never more: the flush position is the session's alone. (psycopg2's
replication loop, used before, reported the keepalive's WAL end as flushed whenever the last
message received began at or before the last flush position sent. pgoutput's messages begin at
their transaction's first LSN, so one amid a transaction that began before a confirmed commit
made it acknowledge later commits not yet durable.) ``reply_requests`` counts those replies: a
walsender asks for one after half of ``wal_sender_timeout`` without a status, and, at a
server's shutdown, again and again until the client reports everything sent as flushed.
"""

from __future__ import annotations

import logging
import select
import struct
import time
from collections.abc import Sequence
from typing import Any, Protocol

import psycopg
from psycopg import pq, sql
from psycopg._conninfo_attempts import conninfo_attempts  # what psycopg's connect tries
from psycopg._encodings import pg2pyenc  # the name psycopg itself maps server encodings with
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgcdc.errors import PgcdcError
from pgcdc.lsn import Lsn
from pgcdc.replication import libpq
from pgcdc.replication.errors import scrub_secrets
from pgcdc.replication.events import WalData

log = logging.getLogger("pgcdc.replication")

__all__ = [
    "LibpqTransport",
    "ReplicationTransport",
    "TransportError",
    "TransportFactory",
    "open_pgconn",
    "start_replication_command",
]


class TransportError(PgcdcError):
    """A replication connection failed; ``lost`` says whether the connection is now unusable."""

    def __init__(self, message: str, *, sqlstate: str | None, phase: str, lost: bool) -> None:
        self.message = scrub_secrets(message.strip())
        self.sqlstate = sqlstate
        self.phase = phase
        self.lost = lost
        super().__init__(self.message)


class ReplicationTransport(Protocol):
    """A logical replication connection (``replication=database``)."""

    @property
    def server_version(self) -> int:
        """``server_version_num`` of the server, e.g. 150018."""
        ...

    @property
    def wal_end(self) -> Lsn:
        """The last WAL end the server reported (keepalive or data)."""
        ...

    def command(self, text: str) -> list[tuple[Any, ...]]:
        """Run a replication command (or simple SQL); the rows it returns."""
        ...

    def start(
        self,
        slot: str,
        start_lsn: Lsn,
        options: Sequence[tuple[str, str]],
        status_interval: float,
    ) -> None:
        """START_REPLICATION SLOT slot LOGICAL start_lsn (options)."""
        ...

    def read(self) -> WalData | None:
        """The next message if one is available, without blocking; keepalives are absorbed."""
        ...

    def wait(self, timeout: float) -> bool:
        """Block until the socket is readable or ``timeout`` seconds passed; whether readable."""
        ...

    def send_status(self, write: Lsn, flush: Lsn, apply: Lsn, *, reply: bool = False) -> None:
        """Send a standby status update now (``reply`` asks the server for a keepalive)."""
        ...

    @property
    def reply_requests(self) -> int:
        """How many keepalives asking for a reply were answered (inside ``read``) so far; some
        may be missed, none is counted that did not ask."""
        ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...


class TransportFactory(Protocol):
    def __call__(self, dsn: str, *, connect_timeout: float) -> ReplicationTransport: ...


_lsn = int.__new__  # Lsn without the range check: the server's 64-bit values always fit


def _repl_literal(value: str) -> str:
    """A string literal of the replication command grammar: quotes doubled, nothing else.

    (Not ``psycopg.sql.Literal``: it writes ``E'...'`` for backslashes, which the replication
    grammar lacks; and not psycopg2's ``start_replication(options=...)``, which encodes option
    values as Latin-1.)
    """
    if "\0" in value:
        raise ValueError("a replication option value cannot contain a NUL character")
    return "'" + value.replace("'", "''") + "'"


def start_replication_command(slot: str, start_lsn: Lsn, options: Sequence[tuple[str, str]]) -> str:
    """``START_REPLICATION SLOT "slot" LOGICAL X/X ("key" 'value', ...)``."""
    text = sql.SQL("START_REPLICATION SLOT {} LOGICAL {}").format(
        sql.Identifier(slot), sql.SQL(str(Lsn(start_lsn)))
    )
    if options:
        text = sql.SQL("{} ({})").format(
            text,
            sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(key), sql.SQL(_repl_literal(value)))
                for key, value in options
            ),
        )
    return text.as_string()


# The streaming replication protocol's CopyData messages (protocol-replication.html):
# XLogData: Byte1('w') Int64 dataStart Int64 walEnd Int64 sendTime, then the message.
# Primary keepalive: Byte1('k') Int64 walEnd Int64 sendTime Byte1 replyRequested.
# Standby status update: Byte1('r') Int64 write Int64 flush Int64 apply Int64 clock Byte1 reply.
_XLOG_DATA = ord("w")
_KEEPALIVE = ord("k")
_XLOG_HEADER = 25
_keepalive = struct.Struct("!QQB")
_two_lsns = struct.Struct("!QQ")
_status = struct.Struct("!cQQQqB")
_EPOCH_2000 = 946_684_800  # the protocol's clock counts microseconds from 2000-01-01 UTC
_COPY_STATES = frozenset({pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH})


def _server_error(
    result: pq.abc.PGresult | None, conn: pq.abc.PGconn | None
) -> tuple[str, str | None]:
    """The error of a failed result (or the connection's own) on one line, with its DETAIL and
    HINT, without the severity prefix; and its SQLSTATE."""
    if result is None or not result.error_message:
        text = conn.get_error_message() if conn is not None else ""
        return " ".join(text.split()) or "the connection to the server was lost", None

    def field(code: pq.DiagnosticField) -> str | None:
        value = result.error_field(code)
        return value.decode("utf-8", "replace") if value else None

    text = field(pq.DiagnosticField.MESSAGE_PRIMARY) or result.get_error_message()
    for label, code in (
        ("DETAIL", pq.DiagnosticField.MESSAGE_DETAIL),
        ("HINT", pq.DiagnosticField.MESSAGE_HINT),
    ):
        value = field(code)
        if value:
            text = f"{text.rstrip()} {label}: {value}"
    return " ".join(text.split()), field(pq.DiagnosticField.SQLSTATE)


def _cell(value: bytes | None, oid: int) -> Any:
    """A replication command's result value: the commands return text, int4 and int8 columns."""
    if value is None:
        return None
    if oid in (20, 21, 23):
        return int(value)
    return value.decode("utf-8", "replace")


def open_pgconn(dsn: str, *, connect_timeout: float, **params: str) -> pq.abc.PGconn:
    """A new libpq connection to ``dsn`` (with ``params`` added), in non-blocking mode.

    Each host (and address) of ``dsn`` is tried in turn, each with the whole timeout: libpq's own
    iteration never leaves a host that accepts and then stays silent, since PQconnectPoll leaves
    connect_timeout to the caller (psycopg's connect does this too). Nothing here blocks in
    libpq: psycopg's ``pq`` keeps the GIL in blocking calls (PQconnectdb), which would stop every
    other thread of the process for as long as the server takes. A refused connection raises
    ``TransportError`` with the server's SQLSTATE (``pgcdc.replication.libpq``): its message is
    in the server's language.
    """
    timeout = max(1, round(connect_timeout))
    try:
        attempts = conninfo_attempts(conninfo_to_dict(dsn, **params))
    except psycopg.Error as exc:  # a malformed DSN, or no host resolved
        raise TransportError(str(exc), sqlstate=None, phase="connect", lost=True) from None
    failure: TransportError | None = None
    for attempt in attempts:
        conn = pq.PGconn.connect_start(make_conninfo("", **attempt).encode())
        verbose = libpq.verbose_errors(conn)
        try:
            _connect(conn, timeout)
        except TransportError as exc:
            conn.finish()
            failure = exc
            continue
        if verbose:
            libpq.default_errors(conn)
        conn.nonblocking = 1
        return conn
    assert failure is not None
    raise failure


def _connect(conn: pq.abc.PGconn, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    status = pq.PollingStatus.WRITING
    while status != pq.PollingStatus.OK:
        if status == pq.PollingStatus.FAILED or conn.status == pq.ConnStatus.BAD:
            message, sqlstate = libpq.split_sqlstate(conn.get_error_message())
            raise TransportError(
                " ".join(message.split()) or "the connection failed",
                sqlstate=sqlstate,
                phase="connect",
                lost=True,
            )
        if status != pq.PollingStatus.ACTIVE:
            left = deadline - time.monotonic()
            if left <= 0 or not _ready(conn, status == pq.PollingStatus.WRITING, left):
                host = conn.host.decode(errors="replace")
                raise TransportError(
                    f'connection to server at "{host}" failed: timeout expired',
                    sqlstate=None,
                    phase="connect",
                    lost=True,
                )
        status = pq.PollingStatus(conn.connect_poll())


def _ready(conn: pq.abc.PGconn, write: bool, timeout: float) -> bool:
    """Wait for the socket to be writable (or readable); whether it became so in time.
    (``poll``, not ``select``: a process with many files may get a socket above 1023.)"""
    poller = select.poll()
    poller.register(conn.socket, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(max(timeout, 0.0) * 1000))


class LibpqTransport:
    """``ReplicationTransport`` on libpq, through psycopg 3's ``pq`` wrapper.

    Every libpq call that may wait is non-blocking and waited on here with ``poll``: psycopg's
    ``pq`` keeps the GIL in blocking ones (PQconnectdb, PQexec), which would stop every other
    thread of the process for as long as the server takes (CREATE_REPLICATION_SLOT waits for
    running transactions to end).
    """

    __slots__ = ("_conn", "_encoding", "_finished", "_positions", "_replies", "_wal_end")

    def __init__(self, dsn: str, *, connect_timeout: float = 10.0) -> None:
        self._finished = True
        self._encoding = "utf-8"
        self._wal_end = 0
        self._positions = (0, 0, 0)  # write, flush, apply: the last status the session sent
        self._replies = 0
        self._conn = open_pgconn(dsn, connect_timeout=connect_timeout, replication="database")
        self._finished = False
        try:
            # server notices (a WARNING about a slot, say) go to the log, not to stderr
            self._conn.notice_handler = _log_notice
            self._encoding = pg2pyenc(self._conn.parameter_status(b"client_encoding") or b"UTF8")
        except psycopg.Error as exc:  # an encoding Python has no codec for
            self.close()
            raise TransportError(str(exc), sqlstate=None, phase="connect", lost=True) from None

    def _ready(self, write: bool, timeout: float) -> bool:
        return _ready(self._conn, write, timeout)

    def _execute(self, text: str, phase: str) -> pq.abc.PGresult:
        """Send one command and wait for its (first) result."""
        conn = self._conn
        try:
            command = text.encode(self._encoding)
        except UnicodeError:
            raise TransportError(
                f"the command cannot be written in the connection's encoding {self._encoding} "
                "(a name or option value with characters it lacks)",
                sqlstate=None,
                phase=phase,
                lost=False,
            ) from None
        try:
            conn.send_query(command)
            while conn.flush():  # 1: not all sent yet
                self._ready(True, 1.0)
            self._await_result()
            result = conn.get_result()
            if result is None:
                raise TransportError(
                    "the server returned no result", sqlstate=None, phase=phase, lost=True
                )
            if result.status not in _COPY_STATES:
                # up to the end of the query's results (none more for these commands)
                while True:
                    self._await_result()
                    rest = conn.get_result()
                    if rest is None:
                        break
                    if rest.status in _COPY_STATES:  # nothing a replication command starts
                        raise TransportError(
                            "the server answered with an unexpected COPY",
                            sqlstate=None,
                            phase=phase,
                            lost=True,
                        )
            return result
        except (psycopg.Error, OSError) as exc:
            raise self._broken(exc, phase) from None

    def _await_result(self) -> None:
        """Wait until libpq has the next result whole (``get_result`` would block for it, and
        psycopg's ``pq`` keeps the GIL while it does)."""
        conn = self._conn
        while conn.is_busy():
            self._ready(False, 1.0)
            conn.consume_input()

    def _broken(self, exc: psycopg.Error | OSError | ValueError, phase: str) -> TransportError:
        """libpq failed on the connection itself (psycopg's ``pq`` raises for it)."""
        self.close()
        return TransportError(" ".join(str(exc).split()), sqlstate=None, phase=phase, lost=True)

    @property
    def reply_requests(self) -> int:
        return self._replies

    @property
    def server_version(self) -> int:
        return self._conn.server_version

    @property
    def wal_end(self) -> Lsn:
        return _lsn(Lsn, self._wal_end)

    @property
    def closed(self) -> bool:
        return self._finished or self._conn.status == pq.ConnStatus.BAD

    def command(self, text: str) -> list[tuple[Any, ...]]:
        result = self._execute(text, "command")
        if result.status == pq.ExecStatus.TUPLES_OK:
            types = [result.ftype(col) for col in range(result.nfields)]
            return [
                tuple(
                    _cell(result.get_value(row, col), types[col]) for col in range(result.nfields)
                )
                for row in range(result.ntuples)
            ]
        if result.status == pq.ExecStatus.COMMAND_OK:
            return []
        message, sqlstate = _server_error(result, self._conn)
        raise TransportError(message, sqlstate=sqlstate, phase="command", lost=self.closed)

    def start(
        self,
        slot: str,
        start_lsn: Lsn,
        options: Sequence[tuple[str, str]],
        status_interval: float,
    ) -> None:
        result = self._execute(start_replication_command(slot, start_lsn, options), "start")
        if result.status != pq.ExecStatus.COPY_BOTH:
            message, sqlstate = _server_error(result, self._conn)
            raise TransportError(message, sqlstate=sqlstate, phase="start", lost=self.closed)

    def read(self) -> WalData | None:
        try:
            return self._read()
        except (psycopg.Error, OSError) as exc:
            raise self._broken(exc, "stream") from None
        except struct.error:
            self.close()
            raise TransportError(
                "the server sent a replication message too short for its header",
                sqlstate=None,
                phase="stream",
                lost=True,
            ) from None

    def _read(self) -> WalData | None:
        conn = self._conn
        consumed = 0
        while True:
            size, data = conn.get_copy_data(1)
            if size > 0:
                kind = data[0]
                if kind == _XLOG_DATA:
                    start, end = _two_lsns.unpack_from(data, 1)
                    self._wal_end = max(self._wal_end, end)
                    return WalData(_lsn(Lsn, start), _lsn(Lsn, end), bytes(data[_XLOG_HEADER:]))
                if kind == _KEEPALIVE:
                    end, _, reply = _keepalive.unpack_from(data, 1)
                    self._wal_end = max(self._wal_end, end)
                    if reply:
                        self._send(*self._positions, reply=False)
                        self._replies += 1
                    continue
                raise TransportError(
                    f"the server sent a replication message of unknown type {kind!r}",
                    sqlstate=None,
                    phase="stream",
                    lost=True,
                )
            if size == 0:
                # twice: over TLS one read can leave the rest of a message decrypted in the
                # TLS layer, where the socket does not show it as readable
                if consumed == 2:
                    return None
                conn.consume_input()
                consumed += 1
                continue
            self._ended()

    def _ended(self) -> None:
        """The COPY ended (the server's error, or its CopyDone): raise."""
        conn = self._conn
        self._await_result()
        result = conn.get_result()
        if result is not None and result.status in (
            pq.ExecStatus.FATAL_ERROR,
            pq.ExecStatus.NONFATAL_ERROR,
        ):
            message, sqlstate = _server_error(result, conn)
        else:
            # a CopyDone leaves libpq in COPY_IN, whose result comes back on every call
            message, sqlstate = "the server ended the replication stream", None
        self.close()
        raise TransportError(message, sqlstate=sqlstate, phase="stream", lost=True)

    def wait(self, timeout: float) -> bool:
        try:
            return self._ready(False, timeout)
        except (OSError, ValueError, psycopg.Error) as exc:
            raise self._broken(exc, "stream") from None

    def send_status(self, write: Lsn, flush: Lsn, apply: Lsn, *, reply: bool = False) -> None:
        self._positions = (int(write), int(flush), int(apply))
        self._send(*self._positions, reply=reply)

    def _send(self, write: int, flush: int, apply: int, *, reply: bool) -> None:
        clock = int((time.time() - _EPOCH_2000) * 1_000_000)
        message = _status.pack(b"r", write, flush, apply, clock, 1 if reply else 0)
        conn = self._conn
        try:
            while not conn.put_copy_data(message):  # 0: libpq's buffer is full, for now
                self._ready(True, 1.0)
            while conn.flush():  # 1: not all sent yet
                self._ready(True, 1.0)
        except (psycopg.Error, OSError) as exc:
            raise self._broken(exc, "stream") from None

    def close(self) -> None:
        if not self._finished:
            self._finished = True
            self._conn.finish()


def _log_notice(result: pq.abc.PGresult) -> None:
    message, sqlstate = _server_error(result, None)
    log.info("server notice (%s): %s", sqlstate, scrub_secrets(message))
