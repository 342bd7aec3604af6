"""`make bench-report`: the benchmarks' JSON results as one markdown table and one plot.

Reads ``bench-results/{decode,catchup,snapshot,memory,latency,scale}.json`` (whichever exist) and
writes ``bench-results/README.md`` (figure, pgcdc, anchor, ratio, goal, met?, what limits it,
and the scale each was measured at) and ``bench-results/bench.png`` (matplotlib, Agg). Every
ratio is pgcdc beside its anchor in the same run, on the same machine and data.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools.bench.harness import RESULTS_DIR

BENCHMARKS = ("decode", "catchup", "snapshot", "memory", "latency", "scale")

#: What limits each figure, from profiling (py-spy on the driver and the Python workers, the
#: pipeline's INFO log); the JSON may carry its own ``limits`` text instead.
LIMITS = {
    "decode": (
        "the per-message Python framing before the vectorised conversion (pgcdc); a Python "
        "object per message and per value (pypgoutput)"
    ),
    "catchup": (
        "CPU, on 2 cores: a run takes 54-58 s of CPU in 31-34 s. Per process (four runs over "
        "one workload): Spark's JVM 30-34 s (its start-up 5.5 s, the C2 JIT about 10 s, then "
        "each batch's Spark work: the Python source's Arrow batches into rows, the cached "
        "batch, the overview and event jobs, Arrow back to the driver), the driver's Python "
        "8.4-9.3 s (mostly the delta-rs MERGEs; the updates' and deletes' copy-on-write "
        "rewrite of the 1M-row mirror takes 1.6 s each where the native subscriber updates "
        "rows in place), the walsender 5.2-5.5 s, the source's receiver 4.9-5.1 s, Spark's "
        "Python workers decoding 4.5-5.0 s. The first batch (9-10 s, the others 2-3.5 s) runs "
        "while the receiver takes in the whole backlog and the walsender decodes it on the same "
        "cores. Fixed cost per run 5.5-6.1 s: the driver JVM maps Spark's classes from a class "
        "data sharing archive the first run writes (8.7 s before). Tried without gain (within "
        "noise): no persist, an uncompressed cache, ParallelGC, SerialGC, a 512 MB heap, fewer "
        "JIT compilations (CompileThresholdScaling=4), events without the explode that splits "
        "key changes (0.05 s a batch); C1 only starts 2 s faster but runs every batch slower. "
        "The goal, 1.2x of the native subscriber's 7.5-7.7 s, is about 9 s: 18 s of CPU on "
        "these 2 cores, less than Spark's JVM alone takes, so it is out of reach for batches "
        "that run through Spark on this machine: a run with nothing to do (5.3-5.9 s) and the "
        "two MERGEs that rewrite the whole mirror (1.6 s each) take 8.5 s or more before the "
        "walsender has sent anything"
    ),
    "snapshot": (
        "CPU: on 2 cores, the two binary COPY server processes take about 1.2-1.5 us a row, "
        "and each copy task's Python about 1.85 us: psycopg2's C copy loop handing each row to "
        "a Python callback about 0.5 us, vectorised decoding 0.8 us, Parquet 0.35 us. Plus a "
        "fixed 1.8 s in the snapshot phase (Spark starting its executors' Python worker daemon "
        "for the copy's first job). Since the previous run (24.6 s, 0.50x): the copy's tasks "
        "are an RDD's partitions (they were a Python data source's read, for which Spark starts "
        "a Python process per planning step: 8-9.5 s fixed), rows reach Python through "
        "psycopg2's C copy loop (psycopg 3's generator-based loop took about 1.2 us a row), "
        "Parquet dictionaries only for columns whose first rows repeat values (0.25 us a row "
        "less, smaller files), and Spark's Python processes import compiled modules. COPY to "
        "/dev/null only formats text in one server process; it took 11.6 to 20.7 s over the "
        "four runs of this code (pgcdc 0.67x to 1.02x beside it)"
    ),
    "memory": (
        "Spark itself, not the transaction: at the issue's full sizes (0.27 to 2.15 GB of WAL "
        "in one transaction) the peak is flat at 2.7-3.0 GiB, the same with streaming on or "
        "off (the receiver spools to disk either way; a micro-batch holds the transaction, "
        "staged by the executors in chunks of [lake] bytes_per_commit, 128 MB of values with "
        "this heap). A run with nothing to do takes 0.82 GB (the JVM 0.35, the driver 0.16, "
        "the streaming source's runner 0.11, Spark's Python daemons and their forks). Under "
        "load the JVM grows its heap to its 1 GB limit whatever the live data (1.36-1.49 GB "
        "in all; about 1.6 GB before the batch was cached serialized with 4 MB G1 regions), "
        "Spark's Python processes take about 1.05 GB summed over some 15 (1.0-1.1 GB: their "
        "workers no longer importing psycopg took 20-60 MB off the sum; a daemon per worker "
        "kind: data source lookup, creation, planning, writing, committing, the executors' "
        "workers; each keeps a forked worker for a minute; PSS is 0.4 GB less), the driver "
        "0.44 GB. spark.python.worker.reuse = false saves about 0.5 GB at the peak (planning "
        "workers exit after use) but costs each batch about 0.4 s (catch-up 5% slower: every "
        "task imports PyArrow and pgcdc again), so it is not the default. Measured with the "
        "batch cached serialized in column batches of 1,000 rows and 4 MB G1 regions"
    ),
    "memory-driver-512m": (
        "the same with spark.driver.memory = 512m: the JVM peaks at 0.9-1.2 GB instead of "
        "1.4-1.5 GB, the whole at 2.2-2.5 GiB. bytes_per_commit follows the heap (37 MiB of "
        "values). Every size passes, 2.15 GB of WAL in 96-100 s. The run before (cached "
        "deserialized, 1 MB G1 regions, spill readers reading ahead) passed up to 1.08 GB and "
        "ran this heap out at 2.15 GB in one of two runs: some 80 spill readers of the "
        "per-key sort held three 1 MiB buffers each outside Spark's memory accounting; the "
        "runs before cached batches of 1,000 rows failed from 0.54 GB. Under 1 GB is out of "
        "reach for a pipeline with a Spark JVM and Spark's Python workers"
    ),
    "latency": (
        "about 0.5-0.7 s per micro-batch whatever its size: the overview job that also reads "
        "and persists the batch (about 40% of the driver's batch time), the mirror's events "
        "collected as Arrow (15%), the delta-rs MERGE (20%), the streaming engine's offset "
        "and commit logs between batches; latency = waiting for the batch in progress + one "
        "batch. Before this run (p50 1.8 s, p99 3.4 to 3.7 s over three runs), every batch "
        "rebuilt its Spark expressions over py4j (their cache was keyed by the Python session "
        "object foreachBatch creates anew for every batch: two thirds of the driver's batch "
        "time) and loaded each Delta table three to four times (a fifth of the rest). Before "
        "MERGEs pruned the mirror's files by the batch's key range, each MERGE read the whole "
        "growing mirror and p99 was 13.2 s. The mirror is compacted every 100 batches (0.5 to "
        "0.7 s each, [lake] compact_files), which this run includes"
    ),
}


LIMITS["scale"] = (
    "throughput, on 2 cores shared with the source, its walsender and the native subscriber: "
    "the continuous run only just keeps up with 2,000 changes/s, each batch taking about as "
    "long as its changes took to arrive (1M rows: 11 s for 22k changes; 10M rows: 23 s for "
    "45k), so the latency is a batch's wait plus its duration and batches grow to fill it. "
    "Where a batch's time goes is not profiled yet; each Delta operation of the Spark "
    "connector has a fixed 2-4 s on this machine, and the MERGE reads the key column of the "
    "whole table for keys scattered over it. What the connector fixed: the bytes written per "
    "change (69 B at both sizes) and the disk growth (0.47 GiB/h, 0.7x the changed bytes; the "
    "delta-rs copy-on-write path left 29 MB/s of replaced files at 10M rows). Latency with "
    "the delta-rs path, in the issue: 1M p50 5.6-7.2 s / p99 13-18 s, 10M 35-60 s / 50-92 s"
)


def _load(directory: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name in BENCHMARKS:
        path = directory / f"{name}.json"
        if path.exists():
            out[name] = json.loads(path.read_text())
    # the memory benchmark with another driver heap (``--driver-memory``), after the default
    for pattern in ("catchup-x*.json", "memory-driver-*.json"):
        for path in sorted(directory.glob(pattern)):
            out[path.stem] = json.loads(path.read_text())
    return out


def _kind(name: str) -> str:
    """The benchmark a result belongs to (``memory-driver-512m`` is a ``memory`` result,
    ``catchup-x10`` a ``catchup`` one)."""
    variant = name.startswith(("memory-driver-", "catchup-x"))
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
    return [
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
            "the anchor: pg_recvlogical took 10.4-10.8 s over the same WAL whatever its options "
            "(protocol 1 or 3, binary, streaming; four runs), longer than the native "
            "subscriber, so it measures the client as much as the walsender, whose CPU for "
            "this stream is 5.2-5.5 s; see above for pgcdc",
        ],
    ]


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
            ">= 0.7x",
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
    """p50, p99 and max of a ``tools.bench.scale.stats`` dict."""
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


ROWS: dict[str, Callable[[dict[str, Any]], list[list[str]]]] = {
    "decode": _row_decode,
    "catchup": _row_catchup,
    "snapshot": _row_snapshot,
    "memory": _row_memory,
    "latency": _row_latency,
    "scale": _row_scale,
}


def markdown(results: dict[str, dict[str, Any]]) -> str:
    head = ["Figure", "pgcdc", "Anchor (same run)", "Ratio", "Goal", "Met?", "Scale", "Limit"]
    lines = [
        "# pgcdc benchmarks",
        "",
        "`make bench` (each alone: `make bench-decode`, `bench-catchup`, `bench-snapshot`, "
        "`bench-memory`, `bench-latency`, `bench-scale`; then `make bench-report`). Every "
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

    fig, grid = plt.subplots(2, 4, figsize=(24, 10))
    axes = list(grid.flat)
    axes[7].axis("off")
    notes = [f"{name}: scale {_scale(data)}, {data.get('measured_at', '?')}"
             for name, data in results.items()]  # fmt: skip
    axes[7].text(0, 1, "pgcdc benchmarks (ratios: same run, same machine)\n\n" + "\n".join(notes),
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
            f"Snapshot, scale {_scale(d)} ({d['ratio_pgcdc_to_copy']:.2f}x COPY, goal 0.7x)"
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
