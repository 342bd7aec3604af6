"""`make bench-scale`: a continuous ``pgcdc run`` under the mixed workload at 1M and 10M rows,
beside PostgreSQL's native subscriber.

Per table size (1M and 10M rows at scale 1; ``--scale`` shrinks both, and the run's length), on
two throwaway servers (a source and a subscriber):

1. Setup, not measured: the table (``tools.bench.workload``'s mixed table, rows of about 100
   bytes) loaded with ``INSERT ... SELECT generate_series``, then its primary key, ``VACUUM
   (FREEZE, ANALYZE)``; ``pgcdc run --until-caught-up`` copies it into the lake (its first run);
   the native subscriber (``CREATE SUBSCRIPTION ... WITH (copy_data = true)`` on the second
   server) copies it too, until every table of the subscription is ready.
2. ``pgcdc run`` continuously in a subprocess (``local[2]``, ``trigger_interval`` 0.5 s), its
   process tree's memory sampled every 0.2 s (``harness.MemorySampler``: RSS summed over the
   tree, a child caught between fork and exec counted once). Warm-up: a transaction until both
   the lake and the subscriber have it, twice (after its first batch, a run does its first
   maintenance: a vacuum and the purge check, which hold up the next batch).
3. The workload: 2,000 changes/s for 120 s at scale 1 (at least 30 s), transactions of 20
   changes: 14 updates and 2 deletes of distinct, uniformly random existing keys and 4 inserts of
   new keys (70/20/10), one writer connection, one round trip per transaction (a server
   function); then until the lake and the subscriber have the last transaction.

Measured, over the transactions committed after the first 5 s (the stream settling):

* **commit-to-lake latency** per source transaction: the writer reads the WAL insert position
  in each transaction after its changes (``pg_current_wal_insert_lsn()``, the function's last
  statement), which is below that transaction's commit LSN and above every earlier one's (one
  writer: every earlier transaction had committed). Each mirror commit's ``userMetadata``
  holds its batch's LSN range, ``max_lsn`` the largest commit LSN it applied, and the pipeline
  applies whole transactions in commit order; so the transaction is in the lake with the first
  batch whose ``max_lsn`` reaches that position (exact, not a bound), at that batch's last mirror
  commit's ``commitInfo.timestamp``. Latency = that time - the transaction's commit timestamp
  on the source (``track_commit_timestamp = on``; ``pg_xact_commit_timestamp`` of its xid, read
  after the run; one machine, one clock);
* **the native subscriber's lag** per transaction: each transaction also inserts a row into a
  small tick table, published to the subscriber only (not to pgcdc). On the subscriber a
  ``BEFORE INSERT`` trigger (``ENABLE ALWAYS``: it fires in the apply worker) stamps the row
  with ``clock_timestamp()`` as the worker applies it, just before it commits. Lag = that time -
  the same commit timestamp;
* **batches**: each batch's duration from the pipeline's log (``batch N: ... , X.XX s``) and
  what its commits wrote into the mirror's folder: new Parquet files, new deletion vector
  files (named in the log), the commit's own log entry and checksum file; per change of the
  batch too. Checkpoints of the log (every 10 commits) and maintenance commits (compaction,
  purge) are counted apart;
* **the lake's disk growth** over the workload (every file under the lake, the streaming
  checkpoint included; Delta keeps replaced files until a vacuum, 168 h by default) per hour,
  beside the changed bytes (changes x the table's average row size) per hour;
* **peak memory** (RSS, PSS) of the continuous run's process tree;
* **the key index** (indexed write): the time its build took (the initial copy's last step
  builds it from the copied table) beside the initial copy's, and its files' bytes a row.

Goals (issue 44's): p99 commit-to-lake latency under 5 s at 10M rows; batch duration (median)
at 10M rows at most 1.2x that at 1M; bytes written per batch proportional to the batch's changes,
not to the table: the median bytes per change at 10M rows at most 1.5x that at 1M (10x the
rows); the lake's disk growth a small multiple of the changed bytes, read as at most 5x. Written
to ``bench-results/scale.json``.
"""

from __future__ import annotations

import argparse
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from psycopg import sql

from pgcdc.cli.throwaway_server import Cluster
from pgcdc.lsn import Lsn
from tools.bench.harness import (
    LakeLog,
    MemorySampler,
    PgcdcRun,
    add_common_arguments,
    add_writes_argument,
    at_subscriber,
    batch_lines,
    bench_cluster,
    commit_time,
    connect,
    log,
    log_entry,
    parse_writes,
    pgcdc_metadata,
    scalar,
    scaled,
    scratch_dir,
    stats,
    stop_process,
    subscribe_natively,
    subscription_ready,
    tick_times,
    wait_for,
    write_result,
)
from tools.bench.workload import (
    MixedKeys,
    MixedTxn,
    MixedWriter,
    commit_times,
    create_mixed_tables,
    load_mixed_table,
)

NAME = "scale"
FULL_SIZES = (1_000_000, 10_000_000)
RATE = 2000.0
SECONDS = 120.0
MIN_SECONDS = 30.0
PER_TXN = 20
TRIGGER = 0.5
WARMUP = 5.0
WARMUP_TRANSACTIONS = 2
TABLE = "bench_mixed"
TICK = "bench_tick"

GOAL_P99 = 5.0
GOAL_DURATION_RATIO = 1.2
GOAL_BYTES_RATIO = 1.5
GOAL_GROWTH = 5.0


def _say(text: str) -> None:
    log(NAME, text)


def q(template: str) -> sql.Composed:
    """SQL naming the benchmark's tables as ``{table}`` and ``{tick}``."""
    return sql.SQL(template).format(table=sql.Identifier(TABLE), tick=sql.Identifier(TICK))


# -- the mirror's Delta log ------------------------------------------------------------------

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}


def _z85_uuid(text: str) -> uuid.UUID:
    """A UUID from Delta's 20-character Base85 (Z85 alphabet) form."""
    data = bytearray()
    for i in range(0, 20, 5):
        value = 0
        for c in text[i : i + 5]:
            value = value * 85 + _Z85_VALUE[c]
        data += value.to_bytes(4, "big")
    return uuid.UUID(bytes=bytes(data))


def deletion_vector_file(table_dir: Path, dv: dict[str, Any]) -> Path | None:
    """The file a deletion vector descriptor names (None for an inline one)."""
    kind, where = dv.get("storageType"), str(dv.get("pathOrInlineDv", ""))
    if kind == "p":
        return Path(where.removeprefix("file:"))
    if kind != "u" or len(where) < 20:
        return None
    prefix, encoded = where[:-20], where[-20:]
    name = f"deletion_vector_{_z85_uuid(encoded)}.bin"
    return table_dir / prefix / name if prefix else table_dir / name


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def mirror_commits(table_dir: Path) -> list[dict[str, Any]]:
    """Each commit of the mirror's Delta log, in order: version, time (s), operation, pgcdc's
    metadata, and the bytes it wrote into the table's folder: Parquet files it added that no
    earlier commit had (a deletion vector added to a file re-adds the file's path), deletion
    vector files it named first, its log entry and checksum file (``*.crc``)."""
    out: list[dict[str, Any]] = []
    seen_files: set[str] = set()
    seen_dvs: set[Path] = set()
    log_dir = table_dir / "_delta_log"
    for path in sorted(log_dir.glob("*.json")):
        if not path.stem.isdigit():
            continue
        version = int(path.stem)
        info, actions = log_entry(path)
        data_bytes = dv_bytes = files_added = dvs_added = 0
        for action in actions:
            add = action.get("add")
            if add is None:
                continue
            if add["path"] not in seen_files:
                seen_files.add(add["path"])
                data_bytes += int(add.get("size", 0))
                files_added += 1
            dv = add.get("deletionVector")
            if dv:
                dv_path = deletion_vector_file(table_dir, dv)
                if dv_path is not None and dv_path not in seen_dvs:
                    seen_dvs.add(dv_path)
                    dv_bytes += _size(dv_path) or int(dv.get("sizeInBytes", 0))
                    dvs_added += 1
        out.append(
            {
                "version": version,
                "time": commit_time(info, path),
                "operation": info.get("operation"),
                "pgcdc": pgcdc_metadata(info),
                "data_bytes": data_bytes,
                "dv_bytes": dv_bytes,
                "log_bytes": _size(path) + _size(log_dir / f"{path.stem}.crc"),
                "files_added": files_added,
                "dvs_added": dvs_added,
                "metrics": info.get("operationMetrics") or {},
            }
        )
    return out


def checkpoint_bytes(table_dir: Path) -> int:
    """The bytes of the log's checkpoints (and their sidecar files)."""
    log_dir = table_dir / "_delta_log"
    total = sum(_size(p) for p in log_dir.glob("*.checkpoint*"))
    return total + sum(_size(p) for p in (log_dir / "_sidecars").glob("*"))


def batches_of(commits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pgcdc's data commits grouped by batch, in order: the batch, its LSN range and changes,
    its last commit's time, and what its commits wrote."""
    batches: dict[int, dict[str, Any]] = {}
    for c in commits:
        meta = c["pgcdc"]
        if not meta or "batch" not in meta or meta.get("max_lsn") in (None, "-"):
            continue
        b = batches.setdefault(
            int(meta["batch"]),
            {
                "batch": int(meta["batch"]),
                "min_lsn": int(Lsn.parse(meta["min_lsn"])),
                "max_lsn": int(Lsn.parse(meta["max_lsn"])),
                "changes": int(meta.get("changes", 0)),
                "time": c["time"],
                "commits": 0,
                "data_bytes": 0,
                "dv_bytes": 0,
                "log_bytes": 0,
                "files_added": 0,
                "dvs_added": 0,
            },
        )
        b["time"] = max(b["time"], c["time"])
        b["commits"] += 1
        for key in ("data_bytes", "dv_bytes", "log_bytes", "files_added", "dvs_added"):
            b[key] += c[key]
    return sorted(batches.values(), key=lambda b: b["max_lsn"])


def lake_size(path: Path) -> tuple[int, int, int]:
    """(bytes, bytes allocated on disk, files) of every file under ``path``."""
    size = allocated = files = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            size += st.st_size
            allocated += st.st_blocks * 512
            files += 1
    return size, allocated, files


# -- one run ---------------------------------------------------------------------------------


def _subscribe(src: Any, dst: Any, source: Cluster) -> None:
    """The native subscriber: the tables (the tick table stamped by its trigger) and a
    subscription copying the table first."""
    create_mixed_tables(dst, TABLE, TICK)
    subscribe_natively(src, dst, source, TICK, q("TABLE {table}, {tick}"))


def _one_txn(conn: Any, keys: MixedKeys, seq: int) -> MixedTxn:
    """One transaction of the workload outside the writer (the warm-up)."""
    upd, ins, dels = keys.transaction(14, 4, 2)
    row = conn.execute(
        "SELECT bench_mixed_txn(%s, %s, %s, %s)",
        (seq, upd.tolist(), ins.tolist(), dels.tolist()),
    ).fetchone()
    assert row is not None
    return MixedTxn.parse(seq, row[0], time.time())


def run_mixed(
    rows: int,
    *,
    rate: float = RATE,
    seconds: float = SECONDS,
    trigger: float = TRIGGER,
    per_txn: int = PER_TXN,
    name: str = NAME,
    write: str = "indexed",
) -> dict[str, Any]:
    """The mixed workload at ``rows`` rows against a continuous ``pgcdc run`` (``[lake] write``
    ``write``) and the native subscriber (see the module's doc); the measurements as a dict."""
    with (
        bench_cluster({"track_commit_timestamp": "on"}) as source,
        bench_cluster() as target,
        scratch_dir(name) as workdir,
        connect(source) as src,
        connect(target) as dst,
    ):
        _say(f"{rows:,} rows, {write} write: loading the table")
        started = time.perf_counter()
        row_bytes = load_mixed_table(src, TABLE, TICK, rows)
        load_seconds = time.perf_counter() - started
        table_bytes = int(scalar(src, "SELECT pg_table_size(%s::regclass)", (TABLE,)))
        _say(f"loaded in {load_seconds:.1f} s ({row_bytes:.0f} bytes a row); pgcdc's first run")
        pipeline = PgcdcRun(
            workdir,
            source.dsn(),
            [f"public.{TABLE}"],
            stream={"trigger_interval": trigger},
            lake_extra=f'write = "{write}"\n',
        )
        first = pipeline.run().check("first run: the initial copy")
        _say(f"pgcdc copied the table in {first.seconds:.1f} s; the native subscriber's copy")
        started = time.perf_counter()
        _subscribe(src, dst, source)
        wait_for(
            "the native subscriber's initial copy",
            lambda: subscription_ready(dst),
            timeout=3 * 3600,
            interval=0.5,
        )
        native_copy_seconds = time.perf_counter() - started
        _say(f"the native subscriber copied it in {native_copy_seconds:.1f} s")

        keys = MixedKeys(rows)
        table_dir = pipeline.lake / "public" / TABLE
        logfile = workdir / "run-continuous.log"
        _say(f"pgcdc run (continuous, trigger interval {trigger:g} s)")
        proc = pipeline.start()
        sampler = MemorySampler(proc.pid).start()
        try:
            wait_for(
                "the continuous stream to start",
                lambda: "stream started" in logfile.read_text() or proc.poll() is not None,
                timeout=600,
                interval=0.5,
            )

            def alive() -> None:
                if proc.poll() is not None:
                    raise RuntimeError(f"pgcdc run exited:\n{logfile.read_text()[-6000:]}")

            lake = LakeLog({TABLE: table_dir})

            def in_lake(txn: MixedTxn) -> bool:
                alive()
                return lake.has_all({TABLE: txn.lsn})

            def applied(txn: MixedTxn) -> bool:
                return at_subscriber(dst, TICK, txn.seq)

            alive()
            # warm-up: a transaction until the lake has it, twice: the first batch of a run is
            # followed by its first maintenance (a vacuum, the purge check), which holds up the
            # next batch; the second arrives after it
            for seq in range(1 - WARMUP_TRANSACTIONS, 1):
                warm = _one_txn(src, keys, seq)
                wait_for("a warm-up transaction in the lake", partial(in_lake, warm), 900, 0.2)
                wait_for("it at the subscriber", partial(applied, warm), 600, 0.2)
            time.sleep(2)
            before = lake_size(pipeline.lake)
            _say(
                f"writer: {rate:,.0f} changes/s in transactions of {per_txn} (70/20/10) for "
                f"{seconds:.0f} s"
            )
            writer = MixedWriter(source.dsn(), keys, rate=rate, seconds=seconds, per_txn=per_txn)
            writer.start()
            writer.join()
            if writer.error is not None:
                raise writer.error
            if not writer.commits:
                raise RuntimeError("the writer committed nothing")
            last = writer.commits[-1]
            _say(f"{writer.changes:,} changes written; waiting for the lake and the subscriber")
            drain = time.perf_counter()
            wait_for("the lake to have the last transaction", lambda: in_lake(last), 1800, 0.5)
            wait_for("the subscriber to have it", lambda: applied(last), 1800, 0.5)
            drain_seconds = time.perf_counter() - drain
            after = lake_size(pipeline.lake)
        finally:
            stop_process(proc)
            sampler.stop()
        output = logfile.read_text()
        applied_at = tick_times(dst, TICK)
        committed = commit_times(src, writer.commits)
        commits = mirror_commits(table_dir)
        lake.refresh()
        checkpoints = checkpoint_bytes(table_dir)
        mirror_after = lake_size(table_dir)
        index_after = lake_size(pipeline.lake / "_pgcdc" / "index" / "public" / TABLE)

    # the server's commit timestamps where it has them (the writer's clock after COMMIT
    # returned is up to a round trip later: a subscriber may have applied the transaction then)
    txns = [replace(t, committed_at=committed.get(t.seq, t.committed_at)) for t in writer.commits]
    start = txns[0].committed_at + WARMUP
    measured = [t for t in txns if t.committed_at >= start] or txns
    batches = batches_of(commits)
    arrived = [lake.arrival(t.lsn, [TABLE]) for t in measured]
    latency = [
        at - t.committed_at for t, at in zip(measured, arrived, strict=True) if at is not None
    ]
    native = [applied_at[t.seq] - t.committed_at for t in measured if t.seq in applied_at]

    # the batches that applied measured transactions
    lo, hi = measured[0].lsn, measured[-1].lsn
    window = [b for b in batches if b["max_lsn"] >= lo and b["min_lsn"] <= hi]
    logged = {line.batch: line for line in batch_lines(output)}
    per_batch = []
    for b in window:
        line = logged.get(b["batch"])
        batch_seconds = None if line is None else line.seconds
        written = b["data_bytes"] + b["dv_bytes"] + b["log_bytes"]
        per_batch.append(
            {
                "batch": b["batch"],
                "changes": b["changes"],
                "seconds": batch_seconds,
                "bytes": written,
                "data_bytes": b["data_bytes"],
                "dv_bytes": b["dv_bytes"],
                "log_bytes": b["log_bytes"],
                "files_added": b["files_added"],
                "deletion_vectors_added": b["dvs_added"],
                "commits": b["commits"],
            }
        )
    durations = [p["seconds"] for p in per_batch if p["seconds"] is not None]
    # every other commit after the initial copy: vacuums, compactions, purges
    copied = max((c["version"] for c in commits if (c["pgcdc"] or {}).get("snapshot")), default=0)
    maintenance = [
        c for c in commits if c["version"] > copied and not (c["pgcdc"] and "batch" in c["pgcdc"])
    ]
    maintenance_ops = Counter(str(c["operation"]) for c in maintenance)
    later = [c for c in maintenance if c["time"] >= txns[0].committed_at]

    changes = writer.changes
    changed_bytes = changes * row_bytes
    growth = after[0] - before[0]
    per_hour = 3600.0 / writer.elapsed
    return {
        "rows": rows,
        "write": write,
        "row_bytes": row_bytes,
        "table_bytes": table_bytes,
        "load_seconds": load_seconds,
        "initial_copy_seconds": {
            "pgcdc": first.seconds,
            "native_subscription": native_copy_seconds,
        },
        "workload": {
            "target_changes_per_second": rate,
            "achieved_changes_per_second": changes / writer.elapsed,
            "seconds": seconds,
            "elapsed_seconds": writer.elapsed,
            "changes_per_transaction": per_txn,
            "updates_inserts_deletes_per_transaction": [
                writer.updates,
                writer.inserts,
                writer.deletes,
            ],
            "transactions": len(txns),
            "transactions_late": writer.late,
            "changes": changes,
            "rows_after": keys.n,
            "drain_seconds": drain_seconds,
        },
        "transactions_measured": len(measured),
        "latency_seconds": stats(latency),
        "native_lag_seconds": stats(native),
        "latency_method": (
            "pgcdc: the mirror commit (commitInfo.timestamp) of the first batch whose max_lsn "
            "reaches the WAL insert position read in the transaction after its changes; native: "
            "the subscriber's BEFORE INSERT trigger's clock_timestamp() on the transaction's tick "
            "row; both minus the source's commit timestamp (track_commit_timestamp)"
        ),
        "commit_timestamps": f"{len(committed)} of {len(txns)} from the server",
        "batches": {
            "count": len(per_batch),
            "seconds": stats(durations),
            "changes": stats([p["changes"] for p in per_batch]),
            "bytes": stats([p["bytes"] for p in per_batch]),
            "bytes_per_change": stats(
                [p["bytes"] / p["changes"] for p in per_batch if p["changes"]]
            ),
            "data_bytes": stats([p["data_bytes"] for p in per_batch]),
            "dv_bytes": stats([p["dv_bytes"] for p in per_batch]),
            "log_bytes": stats([p["log_bytes"] for p in per_batch]),
            "files_added": stats([p["files_added"] for p in per_batch]),
            "deletion_vectors_added": stats([p["deletion_vectors_added"] for p in per_batch]),
            "per_batch": per_batch,
        },
        "maintenance": {
            "commits_during_workload": len(later),
            "commits_total": len(maintenance),
            "operations": dict(maintenance_ops),
            "bytes_during_workload": sum(
                c["data_bytes"] + c["dv_bytes"] + c["log_bytes"] for c in later
            ),
        },
        "lake": {
            "bytes_before": before[0],
            "bytes_after": after[0],
            "files_before": before[2],
            "files_after": after[2],
            "growth_bytes": growth,
            "growth_allocated_bytes": after[1] - before[1],
            "growth_bytes_per_hour": growth * per_hour,
            "growth_allocated_bytes_per_hour": (after[1] - before[1]) * per_hour,
            "changed_bytes": changed_bytes,
            "changed_bytes_per_hour": changed_bytes * per_hour,
            "growth_to_changed": growth / changed_bytes if changed_bytes else None,
            "mirror_bytes_after": mirror_after[0],
            "mirror_files_after": mirror_after[2],
            "mirror_checkpoint_bytes": checkpoints,
            "mirror_commits": len(commits),
        },
        "memory": {
            "peak_rss_bytes": sampler.peak_rss_kb * 1024,
            "peak_pss_bytes": sampler.peak_pss_kb * 1024,
            "peak_rss_by_process_bytes": {k: v * 1024 for k, v in sampler.by_process.items()},
            "pre_exec_samples": sampler.pre_exec_samples,
            "pre_exec_discounted_max_bytes": sampler.pre_exec_max_rss_kb * 1024,
            "pre_exec_samples_by_parent_and_child": dict(sampler.pre_exec_kinds),
        },
        "pgcdc_batches_logged": len(logged),
        "key_index": key_index(first.output + output, index_after[0], keys.n),
    }


_INDEX_BUILT = re.compile(rf"built the key index of \S*\b{TABLE} at \d+: (\d+) keys in ([0-9.]+) s")


def key_index(output: str, disk_bytes: int, rows: int) -> dict[str, Any]:
    """The mirror's key index: its build (the initial copy's last step builds it from the
    copied table: the time logged, a Spark job reading the key column of every file; ``output``
    holds the copy's run and the continuous one) and its files on disk (base and segments) per
    row at the end (nothing for the MERGE write)."""
    built = _INDEX_BUILT.findall(output)
    return {
        "built_keys": int(built[0][0]) if built else None,
        "build_seconds": float(built[0][1]) if built else None,
        "disk_bytes": disk_bytes,
        "disk_bytes_per_row": disk_bytes / rows if rows else None,
    }


def measure(
    scale: float,
    sizes: Sequence[int] = FULL_SIZES,
    *,
    rate: float = RATE,
    trigger: float = TRIGGER,
    writes: Sequence[str] = ("indexed",),
) -> dict[str, Any]:
    """Each size with each of ``writes`` (``[lake] write``); the goals are the first's, the
    others' runs are beside it (``beside``: per write, its runs by size)."""
    seconds = max(MIN_SECONDS, SECONDS * scale)
    rows = [scaled(n, scale, minimum=10_000) for n in sizes]
    by_write = {
        write: [
            run_mixed(n, rate=rate, seconds=seconds, trigger=trigger, write=write) for n in rows
        ]
        for write in writes
    }
    runs = by_write[writes[0]]
    small, large = runs[0], runs[-1]
    p99 = large["latency_seconds"]["p99"]
    compared = len(runs) > 1

    def ratio(key: str) -> float | None:
        a, b = small["batches"][key]["p50"], large["batches"][key]["p50"]
        return b / a if compared and a and b is not None else None

    duration_ratio, bytes_ratio = ratio("seconds"), ratio("bytes_per_change")
    growth = [r["lake"]["growth_to_changed"] for r in runs]
    return {
        "sizes": runs,
        "write": writes[0],
        "beside": {write: by_write[write] for write in writes[1:]},
        "rate": rate,
        "seconds": seconds,
        "trigger_interval": trigger,
        "ratio_batch_seconds_largest_to_smallest": duration_ratio,
        "ratio_bytes_per_change_largest_to_smallest": bytes_ratio,
        "goals": {
            "p99_below": GOAL_P99,
            "p99_at_rows": large["rows"],
            "p99_met": p99 is not None and p99 < GOAL_P99,
            "batch_seconds_ratio_at_most": GOAL_DURATION_RATIO,
            "batch_seconds_met": (
                None if duration_ratio is None else duration_ratio <= GOAL_DURATION_RATIO
            ),
            "bytes_per_change_ratio_at_most": GOAL_BYTES_RATIO,
            "bytes_per_change_met": (
                None if bytes_ratio is None else bytes_ratio <= GOAL_BYTES_RATIO
            ),
            "growth_to_changed_at_most": GOAL_GROWTH,
            "growth_met": all(g is not None and g <= GOAL_GROWTH for g in growth),
            "rate_met": all(
                r["workload"]["achieved_changes_per_second"] >= 0.95 * rate for r in runs
            ),
        },
        "pgcdc_mode": "subprocess: python -m pgcdc run (continuous, own JVM, local[2])",
    }


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.scale", description=__doc__)
    add_common_arguments(parser)
    parser.add_argument(
        "--sizes",
        default=",".join(str(n) for n in FULL_SIZES),
        help="table sizes in rows at scale 1, comma-separated (scaled); default 1M and 10M",
    )
    add_writes_argument(parser)
    parser.add_argument("--rate", type=float, default=RATE, help="changes per second")
    parser.add_argument("--trigger", type=float, default=TRIGGER, help="trigger interval, s")
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",") if s.strip()]
    writes = parse_writes(parser, args.writes)
    result = measure(args.scale, sizes, rate=args.rate, trigger=args.trigger, writes=writes)
    path = write_result(NAME, args.scale, result)
    print(
        f"\nmixed workload, {args.rate:,.0f} changes/s for {result['seconds']:.0f} s "
        f"(scale {args.scale:g})"
    )
    for r in [*result["sizes"], *(r for runs in result["beside"].values() for r in runs)]:
        lat, nat, b = r["latency_seconds"], r["native_lag_seconds"], r["batches"]
        print(
            f"{r['rows']:>11,} rows, {r['write']} write: lake p50/p99/max {_seconds(lat['p50'])}/"
            f"{_seconds(lat['p99'])}/{_seconds(lat['max'])} s, native "
            f"{_seconds(nat['p50'])}/{_seconds(nat['p99'])}/{_seconds(nat['max'])} s; "
            f"batches {b['count']}, median {_seconds(b['seconds']['p50'])} s, "
            f"{(b['bytes']['p50'] or 0) / 1024:,.0f} KiB "
            f"({b['bytes_per_change']['p50'] or 0:,.0f} B/change); "
            f"lake +{r['lake']['growth_bytes_per_hour'] / 2**30:.2f} GiB/h "
            f"({r['lake']['growth_to_changed'] or 0:.1f}x the changed bytes); "
            f"peak RSS {r['memory']['peak_rss_bytes'] / 2**30:.2f} GiB; "
            f"key index {_seconds(r['key_index']['build_seconds'])} s to build, "
            f"{r['key_index']['disk_bytes_per_row'] or 0:.1f} B a row on disk; "
            f"{r['workload']['achieved_changes_per_second']:,.0f} changes/s"
        )
    goals = result["goals"]
    print(
        f"p99 < {GOAL_P99:g} s at {goals['p99_at_rows']:,} rows: {goals['p99_met']}; batch "
        f"duration ratio {result['ratio_batch_seconds_largest_to_smallest']} "
        f"(<= {GOAL_DURATION_RATIO:g}: "
        f"{goals['batch_seconds_met']}); bytes/change ratio "
        f"{result['ratio_bytes_per_change_largest_to_smallest']} (<= 1.5: "
        f"{goals['bytes_per_change_met']}); growth <= {GOAL_GROWTH:g}x: {goals['growth_met']}"
    )
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
