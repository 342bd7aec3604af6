"""What a failed run keeps: the micro-batch a stream failed on is recorded in the lake's state
(``FailureRecord``) before the run raises, so that ``pgcdc status`` reports it until a batch is
applied; when the state cannot be written (the disk it is on is full), the record is kept in a
file outside the lake (``pgcdc.lake.store.state.save_failure_note``), where ``status`` reads it too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pgcdc.lake.diagnosis import Diagnosis, diagnose
from pgcdc.lake.results import BatchResult
from pgcdc.lake.store.state import (
    BatchFailure,
    PipelineState,
    batch_offset,
    committed_batch,
    load_state,
    planned_batch,
    remove_failure_notes,
    save_failure_note,
    save_state,
    state_lock,
)
from pgcdc.replication import scrub_secrets

if TYPE_CHECKING:
    from pgcdc.lake.run.pipeline import Pipeline
    from pgcdc.lake.store.storage import LakePath

__all__ = ["FailureRecord"]

log = logging.getLogger("pgcdc.lake")


class FailureRecord:
    """The failed micro-batch in ``pipeline``'s state: recorded when its stream fails, cleared
    once a batch is applied; also the ``BatchListener`` that hears of each batch (a batch
    failing in this process is diagnosed while its Java exception can still be read)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._lock = threading.Lock()  # batches clear a failure from Spark's thread
        self._failed: tuple[int, Diagnosis] | None = None  # (batch id, diagnosis) in-process

    def batch_done(self, result: BatchResult) -> None:
        self._failed = None
        self.clear(result.batch_id)

    def batch_failed(self, batch_id: int, error: BaseException) -> None:
        found = diagnose(error, str(self.pipeline.layout.root))
        self._failed = (batch_id, found)
        log.warning(
            "batch %s failed: %s",
            batch_id,
            scrub_secrets(found.cause),
            extra={"batch": batch_id, "error": found.error},
        )

    def diagnosis(self, error: BaseException) -> Diagnosis:
        """What the stream's ``error`` comes down to: the diagnosis of the batch that failed
        in this process (its Java exception, before Spark turned it into text), else its own."""
        seen = self._failed
        checkpoint = None if self.pipeline.state is None else self._checkpoint()
        batch = None if checkpoint is None else planned_batch(checkpoint)
        if seen is not None and seen[0] == batch:
            return seen[1]
        return diagnose(error, str(self.pipeline.layout.root))

    def _checkpoint(self) -> LakePath:
        assert self.pipeline.state is not None
        return self.pipeline.state.checkpoint(self.pipeline.layout)

    def _committed(self) -> int | None:
        return committed_batch(self._checkpoint())

    def _update(self, change: Callable[[PipelineState], PipelineState | None]) -> None:
        """Apply ``change`` to the state as saved (``pgcdc drop`` may have written it since)
        and save it atomically; ``change`` returns None to leave it as it is."""
        with self._lock, state_lock():
            current = load_state(self.pipeline.layout) or self.pipeline.state
            if current is None:
                return
            new = change(current)
            if new is None:
                return
            save_state(self.pipeline.layout, new)
            self.pipeline.state = new

    def record(self, error: BaseException, diagnosis: Diagnosis | None = None) -> None:
        """Record the micro-batch the stream failed on in the state, before ``run`` raises:
        ``pgcdc status`` reports it until a batch is applied. That is the batch planned in the
        checkpoint's offset log and not committed, or, for a stream that failed planning one
        with a failure pgcdc recognises (its offset log could not be written to a full disk,
        say), the next batch, whose end is unknown. When the state cannot be written, the
        record is kept outside the lake (``save_failure_note``)."""
        state = self.pipeline.state
        if state is None:
            return
        layout = self.pipeline.layout
        checkpoint = state.checkpoint(layout)
        planned = planned_batch(checkpoint)
        committed = committed_batch(checkpoint)
        found = diagnosis or self.diagnosis(error)
        if planned is not None and (committed is None or committed < planned):
            batch, end = planned, batch_offset(checkpoint, planned)
        elif found.known:
            batch, end = (0 if committed is None else committed + 1), None
        else:  # the source failed planning, say: the next start plans again
            return
        start = state.consistent_point if batch == 0 else batch_offset(checkpoint, batch - 1)
        now = datetime.now(UTC).isoformat(timespec="seconds")

        def failed(current: PipelineState) -> PipelineState:
            before = current.last_failure
            again = before is not None and before.batch == batch
            failure = BatchFailure(
                batch=batch,
                start_lsn=start,
                end_lsn=end,
                error=found.error,
                at=now,
                first_at=before.first_at if again and before is not None else now,
                attempts=before.attempts + 1 if again and before is not None else 1,
                cause=found.cause if found.known else None,
                fix=found.fix if found.known else None,
            )
            return current.evolve(last_failure=failure)

        try:
            self._update(failed)
        except Exception as exc:  # the run fails with the stream's error all the same
            reason = scrub_secrets(f"{type(exc).__name__}: {exc}")
            base = self.pipeline.state or state
            kept = save_failure_note(layout, failed(base), reason)
            log.warning(
                "could not record the failed batch %s in the pipeline state (%s): %s",
                batch,
                reason,
                f"kept in {kept} instead, where pgcdc status reads it"
                if kept is not None
                else "nor outside the lake: pgcdc status cannot report it",
                extra={"batch": batch, "note": None if kept is None else str(kept)},
            )
            return
        remove_failure_notes(layout)  # the state holds the failure now
        log.warning(
            "batch %s (LSN %s to %s) failed with %s: recorded in the pipeline state, "
            "pgcdc status reports it until a batch is applied",
            batch,
            start or "-",
            end or "-",
            found.error,
            extra={"batch": batch, "min_lsn": start, "max_lsn": end, "error": found.error},
        )

    def clear(self, applied: int | None) -> None:
        """Forget the recorded failure: batch ``applied`` is in the lake (a later batch, or
        the failed one applied this time), or (None, the query ended without failing) when
        the checkpoint committed it, or it failed planning (its end is unknown) and this
        query planned without failing."""
        layout = self.pipeline.layout
        state = self.pipeline.state
        if applied is not None or state is None:
            done = applied
        else:  # a failure in planning is kept as failing the batch after the last committed
            committed = self._committed()
            done = (-1 if committed is None else committed) + 1
        if done is not None:
            remove_failure_notes(layout, applied=done)
        if state is None or state.last_failure is None:
            return

        def clear(current: PipelineState) -> PipelineState | None:
            failure = current.last_failure
            if failure is None:
                return None
            planning = failure.end_lsn is None
            if applied is None and not planning and current.failure_standing(layout) is not None:
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
