"""`make bench-report`: the benchmarks' JSON results as one markdown table and one plot.

Reads ``bench-results/{decode,catchup,snapshot,memory,latency,scale,wide,lifecycle}.json``
(whichever
exist) and writes ``bench-results/README.md`` (figure, pgcdc, anchor, ratio, goal, met?, what
limits it, and the scale each was measured at) and ``bench-results/bench.png`` (matplotlib,
Agg). Every ratio is pgcdc beside its anchor in the same run, on the same machine and data.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools.bench.harness import RESULTS_DIR

BENCHMARKS = ("decode", "catchup", "snapshot", "memory", "latency", "scale", "wide", "lifecycle")

#: What limits each figure, from profiling (Spark's event log, the pipeline's DEBUG log with
#: each batch's steps, py-spy); the JSON may carry its own ``limits`` text instead.
LIMITS = {
    "decode": (
        "the per-message Python framing before the vectorised conversion (pgcdc); a Python "
        "object per message and per value (pypgoutput)"
    ),
    "catchup": (
        "Delta's Spark connector's fixed costs on 2 cores, shared with the walsender and the "
        "receiver: each Delta operation (the schema check, planning, about eight Spark jobs, "
        "the log's state after the commit) costs 2-5 s whatever its size, so a batch of "
        "250,000 inserts (one append job) takes 3-4 s and one of updates or deletes scattered "
        "over the mirror (a MERGE that reads every file it touches, whole) 9-12 s. The first "
        "batch (about 16 s) pays the JIT and Spark's Python workers' start while the whole "
        "backlog arrives. Start-up 8 s (a run with nothing to do). The native subscriber "
        "updates rows in place"
    ),
    "catchup-x10": (
        "the same per batch: ten times the changes in ten times the batches, so start-up "
        "counts less and the ratio is that of the batches themselves"
    ),
    "catchup-s3": (
        "the same batches; each Delta operation's reads and writes of its log and files go "
        "through S3A to an S3 server on the same 2 cores (S3Proxy, a JVM of its own)"
    ),
    "snapshot": (
        "the copy runs at COPY's speed (two binary COPY server processes, then per row in "
        "each task's Python: psycopg2's C copy loop, vectorised decoding, Parquet); the fixed "
        "cost is Delta's on a cold JVM: creating each Delta table and committing its files through "
        "the connector's commit API (the log's state before the commit is a Spark job), plus "
        "Spark's Python workers starting for the copy's job: about 4 s in all"
    ),
    "memory": (
        "Spark itself, not the transaction: the receiver spools to disk and a batch passes "
        "through the executors' memory and disk, so the peak is flat over the sizes; the JVM "
        "grows its heap to its limit under load whatever its live data, and Spark's Python "
        "processes (a daemon per worker kind, each keeping a forked worker for a minute) add "
        "about 1 GB summed. A run with nothing to do takes about 0.8 GB. Under 1 GB is out of "
        "reach for a pipeline with a Spark JVM and Spark's Python workers"
    ),
    "latency": (
        "each batch is one append (inserts of new ids) but still costs 1.5-2 s on 2 cores "
        "shared with the source and its walsender: the overview job, the schema check and "
        "the append's planning, write and commit (the log's state after it), the streaming "
        "engine's offset and commit logs; latency is the wait for the batch in progress plus "
        "one batch, and a slow batch lets the next grow. Compaction, purges and vacuums run "
        "beside the batches, not in them"
    ),
}


LIMITS["scale"] = (
    "on 2 cores shared with the source, its walsender and the native subscriber. With the "
    "indexed write (the default) a batch never reads the table: its rows are appended as new "
    "files, the rows they replace are found in the key index and marked in deletion vectors, "
    "and the table moves in one Delta commit, so its time follows its changes (0.7-0.85 s "
    "median for about 1,600-1,900 changes at both sizes: the overview job that decodes the "
    "batch, the write job, the commit). Latency is the wait for the batch in progress plus one "
    "batch; the p99 comes from the few batches beside maintenance (a checkpoint of the log "
    "took 3-9 s beside them; the batch after a compaction follows the files it rewrote), and "
    "varied from 3.95 to 5.29 s at 10M rows over three runs the same night. Smaller batches "
    "write more bytes a change: each commit's deletion-vector file holds the whole bitmap of "
    "every file it marks (rows deleted so far), whatever the batch's size. Beside it, Delta's "
    "MERGE reads every file a batch's scattered keys fall in, whole, so its batches follow the "
    "table (6 s at 1M rows, 14 s at 10M)"
)

LIMITS["wide"] = (
    "a cost per table, on 2 cores shared with the source and the native subscriber. The indexed "
    "write runs one Spark job for up to 64 tables of a batch, then one Delta commit per table, "
    "eight at a time; what is left per table is the driver's work around each (the table's "
    "snapshot, the schema check, its share of the job's plan, the key index, the commit). At "
    "100 tables a steady batch under the workload is the first job (reading and decoding the "
    "micro-batch with the overview's counts: 1-2.4 s, growing with the rows times the tables, "
    "each row carrying every table's struct column), the plan (1-3 s: Spark's analysis of one "
    "plan over 100 outputs, and each table's snapshot and schema), the jobs writing the files "
    "(1.7-3.5 s) and the 100 commits (0.5-1 s since their calls were batched in pgcdc's jar, "
    "2.2-2.8 s before). The p99 comes from the run's first batch over 100 tables (28 s: each "
    "table's part of the plan built, Spark's Python workers and code generation cold) and the "
    "backlog behind it. Runs of the same code vary by about a third. With history and changelog "
    "on, 100 tables get through at 0.72 s a table"
)

LIMITS["lifecycle"] = (
    "the copy's Spark jobs and the stream's batches share 2 cores (fair scheduling), with the "
    "source, its walsender and the copy's COPY on the same machine; the stream stops between "
    "two batches when the table joins the publication and for the last round of its changes "
    "kept aside"
)


def _load(directory: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name in BENCHMARKS:
        path = directory / f"{name}.json"
        if path.exists():
            out[name] = json.loads(path.read_text())
    # the memory benchmark with another driver heap (``--driver-memory``), after the default
    for pattern in ("catchup-*.json", "memory-driver-*.json"):
        for path in sorted(directory.glob(pattern)):
            out[path.stem] = json.loads(path.read_text())
    return out


def _kind(name: str) -> str:
    """The benchmark a result belongs to (``memory-driver-512m`` is a ``memory`` result,
    ``catchup-x10`` a ``catchup`` one)."""
    variant = name.startswith(("memory-driver-", "catchup-"))
    return name.split("-", maxsplit=1)[0] if variant else name


def _ordered(results: dict[str, dict[str, Any]]) -> list[str]:
    """Result names in the table's order: each benchmark, then its variants."""
    return [n for b in BENCHMARKS for n in results if _kind(n) == b]


def _bytes(n: float) -> str:
    """Bytes in the unit that suits them (KiB below 1 MiB)."""
    return (
        f"{n / 2**10:,.0f} KiB"
        if n < 2**20
        else _size(n)
        if n >= 2**30
        else f"{n / 2**20:,.1f} MiB"
    )


def _rate(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}"


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def _met(flag: bool | None) -> str:
    return "–" if flag is None else ("yes" if flag else "**no**")


def _scale(data: dict[str, Any]) -> str:
    return f"{data['scale']:g}" if "scale" in data else "1"


def _row_decode(d: dict[str, Any]) -> list[list[str]]:
    rates = d["changes_per_second"]
    ratio = d["ratio_columnar_to_pypgoutput"]
    changes = d["stream"]["changes"]
    return [
        [
            f"Decode: {changes:,} recorded changes -> typed Arrow (text format)",
            _rate(rates["pgcdc_columnar_text"], "changes/s"),
            f"pypgoutput decoders: {_rate(rates['pypgoutput_decoders'], 'changes/s')}",
            f"{ratio:.1f}x",
            ">= 10x",
            _met(d["goals"]["ratio_met"]),
        ]
    ]


def _row_catchup(d: dict[str, Any]) -> list[list[str]]:
    s = d["seconds"]
    w = d["workload"]
    label = (
        f"Catch-up: {w['inserts']:,} inserts + {w['updates']:,} updates + "
        f"{w['deletes']:,} deletes into the Delta mirror"
    )
    on_s3 = str(d.get("lake", "")).startswith("S3Proxy")
    if on_s3:
        label += " in an S3 bucket (S3Proxy on loopback)"
    rows = [
        [
            label,
            f"{s['pgcdc']:.1f} s ({s['pgcdc_without_fixed_cost']:.1f} s without the "
            f"{s['pgcdc_fixed_cost']:.1f} s fixed cost)",
            f"native subscription: {s['native_subscription']:.1f} s",
            f"{d['ratio_pgcdc_to_native']:.2f}x "
            f"({d['ratio_pgcdc_without_fixed_cost_to_native']:.2f}x)",
            "<= 1.2x",
            _met(d["goals"]["ratio_met"]),
        ],
        [
            "Catch-up, beside the physical limit",
            f"{d['changes_per_second']['pgcdc']:,.0f} changes/s",
            f"pg_recvlogical > /dev/null: {s['pg_recvlogical']:.1f} s "
            f"({d['changes_per_second']['pg_recvlogical']:,.0f} changes/s)",
            f"{d['ratio_pgcdc_to_pg_recvlogical']:.1f}x the time",
            "–",
            "–",
            "the anchor: pg_recvlogical takes about as long over the same WAL whatever its "
            "options (protocol 1 or 3, binary, streaming), longer than the native subscriber, "
            "so it measures the client as much as the walsender; see above for pgcdc",
        ],
    ]
    return rows[:1] if on_s3 else rows


def _row_snapshot(d: dict[str, Any]) -> list[list[str]]:
    r = d["rows_per_second"]
    return [
        [
            f"Initial snapshot: {d['rows']:,} rows into the lake",
            f"{_rate(r['pgcdc_snapshot'], 'rows/s')} "
            f"({_rate(r['pgcdc_snapshot_without_fixed_cost'], 'rows/s')} without the fixed "
            "cost)",
            f"COPY TO STDOUT > /dev/null: {_rate(r['copy_to_stdout'], 'rows/s')}",
            f"{d['ratio_pgcdc_to_copy']:.2f}x ({d['ratio_pgcdc_without_fixed_cost_to_copy']:.2f}x)",
            f">= {d['goals']['ratio_at_least']:g}x",
            _met(d["goals"]["ratio_met"]),
        ]
    ]


def _row_memory(d: dict[str, Any]) -> list[list[str]]:
    rows = []
    for mode in ("on", "off"):
        runs = [r for r in d["runs"] if r["streaming"] == mode]
        if not runs:
            continue
        largest = runs[-1]
        heap = d.get("driver_memory", "")
        label = f", driver heap {heap}" if heap and not heap.startswith("Spark's") else ""
        peaks = ", ".join(f"{_size(r['wal_bytes'])}: {_size(r['peak_rss_bytes'])}" for r in runs)
        growth = d["growth_largest_to_smallest"][mode]
        failed = [r for r in runs if r.get("failed")]
        if failed:
            cause = failed[0]["failed"].split(" | ")[0].removeprefix("Caused by: ")[:120]
            peaks += f"; FAILED at {_size(failed[0]['wal_bytes'])}: {cause}"
        rows.append(
            [
                f"Memory: one {_size(largest['wal_bytes'])} transaction (WAL), streaming {mode}"
                + label,
                f"peak RSS {_size(largest['peak_rss_bytes'])} (transaction: peak, {peaks})",
                f"a run with nothing to do: {_size(d['idle_run']['peak_rss_bytes'])}",
                f"{growth:.2f}x from smallest to largest",
                "< 1 GB, flat",
                f"{_met(largest['peak_rss_bytes'] < d['goals']['peak_below_bytes'])} / "
                f"{_met(growth <= d['goals']['flat_within'] and not failed)}",
            ]
        )
    return rows


def _seconds(stats: dict[str, Any], digits: int = 2) -> str:
    """p50, p99 and max of a ``tools.bench.harness.stats`` dict."""
    if not stats or stats.get("p50") is None:
        return "none measured"
    return (
        f"p50 {stats['p50']:.{digits}f} s, p99 {stats['p99']:.{digits}f} s "
        f"(max {stats['max']:.{digits}f} s)"
    )


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.1f}x" if a is not None and b else "–"


def _mixed_label(r: dict[str, Any]) -> str:
    w = r["workload"]
    return (
        f"{w['achieved_changes_per_second']:,.0f} changes/s (target "
        f"{w['target_changes_per_second']:,.0f}; 70/20/10 updates/inserts/deletes of random "
        f"keys, {w['changes_per_transaction']} a transaction) for {w['seconds']:.0f} s on "
        f"{r['rows']:,} rows"
    )


def _row_latency(d: dict[str, Any]) -> list[list[str]]:
    rows = []
    if "latency_seconds" in d:
        lat = d["latency_seconds"]
        rows.append(
            [
                f"Steady state: {d['achieved_changes_per_second']:,.0f} changes/s "
                f"(target {d['target_changes_per_second']:,.0f}) for {d['seconds']:.0f} s",
                f"p50 {lat['p50']:.2f} s, p99 {lat['p99']:.2f} s (max {lat['max']:.2f} s)",
                "–",
                "–",
                "p99 < 2 s",
                _met(d["goals"]["p99_met"]),
            ]
        )
    m = d.get("mixed")
    if m:
        lat, nat = m["latency_seconds"], m["native_lag_seconds"]
        row = [
            f"Steady state, mixed: {_mixed_label(m)}",
            f"commit-to-lake {_seconds(lat)}",
            f"native subscriber's lag: {_seconds(nat, 3)}",
            f"{_ratio(lat['p99'], nat['p99'])} the p99",
            f"p99 < {m['goals']['p99_below']:g} s",
            _met(m["goals"]["p99_met"]),
            m.get("limits") or LIMITS["scale"],
        ]
        if "scale" in m and m["scale"] != d.get("scale"):
            row[0] += f" (scale {m['scale']:g})"
        rows.append(row)
    return rows


def _row_scale(d: dict[str, Any]) -> list[list[str]]:
    rows = []
    runs = d["sizes"]
    goals = d["goals"]
    for r in runs:
        lat, nat, b, lake = r["latency_seconds"], r["native_lag_seconds"], r["batches"], r["lake"]
        largest = r is runs[-1]
        rows.append(
            [
                f"Scale: {_mixed_label(r)}",
                f"commit-to-lake {_seconds(lat)}",
                f"native subscriber's lag: {_seconds(nat, 3)}",
                f"{_ratio(lat['p99'], nat['p99'])} the p99",
                f"p99 < {goals['p99_below']:g} s at {goals['p99_at_rows']:,} rows"
                if largest
                else "–",
                _met(goals["p99_met"]) if largest else "–",
            ]
        )
        per_change = b["bytes_per_change"]["p50"]
        rows.append(
            [
                f"Scale: batches and lake at {r['rows']:,} rows",
                f"{b['count']} batches: {_seconds(b['seconds'])}; written per batch (median) "
                f"{_bytes(b['bytes']['p50'] or 0)} for {b['changes']['p50'] or 0:,.0f} changes "
                f"({per_change or 0:,.0f} bytes a change); lake growth "
                f"{_bytes(lake['growth_bytes_per_hour'])} an hour; peak RSS "
                f"{_size(r['memory']['peak_rss_bytes'])}",
                f"changed bytes: {_bytes(lake['changed_bytes_per_hour'])} an hour "
                f"({r['row_bytes']:.0f} bytes a row)",
                f"growth {lake['growth_to_changed']:.1f}x the changed bytes"
                if lake["growth_to_changed"] is not None
                else "–",
                f"growth <= {goals['growth_to_changed_at_most']:g}x" if largest else "–",
                _met(goals["growth_met"]) if largest else "–",
            ]
        )
    for r in runs:
        index = r.get("key_index") or {}
        per_row = index.get("disk_bytes_per_row")
        if r.get("write", "indexed") != "indexed" or per_row is None:
            continue
        built = (
            "build time not recorded"
            if index.get("build_seconds") is None
            else f"built in {index['build_seconds']:.1f} s"
        )
        rows.append(
            [
                f"Scale: key index at {r['rows']:,} rows",
                f"{built} (the initial copy: {r['initial_copy_seconds']['pgcdc']:.1f} s); "
                f"{per_row:.1f} bytes a row on disk",
                f"native subscriber's copy: {r['initial_copy_seconds']['native_subscription']:.1f}"
                " s",
                "–",
                "<= 32 bytes a row",
                _met(per_row <= 32),
            ]
        )
    for write, beside in (d.get("beside") or {}).items():
        for r in beside:
            lat, nat, b = r["latency_seconds"], r["native_lag_seconds"], r["batches"]
            rows.append(
                [
                    f"Scale: {_mixed_label(r)}, {write} write (beside)",
                    f"commit-to-lake {_seconds(lat)}; median batch "
                    f"{b['seconds']['p50'] or 0:.2f} s",
                    f"native subscriber's lag: {_seconds(nat, 3)}",
                    f"{_ratio(lat['p99'], nat['p99'])} the p99",
                    "–",
                    "–",
                ]
            )
    if len(runs) > 1:
        small, large = runs[0], runs[-1]
        seconds = d["ratio_batch_seconds_largest_to_smallest"]
        per_change = d["ratio_bytes_per_change_largest_to_smallest"]
        rows.append(
            [
                f"Scale: {small['rows']:,} -> {large['rows']:,} rows (median batch)",
                f"duration {small['batches']['seconds']['p50'] or 0:.2f} -> "
                f"{large['batches']['seconds']['p50'] or 0:.2f} s; bytes a change "
                f"{small['batches']['bytes_per_change']['p50'] or 0:,.0f} -> "
                f"{large['batches']['bytes_per_change']['p50'] or 0:,.0f}",
                "–",
                ("–" if seconds is None else f"{seconds:.2f}x")
                + " / "
                + ("–" if per_change is None else f"{per_change:.2f}x"),
                f"<= {goals['batch_seconds_ratio_at_most']:g}x / "
                f"<= {goals['bytes_per_change_ratio_at_most']:g}x",
                f"{_met(goals['batch_seconds_met'])} / {_met(goals['bytes_per_change_met'])}",
            ]
        )
    return rows


def _wide_mode(r: dict[str, Any]) -> str:
    mode = f"history and changelog {'on' if r['history_changelog'] else 'off'}"
    write = r.get("write", "indexed")
    return mode if write == "indexed" else f"{mode}, {write} write"


def _row_wide(d: dict[str, Any]) -> list[list[str]]:
    rows = []
    goals = d["goals"]
    for r in d["runs"]:
        head = f"Wide: {r['tables']} tables of {r['rows_per_table']:,} rows, {_wide_mode(r)}"
        is_goal = (
            r["tables"] == goals["p99_at_tables"]
            and not r["history_changelog"]
            and r.get("write", "indexed") == d.get("write", "indexed")
        )
        goal = f"p99 < {goals['p99_below']:g} s" if is_goal else "–"
        if "failed" in r:
            failed = " ".join(r["failed"].split())[:200]  # one line of the table
            rows.append([head, f"FAILED: {failed}", "–", "–", goal, "–"])
            continue
        w, lat, nat, b = r["workload"], r["latency_seconds"], r["native_lag_seconds"], r["batches"]
        p99 = lat["p99"]
        rows.append(
            [
                f"{head}: {w['achieved_changes_per_second']:,.0f} changes/s (target "
                f"{w['target_changes_per_second']:,.0f}; {w['changes_per_transaction']} changes "
                f"a transaction over {w['tables_per_transaction'][0]} to "
                f"{w['tables_per_transaction'][1]} random tables, 70/20/10) for "
                f"{w['seconds']:.0f} s",
                f"commit-to-lake {_seconds(lat)}; {b['count']} batches, median "
                f"{b['seconds']['p50'] or 0:.1f} s of {b['tables']['p50'] or 0:.0f} tables "
                f"({b['seconds_per_table']['p50'] or 0:.2f} s a table); start-up "
                f"{r['startup_seconds']:.0f} s; peak RSS {_size(r['memory']['peak_rss_bytes'])}",
                f"native subscriber's lag: {_seconds(nat, 3)}",
                f"{_ratio(p99, nat['p99'])} the p99",
                goal,
                _met(None if p99 is None else p99 < goals["p99_below"]) if is_goal else "–",
            ]
        )
    ratios = d["ratio_batch_seconds_most_to_fewest_tables"]
    if d.get("ratio_compares"):
        off = sorted(
            (r for r in d["runs"] if not r["history_changelog"] and "failed" not in r),
            key=lambda r: r["tables"],
        )
        a, b = (r["equal_changes"]["batch_seconds"]["p50"] for r in (off[0], off[-1]))
        ratio = ratios.get("off")
        rows.append(
            [
                f"Wide: median batch ({d['equal_changes_per_transaction']:,} changes each), "
                f"{d['ratio_compares']}, history and changelog off",
                f"{a or 0:.2f} s -> {b or 0:.2f} s",
                "–",
                "–" if ratio is None else f"{ratio:.2f}x",
                f"<= {goals['batch_seconds_ratio_at_most']:g}x",
                _met(goals["batch_seconds_met"]),
            ]
        )
    return rows


def _row_lifecycle(d: dict[str, Any]) -> list[list[str]]:
    head = f"Lifecycle: a table of {d.get('big_rows', 0):,} rows added to a running pipeline"
    if "failed" in d:
        failed = " ".join(d["failed"].split())[:200]
        return [[head, f"FAILED: {failed}", "–", "–", "–", "–"]]
    goals = d["goals"]
    w = d["workload"]
    before, during = d["latency_before_seconds"], d["latency_during_seconds"]
    return [
        [
            f"{head}: its copy beside the stream",
            f"{d['online_copy_seconds'] or 0:.1f} s (joined {d['join_seconds']:.1f} s after it "
            "appeared under the pattern)",
            f"the same copy offline (initial copy): {d['offline_copy_seconds'] or 0:.1f} s",
            "–" if d["copy_ratio"] is None else f"{d['copy_ratio']:.2f}x",
            f"<= {goals['copy_ratio_at_most']:g}x",
            _met(goals["copy_met"]),
        ],
        [
            f"{head}: the other {d['tables']} tables' commit-to-lake latency at "
            f"{w['achieved_changes_per_second']:,.0f} changes/s (target "
            f"{w['target_changes_per_second']:,.0f})",
            f"during the copy: {_seconds(during)}",
            f"before it: {_seconds(before)}",
            "–"
            if d["p99_ratio_during_to_before"] is None
            else f"{d['p99_ratio_during_to_before']:.2f}x the p99",
            f"<= {goals['p99_ratio_at_most']:g}x",
            _met(goals["p99_met"]),
        ],
    ]


ROWS: dict[str, Callable[[dict[str, Any]], list[list[str]]]] = {
    "decode": _row_decode,
    "catchup": _row_catchup,
    "snapshot": _row_snapshot,
    "memory": _row_memory,
    "latency": _row_latency,
    "scale": _row_scale,
    "wide": _row_wide,
    "lifecycle": _row_lifecycle,
}


def markdown(results: dict[str, dict[str, Any]]) -> str:
    head = ["Figure", "pgcdc", "Anchor (same run)", "Ratio", "Goal", "Met?", "Scale", "Limit"]
    lines = [
        "# pgcdc benchmarks",
        "",
        "`make bench` (each alone: `make bench-decode`, `bench-catchup`, `bench-snapshot`, "
        "`bench-memory`, `bench-latency`, `bench-scale`, `bench-wide`, `bench-lifecycle`; then "
        "`make "
        "bench-report`). Every "
        "ratio is measured "
        "beside its anchor in the same run, on the same machine and data; absolute times on a "
        "shared machine are noise. Scale 1 is the full sizes of the issue; a smaller scale "
        "shrinks every size (rows, bytes, seconds) by that factor. Benchmarks never fail CI.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for name in BENCHMARKS:
        if name not in results:
            lines.append(f"| {name}: not run | | | | | | | |")
    for name in _ordered(results):
        data = results[name]
        limit = data.get("limits") or LIMITS.get(name) or LIMITS[_kind(name)]
        for row in ROWS[_kind(name)](data):
            cells = [*row[:6], _scale(data), row[6] if len(row) > 6 else limit]
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += ["", "Measured on:", ""]
    for name in _ordered(results):
        data = results[name]
        m = data.get("machine", {})
        lines.append(
            f"- {name}: {data.get('measured_at', '?')}, scale {_scale(data)}, "
            f"{m.get('cpus', '?')} CPUs ({m.get('cpu_model', '?')}), "
            f"{m.get('memory_gb', '?')} GB, load {m.get('load_average', '?')}"
        )
    lines += ["", "![benchmarks](bench.png)", ""]
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(3, 3, figsize=(21, 15))
    axes = list(grid.flat)
    axes[8].axis("off")
    notes = [f"{name}: scale {_scale(data)}, {data.get('measured_at', '?')}"
             for name, data in results.items()]  # fmt: skip
    axes[8].text(0, 1, "pgcdc benchmarks (ratios: same run, same machine)\n\n" + "\n".join(notes),
                 va="top", fontsize=10, family="monospace")  # fmt: skip
    blue, grey, green = "#1f77b4", "#999999", "#2ca02c"

    def bars(ax: Any, labels: list[str], values: list[float], colors: list[str]) -> None:
        ax.bar(labels, values, color=colors)
        ax.tick_params(axis="x", labelrotation=20)
        for i, v in enumerate(values):
            ax.annotate(f"{v:,.3g}", (i, v), ha="center", va="bottom", fontsize=8)

    def empty(ax: Any, title: str) -> None:
        ax.set_title(title)
        ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)

    d = results.get("decode")
    if d:
        r = d["changes_per_second"]
        bars(
            axes[0],
            ["pypgoutput", "pgcdc rows", "pgcdc Arrow\n(text)", "pgcdc Arrow\n(binary)"],
            [
                r["pypgoutput_decoders"],
                r["pgcdc_row_decoder"],
                r["pgcdc_columnar_text"],
                r["pgcdc_columnar_binary"],
            ],
            [grey, blue, blue, blue],
        )
        axes[0].set_yscale("log")
        axes[0].set_ylabel("changes/s")
        axes[0].set_title(f"Decode ({d['ratio_columnar_to_pypgoutput']:.0f}x, goal 10x)")
    else:
        empty(axes[0], "Decode")

    d = results.get("catchup")
    if d:
        s = d["seconds"]
        bars(
            axes[1],
            ["pg_recvlogical", "native sub", "pgcdc", "pgcdc w/o\nfixed cost"],
            [
                s["pg_recvlogical"],
                s["native_subscription"],
                s["pgcdc"],
                s["pgcdc_without_fixed_cost"],
            ],
            [grey, grey, blue, blue],
        )
        axes[1].set_ylabel("seconds (lower is better)")
        axes[1].set_title(
            f"Catch-up, scale {_scale(d)} ({d['ratio_pgcdc_to_native']:.2f}x native, goal 1.2x)"
        )
    else:
        empty(axes[1], "Catch-up")

    d = results.get("snapshot")
    if d:
        r = d["rows_per_second"]
        bars(
            axes[2],
            ["COPY > /dev/null", "pgcdc", "pgcdc w/o\nfixed cost"],
            [r["copy_to_stdout"], r["pgcdc_snapshot"], r["pgcdc_snapshot_without_fixed_cost"]],
            [grey, blue, blue],
        )
        axes[2].set_ylabel("rows/s")
        axes[2].set_title(
            f"Snapshot, scale {_scale(d)} ({d['ratio_pgcdc_to_copy']:.2f}x COPY, goal "
            f"{d['goals']['ratio_at_least']:g}x)"
        )
    else:
        empty(axes[2], "Snapshot")

    d = results.get("memory")
    if d:
        ax = axes[3]
        variants = [(n, results[n]) for n in _ordered(results) if _kind(n) == "memory"]
        for name, data in variants:
            heap = "" if name == "memory" else f", heap {data.get('driver_memory')}"
            for mode, color in (("on", blue), ("off", green)):
                runs = [r for r in data["runs"] if r["streaming"] == mode]
                ax.plot(
                    [r["wal_bytes"] / 2**30 for r in runs],
                    [r["peak_rss_bytes"] / 2**30 for r in runs],
                    marker="o",
                    color=color,
                    linestyle="-" if name == "memory" else ":",
                    label=f"streaming {mode}{heap}",
                )
        for mode in ("on", "off"):
            runs = [r for r in d["runs"] if r["streaming"] == mode]
            for r in runs:
                if r.get("failed"):
                    ax.plot(r["wal_bytes"] / 2**30, r["peak_rss_bytes"] / 2**30, "x",
                            color="red", markersize=12, label=f"run failed ({mode})")  # fmt: skip
        ax.axhline(1.0, color="red", linestyle="--", label="goal 1 GB")
        ax.set_xlabel("transaction WAL, GiB")
        ax.set_ylabel("peak RSS of the process tree, GiB")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.set_title(f"Memory, scale {_scale(d)}")
    else:
        empty(axes[3], "Memory")

    d = results.get("latency")
    if d:
        ax = axes[4]
        quantiles = ("p50", "p90", "p99", "max")
        lines = []
        if "latency_seconds" in d:
            lines.append((f"inserts, {d['achieved_changes_per_second']:,.0f}/s",
                          d["latency_seconds"], blue))  # fmt: skip
        if d.get("mixed"):
            m = d["mixed"]
            lines.append((f"mixed, {m['workload']['achieved_changes_per_second']:,.0f}/s, "
                          f"{m['rows']:,} rows", m["latency_seconds"], green))  # fmt: skip
            lines.append(("mixed: native subscriber", m["native_lag_seconds"], grey))
        width = 0.8 / max(len(lines), 1)
        for i, (label, lat, color) in enumerate(lines):
            xs = [q + (i - (len(lines) - 1) / 2) * width for q in range(len(quantiles))]
            ax.bar(xs, [lat[k] or 0 for k in quantiles], width, color=color, label=label)
        ax.set_xticks(range(len(quantiles)), quantiles)
        if "latency_seconds" in d:
            ax.axhline(2.0, color="red", linestyle="--", label="goal p99 2 s (inserts)")
        if d.get("mixed"):
            goal = d["mixed"]["goals"]["p99_below"]
            ax.axhline(goal, color="orange", linestyle="--", label=f"goal p99 {goal:g} s (mixed)")
        ax.set_ylabel("commit-to-lake seconds")
        ax.legend(fontsize=8)
        ax.set_title(f"Latency, scale {_scale(d)}")
    else:
        empty(axes[4], "Latency")

    d = results.get("scale")
    if d:
        ax = axes[5]
        runs = d["sizes"]
        labels = [f"{r['rows']:,} rows" for r in runs]
        for i, (key, name, color) in enumerate(
            (("latency_seconds", "pgcdc", blue), ("native_lag_seconds", "native subscriber", grey))
        ):
            xs = [j + (i - 0.5) * 0.4 for j in range(len(runs))]
            ax.bar(xs, [r[key]["p99"] or 0 for r in runs], 0.4, color=color,
                   label=f"{name} p99")  # fmt: skip
            ax.plot(xs, [r[key]["p50"] or 0 for r in runs], "o", color="black",
                    label="p50" if i == 0 else None)  # fmt: skip
        ax.set_xticks(range(len(runs)), labels)
        ax.axhline(d["goals"]["p99_below"], color="red", linestyle="--",
                   label=f"goal p99 {d['goals']['p99_below']:g} s")  # fmt: skip
        ax.set_ylabel("commit-to-subscriber seconds")
        ax.legend(fontsize=8)
        ax.set_title(f"Scale: mixed workload, {d['rate']:,.0f} changes/s, scale {_scale(d)}")

        ax = axes[6]
        xs = list(range(len(runs)))
        ax.bar([x - 0.2 for x in xs], [r["batches"]["seconds"]["p50"] or 0 for r in runs], 0.4,
               color=blue, label="median batch seconds")  # fmt: skip
        ax.set_ylabel("median batch seconds")
        ax.set_xticks(xs, labels)
        twin = ax.twinx()
        per_change = [r["batches"]["bytes_per_change"]["p50"] or 0 for r in runs]
        twin.bar([x + 0.2 for x in xs], per_change, 0.4, color=green,
                 label="median bytes written a change")  # fmt: skip
        twin.set_ylabel("bytes written per change (median batch)")
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=8, loc="upper left")
        ax.set_title("Scale: batch duration and bytes per change (goal: <= 1.5x)")
    else:
        empty(axes[5], "Scale")
        empty(axes[6], "Scale: batches")

    d = results.get("wide")
    runs = [r for r in d["runs"] if "failed" not in r] if d else []
    if d and runs:
        ax = axes[7]
        labels = [f"{r['tables']} tables\nh+c {'on' if r['history_changelog'] else 'off'}"
                  for r in runs]  # fmt: skip
        for i, (key, name, color) in enumerate(
            (("latency_seconds", "pgcdc", blue), ("native_lag_seconds", "native subscriber", grey))
        ):
            xs = [j + (i - 0.5) * 0.4 for j in range(len(runs))]
            ax.bar(xs, [max(r[key]["p99"] or 0, 1e-3) for r in runs], 0.4, color=color,
                   label=f"{name} p99")  # fmt: skip
            ax.plot(xs, [max(r[key]["p50"] or 0, 1e-3) for r in runs], "o", color="black",
                    label="p50" if i == 0 else None)  # fmt: skip
        ax.set_xticks(range(len(runs)), labels)
        ax.set_yscale("log")
        ax.axhline(d["goals"]["p99_below"], color="red", linestyle="--",
                   label=f"goal p99 {d['goals']['p99_below']:g} s "
                   f"({d['goals']['p99_at_tables']} tables, off)")  # fmt: skip
        ax.set_ylabel("commit-to-lake / subscriber seconds (log)")
        ax.legend(fontsize=8)
        ax.set_title(f"Wide: {d['rate']:,.0f} changes/s over many tables, scale {_scale(d)}")
    else:
        empty(axes[7], "Wide")

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.report", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder")
    args = parser.parse_args(argv)
    results = _load(args.results)
    if not results:
        print(f"no results in {args.results}: run `make bench` first")
        return 0
    text = markdown(results)
    (args.results / "README.md").write_text(text)
    plot(results, args.results / "bench.png")
    print(text)
    print(f"written to {args.results / 'README.md'} and {args.results / 'bench.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
