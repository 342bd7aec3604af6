"""The pipeline's own state, kept under ``<lake>/_pgcdc/state.json`` so it survives restarts.

It records which source the lake mirrors (server system identifier, database, slot,
publication), which tables, the snapshot generation and whether its initial copy finished
(``snapshot_done``), the slot's consistent point, and the streaming checkpoint and Delta
application id the stream uses. Writes are atomic (a temporary file renamed over the old one).

``publication_created`` says whether pgcdc created the publication (``pgcdc drop`` drops only
such a one; state files written before this field existed read as False: keep it).
``dropped_at`` is set by ``pgcdc drop`` when it dropped the slot: ``run`` then refuses to
start (the changes since the slot's position are gone), instead of copying everything again
into a lake that still holds the old tables; moving the lake away starts over.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pgcdc.lake.tables import LakeLayout

__all__ = ["STATE_FORMAT", "PipelineState", "StateError", "load_state", "save_state"]

STATE_FORMAT = 1


class StateError(RuntimeError):
    """The lake's state file is unreadable or belongs to something else."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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
    created_at: str = field(default_factory=_now)
    updated_at: str = field(default_factory=_now)
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

    def checkpoint(self, layout: LakeLayout) -> Path:
        return layout.checkpoint_dir(self.generation)

    def evolve(self, **changes: Any) -> PipelineState:
        return replace(self, updated_at=_now(), **changes)


def load_state(layout: LakeLayout) -> PipelineState | None:
    path = layout.state_file
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read the pipeline state {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
        if data.get("format") != STATE_FORMAT:
            raise StateError(
                f"{path} has state format {data.get('format')!r}, this pgcdc reads "
                f"{STATE_FORMAT}: use the pgcdc version that wrote it"
            )
        data["tables"] = tuple(data["tables"])
        return PipelineState(**data)
    except (ValueError, TypeError, KeyError) as exc:
        raise StateError(
            f"{path} is not a pgcdc pipeline state ({type(exc).__name__}): restore it, or "
            "start a new lake"
        ) from None


def save_state(layout: LakeLayout, state: PipelineState) -> None:
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    path = layout.state_file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = asdict(state)
    data["tables"] = list(state.tables)
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2, sort_keys=True)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
