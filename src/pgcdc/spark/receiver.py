"""The receiver: one background thread that streams the slot into the spool and the index.

It runs a ``ReplicationSession`` (pgoutput, binary values unless a column's type needs text,
streaming of large transactions on, the highest protocol version), appends every message to
the ``Spool`` and feeds the ``Framer``, which indexes committed transactions. Other threads
(the stream reader's driver-side methods) wait on ``changed`` for progress.

Acknowledgement: ``confirm_through(end_lsn, commit_lsn)`` (called by the stream reader for
batches Spark has committed) is the only way the slot advances: the receiver thread passes it to
the session once the stream has reached that position and sends a status update at once; the
caller waits for that. Nothing received is acknowledged before Spark committed the batch that
contained it. The same call drops the committed transactions from the index and releases the
spool segments nothing needs any more.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from pgcdc.lsn import Lsn
from pgcdc.protocol.message_types import MessageType
from pgcdc.replication import (
    Idle,
    Reconnected,
    ReplicationError,
    ReplicationSession,
    ServerUnreachableError,
    SlotActiveError,
    SlotNotFoundError,
    StreamOptions,
    WalData,
    slot_info,
)
from pgcdc.replication.database import with_codec_settings
from pgcdc.replication.reconnect import Backoff
from pgcdc.spark.errors import SparkSourceError
from pgcdc.spark.framer import Framer
from pgcdc.spark.index import TransactionIndex
from pgcdc.spark.spool import DEFAULT_SEGMENT_BYTES, RECORD_HEADER, Spool

__all__ = ["Receiver", "ReceiverSettings"]

log = logging.getLogger("pgcdc.spark")

_COMMITS = frozenset({MessageType.COMMIT, MessageType.STREAM_COMMIT})
#: the messages that end a transaction (or a streamed subtransaction) in the Spark source's
#: stream (no two-phase: the framer refuses it)
_ENDS = frozenset({MessageType.COMMIT, MessageType.STREAM_COMMIT, MessageType.STREAM_ABORT})


@dataclass(frozen=True, slots=True)
class ReceiverSettings:
    dsn: str
    slot: str
    publications: tuple[str, ...]
    binary: bool = True
    spool_dir: str | None = None
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    receive_timeout: float = 60.0
    status_interval: float = 2.0
    poll_interval: float = 0.2
    slot_wait: float = 60.0


class Receiver:
    """Streams the slot on a background thread; see the module doc. Shared state is guarded
    by ``lock``; ``changed`` (a Condition on it) is notified on every commit, idle tick and
    failure."""

    def __init__(self, settings: ReceiverSettings) -> None:
        self.settings = settings
        self.spool = Spool(settings.spool_dir, segment_bytes=settings.segment_bytes)
        self.index = TransactionIndex()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.framer: Framer | None = None
        self.error: BaseException | None = None
        self.proto_version = 0
        self.connected = threading.Event()
        #: every commit with an end LSN up to this has been indexed
        self.progress = 0
        self._confirm_target = 0
        self._confirmed = 0
        self._acked = 0  # the highest position sent to the server as flushed
        self._skip_through = 0
        #: the spool offset after the last message the framer took (lock held): a message
        #: written to the spool but not framed yet lies beyond it, whatever it is
        self._framed_end = 0
        self._stop = threading.Event()
        self._session: ReplicationSession | None = None
        self._thread = threading.Thread(target=self._run, name="pgcdc-receiver", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        # a missing slot is the session's to report, with its own fix; an unreachable server
        # its reconnect policy's (the framer still refuses a prepared transaction)
        try:
            info = slot_info(self.settings.dsn, self.settings.slot)
        except ReplicationError as exc:
            log.info("could not check slot %s for two_phase: %s", self.settings.slot, exc)
            info = None
        if info is not None and info.two_phase:
            # its prepared transactions would arrive at PREPARE time, before they commit or not
            raise SparkSourceError(
                f"replication slot {self.settings.slot!r} was created with two_phase: it "
                "decodes prepared transactions at PREPARE time, which the pgcdc Spark source "
                "does not read",
                "use a slot created without two_phase (pgcdc.replication.create_slot, or "
                "pg_create_logical_replication_slot(name, 'pgoutput') without its fourth "
                "argument)",
            )
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop streaming and delete the spool. The spool goes first: Spark may kill the
        process moments after asking it to stop (acknowledgements were sent already)."""
        self._stop.set()
        self.spool.close()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("receiver thread did not stop within %.0fs", timeout)

    def raise_if_failed(self) -> None:
        error = self.error
        if error is not None:
            if isinstance(error, SlotNotFoundError):  # its own fix: restarting would not do
                raise SparkSourceError(
                    f"the pgcdc receiver failed: {error.cause}", error.fix
                ) from error
            if isinstance(error, ReplicationError) and error.fix:  # one fix, not two
                raise SparkSourceError(
                    f"the pgcdc receiver failed: {error.cause}",
                    f"{error.fix}; then restart the streaming query",
                ) from error
            raise SparkSourceError(
                f"the pgcdc receiver failed: {error}",
                "see the driver log; restart the streaming query once the cause is fixed",
            ) from error

    def wait_connected(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.connected.wait(0.1):
            self.raise_if_failed()
            if time.monotonic() > deadline:
                raise SparkSourceError(
                    f"could not start streaming slot {self.settings.slot!r} within {timeout:g}s",
                    "check that the slot exists and no other process streams from it",
                )
        self.raise_if_failed()

    # -- driver-side API (any thread) ------------------------------------------------------
    @property
    def skipped_through(self) -> int:
        """Transactions committing at or below this were committed by Spark (or skipped)."""
        return self._skip_through

    def skip_through(self, commit_lsn: int) -> None:
        """Transactions committing at or below ``commit_lsn`` were processed: do not index."""
        with self.lock:
            self._skip_through = max(self._skip_through, commit_lsn)
            if self.framer is not None:
                self.framer.skip_through = max(self.framer.skip_through, commit_lsn)

    def confirm_through(self, end_lsn: int, commit_lsn: int, *, wait: float = 2.0) -> None:
        """Spark committed every transaction up to ``commit_lsn`` (ending at ``end_lsn``):
        acknowledge it to the server, forget it, and release its spool data.

        Waits up to ``wait`` seconds for the receiver to send the acknowledgement (Spark may
        end the reader process right after the last batch, without calling ``stop``).
        """
        with self.lock:
            new_target = end_lsn > self._confirm_target
            self._confirm_target = max(self._confirm_target, end_lsn)
            self.index.drop_through(commit_lsn)
            self._skip_through = max(self._skip_through, commit_lsn)
            if self.framer is not None:
                self.framer.skip_through = max(self.framer.skip_through, commit_lsn)
            # not the spool's size: the receiver writes a message before it frames it
            below = self._framed_end
            needed = self.index.needed_ranges()
            if self.framer is not None:
                needed += self.framer.open_ranges(below)
        # by segment: a long open streamed transaction keeps its blocks' segments, not all
        # that came after its first
        self.spool.release_unneeded(needed, below)
        if new_target and wait > 0:
            deadline = time.monotonic() + wait
            with self.changed:
                while self._acked < end_lsn and self.error is None and self.progress >= end_lsn:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._thread.is_alive():
                        break
                    self.changed.wait(remaining)

    # -- the thread ------------------------------------------------------------------------
    def _open(self) -> ReplicationSession:
        settings = self.settings
        options = StreamOptions(
            publication_names=settings.publications, binary=settings.binary, streaming="on"
        )
        deadline = time.monotonic() + settings.slot_wait
        outage: Backoff | None = None
        while True:
            session = ReplicationSession(
                with_codec_settings(settings.dsn),  # values in text form as the codec reads them
                settings.slot,
                options,
                status_interval=settings.status_interval,
                poll_interval=settings.poll_interval,
                receive_timeout=settings.receive_timeout,
            )
            try:
                session.connect()
                return session
            except ServerUnreachableError as exc:
                # the source answered SQL a moment ago (the query's start checked the slot):
                # a network blip or a server restart gets the reconnect policy of a running
                # stream, not a failed query
                session.close()
                outage = outage or Backoff(session.reconnect)
                delay = outage.next_delay()
                if delay is None or self._stop.is_set():
                    raise
                log.warning(
                    "receiver for slot %s could not connect (%s); retrying in %.1fs",
                    settings.slot,
                    exc.cause,
                    delay,
                )
                time.sleep(delay)
            except SlotActiveError:
                session.close()
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                # the previous run's reader may still be letting go of the slot
                time.sleep(0.5)

    def _run(self) -> None:
        try:
            session = self._session = self._open()
            with self.lock:
                self.proto_version = session.proto_version
                self.framer = Framer(self.index, session.proto_version)
                self.framer.skip_through = self._skip_through
            self.connected.set()
            try:
                self._loop(session)
            finally:
                session.close()
        except BaseException as exc:
            if self._stop.is_set():
                return  # stopping: the spool was closed under the thread
            log.error("pgcdc receiver for slot %s failed: %s", self.settings.slot, exc)
            with self.lock:
                self.error = exc
                self.changed.notify_all()
        finally:
            self.connected.set()

    def _loop(self, session: ReplicationSession) -> None:
        framer = self.framer
        assert framer is not None
        spool = self.spool
        lock = self.lock
        for event in session.events():
            if isinstance(event, WalData):
                payload = event.payload
                offset = spool.append(payload)
                if payload and payload[0] in _COMMITS:
                    spool.flush()  # a committed transaction is readable before it is indexed
                with lock:
                    entry = framer.feed(payload, offset)
                    self._framed_end = offset + RECORD_HEADER.size + len(payload)
                    if entry is not None or framer.progress > self.progress:
                        self.progress = max(self.progress, framer.progress)
                        self.changed.notify_all()
                    quiet = not len(self.index)
                if (
                    quiet
                    and entry is None
                    and payload[0] in _ENDS
                    and event.data_start > self._confirmed
                ):
                    # a transaction with no row for the query, or a streamed one aborted, while
                    # nothing Spark reads is unconfirmed: Spark never confirms it, and it would
                    # keep the session from acknowledging anything after it
                    self._confirm_quietly(session, event.data_start)
            elif isinstance(event, Idle):
                with lock:
                    self.progress = max(self.progress, framer.progress, event.server_wal_end)
                    self.changed.notify_all()
            elif isinstance(event, Reconnected):
                with lock:
                    framer.reset()
                log.info(
                    "receiver for slot %s reconnected, resuming at %s",
                    self.settings.slot,
                    event.resume_lsn,
                )
            target = self._confirm_target
            if target > self._confirmed and self.progress >= target:
                session.confirm(Lsn(target))
                # now: the process may be ended at any moment
                session.request_status(reply=False)
                self._confirmed = target
                with lock:
                    self._acked = target
                    self.changed.notify_all()
                log.info("slot %s: confirmed %s", self.settings.slot, Lsn(target))
            if self._stop.is_set():
                return

    def _confirm_quietly(self, session: ReplicationSession, lsn: int) -> None:
        """Confirm ``lsn`` (the dataStart of a transaction's end) while the index holds nothing:
        every commit the server sent up to it is either confirmed by Spark or had no row."""
        session.confirm(Lsn(lsn))
        self._confirmed = lsn
        with self.lock:
            self._acked = max(self._acked, lsn)
            self.changed.notify_all()
