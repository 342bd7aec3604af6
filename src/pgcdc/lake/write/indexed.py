"""The indexed write: a batch's share of a table as new files and one Delta commit, no MERGE.

Delta's MERGE costs what the table weighs (it finds the stored rows of the batch's keys by
reading the key column of every file they may be in, then rewrites from those files again) and
some eight Spark jobs and its planning whatever the batch. The indexed write costs what the
batch holds instead:

1. every table's rows of the batch (the mirror's rows reduced per key, the changelog's rows)
   are computed in Spark as before, and written by Python tasks as Parquet files straight
   into the tables' folders (``FileWriter``, under column mapping's physical names, with the
   statistics Delta's data skipping reads); all the batch's tables in **one** Spark job;
2. per mirror, the key index (``pgcdc.lake.write.keyindex``) gives the file and row of each key's
   stored row: those rows are marked deleted in deletion vectors written by Delta's own store;
   per history, the index holds its current versions: the ones the batch ends are copied,
   ended, by a second job for all histories (read by file and row index, no scan), and the
   stored rows marked deleted the same way;
3. each table moves in one commit through Delta's commit API (``pgcdc.lake.store.deltalog``): the
   new files, the files whose deletion vectors changed (removed and added again with the new
   vector, as Delta's DML does), the application transaction and the index segment's token.

What the index path does not serve stays with the MERGE (``pgcdc.lake.write.mirror``,
``pgcdc.lake.write.history``): a batch that truncates the table, and a table without a key (its
rows are copies, not keys).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from pgcdc.lake.store.delta import conflicts
from pgcdc.lake.store.deltalog import DataFile, TableLog
from pgcdc.lake.store.storage import LakeLocation, LakePath
from pgcdc.lake.store.tables import (
    COMMIT_LSN,
    COMMIT_TIME,
    END_AT,
    END_LSN,
    END_OP,
    IS_CURRENT,
    START_AT,
    START_LSN,
    START_OP,
    LakeLayout,
    LakeTable,
    TableKind,
)
from pgcdc.lake.write.changelog import IMAGES, changelog_columns
from pgcdc.lake.write.changes import (
    event_array,
    expressions,
    image_columns,
    lake_image,
    lake_type,
    quote_column,
)
from pgcdc.lake.write.history import ACTION, history_rows, history_schema
from pgcdc.lake.write.keyindex import (
    HASH_HI,
    HASH_LO,
    Entries,
    IndexChanges,
    IndexError_,
    KeyIndex,
    cached_index,
    index_folder,
    keep_index,
    key_hashes,
    load,
    save_segment,
)
from pgcdc.lake.write.mirror import OP_COLUMN as OP
from pgcdc.lake.write.mirror import mirror_rows, mirror_schema
from pgcdc.lake.write.schema_evolution import evolve
from pgcdc.lake.write.sessions import in_sessions
from pgcdc.lake.write.sink import TableBatch
from pgcdc.lake.write.snapshot import (
    SnapshotOutput,
    arrow_schema,
    dictionary_columns,
    file_stats,
    physical_type,
    snapshot_struct,
    to_physical,
)
from pgcdc.lake.write.toast import KEEP_PREFIX, ROOT_PREFIX, fill_from_stored

__all__ = [
    "WRITTEN",
    "IndexWanted",
    "Output",
    "SharedWriter",
    "Written",
    "direct_write",
    "mirror_indexes",
]

log = logging.getLogger("pgcdc.lake")

#: Where the write tells the tests' kill points (``pgcdc.lake.write.batch._Commits.reached``): the
#: point's name and what reached it
Reached = Callable[[str, str], None]

#: What a writer task reports: one row per file written, and one per task with its deletes
WRITTEN = pa.schema(
    [
        ("output", pa.int32()),
        ("path", pa.string()),
        ("size", pa.int64()),
        ("rows", pa.int64()),
        ("stats", pa.string()),
        ("hi", pa.binary()),
        ("lo", pa.binary()),
        ("row", pa.binary()),
        ("deleted_hi", pa.binary()),
        ("deleted_lo", pa.binary()),
        ("closes", pa.binary()),
    ]
)

#: What a keyed output's row is (its ``OP``): written, its key's current row ('U'); written,
#: not a key's current row (a history version ended within the batch, 'W'); no row any more
#: ('D'); a request to end the key's stored current version ('C', a history's close)
WRITE, WRITE_ONLY, DELETE, CLOSE = "U", "W", "D", "C"

#: A history's close requests as a writer task reports them (Arrow IPC in ``closes``)
CLOSES = pa.schema(
    [
        ("hi", pa.uint64()),
        ("lo", pa.uint64()),
        ("end_lsn", pa.int64()),
        ("end_at", pa.timestamp("us", tz="UTC")),
        ("end_op", pa.string()),
    ]
)


@dataclass(frozen=True, slots=True)
class Output:
    """One Delta table the writer tasks write: where and how (``target``), and whether its
    rows are a mirror's (``keyed``: they carry their key's hash and an operation; deletes are
    not written, only reported, and a file's row order gives each key its row index)."""

    target: SnapshotOutput
    keyed: bool


def packed_column(output: int) -> str:
    """The column holding output ``output``'s rows in the batch's packed union."""
    return f"__pgcdc_w{output}"


#: the packed union's column telling which output a row is for
OUTPUT_COLUMN = "__pgcdc_output"

#: Each Delta table's output number in the batches' shared plan: the same for a table over
#: the process's life, so that its part of the plan is built once (``shared_rows``)
_NUMBERS: dict[tuple[str, TableKind], int] = {}
_NUMBERS_LOCK = threading.Lock()


def output_number(table_id: str, kind: TableKind) -> int:
    """The output number of a table's Delta table of ``kind`` in the shared plan."""
    with _NUMBERS_LOCK:
        return _NUMBERS.setdefault((table_id, kind), len(_NUMBERS))


@dataclass(frozen=True, slots=True)
class SharedWriter:
    """A Spark task's writer (``mapInArrow``) over the batch's packed union of every output's
    rows (each row: its output's number in ``OUTPUT_COLUMN``, its values in that output's
    struct column, ``packed_column``): writes each output's rows of the task as one Parquet
    file in its table's folder and reports them (``WRITTEN``), so that a batch's tables are
    written by one Spark stage, not a stage per table."""

    outputs: Mapping[int, Output]
    location: LakeLocation
    tag: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        files: dict[int, _OutputFile] = {}
        try:
            for received in batches:
                # each output's rows as one slice of the batch sorted by output (a filter per
                # output read the whole batch once per output: a hundred tables, a hundred
                # times); the sort is stable, so each output's rows keep their order
                order = pc.sort_indices(received.column(OUTPUT_COLUMN))
                ordered = received.take(order)
                which = ordered.column(OUTPUT_COLUMN).to_numpy(zero_copy_only=False)
                starts = np.flatnonzero(np.diff(which, prepend=which[:1] - 1))
                ends = np.append(starts[1:], which.size)
                for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
                    number = int(which[start])
                    struct = ordered.column(packed_column(number)).slice(start, end - start)
                    part = pa.RecordBatch.from_struct_array(struct)
                    if number not in files:
                        files[number] = _OutputFile(number, self.outputs[number], self)
                    files[number].write(part)
            reports = [f.close() for f in files.values()]
        except BaseException:
            for f in files.values():
                f.abort()
            raise
        reports = [r for r in reports if r["path"] is not None or r["deleted_hi"] or r["closes"]]
        if reports:
            yield pa.RecordBatch.from_pylist(reports, schema=WRITTEN)


class _OutputFile:
    """One output's Parquet file of a writer task, and the keys it wrote, deleted and asks
    to close."""

    def __init__(self, number: int, output: Output, writer: SharedWriter) -> None:
        self.number = number
        self.output = output
        self.location = writer.location
        self.fs = writer.location.arrow_filesystem()
        self.name = f"part-{uuid.uuid4().hex}-{writer.tag}.snappy.parquet"
        self.uri = f"{output.target.directory}/{self.name}"
        self.path = self.location.arrow_path(self.uri)
        self.writer: Any = None
        self.rows = 0
        self.his: list[np.ndarray] = []
        self.los: list[np.ndarray] = []
        self.at: list[np.ndarray] = []  # row indexes in the file of the entries his/los
        self.deleted_his: list[np.ndarray] = []
        self.deleted_los: list[np.ndarray] = []
        self.closes: list[pa.Table] = []

    def _failed(self, exc: OSError) -> OSError:
        """``exc`` naming the file it was writing (a full disk's error from Arrow names none),
        as a URI: what ``pgcdc.lake.run.failures`` reads the path of a failure from (a local
        lake's is a plain path)."""
        uri = self.uri if self.location.is_s3 else Path(self.path).as_uri()
        return OSError(exc.errno, f"{exc} (writing {uri})")

    def write(self, received: pa.RecordBatch) -> None:
        try:
            self._write(received)
        except OSError as exc:
            raise self._failed(exc) from exc

    def _write(self, received: pa.RecordBatch) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        kept = received
        if self.output.keyed:
            op = received.column(OP)
            gone = received.filter(pc.equal(op, DELETE))
            self.deleted_his.append(_u64(gone.column(HASH_HI)))
            self.deleted_los.append(_u64(gone.column(HASH_LO)))
            closing = received.filter(pc.equal(op, CLOSE))
            if closing.num_rows:
                self.closes.append(_close_requests(closing))
            kept = received.filter(pc.is_in(op, pa.array([WRITE, WRITE_ONLY])))
            if not kept.num_rows:
                return
            current = pc.equal(kept.column(OP), WRITE).to_numpy(zero_copy_only=False)
            self.his.append(_u64(kept.column(HASH_HI))[current])
            self.los.append(_u64(kept.column(HASH_LO))[current])
            self.at.append(self.rows + np.flatnonzero(current).astype(np.int64))
        if not kept.num_rows:
            return
        target = self.output.target
        table = _in_schema(kept, target)
        if self.writer is None:
            if not self.location.is_s3:
                os.makedirs(target.directory, exist_ok=True)
            self.writer = pq.ParquetWriter(
                self.path,
                target.physical,
                filesystem=self.fs,
                compression="snappy",
                use_dictionary=dictionary_columns(table),
            )
        self.writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> dict[str, Any]:
        closes = b""
        if self.closes:
            closes = _ipc_bytes(pa.concat_tables(self.closes))
        report: dict[str, Any] = {
            "output": self.number,
            "path": None,
            "size": 0,
            "rows": 0,
            "stats": None,
            "hi": _bytes(self.his),
            "lo": _bytes(self.los),
            "row": _bytes(self.at),
            "deleted_hi": _bytes(self.deleted_his),
            "deleted_lo": _bytes(self.deleted_los),
            "closes": closes,
        }
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as exc:
                raise self._failed(exc) from exc
            self.writer = None
            report.update(
                path=self.name,
                size=self.fs.get_file_info(self.path).size,
                rows=self.rows,
                stats=file_stats(self.path, self.output.target, self.fs),
            )
        return report

    def abort(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
        with contextlib.suppress(OSError):
            self.fs.delete_file(self.path)


def _close_requests(rows: pa.RecordBatch) -> pa.Table:
    """A history's close rows as ``CLOSES``: the key's hash and how its version ends."""
    return pa.table(
        [
            pa.array(_u64(rows.column(HASH_HI)), pa.uint64()),
            pa.array(_u64(rows.column(HASH_LO)), pa.uint64()),
            rows.column(END_LSN).cast(pa.int64()),
            rows.column(END_AT).cast(pa.timestamp("us", tz="UTC")),
            rows.column(END_OP).cast(pa.string()),
        ],
        schema=CLOSES,
    )


def _ipc_bytes(table: pa.Table) -> bytes:
    import io

    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _in_schema(batch: pa.RecordBatch, target: SnapshotOutput) -> pa.Table:
    """The batch's rows in the table's schema (a column the batch lacks is NULL: a source
    column dropped since, which the table keeps), under its physical names."""
    arrays = []
    for f in target.schema:
        index = batch.schema.get_field_index(f.name)
        if index < 0:
            arrays.append(pa.nulls(batch.num_rows, f.type))
            continue
        column = batch.column(index)
        arrays.append(column if column.type == f.type else column.cast(f.type, safe=True))
    return to_physical(pa.Table.from_arrays(arrays, schema=target.schema), target.physical)


def _u64(column: pa.Array) -> np.ndarray:
    """A hash column (Spark's signed longs) as unsigned 64-bit integers."""
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64).view(np.uint64)


def _bytes(parts: list[np.ndarray]) -> bytes:
    """Arrays of 64-bit integers (hash halves, row indexes) as little-endian bytes."""
    if not parts:
        return b""
    return np.concatenate(parts).astype("<u8").tobytes()


@dataclass(slots=True)
class Written:
    """What the writer tasks wrote for one Delta table: its files, each with the index
    entries of its rows (key hash halves and row index), the deleted keys' hashes, and a
    history's close requests (``CLOSES``)."""

    files: list[tuple[DataFile, np.ndarray, np.ndarray, np.ndarray]]
    deleted_hi: np.ndarray
    deleted_lo: np.ndarray
    closes: pa.Table

    @classmethod
    def collect(cls, rows: Sequence[Mapping[str, Any]]) -> Written:
        import json

        files = []
        dhi: list[np.ndarray] = []
        dlo: list[np.ndarray] = []
        closes: list[pa.Table] = []
        for r in rows:
            if r["path"] is not None:
                stats = r["stats"]
                data_file = DataFile(
                    path=r["path"],
                    size=int(r["size"]),
                    records=int(json.loads(stats).get("numRecords", r["rows"]))
                    if stats
                    else int(r["rows"]),
                    stats=stats,
                    modification_time=0,
                )
                files.append(
                    (
                        data_file,
                        np.frombuffer(r["hi"] or b"", dtype="<u8"),
                        np.frombuffer(r["lo"] or b"", dtype="<u8"),
                        np.frombuffer(r["row"] or b"", dtype="<i8"),
                    )
                )
            dhi.append(np.frombuffer(r["deleted_hi"] or b"", dtype="<u8"))
            dlo.append(np.frombuffer(r["deleted_lo"] or b"", dtype="<u8"))
            if r["closes"]:
                closes.append(pa.ipc.open_stream(pa.BufferReader(r["closes"])).read_all())
        empty = np.empty(0, dtype=np.uint64)
        return cls(
            files,
            np.concatenate(dhi) if dhi else empty,
            np.concatenate(dlo) if dlo else empty,
            pa.concat_tables(closes) if closes else CLOSES.empty_table(),
        )


def commit_appended(
    table: TableLog,
    snapshot: Any,
    written: Written,
    *,
    session: Any,
    app_id: str,
    version: int,
    metadata: Mapping[str, Any],
) -> int:
    """Commit an append (the changelog): the written files, tagged; the version committed."""
    now = _now_ms()
    actions = [_stamped(f, now).add_action() for f, *_ in written.files]
    return table.commit(
        actions,
        snapshot=snapshot,
        session=session,
        app_id=app_id,
        txn_version=version,
        metadata=metadata,
    )


def commit_indexed(
    table: TableLog,
    snapshot: Any,
    index: KeyIndex,
    written: Written,
    *,
    folder: LakePath,
    session: Any,
    app_id: str,
    version: int,
    metadata: Mapping[str, Any],
    replaced: tuple[np.ndarray, np.ndarray] | None = None,
    extra: Sequence[DataFile] = (),
    reached: Reached | None = None,
) -> int:
    """Commit a batch of a mirror or a history through its key index; the version committed.

    The stored rows of ``replaced`` keys (default: every key the batch wrote or deleted, as for
    a mirror; a history's: the keys whose version the batch closes) are marked deleted; the
    written files and ``extra`` ones (a history's closed versions, no key's current row) are
    added; the index gets the deleted keys' tombstones, then the written rows' entries, in a
    segment saved before the commit. The index moves to the committed version only when the
    commit came right after the index's own version (else the next use rebuilds it).
    ``reached``: told each kill point of the tests (``pgcdc.lake.write.batch.KILL_POINTS``)."""
    now = _now_ms()
    new_files = [_stamped(f, now) for f, *_ in written.files]
    extra_files = [_stamped(f, now) for f in extra]
    his = [h for _, h, _, _ in written.files]
    los = [lo for _, _, lo, _ in written.files]
    if replaced is None:
        replaced = (
            np.concatenate([written.deleted_hi, *his]),
            np.concatenate([written.deleted_lo, *los]),
        )
        gone = (written.deleted_hi, written.deleted_lo)
    else:
        gone = replaced
    file_ids, rows = index.lookup(*replaced)
    stored = file_ids >= 0
    pairs = [
        (index.file(int(fid)), rows[stored & (file_ids == fid)])
        for fid in np.unique(file_ids[stored])
    ]
    updated = table.mark_deleted(pairs)
    # the new files' ids follow the index's current ones, in order (``KeyIndex.add_files``)
    next_id = index.next_file_id()
    entry_file = [
        np.full(h.size, next_id + i, dtype=np.int32) for i, (_, h, _, _) in enumerate(written.files)
    ]
    changes = IndexChanges(
        hi=np.concatenate([gone[0], *his]),
        lo=np.concatenate([gone[1], *los]),
        file=np.concatenate([np.full(gone[0].size, -1, np.int32), *entry_file]),
        row=np.concatenate(
            [np.zeros(gone[0].size, np.int64), *[r for _, _, _, r in written.files]]
        ),
        added=(*new_files, *extra_files),
        updated=tuple(updated.values()),
        removed=(),
    )
    token = save_segment(folder, changes)
    if reached is not None:
        reached("index-segment", table.path)
    actions: list[Mapping[str, Any]] = []
    for path, data_file in updated.items():
        previous = index.file(index.file_id(path))  # type: ignore[arg-type]
        actions.append(previous.remove_action(now))
        actions.append(data_file.add_action())
    actions += [f.add_action() for f in (*new_files, *extra_files)]
    committed = table.commit(
        actions,
        snapshot=snapshot,
        session=session,
        app_id=app_id,
        txn_version=version,
        metadata={**metadata, "index": token},
    )
    if committed == index.version + 1:
        index.add_files(changes.added)
        index.apply(changes, committed)
        index.segment_saved(token, int(changes.hi.size))
        if index.base_due():
            index.save_base(folder)
    else:
        index.version = -1  # a concurrent commit came between: rebuilt before the next use
    return committed


#: adaptive query execution runs each of a plan's shuffles as a job of its own and plans the
#: rest again after each: the shared write has one small shuffle per table
_ADAPTIVE = "spark.sql.adaptive.enabled"


#: nested column aliasing through the shared plan's ``explode`` loses a table's struct column
#: when several outputs read fields of it (Spark 4: INTERNAL_ERROR_ATTRIBUTE_NOT_FOUND); the
#: write reads every field it names anyway
_NESTED_PRUNING = (
    "spark.sql.optimizer.nestedSchemaPruning.enabled",
    "spark.sql.optimizer.expression.nestedPruning.enabled",
)


def _collect_without_adaptive(spark: Any, df: Any) -> pa.Table:
    """``df``'s rows (Arrow), computed with adaptive query execution and nested column pruning
    off in ``spark``."""
    conf = spark.conf
    settings = (_ADAPTIVE, *_NESTED_PRUNING)
    before = {k: conf.get(k, None) for k in settings}
    for k in settings:
        conf.set(k, "false")
    try:
        return df.toArrow()
    finally:
        for k, value in before.items():
            if value is None:
                conf.unset(k)
            else:
                conf.set(k, value)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _stamped(data_file: DataFile, now: int) -> DataFile:
    from dataclasses import replace

    return replace(data_file, modification_time=now)


#: the most outputs (Delta tables) one Spark job of a batch's shared plan writes
SHARED_OUTPUTS = 64

#: a Delta table with this many changes in a batch has its rows written by every writer task
#: (each a file of its own), a smaller one by one task
SPREAD = 50_000

#: how many times a table's commit is tried when a concurrent commit (maintenance) conflicts
CONFLICT_ATTEMPTS = 5

#: ``WRITTEN`` as Spark's schema (``mapInArrow``'s result)
_WRITTEN_SPARK = (
    "output int, path string, size long, rows long, stats string, hi binary, lo binary, "
    "row binary, deleted_hi binary, deleted_lo binary, closes binary"
)


#: What a rebuild or a follow reads of a table: per row, its key's hash, file and row index
_ENTRIES_SPARK = "part int, hi long, lo long, file int, row long"


@dataclass(frozen=True, slots=True)
class _IndexRead:
    """One table's rows to enter in an index: which table (``part``), from which files."""

    part: int
    table: TableLog
    snapshot: Any
    keys: tuple[str, ...]
    #: the files to read (all of the snapshot's for a build) and their ids
    files: tuple[DataFile, ...]
    ids: tuple[int, ...]
    #: read the files as Parquet (files a compaction wrote: no deletion vectors), not as the
    #: Delta table at the snapshot
    parquet: bool
    #: a history's: only its current versions are entered
    current_only: bool = False


def _entries_plan(spark: Any, read: _IndexRead) -> Any:
    """A Spark plan of ``read``'s entries: each live row's key hash, the id of its file and
    its row index in it (Delta's reader: deleted rows are not read)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    by_name = {
        unquote(f.path).rsplit("/", 1)[-1]: i for f, i in zip(read.files, read.ids, strict=True)
    }
    if len(by_name) != len(read.files):
        raise IndexError_(f"{read.table.path}: two data files of one name")
    delta = read.table.schema(read.snapshot)
    struct = T.StructType.fromJson(delta)
    if read.parquet:
        physical = {
            f["name"]: f.get("metadata", {}).get("delta.columnMapping.physicalName", f["name"])
            for f in delta["fields"]
        }
        base = read.table.path.rstrip("/")
        wanted = [*read.keys, *([IS_CURRENT] if read.current_only else [])]
        # the columns read, under their physical names (no schema inference from the files)
        schema = T.StructType(
            [T.StructField(physical[n], struct[n].dataType, True) for n in wanted]
        )
        rows = spark.read.schema(schema).parquet(*[f"{base}/{unquote(f.path)}" for f in read.files])
        columns = [(F.col(quote_column(physical[k])), struct[k].dataType) for k in read.keys]
        if read.current_only:
            rows = rows.where(F.col(quote_column(physical[IS_CURRENT])))
    else:
        version = int(read.snapshot.version())
        rows = spark.read.format("delta").option("versionAsOf", version).load(read.table.path)
        columns = [(F.col(quote_column(k)), rows.schema[k].dataType) for k in read.keys]
        if read.current_only:
            rows = rows.where(F.col(quote_column(IS_CURRENT)))
    hi, lo = key_hashes(columns)
    mapping = F.create_map(*[x for n, i in by_name.items() for x in (F.lit(n), F.lit(i))])
    name = F.substring_index(F.col("_metadata.file_path"), "/", -1)
    return rows.select(
        F.lit(read.part).alias("part"),
        hi.alias("hi"),
        lo.alias("lo"),
        F.element_at(mapping, name).cast("int").alias("file"),
        F.col("_metadata.row_index").cast("long").alias("row"),
    )


def _read_entries(spark: Any, reads: Sequence[_IndexRead]) -> dict[int, Entries]:
    """The entries of every read, by one Spark job (collected: 28 bytes a row)."""
    found: dict[int, Entries] = {r.part: Entries.empty() for r in reads}
    plans = [_entries_plan(spark, r) for r in reads if r.files]
    if not plans:
        return found
    union = plans[0]
    for more in plans[1:]:
        union = union.unionByName(more)
    table = union.toArrow()
    if table.column("file").null_count:
        raise IndexError_("a row of a file the table's log does not list")
    parts = table.column("part").to_numpy()
    hi, lo = _u64(table.column("hi")), _u64(table.column("lo"))
    file, row = table.column("file").to_numpy(), table.column("row").to_numpy()
    for part in np.unique(parts):
        mine = parts == part
        found[int(part)] = Entries(hi[mine], lo[mine], file[mine], row[mine])
    return found


@dataclass(frozen=True, slots=True)
class IndexWanted:
    """A table whose key index a batch needs, at ``snapshot`` (a history's indexes its current
    versions only)."""

    table: TableLog
    snapshot: Any
    keys: tuple[str, ...]
    folder: LakePath
    history: bool = False
    #: the snapshot's data files when the caller knows them and none has a deletion vector
    #: (a copy just committed them): an index built is read from them as Parquet, with no
    #: Spark job over the table's log for its files or its state
    files: tuple[DataFile, ...] | None = None


def mirror_indexes(
    spark: Any, wanted: Sequence[IndexWanted], reached: Reached | None = None
) -> list[KeyIndex]:
    """The key index of each table at its snapshot: the one this process keeps when it is at
    that version, or brought there when only compactions and purges came since (their new
    files read), else the lake's (base and segments), else built from the table and saved.
    Whatever the indexes need read is read by one Spark job. ``reached``: told each kill
    point of the tests (``pgcdc.lake.write.batch.KILL_POINTS``)."""
    out: list[KeyIndex | None] = [None] * len(wanted)
    reads: list[_IndexRead] = []
    followed: dict[int, tuple[KeyIndex, list[str]]] = {}
    built: dict[int, list[DataFile]] = {}
    for i, w in enumerate(wanted):
        version = int(w.snapshot.version())
        cached = cached_index(w.table.path)
        if cached is not None and cached.version == version:
            out[i] = cached
            continue
        if cached is not None and 0 <= cached.version < version:
            follow = _follow(w.table, cached, version)
            if follow is not None:
                added, removed = follow
                ids = tuple(cached.add_files(added))
                followed[i] = (cached, removed)
                reads.append(
                    _IndexRead(i, w.table, w.snapshot, w.keys, added, ids, True, w.history)
                )
                continue
        loaded = load(w.folder, w.table, version)
        if loaded is not None:
            out[i] = loaded
            continue
        files = w.table.files(w.snapshot) if w.files is None else list(w.files)
        built[i] = files
        every = tuple(range(len(files)))
        parquet = w.files is not None
        reads.append(
            _IndexRead(i, w.table, w.snapshot, w.keys, tuple(files), every, parquet, w.history)
        )
    started = time.monotonic()
    entries = _read_entries(spark, reads)
    if built and reached is not None:
        reached("index-rebuild", ", ".join(wanted[i].table.path for i in built))
    for i, (index, removed) in followed.items():
        w = wanted[i]
        index.remove_files(removed)
        found = entries[i]
        index.apply(IndexChanges(*found, added=(), updated=(), removed=()), w.snapshot.version())
        index.save_base(w.folder)
        log.info("key index of %s followed a compaction to %s", w.table.path, index.version)
        out[i] = index
    for i, files in built.items():
        w = wanted[i]
        index = KeyIndex.from_entries(int(w.snapshot.version()), files, entries[i])
        index.save_base(w.folder)
        # the read is one job for every index the batch reads: its time is shared
        log.info(
            "built the key index of %s at %s: %s keys in %.1f s",
            w.table.path,
            index.version,
            len(index),
            time.monotonic() - started,
        )
        out[i] = index
    result = []
    for w, ready in zip(wanted, out, strict=True):
        assert ready is not None
        keep_index(w.table.path, ready)
        result.append(ready)
    return result


def _follow(
    table: TableLog, index: KeyIndex, version: int
) -> tuple[tuple[DataFile, ...], list[str]] | None:
    """What brings ``index`` to ``version`` when the commits since are compactions or purges
    only (files rewritten with the same rows, the deleted ones dropped): the files they added
    (to read) and removed; None when another commit came (then the index is rebuilt)."""
    try:
        commits = list(table.commits(index.version + 1, version))
    except LookupError:
        return None
    added: dict[str, DataFile] = {}
    removed: list[str] = []
    for commit in commits:
        meta = commit.metadata or {}
        if commit.changed_metadata or meta.get("operation") not in ("compact", "purge"):
            return None
        for path in commit.removed:
            if path in added:
                del added[path]
            elif index.file_id(path) is not None:
                removed.append(path)
            else:
                return None
        for f in commit.added:
            if f.deletion_vector is not None:
                return None
            added[f.path] = f
    return tuple(added.values()), removed


def indexed_rows(batch: TableBatch) -> Any:
    """A mirror's rows of the batch for the indexed write: per key its last state (``'U'``
    written, ``'D'`` deleted), unchanged TOAST values filled from the mirror as stored before
    the batch, with the key's hash."""
    from pyspark.sql import functions as F

    table = batch.table
    keys = table.row_keys
    rows = mirror_rows(batch.resolved, table, batch.columns, batch.overview)
    rows = fill_from_stored(rows, batch.stored, keys, batch.columns, foreign_only=False)
    hi, lo = key_hashes([(F.col(quote_column(k)), rows.schema[k].dataType) for k in keys])
    names = [*batch.columns, COMMIT_LSN, COMMIT_TIME]
    return rows.select(*[F.col(quote_column(c)) for c in names], F.col(OP), hi, lo)


def _target(
    table: TableLog,
    snapshot: Any,
    batch: TableBatch,
    kind: TableKind,
    delta: dict[str, Any] | None = None,
) -> SnapshotOutput:
    """Where and how the writer tasks write one Delta table's files: its folder, its current
    schema (logical and physical names) and its statistics columns. ``delta``: the snapshot's
    schema (Delta's JSON), when the caller has it."""
    from pyspark.sql import types as T

    if delta is None:
        delta = table.schema(snapshot)
    struct = T.StructType.fromJson(delta)
    schema = arrow_schema(struct)
    physical = pa.schema(list(physical_type(pa.struct(list(schema)), delta)))
    names = dict(zip(schema.names, physical.names, strict=True))
    stats = tuple(names[c] for c in batch.table.stats_columns(kind) if c in names)
    return SnapshotOutput(
        batch.table.table_id, batch.column, kind, table.path, schema, physical, stats
    )


def wanted_schema(df: Any, column: str, kind: TableKind) -> Any:
    """The schema (Spark) a Delta table's rows of the batch have, from the batch's schema
    alone (no plan analysed)."""
    return lake_type(snapshot_struct(df.schema, column, kind))


#: the shared plan's columns: each event's header (its output, key hash, sequence)
_HEADER = "__pgcdc_h"
_HI = "__pgcdc_h_hi"
_LO = "__pgcdc_h_lo"
_SEQ = "__pgcdc_seq"
_REDUCED = "__pgcdc_r"
_EVOP = "__pgcdc_h_op"  # the event's operation (I, U, D)
_TIME = "__pgcdc_h_at"  # its commit time
_LSN = "__pgcdc_lsn"
_FIRST = "__pgcdc_first_op"
_ENDS = "__pgcdc_ends"


@dataclass(frozen=True, slots=True)
class SharedOutput:
    """A Delta table of the batch written through the shared plan: its output number, table,
    kind, struct column and columns."""

    output: int
    table: LakeTable
    kind: TableKind
    column: str
    names: tuple[str, ...]


def shared_rows(df: Any, outputs: Sequence[SharedOutput]) -> Any:
    """Every output's rows of the batch by one plan with one shuffle, whatever the number of
    tables: per source row its events (a key change split in two, a changelog row), each with
    its output and key hash (``event_array``, ``key_hashes``); the mirrors' events reduced per
    key to the last by ``(commit LSN, position, sub)`` (``mirror.mirror_rows``'s rule, for
    tables without unchanged TOAST values in the batch), the histories' events made versions
    per key (``_history_parts``), the changelogs' rows as they are. Rows: ``OUTPUT_COLUMN``
    and each output's ``packed_column``.

    Each output's part of the plan (its events, its packed row, its versions) is built once
    per output number and schema and kept (``expressions``): the tables a batch touches vary
    from batch to batch, and building a part is hundreds of gateway calls."""
    from pyspark.sql import functions as F

    schema = df.schema.json()
    by_table: dict[str, list[SharedOutput]] = {}
    for o in outputs:
        by_table.setdefault(o.table.table_id, []).append(o)
    branches: Any = None
    for mine in by_table.values():
        when, array = expressions(
            df, ("shared-events", tuple(mine), schema), functools.partial(_events, df, mine)
        )
        branches = F.when(when, array) if branches is None else branches.when(when, array)
    carried = sorted({o.column for o in outputs})
    columns = [F.col(c) for c in _CARRIED] + [F.col(quote_column(c)) for c in carried]
    header = expressions(df, ("shared-header",), _header_columns)
    packed = [
        *header,
        *[
            expressions(df, ("shared-packed", o, schema), functools.partial(_packed_value, df, o))
            for o in outputs
        ],
    ]
    where = F.col("_table_id").isin(list(by_table))
    rows = df.where(where).select(*columns, F.explode(branches).alias(_HEADER)).select(*packed)
    mirrors = [o.output for o in outputs if o.kind == "mirror"]
    changelogs = [o.output for o in outputs if o.kind == "changelog"]
    parts = []
    histories = [o for o in outputs if o.kind == "history"]
    keyed = rows
    if histories:
        # one shuffle by key for the mirrors' reduction and the histories' versions alike
        # (an aggregate or window on more columns than these needs no other)
        keyed = rows.repartition(F.col(OUTPUT_COLUMN), F.col(_HI), F.col(_LO))
        parts.extend(_history_parts(df, keyed, histories, schema))
    if mirrors:
        names = [packed_column(k) for k in mirrors]
        reduced = (
            keyed.where(F.col(OUTPUT_COLUMN).isin(mirrors))
            .groupBy(OUTPUT_COLUMN, _HI, _LO)
            .agg(F.max_by(F.struct(*[F.col(n) for n in names]), _SEQ).alias(_REDUCED))
        )
        parts.append(
            reduced.select(
                F.col(OUTPUT_COLUMN), *[F.col(_REDUCED).getField(n).alias(n) for n in names]
            )
        )
    if changelogs:
        names = [packed_column(k) for k in changelogs]
        parts.append(
            rows.where(F.col(OUTPUT_COLUMN).isin(changelogs)).select(
                F.col(OUTPUT_COLUMN), *[F.col(n) for n in names]
            )
        )
    union = parts[0]
    for more in parts[1:]:
        union = union.unionByName(more, allowMissingColumns=True)
    return union


#: the source's columns the shared plan carries beside the tables' struct columns
_CARRIED = (
    "_table_id",
    "_op",
    "_commit_lsn",
    "_commit_lsn_text",
    "_end_lsn",
    "_position",
    "_xid",
    "_commit_time",
)


def _history_parts(
    df: Any, keyed: Any, histories: Sequence[SharedOutput], schema: str
) -> list[Any]:
    """The histories' rows of the batch from their events (``keyed``: partitioned by output
    and key hash), by ``history.history_rows``' rules for a batch without TRUNCATE or
    unchanged TOAST values: a key's events collapsed per transaction to its final state (the
    first operation telling an insert), each state not a delete a version that the key's next
    transaction in the batch ends (``WRITE_ONLY``), or the current one (``WRITE``); per key a
    ``CLOSE`` request ending its version current before the batch at its first transaction."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    numbers = [o.output for o in histories]
    lsn = F.col(_SEQ).getField("_commit_lsn")
    collapsed = (
        keyed.where(F.col(OUTPUT_COLUMN).isin(numbers))
        .groupBy(F.col(OUTPUT_COLUMN), F.col(_HI), F.col(_LO), lsn.alias(_LSN))
        .agg(
            F.max_by(
                F.struct(
                    F.col(_EVOP).alias("op"),
                    F.col(_TIME).alias("at"),
                    *[F.col(packed_column(k)) for k in numbers],
                ),
                _SEQ,
            ).alias(_REDUCED),
            F.min_by(F.col(_EVOP), _SEQ).alias(_FIRST),
        )
    )
    r = F.col(_REDUCED)
    # how the transaction ends the version before it: 'D' if it deleted the key, first
    # (deleted and wrote it again) or last (no version follows)
    ends = F.when((F.col(_FIRST) == "D") | (r.getField("op") == "D"), "D").otherwise("U")
    by_key = Window.partitionBy(OUTPUT_COLUMN, _HI, _LO).orderBy(_LSN)
    stepped = collapsed.select("*", ends.alias(_ENDS)).select(
        F.col(OUTPUT_COLUMN),
        F.col(_HI),
        F.col(_LO),
        F.col(_LSN),
        r,
        F.col(_FIRST),
        F.col(_ENDS),
        F.lead(_LSN).over(by_key).alias("next_lsn"),
        F.lead(r.getField("at")).over(by_key).alias("next_time"),
        F.lead(_ENDS).over(by_key).alias("next_ends"),
        F.row_number().over(by_key).alias("n"),
    )
    out = F.col(OUTPUT_COLUMN)
    versions = stepped.where(r.getField("op") != F.lit("D")).select(
        out,
        *[
            expressions(df, ("shared-version", o, schema), functools.partial(_history_version, o))
            for o in histories
        ],
    )
    closes = stepped.where(F.col("n") == 1).select(
        out,
        *[
            expressions(df, ("shared-close", o, schema), functools.partial(_history_close, o))
            for o in histories
        ],
    )
    return [versions, closes]


def _history_version(o: SharedOutput) -> Any:
    """A history's new version of a key from a transaction's collapsed events (its packed
    column; NULL for another output's row)."""
    from pyspark.sql import functions as F

    r = F.col(_REDUCED)
    next_lsn = F.col("next_lsn")
    current = next_lsn.isNull()
    values = r.getField(packed_column(o.output))
    return F.when(
        F.col(OUTPUT_COLUMN) == F.lit(o.output),
        F.struct(
            *[values.getField(c).alias(c) for c in o.names],
            F.col(_LSN).alias(START_LSN),
            r.getField("at").alias(START_AT),
            next_lsn.alias(END_LSN),
            F.col("next_time").alias(END_AT),
            current.alias(IS_CURRENT),
            F.when(F.col(_FIRST) == "I", "I").otherwise("U").alias(START_OP),
            F.when(current, F.lit(None).cast("string")).otherwise(F.col("next_ends")).alias(END_OP),
            F.when(current, F.lit(WRITE)).otherwise(F.lit(WRITE_ONLY)).alias(OP),
            F.col(_HI).alias(HASH_HI),
            F.col(_LO).alias(HASH_LO),
        ),
    ).alias(packed_column(o.output))


def _history_close(o: SharedOutput) -> Any:
    """A history's request to end a key's version current before the batch, at the key's
    first transaction in it (its packed column; NULL for another output's row)."""
    from pyspark.sql import functions as F

    r = F.col(_REDUCED)
    values = r.getField(packed_column(o.output))
    return F.when(
        F.col(OUTPUT_COLUMN) == F.lit(o.output),
        F.struct(
            *[F.when(F.lit(False), values.getField(c)).alias(c) for c in o.names],
            F.lit(None).cast("long").alias(START_LSN),
            F.lit(None).cast("timestamp").alias(START_AT),
            F.col(_LSN).alias(END_LSN),
            r.getField("at").alias(END_AT),
            F.lit(False).alias(IS_CURRENT),
            F.lit(None).cast("string").alias(START_OP),
            F.col(_ENDS).alias(END_OP),
            F.lit(CLOSE).alias(OP),
            F.col(_HI).alias(HASH_HI),
            F.col(_LO).alias(HASH_LO),
        ),
    ).alias(packed_column(o.output))


def _header_columns() -> list[Any]:
    """The shared plan's columns every output's event carries (``shared_rows``)."""
    from pyspark.sql import functions as F

    h = F.col(_HEADER)
    return [
        h.getField("out").alias(OUTPUT_COLUMN),
        h.getField("hi").alias(_HI),
        h.getField("lo").alias(_LO),
        F.struct(F.col("_commit_lsn"), F.col("_position"), h.getField("sub")).alias(_SEQ),
        h.getField("op").alias(_EVOP),
        F.col("_commit_time").alias(_TIME),
    ]


def _packed_value(df: Any, o: SharedOutput) -> Any:
    """Output ``o``'s row of an event (NULL for another output's event), as its packed
    column."""
    from pyspark.sql import functions as F

    h = F.col(_HEADER)
    mine = h.getField("out") == F.lit(o.output)
    if o.kind == "changelog":
        value = F.when(mine, F.struct(*changelog_columns(df, o.column, o.names)))
        return value.alias(packed_column(o.output))
    image_type, _ = image_columns(df, o.column)
    new = lake_image(F.col(quote_column(o.column)).getField("new"), image_type)
    deleted = h.getField("op") == F.lit("D")
    values = [F.when(~deleted, new.getField(c)).alias(c) for c in o.names]
    if o.kind == "history":  # made versions per key in ``_history_parts``
        return F.when(mine, F.struct(*values)).alias(packed_column(o.output))
    return F.when(
        mine,
        F.struct(
            *values,
            F.col("_commit_lsn").alias(COMMIT_LSN),
            F.col("_commit_time").alias(COMMIT_TIME),
            F.when(deleted, F.lit("D")).otherwise(F.lit("U")).alias(OP),
            h.getField("hi").alias(HASH_HI),
            h.getField("lo").alias(HASH_LO),
        ),
    ).alias(packed_column(o.output))


def _event_header(o: SharedOutput, types: Mapping[str, Any]) -> Callable[[Any], Any]:
    """The function from a mirror's event to its header (``F.transform``'s lambda: Spark
    counts its parameters, so it takes the event only)."""
    from pyspark.sql import functions as F

    def header(e: Any) -> Any:
        hi, lo = key_hashes([(e.getField("key").getField(k), types[k]) for k in o.table.keys])
        return F.struct(
            F.lit(o.output).alias("out"),
            e.getField("sub").alias("sub"),
            e.getField("op").alias("op"),
            hi.alias("hi"),
            lo.alias("lo"),
        )

    return header


def _events(df: Any, mine: Sequence[SharedOutput]) -> tuple[Any, Any]:
    """One table's branch of the shared plan's event array: the condition that a source row is
    the table's, and the row's events for each of the table's outputs (``mine``)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    op = F.col("_op")
    parts = []
    for o in mine:
        if o.kind in ("mirror", "history"):
            image_type, _ = image_columns(df, o.column)
            key_types = {f.name: f.dataType for f in lake_type(image_type).fields}
            events = event_array(df, o.table, o.column)
            # a TRUNCATE is no event of the mirror (such batches take the MERGE)
            parts.append(
                F.filter(
                    F.transform(events, _event_header(o, key_types)),
                    lambda _: op != F.lit("T"),
                )
            )
        else:
            parts.append(
                F.array(
                    F.struct(
                        F.lit(o.output).alias("out"),
                        F.lit(0).alias("sub"),
                        op.alias("op"),
                        F.lit(None).cast(T.LongType()).alias("hi"),
                        F.lit(None).cast(T.LongType()).alias("lo"),
                    )
                )
            )
    array = parts[0] if len(parts) == 1 else F.concat(*parts)
    return F.col("_table_id") == F.lit(mine[0].table.table_id), array


def history_indexed_rows(batch: TableBatch) -> Any:
    """A history's rows of the batch for the indexed write: its new versions (``WRITE`` the
    current one of a key, ``WRITE_ONLY`` the ones the batch also ended) and per key a request
    to end its version current before the batch (``CLOSE``, with how it ends), with the key's
    hash; unchanged TOAST values filled from the mirror as stored before the batch."""
    from pyspark.sql import functions as F

    table = batch.table
    keys = table.row_keys
    rows = history_rows(batch.resolved, table, batch.columns, batch.overview)
    if any(c.startswith(KEEP_PREFIX) for c in rows.columns):
        rows = fill_from_stored(rows, batch.stored, keys, batch.columns, foreign_only=False)
    rows = rows.drop(*[c for c in rows.columns if c.startswith((KEEP_PREFIX, ROOT_PREFIX))])
    hi, lo = key_hashes([(F.col(quote_column(k)), rows.schema[k].dataType) for k in keys])
    op = (
        F.when(F.col(ACTION) == F.lit("close"), F.lit(CLOSE))
        .when(F.col(IS_CURRENT), F.lit(WRITE))
        .otherwise(F.lit(WRITE_ONLY))
    )
    names = [*batch.columns, START_LSN, START_AT, END_LSN, END_AT, IS_CURRENT, START_OP, END_OP]
    return rows.select(*[F.col(quote_column(c)) for c in names], op.alias(OP), hi, lo)


@dataclass(frozen=True, slots=True)
class _Closing:
    """A history's stored current versions the batch ends: where they are, and how they end."""

    output: int
    table: TableLog
    target: SnapshotOutput
    requests: pa.Table  # path (the file's in the table), row, end_lsn, end_at, end_op


#: a closing request as the closed copies' Spark job carries it (``_closed_copies``)
_CLOSING_SPARK = "out int, path string, row long, end_lsn long, end_at timestamp, end_op string"


@dataclass(frozen=True, slots=True)
class ClosedCopier:
    """A Spark task's copier (``mapInArrow``) of histories' ended versions: from the closing
    requests of the task (``_CLOSING_SPARK``: output, file, row index, how the version ends)
    it reads each named file's row groups holding the rows (only those, under the physical
    names: the rows are copied as stored), sets their end and writes each output's rows as
    one Parquet file (``SharedWriter``'s files), reported as ``WRITTEN``."""

    writer: SharedWriter  # its outputs: each history as stored (physical names both ways)
    ended: Mapping[int, Mapping[str, str]]  # per output: the request's column by physical name
    current: Mapping[int, str]  # per output: the physical name of its IS_CURRENT (made false)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        received = list(batches)
        if not received:
            return
        asked = pa.Table.from_batches(received)
        fs = self.writer.location.arrow_filesystem()
        files: dict[int, _OutputFile] = {}
        try:
            for number in sorted(pc.unique(asked.column("out")).to_pylist()):
                mine = asked.filter(pc.equal(asked.column("out"), number))
                output = self.writer.outputs[number]
                files[number] = out = _OutputFile(number, output, self.writer)
                for path in sorted(pc.unique(mine.column("path")).to_pylist()):
                    rows = mine.filter(pc.equal(mine.column("path"), path))
                    uri = f"{output.target.directory.rstrip('/')}/{path}"
                    stored = _stored_rows(fs, self.writer.location.arrow_path(uri), rows)
                    values = {name: rows.column(c) for name, c in self.ended[number].items()}
                    values[self.current[number]] = pa.array([False] * rows.num_rows, pa.bool_())
                    for name, value in values.items():
                        at = stored.schema.get_field_index(name)
                        stored = (
                            stored.set_column(at, name, value)
                            if at >= 0
                            else stored.append_column(name, value)
                        )
                    for part in stored.to_batches():
                        out.write(part)
            reports = [f.close() for f in files.values()]
        except BaseException:
            for f in files.values():
                f.abort()
            raise
        reports = [r for r in reports if r["path"] is not None]
        if reports:
            yield pa.RecordBatch.from_pylist(reports, schema=WRITTEN)


def _stored_rows(fs: Any, path: str, requests: pa.Table) -> pa.Table:
    """The rows of one stored data file the requests name by row index (the row's position in
    the file, as Delta's deletion vectors and ``_metadata.row_index`` count), in their order:
    only the row groups holding them are read."""
    import pyarrow.parquet as pq

    rows = requests.column("row").to_numpy().astype(np.int64)
    with fs.open_input_file(path) as f:
        parquet = pq.ParquetFile(f)
        counts = np.array(
            [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)],
            dtype=np.int64,
        )
        starts = np.concatenate([[0], np.cumsum(counts)])
        if rows.size and (rows.min() < 0 or rows.max() >= starts[-1]):
            raise ValueError(f"{path}: a closed version's row index is past the file's rows")
        group = np.searchsorted(starts, rows, side="right") - 1
        groups = np.unique(group)
        read = parquet.read_row_groups(groups.tolist())
    # each chosen group's first row in what was read (the groups concatenated in order)
    first = np.concatenate([[0], np.cumsum(counts[groups])])[:-1]
    local = rows - starts[group] + first[np.searchsorted(groups, group)]
    return read.take(pa.array(local, pa.int64()))


def _closed_copies(
    spark: Any, closings: Sequence[_Closing], location: LakeLocation, tag: str
) -> dict[int, list[DataFile]]:
    """Each closing's versions written anew as ended (their stored values, the end set, no
    longer current), by one Spark job for all histories: the requests spread over the tasks
    by output, each task copying its outputs' rows from the files holding them
    (``ClosedCopier``). The files written, by output.

    The stored rows are read by the tasks with Arrow, not by a Spark scan per history: a
    scan's plan differs with each table's physical schema, and a hundred of them in one job
    were a hundred code generations (about half a second each)."""
    from pyspark.sql import functions as F

    if not closings:
        return {}
    requests = []
    outputs = {}
    ended = {}
    current = {}
    for number, closing in enumerate(closings):
        target = closing.target
        asked = closing.requests
        requests.append(asked.add_column(0, "out", pa.array([number] * asked.num_rows, pa.int32())))
        names = dict(zip(target.schema.names, target.physical.names, strict=True))
        ended[number] = {
            names[END_LSN]: "end_lsn",
            names[END_AT]: "end_at",
            names[END_OP]: "end_op",
        }
        current[number] = names[IS_CURRENT]
        # written as read: under the physical names already
        physical = SnapshotOutput(
            target.table_id,
            target.column,
            target.kind,
            target.directory,
            target.physical,
            target.physical,
            target.stats,
        )
        outputs[number] = Output(physical, keyed=False)
    asked_all = spark.createDataFrame(pa.concat_tables(requests).to_pandas(), _CLOSING_SPARK)
    tasks = max(1, min(len(closings), int(spark.sparkContext.defaultParallelism)))
    copier = ClosedCopier(SharedWriter(outputs, location, tag), ended, current)
    reports: dict[int, list[Mapping[str, Any]]] = {}
    rows = _collect_without_adaptive(
        spark, asked_all.repartition(tasks, F.col("out")).mapInArrow(copier, _WRITTEN_SPARK)
    ).to_pylist()
    for row in rows:
        reports.setdefault(int(row["output"]), []).append(row)
    return {
        closing.output: [f for f, *_ in Written.collect(reports.get(n, [])).files]
        for n, closing in enumerate(closings)
    }


def _closing(
    output: int, table: TableLog, target: SnapshotOutput, index: KeyIndex, closes: pa.Table
) -> _Closing | None:
    """The closing of a history's stored current versions the batch's close requests name
    (None when none of them has one: a key new to the history)."""
    file_ids, rows = index.lookup(closes.column("hi").to_numpy(), closes.column("lo").to_numpy())
    stored = file_ids >= 0
    if not stored.any():
        return None
    requests = pa.table(
        {
            "path": pa.array(
                [unquote(index.file(int(f)).path) for f in file_ids[stored]], pa.string()
            ),
            "row": pa.array(rows[stored], pa.int64()),
            "end_lsn": closes.column("end_lsn").filter(pa.array(stored)),
            "end_at": closes.column("end_at").filter(pa.array(stored)),
            "end_op": closes.column("end_op").filter(pa.array(stored)),
        }
    )
    return _Closing(output, table, target, requests)


def direct_write(
    spark: Any,
    items: Sequence[tuple[TableBatch, TableKind, str]],
    *,
    layout: LakeLayout,
    fence: Callable[[], None] | None,
    on_commit: Callable[[], None],
    parallel: int,
    reached: Reached | None = None,
) -> dict[str, Any]:
    """Write each item (a table's batch, the kind of its Delta table, its path) by the indexed
    write; the newest source commit time each mirror got, by table id. ``reached``: told each
    kill point of the tests (``pgcdc.lake.write.batch.KILL_POINTS``)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    clock = time.monotonic()
    plans = []
    outputs: dict[int, Output] = {}
    packed: list[Any] = []
    wanted: list[tuple[int, IndexWanted]] = []
    shared: list[SharedOutput] = []
    numbers = [output_number(batch.table.table_id, kind) for batch, kind, _ in items]
    for i, (batch, kind, path) in enumerate(items):
        table = batch.table
        number = numbers[i]
        log_ = TableLog(spark, path)
        snapshot = log_.snapshot()
        # the schema as the table's latest snapshot has it (None: no table yet, evolve creates it)
        stored = log_.schema(snapshot) if snapshot.version() >= 0 else None
        current = T.StructType.fromJson(stored) if stored is not None else None
        # the shared plan serves every changelog and the mirrors and histories without
        # unchanged TOAST values in the batch; one with some has a plan of its own (they are
        # resolved per key, and filled from the mirror as stored)
        own = kind != "changelog" and bool(batch.overview.unchanged_columns)
        rows = None
        if own:
            rows = indexed_rows(batch) if kind == "mirror" else history_indexed_rows(batch)
        if kind == "history":
            changed = evolve(
                spark,
                path,
                history_schema(rows, batch.columns)
                if rows is not None
                else wanted_schema(batch.changes, batch.column, kind),
                drop_missing=False,
                what=f"{table.table_id} history",
                stats_columns=table.stats_columns("history"),
                defaults=batch.defaults,
                current=current,
            )
        elif kind == "mirror":
            changed = evolve(
                spark,
                path,
                mirror_schema(rows, batch.columns)
                if rows is not None
                else wanted_schema(batch.changes, batch.column, kind),
                drop_missing=True,
                what=f"{table.table_id} mirror",
                stats_columns=table.stats_columns("mirror"),
                defaults=batch.defaults,
                current=current,
            )
        else:
            changed = evolve(
                spark,
                path,
                wanted_schema(batch.changes, batch.column, kind),
                drop_missing=False,
                what=f"{table.table_id} changelog",
                stats_columns=table.stats_columns("changelog"),
                defaults=batch.defaults,
                images=IMAGES,
                current=current,
            )
        if changed:
            snapshot = log_.snapshot()
            stored = None
        target = _target(log_, snapshot, batch, kind, stored)
        folder = index_folder(layout, table, kind)
        if kind != "changelog":
            keys = tuple(table.row_keys)
            wanted.append((i, IndexWanted(log_, snapshot, keys, folder, kind == "history")))
        if rows is not None:
            packed.append(
                rows.select(
                    F.lit(number).alias(OUTPUT_COLUMN),
                    F.struct(*[F.col(quote_column(c)) for c in rows.columns]).alias(
                        packed_column(number)
                    ),
                )
            )
        else:
            shared.append(SharedOutput(number, table, kind, batch.column, tuple(batch.names)))
        outputs[number] = Output(target, keyed=kind != "changelog")
        plans.append((batch, kind, log_, snapshot, folder, target))
    # the shared plan in parts of at most SHARED_OUTPUTS outputs, a Spark job each: a plan's
    # size (and the driver's memory analysing it) grows faster than its outputs
    jobs = [
        [shared_rows(items[0][0].changes, shared[at : at + SHARED_OUTPUTS])]
        for at in range(0, len(shared), SHARED_OUTPUTS)
    ] or [[]]
    jobs[0].extend(packed)
    planned = time.monotonic()
    found = mirror_indexes(spark, [w for _, w in wanted], reached)
    indexed_at = time.monotonic()
    indexes = dict(zip([i for i, _ in wanted], found, strict=True))
    # each job's writer stage: as many tasks as the session's parallelism, whatever the
    # number of tables, each output's rows in one of them (a file per table and batch, not
    # one per task: fewer files for the next commits to mark), but for a table with many
    # changes in the batch, whose rows are spread over all tasks
    tasks = max(1, int(spark.sparkContext.defaultParallelism))
    spread = [
        numbers[i] for i, (batch, _, _) in enumerate(items) if batch.overview.changes >= SPREAD
    ]
    writer = SharedWriter(outputs, layout.location, f"b{items[0][0].batch_id}")
    reports: dict[int, list[Mapping[str, Any]]] = {}
    for parts in jobs:
        union = parts[0]
        for more in parts[1:]:
            union = union.unionByName(more, allowMissingColumns=True)
        bucket: Any = F.lit(0)
        mine = [n for n in spread if packed_column(n) in union.columns]
        if mine and tasks > 1:
            out = F.col(OUTPUT_COLUMN)
            hashes = [F.when(out == F.lit(n), F.hash(F.col(packed_column(n)))) for n in mine]
            bucket = F.coalesce(F.pmod(F.coalesce(*hashes), F.lit(tasks)), F.lit(0))
        written = union.repartition(tasks, F.col(OUTPUT_COLUMN), bucket).mapInArrow(
            writer, _WRITTEN_SPARK
        )
        for row in _collect_without_adaptive(spark, written).to_pylist():
            reports.setdefault(int(row["output"]), []).append(row)
    collected = {i: Written.collect(reports.get(n, [])) for i, n in enumerate(numbers)}
    batch_id = items[0][0].batch_id
    if reached is not None:
        reached("data-files", f"{len(plans)} Delta tables")
    closings = []
    for i, (_, kind, log_, _, _, target) in enumerate(plans):
        closes = collected[i].closes
        if kind == "history" and closes.num_rows:
            closing = _closing(i, log_, target, indexes[i], closes)
            if closing is not None:
                closings.append(closing)
    extra = _closed_copies(spark, closings, layout.location, f"b{batch_id}c")
    if extra and reached is not None:
        reached("closed-copies", f"{len(extra)} histories")
    wrote = time.monotonic()
    committed = threading.Event()  # a commit of the batch is in

    def commit(session: Any, i: int) -> Any:
        batch, kind, log_, snapshot, folder, _ = plans[i]
        written = collected[i]
        index = indexes.get(i)
        closes = written.closes
        replaced = None
        if kind == "history":  # a history's stored rows replaced: the versions it closes
            replaced = (closes.column("hi").to_numpy(), closes.column("lo").to_numpy())
        what = f"batch {batch.batch_id} {batch.table.table_id} {kind}"
        if reached is not None and committed.is_set():
            reached("between-commits", f"{batch.table.table_id} {kind}")
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            if fence is not None:
                fence()
            try:
                if index is not None:
                    commit_indexed(
                        log_,
                        snapshot,
                        index,
                        written,
                        folder=folder,
                        session=session,
                        app_id=batch.app_id,
                        version=batch.batch_id,
                        metadata=batch.metadata,
                        replaced=replaced,
                        extra=extra.get(i, ()),
                        reached=reached,
                    )
                else:
                    commit_appended(
                        log_,
                        snapshot,
                        written,
                        session=session,
                        app_id=batch.app_id,
                        version=batch.batch_id,
                        metadata=batch.metadata,
                    )
                break
            except conflicts() as exc:
                if attempt == CONFLICT_ATTEMPTS:
                    raise
                # a compaction or purge committed first: the written files stay good; the
                # rows they replace are found again in the index at the table's new version
                log.info("%s: a concurrent commit (%s); committing again", what, type(exc).__name__)
                snapshot = log_.snapshot()
                if index is not None:
                    keys = tuple(batch.table.row_keys)
                    history = kind == "history"
                    wanted_now = IndexWanted(log_, snapshot, keys, folder, history)
                    index = mirror_indexes(session, [wanted_now])[0]
        committed.set()
        on_commit()
        return batch.overview.max_commit_time if kind == "mirror" else None

    newest: dict[str, Any] = {}
    results = in_sessions(spark, commit, list(range(len(plans))), parallel)
    log.debug(
        "direct write of %s Delta tables: planned in %.2f s, indexes %.2f s, files %.2f s, "
        "commits %.2f s",
        len(plans),
        planned - clock,
        indexed_at - planned,
        wrote - indexed_at,
        time.monotonic() - wrote,
    )
    for (batch, kind, *_), moment in zip(plans, results, strict=True):
        if kind == "mirror":
            newest[batch.table.table_id] = moment
    return newest
