"""delta-rs MERGEs as pgcdc runs them (``lake.writer.MERGE_OPTIONS``), on real Delta tables.

A MERGE reads, and rewrites, every file of the target that may hold a source key; its memory
grows with what it reads. pgcdc's MERGEs let delta-rs skip the files outside the source keys'
range, so appending new keys (a bulk load, a large transaction's chunks in key order) never
reads the rows already in the table.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from pgcdc.lake.mirror import OP_COLUMN, merge_mirror
from pgcdc.lake.tables import COMMIT_LSN, COMMIT_TIME, LakeTable
from pgcdc.lake.target import DeltaTarget

TABLE = LakeTable("public", "items", ("id",), "d")


def _rows(ids: list[int], ops: list[str], lsn: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "note": pa.array([f"note {i} at {lsn}" for i in ids]),
            COMMIT_LSN: pa.array([lsn] * len(ids), pa.int64()),
            COMMIT_TIME: pa.array(
                [datetime(2026, 1, 1, tzinfo=UTC)] * len(ids), pa.timestamp("us", tz="UTC")
            ),
            OP_COLUMN: pa.array(ops),
        }
    )


def _merge(target: DeltaTarget, rows: pa.Table, version: int) -> None:
    merge_mirror(
        target, rows, TABLE, ["id", "note"], truncated=False, app_id="test", version=version
    )


def _last_merge_range(path: Path) -> str | None:
    (commit,) = DeltaTable(str(path)).history(1)
    assert commit["operation"] == "MERGE"
    predicate: str | None = commit["operationParameters"].get("predicate")
    return predicate


def test_merge_reads_only_the_source_keys_range(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path / "mirror")
    _merge(target, _rows(list(range(1000)), ["U"] * 1000, 10), 1)
    # new keys above the stored ones: the MERGE is limited to their range (the files of keys
    # 0-999 are skipped, not read)
    _merge(target, _rows(list(range(1000, 2000)), ["U"] * 1000, 20), 2)
    assert _last_merge_range(tmp_path / "mirror") == "id >= 1000 AND id <= 1999"
    # an update and a delete in the stored range, and an insert: still exact
    _merge(target, _rows([5, 1500, 2500], ["U", "D", "U"], 30), 3)
    assert _last_merge_range(tmp_path / "mirror") == "id >= 5 AND id <= 2500"
    stored = target.read().sort_by("id")
    ids = stored["id"].to_pylist()
    assert ids == [i for i in range(2000) if i != 1500] + [2500]
    notes = dict(zip(ids, stored["note"].to_pylist(), strict=True))
    assert notes[5] == "note 5 at 30"
    assert notes[4] == "note 4 at 10"
    assert notes[1999] == "note 1999 at 20"
    assert notes[2500] == "note 2500 at 30"
    assert pc.max(stored[COMMIT_LSN]).as_py() == 30


def test_a_truncating_merge_still_reads_the_whole_table(tmp_path: Path) -> None:
    """A batch that truncated the table deletes every stored row it did not write, also
    outside its keys' range: delta-rs must not prune there (and does not: no range is
    recorded)."""
    target = DeltaTarget(tmp_path / "mirror")
    _merge(target, _rows(list(range(100)), ["U"] * 100, 10), 1)
    merge_mirror(
        target,
        _rows([500, 501], ["U", "U"], 20),
        TABLE,
        ["id", "note"],
        truncated=True,
        app_id="test",
        version=2,
    )
    assert _last_merge_range(tmp_path / "mirror") is None
    assert target.read()["id"].to_pylist() in ([500, 501], [501, 500])
