"""``pgcdc.lake.writer.DeltaTarget``: what it says of a table follows the table on disk, though
it keeps loaded tables between checks."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from pgcdc.lake.target import DeltaTarget

APP = "app-1"


def _write(
    path: Path,
    rows: list[int],
    version: int | None,
    mode: Literal["append", "overwrite"] = "append",
) -> None:
    properties = CommitProperties(
        app_transactions=[Transaction(APP, version)] if version is not None else None
    )
    write_deltalake(
        str(path),
        pa.table({"id": pa.array(rows, pa.int64())}),
        mode=mode,
        commit_properties=properties,
    )


def test_a_target_sees_later_commits_and_a_table_recreated_at_its_path(tmp_path: Path) -> None:
    path = tmp_path / "t"
    target = DeltaTarget(path)
    assert target.table() is None and not target.applied(APP, 0)
    _write(path, [1, 2], 1)
    assert target.applied(APP, 1) and not target.applied(APP, 2)
    assert target.version() == 0
    # another writer (another target object, or another process) commits
    _write(path, [3], 2)
    assert target.applied(APP, 2) and target.version() == 1
    assert DeltaTarget(path).applied(APP, 2)
    assert target.count() == 3
    # the table is dropped and created again at the same path, with fewer commits
    shutil.rmtree(path)
    assert target.table() is None and not target.applied(APP, 1)
    _write(path, [9], None)
    assert not target.applied(APP, 1) and target.version() == 0 and target.count() == 1
    assert not DeltaTarget(path).applied(APP, 1)
    _write(path, [10], 5, mode="overwrite")
    assert target.applied(APP, 5) and target.count() == 1
