"""Bulk writes of a Spark DataFrame into one Delta table: executors write, one commit.

``write_delta_files(df, target, ...)`` saves ``df`` through the Python data source
``pgcdc_lake_files`` (a ``DataSourceArrowWriter``): each task writes its rows as one Parquet
file straight into the table's folder, and the writer's ``commit`` (run once, on the driver,
after every task succeeded) adds all files to the Delta table in a single commit tagged with
the given application transaction; ``abort`` removes the files of a failed write. So a large
table never passes through the driver's memory. Executors must reach the lake path (local mode,
or a shared filesystem mounted at the same path).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgcdc.lake.writer import DeltaTarget, cast_to, commit_properties

__all__ = ["FORMAT", "register", "write_delta_files", "written_rows"]

log = logging.getLogger("pgcdc.lake")

FORMAT = "pgcdc_lake_files"


def _encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def _decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _classes() -> tuple[type[Any], type[Any]]:
    """The data source classes (defined lazily: pyspark is imported only where needed)."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    @dataclass
    class FileMessage(WriterCommitMessage):
        path: str
        size: int
        rows: int

    class FilesWriter(DataSourceArrowWriter):
        def __init__(self, options: dict[str, str]) -> None:
            self.directory = options["path"]
            self.schema = _decode_schema(options["arrowschema"])
            self.options = options

        def write(self, iterator: Iterator[pa.RecordBatch]) -> Any:
            import pyarrow.parquet as pq

            name = f"part-{uuid.uuid4().hex}-{self.options.get('tag', 'w')}.snappy.parquet"
            path = os.path.join(self.directory, name)
            writer: pq.ParquetWriter | None = None
            rows = 0
            try:
                for batch in iterator:
                    if batch.num_rows == 0:
                        continue
                    table = cast_to(pa.Table.from_batches([batch]), self.schema)
                    if writer is None:
                        os.makedirs(self.directory, exist_ok=True)
                        writer = pq.ParquetWriter(path, self.schema, compression="snappy")
                    writer.write_table(table)
                    rows += batch.num_rows
            finally:
                if writer is not None:
                    writer.close()
            if writer is None:
                return FileMessage("", 0, 0)
            return FileMessage(name, os.path.getsize(path), rows)

        def commit(self, messages: Sequence[Any]) -> None:
            files = [m for m in messages if m is not None and m.path]
            _commit(
                DeltaTarget(self.directory),
                self.schema,
                files,
                app_id=self.options["appid"],
                version=int(self.options["version"]),
                metadata=json.loads(self.options.get("metadata", "{}")),
            )

        def abort(self, messages: Sequence[Any]) -> None:
            for m in messages:
                if m is not None and m.path:
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(self.directory, m.path))

    class FilesSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return FilesWriter(dict(self.options))

    return FilesSource, FileMessage


def _commit(
    target: DeltaTarget,
    schema: pa.Schema,
    files: Sequence[Any],
    *,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
) -> None:
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


_registered: set[int] = set()


def register(spark: Any) -> None:
    """Register the ``pgcdc_lake_files`` data source with a session (once per session)."""
    if id(spark) in _registered:
        return
    source, _ = _classes()
    spark.dataSource.register(source)
    _registered.add(id(spark))


def write_delta_files(
    df: Any,
    target: DeltaTarget,
    schema: pa.Schema,
    *,
    app_id: str,
    version: int,
    metadata: dict[str, Any],
    tag: str = "w",
) -> None:
    """Replace the Delta table at ``target`` by ``df``'s rows (written as ``schema``)."""
    register(df.sparkSession)
    Path(target.uri).mkdir(parents=True, exist_ok=True)
    (
        df.write.format(FORMAT)
        .mode("append")
        .option("path", target.uri)
        .option("arrowschema", _encode_schema(schema))
        .option("appid", app_id)
        .option("version", str(version))
        .option("metadata", json.dumps(metadata))
        .option("tag", tag)
        .save()
    )


def written_rows(target: DeltaTarget) -> int:
    """The row count the last ``write_delta_files`` commit recorded."""
    table = target.table()
    if table is None:
        return 0
    for commit in table.history(1):
        meta = commit.get("pgcdc")
        if isinstance(meta, dict) and "rows" in meta:
            return int(meta["rows"])
    return 0
