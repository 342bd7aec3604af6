"""`make bench-snapshot`: pgcdc's initial snapshot into the lake next to ``COPY ... TO STDOUT``.

A throwaway server gets the standard ten-column table (``tools.bench.workload``) with 10M rows
at scale 1, vacuumed and frozen (so neither reader pays for setting hint bits). Then, on the
same table:

* the anchor: ``psql -c "COPY (SELECT * FROM bench_items) TO STDOUT" > /dev/null``, the fastest
  way to read a table out of PostgreSQL, best of two runs (the first also warms the cache);
* pgcdc: ``pgcdc run --until-caught-up`` on a new lake (first start: publication, slot with an
  exported snapshot, the parallel copy into the Delta mirror, committed, then an empty stream),
  in a subprocess as a user runs it, ``local[2]``. The headline time is the snapshot phase as
  the pipeline reports it (``snapshot: N rows ... in X s``, which includes starting the Spark
  session); the process's whole wall time and the same first start on an empty table (the
  fixed cost) are recorded too.

Goal: pgcdc's rows/s at least 0.9x of COPY's (issue 25: keep the copy as fast as it was).
Written to ``bench-results/snapshot.json``.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Sequence
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
    scaled,
    scratch_dir,
    write_result,
)
from tools.bench.workload import create_table, insert_rows

NAME = "snapshot"
GOAL_RATIO = 0.9
TABLE = "bench_items"
EMPTY = "bench_empty"
FULL_ROWS = 10_000_000


def _say(text: str) -> None:
    log(NAME, text)


def measure(scale: float) -> dict[str, Any]:
    rows = scaled(FULL_ROWS, scale, minimum=10_000)
    with (
        bench_cluster() as cluster,
        scratch_dir(NAME) as workdir,
        connect(cluster) as conn,
    ):
        create_table(conn, TABLE)
        create_table(conn, EMPTY)
        _say(f"loading {rows:,} rows")
        started = time.perf_counter()
        step = 1_000_000
        for first in range(1, rows + 1, step):
            insert_rows(conn, TABLE, first, min(first + step - 1, rows))
        conn.execute(sql.SQL("VACUUM (FREEZE, ANALYZE) {}").format(sql.Identifier(TABLE)))
        _say(f"loaded in {time.perf_counter() - started:.0f} s")
        table_bytes = int(scalar(conn, "SELECT pg_table_size(%s)", (TABLE,)))

        copy_argv = [
            str(client_program("psql")),
            "-X",
            "-q",
            "-d",
            cluster.dsn(),
            "-c",
            sql.SQL("COPY (SELECT * FROM {}) TO STDOUT")
            .format(sql.Identifier(TABLE))
            .as_string(conn),
        ]
        copy_runs = []
        for attempt in range(2):
            _say(f"COPY ... TO STDOUT > /dev/null ({attempt + 1} of 2)")
            started = time.perf_counter()
            subprocess.run(copy_argv, stdout=subprocess.DEVNULL, check=True)
            copy_runs.append(time.perf_counter() - started)
        copy_seconds = min(copy_runs)

        empty_dir = workdir / "empty"
        empty_dir.mkdir()
        _say("pgcdc: first start on an empty table (the fixed cost)")
        empty = PgcdcRun(
            empty_dir, cluster.dsn(), [f"public.{EMPTY}"], slot="bench_empty", publication="empty"
        ).run()
        empty.check("empty snapshot")

        full_dir = workdir / "full"
        full_dir.mkdir()
        _say("pgcdc: first start on the table (snapshot into the lake)")
        pipeline = PgcdcRun(full_dir, cluster.dsn(), [f"public.{TABLE}"])
        run = pipeline.run().check("snapshot")
        lake_rows = DeltaTarget(pipeline.lake / "public" / TABLE).count()

    snapshot_seconds = run.snapshot_seconds or run.seconds
    fixed = empty.snapshot_seconds or 0.0
    ratio = copy_seconds / snapshot_seconds
    return {
        "rows": rows,
        "table_bytes": table_bytes,
        "seconds": {
            "copy_to_stdout": copy_seconds,
            "copy_runs": copy_runs,
            "pgcdc_snapshot": snapshot_seconds,
            "pgcdc_snapshot_without_fixed_cost": max(snapshot_seconds - fixed, 1e-9),
            "pgcdc_snapshot_of_empty_table": fixed,
            "pgcdc_process": run.seconds,
            "pgcdc_process_empty_table": empty.seconds,
        },
        "rows_per_second": {
            "copy_to_stdout": rows / copy_seconds,
            "pgcdc_snapshot": rows / snapshot_seconds,
            "pgcdc_snapshot_without_fixed_cost": rows / max(snapshot_seconds - fixed, 1e-9),
        },
        "lake_rows": lake_rows,
        "rows_equal": lake_rows == rows,
        "ratio_pgcdc_to_copy": ratio,
        "ratio_pgcdc_without_fixed_cost_to_copy": copy_seconds
        / max(snapshot_seconds - fixed, 1e-9),
        "goals": {"ratio_at_least": GOAL_RATIO, "ratio_met": ratio >= GOAL_RATIO},
        "pgcdc_mode": "subprocess: python -m pgcdc run --until-caught-up (own JVM, local[2])",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.snapshot", description=__doc__)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    result = measure(args.scale)
    path = write_result(NAME, args.scale, result)
    s, r = result["seconds"], result["rows_per_second"]
    print(f"\ninitial snapshot of {result['rows']:,} rows (scale {args.scale:g})")
    for key in ("copy_to_stdout", "pgcdc_snapshot", "pgcdc_snapshot_without_fixed_cost"):
        print(f"{key:<36}{s[key]:>9.1f} s{r[key]:>14,.0f} rows/s")
    print(
        f"pgcdc / COPY: {result['ratio_pgcdc_to_copy']:.2f}x (goal >= {GOAL_RATIO}); "
        f"rows equal: {result['rows_equal']}"
    )
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
