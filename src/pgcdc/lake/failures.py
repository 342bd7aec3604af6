"""What a failed run says and keeps.

``PipelineError`` is the error of a pipeline that cannot start or continue. A Spark failure is
summed up in one line (``first_line``: the Python exception it wraps, if any), with a fix for
failures of Spark itself (``spark_hint``: its driver out of memory, its JVM gone). The
micro-batch a stream failed on is recorded in the lake's state (``FailureRecord``) before the
run raises, so that ``pgcdc status`` reports it until a batch is applied.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pgcdc.errors import PgcdcError
from pgcdc.lake.batch import BatchResult
from pgcdc.lake.state import (
    BatchFailure,
    PipelineState,
    batch_offset,
    committed_batch,
    load_state,
    planned_batch,
    save_state,
)
from pgcdc.replication import scrub_secrets

if TYPE_CHECKING:
    from pgcdc.lake.pipeline import Pipeline

__all__ = [
    "FailureRecord",
    "PipelineError",
    "error_class",
    "first_line",
    "spark_hint",
    "spark_reason",
]

log = logging.getLogger("pgcdc.lake")


class PipelineError(PgcdcError, RuntimeError):
    """The pipeline cannot start or continue; the message names the cause and the fix."""


class FailureRecord:
    """The failed micro-batch in ``pipeline``'s state: recorded when its stream fails, cleared
    once a batch is applied; also the ``BatchListener`` that hears of each batch (a batch
    failing in this process tells its error's class exactly)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._lock = threading.Lock()  # batches clear a failure from Spark's thread
        self._failed: tuple[int, str] | None = None  # (batch id, error class) seen in-process

    def batch_done(self, result: BatchResult) -> None:
        self._failed = None
        self.clear(result.batch_id)

    def batch_failed(self, batch_id: int, error: BaseException) -> None:
        self._failed = (batch_id, error_class(error))

    def _update(self, change: Callable[[PipelineState], PipelineState | None]) -> None:
        """Apply ``change`` to the state as saved (``pgcdc drop`` may have written it since)
        and save it atomically; ``change`` returns None to leave it as it is."""
        with self._lock:
            current = load_state(self.pipeline.layout) or self.pipeline.state
            if current is None:
                return
            new = change(current)
            if new is None:
                return
            save_state(self.pipeline.layout, new)
            self.pipeline.state = new

    def record(self, error: BaseException) -> None:
        """Record the micro-batch the stream failed on (planned in the checkpoint's offset
        log, not committed) in the state, before ``run`` raises: ``pgcdc status`` reports it
        until a batch is applied. A stream that failed planning a batch records nothing."""
        state = self.pipeline.state
        if state is None:
            return
        checkpoint = state.checkpoint(self.pipeline.layout)
        batch = planned_batch(checkpoint)
        committed = committed_batch(checkpoint)
        if batch is None or (committed is not None and committed >= batch):
            return
        seen = self._failed
        failed = seen[1] if seen is not None and seen[0] == batch else error_class(error)
        start = state.consistent_point if batch == 0 else batch_offset(checkpoint, batch - 1)
        end = batch_offset(checkpoint, batch)
        now = datetime.now(UTC).isoformat(timespec="seconds")

        def record(current: PipelineState) -> PipelineState:
            before = current.last_failure
            again = before is not None and before.batch == batch
            failure = BatchFailure(
                batch=batch,
                start_lsn=start,
                end_lsn=end,
                error=failed,
                at=now,
                first_at=before.first_at if again and before is not None else now,
                attempts=before.attempts + 1 if again and before is not None else 1,
            )
            return current.evolve(last_failure=failure)

        try:
            self._update(record)
        except Exception as exc:  # the run fails with the stream's error all the same
            log.warning(
                "could not record the failed batch %s in the pipeline state: %s",
                batch,
                scrub_secrets(f"{type(exc).__name__}: {exc}"),
            )
            return
        log.warning(
            "batch %s (LSN %s to %s) failed with %s: recorded in the pipeline state, "
            "pgcdc status reports it until a batch is applied",
            batch,
            start or "-",
            end or "-",
            failed,
            extra={"batch": batch, "min_lsn": start, "max_lsn": end, "error": failed},
        )

    def clear(self, applied: int | None) -> None:
        """Forget the recorded failure: batch ``applied`` is in the lake (a later batch, or
        the failed one applied this time), or (None) when the checkpoint committed it."""
        state = self.pipeline.state
        if state is None or state.last_failure is None:
            return

        def clear(current: PipelineState) -> PipelineState | None:
            failure = current.last_failure
            if failure is None:
                return None
            if applied is None and current.failure_standing(self.pipeline.layout) is not None:
                return None
            if applied is not None and applied < failure.batch:
                return None
            log.info(
                "batch %s is applied: the failure of batch %s is cleared",
                failure.batch if applied is None else applied,
                failure.batch,
                extra={"batch": failure.batch},
            )
            return current.evolve(last_failure=None)

        try:
            self._update(clear)
        except Exception as exc:  # status then reports a failure that was repaired: harmless
            log.warning(
                "could not clear the failed batch in the pipeline state: %s",
                scrub_secrets(f"{type(exc).__name__}: {exc}"),
            )


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Changed|Again|Exit)): .+")


def first_line(error: BaseException) -> str:
    """What failed, in one line: the Python exception a Spark error wraps, if any."""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if raised:
        return raised[-1][:2000]
    return lines[0][:2000] if lines else type(error).__name__


def error_class(error: BaseException) -> str:
    """The class of the exception that failed: the last one a Spark or Py4J error's text
    names (``java.lang.OutOfMemoryError``, ``RuntimeError``), else the error's own."""
    for line in reversed(str(error).splitlines()):
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            return match.group(1)[:200]
    return type(error).__name__


_OUT_OF_MEMORY = ("OutOfMemoryError", "Java heap space", "GC overhead limit exceeded")
_JVM_GONE = ("Answer from Java side is empty", "Error while receiving", "Connection refused")


def spark_reason(error: BaseException) -> str:
    """Spark's own message in a Py4J error: the Java exception's class and whole message (the
    lines after the Py4J call's, up to the stack trace), on one line: Spark's messages say the
    fix on their second line."""
    lines = str(error).splitlines()
    for at, raw in enumerate(lines):
        line = raw.strip()
        if line.startswith(": "):
            said = [line[2:]]
            for more in lines[at + 1 :]:
                if more.startswith("\t") or not more.strip():
                    break
                said.append(more.strip())
            return " ".join(said)[:1000]
    return first_line(error)


def spark_hint(error: BaseException) -> str:
    """The fix for failures of Spark itself: its driver ran out of memory, or its JVM is gone.
    How a gone JVM ended tells which (``pgcdc.spark.session.driver_exit``, waiting a few
    seconds for one that is exiting): a JVM killed by a signal did not run out of its heap
    (``spark_session`` makes the JVM exit with status 3 on OutOfMemoryError rather than hang)."""
    from pgcdc.spark.session import driver_exit

    text = f"{type(error).__name__}: {error}"
    out_of_memory = any(marker in text for marker in _OUT_OF_MEMORY)
    if not out_of_memory and not any(marker in text for marker in _JVM_GONE):
        return ""
    exit_status = None if out_of_memory else driver_exit()
    out_of_memory = out_of_memory or exit_status == 3
    unconfirmed = (
        "Nothing of the failed batch was confirmed to PostgreSQL: the next start applies it"
    )
    signum = _killed_by(exit_status)
    if signum == signal.SIGKILL and not out_of_memory:
        return (
            f"; Spark's driver JVM was killed by SIGKILL (by another process, or by the kernel "
            f"when the machine ran out of memory). {unconfirmed}. Fix: look for the kernel's "
            "out-of-memory killer in the system log (then give the machine more memory, or "
            '[spark.conf] "spark.driver.memory" less), and run again'
        )
    if signum is not None and not out_of_memory:
        name = signal.Signals(signum).name
        return (
            f"; Spark's driver JVM was stopped by {name} from another process (one that "
            f"signals pgcdc's whole process group or service, or the JVM alone). {unconfirmed}. "
            f"Fix: send {name} to pgcdc's process only (it stops Spark after the batch in "
            "progress), and run again"
        )
    if exit_status is not None and not out_of_memory:
        return (
            f"; Spark's driver JVM exited with status {exit_status} (its log above says why). "
            f"{unconfirmed}"
        )
    return (
        "; Spark's driver ran out of memory or stopped (a micro-batch holds whole source "
        "transactions, so a very large transaction needs a driver heap to match). Nothing "
        "of the failed batch was confirmed to PostgreSQL. Fix: give the driver more memory, "
        'e.g. [spark.conf] "spark.driver.memory" = "4g", and run again'
    )


def _killed_by(exit_status: int | None) -> int | None:
    """The signal that ended a JVM: one that killed it (status -N), or one whose handler
    made it exit with 128+N (SIGHUP, SIGINT, SIGTERM run the JVM's shutdown hooks first)."""
    if exit_status is None:
        return None
    signum = -exit_status if exit_status < 0 else exit_status - 128
    known = {s.value for s in signal.Signals}
    if exit_status < 0 or signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        return signum if signum in known else None
    return None
