"""`make bench-latency`: commit-to-lake latency of a continuous ``pgcdc run`` at a steady rate.

A throwaway server has the standard table (``tools.bench.workload``); ``pgcdc run
--until-caught-up`` starts once (a trivial snapshot; the slot is created), then ``pgcdc run``
runs continuously in a subprocess (``local[2]``, ``trigger_interval`` 0.5 s). Once its stream
has applied a first (warm-up) row, one writer connection commits transactions of 50 inserted
rows at a steady pace, 5,000 changes/s (100 transactions/s) for 180 s at scale 1 (the duration
scales; at least 30 s).
Each transaction's rows have ids ``k*50+1 .. k*50+50`` and the writer notes the wall-clock time
its COMMIT returned.

Afterwards the mirror's Delta log is read: each commit's timestamp (``commitInfo.timestamp``,
the same machine's clock) and the largest ``id`` it added (from the add actions' statistics, or
the added Parquet files if a commit has none). Transaction ``k`` reached the lake with the first
commit whose running largest id covers its rows (the pipeline applies transactions in commit
order). Latency = that commit's time - the source commit's time; the first 5 s (the stream
settling) are left out. Reported: p50, p99, max, the achieved rate and the lake commits.

Goal: p99 under 2 s at 5,000 changes/s.

A second line, ``mixed`` in the result: the mixed workload of ``make bench-scale``
(``tools.bench.scale``: 2,000 changes/s, 70% updates and 10% deletes of random existing keys,
20% inserts, 20 changes a transaction; 120 s at scale 1, at least 30 s) on a modest pre-loaded
table of 100,000 rows (scaled, at least 10,000), beside the native subscriber's lag, measured as
``bench-scale`` measures it (its goal: p99 under 5 s). ``--workloads`` picks the lines.

Written to ``bench-results/latency.json``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from tools.bench.harness import (
    RESULTS_DIR,
    PgcdcRun,
    add_common_arguments,
    bench_cluster,
    connect,
    log,
    scaled,
    scratch_dir,
    stop_process,
    wait_for,
    write_result,
)
from tools.bench.workload import create_table, insert_rows

NAME = "latency"
GOAL_P99 = 2.0
MIXED_ROWS = 100_000
TABLE = "bench_items"
WARMUP = 5.0


def _say(text: str) -> None:
    log(NAME, text)


class Writer(threading.Thread):
    """Commits ``per_txn``-row insert transactions at ``rate`` changes/s for ``seconds``."""

    def __init__(self, dsn: str, rate: float, per_txn: int, seconds: float) -> None:
        super().__init__(name="bench-writer", daemon=True)
        self.dsn, self.rate, self.per_txn, self.seconds = dsn, rate, per_txn, seconds
        self.commits: list[tuple[int, float]] = []  # (last id, wall-clock commit time)
        self.error: BaseException | None = None
        self.elapsed = 0.0

    def run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                interval = self.per_txn / self.rate
                started = time.perf_counter()
                k = 0
                while True:
                    due = started + k * interval
                    if due - started >= self.seconds:
                        break
                    pause = due - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                    first = k * self.per_txn + 1
                    insert_rows(conn, TABLE, first, first + self.per_txn - 1)
                    self.commits.append((first + self.per_txn - 1, time.time()))
                    k += 1
                self.elapsed = time.perf_counter() - started
        except BaseException as exc:
            self.error = exc


def lake_commits(table_dir: Path) -> list[tuple[int, float, int]]:
    """``(version, commit time in s, largest id added so far)`` for each Delta commit."""
    out: list[tuple[int, float, int]] = []
    running = 0
    physical = "id"  # the column's name in the files and statistics (column mapping)
    for path in sorted((table_dir / "_delta_log").glob("*.json")):
        version = int(path.stem)
        stamp = None
        largest = running
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                stamp = action["commitInfo"].get("timestamp")
            if "metaData" in action:
                for field in json.loads(action["metaData"]["schemaString"])["fields"]:
                    if field["name"] == "id":
                        meta = field.get("metadata", {})
                        physical = meta.get("delta.columnMapping.physicalName", "id")
            add = action.get("add")
            if add is None or not add.get("dataChange", True):  # a compaction adds no rows
                continue
            stats = json.loads(add["stats"]) if add.get("stats") else {}
            top = stats.get("maxValues", {}).get(physical)
            if top is None and stats.get("numRecords", 1):
                file = table_dir / add["path"]
                column = pq.read_table(file, columns=[physical]).column(physical)
                top = max(column.to_pylist() or [0])
            largest = max(largest, int(top or 0))
        if stamp is None:
            stamp = int(path.stat().st_mtime * 1000)
        running = largest
        out.append((version, stamp / 1000.0, running))
    return out


def latencies(commits: list[tuple[int, float]], lake: list[tuple[int, float, int]]) -> list[float]:
    """Per source transaction (in commit order), seconds until the lake commit covering it."""
    out = []
    j = 0
    for last_id, at in commits:
        while j < len(lake) and lake[j][2] < last_id:
            j += 1
        if j == len(lake):
            break
        out.append(lake[j][1] - at)
    return out


def measure(scale: float, rate: float, per_txn: int, trigger: float) -> dict[str, Any]:
    seconds = max(30.0, 180.0 * scale)
    with (
        bench_cluster() as cluster,
        scratch_dir(NAME) as workdir,
        connect(cluster) as conn,
    ):
        create_table(conn, TABLE)
        pipeline = PgcdcRun(
            workdir,
            cluster.dsn(),
            [f"public.{TABLE}"],
            stream={"trigger_interval": trigger},
        )
        _say("pgcdc: first start (empty table)")
        pipeline.run().check("first start")
        _say(f"pgcdc run (continuous, trigger interval {trigger:g} s)")
        proc = pipeline.start()
        logfile = workdir / "run-continuous.log"
        try:
            wait_for(
                "the continuous stream to start",
                lambda: "stream started" in logfile.read_text() or proc.poll() is not None,
                timeout=300,
                interval=0.5,
            )
            if proc.poll() is not None:
                raise RuntimeError(f"pgcdc run exited:\n{logfile.read_text()[-4000:]}")
            # warm up: one row with a negative id, until the lake has it (the stream's Python
            # workers have started and a batch went through)
            table_dir = pipeline.lake / "public" / TABLE
            before = len(lake_commits(table_dir))
            insert_rows(conn, TABLE, -1, -1)
            wait_for(
                "the first batch of the continuous run",
                lambda: len(lake_commits(table_dir)) > before,
                timeout=300,
                interval=0.2,
            )
            time.sleep(2)
            _say(f"writer: {rate:,.0f} changes/s in transactions of {per_txn} for {seconds:.0f} s")
            writer = Writer(cluster.dsn(), rate, per_txn, seconds)
            writer.start()
            writer.join()
            if writer.error is not None:
                raise writer.error
            total = len(writer.commits) * per_txn
            _say(f"waiting for the lake to have all {total:,} rows")
            wait_for(
                "the mirror to have every row",
                lambda: bool(lake_commits(table_dir)) and lake_commits(table_dir)[-1][2] >= total,
                timeout=600,
                interval=1.0,
            )
        finally:
            stop_process(proc)
        lake = lake_commits(table_dir)
    start = writer.commits[0][1] + WARMUP if writer.commits else 0.0
    kept = [(i, t) for i, t in writer.commits if t >= start]
    values = np.array(latencies(kept, lake))
    achieved = len(writer.commits) * per_txn / writer.elapsed
    p50, p99 = (float(np.percentile(values, q)) for q in (50, 99))
    in_window = [v for v in lake if v[1] >= start]
    return {
        "target_changes_per_second": rate,
        "achieved_changes_per_second": achieved,
        "rows_per_transaction": per_txn,
        "seconds": seconds,
        "trigger_interval": trigger,
        "transactions": len(writer.commits),
        "transactions_measured": len(values),
        "latency_seconds": {
            "p50": p50,
            "p90": float(np.percentile(values, 90)),
            "p99": p99,
            "max": float(values.max()),
            "mean": float(values.mean()),
        },
        "lake_commits": len(in_window),
        "seconds_between_lake_commits": (
            float(np.diff([v[1] for v in in_window]).mean()) if len(in_window) > 1 else None
        ),
        "goals": {
            "p99_below": GOAL_P99,
            "p99_met": p99 < GOAL_P99,
            "rate_met": achieved >= 0.95 * rate,
        },
        "pgcdc_mode": "subprocess: python -m pgcdc run (continuous, own JVM, local[2])",
    }


def measure_mixed(scale: float, trigger: float) -> dict[str, Any]:
    """The second line: ``bench-scale``'s mixed workload on a modest pre-loaded table."""
    from tools.bench import scale as bench_scale

    rows = scaled(MIXED_ROWS, scale, minimum=10_000)
    seconds = max(bench_scale.MIN_SECONDS, bench_scale.SECONDS * scale)
    result = bench_scale.run_mixed(rows, seconds=seconds, trigger=trigger, name=f"{NAME}-mixed")
    p99 = result["latency_seconds"]["p99"]
    result["trigger_interval"] = trigger
    result["goals"] = {
        "p99_below": bench_scale.GOAL_P99,
        "p99_met": p99 is not None and p99 < bench_scale.GOAL_P99,
        "rate_met": result["workload"]["achieved_changes_per_second"]
        >= 0.95 * result["workload"]["target_changes_per_second"],
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.latency", description=__doc__)
    add_common_arguments(parser)
    parser.add_argument("--rate", type=float, default=5000.0, help="changes per second")
    parser.add_argument("--rows", type=int, default=50, help="rows per transaction")
    parser.add_argument("--trigger", type=float, default=0.5, help="trigger interval, seconds")
    parser.add_argument(
        "--workloads",
        default="inserts,mixed",
        help="the lines to measure, comma-separated: inserts (the first line), mixed; default both",
    )
    args = parser.parse_args(argv)
    lines = {w.strip() for w in args.workloads.split(",") if w.strip()}
    if not lines or lines - {"inserts", "mixed"}:
        parser.error(f"--workloads takes inserts and/or mixed, not {args.workloads!r}")
    result: dict[str, Any] = {}
    if "inserts" in lines:
        result = measure(args.scale, args.rate, args.rows, args.trigger)
    elif RESULTS_DIR.joinpath(f"{NAME}.json").exists():
        # the mixed line alone: the first line's last result stays (with its own scale)
        kept = json.loads(RESULTS_DIR.joinpath(f"{NAME}.json").read_text())
        result = {k: v for k, v in kept.items() if k not in ("benchmark", "machine", "mixed")}
    if "mixed" in lines:
        result["mixed"] = measure_mixed(args.scale, args.trigger)
        result["mixed"]["scale"] = args.scale
    path = write_result(NAME, result.pop("scale", args.scale), result)
    if "latency_seconds" in result:
        lat = result["latency_seconds"]
        print(
            f"\ncommit-to-lake latency at {result['achieved_changes_per_second']:,.0f} "
            f"changes/s (target {args.rate:,.0f}) for {result['seconds']:.0f} s "
            f"(scale {args.scale:g})"
        )
        print(f"p50 {lat['p50']:.2f} s, p99 {lat['p99']:.2f} s, max {lat['max']:.2f} s")
        print(f"p99 under {GOAL_P99:g} s: {result['goals']['p99_met']}")
    if "mixed" in result:
        mixed = result["mixed"]
        lat, nat = mixed["latency_seconds"], mixed["native_lag_seconds"]
        print(
            f"mixed workload at {mixed['workload']['achieved_changes_per_second']:,.0f} "
            f"changes/s on {mixed['rows']:,} rows: p50 {lat['p50']:.2f} s, p99 "
            f"{lat['p99']:.2f} s, max {lat['max']:.2f} s; native subscriber p50 "
            f"{nat['p50']:.3f} s, p99 {nat['p99']:.3f} s, max {nat['max']:.3f} s"
        )
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
