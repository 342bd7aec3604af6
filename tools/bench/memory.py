"""`make bench-memory`: peak memory of ``pgcdc run`` for one big transaction, streaming on/off.

A throwaway server has one table per measurement (``id bigint PRIMARY KEY, payload text`` with
a 1,000-byte payload: about 1 kB of WAL and of pgoutput per row); ``pgcdc run
--until-caught-up`` starts once on the empty tables (a trivial snapshot; the slot is created).
Then, per measurement, one transaction inserts rows into its own table until its WAL reaches
the size (0.25, 0.5, 1 and 2 GB at scale 1), and ``pgcdc run --until-caught-up`` (a subprocess,
``local[2]``, Spark's default 1 GB driver heap) applies it while a sampler reads
``/proc/<pid>/smaps_rollup`` of every process in its tree (the Python driver, the JVM, Spark's
Python workers) every 0.2 s. The peak of the summed RSS is the figure (PSS, which counts shared
pages once, is recorded too); a child caught between fork and exec (pyspark's driver starting
the JVM, a JVM starting a Python worker) is counted once with its parent
(``harness.tree_memory``), where results before counted such a sample's parent twice.

Streaming: pgcdc's receiver always asks for ``streaming 'on'`` (pgoutput protocol 2+), so
whether the pipeline gets the transaction in pieces while it is decoded is the server's choice:
``on`` is ``logical_decoding_work_mem = 64MB`` (the default; the server streams the transaction
in chunks of about 64 MB before its commit), ``off`` is ``logical_decoding_work_mem = 16GB`` (the
server never streams, and sends the transaction whole after its commit: what the pipeline would
receive with streaming off; the server keeps it in its own memory, not the pipeline's).

A run that fails (the pipeline running out of memory) is recorded with its error, and that
mode's larger sizes are skipped. Each mode has its own pipeline (slot, publication, lake).

``--driver-memory 512m`` measures with that driver heap (``spark.driver.memory``; the JVM's
heap grows to its limit under load, so the limit is what the JVM peaks at) and writes
``bench-results/memory-driver-512m.json`` instead.

Goal: peak under 1 GB, and flat as the transaction grows. Written to
``bench-results/memory.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from tools.bench.harness import (
    PgcdcRun,
    RunOutcome,
    add_common_arguments,
    bench_cluster,
    connect,
    log,
    scalar,
    scratch_dir,
    write_result,
)

NAME = "memory"
GOAL_BYTES = 1 << 30
FULL_SIZES_GB = (0.25, 0.5, 1.0, 2.0)
MODES = {"on": "64MB", "off": "16GB"}
PAYLOAD = 1000
ROWS_PER_STATEMENT = 100_000

_INSERT = """
INSERT INTO {table}
SELECT g, repeat(md5(g::text), %(repeat)s)
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""


def _say(text: str) -> None:
    log(NAME, text)


def _table(mode: str, index: int) -> str:
    return f"mem_{mode}_{index}"


def big_transaction(conn: Any, table: str, target_bytes: int) -> tuple[int, int, float]:
    """One transaction inserting rows until its WAL reaches ``target_bytes``; (rows, WAL
    bytes, seconds)."""
    started = time.perf_counter()
    rows = 0
    insert = sql.SQL(_INSERT).format(table=sql.Identifier(table))
    with conn.transaction():
        start_lsn = scalar(conn, "SELECT pg_current_wal_insert_lsn()")
        wal = 0
        while wal < target_bytes:
            step = min(ROWS_PER_STATEMENT, max(1000, (target_bytes - wal) // (PAYLOAD + 100)))
            conn.execute(insert, {"first": rows + 1, "last": rows + step, "repeat": PAYLOAD // 32})
            rows += step
            wal = int(
                scalar(
                    conn,
                    "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)",
                    (start_lsn,),
                )
            )
    return rows, wal, time.perf_counter() - started


def measure(
    scale: float, modes: Sequence[str] = tuple(MODES), driver_memory: str | None = None
) -> dict[str, Any]:
    sizes = [max(1 << 20, round(gb * scale * (1 << 30))) for gb in FULL_SIZES_GB]
    chosen = {mode: MODES[mode] for mode in modes}
    runs: list[dict[str, Any]] = []
    with (
        bench_cluster() as cluster,
        scratch_dir(NAME) as workdir,
        connect(cluster) as conn,
    ):
        tables = [_table(mode, i) for mode in chosen for i in range(len(sizes))]
        for table in tables:
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, payload text)").format(
                    sql.Identifier(table)
                )
            )
        idle: RunOutcome | None = None
        for mode, work_mem in chosen.items():
            conn.execute(
                sql.SQL("ALTER SYSTEM SET logical_decoding_work_mem = {}").format(
                    sql.Literal(work_mem)
                )
            )
            conn.execute("SELECT pg_reload_conf()")
            # a pipeline per mode (its own slot and lake): a failed run leaves its transaction
            # unapplied, and it must not be replayed into the other mode's runs
            (workdir / mode).mkdir()
            pipeline = PgcdcRun(
                workdir / mode,
                cluster.dsn(),
                [f"public.{_table(mode, i)}" for i in range(len(sizes))],
                slot=f"pgcdc_mem_{mode}",
                publication=f"pgcdc_mem_{mode}",
                spark_conf={"spark.driver.memory": driver_memory} if driver_memory else {},
            )
            _say(f"streaming {mode}: pgcdc first start (empty tables)")
            pipeline.run().check("first start")
            if idle is None:
                _say("pgcdc: a start with nothing to do (the baseline)")
                idle = pipeline.run(sample_memory=True).check("idle start")
            for i, size in enumerate(sizes):
                table = _table(mode, i)
                rows, wal, write_seconds = big_transaction(conn, table, size)
                _say(
                    f"streaming {mode}: one transaction of {rows:,} rows, {wal / 1e6:,.0f} MB "
                    f"of WAL ({write_seconds:.0f} s); pgcdc run --until-caught-up"
                )
                run = pipeline.run(sample_memory=True)
                error = None if run.returncode == 0 else run.error_lines()
                runs.append(
                    {
                        "streaming": mode,
                        "logical_decoding_work_mem": work_mem,
                        "target_bytes": size,
                        "rows": rows,
                        "wal_bytes": wal,
                        "seconds": run.seconds,
                        "peak_rss_bytes": run.peak_rss_kb * 1024,
                        "peak_pss_bytes": run.peak_pss_kb * 1024,
                        "peak_rss_by_process_bytes": {
                            k: v * 1024 for k, v in run.rss_by_process_kb.items()
                        },
                        "changes": run.stream_changes,
                        # children caught between fork and exec, counted once (harness)
                        "pre_exec_samples": run.pre_exec_samples,
                        "pre_exec_discounted_max_bytes": run.pre_exec_max_rss_kb * 1024,
                        "failed": error,
                    }
                )
                _say(
                    f"  peak RSS {run.peak_rss_kb / 2**20:.2f} GiB, "
                    f"PSS {run.peak_pss_kb / 2**20:.2f} GiB in {run.seconds:.0f} s"
                    + (f"; FAILED: {error}" if error else "")
                )
                if error:
                    break  # the next run would replay this transaction first
    assert idle is not None
    peak = max(r["peak_rss_bytes"] for r in runs)
    growth = {}
    for mode in chosen:
        mine = [r for r in runs if r["streaming"] == mode]
        growth[mode] = mine[-1]["peak_rss_bytes"] / max(mine[0]["peak_rss_bytes"], 1)
    flat = all(g <= 1.25 for g in growth.values()) and not any(r["failed"] for r in runs)
    return {
        "sizes_bytes": sizes,
        "idle_run": {
            "peak_rss_bytes": idle.peak_rss_kb * 1024,
            "peak_pss_bytes": idle.peak_pss_kb * 1024,
            "seconds": idle.seconds,
        },
        "runs": runs,
        "peak_rss_bytes": peak,
        "growth_largest_to_smallest": growth,
        "goals": {
            "peak_below_bytes": GOAL_BYTES,
            "peak_met": peak < GOAL_BYTES,
            "flat_within": 1.25,
            "flat_met": flat,
        },
        "pgcdc_mode": "subprocess: python -m pgcdc run --until-caught-up (own JVM, local[2])",
        "driver_memory": driver_memory or "Spark's default (1g)",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.memory", description=__doc__)
    add_common_arguments(parser)
    parser.add_argument(
        "--modes",
        default="on,off",
        help="streaming modes to measure, comma-separated (on: the server streams the "
        "transaction, off: it sends it whole); default on,off",
    )
    parser.add_argument(
        "--driver-memory",
        default=None,
        help="spark.driver.memory of the measured runs (e.g. 512m); the result goes to "
        "memory-driver-<size>.json",
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes takes on and/or off, not {args.modes!r}")
    result = measure(args.scale, modes, args.driver_memory)
    name = f"{NAME}-driver-{args.driver_memory}" if args.driver_memory else NAME
    path = write_result(name, args.scale, result)
    print(f"\npeak memory of pgcdc run, one transaction (scale {args.scale:g})")
    print(f"{'streaming':<11}{'WAL MB':>9}{'peak RSS MiB':>14}{'peak PSS MiB':>14}{'s':>7}")
    for r in result["runs"]:
        print(
            f"{r['streaming']:<11}{r['wal_bytes'] / 1e6:>9,.0f}"
            f"{r['peak_rss_bytes'] / 2**20:>14,.0f}{r['peak_pss_bytes'] / 2**20:>14,.0f}"
            f"{r['seconds']:>7.0f}"
        )
    goals = result["goals"]
    print(f"under 1 GB: {goals['peak_met']}; flat: {goals['flat_met']}")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
