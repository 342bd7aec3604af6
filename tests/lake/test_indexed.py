"""The indexed write against Delta's MERGE: the same random change streams through both, the
mirrors compared row for row after every batch, read by Spark's Delta reader and by delta-rs.

Streams (seeded) hold inserts, updates with unchanged TOAST values, key changes, deletes and
re-inserts of one key in one transaction, and TRUNCATEs (which the MERGE serves, after which
the index is rebuilt). Between batches the indexed lake is compacted and purged (Delta's
``OPTIMIZE`` and ``REORG ... APPLY (PURGE)`` move rows: the index is rebuilt from the table) and
the process's indexes are dropped (the next batch loads them from the lake's base and
segments). Key types: int, bigint, text, uuid, numeric and a composite key.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.store.delta import USER_METADATA, user_metadata
from pgcdc.lake.store.tables import LakeLayout, LakeTable
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lake.write import indexed as indexed_module
from pgcdc.lake.write.batch import LakeBatchWriter
from pgcdc.lake.write.keyindex import forget_indexes, index_folder
from pgcdc.lake.write.maintenance import COMPACT_METADATA
from pgcdc.spark import table_column

T0 = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class KeyType:
    name: str
    spark: str  # the key column's Spark type (DDL)
    keys: tuple[str, ...]

    def value(self, n: int) -> tuple[Any, ...]:
        if self.name == "int":
            return (n,)
        if self.name == "bigint":
            return (n * 1_000_000_007,)
        if self.name == "text":
            return (f"key-{n:05d}-é",)
        if self.name == "uuid":
            return (str(uuid.UUID(int=n * 7919 + 1)),)
        if self.name == "numeric":
            return (Decimal(n) / Decimal(100),)
        return (n % 7, f"p{n}")  # composite


KEY_TYPES = [
    KeyType("int", "int", ("id",)),
    KeyType("bigint", "bigint", ("id",)),
    KeyType("text", "string", ("id",)),
    KeyType("uuid", "string", ("id",)),
    KeyType("numeric", "decimal(12,2)", ("id",)),
    KeyType("composite", "int", ("id", "k2")),
]


def table_struct(key: KeyType) -> Any:
    from pyspark.sql import types as T

    fields = [T.StructField("id", T._parse_datatype_string(key.spark))]
    if len(key.keys) == 2:
        fields.append(T.StructField("k2", T.StringType()))
    fields += [T.StructField("v", T.LongType()), T.StructField("big", T.StringType())]
    image = T.StructType(fields)
    return T.StructType(
        [
            T.StructField("new", image),
            T.StructField("old", image),
            T.StructField("old_kind", T.StringType()),
            T.StructField("unchanged", T.ArrayType(T.StringType())),
        ]
    )


def lake_table(key: KeyType, *, history: bool = False) -> LakeTable:
    return LakeTable("public", f"t_{key.name}", key.keys, "d", history=history)


def source_schema(keys: list[KeyType]) -> Any:
    """The source's DataFrame schema with one table per key type (``public.t_<name>``)."""
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("_table_id", T.StringType(), False),
            T.StructField("_schema", T.StringType(), False),
            T.StructField("_table", T.StringType(), False),
            T.StructField("_op", T.StringType(), False),
            T.StructField("_commit_lsn", T.LongType(), False),
            T.StructField("_commit_lsn_text", T.StringType(), False),
            T.StructField("_end_lsn", T.LongType(), False),
            T.StructField("_position", T.IntegerType(), False),
            T.StructField("_xid", T.LongType()),
            T.StructField("_commit_time", T.TimestampType()),
            *[T.StructField(table_column("public", f"t_{k.name}"), table_struct(k)) for k in keys],
        ]
    )


class Stream:
    """A seeded random change stream over one table, with a model of its rows."""

    def __init__(
        self, key: KeyType, seed: int, slot: int = 0, width: int = 1, *, toast: bool = True
    ) -> None:
        self.key = key
        self.toast = toast  # updates leave ``big`` out (unchanged TOAST) at times
        self.slot = slot  # which of the batch's ``width`` table columns is this table's
        self.width = width
        self.random = random.Random(seed)
        self.rows: dict[int, tuple[int, str]] = {}  # key number -> (v, big)
        self.next_key = 1
        self.lsn = 100

    def _image(self, n: int, v: int | None, big: str | None) -> tuple[Any, ...]:
        return (*self.key.value(n), v, big)

    def _row(
        self, op: str, pos: int, new: tuple[Any, ...] | None, old: tuple[Any, ...] | None = None
    ) -> tuple[Any, ...]:
        unchanged = ["big"] if new is not None and new[-1] is None and op == "U" else []
        struct = None if op == "T" else (new, old, None if old is None else "K", unchanged)
        tables: list[Any] = [None] * self.width
        tables[self.slot] = struct
        lsn = self.lsn
        name = f"t_{self.key.name}"
        return (
            f"public.{name}",
            "public",
            name,
            op,
            lsn,
            f"0/{lsn:X}",
            lsn + 8,
            pos,
            lsn // 10,
            T0 + timedelta(seconds=lsn),
            *tables,
        )

    def batch(self, transactions: int, truncate: bool = False) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        r = self.random
        for t in range(transactions):
            self.lsn += 10
            pos = 0
            if truncate and t == transactions // 2:
                out.append(self._row("T", pos, None))
                self.rows.clear()
                continue
            for _ in range(r.randint(1, 6)):
                choice = r.random()
                live = sorted(self.rows)
                if choice < 0.3 or not live:  # insert
                    n = self.next_key
                    self.next_key += 1
                    big = f"BIG{n}-" + "x" * r.randint(0, 40)
                    v = r.randint(0, 10**9)
                    out.append(self._row("I", pos, self._image(n, v, big)))
                    self.rows[n] = (v, big)
                elif choice < 0.6:  # update, big unchanged half the time
                    n = r.choice(live)
                    v = r.randint(0, 10**9)
                    keep = r.random() < 0.5
                    big = self.rows[n][1] if keep else f"NEW{n}-{self.lsn}"
                    image = self._image(n, v, None if keep and self.toast else big)
                    out.append(self._row("U", pos, image))
                    self.rows[n] = (v, big)
                elif choice < 0.75:  # key change, big unchanged
                    n = r.choice(live)
                    m = self.next_key
                    self.next_key += 1
                    v = r.randint(0, 10**9)
                    big = self.rows.pop(n)[1]
                    old = self._image(n, None, None)
                    new = self._image(m, v, None if self.toast else big)
                    out.append(self._row("U", pos, new, old))
                    self.rows[m] = (v, big)
                elif choice < 0.9:  # delete
                    n = r.choice(live)
                    del self.rows[n]
                    out.append(self._row("D", pos, None, self._image(n, None, None)))
                else:  # delete and insert the key again in one transaction
                    n = r.choice(live)
                    out.append(self._row("D", pos, None, self._image(n, None, None)))
                    pos += 1
                    v = r.randint(0, 10**9)
                    big = f"AGAIN{n}-{self.lsn}"
                    out.append(self._row("I", pos, self._image(n, v, big)))
                    self.rows[n] = (v, big)
                pos += 1
        return out

    def expected(self) -> set[tuple[Any, ...]]:
        return {(*self.key.value(n), v, big) for n, (v, big) in self.rows.items()}


def lake_rows(lake: Path, table: LakeTable, spark: Any | None = None) -> set[tuple[Any, ...]]:
    """The mirror's rows as delta-rs reads them (with ``spark``, checked equal to Spark's Delta
    reader's)."""
    names = [*table.keys, "v", "big"]
    path = table.path(LakeLayout(lake), "mirror")
    by_delta_rs = DeltaTarget(path).read(names).to_pylist()
    rows = {tuple(r[n] for n in names) for r in by_delta_rs}
    assert len(rows) == len(by_delta_rs), "a key twice in the mirror"
    if spark is not None:
        by_spark = spark.read.format("delta").load(str(path)).select(*names).collect()
        assert {tuple(r) for r in by_spark} == rows
    return rows


def history_rows(lake: Path, table: LakeTable) -> list[tuple[Any, ...]]:
    """The history's rows (delta-rs), sorted; one current version per key at most."""
    target = DeltaTarget(table.path(LakeLayout(lake), "history"))
    rows = target.read().to_pylist()
    current = [tuple(r[k] for k in table.keys) for r in rows if r["__is_current"]]
    assert len(current) == len(set(current)), "two current versions of a key"
    names = sorted(rows[0]) if rows else []
    return sorted(tuple(str(r[n]) for n in names) for r in rows)


def make_writer(lake: Path, tables: list[LakeTable], *, indexed: bool) -> LakeBatchWriter:
    return LakeBatchWriter(
        lake=str(lake),
        tables=tuple(tables),
        table_columns=tuple((t.table_id, table_column(t.schema, t.name)) for t in tables),
        app_id="test-app",
        indexed=indexed,
    )


@dataclass
class TwoLakes:
    """An indexed lake and a merged one, written the same batches of the same streams."""

    indexed: Path
    merged: Path
    tables: list[LakeTable]
    streams: list[Stream]
    schema: Any

    def write(self, spark: Any, batch_id: int, transactions: int, truncating: set[int]) -> None:
        """One batch of every stream (``transactions`` each; a TRUNCATE first in the streams
        ``truncating`` names) written to both lakes."""
        rows = [
            r for i, st in enumerate(self.streams) for r in st.batch(transactions, i in truncating)
        ]
        df = spark.createDataFrame(rows, self.schema)
        make_writer(self.indexed, self.tables, indexed=True)(df, batch_id)
        make_writer(self.merged, self.tables, indexed=False)(df, batch_id)


def maintain(spark: Any, lake: Path, table: LakeTable, step: str) -> None:
    """A compaction as pgcdc's maintenance makes it (its metadata tells the index to follow
    it), or a purge made by another tool (the index is rebuilt)."""
    path = str(table.path(LakeLayout(lake), "mirror"))
    if step == "compact":
        spark.conf.set(USER_METADATA, user_metadata(COMPACT_METADATA))
        try:
            spark.sql(f"OPTIMIZE delta.`{path}`").collect()
        finally:
            spark.conf.unset(USER_METADATA)
    elif step == "purge":
        spark.sql(f"REORG TABLE delta.`{path}` APPLY (PURGE)").collect()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_indexed_mirrors_equal_merged_mirrors(spark: Any, tmp_path: Path) -> None:
    """Every key type, one table each, in the same batches: the shared plan's many tables;
    every other table with a history, compared too."""
    tables = [lake_table(k, history=i % 2 == 1) for i, k in enumerate(KEY_TYPES)]
    streams = [Stream(k, seed=i + 1, slot=i, width=len(KEY_TYPES)) for i, k in enumerate(KEY_TYPES)]
    indexed, merged = tmp_path / "indexed", tmp_path / "merged"
    lakes = TwoLakes(indexed, merged, tables, streams, source_schema(KEY_TYPES))
    plan: list[tuple[int, set[int], str | None]] = [
        (10, set(), "compact"),
        (6, {0, 3}, "forget"),  # TRUNCATEs: the MERGE for those tables, then the index rebuilt
        (8, set(), "purge"),
        (6, set(), None),
    ]
    for batch_id, (transactions, truncating, between) in enumerate(plan):
        lakes.write(spark, batch_id, transactions, truncating)
        last = batch_id == len(plan) - 1
        for table, stream in zip(tables, streams, strict=True):
            expected = stream.expected()
            what = f"batch {batch_id} {table.table_id}"
            assert lake_rows(indexed, table, spark if last else None) == expected, what
            assert lake_rows(merged, table, spark if last else None) == expected, what
            if table.history:
                assert history_rows(indexed, table) == history_rows(merged, table), what
        if between == "forget":
            forget_indexes()
        elif between is not None:
            for table in tables[::2]:
                maintain(spark, indexed, table, between)
    for table in tables:  # each indexed mirror kept its index in the lake
        folder = index_folder(LakeLayout(indexed), table, "mirror")
        assert any(n.startswith("base-") for n in folder.names()), table.table_id


@pytest.mark.slow
def test_indexed_histories_without_toast_equal_merged_histories(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches without unchanged TOAST values: every history's versions come from the shared
    plan (one shuffle for all tables), not a plan of its own; a TRUNCATE batch between (the
    MERGE) and a lost index (rebuilt) on the way."""
    keys = [KEY_TYPES[0], KEY_TYPES[2], KEY_TYPES[5]]  # int, text, composite
    tables = [lake_table(k, history=True) for k in keys]
    streams = [
        Stream(k, seed=i + 11, slot=i, width=len(keys), toast=False) for i, k in enumerate(keys)
    ]
    indexed, merged = tmp_path / "indexed", tmp_path / "merged"
    lakes = TwoLakes(indexed, merged, tables, streams, source_schema(keys))
    plan: list[tuple[int, set[int], bool]] = [(10, set(), False), (8, {1}, True), (8, set(), False)]
    shared: list[int] = []
    parts = indexed_module._history_parts

    def counted(df: Any, keyed: Any, histories: Any, schema: str) -> Any:
        shared.append(len(histories))
        return parts(df, keyed, histories, schema)

    monkeypatch.setattr(indexed_module, "_history_parts", counted)
    for batch_id, (transactions, truncating, forget) in enumerate(plan):
        lakes.write(spark, batch_id, transactions, truncating)
        for table, stream in zip(tables, streams, strict=True):
            what = f"batch {batch_id} {table.table_id}"
            assert lake_rows(indexed, table) == stream.expected(), what
            assert history_rows(indexed, table) == history_rows(merged, table), what
        if forget:
            forget_indexes()
    assert shared == [3, 2, 3], shared  # the truncated table's history took the MERGE


def test_a_replayed_batch_is_skipped_and_a_new_process_reads_the_index(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = KEY_TYPES[0]
    table = lake_table(key)
    stream = Stream(key, seed=7)
    schema = source_schema([key])
    lake = tmp_path / "lake"
    first = spark.createDataFrame(stream.batch(10), schema)
    make_writer(lake, [table], indexed=True)(first, 0)
    second = spark.createDataFrame(stream.batch(10), schema)
    make_writer(lake, [table], indexed=True)(second, 1)
    target = DeltaTarget(table.path(LakeLayout(lake), "mirror"))
    version = target.version()
    make_writer(lake, [table], indexed=True)(second, 1)  # replayed: already in the table
    assert target.version() == version
    forget_indexes()  # as a new process: the index comes from the lake's base and segments
    third = spark.createDataFrame(stream.batch(10), schema)
    make_writer(lake, [table], indexed=True)(third, 2)
    assert lake_rows(lake, table, spark) == stream.expected()
    commits = target.commits(3)
    assert all(meta is not None and "index" in meta for _, _, meta in commits[:2])
    # a segment is not flushed when written: one a machine's crash left empty is found, and
    # the index rebuilt from the table
    folder = index_folder(LakeLayout(lake), table, "mirror").local()
    token = commits[0][2]["index"]  # type: ignore[index]
    (folder / f"seg-{token}.arrow").write_bytes(b"")
    forget_indexes()
    fourth = spark.createDataFrame(stream.batch(10), schema)
    with caplog.at_level("WARNING", logger="pgcdc.lake"):
        make_writer(lake, [table], indexed=True)(fourth, 3)
    assert f"segment {token} unreadable" in caplog.text
    assert lake_rows(lake, table, spark) == stream.expected()


def test_a_new_base_replaces_the_old_one_and_its_segments(tmp_path: Path) -> None:
    """Once the segments since the base weigh an eighth of it (or 65,536 entries), the index
    writes a new base and removes the old base and those segments."""
    import numpy as np

    from pgcdc.lake.store.deltalog import DataFile
    from pgcdc.lake.store.storage import LakePath
    from pgcdc.lake.write.keyindex import Entries, IndexChanges, KeyIndex, save_segment

    folder = LakePath.parse(str(tmp_path / "index"))
    files = [DataFile("a.parquet", 10, 100_000)]
    n = 100_000
    keys = np.arange(n, dtype=np.uint64)
    index = KeyIndex.from_entries(
        1, files, Entries(keys, keys, np.zeros(n, np.int32), np.arange(n, dtype=np.int64))
    )
    index.save_base(folder)
    version = 1
    while not index.base_due():
        version += 1
        new = DataFile(f"f{version}.parquet", 10, 10_000)
        at = np.arange(10_000, dtype=np.uint64) + np.uint64(version * 1_000_000)
        changes = IndexChanges(
            at,
            at,
            np.full(at.size, index.next_file_id(), np.int32),
            np.arange(at.size),
            added=(new,),
            updated=(),
            removed=(),
        )
        token = save_segment(folder, changes)
        index.add_files(changes.added)
        index.apply(changes, version)
        index.segment_saved(token, at.size)
    assert version == 8  # 70,000 entries: past 65,536
    assert len([n for n in folder.names() if n.startswith("seg-")]) == 2 * 7
    index.save_base(folder)
    assert sorted(folder.names()) == [f"base-{version}.arrow", f"base-{version}.json"]
    assert len(index) == n + 70_000
    assert not index.base_due()


def test_closed_versions_are_read_by_row_index_from_their_row_groups(tmp_path: Path) -> None:
    """A closed version is read from its file by row index (its position in the file, across
    row groups), only the row groups holding the asked rows, in the order asked; an index past
    the file's rows is an error, never another row."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": list(range(50))}), path, row_group_size=7)
    assert pq.ParquetFile(path).num_row_groups == 8
    asked = [48, 3, 7, 20, 21, 6, 49, 0]
    requests = pa.table({"row": pa.array(asked, pa.int64())})
    rows = indexed_module._stored_rows(fs.LocalFileSystem(), str(path), requests)
    assert rows.column("id").to_pylist() == asked
    with pytest.raises(ValueError, match="past the file's rows"):
        indexed_module._stored_rows(
            fs.LocalFileSystem(), str(path), pa.table({"row": pa.array([50], pa.int64())})
        )
