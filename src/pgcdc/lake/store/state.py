"""The pipeline's own state, kept under ``<lake>/_pgcdc/state.json`` so it survives restarts.

It records which source the lake mirrors (server system identifier, database, slot,
publication), which tables, the snapshot generation and whether its initial copy finished
(``snapshot_done``), the slot's consistent point, and the streaming checkpoint and Delta
application id the stream uses. Writes are atomic: a temporary file renamed over the old one
locally, one whole object on S3.

``publication_created`` says whether pgcdc created the publication (``pgcdc drop`` drops only
such a one; state files written before this field existed read as False: keep it).
``dropped_at`` is set by ``pgcdc drop`` when it dropped the slot: ``run`` then refuses to
start (the changes since the slot's position are gone), instead of copying everything again
into a lake that still holds the old tables; moving the lake away starts over.

``phases`` records the tables that joined or left the pipeline after its initial copy
(``TablePhase``; ``pgcdc.lake.run.table_set``): a table added to the configuration is ``copying``
(saved before anything of its copy is created, so that a start that finds it so removes what
the copy left and copies it again), then ``streaming`` from the LSN its copy was taken at
(``copied_at``: the stream applies its changes committed at or after it); a table removed from
the configuration is ``removed`` (its Delta tables are kept, no longer written). ``tables``
lists the tables the stream writes: the initial copy's and the added ones once copied.

``shapes`` records each table's shape (``pgcdc.lake.run.shape``) when a query starts. ``columns``
(column numbers only) is what states written before shapes kept: read as their baseline, and
no longer written.

``last_failure`` (a ``BatchFailure``) is the micro-batch a run failed on, until a batch is
applied again: ``pgcdc status`` shows it and exits 1 while it stands (``failure_standing``: the
streaming checkpoint has not committed that batch since). The checkpoint helpers read Spark's
offset and commit logs (``offsets/<batch>``, ``commits/<batch>``) without Spark.

A failure the state cannot take (the disk that holds the lake is full) is kept in a note
outside the lake instead (``save_failure_note``): a small JSON file named after the lake,
``failure-<digest>.json``, in the first of ``note_folders`` that takes it
(``$XDG_STATE_HOME/pgcdc`` or ``~/.local/state/pgcdc``, then ``/dev/shm/pgcdc-<uid>``, then the
temporary directory's ``pgcdc-<uid>``: different file systems, as a rule). ``pgcdc status``
on the same machine reads it (``load_failure_note``); the run that records a failure in the
state again, or applies the batch, removes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pgcdc.errors import PgcdcError
from pgcdc.lake.store.storage import LakeLocation, LakePath, Lease, StorageError, StoreConflict
from pgcdc.lake.store.tables import LakeLayout, encode_name

__all__ = [
    "RUN_LOCK",
    "STATE_FORMAT",
    "BatchFailure",
    "FailureNote",
    "PipelineState",
    "StateError",
    "TablePhase",
    "batch_offset",
    "check_writable",
    "committed_batch",
    "load_failure_note",
    "load_state",
    "note_folders",
    "now",
    "planned_batch",
    "remove_failure_notes",
    "remove_torn_writes",
    "request_resync",
    "resync_done",
    "resync_requests",
    "run_lock",
    "save_failure_note",
    "save_state",
    "state_lock",
    "update_state",
]

log = logging.getLogger("pgcdc.lake")

#: 5: tables copied while the others stream (``TablePhase.from_batch``, the ``catching-up``
#: phase); 4: parked tables (``TablePhase.reason``); 3: ``phases`` (tables added or removed
#: after the initial copy); 2: the lake's tables are written by Delta's Spark connector
#: (deletion vectors, column mapping); 1 was delta-rs's copy-on-write tables, which this
#: version does not write to. A format 2 to 4 state reads as one without what came later (and
#: is written as 5 from then on: an older pgcdc then refuses it by name)
STATE_FORMAT = 5
#: the formats this version reads
READABLE_FORMATS = (2, 3, 4, 5)

#: ``TablePhase.phase``: being copied (the stream keeps its changes aside meanwhile), copied
#: and having the changes kept aside applied, streamed since its copy, left the
#: configuration, no longer written because of ``reason`` (since ``parked_at``)
TablePhaseName = Literal["copying", "catching-up", "streaming", "removed", "parked"]


class StateError(PgcdcError, RuntimeError):
    """The lake's state file is unreadable or belongs to something else."""


def now() -> str:
    """The time now as the state records it (UTC, ISO 8601, to the second)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True)
class BatchFailure:
    """A micro-batch that failed and has not been applied since: its id, the WAL it covers
    (after ``start_lsn``, through ``end_lsn``), the error's class (never its message, which
    may quote row values), when it failed last and first, and how many runs failed on it;
    for a failure pgcdc recognised (``pgcdc.lake.diagnosis.diagnose``), its cause and fix in
    pgcdc's words (a path at most, no value)."""

    batch: int
    start_lsn: str | None  # "X/XXXXXXXX"
    end_lsn: str | None
    error: str
    at: str  # ISO time
    first_at: str
    attempts: int = 1
    cause: str | None = None
    fix: str | None = None


@dataclass(frozen=True, slots=True)
class TablePhase:
    """Where a table that joined or left the pipeline after its initial copy is (see the
    module doc): its ``phase`` since ``since``; its schema and name (its lake paths, which
    ``schema.table`` alone does not tell when a name holds a dot); the copy ``attempt`` (1, 2,
    ... : the Delta application transaction version of its copy's commits); once copied, the
    consistent point of its copy's snapshot (``copied_at``, "X/XXXXXXXX"), when the copy
    started (the time of its rows in the lake) and the rows it copied."""

    phase: TablePhaseName
    schema: str
    name: str
    attempt: int = 1
    since: str = field(default_factory=now)
    copied_at: str | None = None
    copy_started_at: str | None = None
    rows: int | None = None
    #: a parked table's: why, with the fix, and the slot's confirmed LSN then (the lake holds
    #: its changes up to there)
    reason: str | None = None
    parked_at: str | None = None
    #: a table copied while the stream runs (``copying``, ``catching-up``): the first
    #: micro-batch whose changes of it the stream kept aside (``pgcdc.lake.write.held``); its
    #: Delta tables hold no batch of the stream from there on until they are caught up
    from_batch: int | None = None
    #: copied anew over Delta tables it had (``pgcdc resync``): they are replaced when the copy
    #: lands, not removed before
    again: bool = False


@dataclass(frozen=True, slots=True)
class PipelineState:
    pipeline_id: str
    system_identifier: str
    database: str
    slot: str
    publication: str
    tables: tuple[str, ...]
    generation: int = 1
    consistent_point: str | None = None  # "X/XXXXXXXX"
    snapshot_started_at: str | None = None  # ISO time: the snapshot rows' time in the lake
    snapshot_done: bool = False
    snapshot_rows: dict[str, int] = field(default_factory=dict)
    publication_created: bool = False  # pgcdc created the publication (pgcdc drop drops it)
    dropped_at: str | None = None  # ISO time pgcdc drop dropped the slot
    last_failure: BatchFailure | None = None  # the batch a run failed on, until one is applied
    #: table id -> column -> attnum, as states written before ``shapes`` recorded them (the
    #: baseline of a table without a shape; not written any more)
    columns: dict[str, dict[str, int]] = field(default_factory=dict)
    #: table id -> what the lake follows it by, as when a query last started (``shape.py``):
    #: {"oid": int, "keys": [...], "multiset": bool, "columns": {name: [attnum, type, typmod]}}
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: table id -> its phase, for the tables added or removed after the initial copy
    phases: dict[str, TablePhase] = field(default_factory=dict)
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    format: int = STATE_FORMAT

    @classmethod
    def new(
        cls,
        *,
        system_identifier: str,
        database: str,
        slot: str,
        publication: str,
        tables: tuple[str, ...],
    ) -> PipelineState:
        return cls(
            pipeline_id=uuid.uuid4().hex,
            system_identifier=system_identifier,
            database=database,
            slot=slot,
            publication=publication,
            tables=tables,
        )

    @property
    def stream_app_id(self) -> str:
        """The Delta application id of the stream's commits (its versions are batch ids)."""
        return f"pgcdc-{self.pipeline_id}-g{self.generation}-stream"

    @property
    def snapshot_app_id(self) -> str:
        """The Delta application id of the snapshot's commits (its version: the generation)."""
        return f"pgcdc-{self.pipeline_id}-snapshot"

    @property
    def added_app_id(self) -> str:
        """The Delta application id of an added table's copy (its version: the attempt)."""
        return f"pgcdc-{self.pipeline_id}-added"

    def copied_at(self) -> dict[str, str]:
        """The tables added after the initial copy and streamed since, with the LSN their copy
        was taken at: the stream applies their changes committed at or after it."""
        return {
            table_id: phase.copied_at
            for table_id, phase in self.phases.items()
            if phase.phase == "streaming" and phase.copied_at is not None
        }

    def unwritten(self, phases: Mapping[str, TablePhase]) -> PipelineState:
        """The state once the tables of ``phases`` (removed or parked) are no longer written:
        out of ``tables`` and ``shapes``, with those phases."""
        return self.evolve(
            tables=tuple(t for t in self.tables if t not in phases),
            phases={**self.phases, **phases},
            shapes={k: v for k, v in self.shapes.items() if k not in phases},
        )

    def table_phases(self) -> dict[str, TablePhaseName]:
        """Every table's phase, by table id: its ``phases`` entry's, else (a table of the
        initial copy) "copying" until the snapshot is done and "streaming" from then on."""
        first: TablePhaseName = "streaming" if self.snapshot_done else "copying"
        return {**dict.fromkeys(self.tables, first), **{t: p.phase for t, p in self.phases.items()}}

    def parked(self) -> dict[str, TablePhase]:
        """The parked tables' phases, by table id."""
        return {t: p for t, p in self.phases.items() if p.phase == "parked"}

    def checkpoint(self, layout: LakeLayout) -> LakePath:
        return layout.checkpoint_dir(self.generation)

    def evolve(self, **changes: Any) -> PipelineState:
        return replace(self, updated_at=now(), **changes)

    def failure_standing(self, layout: LakeLayout) -> BatchFailure | None:
        """``last_failure``, unless the checkpoint committed that batch since (a run that
        applied it may have been killed before it cleared the record)."""
        failure = self.last_failure
        if failure is None:
            return None
        committed = committed_batch(self.checkpoint(layout))
        return None if committed is not None and committed >= failure.batch else failure


def _batch_ids(folder: LakePath) -> list[int]:
    return [int(name) for name in folder.names() if name.isdigit()]


#: The object a running pipeline holds (``run_lock``): an flock'ed file locally, a lease on S3
RUN_LOCK = "run.lock"


@contextmanager
def run_lock(
    layout: LakeLayout,
    *,
    what: str = "pgcdc run",
    on_lost: Callable[[str], None] | None = None,
) -> Iterator[Lease]:
    """Hold the lake for one process: ``pgcdc run`` for its whole life, ``pgcdc drop`` while
    it drops. Another holder gets a ``StateError`` naming its process. Locally the kernel drops
    the lock however the holder ends (kill -9 included); on S3 it is a lease
    (``pgcdc.lake.store.storage``) that a later run on the same host takes over at once from a gone
    process, and from any other once it ran out. ``on_lost`` is called (from another thread)
    if another process took the lake over: the holder must stop writing. A lake this process
    cannot write is refused first (``check_writable``)."""
    path = layout.state_dir / RUN_LOCK
    holder = f"{what} (pid {os.getpid()} on {os.uname().nodename})"
    check_writable(layout)

    def lost(other: str) -> None:
        log.error("%s lost the lake %s to %s: stopping", what, layout.root, other)
        if on_lost is not None:
            on_lost(other)

    with contextlib.ExitStack() as stack:
        try:
            lease = stack.enter_context(
                layout.location.store().lease(path.key, holder, on_lost=lost)
            )
        except StoreConflict as exc:
            raise StateError(
                f"the lake {layout.root} is in use by {exc}: {what} changes nothing while "
                "another pgcdc process runs on it. Fix: stop that process first (or wait for "
                "it to end); two pipelines need two lake paths"
            ) from None
        except StorageError as exc:
            raise StateError(str(exc)) from None
        _HELD[layout.location] = lease
        stack.callback(_HELD.pop, layout.location, None)
        yield lease


def check_writable(layout: LakeLayout) -> None:
    """What ``run`` does to the lake, tried: a file written under ``_pgcdc/`` and removed (and,
    on S3, whether the store honours conditional writes), leaving nothing behind. A
    ``StateError`` naming the path and the fix if the lake refuses it (read-only, no
    permission)."""
    try:
        layout.location.store().probe(layout.state_dir.key)
    except StorageError as exc:
        raise StateError(str(exc)) from None


#: the lease this process holds on a lake (``run_lock``): ``save_state`` checks it
_HELD: dict[LakeLocation, Lease] = {}


def remove_torn_writes(checkpoint: LakePath) -> list[str]:
    """Delete the temporary files a killed process left in the checkpoint's offset and commit
    logs (Spark writes ``.<batch>.<uuid>.tmp`` and its ``.crc``, then renames it): Spark never
    reads them, but a fresh checkpoint holding any file is refused for good
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). Only while no query runs; the names removed."""
    removed = []
    for folder in ("offsets", "commits"):
        for name in (checkpoint / folder).names():
            if name.startswith(".") and name.endswith((".tmp", ".tmp.crc")):
                (checkpoint / folder / name).remove()
                removed.append(f"{folder}/{name}")
    return removed


def committed_batch(checkpoint: LakePath) -> int | None:
    """The newest micro-batch Spark committed (its commit log), if any."""
    return max(_batch_ids(checkpoint / "commits"), default=None)


def planned_batch(checkpoint: LakePath) -> int | None:
    """The newest micro-batch Spark planned (its offset log, written before the batch runs)."""
    return max(_batch_ids(checkpoint / "offsets"), default=None)


def batch_offset(checkpoint: LakePath, batch: int) -> str | None:
    """The ``end_lsn`` of the source's offset the offset log holds for ``batch`` (the end of
    the batch's last transaction), if readable."""
    try:
        text = (checkpoint / "offsets" / str(batch)).read_text()
        if text is None:
            return None
        offset = json.loads(text.splitlines()[2])  # "v1", the batch's metadata, the offset
    except (StorageError, IndexError, ValueError):
        return None
    end = offset.get("end_lsn") if isinstance(offset, dict) else None
    return end if isinstance(end, str) else None


def load_state(layout: LakeLayout) -> PipelineState | None:
    path = layout.state_file
    try:
        text = path.read_text()
    except StorageError as exc:
        raise StateError(f"cannot read the pipeline state: {exc}") from None
    if text is None:
        return None
    try:
        data = json.loads(text)
        if data.get("format") == 1:
            raise StateError(
                f"{path}: this lake was written by an earlier pgcdc (delta-rs tables without "
                "deletion vectors); this version writes every table with Delta's Spark "
                "connector from its first commit on. Move the lake away (or point lake.path at "
                "a new folder) and run again to copy everything into a new lake"
            )
        if data.get("format") not in READABLE_FORMATS:
            raise StateError(
                f"{path} has state format {data.get('format')!r}, this pgcdc reads "
                f"{' and '.join(map(str, READABLE_FORMATS))}: use the pgcdc version that "
                "wrote it"
            )
        data["format"] = STATE_FORMAT
        data["tables"] = tuple(data["tables"])
        data["phases"] = {
            table_id: TablePhase(**phase) for table_id, phase in data.get("phases", {}).items()
        }
        if data.get("last_failure") is not None:
            data["last_failure"] = BatchFailure(**data["last_failure"])
        return PipelineState(**data)
    except (ValueError, TypeError, KeyError) as exc:
        raise StateError(
            f"{path} is not a pgcdc pipeline state ({type(exc).__name__}): restore it, or "
            "start a new lake"
        ) from None


#: held while a state is read, changed and written again (``update_state``): a run's threads
#: (the stream's batches, a table's copy, the failure records) each change their part
_STATE_LOCK = threading.RLock()


@contextmanager
def state_lock() -> Iterator[None]:
    """Held around a load, change and save of the state that other threads of this run may
    change at the same time."""
    with _STATE_LOCK:
        yield


def update_state(
    layout: LakeLayout, change: Callable[[PipelineState], PipelineState]
) -> PipelineState:
    """The state saved as ``change`` makes the one saved now (read, changed and written under
    ``state_lock``, so that no other thread's change is lost)."""
    with _STATE_LOCK:
        state = load_state(layout)
        if state is None:
            raise StateError(f"{layout.state_file} is gone: the pipeline's state was removed")
        state = change(state)
        save_state(layout, state)
        return state


def save_state(layout: LakeLayout, state: PipelineState) -> None:
    """Write ``state`` atomically (one whole file or object: a crash leaves the old state or the
    new one). A drop recorded in the state stays recorded: ``pgcdc drop --force`` may drop under
    a run whose state in memory predates it."""
    path = layout.state_file
    held = _HELD.get(layout.location)
    if held is not None:
        held.check()  # a run that lost the lake must not overwrite its new holder's state
    if state.dropped_at is None:
        try:
            earlier = json.loads(path.read_text() or "{}").get("dropped_at")
        except (StorageError, ValueError, AttributeError):
            earlier = None
        if isinstance(earlier, str):
            state = replace(state, dropped_at=earlier)
    data = asdict(state)
    data["tables"] = list(state.tables)
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    try:
        layout.location.store().write(path.key, text.encode("utf-8"))
    except StorageError as exc:
        raise StateError(f"cannot write the pipeline state: {exc}") from None


@dataclass(frozen=True, slots=True)
class FailureNote:
    """A failure kept outside the lake (see the module doc): the failure, the file, and why
    the state could not take it."""

    failure: BatchFailure
    path: Path
    state_error: str


def note_folders() -> list[Path]:
    """Where failure notes are kept, in the order tried."""
    uid = os.getuid()
    state_home = os.environ.get("XDG_STATE_HOME")
    folders = []
    with contextlib.suppress(KeyError, RuntimeError):  # no home directory known
        folders.append(
            Path(state_home) / "pgcdc" if state_home else Path.home() / ".local/state/pgcdc"
        )
    if Path("/dev/shm").is_dir():
        folders.append(Path("/dev/shm") / f"pgcdc-{uid}")
    folders.append(Path(tempfile.gettempdir()) / f"pgcdc-{uid}")
    return folders


def _note_name(layout: LakeLayout) -> str:
    digest = hashlib.sha256(str(layout.root).encode("utf-8")).hexdigest()[:24]
    return f"failure-{digest}.json"


def save_failure_note(layout: LakeLayout, state: PipelineState, reason: str) -> Path | None:
    """Keep ``state``'s ``last_failure`` outside the lake (the state could not be written:
    ``reason``), atomically, in the first folder that takes it; the file, or None."""
    if state.last_failure is None:
        return None
    data = {
        "lake": str(layout.root),
        "pipeline_id": state.pipeline_id,
        "generation": state.generation,
        "state_error": reason,
        "failure": asdict(state.last_failure),
    }
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    for folder in note_folders():
        target = folder / _note_name(layout)
        temporary = folder / f".{target.name}.{os.getpid()}.tmp"
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            found = folder.lstat()
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
                # /dev/shm and /tmp are everyone's: a folder of another user, or a link
                raise OSError(f"{folder} is not a folder of this user")
            temporary.write_text(text, encoding="utf-8")
            temporary.replace(target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            log.debug("no failure note in %s: %s", folder, exc)
            continue
        return target
    return None


def _read_note(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_failure_note(layout: LakeLayout, state: PipelineState) -> FailureNote | None:
    """The newest failure kept outside the lake for ``state``'s pipeline and generation."""
    found: list[FailureNote] = []
    for folder in note_folders():
        path = folder / _note_name(layout)
        data = _read_note(path)
        if (
            data is None
            or data.get("lake") != str(layout.root)
            or data.get("pipeline_id") != state.pipeline_id
            or data.get("generation") != state.generation
        ):
            continue
        try:
            failure = BatchFailure(**data["failure"])
        except (KeyError, TypeError):
            continue
        found.append(FailureNote(failure, path, str(data.get("state_error", ""))))
    return max(found, key=lambda note: (note.failure.at, note.failure.batch), default=None)


def remove_failure_notes(layout: LakeLayout, *, applied: int | None = None) -> None:
    """Remove the lake's failure notes: all, or those of batches up to ``applied``."""
    for folder in note_folders():
        path = folder / _note_name(layout)
        if not path.exists():
            continue
        if applied is not None:
            data = _read_note(path)
            failure = None if data is None else data.get("failure")
            batch = failure.get("batch") if isinstance(failure, dict) else None
            if isinstance(batch, int) and batch > applied:
                continue
        with contextlib.suppress(OSError):
            path.unlink()


# -- resync requests -----------------------------------------------------------------------
#
# ``pgcdc resync`` asks for tables to be copied anew without holding the lake (a run may be
# streaming): one small file per table under ``_pgcdc/resync/``, which the run holding the
# lake picks up (``table_set.TableDiscovery``), or the next start; removed once the copy is in
# the lake's state.


def _resync_folder(layout: LakeLayout) -> LakePath:
    return layout.state_dir / "resync"


def request_resync(layout: LakeLayout, table_ids: Sequence[str]) -> None:
    """Ask for ``table_ids`` to be copied anew."""
    store = layout.location.store()
    for table_id in table_ids:
        body = json.dumps({"table": table_id, "at": now()}).encode()
        store.write((_resync_folder(layout) / encode_name(table_id)).key, body)


def resync_requests(layout: LakeLayout) -> dict[str, LakePath]:
    """The tables asked to be copied anew, by table id, with their request files."""
    folder = _resync_folder(layout)
    found: dict[str, LakePath] = {}
    for name in folder.names():
        path = folder / name
        try:
            table_id = json.loads(path.read_text() or "{}").get("table")
        except (ValueError, AttributeError):
            continue
        if isinstance(table_id, str):
            found[table_id] = path
    return found


def resync_done(requests: Mapping[str, LakePath], table_ids: Sequence[str]) -> None:
    """Remove the requests of ``table_ids`` (copied anew)."""
    for table_id in table_ids:
        path = requests.get(table_id)
        if path is not None:
            path.remove()
