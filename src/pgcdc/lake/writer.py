"""Delta tables through delta-rs: idempotent commits tagged with an application transaction.

Every data commit pgcdc makes carries ``Transaction(app_id, version)`` (Delta's ``txn``
action): the stream's app id and the micro-batch id, or the snapshot's app id and generation.
``DeltaTarget.applied(app_id, version)`` tells whether a commit with that version (or a later
one) is already in the table, so a replayed batch is skipped instead of applied twice. Each of
a table's Delta tables (mirror, history, changelog) is checked on its own, so a batch that
failed after the mirror's commit but before the history's completes the history on replay.

Reads go through ``pyarrow.dataset`` over the table's current files (pgcdc's tables have no
deletion vectors or column mapping), which avoids a delta-rs + pyarrow filesystem shutdown
crash seen with ``DeltaTable.to_pyarrow_table``.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as pads
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import TableNotFoundError

__all__ = [
    "CHUNK_BASE",
    "MERGE_OPTIONS",
    "Chunk",
    "DeltaTarget",
    "chunk_app_id",
    "commit_properties",
    "nullable_schema",
    "nullable_type",
]

log = logging.getLogger("pgcdc.lake")


#: a chunk's version in its ``chunk_app_id`` transaction: batch version * CHUNK_BASE + chunk
CHUNK_BASE = 1 << 20

#: Keyword arguments of every ``DeltaTable.merge``. The source is an Arrow table in memory
#: already, so it is not streamed (delta-rs's default): delta-rs then reads the source keys'
#: range and skips the target's files outside it. A MERGE reads (and rewrites) every file that
#: may hold a source key, and its memory grows with what it reads; with the pruning, a batch of
#: new keys above the stored ones (a bulk load) reads none of the table, and a large
#: transaction's memory stays that of its micro-batch instead of growing with the mirror
#: (a delta-rs memory limit, ``max_spill_size``, does not help: the hash join cannot spill and
#: fails with "Resources exhausted" instead).
MERGE_OPTIONS: dict[str, Any] = {"streamed_exec": False}


class Chunk(NamedTuple):
    """One chunk of a batch committed in several (``lake.stage``)."""

    number: int  # 0 to total - 1
    total: int
    #: how the batch's rows were split: "hash" (of the key) or "range" (runs of keys in order);
    #: recorded so that a replay of a half-applied batch splits it the same way
    split: str = "hash"


def chunk_app_id(app_id: str) -> str:
    """The application transaction id counting the chunks of ``app_id``'s batches."""
    return f"{app_id}.chunks"


def commit_properties(
    app_id: str,
    version: int,
    metadata: dict[str, Any] | None = None,
    *,
    chunk: Chunk | None = None,
) -> CommitProperties:
    """Commit properties carrying the application transaction ``(app_id, version)``.

    A batch committed in chunks tags each chunk's commit with ``(chunk_app_id(app_id), version
    * CHUNK_BASE + chunk)`` and only its last chunk with ``(app_id, version)``: the batch counts
    as applied once every chunk is in."""
    transactions = []
    if chunk is None or chunk.number == chunk.total - 1:
        transactions.append(Transaction(app_id, version))
    if chunk is not None:
        if not 0 <= chunk.number < chunk.total <= CHUNK_BASE:
            raise ValueError(f"chunk {chunk.number} of {chunk.total}: out of range")
        transactions.append(Transaction(chunk_app_id(app_id), version * CHUNK_BASE + chunk.number))
        metadata = {
            **(metadata or {}),
            "chunk": chunk.number,
            "chunks": chunk.total,
            "split": chunk.split,
        }
    return CommitProperties(
        custom_metadata={"pgcdc": metadata} if metadata else None,
        app_transactions=transactions,
    )


def execute_merge(
    delta: DeltaTable, merger: Any, app_id: str, version: int, properties: CommitProperties
) -> dict[str, Any]:
    """Run a delta-rs MERGE; when it changed nothing (delta-rs then makes no commit), commit an
    empty transaction with the same ``properties`` so that the batch (or chunk) is recorded as
    applied like any other: a replay must never run a chunk again once a later one landed."""
    before = delta.version()
    metrics: dict[str, Any] = merger.execute()
    delta.update_incremental()
    if delta.version() == before:
        delta.create_write_transaction([], "append", delta.schema(), commit_properties=properties)
        log.debug("empty MERGE of %s %s recorded in its own commit", app_id, version)
    return metrics


def nullable_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable and canonical list/large types."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, nullable_type(f.type), True) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field("element", nullable_type(t.value_type), True))
    if pa.types.is_map(t):
        return pa.map_(nullable_type(t.key_type), nullable_type(t.item_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t) and t.tz is not None and t.tz != "UTC":
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    return t


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, nullable_type(f.type), True) for f in schema])


#: Loaded Delta tables by path, with the identity of the table they were loaded from (see
#: ``_identity``), kept across ``DeltaTarget`` objects: a micro-batch's targets are new objects,
#: and loading a table replays its log (tens of milliseconds for a few dozen commits, several
#: times per batch) where ``update_incremental`` reads only the commits since. Per thread, so
#: that no DeltaTable is ever used by two threads at once (a query's batches run in one).
class _Loaded(threading.local):
    def __init__(self) -> None:
        self.tables: dict[Path, tuple[DeltaTable, tuple[int, int, int]]] = {}


_LOADED = _Loaded()


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What tells a table from another one created at the same path later: its first commit
    file's device, inode and modification time (None once log clean-up removed it; then the
    table is loaded afresh every time)."""
    try:
        st = os.stat(path / "_delta_log" / "00000000000000000000.json")
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


class DeltaTarget:
    """One Delta table at ``path`` (which need not exist yet)."""

    __slots__ = ("_table", "_txn", "path")

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._table: DeltaTable | None = None
        #: application transaction versions read at one table version: (version, {app id: v})
        self._txn: tuple[int, dict[str, int | None]] = (-1, {})

    @property
    def uri(self) -> str:
        return str(self.path)

    def table(self, *, refresh: bool = True) -> DeltaTable | None:
        """The Delta table, or None if there is none at the path yet; with ``refresh``, at its
        latest version (brought up to date incrementally when it was loaded before)."""
        if self._table is not None and not refresh:
            return self._table
        if not (self.path / "_delta_log").is_dir():
            self._table = None
            return None
        table = self._load()
        if table is not self._table:  # another table object: its transactions are unread
            self._txn = (-1, {})
        self._table = table
        return table

    def _load(self) -> DeltaTable | None:
        """The table at its latest version: the thread's loaded table brought up to date when
        it is still the table at the path, else loaded afresh."""
        identity = _identity(self.path)
        cache = _LOADED.tables
        loaded = cache.get(self.path)
        if loaded is not None and identity is not None and loaded[1] == identity:
            try:
                loaded[0].update_incremental()
            except Exception as exc:  # the log changed under it: load it afresh
                log.debug("%s: reloading the Delta table (%s)", self.path, type(exc).__name__)
            else:
                return loaded[0]
        cache.pop(self.path, None)
        try:
            table = DeltaTable(self.uri)
        except TableNotFoundError:
            return None
        if identity is not None:
            cache[self.path] = (table, identity)
        return table

    def _transaction_version(self, table: DeltaTable, app_id: str) -> int | None:
        """``table.transaction_version(app_id)``, read once per table version (it scans the
        log's transactions: about 20 ms)."""
        version = int(table.version())
        if self._txn[0] != version:
            self._txn = (version, {})
        known = self._txn[1]
        if app_id not in known:
            done = table.transaction_version(app_id)
            known[app_id] = None if done is None else int(done)
        return known[app_id]

    def exists(self) -> bool:
        return self.table() is not None

    def version(self) -> int | None:
        table = self.table()
        return None if table is None else int(table.version())

    def applied(self, app_id: str, version: int) -> bool:
        """Whether a commit of ``app_id`` with this or a later version is in the table."""
        table = self.table()
        if table is None:
            return False
        done = self._transaction_version(table, app_id)
        return done is not None and done >= version

    def chunk_applied(self, app_id: str, version: int, chunk: int) -> bool:
        """Whether chunk ``chunk`` of batch ``version`` (or anything later) is in the table."""
        table = self.table()
        if table is None:
            return False
        done = self._transaction_version(table, chunk_app_id(app_id))
        return done is not None and done >= version * CHUNK_BASE + chunk

    def partial_chunks(self, app_id: str, version: int) -> tuple[int, str] | None:
        """The chunk count and split an interrupted attempt at batch ``version`` committed its
        first chunks with (None when no chunk of that batch is in the table, or all of them
        are): a replay must split the batch the same way, whatever the settings say now.
        Chunks committed before splits were recorded were split by hash."""
        table = self.table()
        if table is None:
            return None
        done = self._transaction_version(table, chunk_app_id(app_id))
        if done is None or done // CHUNK_BASE != version or self.applied(app_id, version):
            return None
        for commit in table.history(1000):
            meta = commit.get("pgcdc")
            if (
                isinstance(meta, dict)
                and meta.get("batch") == version
                and isinstance(meta.get("chunks"), int)
            ):
                return int(meta["chunks"]), str(meta.get("split", "hash"))
        raise RuntimeError(
            f"{self.path}: chunks of batch {version} are committed but none of the last 1000 "
            "commits records their count; do not change rows_per_commit / bytes_per_commit "
            "while a batch is half applied"
        )

    def arrow_schema(self) -> pa.Schema | None:
        table = self.table()
        if table is None:
            return None
        return pa.schema(table.schema().to_arrow())

    def read(
        self,
        columns: list[str] | None = None,
        filter: pads.Expression | None = None,
    ) -> pa.Table:
        """The table's current rows (all columns of its current schema unless ``columns``)."""
        table = self.table()
        if table is None:
            raise FileNotFoundError(f"no Delta table at {self.path}")
        schema = pa.schema(table.schema().to_arrow())
        # delta-rs gives local files as percent-encoded URI paths (a space or non-ASCII
        # letter in the lake path or a table folder): decode them for pyarrow
        files = [unquote(uri.removeprefix("file://")) for uri in table.file_uris()]
        if not files:
            empty = schema.empty_table()
            return empty.select(columns) if columns is not None else empty
        dataset = pads.dataset(files, format="parquet", schema=schema)
        return dataset.to_table(columns=columns, filter=filter)

    def count(self) -> int:
        table = self.table()
        if table is None:
            return 0
        return int(self.read(columns=[]).num_rows) if table.file_uris() else 0


def cast_to(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns cast to the types ``schema`` gives them (columns ``schema`` does not
    name keep their type); raises ``pa.ArrowInvalid`` when a value does not fit."""
    types = {f.name: f.type for f in schema}
    arrays = []
    fields = []
    for f, original in zip(table.schema, table.columns, strict=True):
        target = types.get(f.name, nullable_type(f.type))
        column = original if original.type == target else original.cast(target, safe=True)
        arrays.append(column)
        fields.append(pa.field(f.name, target, True))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
