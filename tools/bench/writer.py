"""``python -m tools.bench.writer``: the lake's batch writer alone over many generated tables.

A profiling aid, not a benchmark (it has no anchor and records no result): it drives
``LakeBatchWriter`` with micro-batches built in Spark from Python rows (no PostgreSQL, no
stream), so that a batch's driver work can be timed and profiled apart from the source, the
receiver and the streaming engine. The tables are bench-wide's (``id bigint`` key, an integer,
a 40-character text, a ``numeric(12,2)``, a timestamp); the first batch inserts ``--rows`` rows
into every table (creating the Delta tables), each later one is ``--changes`` changes in
transactions of 10 over 1 to 3 random tables (70% updates, 20% inserts, 10% deletes of random
live keys), as bench-wide's workload. Prints each batch's time and, at ``--log-level DEBUG``,
the writer's own timing lines (overview, planning, indexes, files, commits).

    .venv/bin/python -m tools.bench.writer --tables 100 --batches 5 --log-level DEBUG
    .venv/bin/py-spy record -o out.txt --format raw -- .venv/bin/python -m tools.bench.writer
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

T0 = datetime(2024, 1, 1, tzinfo=UTC)


class Tables:
    """N tables' live keys and the source DataFrame rows of their changes."""

    def __init__(self, count: int, seed: int) -> None:
        self.count = count
        self.random = random.Random(seed)
        self.live: list[list[int]] = [[] for _ in range(count)]
        self.next_key = [1] * count
        self.lsn = 1000

    def _image(self, key: int) -> tuple[Any, ...]:
        return (
            key,
            key % 1000,
            f"{key:040d}",
            Decimal(key % 100000) / Decimal(100),
            T0 + timedelta(seconds=key),
        )

    def _row(self, table: int, op: str, pos: int, key: int) -> tuple[Any, ...]:
        image = self._image(key)
        new, old = (None, image) if op == "D" else (image, None)
        structs: list[Any] = [None] * self.count
        structs[table] = (new, old, None if old is None else "K", [])
        name = f"t{table + 1:03d}"
        return (
            f"probe.{name}",
            "probe",
            name,
            op,
            self.lsn,
            f"0/{self.lsn:X}",
            self.lsn + 8,
            pos,
            self.lsn // 10,
            T0 + timedelta(milliseconds=self.lsn),
            *structs,
        )

    def load(self, rows: int) -> list[tuple[Any, ...]]:
        out = []
        for t in range(self.count):
            self.lsn += 10
            for pos in range(rows):
                key = self.next_key[t]
                self.next_key[t] += 1
                self.live[t].append(key)
                out.append(self._row(t, "I", pos, key))
        return out

    def changes(self, count: int) -> list[tuple[Any, ...]]:
        r = self.random
        out: list[tuple[Any, ...]] = []
        while len(out) < count:
            self.lsn += 10
            picked = r.sample(range(self.count), r.randint(1, 3))
            for pos, op in enumerate(["U"] * 7 + ["I"] * 2 + ["D"]):
                t = picked[pos % len(picked)]
                if op == "I" or not self.live[t]:
                    key = self.next_key[t]
                    self.next_key[t] += 1
                    self.live[t].append(key)
                    out.append(self._row(t, "I", pos, key))
                    continue
                i = r.randrange(len(self.live[t]))
                key = self.live[t][i]
                if op == "D":
                    self.live[t][i] = self.live[t][-1]
                    self.live[t].pop()
                out.append(self._row(t, op, pos, key))
        return out


def source_schema(count: int) -> Any:
    from pyspark.sql import types as T

    from pgcdc.spark import table_column

    image = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("qty", T.IntegerType()),
            T.StructField("note", T.StringType()),
            T.StructField("price", T.DecimalType(12, 2)),
            T.StructField("updated_at", T.TimestampType()),
        ]
    )
    struct = T.StructType(
        [
            T.StructField("new", image),
            T.StructField("old", image),
            T.StructField("old_kind", T.StringType()),
            T.StructField("unchanged", T.ArrayType(T.StringType())),
        ]
    )
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
            *[T.StructField(table_column("probe", f"t{i + 1:03d}"), struct) for i in range(count)],
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.writer", description=__doc__)
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--rows", type=int, default=1000, help="rows a table in the first batch")
    parser.add_argument("--batches", type=int, default=5, help="batches after the first")
    parser.add_argument("--changes", type=int, default=3000, help="changes a batch")
    parser.add_argument("--history", action="store_true", help="history and changelog on")
    parser.add_argument("--merge", action="store_true", help='[lake] write = "merge"')
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        type=lambda text: tuple(text.split("=", 1)),
        help="a Spark setting KEY=VALUE for the session (repeatable)",
    )
    parser.add_argument("--lake", type=Path, help="the lake's folder (default: a scratch one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from pgcdc.lake.store.delta import delta_settings, local_file_system, quiet_logs
    from pgcdc.lake.store.tables import LakeTable
    from pgcdc.lake.write.batch import LakeBatchWriter, table_column_pairs
    from pgcdc.spark import spark_session

    conf = delta_settings({"spark.sql.adaptive.enabled": "false", **dict(args.conf)})
    local_file_system(conf)
    spark = spark_session(
        "local[2]",
        "pgcdc-writer-profile",
        conf=conf,
        class_data_sharing=False,
    )
    spark.sparkContext.setLogLevel("ERROR")
    quiet_logs(spark)
    lake = args.lake or Path(tempfile.mkdtemp(prefix="pgcdc-writer-"))
    tables = tuple(
        LakeTable(
            "probe",
            f"t{i + 1:03d}",
            ("id",),
            "d",
            history=args.history,
            changelog=args.history,
        )
        for i in range(args.tables)
    )
    writer = LakeBatchWriter(
        lake=str(lake),
        tables=tables,
        table_columns=table_column_pairs(tables),
        app_id="writer-profile",
        indexed=not args.merge,
    )
    source = Tables(args.tables, seed=42)
    schema = source_schema(args.tables)
    try:
        for batch_id in range(args.batches + 1):
            rows = source.load(args.rows) if batch_id == 0 else source.changes(args.changes)
            df = spark.createDataFrame(rows, schema)
            started = time.monotonic()
            writer(df, batch_id)
            print(
                f"batch {batch_id}: {len(rows)} changes in {time.monotonic() - started:.2f} s",
                flush=True,
            )
    finally:
        spark.stop()
        if args.lake is None:
            shutil.rmtree(lake, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
