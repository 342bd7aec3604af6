"""The key index of a Delta table: where each live row of each key is (data file, row index).

With it a batch's write never scans the table: the rows a batch replaces are found by key in
the index and marked in deletion vectors, and the batch's rows are appended in new files whose
positions the index then records (``pgcdc.lake.write.indexed``).

Keys are indexed by a 128-bit hash (two 64-bit halves, Spark's ``xxhash64`` of the key's
values with two different seeds: ``key_hashes``), computed in Spark on the values as the lake
stores them, both when the batch's rows are written and when the index is built from the table,
so the two always agree. Two keys sharing 128 bits would be mistaken for one; for a billion keys
the odds are about 1 in 10**20.

In memory (on the driver) an index is sorted arrays of 24 bytes an entry (``hi``, ``lo``, file
id, row index) plus a smaller sorted layer of recent changes (deletions as tombstones), merged
into the base when it grows past a share of it. It describes the table at one Delta version
(``version``) and keeps that version's data files (``DataFile``: size, statistics, deletion
vector), so a commit can mark rows without reading Delta's state.

In the lake, under ``_pgcdc/index/<table folder>/<kind>/``, an index is a base (Arrow IPC:
``base-<version>.arrow`` with its files in ``base-<version>.json``) and, for each later commit
that pgcdc's indexed write made, a segment (``seg-<token>.arrow`` / ``.json``: the commit's
entries, tombstones and file changes) written before the commit, whose token the commit's
metadata records. Loading takes the newest base at or below the table's version and replays the
segments of the commits since; a commit without a segment of its own (a MERGE, a schema
rewrite, a compaction) makes the loader rebuild the index from the table instead, so a stale
index is never trusted.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from pgcdc.errors import PgcdcError
from pgcdc.lake.store.deltalog import DataFile, TableLog
from pgcdc.lake.store.storage import LakePath, StorageError
from pgcdc.lake.store.tables import LakeLayout, LakeTable, TableKind

__all__ = [
    "HASH_HI",
    "HASH_LO",
    "Entries",
    "IndexChanges",
    "IndexError_",
    "KeyIndex",
    "cached_index",
    "forget_index",
    "forget_indexes",
    "index_folder",
    "keep_index",
    "key_hashes",
]

log = logging.getLogger("pgcdc.lake")

HASH_HI = "__pgcdc_hash_hi"
HASH_LO = "__pgcdc_hash_lo"
#: the two seeds' stand-ins: xxhash64 chains its seed through its arguments, so a first
#: constant argument makes each half a hash function of its own
_SEED_HI = 0x5EED_0001
_SEED_LO = 0x5EED_0002
#: the recent-changes layer is merged into the base past this share of it (or this size)
_MERGE_SHARE = 8
_MERGE_MIN = 65_536

_U64 = np.uint64
_ENTRY = pa.schema(
    [("hi", pa.uint64()), ("lo", pa.uint64()), ("file", pa.int32()), ("row", pa.int64())]
)


def key_hashes(keys: Sequence[tuple[Any, Any]]) -> tuple[Any, Any]:
    """The two halves of a key's hash (Spark columns, 64 bits each, as signed longs) from its
    columns ``keys`` (Spark columns with their types, in the lake's types). A float's -0
    hashes as 0: Spark's equality makes them one key, as the MERGE matched them."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    parts = [
        F.when(column == F.lit(0), F.lit(0).cast(dtype)).otherwise(column)
        if isinstance(dtype, (T.FloatType, T.DoubleType))
        else column
        for column, dtype in keys
    ]
    return (
        F.xxhash64(F.lit(_SEED_HI), *parts).alias(HASH_HI),
        F.xxhash64(F.lit(_SEED_LO), *parts).alias(HASH_LO),
    )


@dataclass(frozen=True, slots=True)
class IndexChanges:
    """What one indexed commit changes in the index: new entries (a key's row is at file id,
    row), removed keys, files added, files whose deletion vector changed, files removed."""

    hi: np.ndarray
    lo: np.ndarray
    file: np.ndarray  # int32; -1: the key has no row any more
    row: np.ndarray  # int64
    added: tuple[DataFile, ...]
    updated: tuple[DataFile, ...]
    removed: tuple[str, ...]

    def to_bytes(self) -> tuple[bytes, bytes]:
        table = pa.table(
            [
                pa.array(self.hi, pa.uint64()),
                pa.array(self.lo, pa.uint64()),
                pa.array(self.file, pa.int32()),
                pa.array(self.row, pa.int64()),
            ],
            schema=_ENTRY,
        )
        files = {
            "added": [f.add_action()["add"] for f in self.added],
            "updated": [f.add_action()["add"] for f in self.updated],
            "removed": list(self.removed),
        }
        return _ipc(table), json.dumps(files).encode()

    @classmethod
    def from_bytes(cls, entries: bytes, files: bytes) -> IndexChanges:
        table = _read_ipc(entries)
        spec = json.loads(files)
        return cls(
            hi=table.column("hi").to_numpy(),
            lo=table.column("lo").to_numpy(),
            file=table.column("file").to_numpy(),
            row=table.column("row").to_numpy(),
            added=tuple(DataFile.from_add(a) for a in spec["added"]),
            updated=tuple(DataFile.from_add(a) for a in spec["updated"]),
            removed=tuple(spec["removed"]),
        )


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _read_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()


class Entries(NamedTuple):
    """Index entries sorted by key hash: its halves, the row's file id (-1: a tombstone, the
    key has no row) and row index."""

    hi: np.ndarray
    lo: np.ndarray
    file: np.ndarray
    row: np.ndarray

    @classmethod
    def empty(cls) -> Entries:
        u = np.empty(0, dtype=_U64)
        return cls(u, u, np.empty(0, np.int32), np.empty(0, np.int64))

    @classmethod
    def of(cls, hi: np.ndarray, lo: np.ndarray, file: np.ndarray, row: np.ndarray) -> Entries:
        """The entries, sorted."""
        hi = hi.astype(_U64, copy=False)
        lo = lo.astype(_U64, copy=False)
        order = np.lexsort((lo, hi))
        return cls(
            hi[order],
            lo[order],
            file.astype(np.int32, copy=False)[order],
            row.astype(np.int64, copy=False)[order],
        )

    def where(self, keep: np.ndarray) -> Entries:
        return Entries(self.hi[keep], self.lo[keep], self.file[keep], self.row[keep])


def _find(hi: np.ndarray, lo: np.ndarray, qhi: np.ndarray, qlo: np.ndarray) -> np.ndarray:
    """Positions of (qhi, qlo) in the sorted arrays (hi, lo); -1 where absent."""
    out = np.full(qhi.shape, -1, dtype=np.int64)
    if not hi.size or not qhi.size:
        return out
    left = np.searchsorted(hi, qhi, side="left")
    right = np.searchsorted(hi, qhi, side="right")
    single = (right - left) == 1
    idx = left[single]
    match = lo[idx] == qlo[single]
    out[np.flatnonzero(single)[match]] = idx[match]
    # the same upper half for several keys (about once in 2**64 pairs): compare the lower one
    for q in np.flatnonzero((right - left) > 1):
        for p in range(int(left[q]), int(right[q])):
            if lo[p] == qlo[q]:
                out[q] = p
                break
    return out


class KeyIndex:
    """A table's key index at one Delta version (see the module doc)."""

    def __init__(self, version: int, files: Sequence[DataFile]) -> None:
        self.version = version
        self._files: list[DataFile | None] = list(files)
        self._ids = {f.path: i for i, f in enumerate(files)}
        self._base = Entries.empty()
        #: recent changes (tombstones included), merged into the base when it grows
        self._recent = Entries.empty()
        #: the base as last persisted (version), and the segments since (their tokens, and
        #: the entries they hold)
        self.persisted: int | None = None
        self.segments: list[str] = []
        self.segment_entries = 0

    # -- building --------------------------------------------------------------------------

    @classmethod
    def from_entries(cls, version: int, files: Sequence[DataFile], entries: Entries) -> KeyIndex:
        """The index of a table at ``version`` with ``files`` and the live rows' ``entries``
        (file ids are positions in ``files``)."""
        index = cls(version, files)
        base = Entries.of(*entries)
        same = (base.hi[1:] == base.hi[:-1]) & (base.lo[1:] == base.lo[:-1])
        duplicates = np.flatnonzero(same)
        if duplicates.size:
            raise IndexError_(
                f"the table holds {duplicates.size + 1} or more rows of one key hash: it is not "
                "a table of unique keys"
            )
        index._base = base
        return index

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        live_recent = int(np.count_nonzero(self._recent[2] >= 0))
        shadowed = int(
            np.count_nonzero(_find(self._base[0], self._base[1], *self._recent[:2]) >= 0)
        )
        return int(self._base[0].size) - shadowed + live_recent

    def file(self, file_id: int) -> DataFile:
        found = self._files[file_id]
        if found is None:
            raise KeyError(file_id)
        return found

    def file_id(self, path: str) -> int | None:
        return self._ids.get(path)

    def files(self) -> list[DataFile]:
        return [f for f in self._files if f is not None]

    def next_file_id(self) -> int:
        """The id ``add_files`` gives the next file."""
        return len(self._files)

    def lookup(self, hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file id, row index) of each key's live row; file id -1 where it has none."""
        hi = hi.astype(_U64, copy=False)
        lo = lo.astype(_U64, copy=False)
        file = np.full(hi.shape, -1, dtype=np.int32)
        row = np.zeros(hi.shape, dtype=np.int64)
        recent = _find(self._recent.hi, self._recent.lo, hi, lo)
        in_recent = recent >= 0
        file[in_recent] = self._recent.file[recent[in_recent]]
        row[in_recent] = self._recent.row[recent[in_recent]]
        rest = np.flatnonzero(~in_recent)
        base = _find(self._base.hi, self._base.lo, hi[rest], lo[rest])
        found = base >= 0
        file[rest[found]] = self._base.file[base[found]]
        row[rest[found]] = self._base.row[base[found]]
        return file, row

    # -- changing --------------------------------------------------------------------------

    def add_files(self, files: Sequence[DataFile]) -> list[int]:
        """Register new data files; their ids."""
        ids = []
        for f in files:
            if f.path in self._ids:
                raise IndexError_(f"file {f.path} is already in the index")
            self._ids[f.path] = len(self._files)
            ids.append(len(self._files))
            self._files.append(f)
        return ids

    def apply(self, changes: IndexChanges, version: int) -> None:
        """The index after ``changes`` made the table's ``version`` (file ids of
        ``changes.added`` are those ``add_files`` gave, in order)."""
        for f in changes.updated:
            self._files[self._ids[f.path]] = f
        for path in changes.removed:
            file_id = self._ids.pop(path, None)
            if file_id is not None:
                self._files[file_id] = None
        if changes.hi.size:
            # a key's entry of a later written file wins over an earlier one (a stable sort
            # keeps the order of the changes among entries of one key)
            order = np.lexsort((np.arange(changes.hi.size), changes.lo, changes.hi))
            new = Entries(
                changes.hi.astype(_U64)[order],
                changes.lo.astype(_U64)[order],
                changes.file.astype(np.int32)[order],
                changes.row.astype(np.int64)[order],
            )
            last = np.ones(new.hi.size, dtype=bool)
            last[:-1] = (new.hi[1:] != new.hi[:-1]) | (new.lo[1:] != new.lo[:-1])
            new = new.where(last)
            old = _find(self._recent.hi, self._recent.lo, new.hi, new.lo)
            stay = np.ones(self._recent.hi.size, dtype=bool)
            stay[old[old >= 0]] = False
            kept = self._recent.where(stay)
            self._recent = Entries.of(
                *(np.concatenate([a, b]) for a, b in zip(kept, new, strict=True))
            )
        self.version = version
        if self._recent.hi.size > max(_MERGE_MIN, self._base.hi.size // _MERGE_SHARE):
            self.compact()

    def compact(self) -> None:
        """Merge the recent layer into the base (tombstones dropped)."""
        base, recent = self._base, self._recent
        shadowed = _find(base.hi, base.lo, recent.hi, recent.lo)
        stay = np.ones(base.hi.size, dtype=bool)
        stay[shadowed[shadowed >= 0]] = False
        live = recent.where(recent.file >= 0)
        self._base = Entries.of(
            *(np.concatenate([a, b]) for a, b in zip(base.where(stay), live, strict=True))
        )
        self._recent = Entries.empty()

    def remove_files(self, paths: Sequence[str]) -> None:
        """Forget ``paths`` and every entry pointing into them (after a commit that rewrote
        them: a compaction's or purge's rows are entered again from the files it added)."""
        ids = [self._ids.pop(p) for p in paths if p in self._ids]
        for i in ids:
            self._files[i] = None
        if not ids:
            return
        self.compact()
        self._base = self._base.where(~np.isin(self._base.file, np.asarray(ids, np.int32)))

    # -- the lake --------------------------------------------------------------------------

    def save_base(self, folder: LakePath) -> None:
        """Write the whole index as the base at its version; then remove the base it replaces
        and the segments since (a process killed in between leaves them: loading takes the
        newest base, and the vacuum of the index's folder is this)."""
        self.compact()
        hi, lo, file, row = self._base
        table = pa.table([pa.array(hi), pa.array(lo), pa.array(file), pa.array(row)], schema=_ENTRY)
        store = folder.location.store()
        files = [f.add_action()["add"] if f is not None else None for f in self._files]
        store.write((folder / f"base-{self.version}.json").key, json.dumps(files).encode())
        store.write((folder / f"base-{self.version}.arrow").key, _ipc(table))
        old = self.persisted
        gone = [f"seg-{token}.{ext}" for token in self.segments for ext in ("arrow", "json")]
        if old is not None and old != self.version:
            gone += [f"base-{old}.arrow", f"base-{old}.json"]
        for name in gone:
            with contextlib.suppress(OSError, StorageError):
                store.remove((folder / name).key)
        self.persisted = self.version
        self.segments = []
        self.segment_entries = 0

    def segment_saved(self, token: str, entries: int) -> None:
        """A segment of the index's latest commit is in the lake."""
        self.segments.append(token)
        self.segment_entries += entries

    def base_due(self) -> bool:
        """Whether the segments since the base weigh enough beside it to write a new base
        (they are replayed at each load, and their entries cost the lake's disk twice)."""
        if self.persisted is None:
            return False
        return self.segment_entries > max(_MERGE_MIN, self._base.hi.size // _MERGE_SHARE)


def save_segment(folder: LakePath, changes: IndexChanges) -> str:
    """Write a commit's changes as a segment before the commit; its token, for the commit's
    metadata. Not flushed to disk (``sync=False``: two flushes a table of every batch were a
    sixth of a hundred-table batch's commit threads): a segment a crash of the machine
    damaged is found by ``load``, which then rebuilds the index from the table."""
    token = uuid.uuid4().hex
    entries, files = changes.to_bytes()
    store = folder.location.store()
    store.write((folder / f"seg-{token}.json").key, files, sync=False)
    store.write((folder / f"seg-{token}.arrow").key, entries, sync=False)
    return token


class IndexError_(PgcdcError, RuntimeError):
    """The key index cannot describe the table (keys not unique, a file twice)."""


def load(folder: LakePath, table: TableLog, latest: int) -> KeyIndex | None:
    """The index at the table's version ``latest`` from its base and segments in ``folder``;
    None when they cannot give it (no base, or a commit since without its segment)."""
    names = set(folder.names())
    bases = sorted(
        (int(n[5:-6]) for n in names if n.startswith("base-") and n.endswith(".arrow")),
        reverse=True,
    )
    base = next((b for b in bases if b <= latest and f"base-{b}.json" in names), None)
    if base is None:
        return None
    files_json = (folder / f"base-{base}.json").read_bytes()
    entries = (folder / f"base-{base}.arrow").read_bytes()
    if files_json is None or entries is None:
        return None
    spec = json.loads(files_json)
    table_files = [DataFile.from_add(a) if a is not None else None for a in spec]
    t = _read_ipc(entries)
    index = KeyIndex(base, [f for f in table_files if f is not None])
    index._files = list(table_files)
    index._ids = {f.path: i for i, f in enumerate(table_files) if f is not None}
    index._base = Entries(*(t.column(n).to_numpy() for n in ("hi", "lo", "file", "row")))
    index.persisted = base
    if base == latest:
        return index
    try:
        commits = list(table.commits(base + 1, latest))
    except LookupError:
        return None
    for commit in commits:
        token = (commit.metadata or {}).get("index")
        if not isinstance(token, str) or f"seg-{token}.arrow" not in names:
            return None
        data = (folder / f"seg-{token}.arrow").read_bytes()
        spec_bytes = (folder / f"seg-{token}.json").read_bytes()
        if data is None or spec_bytes is None:
            return None
        try:
            changes = IndexChanges.from_bytes(data, spec_bytes)
        except (pa.ArrowException, ValueError, KeyError, TypeError) as exc:
            # not flushed when written (``save_segment``): a machine's crash can leave it empty
            log.warning("%s: segment %s unreadable (%s); rebuilding the index", folder, token, exc)
            return None
        index.add_files(changes.added)
        index.apply(changes, commit.version)
        index.segment_saved(token, int(changes.hi.size))
    return index


def index_folder(layout: LakeLayout, table: LakeTable, kind: TableKind) -> LakePath:
    """Where a Delta table's key index lives in the lake."""
    return layout.state_dir / "index" / table.path(layout, kind).key


#: Key indexes of the tables this process writes, by table path (kept between batches)
_INDEXES: dict[str, KeyIndex] = {}
_INDEXES_LOCK = threading.Lock()


def cached_index(path: str) -> KeyIndex | None:
    """The index this process keeps of the Delta table at ``path``, at whichever version."""
    with _INDEXES_LOCK:
        return _INDEXES.get(path)


def keep_index(path: str, index: KeyIndex) -> None:
    """Keep ``index`` as this process's index of the Delta table at ``path``."""
    with _INDEXES_LOCK:
        _INDEXES[path] = index


def forget_index(path: str) -> None:
    """Drop the index this process keeps of the Delta table at ``path`` (it was removed: a
    table created there again starts its versions anew)."""
    with _INDEXES_LOCK:
        _INDEXES.pop(str(path), None)


def forget_indexes() -> None:
    """Drop the indexes this process keeps (tests: another process wrote the tables)."""
    with _INDEXES_LOCK:
        _INDEXES.clear()
