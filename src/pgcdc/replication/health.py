"""Keeping a slot healthy: how much WAL it retains, and heartbeats that let it advance.

A logical slot holds back WAL from its ``restart_lsn`` on. ``slot_health`` measures that (bytes
retained, lag of the confirmed position behind the server's WAL, ``wal_status`` and
``safe_wal_size`` against ``max_slot_wal_keep_size``) and says when it is time to worry.

On a database with no published traffic, or whose traffic is all filtered out, nothing arrives
for the slot, and its restart position only moves when the walsender decodes records of this
database. ``Heartbeat`` writes a tiny record on a schedule (a non-transactional logical message
by default, or an UPDATE of a heartbeat table) so the slot keeps decoding and advancing.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgcdc.lsn import Lsn
from pgcdc.replication.database import Connectable, server_name, sql_connection
from pgcdc.replication.errors import SlotInvalidatedError, SlotNotFoundError, scrub_secrets

__all__ = ["DEFAULT_WARN_BYTES", "Heartbeat", "SlotHealth", "slot_health"]

log = logging.getLogger("pgcdc.replication")

#: Retained WAL above which ``SlotHealth.warning`` speaks up (1 GiB).
DEFAULT_WARN_BYTES = 1 << 30

_HEALTH_QUERY = """
SELECT s.slot_name::text, s.active, s.active_pid, s.wal_status,
       s.restart_lsn::text, s.confirmed_flush_lsn::text,
       pg_current_wal_lsn()::text,
       CASE WHEN s.restart_lsn IS NULL THEN NULL
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint END,
       CASE WHEN s.confirmed_flush_lsn IS NULL THEN NULL
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint END,
       s.safe_wal_size,
       current_setting('max_slot_wal_keep_size')
FROM pg_catalog.pg_replication_slots s
WHERE s.slot_name = %s
"""


@dataclass(frozen=True, slots=True)
class SlotHealth:
    """A slot's WAL retention, measured on the server at one moment."""

    slot: str
    active: bool
    active_pid: int | None
    wal_status: str | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    server_lsn: Lsn
    retained_bytes: int | None
    lag_bytes: int | None
    safe_wal_size: int | None
    max_slot_wal_keep_size: str

    @property
    def lost(self) -> bool:
        return self.wal_status == "lost"

    def warning(self, warn_bytes: int = DEFAULT_WARN_BYTES) -> str | None:
        """A sentence for the operator when the slot retains too much WAL or is at risk."""
        if self.lost:
            return (
                f"slot {self.slot} was invalidated (wal_status 'lost'): the WAL it needed was "
                "removed; it can never stream again"
            )
        if self.wal_status == "unreserved":
            return (
                f"slot {self.slot} retains more WAL than max_slot_wal_keep_size "
                f"({self.max_slot_wal_keep_size}) allows and will be invalidated at the next "
                "checkpoint unless it catches up: make the consumer run, or raise the setting"
            )
        if self.retained_bytes is not None and self.retained_bytes > warn_bytes:
            return (
                f"slot {self.slot} retains {_size(self.retained_bytes)} of WAL (restart LSN "
                f"{self.restart_lsn}, server at {self.server_lsn}): the consumer is behind or not "
                "running; disk use on the server grows until it catches up"
            )
        return None


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    raise AssertionError("unreachable")


def _lsn(text: object) -> Lsn | None:
    return None if text is None else Lsn.parse(str(text))


def slot_health(target: Connectable, slot: str) -> SlotHealth:
    """Measure ``slot``. Raises SlotNotFoundError when it does not exist."""
    with sql_connection(target) as conn:
        row = conn.execute(_HEALTH_QUERY, (slot,)).fetchone()
        if row is None:
            raise SlotNotFoundError(
                f"replication slot {slot!r} does not exist on {server_name(conn)}",
                "create it (pgcdc run creates its slot on first start) or fix the slot name",
            )
    name, active, pid, status, restart, confirmed, current, retained, lag, safe, keep = row
    return SlotHealth(
        slot=str(name),
        active=bool(active),
        active_pid=pid,
        wal_status=status,
        restart_lsn=_lsn(restart),
        confirmed_flush_lsn=_lsn(confirmed),
        server_lsn=Lsn.parse(str(current)),
        retained_bytes=None if retained is None else int(retained),
        lag_bytes=None if lag is None else int(lag),
        safe_wal_size=None if safe is None else int(safe),
        max_slot_wal_keep_size=str(keep),
    )


def raise_if_lost(health: SlotHealth, server: str) -> None:
    """A clear error when the slot was invalidated; never a silent re-snapshot."""
    if health.lost:
        raise SlotInvalidatedError(
            f"replication slot {health.slot!r} on {server} was invalidated (wal_status 'lost'): "
            "the server removed WAL it still needed, so changes since its last confirmed "
            f"position {health.confirmed_flush_lsn} are gone",
            "drop the slot and start over with a new snapshot (pgcdc drop, then pgcdc run), "
            "and raise max_slot_wal_keep_size or keep the consumer running to avoid it",
        )


class Heartbeat:
    """Writes a small WAL record every ``interval`` seconds from its own connection.

    ``mode="message"`` (default) emits ``pg_logical_emit_message(false, prefix, <counter>)``:
    no table needed, nothing published. ``mode="table"`` runs ``UPDATE <table> SET beat =
    now()`` on a one-row table (created if missing when ``create=True``) that a publication can
    include. Errors are logged (without secrets) and retried at the next beat; they never stop
    the pipeline.
    """

    def __init__(
        self,
        dsn: str,
        *,
        interval: float = 30.0,
        mode: str = "message",
        prefix: str = "pgcdc_heartbeat",
        table: str = "pgcdc_heartbeat",
        schema: str = "public",
        create: bool = True,
    ) -> None:
        if mode not in ("message", "table"):
            raise ValueError(f"heartbeat mode must be 'message' or 'table', not {mode!r}")
        if not interval > 0:
            raise ValueError(f"heartbeat interval must be positive seconds, not {interval!r}")
        self.dsn = dsn
        self.interval = float(interval)
        self.mode = mode
        self.prefix = prefix
        self.table = sql.Identifier(schema, table)
        self.create = create
        self.beats = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None

    def beat(self) -> Lsn:
        """Write one heartbeat now; returns the WAL position written."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
            if self.mode == "table" and self.create:
                self._conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY CHECK (id = 1),"
                        " beat timestamptz NOT NULL)"
                    ).format(self.table)
                )
                self._conn.execute(
                    sql.SQL("INSERT INTO {} VALUES (1, now()) ON CONFLICT DO NOTHING").format(
                        self.table
                    )
                )
        if self.mode == "message":
            row = self._conn.execute(
                "SELECT pg_logical_emit_message(false, %s, %s)::text",
                (self.prefix, str(self.beats + 1)),
            ).fetchone()
        else:
            self._conn.execute(
                sql.SQL("UPDATE {} SET beat = now() WHERE id = 1").format(self.table)
            )
            row = self._conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        self.beats += 1
        return Lsn.parse(str(row[0])) if row else Lsn(0)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                lsn = self.beat()
                log.debug("heartbeat %d at %s", self.beats, lsn)
            except psycopg.Error as exc:
                self.failures += 1
                log.warning(
                    "heartbeat failed (%s); retrying in %.0f s",
                    scrub_secrets(str(exc).strip().splitlines()[0]),
                    self.interval,
                )
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

    def start(self) -> Heartbeat:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pgcdc-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
            self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
