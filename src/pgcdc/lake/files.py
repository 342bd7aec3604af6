"""Parquet files written straight into a Delta table's folder, added in one commit.

The initial copy's Spark tasks write their rows as Parquet files into each Delta table's folder
(``pgcdc.lake.snapshot``); ``commit_files`` then adds all of them to the table in a single
commit tagged with the given application transaction, replacing what the table held. So a
large table never passes through the driver's memory. Executors must reach the lake path (local
mode, or a shared filesystem mounted at the same path).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pgcdc.lake.writer import DeltaTarget, commit_properties

__all__ = ["CommittedFile", "commit_files"]


@dataclass(frozen=True, slots=True)
class CommittedFile:
    """A Parquet file written into a Delta table's folder, to add in a commit."""

    path: str  # relative to the table's folder
    size: int
    rows: int


def commit_files(
    target: DeltaTarget,
    schema: pa.Schema,
    files: Sequence[CommittedFile],
    *,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
) -> None:
    """Replace the Delta table at ``target`` (created if missing, with ``schema``) by ``files``,
    in one commit tagged ``Transaction(app_id, version)``; the commit's metadata records the
    row and file counts besides ``metadata``."""
    from deltalake import Schema
    from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

    now = int(time.time() * 1000)
    actions = [
        AddAction(f.path, int(f.size), {}, now, True, json.dumps({"numRecords": int(f.rows)}))
        for f in files
    ]
    rows = sum(int(f.rows) for f in files)
    props = commit_properties(app_id, version, {**metadata, "rows": rows, "files": len(files)})
    existing = target.table()
    if existing is None:
        create_table_with_add_actions(
            target.uri,
            Schema.from_arrow(schema),
            actions,
            mode="overwrite",
            commit_properties=props,
        )
    else:
        existing.create_write_transaction(
            list[AddAction | RemoveAction](actions), "overwrite", schema, commit_properties=props
        )
