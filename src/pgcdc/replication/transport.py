"""The wire: one logical replication connection, behind a small interface.

``ReplicationTransport`` is everything the session needs from a replication connection: run a
replication command, start streaming, read one message without blocking, wait for the socket,
send a standby status update. ``Psycopg2Transport`` implements it with psycopg2's
``LogicalReplicationConnection``; this is the only module of pgcdc that imports psycopg2, so the
codec and everything above never see it. Driver errors leave this module as ``TransportError``
(SQLSTATE and scrubbed message), which ``pgcdc.replication.failures`` turns into
``ReplicationError`` subclasses.

psycopg2 answers keepalives that request a reply inside ``read_message`` (with the positions of
the last status sent), and itself reports the server's WAL end as flushed after a keepalive when
the last message received is at or before the last flush position sent: the same rule as
``FeedbackTracker``. It does not tell that a keepalive asked for a reply; the transport counts
such replies (``reply_requests``) from the time of the last status psycopg2 sent: one sent
sooner than its own status interval after the previous one can only be such a reply. A
walsender asks for one after half of ``wal_sender_timeout`` without a status, and, at a server's
shutdown, again and again until the client reports everything sent as flushed.
"""

from __future__ import annotations

import contextlib
import datetime
import select
from collections.abc import Sequence
from typing import Any, Protocol

import psycopg2
import psycopg2.extensions
import psycopg2.extras
from psycopg import sql

from pgcdc.errors import PgcdcError
from pgcdc.lsn import Lsn
from pgcdc.replication.errors import scrub_secrets
from pgcdc.replication.events import WalData

__all__ = [
    "Psycopg2Transport",
    "ReplicationTransport",
    "TransportError",
    "TransportFactory",
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


def driver_message(exc: BaseException) -> str:
    """A psycopg2 error's message on one line, with the server's DETAIL and HINT."""
    text = str(exc) or type(exc).__name__
    diag = getattr(exc, "diag", None)
    detail = getattr(diag, "message_detail", None) if diag is not None else None
    hint = getattr(diag, "message_hint", None) if diag is not None else None
    if detail and detail not in text:
        text = f"{text.rstrip()} DETAIL: {detail}"
    if hint and hint not in text:
        text = f"{text.rstrip()} HINT: {hint}"
    return " ".join(text.split())


def _wrap(exc: BaseException, phase: str, lost: bool) -> TransportError:
    sqlstate = getattr(exc, "pgcode", None)
    return TransportError(driver_message(exc), sqlstate=sqlstate, phase=phase, lost=lost)


class Psycopg2Transport:
    """``ReplicationTransport`` over psycopg2's ``LogicalReplicationConnection``."""

    __slots__ = ("_conn", "_cur", "_feedback", "_interval", "_replies")

    def __init__(self, dsn: str, *, connect_timeout: float = 10.0) -> None:
        try:
            self._conn: Any = psycopg2.connect(
                dsn,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                connect_timeout=max(1, round(connect_timeout)),
            )
        except psycopg2.Error as exc:
            raise _wrap(exc, "connect", lost=True) from None
        self._cur: Any = self._conn.cursor()
        self._interval = 0.0  # psycopg2's own status interval, once streaming
        self._feedback: datetime.datetime | None = None  # its last status sent, as last seen
        self._replies = 0

    @property
    def reply_requests(self) -> int:
        return self._replies

    def _note_feedback(self) -> None:
        """Count a status psycopg2 sent since the last one seen, if it was a reply: its own
        periodic status comes only ``status_interval`` after the previous one."""
        sent = self._cur.feedback_timestamp
        seen, self._feedback = self._feedback, sent
        if seen is not None and sent != seen and (sent - seen).total_seconds() < self._interval:
            self._replies += 1

    @property
    def server_version(self) -> int:
        version: int = self._conn.server_version
        return version

    @property
    def wal_end(self) -> Lsn:
        return _lsn(Lsn, self._cur.wal_end)

    @property
    def closed(self) -> bool:
        return bool(self._conn.closed)

    def command(self, text: str) -> list[tuple[Any, ...]]:
        try:
            self._cur.execute(text)
            return list(self._cur.fetchall()) if self._cur.description else []
        except psycopg2.Error as exc:
            raise _wrap(exc, "command", lost=bool(self._conn.closed)) from None

    def start(
        self,
        slot: str,
        start_lsn: Lsn,
        options: Sequence[tuple[str, str]],
        status_interval: float,
    ) -> None:
        command = start_replication_command(slot, start_lsn, options)
        try:
            # psycopg2 also sends periodic updates itself; it refuses intervals below 1s
            self._interval = max(1.0, status_interval)
            self._cur.start_replication_expert(
                command, decode=False, status_interval=self._interval
            )
        except psycopg2.Error as exc:
            raise _wrap(exc, "start", lost=bool(self._conn.closed)) from None

    def read(self) -> WalData | None:
        try:
            msg = self._cur.read_message()
        except psycopg2.Error as exc:
            # errors while streaming end the COPY: the connection is no longer usable for it
            raise _wrap(exc, "stream", lost=True) from None
        if msg is None:
            # only here, not for each message: a walsender waiting for a reply sends no data
            self._note_feedback()
            return None
        return WalData(_lsn(Lsn, msg.data_start), _lsn(Lsn, msg.wal_end), msg.payload)

    def wait(self, timeout: float) -> bool:
        try:
            readable, _, _ = select.select([self._conn], [], [], max(timeout, 0.0))
        except (OSError, ValueError, psycopg2.Error) as exc:
            raise _wrap(exc, "stream", lost=True) from None
        return bool(readable)

    def send_status(self, write: Lsn, flush: Lsn, apply: Lsn, *, reply: bool = False) -> None:
        try:
            self._cur.send_feedback(
                write_lsn=int(write),
                flush_lsn=int(flush),
                apply_lsn=int(apply),
                reply=reply,
                force=True,
            )
        except psycopg2.Error as exc:
            raise _wrap(exc, "stream", lost=True) from None
        self._feedback = self._cur.feedback_timestamp  # ours: not a reply

    def close(self) -> None:
        if not self._conn.closed:
            with contextlib.suppress(psycopg2.Error):
                self._conn.close()
