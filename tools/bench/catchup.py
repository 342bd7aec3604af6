"""`make bench-catchup`: end-to-end catch-up time of pgcdc next to PostgreSQL's own replication.

On a throwaway source server, the standard table (``tools.bench.workload``) is set up with
three consumers that all retain the WAL from before the workload:

* pgcdc: ``pgcdc run --until-caught-up`` started once on the empty table (a trivial snapshot;
  the slot then holds the WAL), and once more with nothing to do (its fixed cost: Python, the
  JVM, Spark, the query's start and end);
* the native subscriber: a second throwaway server with the same tables and ``CREATE
  SUBSCRIPTION ... WITH (copy_data = false, enabled = false)`` (its slot is created then);
* ``pg_recvlogical`` on a pgoutput slot of the same publication: the rate the server can
  decode and send, the physical limit.

Then the workload runs (1M inserts, 250k updates, 100k deletes at scale 1, in transactions of
10,000 changes) and a marker transaction last. Each consumer is then timed alone over the same
WAL, one after another:

1. ``pg_recvlogical --start --endpos <end> -f /dev/null -o proto_version=1
   -o publication_names=...`` (pgoutput, the same publication), until it exits at the end LSN;
2. ``ALTER SUBSCRIPTION ... ENABLE``, until the subscriber has the marker row (apply is in
   commit order, so everything before it is applied); its row count is checked after;
3. ``pgcdc run --until-caught-up`` in a subprocess, as a user runs it, until it exits (its time
   includes the fixed cost; the time without it is reported too); the mirror's row count is
   checked after.

Goal: pgcdc's time within 1.2x of the native subscriber's. Written to
``bench-results/catchup.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from psycopg import sql

from pgcdc.lake.store.target import DeltaTarget
from tools.bench.harness import (
    PgcdcRun,
    add_common_arguments,
    bench_cluster,
    client_program,
    connect,
    log,
    scalar,
    scratch_dir,
    wait_for,
    write_result,
)
from tools.bench.workload import CatchUpWorkload, create_table

NAME = "catchup"
GOAL_RATIO = 1.2
TABLE = "bench_items"
MARKER = "bench_marker"


def q(template: str) -> sql.Composed:
    """SQL naming the benchmark's tables as ``{table}`` and ``{marker}``."""
    return sql.SQL(template).format(table=sql.Identifier(TABLE), marker=sql.Identifier(MARKER))


def _say(text: str) -> None:
    log(NAME, text)


def mirror_rows(lake_table: str) -> int:
    return DeltaTarget(lake_table).count()


@contextlib.contextmanager
def s3_lake(workdir: Path) -> Iterator[tuple[str, str]]:
    """An S3Proxy server on loopback (the tests' S3 server) with a bucket: the lake's URI and
    its ``[lake.s3]``; its keys in this process's environment, which the runs inherit."""
    from tests.fix_s3 import S3ProxyServer, s3_client, s3_env

    server = S3ProxyServer(workdir / "s3proxy")
    server.start()
    try:
        os.environ.update(s3_env(server))
        s3_client(server).create_bucket(Bucket="pgcdc-bench")
        yield (
            "s3://pgcdc-bench/lake",
            (f'[lake.s3]\nendpoint = "{server.endpoint}"\npath_style = true\n'),
        )
    finally:
        server.stop()


def measure(scale: float, *, s3: bool = False) -> dict[str, Any]:
    work = CatchUpWorkload.at_scale(scale)
    with (
        bench_cluster() as source,
        bench_cluster() as target,
        scratch_dir(NAME) as workdir,
        connect(source) as src,
        connect(target) as dst,
        contextlib.ExitStack() as stack,
    ):
        for conn in (src, dst):
            create_table(conn, TABLE)
            conn.execute(q("CREATE TABLE {marker} (id int PRIMARY KEY, at timestamptz)"))
        src.execute(q("CREATE PUBLICATION native_pub FOR TABLE {table}, {marker}"))
        lake_uri, lake_extra = stack.enter_context(s3_lake(workdir)) if s3 else (None, "")
        pipeline = PgcdcRun(
            workdir,
            source.dsn(),
            [f"public.{TABLE}", f"public.{MARKER}"],
            master="local[2]",
            lake_uri=lake_uri,
            lake_extra=lake_extra,
        )
        _say("pgcdc: first start (empty tables: a trivial snapshot, creates the slot)")
        first = pipeline.run().check("first start")
        dst.execute(
            sql.SQL(
                "CREATE SUBSCRIPTION native CONNECTION {} PUBLICATION native_pub WITH "
                "(copy_data = false, enabled = false, create_slot = true, slot_name = "
                "'native_sub')"
            ).format(sql.Literal(source.dsn()))
        )
        src.execute("SELECT pg_create_logical_replication_slot('recv_bench', 'pgoutput')")
        _say("pgcdc: a start with nothing to do (its fixed cost)")
        idle = pipeline.run().check("idle start")

        _say(
            f"workload: {work.inserts:,} inserts, {work.updates:,} updates, "
            f"{work.deletes:,} deletes, {work.batch:,} changes per transaction"
        )
        start_lsn = scalar(src, "SELECT pg_current_wal_lsn()")
        started = time.perf_counter()
        work.run(src, TABLE)
        src.execute(q("INSERT INTO {marker} VALUES (1, now())"))
        workload_seconds = time.perf_counter() - started
        end_lsn = scalar(src, "SELECT pg_current_wal_lsn()")
        wal_bytes = int(scalar(src, "SELECT pg_wal_lsn_diff(%s, %s)", (end_lsn, start_lsn)))
        _say(f"workload took {workload_seconds:.1f} s, {wal_bytes / 1e6:.0f} MB of WAL")

        _say("pg_recvlogical into /dev/null")
        argv = [
            str(client_program("pg_recvlogical")),
            "-d",
            source.dsn(),
            "--slot",
            "recv_bench",
            "--start",
            "--no-loop",
            "--endpos",
            str(end_lsn),
            "-f",
            "/dev/null",
            "-o",
            "proto_version=1",
            "-o",
            "publication_names=native_pub",
        ]
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        recv_seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"pg_recvlogical failed: {proc.stderr.strip()}")

        _say("native subscription")
        started = time.perf_counter()
        dst.execute("ALTER SUBSCRIPTION native ENABLE")
        wait_for(
            "the native subscriber applying the marker",
            lambda: scalar(dst, q("SELECT count(*) FROM {marker}")) == 1,
            timeout=3 * 3600,
        )
        native_seconds = time.perf_counter() - started
        native_rows = scalar(dst, q("SELECT count(*) FROM {table}"))
        dst.execute("ALTER SUBSCRIPTION native DISABLE")

        _say("pgcdc run --until-caught-up")
        run = pipeline.run().check("catch-up")
        rows = mirror_rows(pipeline.table_uri(TABLE))
        source_rows = scalar(src, q("SELECT count(*) FROM {table}"))
        dst.execute("ALTER SUBSCRIPTION native SET (slot_name = NONE)")
        dst.execute("DROP SUBSCRIPTION native")

    changes = work.changes
    pgcdc_stream = max(run.seconds - idle.seconds, 1e-9)
    ratio = run.seconds / native_seconds
    result = {
        "workload": {
            "inserts": work.inserts,
            "updates": work.updates,
            "deletes": work.deletes,
            "changes": changes,
            "changes_per_transaction": work.batch,
            "wal_bytes": wal_bytes,
            "workload_seconds": workload_seconds,
            "rows_after": source_rows,
        },
        "seconds": {
            "pgcdc": run.seconds,
            "pgcdc_without_fixed_cost": pgcdc_stream,
            "pgcdc_fixed_cost": idle.seconds,
            "pgcdc_first_start": first.seconds,
            "native_subscription": native_seconds,
            "pg_recvlogical": recv_seconds,
        },
        "changes_per_second": {
            "pgcdc": changes / run.seconds,
            "pgcdc_without_fixed_cost": changes / pgcdc_stream,
            "native_subscription": changes / native_seconds,
            "pg_recvlogical": changes / recv_seconds,
        },
        "pgcdc_batches": run.stream_batches,
        "pgcdc_batch_seconds": [
            {"changes": changes, "seconds": seconds} for changes, seconds in run.batches
        ],
        "pgcdc_changes": run.stream_changes,
        "rows_check": {
            "source": source_rows,
            "pgcdc_mirror": rows,
            "native_subscriber": native_rows,
            "equal": rows == source_rows == native_rows,
        },
        "ratio_pgcdc_to_native": ratio,
        "ratio_pgcdc_without_fixed_cost_to_native": pgcdc_stream / native_seconds,
        "ratio_pgcdc_to_pg_recvlogical": run.seconds / recv_seconds,
        "goals": {"ratio_at_most": GOAL_RATIO, "ratio_met": ratio <= GOAL_RATIO},
        "pgcdc_mode": "subprocess: python -m pgcdc run --until-caught-up (own JVM, local[2])",
        "lake": "S3Proxy on loopback (s3a://, filesystem backend)" if s3 else "local folder",
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.catchup", description=__doc__)
    add_common_arguments(parser)
    parser.add_argument(
        "--s3",
        action="store_true",
        help="the lake in a bucket of an S3-compatible server on loopback (S3Proxy)",
    )
    args = parser.parse_args(argv)
    result = measure(args.scale, s3=args.s3)
    # a larger run (where start-up counts less) is a variant beside the scale-1 result
    name = f"{NAME}-x{args.scale:g}" if args.scale > 1 else NAME
    if args.s3:
        name += "-s3"
    path = write_result(name, args.scale, result)
    s = result["seconds"]
    print(f"\ncatch-up of {result['workload']['changes']:,} changes (scale {args.scale:g})")
    for key in ("pg_recvlogical", "native_subscription", "pgcdc", "pgcdc_without_fixed_cost"):
        print(f"{key:<28}{s[key]:>9.1f} s")
    print(
        f"pgcdc / native: {result['ratio_pgcdc_to_native']:.2f}x (goal <= {GOAL_RATIO}); "
        f"rows equal: {result['rows_check']['equal']}"
    )
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
