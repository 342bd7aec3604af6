"""What the pipeline's parts hand each other across rooms: a batch's result and the pipeline's
error. A leaf module (it imports nothing of pgcdc.lake), so that the writer, the monitor and
the run's parts can all name them without importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from pgcdc.errors import PgcdcError

__all__ = ["BatchResult", "PipelineError"]


class PipelineError(PgcdcError, RuntimeError):
    """The pipeline cannot start or continue; the message names the cause and the fix."""


@dataclass(slots=True)
class BatchResult:
    """What one micro-batch did: its changes and tables, its LSN range, how long it took."""

    batch_id: int
    changes: int = 0
    tables: int = 0
    skipped: bool = False
    min_lsn: int | None = None
    max_lsn: int | None = None
    seconds: float = 0.0
    per_table: dict[str, int] = field(default_factory=dict)
    #: changes per (table id, operation 'I' / 'U' / 'D' / 'T')
    per_op: dict[tuple[str, str], int] = field(default_factory=dict)
    #: commit time of the newest source transaction the batch wrote to a mirror
    max_commit_time: datetime | None = None
    #: wall-clock time (``time.time()``) the batch's commits were done
    finished_at: float = 0.0
