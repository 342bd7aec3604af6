"""The initial copy: every published table into its Delta tables, in parallel, consistently.

The slot is created with an exported snapshot; the Spark source's snapshot reader
(``pgcdc.spark.snapshot_reader``) splits each table into ctid ranges, all read in that snapshot
with the publication's row filters. One Spark task per range reads its rows (``reader.copy``
hands it Arrow record batches as they are decoded) and, in the same Python process, writes them
as Parquet files straight into the folders of the table's Delta tables: the mirror, and the
history (every row a current version, ``__start_op`` 'S', starting at the consistent point) and
the changelog (rows with ``__op`` 'S') when the table has them. Only the columns whose first rows
hold few distinct values are dictionary-encoded (``dictionary_columns``). The rows never pass
through the JVM, and PostgreSQL is read once however many Delta tables are written.

``snapshot_rows`` gives those tables' rows as Spark expressions: it is what ``arrow_rows``
computes, in the schema ``snapshot_schema`` gives (Spark's types for those expressions, as the
stream's writes see the tables). When every task
succeeded, each Delta table gets its files in one commit tagged ``Transaction(snapshot app id,
generation)`` (``files.commit_files``); files of failed attempts are removed. A snapshot that
did not finish is redone from scratch with a new slot (the next generation): the tables of the
unfinished one are removed first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgcdc.lake.changelog import changelog_rows
from pgcdc.lake.changes import image_columns, lake_image, needs_cast, quote_column
from pgcdc.lake.files import CommittedFile, commit_files
from pgcdc.lake.tables import (
    CL_COMMIT_LSN,
    CL_COMMIT_LSN_TEXT,
    CL_COMMIT_TIME,
    CL_END_LSN,
    COMMIT_LSN,
    COMMIT_TIME,
    END_AT,
    END_LSN,
    END_OP,
    IS_CURRENT,
    OLD,
    OLD_KIND,
    OP,
    POSITION,
    START_AT,
    START_LSN,
    START_OP,
    UNCHANGED,
    XID,
    LakeLayout,
    LakeTable,
    TableKind,
)
from pgcdc.lake.writer import DeltaTarget, cast_to, nullable_schema
from pgcdc.lsn import Lsn

__all__ = [
    "DICTIONARY_SAMPLE",
    "DICTIONARY_SHARE",
    "SnapshotOutput",
    "SnapshotResult",
    "SnapshotTask",
    "arrow_rows",
    "dictionary_columns",
    "remove_tables",
    "snapshot_outputs",
    "snapshot_rows",
    "snapshot_schema",
    "write_snapshot",
]

log = logging.getLogger("pgcdc.lake")


class SnapshotResult:
    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.seconds = 0.0


def snapshot_rows(
    df: Any,
    table: LakeTable,
    column: str,
    kind: TableKind,
    *,
    consistent_point: Lsn,
    started_at: datetime,
) -> Any:
    """The rows of one Delta table of ``table`` for a snapshot DataFrame (Spark)."""
    from pyspark.sql import functions as F

    image_type, names = image_columns(df, column)
    if kind == "changelog":
        rows = changelog_rows(df, table, column, names)
        return rows.withColumn(OP, F.lit("S")).withColumn(
            CL_COMMIT_TIME, F.coalesce(F.col(CL_COMMIT_TIME), F.lit(started_at))
        )
    new = lake_image(F.col(quote_column(column)).getField("new"), image_type)
    values = [new.getField(n).alias(n) for n in names]
    rows = df.where((F.col("_table_id") == table.table_id) & (F.col("_op") != "T"))
    if kind == "mirror":
        return rows.select(
            *values,
            F.lit(int(consistent_point)).cast("long").alias(COMMIT_LSN),
            F.lit(started_at).cast("timestamp").alias(COMMIT_TIME),
        )
    return rows.select(
        *values,
        F.lit(int(consistent_point)).cast("long").alias(START_LSN),
        F.lit(started_at).cast("timestamp").alias(START_AT),
        F.lit(None).cast("long").alias(END_LSN),
        F.lit(None).cast("timestamp").alias(END_AT),
        F.lit(True).alias(IS_CURRENT),
        F.lit("S").alias(START_OP),
        F.lit(None).cast("string").alias(END_OP),
    )


def remove_tables(layout: LakeLayout, tables: Sequence[LakeTable]) -> None:
    """Remove the Delta tables of an unfinished snapshot (their folders)."""
    for table in tables:
        kinds: tuple[TableKind, ...] = ("mirror", "history", "changelog")
        for kind in kinds:
            path: Path = table.path(layout, kind)
            if path.exists():
                shutil.rmtree(path)
                log.info("removed %s %s of an unfinished snapshot", table.table_id, kind)


#: What each copy task reports: one row per Parquet file written.
_FILES = pa.schema(
    [
        ("table_id", pa.string()),
        ("kind", pa.string()),
        ("path", pa.string()),
        ("size", pa.int64()),
        ("rows", pa.int64()),
    ]
)


@dataclass(frozen=True, slots=True)
class SnapshotOutput:
    """One Delta table a copy task writes: where, in which Arrow schema, from which column."""

    table_id: str
    column: str
    kind: TableKind
    directory: str
    schema: pa.Schema


@dataclass(frozen=True, slots=True)
class SnapshotTask:
    """What a Spark task runs: copy one of the reader's partitions into Parquet files of every
    Delta table of the partition's table, and report the files. A failed copy removes the files
    it wrote."""

    reader: Any  # pgcdc.spark.snapshot.PgcdcSnapshotReader
    partitions: tuple[Any, ...]
    outputs: dict[int, tuple[SnapshotOutput, ...]]  # by table relid
    consistent_point: Lsn
    started_at: datetime
    tag: str

    def copy(self, index: int) -> pa.RecordBatch:
        """Copy partition ``index``; one row per file written."""
        import pyarrow.parquet as pq

        partition = self.partitions[index]
        outputs = self.outputs.get(partition.relid, ())
        writers: dict[int, tuple[str, pq.ParquetWriter]] = {}
        rows = [0] * len(outputs)

        def write(batch: pa.RecordBatch) -> None:
            for i, output in enumerate(outputs):
                table = arrow_rows(
                    batch,
                    output,
                    consistent_point=self.consistent_point,
                    started_at=self.started_at,
                )
                if not table.num_rows:
                    continue
                if i not in writers:
                    name = f"part-{uuid.uuid4().hex}-{self.tag}.snappy.parquet"
                    os.makedirs(output.directory, exist_ok=True)
                    path = os.path.join(output.directory, name)
                    writers[i] = (
                        name,
                        pq.ParquetWriter(
                            path,
                            output.schema,
                            compression="snappy",
                            use_dictionary=dictionary_columns(table),
                        ),
                    )
                writers[i][1].write_table(table)
                rows[i] += table.num_rows

        try:
            self.reader.copy(partition, write)
        except BaseException:
            for i, (name, writer) in writers.items():
                with contextlib.suppress(Exception):
                    writer.close()
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(outputs[i].directory, name))
            raise
        report = []
        for i, (name, writer) in writers.items():
            writer.close()
            output = outputs[i]
            size = os.path.getsize(os.path.join(output.directory, name))
            report.append(
                {
                    "table_id": output.table_id,
                    "kind": output.kind,
                    "path": name,
                    "size": size,
                    "rows": rows[i],
                }
            )
        return pa.RecordBatch.from_pylist(report, schema=_FILES)

    def run(self, indexes: Iterable[int]) -> Iterator[dict[str, Any]]:
        """Copy the partitions ``indexes`` (an RDD partition's elements); a dict per file."""
        for index in indexes:
            yield from self.copy(index).to_pylist()


#: A column of a copy's Parquet files is dictionary-encoded when the first ``DICTIONARY_SAMPLE``
#: rows written hold at most ``DICTIONARY_SHARE`` of distinct values. Parquet writers try a
#: dictionary for every column by default and fall back to plain values only once it outgrows
#: its page (1 MB): for keys, timestamps and free text that costs a third of the writing time
#: and gives larger files. (Each record batch is written as its own row group, about 100,000
#: rows, so a quarter of a sample distinct still makes a dictionary that fits its page.)
DICTIONARY_SHARE = 0.25
DICTIONARY_SAMPLE = 20_000


def dictionary_columns(table: pa.Table) -> list[str]:
    """The Parquet column paths of ``table``'s schema worth a dictionary, judged on its first
    rows: top-level columns with few distinct values, and every leaf of nested columns
    (Parquet's default)."""
    import pyarrow.compute as pc

    sample = table.slice(0, DICTIONARY_SAMPLE)
    paths: list[str] = []
    for field, column in zip(sample.schema, sample.columns, strict=True):
        if pa.types.is_nested(field.type):
            paths.extend(_leaf_paths(field.name, field.type))
            continue
        present = len(column) - column.null_count
        try:
            distinct = pc.count_distinct(column).as_py()
        except pa.ArrowNotImplementedError:  # a type without a hash kernel: no dictionary
            continue
        if present and distinct <= DICTIONARY_SHARE * present:
            paths.append(field.name)
    return paths


def _leaf_paths(path: str, dtype: pa.DataType) -> list[str]:
    """The Parquet leaf column paths of an Arrow column (as pyarrow writes nested types)."""
    if pa.types.is_struct(dtype):
        return [p for f in dtype for p in _leaf_paths(f"{path}.{f.name}", f.type)]
    if pa.types.is_map(dtype):
        return _leaf_paths(f"{path}.key_value.key", dtype.key_type) + _leaf_paths(
            f"{path}.key_value.value", dtype.item_type
        )
    if (
        pa.types.is_list(dtype)
        or pa.types.is_large_list(dtype)
        or pa.types.is_fixed_size_list(dtype)
    ):
        return _leaf_paths(f"{path}.list.element", dtype.value_type)
    return [path]


def arrow_rows(
    batch: pa.RecordBatch,
    output: SnapshotOutput,
    *,
    consistent_point: Lsn,
    started_at: datetime,
) -> pa.Table:
    """``snapshot_rows`` in Arrow: the rows of ``output``'s Delta table for one record batch of
    the snapshot reader, in ``output.schema``."""
    import pyarrow.compute as pc

    keep = pc.and_(
        pc.equal(batch.column("_table_id"), output.table_id),
        pc.not_equal(batch.column("_op"), "T"),
    )
    if not pc.all(keep).as_py():
        batch = batch.filter(keep)
    n = batch.num_rows
    struct = batch.column(output.column)
    parts = dict(zip([f.name for f in struct.type], struct.flatten(), strict=True))
    new = parts["new"]
    columns: dict[str, pa.Array] = dict(zip([f.name for f in new.type], new.flatten(), strict=True))
    types = {f.name: f.type for f in output.schema}

    def constant(name: str, value: Any) -> pa.Array:
        return pa.repeat(pa.scalar(value, types[name]), n)

    point = int(consistent_point)
    if output.kind == "mirror":
        columns[COMMIT_LSN] = constant(COMMIT_LSN, point)
        columns[COMMIT_TIME] = constant(COMMIT_TIME, started_at)
    elif output.kind == "history":
        columns[START_LSN] = constant(START_LSN, point)
        columns[START_AT] = constant(START_AT, started_at)
        columns[END_LSN] = pa.nulls(n, types[END_LSN])
        columns[END_AT] = pa.nulls(n, types[END_AT])
        columns[IS_CURRENT] = constant(IS_CURRENT, True)
        columns[START_OP] = constant(START_OP, "S")
        columns[END_OP] = pa.nulls(n, types[END_OP])
    else:
        old_kind = parts["old_kind"]
        columns[OP] = constant(OP, "S")
        columns[CL_COMMIT_LSN] = batch.column("_commit_lsn")
        columns[CL_COMMIT_LSN_TEXT] = batch.column("_commit_lsn_text")
        columns[CL_END_LSN] = batch.column("_end_lsn")
        columns[POSITION] = batch.column("_position")
        columns[XID] = batch.column("_xid")
        columns[CL_COMMIT_TIME] = pc.coalesce(
            batch.column("_commit_time").cast(types[CL_COMMIT_TIME]),
            pa.scalar(started_at, types[CL_COMMIT_TIME]),
        )
        columns[OLD_KIND] = old_kind
        old = parts["old"]
        columns[OLD] = (
            pa.nulls(n, old.type)
            if old_kind.null_count == n
            else pc.if_else(pc.is_valid(old_kind), old, pa.nulls(n, old.type))
        )
        unchanged = parts["unchanged"]
        columns[UNCHANGED] = (
            unchanged
            if not unchanged.null_count
            else pc.if_else(
                pc.is_valid(unchanged),
                unchanged,
                pa.repeat(pa.scalar([], unchanged.type), n),
            )
        )
    table = pa.Table.from_arrays(
        [columns[f.name] for f in output.schema], names=output.schema.names
    )
    return cast_to(table, output.schema)


def snapshot_schema(source: Any, column: str, kind: TableKind) -> pa.Schema:
    """The Arrow schema of ``snapshot_rows`` for the source schema ``source`` (a Spark
    ``StructType``), built without Spark: the same types its expressions give."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = source[column].dataType
    image = struct["new"].dataType
    fields = [T.StructField(f.name, f.dataType, True) for f in image.fields]

    def add(name: str, dtype: Any) -> None:
        fields.append(T.StructField(name, dtype, True))

    if kind == "mirror":
        add(COMMIT_LSN, T.LongType())
        add(COMMIT_TIME, T.TimestampType())
    elif kind == "history":
        for name, dtype in (
            (START_LSN, T.LongType()),
            (START_AT, T.TimestampType()),
            (END_LSN, T.LongType()),
            (END_AT, T.TimestampType()),
            (IS_CURRENT, T.BooleanType()),
            (START_OP, T.StringType()),
            (END_OP, T.StringType()),
        ):
            add(name, dtype)
    else:
        changelog: list[tuple[str, Any]] = [
            (OP, T.StringType()),
            (CL_COMMIT_LSN, source["_commit_lsn"].dataType),
            (CL_COMMIT_LSN_TEXT, source["_commit_lsn_text"].dataType),
            (CL_END_LSN, source["_end_lsn"].dataType),
            (POSITION, T.LongType()),
            (XID, source["_xid"].dataType),
            (CL_COMMIT_TIME, source["_commit_time"].dataType),
            (OLD_KIND, struct["old_kind"].dataType),
            (OLD, image),
            (UNCHANGED, T.ArrayType(T.StringType(), True)),
        ]
        for name, dtype in changelog:
            add(name, dtype)
    return nullable_schema(to_arrow_schema(T.StructType(fields), timezone="UTC"))


def snapshot_outputs(
    reader: Any, layout: LakeLayout, tables: Sequence[LakeTable], table_columns: dict[str, str]
) -> dict[int, tuple[SnapshotOutput, ...]]:
    """Each copied table's outputs (by relid), in the Arrow schemas ``snapshot_rows`` gives."""
    from pyspark.sql import types as T

    source = reader.schema
    relids = {f"{t.schema}.{t.name}": t.relid for t in reader.catalog.tables}
    outputs: dict[int, tuple[SnapshotOutput, ...]] = {}
    for table in tables:
        column = table_columns[table.table_id]
        if column not in source.fieldNames() or table.table_id not in relids:
            raise RuntimeError(f"the snapshot has no column for {table.table_id}: is it published?")
        image = source[column].dataType["new"].dataType
        if not isinstance(image, T.StructType) or needs_cast(image):
            raise RuntimeError(
                f"{table.table_id}: the lake's snapshot reads TIME and JSON columns as strings; "
                "read the source without timeAsTime and jsonAsVariant"
            )
        outputs[relids[table.table_id]] = tuple(
            SnapshotOutput(
                table.table_id,
                column,
                kind,
                str(table.path(layout, kind)),
                snapshot_schema(source, column, kind),
            )
            for kind in table.kinds()
        )
    return outputs


#: Under Spark Connect (no SparkContext), the copy's tasks are the reads of a Python data source
#: registered under this name and the copy's tag (one per copy, so that copies running at the
#: same time on one session never run each other's tasks).
SOURCE_NAME = "pgcdc_lake_snapshot"


def _spark_context(spark: Any) -> Any:
    """The session's SparkContext; None under Spark Connect (which has none)."""
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect: PySparkNotImplementedError
        return None


def _run(spark: Any, task: SnapshotTask) -> list[Any]:
    """Run ``task`` on the executors, one Spark task per reader partition; the files' rows.

    With a SparkContext, the tasks are an RDD's partitions: a first Python job costs Spark one
    Python process (the executors' worker daemon, which the stream uses later anyway). Spark
    Connect has no RDDs: there the tasks are a Python data source's read, for which Spark starts
    a Python process per planning step (creating the source, planning its partitions) on top
    of the executors' one, several seconds on a small machine."""
    context = _spark_context(spark)
    if context is None:
        return _run_as_data_source(spark, task)
    count = len(task.partitions)
    return list(context.parallelize(range(count), count).mapPartitions(task.run).collect())


def _run_as_data_source(spark: Any, task: SnapshotTask) -> list[Any]:
    """``_run`` as a Python data source's read (``SOURCE_NAME`` and the copy's tag), registered
    with ``task`` inside its class: each partition's ``read`` copies its range and yields the
    files it wrote."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    name = f"{SOURCE_NAME}_{task.tag.replace('-', '_')}"

    class CopyReader(DataSourceReader):
        def partitions(self) -> Sequence[InputPartition]:
            return [InputPartition(i) for i in range(len(task.partitions))]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield task.copy(int(partition.value))

    class CopySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> Any:
            from pyspark.sql.pandas.types import from_arrow_schema

            return from_arrow_schema(_FILES)

        def reader(self, schema: Any) -> DataSourceReader:
            return CopyReader()

    spark.dataSource.register(CopySource)
    return list(spark.read.format(name).load().collect())


def _wait_for_tasks(spark: Any, timeout: float = 60.0) -> None:
    """After a failed copy, wait (up to ``timeout`` seconds) until Spark no longer runs the
    copy's stage. Spark Connect sessions have no status tracker here."""
    context = _spark_context(spark)
    if context is None:
        return
    tracker = context.statusTracker()
    deadline = time.monotonic() + timeout
    while tracker.getActiveStageIds() and time.monotonic() < deadline:
        time.sleep(0.2)


def _remove_files(directories: Iterable[str], tag: str, keep: set[str]) -> int:
    """Remove the Parquet files of this copy (``tag``) not in ``keep``; how many."""
    removed = 0
    for directory in directories:
        path = Path(directory)
        if not path.is_dir():
            continue
        for file in path.glob(f"part-*-{tag}.snappy.parquet"):
            if file.name not in keep:
                with contextlib.suppress(OSError):
                    file.unlink()
                    removed += 1
    return removed


def _remove_files_until_quiet(
    directories: Sequence[str], tag: str, keep: set[str], *, quiet: float = 3.0, limit: float = 30.0
) -> None:
    """Remove the copy's files until none has appeared for ``quiet`` seconds (at most ``limit``):
    a task Spark is still cancelling (it kills a task's Python worker a few seconds after the
    job failed) may write one after the first pass. What is left after ``limit`` is never in
    a Delta log, and the next start removes an unfinished snapshot's tables."""
    deadline = time.monotonic() + limit
    last = time.monotonic()
    while True:
        if _remove_files(directories, tag, keep):
            last = time.monotonic()
        now = time.monotonic()
        if now - last >= quiet or now >= deadline:
            return
        time.sleep(0.5)


def write_snapshot(
    spark: Any,
    reader: Any,
    layout: LakeLayout,
    tables: Sequence[LakeTable],
    table_columns: dict[str, str],
    *,
    consistent_point: Lsn,
    started_at: datetime,
    app_id: str,
    generation: int,
    on_progress: Callable[[str | None, int], None] | None = None,
) -> SnapshotResult:
    """Copy every table of ``reader`` (``pgcdc.spark.snapshot_reader``) into the lake.

    ``on_progress`` (progress displays) is called with ``(None, rows read)`` once the copy is
    read, then with ``(table id, mirror rows)`` as each table is committed."""
    result = SnapshotResult()
    started = time.monotonic()
    outputs = snapshot_outputs(reader, layout, tables, table_columns)
    partitions = tuple(reader.partitions())
    tag = f"s{generation}-{uuid.uuid4().hex[:8]}"
    task = SnapshotTask(reader, partitions, outputs, consistent_point, started_at, tag)
    directories = [o.directory for found in outputs.values() for o in found]
    committed: set[str] = set()
    try:
        files = _run(spark, task) if partitions else []
        by_output: dict[tuple[str, str], list[Any]] = {}
        for row in files:
            by_output.setdefault((row["table_id"], row["kind"]), []).append(row)
        total = sum(int(r["rows"]) for r in files if r["kind"] == "mirror")
        log.info("snapshot at %s: %s rows read from the source", consistent_point, total)
        if on_progress is not None:
            on_progress(None, total)
        for table, found in zip(tables, outputs.values(), strict=True):  # in tables' order
            for output in found:
                written = by_output.get((output.table_id, output.kind), [])
                target = DeltaTarget(output.directory)
                Path(output.directory).mkdir(parents=True, exist_ok=True)
                # kept from here on even if the commit raises: it may have landed first
                committed.update(r["path"] for r in written)
                commit_files(
                    target,
                    output.schema,
                    [CommittedFile(r["path"], int(r["size"]), int(r["rows"])) for r in written],
                    app_id=app_id,
                    version=generation,
                    metadata={"snapshot": generation, "consistent_point": str(consistent_point)},
                )
                count = sum(int(r["rows"]) for r in written)
                if output.kind == "mirror":
                    result.rows[table.table_id] = count
                log.info("snapshot of %s %s: %s rows", table.table_id, output.kind, count)
            if on_progress is not None:
                on_progress(table.table_id, result.rows.get(table.table_id, 0))
    except BaseException:
        _wait_for_tasks(spark)
        _remove_files_until_quiet(directories, tag, committed)
        raise
    _remove_files(directories, tag, committed)  # of task attempts that failed and were retried
    result.seconds = time.monotonic() - started
    return result
