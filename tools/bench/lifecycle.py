"""`make bench-lifecycle`: a 1M-row table added to a running pipeline while 2,000 changes/s
stream into the others (issue 43's benchmark).

On one throwaway server:

1. Setup, not measured: 10 tables ``probe.t01 ...`` of 10,000 rows (``bench-wide``'s shape: an
   ``id bigint`` key, an integer, a 40-character text, a ``numeric(12,2)``, a ``timestamptz``)
   and ``staging.big`` of 1,000,000 rows of the same shape, loaded and frozen.
2. **Offline copy** (the anchor): a pipeline of its own copies ``staging.big`` alone with
   ``pgcdc run --until-caught-up`` into a lake of its own: the initial copy, from its log's
   ``snapshot done`` line (the copy, not Spark's start).
3. The pipeline ``probe.*`` copies its ten tables, then runs continuously (trigger interval
   0.5 s, ``table_discovery_interval`` 1 s), is warmed up as ``bench-wide``'s (a transaction
   touching every table, then one of the workload, each waited for in the lake), then runs
   while one writer commits 2,000 changes/s in transactions of 20 (70/20/10 updates, inserts,
   deletes of random keys) over one to three of the ten tables (``bench-wide``'s workload).
   After ``--before`` seconds (60 at scale 1), ``ALTER TABLE staging.big SET SCHEMA probe``:
   the running pipeline finds the table, copies it beside the stream and hands it over. The
   writer goes on until ``--after`` seconds (30 at scale 1) after the table joined.

Reported: the **online copy**'s time (the ``copied ... in S s`` line: the temporary slot, the
copy, its landing and key indexes) and the time to join (from the ``ALTER`` to the table's
phase ``streaming`` in the lake's state: discovery, the copy, applying what the stream kept
aside); the other tables' commit-to-lake latency (``bench-wide``'s method: per transaction, the
first batch commit of every Delta table it touched whose ``max_lsn`` reaches the WAL position
read in it) for the transactions committed **before** the ``ALTER`` and **during** the copy
(from the ``ALTER`` to the join); the batches of each window; peak memory.

Goals: the online copy within 1.5x of the offline one; the others' p99 during the copy at most
2x their p99 before it. Written to ``bench-results/lifecycle.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from tools.bench.harness import (
    LakeLog,
    MemorySampler,
    PgcdcRun,
    add_common_arguments,
    batch_lines,
    bench_cluster,
    connect,
    log,
    scaled,
    scratch_dir,
    stats,
    stop_process,
    wait_for,
    write_result,
)
from tools.bench.wide import (
    _LOAD,
    _ROW_FUNCTION,
    _TABLE,
    _TXN_FUNCTION,
    TICK,
    WideWorkload,
    WideWriter,
    _one_txn,
)
from tools.bench.workload import MixedTxn, commit_times, create_tick_table

NAME = "lifecycle"
SCHEMA = "probe"
STAGING = "staging"
BIG = "big"
TABLES = 10
ROWS = 10_000
BIG_ROWS = 1_000_000
RATE = 2_000.0
PER_TXN = 20
BEFORE = 60.0
AFTER = 30.0
MIN_BEFORE = 20.0
MIN_AFTER = 10.0
TRIGGER = 0.5

GOAL_COPY_RATIO = 1.5
GOAL_P99_RATIO = 2.0

_COPIED = re.compile(r"copied \S+\.big: (\d+) rows at \S+ in ([0-9.]+) s")
_SNAPSHOT_DONE = re.compile(r"snapshot done: (\d+) rows of \d+ tables in ([0-9.]+) s")


def _say(text: str) -> None:
    log(NAME, text)


def load(conn: psycopg.Connection[Any], names: Sequence[str], rows: int, big_rows: int) -> None:
    """The ten tables, ``staging.big``, the tick table and the workload's functions."""
    for schema in (SCHEMA, STAGING):
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(_ROW_FUNCTION)
    for schema, name, count in [*((SCHEMA, n, rows) for n in names), (STAGING, BIG, big_rows)]:
        table = sql.Identifier(schema, name)
        conn.execute(sql.SQL(_TABLE).format(table=table))
        conn.execute(sql.SQL(_LOAD).format(table=table), (count,))
    create_tick_table(conn, TICK)
    conn.execute("VACUUM (FREEZE, ANALYZE)")
    conn.execute(
        sql.SQL(_TXN_FUNCTION).format(schema=sql.Literal(SCHEMA), tick=sql.Identifier(TICK))
    )


def phase_of(lake: Any, table_id: str) -> str | None:
    """The table's phase in the lake's state (None: none recorded)."""
    try:
        state = json.loads((lake / "_pgcdc" / "state.json").read_text())
    except (OSError, ValueError):
        return None
    phase = state.get("phases", {}).get(table_id)
    return None if phase is None else str(phase.get("phase"))


def run_lifecycle(
    *, rows: int, big_rows: int, before: float, after: float, rate: float
) -> dict[str, Any]:
    names = [f"t{i:02d}" for i in range(1, TABLES + 1)]
    with (
        bench_cluster({"track_commit_timestamp": "on"}) as source,
        scratch_dir(NAME) as workdir,
        connect(source) as src,
    ):
        _say(f"{TABLES} tables of {rows:,} rows and one of {big_rows:,}: loading them")
        started = time.perf_counter()
        load(src, names, rows, big_rows)
        _say(f"loaded in {time.perf_counter() - started:.1f} s; the offline copy of the big one")
        offline_dir = workdir / "offline"
        offline_dir.mkdir()
        offline = PgcdcRun(
            offline_dir,
            source.dsn(),
            [f"{STAGING}.{BIG}"],
            slot="pgcdc_offline",
            publication="pgcdc_offline",
        )
        done = offline.run().check("the offline copy")
        match = _SNAPSHOT_DONE.search(done.output)
        offline_seconds = float(match.group(2)) if match else None
        _say(f"offline copy: {offline_seconds} s ({done.seconds:.1f} s with Spark's start)")
        src.execute(sql.SQL("SELECT pg_drop_replication_slot('pgcdc_offline')"))

        online_dir = workdir / "online"
        online_dir.mkdir()
        pipeline = PgcdcRun(
            online_dir,
            source.dsn(),
            [f"{SCHEMA}.*"],
            stream={"trigger_interval": TRIGGER},
            source_extra="table_discovery_interval = 1\n",
        )
        pipeline.run().check("the first run: the ten tables' copy")
        lake = LakeLog({n: pipeline.lake / SCHEMA / n for n in names})
        logfile = online_dir / "run-continuous.log"
        proc = pipeline.start()
        sampler = MemorySampler(proc.pid).start()
        workload = WideWorkload(names, rows, per_txn=PER_TXN)
        try:
            wait_for(
                "the stream to start",
                lambda: "stream started" in logfile.read_text() or proc.poll() is not None,
                timeout=900,
                interval=0.2,
            )
            if proc.poll() is not None:
                raise RuntimeError(f"pgcdc run exited:\n{logfile.read_text()[-6000:]}")

            def in_lake(txns: Sequence[MixedTxn]) -> bool:
                last: dict[str, int] = {}
                for txn in txns:
                    for table in txn.tables:
                        last[table] = max(last.get(table, 0), txn.lsn)
                return lake.has_all(last)

            # warm-up, as bench-wide's: every table written once in this run (the first batch
            # of a table pays its JIT and its index's load), then a transaction of the workload
            warm = [_one_txn(src, -1, workload.touch_all())]
            wait_for("the warm-up in the lake", partial(in_lake, warm), 900, 0.5)
            warm.append(_one_txn(src, 0, workload.transaction()))
            wait_for("a warm-up transaction in the lake", partial(in_lake, warm[1:]), 900, 0.2)
            _say(f"writer: {rate:,.0f} changes/s; the big table joins after {before:.0f} s")
            writer = WideWriter(source.dsn(), workload, rate=rate, seconds=24 * 3600.0)
            writer.start()
            time.sleep(before)
            altered = time.time()
            src.execute(
                sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(
                    sql.Identifier(STAGING, BIG), sql.Identifier(SCHEMA)
                )
            )
            table_id = f"{SCHEMA}.{BIG}"
            wait_for(
                "the big table to join",
                lambda: phase_of(pipeline.lake, table_id) == "streaming" or proc.poll() is not None,
                timeout=3 * 3600,
                interval=0.2,
            )
            joined = time.time()
            if proc.poll() is not None:
                raise RuntimeError(f"pgcdc run exited:\n{logfile.read_text()[-6000:]}")
            _say(f"joined {joined - altered:.1f} s after the ALTER; {after:.0f} s more")
            time.sleep(after)
            writer.stop()
            writer.join()
            if writer.error is not None:
                raise writer.error
            every = partial(in_lake, writer.commits)
            wait_for("the lake to have every transaction", every, 3600, 1)
        finally:
            stop_process(proc)
            sampler.stop()
        output = logfile.read_text()
        lake.refresh()
        committed = commit_times(src, writer.commits)

    txns = [t for t in writer.commits if t.seq in committed]
    measured_from = txns[0].committed_at + 10.0 if txns else 0.0  # the writer at its rate

    def latencies(low: float, high: float) -> list[float]:
        out = []
        for t in txns:
            at = committed[t.seq]
            if low <= at < high:
                arrival = lake.arrival(t.lsn, t.tables)
                if arrival is not None:
                    out.append(arrival - at)
        return out

    before_lat = latencies(measured_from, altered)
    during_lat = latencies(altered, joined)
    after_lat = latencies(joined, float("inf"))
    match = _COPIED.search(output)
    online_seconds = float(match.group(2)) if match else None
    lines = batch_lines(output)
    p99_before = stats(before_lat)["p99"]
    p99_during = stats(during_lat)["p99"]
    copy_ratio = (
        None if online_seconds is None or not offline_seconds else online_seconds / offline_seconds
    )
    p99_ratio = None if not p99_before or p99_during is None else p99_during / p99_before
    return {
        "tables": TABLES,
        "rows_per_table": rows,
        "big_rows": big_rows,
        "workload": {
            "target_changes_per_second": rate,
            "achieved_changes_per_second": writer.changes / writer.elapsed,
            "changes_per_transaction": PER_TXN,
            "transactions": len(txns),
            "transactions_late": writer.late,
        },
        "offline_copy_seconds": offline_seconds,
        "online_copy_seconds": online_seconds,
        "join_seconds": joined - altered,
        "copy_ratio": copy_ratio,
        "latency_before_seconds": stats(before_lat),
        "latency_during_seconds": stats(during_lat),
        "latency_after_seconds": stats(after_lat),
        "p99_ratio_during_to_before": p99_ratio,
        "batches": {"count": len(lines), "seconds": stats([b.seconds for b in lines])},
        "memory": {"peak_rss_bytes": sampler.peak_rss_kb * 1024},
        "goals": {
            "copy_ratio_at_most": GOAL_COPY_RATIO,
            "copy_met": None if copy_ratio is None else copy_ratio <= GOAL_COPY_RATIO,
            "p99_ratio_at_most": GOAL_P99_RATIO,
            "p99_met": None if p99_ratio is None else p99_ratio <= GOAL_P99_RATIO,
        },
    }


def summary(r: dict[str, Any]) -> str:
    if "failed" in r:
        return f"FAILED: {r['failed'][:500]}"

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    b, d = r["latency_before_seconds"], r["latency_during_seconds"]
    return (
        f"{r['big_rows']:,} rows added online: copy {s(r['online_copy_seconds'])} s beside "
        f"{s(r['offline_copy_seconds'])} s offline ({s(r['copy_ratio'])}x), joined in "
        f"{s(r['join_seconds'])} s; the others' latency p50/p99 before {s(b['p50'])}/"
        f"{s(b['p99'])} s, during {s(d['p50'])}/{s(d['p99'])} s "
        f"({s(r['p99_ratio_during_to_before'])}x); "
        f"{r['workload']['achieved_changes_per_second']:,.0f} changes/s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.lifecycle", description=__doc__)
    add_common_arguments(parser)
    parser.add_argument("--rate", type=float, default=RATE, help="changes per second")
    args = parser.parse_args(argv)
    scale = args.scale
    options = {
        "rows": scaled(ROWS, min(scale, 1.0), minimum=1_000),
        "big_rows": scaled(BIG_ROWS, scale, minimum=10_000),
        "before": max(MIN_BEFORE, BEFORE * scale),
        "after": max(MIN_AFTER, AFTER * scale),
        "rate": args.rate,
    }
    try:
        result = run_lifecycle(**options)
    except Exception as exc:  # a benchmark records its failure
        result = {"failed": f"{type(exc).__name__}: {str(exc)[:2000]}", **options}
    path = write_result(NAME, scale, result)
    print(summary(result))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
