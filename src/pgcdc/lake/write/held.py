"""Changes kept aside for a table copied while the stream runs, until its copy lands.

A table that joins a running pipeline (added to it, or copied anew by ``pgcdc resync``) is
copied in a snapshot of its own, exported at LSN X, while the stream goes on applying the other
tables (``pgcdc.lake.run.table_sync``). The stream reads the table's changes meanwhile (the
publication has it) but cannot apply them: its Delta tables are not there yet, or are about to
be replaced. So each micro-batch keeps them aside before it ends, that is before the slot may
advance past them: the batch's rows of the table, as the source gives them (the metadata
columns and the table's struct column), written as Parquet into
``<lake>/_pgcdc/held/<table folder>/<attempt>/batch-<id>/`` (a batch written again, a replay,
overwrites its folder).

Once the copy has landed, those rows are applied to the table's Delta tables as micro-batches
of the stream are, by the same writer (``LakeBatchWriter``; the copy holds what committed
before X, so only changes committed at X or later are applied), tagged with the stream's
application id and the newest batch whose rows they are. Then the table is **direct**: from
the next micro-batch on, the stream writes it itself. The switch is made between two batches:
each batch holds ``HeldTables.lock`` from its start to its end, and the last rows kept aside
are applied, and the table made direct, under it.

Replays stay exactly-once: a batch whose rows were kept aside and applied is recorded by the
table's Delta tables (the catch-up's application transaction is at least that batch), so a
replay of it skips the table, as for any batch already written. ``HeldTable.last_batch`` is
the newest batch whose rows (or absence of rows) are kept: rows of a later batch, whose write
may not have finished, are never applied from here; that batch runs again.

``HeldTables`` (``held_tables(app id)``: one per stream application id in this process) is
what the stream's batches and the tables' copies share; nothing in it outlives the process:
a start rebuilds it from the lake's state (``TablePhase.from_batch``) and the streaming
checkpoint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pgcdc.lake.store.storage import LakePath
from pgcdc.lake.store.tables import LakeLayout, LakeTable, encode_name

__all__ = [
    "HeldTable",
    "HeldTables",
    "held_folder",
    "held_rows",
    "held_tables",
    "keep_rows",
]

log = logging.getLogger("pgcdc.lake")

#: the prefix of a kept batch's folder (``batch-<id>``)
_BATCH = "batch-"


def held_folder(layout: LakeLayout, table: LakeTable, attempt: int | None = None) -> LakePath:
    """Where ``table``'s changes are kept aside: the folder of its copy ``attempt``, or (None)
    of every attempt."""
    folder = layout.root / "_pgcdc" / "held" / encode_name(table.schema) / encode_name(table.name)
    return folder if attempt is None else folder / str(attempt)


@dataclass(slots=True)
class HeldTable:
    """A table whose changes the stream keeps aside (``direct`` False), or writes itself since
    its copy landed and the changes kept aside were applied (``direct``, with ``copied_at``:
    the stream applies its changes committed at X or later)."""

    table: LakeTable
    column: str  # its struct column in the source's rows
    folder: LakePath  # held_folder(layout, table, attempt)
    from_batch: int  # the first batch whose rows are kept aside
    last_batch: int  # the newest batch whose rows are kept (from_batch - 1: none yet)
    direct: bool = False
    copied_at: int | None = None  # X, once direct

    @property
    def table_id(self) -> str:
        return self.table.table_id


class HeldTables:
    """The tables of one stream whose copy runs or just landed. ``lock`` is held by each batch
    for its whole run and by a table's switch to direct."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._tables: dict[str, HeldTable] = {}

    def hold(self, entry: HeldTable) -> None:
        with self.lock:
            self._tables[entry.table_id] = entry

    def get(self, table_id: str) -> HeldTable | None:
        with self.lock:
            return self._tables.get(table_id)

    def drop(self, table_id: str) -> None:
        """Forget ``table_id`` (its copy was given up: the stream neither keeps nor writes its
        changes any more; a parked table)."""
        with self.lock:
            self._tables.pop(table_id, None)

    def held(self) -> list[HeldTable]:
        with self.lock:
            return [t for t in self._tables.values() if not t.direct]

    def direct(self) -> list[HeldTable]:
        with self.lock:
            return [t for t in self._tables.values() if t.direct]

    def ids(self) -> set[str]:
        with self.lock:
            return set(self._tables)

    def clear(self) -> None:
        with self.lock:
            self._tables.clear()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Held by a micro-batch from its start to its end."""
        with self.lock:
            yield


_REGISTRY: dict[str, HeldTables] = {}
_REGISTRY_LOCK = threading.Lock()


def held_tables(app_id: str) -> HeldTables:
    """The held tables of the stream whose application id is ``app_id`` (made on first use)."""
    with _REGISTRY_LOCK:
        return _REGISTRY.setdefault(app_id, HeldTables())


def keep_rows(df: Any, entry: HeldTable, batch_id: int) -> None:
    """Keep ``entry``'s rows of micro-batch ``batch_id`` (the batch's DataFrame ``df``) aside:
    the metadata columns and its struct column, one Parquet folder per batch (a replay
    overwrites it)."""
    from pyspark.sql import functions as F

    from pgcdc.spark.schema import METADATA_COLUMNS

    rows = df.where(F.col("_table_id") == F.lit(entry.table_id)).select(
        *METADATA_COLUMNS, entry.column
    )
    target = entry.folder / f"{_BATCH}{batch_id}"
    rows.write.mode("overwrite").parquet(str(target))


def kept_batches(folder: LakePath) -> list[int]:
    """The batches kept aside in ``folder``, in order."""
    ids = []
    for name in folder.names():
        if name.startswith(_BATCH) and name[len(_BATCH) :].isdigit():
            ids.append(int(name[len(_BATCH) :]))
    return sorted(ids)


def held_rows(spark: Any, entry: HeldTable, after: int, through: int) -> Any | None:
    """The rows kept aside for ``entry`` in batches ``after`` (exclusive) to ``through``, as
    one DataFrame in the source's shape (None when none were kept: no batch of the range had
    changes of the table). Folders of the same table written by queries of different schemas
    (a column added meanwhile) read as one, with the columns of all."""
    wanted = [b for b in kept_batches(entry.folder) if after < b <= through]
    if not wanted:
        return None
    paths = [str(entry.folder / f"{_BATCH}{b}") for b in wanted]
    return spark.read.option("mergeSchema", "true").parquet(*paths)
