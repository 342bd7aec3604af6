"""The initial copy: every published table into its Delta tables, in parallel, consistently.

The slot is created with an exported snapshot; the Spark source's snapshot reader
(``pgcdc.spark.snapshot_reader``) splits each table into ctid ranges, all read in that snapshot
with the publication's row filters. First every Delta table is created, empty, by Delta's Spark
connector (``delta.create_table``: deletion vectors, column mapping, statistics columns). Then
one Spark task per range reads its rows (``reader.copy`` hands it Arrow record batches as they
are decoded) and, in the same Python process, writes them as Parquet files straight into the
folders of the table's Delta tables, under the columns' physical names (column mapping): the
mirror, and the history (every row a current version, ``__start_op`` 'S', starting at the
consistent point) and the changelog (rows with ``__op`` 'S') when the table has them. Each file's
statistics (rows, and min, max and nulls of the table's statistics columns, from the Parquet
footer the task wrote) go with it, so the stream's MERGEs skip files by key range from the first
batch on. Only the columns whose first rows hold few distinct values are dictionary-encoded
(``dictionary_columns``). The rows never pass through the JVM, and PostgreSQL is read once
however many Delta tables are written.

``snapshot_rows`` gives those tables' rows as Spark expressions: it is what ``arrow_rows``
computes, in the schema ``snapshot_struct`` gives (Spark's types for those expressions, as the
stream's writes see the tables). When every task
succeeded, each Delta table gets its files in one commit through the connector's commit API,
tagged ``Transaction(snapshot app id, generation)`` (``deltalog.TableLog.commit``): from then on the
table is written by Delta's Spark connector alone. Files of failed attempts are removed. A
snapshot that did not finish is redone from scratch with a new slot (the next generation): the
tables of the unfinished one are removed first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa

from pgcdc.errors import PgcdcError
from pgcdc.lake.store.delta import create_table, stats_json
from pgcdc.lake.store.deltalog import DataFile, TableLog
from pgcdc.lake.store.storage import LakeLocation, LakePath, LeaseLost, StorageError
from pgcdc.lake.store.tables import (
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
    ROW_ID,
    START_AT,
    START_LSN,
    START_OP,
    UNCHANGED,
    XID,
    LakeLayout,
    LakeTable,
    TableKind,
)
from pgcdc.lake.store.target import canonical_schema
from pgcdc.lake.write.changelog import changelog_rows
from pgcdc.lake.write.changes import image_columns, lake_image, needs_cast, quote_column
from pgcdc.lake.write.keyindex import forget_index, index_folder
from pgcdc.lake.write.multiset import snapshot_row_id
from pgcdc.lsn import Lsn

__all__ = [
    "DICTIONARY_SAMPLE",
    "DICTIONARY_SHARE",
    "Incompatible",
    "SnapshotOutput",
    "SnapshotResult",
    "SnapshotTask",
    "arrow_rows",
    "arrow_schema",
    "dictionary_columns",
    "file_stats",
    "physical_schema",
    "remove_tables",
    "snapshot_outputs",
    "snapshot_rows",
    "snapshot_struct",
    "write_snapshot",
]

log = logging.getLogger("pgcdc.lake")


class SnapshotResult:
    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.seconds = 0.0
        #: per (table id, kind): the version the copy committed and its data files, the
        #: table's only ones (no deletion vectors): what its key index is built from
        self.files: dict[tuple[str, TableKind], tuple[int, tuple[DataFile, ...]]] = {}


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


def remove_tables(
    layout: LakeLayout, tables: Sequence[LakeTable], fence: Callable[[], None] | None = None
) -> None:
    """Remove the Delta tables of an unfinished snapshot, or of a table about to be copied
    again (their folders, and their key indexes: a table created there again starts its
    versions anew). ``fence`` raises when this process may no longer write the lake: called
    before anything is removed."""

    if fence is not None:
        fence()
    for table in tables:
        kinds: tuple[TableKind, ...] = ("mirror", "history", "changelog")
        for kind in kinds:
            path = table.path(layout, kind)
            forget_index(str(path))
            index_folder(layout, table, kind).remove_tree()
            if path.remove_tree():
                log.info("removed %s %s of an unfinished copy", table.table_id, kind)


def _remove_after(
    failure: BaseException,
    layout: LakeLayout,
    tables: Sequence[LakeTable],
    fence: Callable[[], None] | None,
) -> None:
    """``remove_tables`` after a failed copy; a lake no longer this run's keeps its tables,
    and the copy's own failure is what is raised, noted with that."""
    try:
        remove_tables(layout, tables, fence)
    except LeaseLost as lost:
        failure.add_note(f"the copy's tables were left in place: {lost}")


#: What each copy task reports: one row per Parquet file written.
_FILES = pa.schema(
    [
        ("table_id", pa.string()),
        ("kind", pa.string()),
        ("path", pa.string()),
        ("size", pa.int64()),
        ("rows", pa.int64()),
        ("stats", pa.string()),
    ]
)


@dataclass(frozen=True, slots=True)
class SnapshotOutput:
    """One Delta table a copy task writes: where, from which column, in which Arrow schema
    (``schema``, by the columns' names), written under the columns' physical names
    (``physical``: the same types, column mapping's names), with which statistics columns
    (``stats``: physical names)."""

    table_id: str
    column: str
    kind: TableKind
    directory: str
    schema: pa.Schema
    physical: pa.Schema
    stats: tuple[str, ...] = ()


def to_physical(table: pa.Table, physical: pa.Schema) -> pa.Table:
    """``table`` under ``physical``'s names (a view: the same buffers, renamed fields)."""
    columns = [
        pa.chunked_array([chunk.view(f.type) for chunk in column.chunks], type=f.type)
        for column, f in zip(table.columns, physical, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=physical)


def _stat_value(dtype: pa.DataType, value: Any) -> Any | None:
    """A Parquet statistic as Delta records it, for the types whose statistics Delta reads as
    written (integers, text, decimals, dates, timestamps with a time zone as datetimes, turned
    into Delta's text once reduced); None for the others (no min/max: a MERGE then
    reads the file whatever its keys)."""
    if value is None:
        return None
    if pa.types.is_integer(dtype) and not pa.types.is_unsigned_integer(dtype):
        return int(value)
    if pa.types.is_string(dtype) and isinstance(value, str):
        return value
    if pa.types.is_decimal(dtype) and isinstance(value, Decimal):
        return value
    if pa.types.is_date32(dtype) and isinstance(value, date):
        return value.isoformat()
    if pa.types.is_timestamp(dtype) and dtype.tz is not None and isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return None


def _timestamp_stat(value: datetime, *, upper: bool) -> str:
    """A timestamp statistic as Delta writes it: UTC, to the millisecond. Delta truncates; a
    maximum is rounded up here instead, so that it still bounds the file's values."""
    value = value.astimezone(UTC)
    extra = value.microsecond % 1000
    value = value.replace(microsecond=value.microsecond - extra)
    if upper and extra:
        value += timedelta(milliseconds=1)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def file_stats(path: str, output: SnapshotOutput, filesystem: Any = None) -> str:
    """Delta's statistics of a Parquet file a copy task wrote, from its footer: its rows, and
    the min, max and null count of ``output.stats``'s columns."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path, filesystem=filesystem)
    index = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
    types = {f.name: f.type for f in output.physical}
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in output.stats:
        j = index.get(name)
        if j is None:
            continue
        chunks = [meta.row_group(g).column(j).statistics for g in range(meta.num_row_groups)]
        if not chunks or any(s is None or not s.has_null_count for s in chunks):
            continue
        nulls[name] = sum(int(s.null_count) for s in chunks)
        bounds = _bounds(types[name], chunks)
        if bounds is not None:
            minimum[name], maximum[name] = bounds
    return stats_json(meta.num_rows, minimum, maximum, nulls)


def _bounds(dtype: pa.DataType, chunks: list[Any]) -> tuple[Any, Any] | None:
    """The column's min and max over the row groups, as Delta records them; None when some
    row group holding values has none (pyarrow writes none for text over 4 kB: bounds of the
    others would leave its keys outside, and a MERGE would skip the file) or when a value has
    no Python or Delta form (a date after 9999 or before year 1)."""
    if any(not s.has_min_max and s.num_values > 0 for s in chunks):
        return None
    valued = [s for s in chunks if s.has_min_max]
    try:
        lows = [_stat_value(dtype, s.min) for s in valued]
        highs = [_stat_value(dtype, s.max) for s in valued]
        if not valued or None in lows or None in highs:
            return None
        low = min(v for v in lows if v is not None)
        high = max(v for v in highs if v is not None)
        if isinstance(low, datetime) and isinstance(high, datetime):
            return _timestamp_stat(low, upper=False), _timestamp_stat(high, upper=True)
    except (OverflowError, ValueError):
        return None
    return low, high


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
    location: LakeLocation  # the lake: where the files go (a local folder or S3)

    def copy(self, index: int) -> pa.RecordBatch:
        """Copy partition ``index``; one row per file written."""
        import pyarrow.parquet as pq

        fs = self.location.arrow_filesystem()

        def file(output: SnapshotOutput, name: str) -> str:
            return self.location.arrow_path(f"{output.directory}/{name}")

        partition = self.partitions[index]
        outputs = self.outputs.get(partition.relid, ())
        writers: dict[int, tuple[str, pq.ParquetWriter]] = {}
        rows = [0] * len(outputs)
        copied = 0  # the partition's rows so far (a table without a key numbers its copies)

        def write(batch: pa.RecordBatch) -> None:
            nonlocal copied
            count = 0
            for i, output in enumerate(outputs):
                table = arrow_rows(
                    batch,
                    output,
                    consistent_point=self.consistent_point,
                    started_at=self.started_at,
                    partition=index,
                    first_row=copied,
                )
                count = table.num_rows
                if not table.num_rows:
                    continue
                table = to_physical(table, output.physical)
                if i not in writers:
                    name = f"part-{uuid.uuid4().hex}-{self.tag}.snappy.parquet"
                    if not self.location.is_s3:  # S3 has no folders
                        os.makedirs(output.directory, exist_ok=True)
                    writers[i] = (
                        name,
                        pq.ParquetWriter(
                            file(output, name),
                            output.physical,
                            filesystem=fs,
                            compression="snappy",
                            use_dictionary=dictionary_columns(table),
                        ),
                    )
                writers[i][1].write_table(table)
                rows[i] += table.num_rows
            copied += count

        try:
            self.reader.copy(partition, write)
        except BaseException:
            for i, (name, writer) in writers.items():
                with contextlib.suppress(Exception):
                    writer.close()
                with contextlib.suppress(OSError):
                    fs.delete_file(file(outputs[i], name))
            raise
        report = []
        for i, (name, writer) in writers.items():
            writer.close()
            output = outputs[i]
            path = file(output, name)
            report.append(
                {
                    "table_id": output.table_id,
                    "kind": output.kind,
                    "path": name,
                    "size": fs.get_file_info(path).size,
                    "rows": rows[i],
                    "stats": file_stats(path, output, fs),
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
#: its page (1 MB): for keys, timestamps and free text that is wasted work and larger files.
#: (Each record batch is written as its own row group, about 100,000 rows, so a quarter of a
#: sample distinct still makes a dictionary that fits its page.)
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
    partition: int = 0,
    first_row: int = 0,
) -> pa.Table:
    """``snapshot_rows`` in Arrow: the rows of ``output``'s Delta table for one record batch of
    the snapshot reader, in ``output.schema``; for a table without a key, each row's
    ``__row_id`` numbers it from ``first_row`` within copy task ``partition``."""
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
    if ROW_ID in types:
        columns[ROW_ID] = pa.array(
            [snapshot_row_id(partition, first_row + i) for i in range(n)], pa.string()
        )
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
    arrays = []
    for f in output.schema:
        column = columns[f.name]
        arrays.append(column if column.type == f.type else column.cast(f.type, safe=True))
    return pa.Table.from_arrays(arrays, schema=output.schema)


def snapshot_struct(source: Any, column: str, kind: TableKind, *, multiset: bool = False) -> Any:
    """The Spark schema of a Delta table's snapshot rows (``snapshot_rows``, and ``__row_id``
    for the mirror and history of a table without a key) for the source schema ``source`` (a
    Spark ``StructType``): the types the stream's writes give those tables too."""
    from pyspark.sql import types as T

    struct = source[column].dataType
    image = struct["new"].dataType
    fields = [T.StructField(f.name, f.dataType, True) for f in image.fields]

    def add(name: str, dtype: Any) -> None:
        fields.append(T.StructField(name, dtype, True))

    if multiset and kind != "changelog":
        add(ROW_ID, T.StringType())
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
    return T.StructType(fields)


def arrow_schema(struct: Any) -> pa.Schema:
    """A Spark schema in (canonical) Arrow types."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return canonical_schema(to_arrow_schema(struct, timezone="UTC"))


def physical_type(dtype: pa.DataType, delta: Any) -> pa.DataType:
    """``dtype`` with its struct fields renamed to their physical names in ``delta`` (the type
    in the Delta table's schema JSON, with column mapping's metadata)."""
    if pa.types.is_struct(dtype) and isinstance(delta, dict) and delta.get("type") == "struct":
        by_name = {f["name"]: f for f in delta["fields"]}
        fields = []
        for f in dtype:
            spec = by_name[f.name]
            name = spec.get("metadata", {}).get("delta.columnMapping.physicalName", f.name)
            fields.append(pa.field(name, physical_type(f.type, spec["type"]), True))
        return pa.struct(fields)
    if pa.types.is_list(dtype) and isinstance(delta, dict) and delta.get("type") == "array":
        return pa.list_(pa.field("element", physical_type(dtype.value_type, delta["elementType"])))
    if pa.types.is_map(dtype) and isinstance(delta, dict) and delta.get("type") == "map":
        return pa.map_(
            physical_type(dtype.key_type, delta["keyType"]),
            physical_type(dtype.item_type, delta["valueType"]),
        )
    return dtype


def physical_schema(directory: str, schema: pa.Schema) -> pa.Schema:
    """``schema`` under the physical names of the Delta table at ``directory``."""
    import json

    from pgcdc.lake.store.target import DeltaTarget

    table = DeltaTarget(directory).table()
    assert table is not None, directory
    delta = json.loads(table.schema().to_json())
    physical = physical_type(pa.struct(list(schema)), delta)
    return pa.schema(list(physical))


class Incompatible(PgcdcError, RuntimeError):
    """A Delta table the copy would replace whose columns' types differ from the copy's: its
    files cannot be replaced in place (``snapshot_outputs`` with ``replace``)."""


def snapshot_outputs(
    spark: Any,
    reader: Any,
    layout: LakeLayout,
    tables: Sequence[LakeTable],
    table_columns: dict[str, str],
    *,
    kinds: Mapping[str, Sequence[TableKind]] | None = None,
    replace: bool = False,
) -> dict[int, tuple[SnapshotOutput, ...]]:
    """Each copied table's outputs (by relid), its Delta tables created (empty) by Delta's
    Spark connector in the schemas ``snapshot_struct`` gives. ``kinds``: the Delta tables to
    write of each table (by id; default all of its own). ``replace``: the Delta tables exist
    and the copy replaces their rows (``write_snapshot``): columns they lack are added first
    (Delta's schema evolution); a column of another type raises ``Incompatible``."""
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
        found = []
        wanted = table.kinds() if kinds is None else tuple(kinds.get(table.table_id, ()))
        for kind in wanted:
            directory = str(table.path(layout, kind))
            struct = snapshot_struct(source, column, kind, multiset=table.multiset)
            if replace:
                _widen_for_copy(spark, directory, struct, f"{table.table_id} {kind}")
            else:
                create_table(
                    spark,
                    directory,
                    struct,
                    stats_columns=table.stats_columns(kind),
                    what=f"{table.table_id} {kind}",
                )
            schema = arrow_schema(struct)
            physical = physical_schema(directory, schema)
            names = dict(zip(schema.names, physical.names, strict=True))
            found.append(
                SnapshotOutput(
                    table.table_id,
                    column,
                    kind,
                    directory,
                    schema,
                    physical,
                    tuple(names[c] for c in table.stats_columns(kind) if c in names),
                )
            )
        outputs[relids[table.table_id]] = tuple(found)
    return outputs


def _widen_for_copy(spark: Any, directory: str, struct: Any, what: str) -> None:
    """Make the Delta table at ``directory`` take files of the copy's ``struct``: the columns
    it lacks added (no file rewritten); ``Incompatible`` when a column it has is of another
    type (its files could not be read under one schema)."""
    from pgcdc.lake.store.delta import plain_type, table_schema
    from pgcdc.lake.write.schema_evolution import evolve

    stored = {f.name: f.dataType for f in table_schema(spark, directory).fields}
    for field in struct.fields:
        have = stored.get(field.name)
        if have is not None and plain_type(have) != plain_type(field.dataType):
            raise Incompatible(
                f"{what}: column {field.name} is {have.simpleString()} in the lake and "
                f"{field.dataType.simpleString()} in the source"
            )
    if any(f.name not in stored for f in struct.fields):
        evolve(spark, directory, struct, drop_missing=False, what=what)


def _run(spark: Any, task: SnapshotTask) -> list[Any]:
    """Run ``task`` on the executors, one Spark task per reader partition (an RDD's
    partitions: a first Python job costs Spark one Python process, the executors' worker
    daemon, which the stream uses later anyway); the files' rows."""
    count = len(task.partitions)
    context = spark.sparkContext
    return list(context.parallelize(range(count), count).mapPartitions(task.run).collect())


def _wait_for_tasks(spark: Any, timeout: float = 60.0) -> None:
    """After a failed copy, wait (up to ``timeout`` seconds) until Spark no longer runs the
    copy's stage. Spark Connect sessions have no status tracker here."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout
    while tracker.getActiveStageIds() and time.monotonic() < deadline:
        time.sleep(0.2)


def _remove_files(directories: Iterable[str], tag: str, keep: set[str]) -> int:
    """Remove the Parquet files of this copy (``tag``) not in ``keep``; how many."""
    removed = 0
    suffix = f"-{tag}.snappy.parquet"
    for directory in directories:
        folder = LakePath.parse(directory)
        for name in folder.names():
            if name.startswith("part-") and name.endswith(suffix) and name not in keep:
                with contextlib.suppress(StorageError, OSError):
                    (folder / name).remove()
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
    fence: Callable[[], None] | None = None,
    kinds: Mapping[str, Sequence[TableKind]] | None = None,
    replace: bool = False,
) -> SnapshotResult:
    """Copy every table of ``reader`` (``pgcdc.spark.snapshot_reader``) into the lake.

    ``on_progress`` (progress displays) is called with ``(None, rows read)`` once the copy is
    read, then with ``(table id, mirror rows)`` as each table is committed. ``fence`` raises
    when this process may no longer write the lake: called before each commit. ``kinds``:
    the Delta tables of each table to write (default all). ``replace``: the Delta tables
    exist, and each commit replaces every row they had with the copy's (its files removed,
    the copy's added, one commit: a reader sees the old rows or the copy, never a part);
    ``Incompatible`` when one's columns are of other types (nothing is written then)."""
    result = SnapshotResult()
    started = time.monotonic()
    try:
        outputs = snapshot_outputs(
            spark, reader, layout, tables, table_columns, kinds=kinds, replace=replace
        )
    except BaseException as exc:
        if not replace:  # those created before the one that failed
            _remove_after(exc, layout, tables, fence)
        raise
    partitions = tuple(reader.partitions())
    tag = f"s{generation}-{uuid.uuid4().hex[:8]}"
    task = SnapshotTask(
        reader, partitions, outputs, consistent_point, started_at, tag, layout.location
    )
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
                if fence is not None:
                    fence()
                # kept from here on even if the commit raises: it may have landed first
                committed.update(r["path"] for r in written)
                count = sum(int(r["rows"]) for r in written)
                now = int(time.time() * 1000)
                added = [
                    DataFile(r["path"], int(r["size"]), int(r["rows"]), r["stats"], now)
                    for r in written
                ]
                table_log = TableLog(spark, str(output.directory))
                snapshot = table_log.snapshot()
                replaced = table_log.files(snapshot) if replace else []
                version = table_log.commit(
                    [*(f.remove_action(now) for f in replaced), *(f.add_action() for f in added)],
                    snapshot=snapshot,
                    session=spark,
                    app_id=app_id,
                    txn_version=generation,
                    operation="write",
                    metadata={
                        "snapshot": generation,
                        "consistent_point": str(consistent_point),
                        "rows": count,
                        "files": len(written),
                        **({"replaced": len(replaced)} if replace else {}),
                    },
                )
                log.debug(
                    "committed %s files to %s as version %s", len(added), output.directory, version
                )
                result.files[(table.table_id, output.kind)] = (version, tuple(added))
                if output.kind == "mirror":
                    result.rows[table.table_id] = count
                log.info("snapshot of %s %s: %s rows", table.table_id, output.kind, count)
            if on_progress is not None:
                on_progress(table.table_id, result.rows.get(table.table_id, 0))
    except BaseException as exc:
        _wait_for_tasks(spark)
        _remove_files_until_quiet(directories, tag, committed)
        if not committed and not replace:  # still empty: a failed copy leaves nothing behind
            _remove_after(exc, layout, tables, fence)
        raise
    _remove_files(directories, tag, committed)  # of task attempts that failed and were retried
    result.seconds = time.monotonic() - started
    return result
