"""Watching a running pipeline: its slot's health, its metrics, and hooks for progress displays.

* ``RunObserver``: what ``Pipeline.run`` tells a progress display (snapshot started, tables
  copied, stream started with its start and target LSN, each batch, each slot check). The
  methods do nothing by default; they are called from the pipeline's threads (batches from the
  thread Spark runs ``foreachBatch`` in) and must not raise.
* ``BatchEvents``: the ``batch.BatchListener`` that turns applied batches into metrics (changes
  by table and operation, batch durations, lag in seconds) and tells the observer.
* ``SlotMonitor``: a thread that checks the slot every ``[source] health_check_interval``
  seconds: it updates the lag and retained-WAL gauges, logs a warning each time the retained
  WAL crosses ``[source] retained_wal_warning`` (with the sizes, the slot and the fix), and when
  the slot is invalidated or gone, or the publication was dropped, it records a
  ``PipelineError`` naming the fix, which the pipeline raises after stopping its query.
  pgcdc never copies everything again on its own.

Lag, as the metrics define it: ``pgcdc_lag_bytes`` is the server's current WAL position minus
the slot's confirmed position (what the pipeline has not confirmed yet); ``pgcdc_lag_seconds``
is, for the latest batch, the time its commits finished minus the commit time of the newest
source transaction it applied (how late changes reach the lake). Neither grows on an idle
source: with no changes, the slot is confirmed up to the server's WAL end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from pgcdc.lake.results import BatchResult
from pgcdc.lsn import Lsn
from pgcdc.metrics import PipelineMetrics
from pgcdc.replication import (
    Heartbeat,
    ReplicationError,
    SlotHealth,
    SlotNotFoundError,
    missing_publications,
    scrub_secrets,
    slot_health,
    slot_info,
)

if TYPE_CHECKING:
    from pgcdc.lake.store.storage import LakePath

__all__ = [
    "BatchEvents",
    "Observer",
    "RunObserver",
    "SlotMonitor",
    "human_size",
    "publication_gone_message",
    "slot_gone_message",
    "slot_lost_message",
]

log = logging.getLogger("pgcdc.lake")


def human_size(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"`` (1024-based, as PostgreSQL prints sizes)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class Observer(Protocol):
    """What ``Pipeline.run`` tells a progress display (``RunObserver`` documents each call)."""

    def snapshot_started(self, tables: int, consistent_point: Lsn) -> None: ...

    def snapshot_progress(self, table: str | None, rows: int) -> None: ...

    def snapshot_finished(self, rows: int, seconds: float) -> None: ...

    def stream_started(
        self, start: Lsn | None, target: Lsn | None, until_caught_up: bool
    ) -> None: ...

    def batch_done(self, result: BatchResult) -> None: ...

    def slot_checked(self, health: SlotHealth) -> None: ...

    def finished(self) -> None: ...


class RunObserver:
    """Hooks of ``Pipeline.run`` for progress displays; every method is a no-op here."""

    def snapshot_started(self, tables: int, consistent_point: Lsn) -> None:
        """The initial copy of ``tables`` tables at ``consistent_point`` starts."""

    def snapshot_progress(self, table: str | None, rows: int) -> None:
        """``(None, rows read from the source)``, then ``(table id, rows)`` per table copied."""

    def snapshot_finished(self, rows: int, seconds: float) -> None:
        """The initial copy is in the lake."""

    def stream_started(self, start: Lsn | None, target: Lsn | None, until_caught_up: bool) -> None:
        """The stream starts at ``start`` (the slot's confirmed position); ``target`` is the
        server's WAL position at that moment (what catching up means)."""

    def batch_done(self, result: BatchResult) -> None:
        """A micro-batch is in the lake."""

    def slot_checked(self, health: SlotHealth) -> None:
        """The slot monitor measured the slot."""

    def finished(self) -> None:
        """``run`` is returning (or failing)."""


def slot_lost_message(
    slot: str,
    lake: LakePath,
    *,
    wal_status: str | None,
    reason: str | None,
    confirmed: Lsn | None,
) -> str:
    """The error for an invalidated slot, naming the cause and the fix."""
    why = f"wal_status {wal_status!r}" + (f", invalidation reason {reason!r}" if reason else "")
    since = f" since {confirmed}" if confirmed is not None else ""
    return (
        f"slot {slot!r} was invalidated ({why}): the server removed WAL it still needed, so the "
        f"changes{since} cannot be streamed and pgcdc will not copy everything again on its own. "
        "Fix: raise max_slot_wal_keep_size on the server (or keep pgcdc run running) so this "
        f"does not happen again; then, to start over, move the lake {lake} away, drop the slot "
        "(pgcdc drop --config ...) and run again to copy everything again"
    )


def slot_gone_message(slot: str, lake: LakePath, since: str | None) -> str:
    """The error for a slot that no longer exists under a running or resumed pipeline."""
    where = f" since {since}" if since else ""
    return (
        f"slot {slot!r} is gone from the source, so the changes{where} cannot be streamed; "
        f"to copy everything again, move the lake {lake} away and run again"
    )


def publication_gone_message(publication: str, lake: LakePath) -> str:
    """The error for a publication dropped under a running or resumed pipeline."""
    return (
        f"publication {publication!r} is gone from the source: PostgreSQL no longer sends the "
        "changes of its tables (PostgreSQL 15 stops the stream, 16+ skips them with a warning), "
        f"so the lake {lake} can no longer be kept exact, and pgcdc will not copy everything "
        "again on its own. Fix: to start over, drop the slot (pgcdc drop --config ...), move "
        "the lake away and run again to create the publication and copy everything again"
    )


class BatchEvents:
    """Applied batches -> metrics and the observer (a ``batch.BatchListener``)."""

    def __init__(self, metrics: PipelineMetrics, observer: Observer) -> None:
        self.metrics = metrics
        self.observer = observer

    def batch_done(self, result: BatchResult) -> None:
        self.metrics.record_batch(result.seconds, result.per_op)
        if result.max_commit_time is not None and result.finished_at:
            lag = max(0.0, result.finished_at - result.max_commit_time.timestamp())
            self.metrics.record_lag(lag_seconds=lag)
        self.observer.batch_done(result)

    def batch_failed(self, batch_id: int, error: BaseException) -> None:
        self.metrics.record_error("batch")  # the failure's record logs it (failures.py)


class SlotMonitor:
    """Checks the pipeline's slot on a schedule (see the module docstring)."""

    def __init__(
        self,
        dsn: str,
        slot: str,
        lake: LakePath,
        *,
        metrics: PipelineMetrics,
        observer: Observer,
        interval: float,
        warn_bytes: int,
        on_fatal: Callable[[str], None],
        heartbeat: Heartbeat | None = None,
        publication: str | None = None,
    ) -> None:
        """``publication``: also check, each time, that the pipeline's publication exists."""
        self._dsn = dsn
        self.slot = slot
        self.publication = publication
        self.lake = lake
        self.metrics = metrics
        self.observer = observer
        self.interval = interval
        self.warn_bytes = warn_bytes
        self._on_fatal = on_fatal
        self.heartbeat = heartbeat
        self.last: SlotHealth | None = None
        self.checks = 0
        self.warnings = 0
        self._over = False
        self._unreserved = False
        self._heartbeat_failures = 0
        self._fatal = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> SlotHealth | None:
        """Measure the slot now; returns None (after ``on_fatal``) when it is lost or gone."""
        try:
            health = slot_health(self._dsn, self.slot)
        except SlotNotFoundError:
            self._fail(slot_gone_message(self.slot, self.lake, None))
            return None
        self.checks += 1
        self.last = health
        self.metrics.record_lag(
            lag_bytes=health.lag_bytes,
            retained_bytes=health.retained_bytes,
            confirmed_lsn=health.confirmed_flush_lsn,
        )
        reason: str | None = None
        if not health.lost and health.wal_status != "unreserved":
            info = slot_info(self._dsn, self.slot)
            reason = None if info is None else info.invalidation_reason
        if health.lost or reason is not None:
            self.metrics.record_error("slot_invalidated")
            self._fail(
                slot_lost_message(
                    self.slot,
                    self.lake,
                    wal_status=health.wal_status,
                    reason=reason,
                    confirmed=health.confirmed_flush_lsn,
                )
            )
            return None
        if self.publication is not None and missing_publications(self._dsn, [self.publication]):
            self.metrics.record_error("publication_gone")
            self._fail(publication_gone_message(self.publication, self.lake))
            return None
        self._warn(health)
        self.observer.slot_checked(health)
        if self.heartbeat is not None and self.heartbeat.failures > self._heartbeat_failures:
            for _ in range(self.heartbeat.failures - self._heartbeat_failures):
                self.metrics.record_error("heartbeat")
            self._heartbeat_failures = self.heartbeat.failures
        return health

    def _fail(self, message: str) -> None:
        if not self._fatal:
            self._fatal = True
            log.error(message, extra={"slot": self.slot})
            self._on_fatal(message)

    def _warn(self, health: SlotHealth) -> None:
        retained = health.retained_bytes
        over = retained is not None and retained > self.warn_bytes
        if over and not self._over and retained is not None:
            self.warnings += 1
            log.warning(
                "slot %s retains %s of WAL (%s bytes), more than source.retained_wal_warning "
                "(%s): restart LSN %s, confirmed %s, server at %s; the server keeps this WAL on "
                "disk until the pipeline catches up. Fix: keep pgcdc run running and check that "
                "it progresses (pgcdc status), or raise source.retained_wal_warning if this much "
                "is expected",
                self.slot,
                human_size(retained),
                retained,
                human_size(self.warn_bytes),
                health.restart_lsn,
                health.confirmed_flush_lsn,
                health.server_lsn,
                extra={
                    "slot": self.slot,
                    "retained_bytes": retained,
                    "threshold_bytes": self.warn_bytes,
                    "restart_lsn": _text(health.restart_lsn),
                    "confirmed_lsn": _text(health.confirmed_flush_lsn),
                    "server_lsn": _text(health.server_lsn),
                },
            )
        elif not over and self._over:
            log.info(
                "slot %s retains %s of WAL again, below source.retained_wal_warning",
                self.slot,
                human_size(retained or 0),
                extra={"slot": self.slot, "retained_bytes": retained},
            )
        self._over = over
        unreserved = health.wal_status == "unreserved"
        if unreserved and not self._unreserved:
            self.warnings += 1
            log.warning(
                "%s",
                health.warning(self.warn_bytes),
                extra={"slot": self.slot, "wal_status": health.wal_status},
            )
        self._unreserved = unreserved

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.check() is None:
                    return
            except ReplicationError as exc:
                self.metrics.record_error("health_check")
                log.warning(
                    "checking slot %s failed: %s; retrying in %.0f s",
                    self.slot,
                    exc,
                    self.interval,
                    extra={"slot": self.slot},
                )
            except Exception as exc:  # never let the monitor die silently
                self.metrics.record_error("health_check")
                log.warning(
                    "checking slot %s failed: %s; retrying in %.0f s",
                    self.slot,
                    scrub_secrets(f"{type(exc).__name__}: {exc}"),
                    self.interval,
                    extra={"slot": self.slot},
                )

    def start(self) -> SlotMonitor:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="pgcdc-slot-monitor", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.interval + 15)


def _text(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(lsn)
