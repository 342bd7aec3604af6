"""Staging of a large micro-batch's rows, so that no Delta commit needs them all in memory.

A table whose changes in one micro-batch exceed ``[lake] rows_per_commit`` (or whose values
exceed ``bytes_per_commit``) is not collected to the driver in one piece (a transaction of
millions of rows would exhaust the driver's heap).
Its rows for one Delta table (mirror, history or changelog) are split into ``n`` chunks, and
executors write them through the Python data source ``pgcdc_lake_stage`` (a
``DataSourceArrowWriter``) as Arrow files, one folder per chunk, under the lake's
``_pgcdc/stage`` folder. The driver then reads one chunk at a time and commits it to Delta.

The split is deterministic: the same batch gives the same chunks on a replay (``n`` follows from
the batch's change count, the chunk of a row from the rows), so the chunks a failed run
committed already are recognised by their application transaction (``writer.commit_properties``)
and skipped. The mirror and the history are split by the key a row's values come from (its root
key when a key-changing update left unchanged TOAST values to fill from the stored row), so one
chunk holds everything that fills or closes a stored row: into runs of keys in order
(``range_chunks``, for a key of one integer, date or string column), so that each chunk's
MERGE reads only the stored files of its key range, or else by a hash of the key (and as a
half-applied batch was split, whatever the key). The
changelog (appended, never merged) is split by a hash of commit LSN and position.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgcdc.lake.changes import quote_column

__all__ = [
    "CHUNK",
    "FORMAT",
    "StagedRows",
    "chunk_count",
    "hash_chunks",
    "range_chunks",
    "range_splittable",
    "stage_rows",
]

FORMAT = "pgcdc_lake_stage"
#: the chunk number of a staged row (a column of the staged DataFrame, not of the files)
CHUNK = "__pgcdc_chunk"


def chunk_count(changes: int, rows_per_commit: int) -> int:
    """How many chunks a table's ``changes`` of one batch are committed in (1: no staging)."""
    if rows_per_commit <= 0 or changes <= rows_per_commit:
        return 1
    return -(-changes // rows_per_commit)


def _has_root(roots: Sequence[str]) -> Any:
    from pyspark.sql import functions as F

    has_root = F.lit(False)
    for r in roots:
        has_root = has_root | F.col(quote_column(r)).isNotNull()
    return has_root


def hash_chunks(columns: Sequence[str], n: int, *, roots: Sequence[str] = ()) -> Any:
    """The chunk number (0 to ``n`` - 1) of a row: a hash of ``columns``, or of ``roots`` where
    any of them is set (a Spark column expression)."""
    from pyspark.sql import functions as F

    by_columns = F.xxhash64(*[F.col(quote_column(c)) for c in columns])
    value = by_columns
    if roots:
        value = F.when(
            _has_root(roots), F.xxhash64(*[F.col(quote_column(r)) for r in roots])
        ).otherwise(by_columns)
    return F.pmod(value, F.lit(n))


def range_splittable(df: Any, columns: Sequence[str]) -> bool:
    """Whether ``range_chunks`` can split ``df`` by ``columns``: one key column, of an integer,
    date or string type (compared the same way by Spark's sort and by a literal)."""
    from pyspark.sql.types import (
        ByteType,
        DateType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
    )

    if len(columns) != 1:
        return False
    types = {f.name: f.dataType for f in df.schema.fields}
    return isinstance(
        types.get(columns[0]), ByteType | ShortType | IntegerType | LongType | DateType | StringType
    )


def range_chunks(df: Any, column: str, n: int, *, root: str | None = None, keys: Any = None) -> Any:
    """The chunk number (0 to ``n`` - 1) of a row of ``df`` (a Spark column expression) by
    ranges of its chunk key (``column``, or ``root`` where set): the distinct keys in order,
    cut into ``n`` runs of as equal a number of keys as can be (``ntile``; rows with a NULL key
    go to chunk 0). Each chunk's keys then cover a narrow range, so a MERGE of one chunk skips
    the stored files of the others (delta-rs prunes the target by the source keys' range), and
    memory stays that of one chunk as a large transaction of new keys is applied.

    Runs a Spark job over the keys alone (the rows are not joined or moved) and returns an
    expression comparing each key with the ``n`` - 1 boundaries found. Deterministic: the same
    distinct keys give the same boundaries. The keys are read from ``keys`` if given: a
    DataFrame with the same distinct chunk keys as ``df`` in the same columns, cheaper to
    compute (``df`` may be an aggregation of every row's values, which the staging then
    computes again)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key = F.col(quote_column(column))
    if root is not None:
        key = F.coalesce(F.col(quote_column(root)), key)
    source = df if keys is None else keys
    distinct = source.select(key.alias("k")).where(F.col("k").isNotNull()).distinct()
    tiles = distinct.withColumn("t", F.ntile(n).over(Window.orderBy("k")))
    # the last key of each run but the last: a key above the i-th boundary is past run i
    ends = tiles.groupBy("t").agg(F.max("k").alias("k")).orderBy("t").collect()
    chunk = F.lit(0)
    for row in ends[:-1]:
        chunk = chunk + F.when(key > F.lit(row["k"]), 1).otherwise(0)
    return F.when(key.isNull(), F.lit(0)).otherwise(chunk)


def _classes() -> type[Any]:
    """The data source class (defined lazily: pyspark is imported only where needed)."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    @dataclass
    class StageMessage(WriterCommitMessage):
        files: int
        rows: int

    class StageWriter(DataSourceArrowWriter):
        def __init__(self, options: dict[str, str]) -> None:
            self.directory = options["path"]

        def write(self, iterator: Iterator[pa.RecordBatch]) -> Any:
            import pyarrow.compute as pc

            writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
            sinks: list[Any] = []
            rows = 0
            task = uuid.uuid4().hex
            try:
                for batch in iterator:
                    if batch.num_rows == 0:
                        continue
                    chunks = batch.column(CHUNK)
                    data = batch.drop_columns([CHUNK])
                    for value in pc.unique(chunks).to_pylist():
                        part = data.filter(pc.equal(chunks, value))
                        writer = writers.get(value)
                        if writer is None:
                            folder = os.path.join(self.directory, f"chunk-{value}")
                            os.makedirs(folder, exist_ok=True)
                            sink = pa.OSFile(os.path.join(folder, f"{task}.arrow"), "wb")
                            sinks.append(sink)
                            writer = pa.ipc.new_file(
                                sink,
                                part.schema,
                                options=pa.ipc.IpcWriteOptions(compression="lz4"),
                            )
                            writers[value] = writer
                        writer.write_batch(part)
                    rows += batch.num_rows
            finally:
                for writer in writers.values():
                    writer.close()
                for sink in sinks:
                    sink.close()
            return StageMessage(len(writers), rows)

    class StageSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return StageWriter(dict(self.options))

    return StageSource


def _register(spark: Any) -> None:
    """Register the staging data source with ``spark``'s JVM session, every time: a
    ``foreachBatch`` batch's Python session is a new object each batch (so no Python-side
    memo can say which JVM sessions have it), and staging is for large batches only."""
    spark.dataSource.register(_classes())


@dataclass(frozen=True, slots=True)
class StagedRows:
    """The staged rows of one Delta table of one batch: ``chunks`` folders under ``directory``."""

    directory: Path
    chunks: int
    schema: pa.Schema

    def read(self, chunk: int) -> pa.Table:
        """Chunk ``chunk``'s rows (as ``DataFrame.toArrow`` would give them; maybe none)."""
        folder = self.directory / f"chunk-{chunk}"
        tables = []
        if folder.is_dir():
            for path in sorted(folder.glob("*.arrow")):
                with pa.memory_map(str(path)) as source:
                    tables.append(pa.ipc.open_file(source).read_all())
        if not tables:
            return self.schema.empty_table()
        return pa.concat_tables(tables).cast(self.schema)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def stage_rows(df: Any, directory: Path, chunks: int) -> StagedRows:
    """Write ``df``'s rows, split into ``chunks`` by their ``CHUNK`` column (which the files
    do not keep), under ``directory`` (replacing what a failed attempt left there)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    schema = to_arrow_schema(
        df.drop(CHUNK).schema,
        error_on_duplicated_field_names_in_struct=True,
        timezone="UTC",
        prefers_large_types=False,
    )
    _register(df.sparkSession)
    df.write.format(FORMAT).mode("append").option("path", str(directory)).save()
    return StagedRows(directory, chunks, schema)
