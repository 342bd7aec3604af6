"""Logical replication slots (pgoutput): create, create with an exported snapshot, drop, inspect.

A slot remembers how far its consumer got (``confirmed_flush_lsn``) and keeps the WAL the consumer
still needs. ``create_slot`` makes one through SQL. ``create_slot_with_snapshot`` makes one on a
replication connection with ``SNAPSHOT 'export'`` for the initial copy: the returned
``ExportedSnapshot`` keeps that connection open and idle, which is what keeps the snapshot usable
(``SET TRANSACTION SNAPSHOT``), until the caller releases it; changes committed after its
``consistent_point`` are what the slot streams. ``slot_info`` reads ``pg_replication_slots``.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from pgcdc.lsn import Lsn
from pgcdc.replication.database import (
    UNLIMITED_TRANSACTION,
    Connectable,
    raise_sql_error,
    server_name,
    sql_connection,
    without_time_limits,
)
from pgcdc.replication.errors import (
    ReplicationError,
    SlotActiveError,
    SlotInvalidatedError,
    SlotMismatchError,
    SlotNotFoundError,
    describe_server,
)
from pgcdc.replication.failures import Doing, classify, doing_in_phase
from pgcdc.replication.transport import (
    LibpqTransport,
    ReplicationTransport,
    TransportError,
    TransportFactory,
)

__all__ = [
    "ACTIVE_WAIT_SECONDS",
    "CreatedSlot",
    "ExportedSnapshot",
    "SlotInfo",
    "check_slot_name",
    "create_slot",
    "create_slot_with_snapshot",
    "drop_slot",
    "list_slots",
    "slot_info",
]

log = logging.getLogger("pgcdc.replication")

_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


def check_slot_name(name: str) -> str:
    """``name`` if PostgreSQL accepts it as a slot name, else ValueError saying why."""
    if not isinstance(name, str) or not _SLOT_NAME.fullmatch(name):
        raise ValueError(
            f"invalid replication slot name {name!r}: slot names are 1 to 63 characters, "
            "lower-case letters, digits and underscores only"
        )
    return name


def _lsn(value: object) -> Lsn | None:
    return None if value is None else Lsn.parse(str(value))


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """One row of ``pg_replication_slots`` (columns newer than PostgreSQL 15 are None there)."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    wal_status: str | None
    two_phase: bool
    conflicting: bool | None = None  # 16+
    invalidation_reason: str | None = None  # 17+
    inactive_since: str | None = None  # 17+

    @property
    def lost(self) -> bool:
        """Whether the slot was invalidated (``wal_status = 'lost'``): it can never stream."""
        return self.wal_status == "lost" or self.invalidation_reason is not None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SlotInfo:
        return cls(
            name=row["slot_name"],
            plugin=row.get("plugin"),
            slot_type=row["slot_type"],
            database=row.get("database"),
            temporary=bool(row.get("temporary")),
            active=bool(row.get("active")),
            active_pid=row.get("active_pid"),
            restart_lsn=_lsn(row.get("restart_lsn")),
            confirmed_flush_lsn=_lsn(row.get("confirmed_flush_lsn")),
            wal_status=row.get("wal_status"),
            two_phase=bool(row.get("two_phase")),
            conflicting=row.get("conflicting"),
            invalidation_reason=row.get("invalidation_reason"),
            inactive_since=row.get("inactive_since"),
        )


# to_jsonb() makes the query independent of which columns this server version has
_SLOT_QUERY = "SELECT to_jsonb(s) FROM pg_replication_slots s WHERE s.slot_name = %s"
_SLOTS_QUERY = (
    "SELECT to_jsonb(s) FROM pg_replication_slots s "
    "WHERE %(db)s::text IS NULL OR s.database = %(db)s ORDER BY s.slot_name"
)


def slot_info(target: Connectable, name: str) -> SlotInfo | None:
    """The slot's row of ``pg_replication_slots``, or None if there is no such slot."""
    with sql_connection(target) as conn:
        try:
            row = conn.execute(_SLOT_QUERY, (name,)).fetchone()
        except psycopg.Error as exc:
            raise_sql_error(exc, conn, slot=name)
    return None if row is None else SlotInfo.from_row(row[0])


def list_slots(target: Connectable, *, database: str | None = None) -> list[SlotInfo]:
    """Every slot of the server, or of one database."""
    with sql_connection(target) as conn:
        try:
            rows = conn.execute(_SLOTS_QUERY, {"db": database}).fetchall()
        except psycopg.Error as exc:
            raise_sql_error(exc, conn)
    return [SlotInfo.from_row(row[0]) for row in rows]


#: how long a consumer starting on a slot waits for the slot's previous walsender to exit (a
#: consumer that just stopped on it: its walsender exits a moment after the connection closed)
ACTIVE_WAIT_SECONDS = 10.0


def wait_for_release(
    target: Connectable, name: str, seconds: float, info: SlotInfo | None = None
) -> SlotInfo | None:
    """The slot's state once no walsender holds it, or after ``seconds`` (a consumer that just
    stopped leaves its walsender exiting for a moment); ``info``: the state already read."""
    if info is None:
        info = slot_info(target, name)
    deadline = time.monotonic() + seconds
    while info is not None and info.active and not info.lost and time.monotonic() < deadline:
        time.sleep(0.2)
        info = slot_info(target, name)
    return info


def require_usable_slot(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    allow_active: bool = False,
    active_wait: float = 0.0,
) -> SlotInfo:
    """The slot, checked to be a logical pgoutput slot of this database that can stream
    (waiting up to ``active_wait`` seconds for it to be released if it is in use)."""
    info = slot_info(conn, name) if allow_active else wait_for_release(conn, name, active_wait)
    server = server_name(conn)
    if info is None:
        raise SlotNotFoundError(
            f"replication slot {name!r} does not exist on {server}",
            "create it first (pgcdc.replication.create_slot) or fix the slot name",
        )
    if info.slot_type != "logical":
        raise SlotMismatchError(
            f"replication slot {name!r} on {server} is a {info.slot_type} slot",
            "use a logical slot created with the pgoutput plugin",
        )
    if info.plugin != "pgoutput":
        raise SlotMismatchError(
            f"replication slot {name!r} on {server} uses the output plugin {info.plugin!r}, "
            "not pgoutput",
            "create a slot with the pgoutput plugin (pgcdc.replication.create_slot)",
        )
    if info.database != conn.info.dbname:
        raise SlotMismatchError(
            f"replication slot {name!r} belongs to database {info.database!r}, but {server} "
            f"names database {conn.info.dbname!r}",
            f"connect to database {info.database!r}",
        )
    if info.lost:
        reason = f" ({info.invalidation_reason})" if info.invalidation_reason else ""
        raise SlotInvalidatedError(
            f"replication slot {name!r} on {server} was invalidated{reason}: wal_status is "
            f"{info.wal_status!r}, the WAL it needed is gone",
            "drop the slot and create it again, then re-copy the tables (changes since the "
            "slot's last position are lost); raise max_slot_wal_keep_size so it does not "
            "happen again",
        )
    if info.active and not allow_active:
        raise SlotActiveError(
            f"replication slot {name!r} on {server} is in use by process {info.active_pid}",
            "stop the other consumer of this slot, or terminate its walsender "
            f"(SELECT pg_terminate_backend({info.active_pid})), or use another slot",
        )
    return info


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    """A new slot: it streams every transaction that commits after ``consistent_point``."""

    name: str
    consistent_point: Lsn


def create_slot(
    target: Connectable, name: str, *, two_phase: bool = False, temporary: bool = False
) -> CreatedSlot:
    """Create a logical slot with the pgoutput plugin through SQL.

    ``two_phase`` (PostgreSQL 15+) makes the slot decode prepared transactions at PREPARE time.
    A ``temporary`` slot lives as long as the SQL session that made it, so it needs a
    connection object, not a connection string; to stream from a temporary slot, let
    ``ReplicationSession(temporary_slot=True)`` create it on its own connection.
    """
    check_slot_name(name)
    if temporary and not isinstance(target, psycopg.Connection):
        raise ValueError(
            "a temporary slot made through SQL is dropped when its connection closes: pass an "
            "open psycopg.Connection (or use create_slot_with_snapshot(temporary=True), or "
            "ReplicationSession(temporary_slot=True))"
        )
    with sql_connection(target) as conn:
        try:
            row = conn.execute(
                "SELECT slot_name::text, lsn::text "
                "FROM pg_create_logical_replication_slot(%s, 'pgoutput', %s, %s)",
                (name, temporary, two_phase),
            ).fetchone()
        except psycopg.Error as exc:
            raise_sql_error(exc, conn, slot=name, doing=Doing.CREATE_SLOT)
    assert row is not None
    created = CreatedSlot(row[0], Lsn.parse(row[1]))
    log.info(
        "created replication slot %s at %s (two_phase=%s, temporary=%s)",
        name,
        created.consistent_point,
        two_phase,
        temporary,
    )
    return created


class ExportedSnapshot:
    """A slot just created on a replication connection, with its exported snapshot.

    ``snapshot_name`` can be passed to ``SET TRANSACTION SNAPSHOT`` (in a REPEATABLE READ
    transaction) by any number of other connections, which then see the database exactly as of
    ``consistent_point``; the slot streams what commits after it. The snapshot stays valid only
    while this object's connection is open and idle: call ``release()`` (or leave the ``with``
    block) once every copying transaction has imported it. A temporary slot is dropped on
    release too.
    """

    __slots__ = (
        "_server",
        "_transport",
        "consistent_point",
        "slot_name",
        "snapshot_name",
        "temporary",
        "two_phase",
    )

    def __init__(
        self,
        transport: ReplicationTransport,
        *,
        slot_name: str,
        consistent_point: Lsn,
        snapshot_name: str,
        two_phase: bool,
        temporary: bool,
        server: str,
    ) -> None:
        self._transport: ReplicationTransport | None = transport
        self._server = server
        self.slot_name = slot_name
        self.consistent_point = consistent_point
        self.snapshot_name = snapshot_name
        self.two_phase = two_phase
        self.temporary = temporary

    @property
    def held(self) -> bool:
        """Whether the snapshot (and a temporary slot) is still being kept alive."""
        return self._transport is not None and not self._transport.closed

    def release(self) -> None:
        """Close the connection: the snapshot becomes unusable (a temporary slot is dropped)."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            log.info(
                "released exported snapshot of slot %s (consistent point %s)",
                self.slot_name,
                self.consistent_point,
            )

    def __enter__(self) -> ExportedSnapshot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"ExportedSnapshot(slot_name={self.slot_name!r}, "
            f"consistent_point={self.consistent_point}, snapshot_name={self.snapshot_name!r}, "
            f"held={self.held})"
        )


def create_slot_with_snapshot(
    dsn: str,
    name: str,
    *,
    two_phase: bool = False,
    temporary: bool = False,
    connect_timeout: float = 10.0,
    transport_factory: TransportFactory = LibpqTransport,
) -> ExportedSnapshot:
    """``CREATE_REPLICATION_SLOT name [TEMPORARY] LOGICAL pgoutput (SNAPSHOT 'export')``.

    Runs on a new replication connection that the returned handle keeps open; see
    ``ExportedSnapshot``. ``two_phase`` adds ``TWO_PHASE`` (PostgreSQL 15+).
    """
    check_slot_name(name)
    server = describe_server(dsn)
    try:
        # the snapshot is held in an idle transaction for as long as the copy runs
        transport = transport_factory(without_time_limits(dsn), connect_timeout=connect_timeout)
    except TransportError as exc:
        raise classify(
            exc.message, exc.sqlstate, server=server, slot=name, doing=doing_in_phase(exc.phase)
        ).error from None
    options = [sql.SQL("SNAPSHOT 'export'")]
    if two_phase:
        options.append(sql.SQL("TWO_PHASE true"))
    command = sql.SQL("CREATE_REPLICATION_SLOT {} {}LOGICAL pgoutput ({})").format(
        sql.Identifier(name),
        sql.SQL("TEMPORARY " if temporary else ""),
        sql.SQL(", ").join(options),
    )
    try:
        transport.command(UNLIMITED_TRANSACTION)
        rows = transport.command(command.as_string())
    except TransportError as exc:
        transport.close()
        raise classify(
            exc.message, exc.sqlstate, server=server, slot=name, doing=doing_in_phase(exc.phase)
        ).error from None
    if len(rows) != 1 or len(rows[0]) < 3:
        transport.close()
        raise ReplicationError(
            f"{server} answered CREATE_REPLICATION_SLOT with an unexpected result {rows!r}",
            "report this as a pgcdc bug",
        )
    slot_name, consistent_point, snapshot_name = rows[0][0], rows[0][1], rows[0][2]
    handle = ExportedSnapshot(
        transport,
        slot_name=str(slot_name),
        consistent_point=Lsn.parse(str(consistent_point)),
        snapshot_name=str(snapshot_name),
        two_phase=two_phase,
        temporary=temporary,
        server=server,
    )
    log.info(
        "created replication slot %s at %s with exported snapshot %s (two_phase=%s, temporary=%s)",
        name,
        handle.consistent_point,
        handle.snapshot_name,
        two_phase,
        temporary,
    )
    return handle


def drop_slot(
    target: Connectable,
    name: str,
    *,
    terminate_active: bool = False,
    missing_ok: bool = False,
    timeout: float = 10.0,
) -> bool:
    """Drop the slot; whether there was one to drop.

    An active slot (a walsender streams from it) raises ``SlotActiveError`` unless
    ``terminate_active``, which terminates that walsender first and waits up to ``timeout``
    seconds for it to let go of the slot.
    """
    with sql_connection(target) as conn:
        deadline = time.monotonic() + timeout
        terminated = False
        while True:
            info = slot_info(conn, name)
            if info is None:
                if missing_ok:
                    return False
                raise SlotNotFoundError(
                    f"replication slot {name!r} does not exist on {server_name(conn)}",
                    "check the name (pgcdc.replication.list_slots), or pass missing_ok=True",
                )
            if info.active and info.active_pid is not None:
                if not terminate_active:
                    raise SlotActiveError(
                        f"replication slot {name!r} on {server_name(conn)} is in use by "
                        f"process {info.active_pid}",
                        "stop its consumer first, or pass terminate_active=True to terminate "
                        "that walsender",
                    )
                if time.monotonic() > deadline:
                    raise SlotActiveError(
                        f"replication slot {name!r} on {server_name(conn)} is still in use by "
                        f"process {info.active_pid} {timeout:g}s after terminating it",
                        "check why that process does not exit (pg_stat_activity)",
                    )
                if not terminated:
                    log.info(
                        "terminating walsender %s of replication slot %s", info.active_pid, name
                    )
                    try:
                        conn.execute("SELECT pg_terminate_backend(%s)", (info.active_pid,))
                    except psycopg.Error as exc:
                        raise_sql_error(exc, conn, slot=name)
                    terminated = True
                time.sleep(0.05)
                continue
            try:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.errors.UndefinedObject) and missing_ok:
                    return False
                if (
                    isinstance(exc, psycopg.errors.ObjectInUse)
                    and terminate_active
                    and time.monotonic() < deadline
                ):
                    terminated = False  # someone else took the slot meanwhile
                    time.sleep(0.05)
                    continue
                raise_sql_error(exc, conn, slot=name, doing=Doing.SLOT)
            log.info("dropped replication slot %s", name)
            return True
