"""`make bench-wide`: a continuous ``pgcdc run`` over a database of many small tables, beside
PostgreSQL's native subscriber (issue 42's benchmark).

Per run (10 and 100 tables by default, ``--tables 10,100,500`` for more; each with history and
changelog off, then on: ``--modes``; with the indexed write, and ``--writes indexed,merge``
runs each again with ``[lake] write = "merge"``, the MERGE per table that came before), on two
throwaway servers (a source and a subscriber):

1. Setup, not measured: N tables ``probe.t001 ...`` of 10,000 rows each (``id bigint`` primary
   key, an integer, a 40-character text, a ``numeric(12,2)``, a ``timestamptz``; about 90 bytes
   a row), loaded with ``INSERT ... SELECT generate_series``, then ``VACUUM (FREEZE,
   ANALYZE)``. One pipeline, ``[[tables]] name = "probe.*"`` (with ``[lake] history`` and
   ``changelog`` on in the second mode), copies them with ``pgcdc run --until-caught-up``; the
   native subscriber (``CREATE SUBSCRIPTION ... WITH (copy_data = true)`` on the second server,
   ``FOR TABLES IN SCHEMA probe`` and the tick table) copies them too.
2. ``pgcdc run`` continuously in a subprocess (a resumed run: ``local[2]``, ``trigger_interval``
   0.5 s), its process tree's memory sampled every 0.2 s (``harness.MemorySampler``). Its
   start-up is the time from the process's start to its ``stream started`` line. Warm-up: one
   transaction updating a row of every table (so that every table has been written once in
   this run, as in a pipeline that has been running for a while; its commit-to-lake time is
   reported as the cost of a batch touching every table), then one transaction of the
   workload, each until both the lake and the subscriber have it.
3. The workload: 500 changes/s for 120 s at scale 1 (``BENCH_SCALE`` shrinks the run, at least
   30 s, and below 1 the tables' rows too), one writer connection at a steady pace, one round
   trip per transaction (a server function): transactions of 10 changes (7 updates, 2 inserts,
   1 delete: 70/20/10) touching 1 to 3 tables (uniformly), picked at random; the changes are
   dealt out over them in a random order (every picked table gets at least one); updates and
   deletes hit distinct, uniformly random existing keys, inserts new keys. Then until the lake
   (every Delta table the workload touched) and the subscriber have every transaction.
4. Equal-changes batches: with the writer stopped, 3 transactions of 6,000 changes each
   (``BURST_CHANGES``, 70/20/10, dealt evenly over every table; fewer below scale 1), one at a
   time, each until the lake has it. A transaction is applied in one batch, so these batches
   hold the same changes whatever the number of tables: the issue's ratio ("batch time at 100
   tables at most 3x that at 10 tables for the same changes") is their medians' ratio. The
   continuous run's batches cannot give it: their size follows the batch time (a slower batch
   gathers more changes), so the 100-table batches held about 4x the changes of the 10-table
   ones.

Measured, over the transactions committed after the first 5 s (the stream settling), with
only what a user sees (the Delta tables' logs and the pipeline's log lines, nothing of how the
pipeline writes a batch):

* **commit-to-lake latency** per source transaction (``harness.LakeLog``): the writer reads the
  WAL insert position in each transaction after its changes, which is below that transaction's
  commit LSN and above every earlier one's. Each Delta commit's ``userMetadata`` holds its
  batch's LSN range for that table (``max_lsn``, the largest commit LSN of the table's changes
  it applied), and the pipeline applies whole transactions in commit order; so the transaction
  is in a Delta table with that table's first batch commit whose ``max_lsn`` reaches its
  position (exact), and in the lake when every Delta table of every table it touched has it
  (the mirrors, and with history and changelog on, those too): the latest of those commits'
  ``commitInfo.timestamp``. Latency = that time - the transaction's commit timestamp on the
  source (``track_commit_timestamp``; one machine, one clock). The mirrors alone are reported
  beside it (``mirror_latency_seconds``; the same figure with history and changelog off);
* **the native subscriber's lag** per transaction: each transaction also inserts a row into a
  tick table published to the subscriber only; a trigger there stamps it as the apply worker
  applies it (``harness.subscribe_natively``). Lag = that time - the same commit timestamp;
* **batches** that applied measured transactions, from the pipeline's log lines (``batch N: C
  changes of T tables, LSN a to b, S s``): the duration, the tables written, the changes, and
  the per-table share of a batch (its duration / its tables);
* **equal-changes batches**: each transaction's batch (its log line) and commit-to-lake time;
* **peak memory** (RSS, PSS) of the continuous run's process tree.

Goals (the issue's): at 100 tables and 500 changes/s, history and changelog off, p99
commit-to-lake latency under 30 s; the median equal-changes batch at 100 tables at most 3x as
long as at 10 tables. Written to ``bench-results/wide.json``; a run that fails (or does
not drain within ``--drain-timeout``) is recorded with its error and the others still run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from tools.bench.harness import (
    BatchLine,
    LakeLog,
    MemorySampler,
    PgcdcRun,
    add_common_arguments,
    add_writes_argument,
    at_subscriber,
    batch_lines,
    bench_cluster,
    connect,
    log,
    parse_writes,
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
    PacedWriter,
    TxnCall,
    commit_times,
    create_tick_table,
)

NAME = "wide"
SCHEMA = "probe"
TICK = "bench_tick"
TABLE_COUNTS = (10, 100)
ROWS = 10_000
MIN_ROWS = 1_000
RATE = 500.0
SECONDS = 120.0
MIN_SECONDS = 30.0
PER_TXN = 10
TABLES_PER_TXN = (1, 3)
TRIGGER = 0.5
WARMUP = 5.0
DRAIN_TIMEOUT = 7200.0
SEED = 42_000
BURSTS = 3
BURST_CHANGES = 6_000

GOAL_P99 = 30.0
GOAL_P99_TABLES = 100
GOAL_BATCH_RATIO = 3.0

_TABLE = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    qty integer NOT NULL,
    note text NOT NULL,
    price numeric(12,2) NOT NULL,
    updated_at timestamptz NOT NULL
)
"""

#: a row's values from its id (the load and the workload's inserts)
_ROW_FUNCTION = """
CREATE FUNCTION bench_wide_row(
    g bigint, OUT id bigint, OUT qty integer, OUT note text, OUT price numeric,
    OUT updated_at timestamptz
) LANGUAGE sql IMMUTABLE AS $$
SELECT g, mod(g, 1000)::integer, left(md5(g::text) || md5((g + 1)::text), 40),
       (mod(g, 100000) / 100.0)::numeric(12,2),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
$$
"""

_LOAD = (
    "INSERT INTO {table} SELECT r.* FROM generate_series(1, %s::bigint) AS g, "
    "bench_wide_row(g) AS r"
)

#: one transaction of the workload: ``tabs[i]`` gets change ``ops[i]`` (U, I, D) of key
#: ``ids[i]``, one statement per table and kind in the order they first appear; then its tick
#: row; returns ``'<xid> <WAL insert position after its changes>'`` (``MixedTxn.parse``)
_TXN_FUNCTION = """
CREATE FUNCTION bench_wide_txn(p_seq bigint, p_tabs text[], p_ops text[], p_ids bigint[])
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    target text;
    action text;
    keys bigint[];
BEGIN
    FOR target, action IN
        SELECT c.tb, c.op FROM unnest(p_tabs, p_ops) WITH ORDINALITY AS c(tb, op, n)
        GROUP BY c.tb, c.op ORDER BY min(c.n)
    LOOP
        keys := ARRAY(
            SELECT c.key FROM unnest(p_tabs, p_ops, p_ids) AS c(tb, op, key)
            WHERE c.tb = target AND c.op = action
        );
        IF action = 'U' THEN
            EXECUTE format(
                'UPDATE %I.%I SET qty = qty + 1, price = price + 1, '
                'updated_at = clock_timestamp() WHERE id = ANY ($1)', {schema}, target
            ) USING keys;
        ELSIF action = 'I' THEN
            EXECUTE format(
                'INSERT INTO %I.%I SELECT r.* FROM unnest($1) AS g, bench_wide_row(g) AS r',
                {schema}, target
            ) USING keys;
        ELSE
            EXECUTE format('DELETE FROM %I.%I WHERE id = ANY ($1)', {schema}, target)
            USING keys;
        END IF;
    END LOOP;
    INSERT INTO {tick} (seq) VALUES (p_seq);
    RETURN pg_current_xact_id()::text || ' ' || pg_current_wal_insert_lsn()::text;
END
$$
"""

_CALL = sql.SQL("SELECT bench_wide_txn(%s, %s, %s, %s)")


def _say(text: str) -> None:
    log(NAME, text)


def table_names(count: int) -> list[str]:
    width = max(3, len(str(count)))
    return [f"t{i:0{width}d}" for i in range(1, count + 1)]


def create_tables(conn: psycopg.Connection[Any], names: Sequence[str]) -> None:
    """The schema, its empty tables and the tick table."""
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    for name in names:
        conn.execute(sql.SQL(_TABLE).format(table=sql.Identifier(SCHEMA, name)))
    create_tick_table(conn, TICK)


def load_tables(conn: psycopg.Connection[Any], names: Sequence[str], rows: int) -> float:
    """The tables with ``rows`` rows each (ids 1..rows), frozen and analysed, and the workload's
    functions; a row's average size in bytes (``pg_column_size``)."""
    create_tables(conn, names)
    conn.execute(_ROW_FUNCTION)
    for name in names:
        conn.execute(sql.SQL(_LOAD).format(table=sql.Identifier(SCHEMA, name)), (rows,))
    conn.execute("VACUUM (FREEZE, ANALYZE)")
    conn.execute(
        sql.SQL(_TXN_FUNCTION).format(schema=sql.Literal(SCHEMA), tick=sql.Identifier(TICK))
    )
    size = scalar(
        conn,
        sql.SQL("SELECT avg(pg_column_size(t.*)) FROM {} AS t").format(
            sql.Identifier(SCHEMA, names[0])
        ),
    )
    return float(size or 0.0)


#: ``bench_wide_txn``'s arrays: each change's table, kind (U, I, D) and key
_Arrays = tuple[list[str], list[str], list[int]]


def _deal(arrays: _Arrays, name: str, upd: Any, ins: Any, dels: Any) -> None:
    """Table ``name``'s updates, inserts and deletes of these keys added to ``arrays``."""
    tabs, kinds, ids = arrays
    for kind, keys in (("U", upd), ("I", ins), ("D", dels)):
        tabs += [name] * len(keys)
        kinds += [kind] * len(keys)
        ids += keys.tolist()


@dataclass
class WideWorkload:
    """The transactions: each picks 1 to 3 tables (uniformly) and deals its 7 updates, 2
    inserts and 1 delete over them in a random order, every picked table getting at least one;
    the keys come from each table's ``MixedKeys`` (distinct random existing keys, new ids).
    Seeded, so a run is repeatable."""

    names: Sequence[str]
    rows: int
    per_txn: int = PER_TXN
    keys: list[MixedKeys] = field(default_factory=list)
    rng: Any = None

    def __post_init__(self) -> None:
        self.keys = [MixedKeys(self.rows, seed=SEED + i) for i in range(len(self.names))]
        self.rng = np.random.default_rng(SEED)
        self.updates = round(self.per_txn * 0.7)
        self.inserts = round(self.per_txn * 0.2)
        self.deletes = self.per_txn - self.updates - self.inserts

    def transaction(self) -> tuple[tuple[Any, ...], tuple[str, ...]]:
        """The function's arrays (tables, kinds, keys) and the tables touched."""
        low, high = TABLES_PER_TXN
        k = int(self.rng.integers(low, high + 1))
        picked = [int(i) for i in self.rng.choice(len(self.names), size=k, replace=False)]
        ops = self.rng.permutation(
            ["U"] * self.updates + ["I"] * self.inserts + ["D"] * self.deletes
        )
        arrays: _Arrays = ([], [], [])
        for j, t in enumerate(picked):
            mine = list(ops[j::k])
            counts = mine.count("U"), mine.count("I"), mine.count("D")
            _deal(arrays, self.names[t], *self.keys[t].transaction(*counts))
        touched = tuple(self.names[t] for t in picked)
        return arrays, touched

    def burst(self, changes: int) -> tuple[tuple[Any, ...], tuple[str, ...]]:
        """One transaction of ``changes`` changes dealt evenly over every table, each table's
        share 70% updates, 20% inserts and 10% deletes (the equal-changes batches)."""
        arrays: _Arrays = ([], [], [])
        count = len(self.names)
        for t, (name, keys) in enumerate(zip(self.names, self.keys, strict=True)):
            share = changes // count + (1 if t < changes % count else 0)
            updates, inserts = round(share * 0.7), round(share * 0.2)
            _deal(arrays, name, *keys.transaction(updates, inserts, share - updates - inserts))
        return arrays, tuple(self.names)

    def touch_all(self) -> tuple[tuple[Any, ...], tuple[str, ...]]:
        """One update of a random row in every table (the warm-up)."""
        tabs, ids = [], []
        for name, keys in zip(self.names, self.keys, strict=True):
            upd, _, _ = keys.transaction(1, 0, 0)
            tabs.append(name)
            ids.append(int(upd[0]))
        return (tabs, ["U"] * len(tabs), ids), tuple(self.names)


class WideWriter(PacedWriter):
    """The workload at ``rate`` changes/s for ``seconds`` (``bench_wide_txn``)."""

    def __init__(self, dsn: str, workload: WideWorkload, *, rate: float, seconds: float) -> None:
        super().__init__(dsn, rate=rate, seconds=seconds, per_txn=workload.per_txn)
        self.workload = workload

    def call(self, seq: int) -> TxnCall:
        arrays, touched = self.workload.transaction()
        return _CALL, (seq, *arrays), touched


def _one_txn(
    conn: psycopg.Connection[Any], seq: int, made: tuple[tuple[Any, ...], tuple[str, ...]]
) -> MixedTxn:
    """One transaction outside the writer (the warm-up)."""
    arrays, touched = made
    row = conn.execute(_CALL, (seq, *arrays)).fetchone()
    assert row is not None
    return MixedTxn.parse(seq, row[0], time.time(), touched)


# -- one run ---------------------------------------------------------------------------------


def run_wide(
    count: int,
    rows: int,
    *,
    history: bool,
    write: str = "indexed",
    rate: float = RATE,
    seconds: float = SECONDS,
    trigger: float = TRIGGER,
    drain_timeout: float = DRAIN_TIMEOUT,
    burst: int = BURST_CHANGES,
) -> dict[str, Any]:
    """The workload over ``count`` tables of ``rows`` rows against a continuous ``pgcdc run``
    (history and changelog on or off; ``[lake] write`` ``write``) and the native subscriber
    (see the module's doc)."""
    names = table_names(count)
    kinds = ("mirror", "history", "changelog") if history else ("mirror",)
    mode = ("history and changelog on" if history else "history and changelog off") + (
        f", {write} write"
    )

    def delta_tables(table: str) -> list[str]:
        return [table if kind == "mirror" else f"{table}.{kind}" for kind in kinds]

    with (
        bench_cluster({"track_commit_timestamp": "on"}) as source,
        bench_cluster() as target,
        scratch_dir(f"{NAME}-{count}") as workdir,
        connect(source) as src,
        connect(target) as dst,
    ):
        _say(f"{count} tables of {rows:,} rows, {mode}: loading them")
        started = time.perf_counter()
        row_bytes = load_tables(src, names, rows)
        load_seconds = time.perf_counter() - started
        pipeline = PgcdcRun(
            workdir,
            source.dsn(),
            [f"{SCHEMA}.*"],
            stream={"trigger_interval": trigger},
            lake_extra=(
                ("history = true\nchangelog = true\n" if history else "") + f'write = "{write}"\n'
            ),
        )
        _say(f"loaded in {load_seconds:.1f} s ({row_bytes:.0f} bytes a row); pgcdc's first run")
        first = pipeline.run().check("first run: the initial copy")
        _say(f"pgcdc copied the tables in {first.seconds:.1f} s; the native subscriber's copy")
        started = time.perf_counter()
        create_tables(dst, names)
        subscribe_natively(
            src,
            dst,
            source,
            TICK,
            sql.SQL("TABLES IN SCHEMA {}, TABLE {}").format(
                sql.Identifier(SCHEMA), sql.Identifier(TICK)
            ),
        )
        wait_for(
            "the native subscriber's initial copy",
            lambda: subscription_ready(dst),
            timeout=3 * 3600,
            interval=0.5,
        )
        native_copy_seconds = time.perf_counter() - started
        _say(f"the native subscriber copied them in {native_copy_seconds:.1f} s")

        workload = WideWorkload(names, rows)
        root = pipeline.lake / SCHEMA
        lake = LakeLog({d: root / d for t in names for d in delta_tables(t)})
        logfile = workdir / "run-continuous.log"
        _say(f"pgcdc run (continuous, trigger interval {trigger:g} s)")
        started = time.perf_counter()
        proc = pipeline.start()
        sampler = MemorySampler(proc.pid).start()
        bursts: list[MixedTxn] = []
        try:
            wait_for(
                "the continuous stream to start",
                lambda: "stream started" in logfile.read_text() or proc.poll() is not None,
                timeout=900,
                interval=0.2,
            )
            startup_seconds = time.perf_counter() - started

            def alive() -> None:
                if proc.poll() is not None:
                    raise RuntimeError(f"pgcdc run exited:\n{logfile.read_text()[-6000:]}")

            def in_lake(txns: Sequence[MixedTxn]) -> bool:
                """Whether every Delta table of every table ``txns`` touched has them."""
                alive()
                last: dict[str, int] = {}
                for txn in txns:
                    for table in txn.tables:
                        for d in delta_tables(table):
                            last[d] = max(last.get(d, 0), txn.lsn)
                return lake.has_all(last)

            def applied(txn: MixedTxn) -> bool:
                return at_subscriber(dst, TICK, txn.seq)

            alive()
            # warm-up: every table written once in this run, then a transaction of the workload
            warm = [_one_txn(src, -1, workload.touch_all())]
            wait_for("the warm-up in the lake", partial(in_lake, warm), drain_timeout, 0.5)
            wait_for("it at the subscriber", partial(applied, warm[0]), 600, 0.2)
            warm.append(_one_txn(src, 0, workload.transaction()))
            wait_for("a warm-up transaction in the lake", partial(in_lake, warm[1:]), 900, 0.2)
            wait_for("it at the subscriber", partial(applied, warm[1]), 600, 0.2)
            time.sleep(2)
            _say(
                f"writer: {rate:,.0f} changes/s in transactions of {PER_TXN} over "
                f"{TABLES_PER_TXN[0]} to {TABLES_PER_TXN[1]} tables for {seconds:.0f} s"
            )
            writer = WideWriter(source.dsn(), workload, rate=rate, seconds=seconds)
            writer.start()
            writer.join()
            if writer.error is not None:
                raise writer.error
            if not writer.commits:
                raise RuntimeError("the writer committed nothing")
            _say(f"{writer.changes:,} changes written; waiting for the lake and the subscriber")
            drain = time.perf_counter()
            wait_for(
                "the lake to have every transaction",
                partial(in_lake, writer.commits),
                drain_timeout,
                1.0,
            )
            last = writer.commits[-1]
            wait_for("the subscriber to have them", partial(applied, last), drain_timeout, 0.5)
            drain_seconds = time.perf_counter() - drain
            _say(f"{BURSTS} transactions of {burst:,} changes over every table, one at a time")
            for k in range(BURSTS):
                bursts.append(_one_txn(src, -2 - k, workload.burst(burst)))
                wait_for("the transaction in the lake", partial(in_lake, bursts[-1:]), 900, 0.2)
        finally:
            stop_process(proc)
            sampler.stop()
        output = logfile.read_text()
        lake.refresh()  # before the scratch folder goes
        applied_at = tick_times(dst, TICK)
        committed = commit_times(src, warm + writer.commits + bursts)

    # the server's commit timestamps where it has them (the writer's clock after COMMIT
    # returned is up to a round trip later: a subscriber may have applied the transaction then)
    def server_time(t: MixedTxn) -> MixedTxn:
        return replace(t, committed_at=committed.get(t.seq, t.committed_at))

    txns = [server_time(t) for t in writer.commits]
    start = txns[0].committed_at + WARMUP
    measured = [t for t in txns if t.committed_at >= start] or txns
    mirrors, everything = [], []
    for t in measured:
        at_mirrors = lake.arrival(t.lsn, t.tables)
        at_all = lake.arrival(t.lsn, [d for table in t.tables for d in delta_tables(table)])
        if at_mirrors is not None:
            mirrors.append(at_mirrors - t.committed_at)
        if at_all is not None:
            everything.append(at_all - t.committed_at)
    native = [applied_at[t.seq] - t.committed_at for t in measured if t.seq in applied_at]
    touch_all = server_time(warm[0])
    warm_at = lake.arrival(touch_all.lsn, lake.tables)

    # the batches that applied measured transactions (the equal-changes ones come after)
    lines = batch_lines(output)
    window = [
        b
        for b in lines
        if b.changes and b.max_lsn is not None and measured[0].lsn <= b.max_lsn < bursts[0].lsn
    ]

    def batch_of(txn: MixedTxn) -> BatchLine | None:
        return next((b for b in lines if b.max_lsn is not None and b.max_lsn >= txn.lsn), None)

    def batch(b: BatchLine) -> dict[str, Any]:
        return {"batch": b.batch, "changes": b.changes, "tables": b.tables, "seconds": b.seconds}

    warm_batch = batch_of(touch_all)

    equal: list[dict[str, Any]] = []
    for txn in map(server_time, bursts):
        at = lake.arrival(txn.lsn, [d for table in txn.tables for d in delta_tables(table)])
        line = batch_of(txn)
        equal.append(
            {
                "commit_to_lake_seconds": None if at is None else at - txn.committed_at,
                "batch": None if line is None else batch(line),
            }
        )

    changes = writer.changes
    return {
        "tables": count,
        "rows_per_table": rows,
        "row_bytes": row_bytes,
        "history_changelog": history,
        "write": write,
        "delta_tables": len(lake.tables),
        "load_seconds": load_seconds,
        "initial_copy_seconds": {
            "pgcdc": first.seconds,
            "native_subscription": native_copy_seconds,
        },
        "startup_seconds": startup_seconds,
        "warmup_touching_every_table": {
            "commit_to_lake_seconds": (
                None if warm_at is None else warm_at - touch_all.committed_at
            ),
            "batch": None if warm_batch is None else batch(warm_batch),
        },
        "workload": {
            "target_changes_per_second": rate,
            "achieved_changes_per_second": changes / writer.elapsed,
            "seconds": seconds,
            "elapsed_seconds": writer.elapsed,
            "changes_per_transaction": PER_TXN,
            "updates_inserts_deletes_per_transaction": [
                workload.updates,
                workload.inserts,
                workload.deletes,
            ],
            "tables_per_transaction": list(TABLES_PER_TXN),
            "tables_touched_per_transaction_mean": (
                float(np.mean([len(t.tables) for t in txns])) if txns else None
            ),
            "transactions": len(txns),
            "transactions_late": writer.late,
            "changes": changes,
            "drain_seconds": drain_seconds,
        },
        "transactions_measured": len(measured),
        "transactions_measured_in_lake": len(everything),
        "latency_seconds": stats(everything),
        "mirror_latency_seconds": stats(mirrors),
        "native_lag_seconds": stats(native),
        "latency_method": (
            "pgcdc: per transaction, the latest over every Delta table (mirror, and history and "
            "changelog when on) of every table it touched of that Delta table's first batch "
            "commit (commitInfo.timestamp) whose userMetadata max_lsn reaches the WAL insert "
            "position read in the transaction after its changes; native: the subscriber's "
            "BEFORE INSERT trigger's clock_timestamp() on the transaction's tick row; both "
            "minus the source's commit timestamp (track_commit_timestamp)"
        ),
        "commit_timestamps": f"{len(committed)} of {len(txns) + len(warm)} from the server",
        "batches": {
            "count": len(window),
            "seconds": stats([b.seconds for b in window]),
            "tables": stats([b.tables for b in window]),
            "changes": stats([b.changes for b in window]),
            "seconds_per_table": stats([b.seconds / b.tables for b in window if b.tables]),
            "per_batch": [batch(b) for b in window],
        },
        "equal_changes": {
            "changes_per_transaction": burst,
            "transactions": equal,
            "batch_seconds": stats(
                [e["batch"]["seconds"] for e in equal if e["batch"] is not None]
            ),
        },
        "memory": {
            "peak_rss_bytes": sampler.peak_rss_kb * 1024,
            "peak_pss_bytes": sampler.peak_pss_kb * 1024,
            "peak_rss_by_process_bytes": {k: v * 1024 for k, v in sampler.by_process.items()},
            "pre_exec_samples": sampler.pre_exec_samples,
            "pre_exec_discounted_max_bytes": sampler.pre_exec_max_rss_kb * 1024,
        },
        "pgcdc_batches_logged": len(lines),
    }


def _run_or_failure(
    count: int, rows: int, *, history: bool, write: str, **options: Any
) -> dict[str, Any]:
    """``run_wide``, or what failed (the other runs still run)."""
    try:
        result = run_wide(count, rows, history=history, write=write, **options)
    except Exception as exc:  # a benchmark never stops at one failed run
        result = {
            "tables": count,
            "rows_per_table": rows,
            "history_changelog": history,
            "write": write,
            "failed": f"{type(exc).__name__}: {str(exc)[:2000]}",
        }
    _say(summary(result))
    return result


def measure(
    scale: float,
    counts: Sequence[int] = TABLE_COUNTS,
    modes: Sequence[bool] = (False, True),
    writes: Sequence[str] = ("indexed",),
    *,
    rate: float = RATE,
    trigger: float = TRIGGER,
    drain_timeout: float = DRAIN_TIMEOUT,
) -> dict[str, Any]:
    seconds = max(MIN_SECONDS, SECONDS * scale)
    rows = scaled(ROWS, min(scale, 1.0), minimum=MIN_ROWS)
    burst = scaled(BURST_CHANGES, min(scale, 1.0), minimum=1_000)
    runs = [
        _run_or_failure(
            n,
            rows,
            history=history,
            write=write,
            rate=rate,
            seconds=seconds,
            trigger=trigger,
            drain_timeout=drain_timeout,
            burst=burst,
        )
        for write in writes
        for n in counts
        for history in modes
    ]
    # the goals are the default write's (the first of ``writes``); the others are beside it
    main_write = writes[0]

    def ran(history: bool, write: str = main_write) -> list[dict[str, Any]]:
        return [
            r
            for r in runs
            if r["history_changelog"] == history and r["write"] == write and "failed" not in r
        ]

    def ratio(done: list[dict[str, Any]], part: str, figure: str) -> float | None:
        """The most tables' median ``figure`` of ``part`` over the fewest tables'."""
        if len(done) < 2:
            return None
        a, b = done[0][part][figure]["p50"], done[-1][part][figure]["p50"]
        return b / a if a and b is not None else None

    ratios: dict[str, float | None] = {}
    continuous: dict[str, float | None] = {}
    for write in writes:
        for history in modes:
            done = sorted(ran(history, write), key=lambda r: r["tables"])
            key = ("on" if history else "off") + ("" if write == main_write else f" {write}")
            ratios[key] = ratio(done, "equal_changes", "batch_seconds")
            continuous[key] = ratio(done, "batches", "seconds")
    goal_run = next((r for r in ran(False) if r["tables"] == GOAL_P99_TABLES), None)
    p99 = None if goal_run is None else goal_run["latency_seconds"]["p99"]
    off = sorted(ran(False), key=lambda r: r["tables"])
    ratio_compares = f"{off[0]['tables']} -> {off[-1]['tables']} tables" if len(off) > 1 else None
    off_ratio = ratios.get("off")
    return {
        "runs": runs,
        "rate": rate,
        "seconds": seconds,
        "rows_per_table": rows,
        "trigger_interval": trigger,
        "equal_changes_per_transaction": burst,
        "ratio_batch_seconds_most_to_fewest_tables": ratios,
        "ratio_compares": ratio_compares,
        "ratio_method": (
            "median batch of the equal-changes transactions (the same changes at every table "
            "count); beside it the continuous run's median batches, whose changes differ"
        ),
        "ratio_continuous_batch_seconds_most_to_fewest_tables": continuous,
        "goals": {
            "p99_below": GOAL_P99,
            "p99_at_tables": GOAL_P99_TABLES,
            "p99_met": None if p99 is None else p99 < GOAL_P99,
            "batch_seconds_ratio_at_most": GOAL_BATCH_RATIO,
            "batch_seconds_met": None if off_ratio is None else off_ratio <= GOAL_BATCH_RATIO,
            "rate_met": all(
                r["workload"]["achieved_changes_per_second"] >= 0.95 * rate
                for r in runs
                if "failed" not in r
            ),
        },
        "pgcdc_mode": "subprocess: python -m pgcdc run (continuous, own JVM, local[2])",
    }


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def summary(r: dict[str, Any]) -> str:
    """One run's figures in a line."""
    head = (
        f"{r['tables']:>4} tables, history+changelog {'on ' if r['history_changelog'] else 'off'}"
        f", {r.get('write', 'indexed')} write:"
    )
    if "failed" in r:
        return f"{head} FAILED: {r['failed'][:300]}"
    lat, nat, b = r["latency_seconds"], r["native_lag_seconds"], r["batches"]
    median, share = b["seconds"]["p50"], b["seconds_per_table"]["p50"]
    return (
        f"{head} lake p50/p99/max {_seconds(lat['p50'])}/{_seconds(lat['p99'])}/"
        f"{_seconds(lat['max'])} s, native {_seconds(nat['p50'])}/{_seconds(nat['p99'])}/"
        f"{_seconds(nat['max'])} s; {b['count']} batches, median {_seconds(median)} s of "
        f"{b['tables']['p50'] or 0:.0f} tables ({_seconds(share)} s a table); start-up "
        f"{r['startup_seconds']:.1f} s; peak RSS {r['memory']['peak_rss_bytes'] / 2**30:.2f} "
        f"GiB; {r['workload']['achieved_changes_per_second']:,.0f} changes/s; equal-changes "
        f"batches ({r['equal_changes']['changes_per_transaction']:,} changes) median "
        f"{_seconds(r['equal_changes']['batch_seconds']['p50'])} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.wide", description=__doc__)
    add_common_arguments(parser)
    parser.add_argument(
        "--tables",
        default=",".join(str(n) for n in TABLE_COUNTS),
        help="table counts, comma-separated (not scaled); default 10,100; at scale 1 on a "
        "machine with the time, 10,100,500",
    )
    parser.add_argument(
        "--modes",
        default="off,on",
        help="history and changelog: off, on or both (comma-separated); default off,on",
    )
    add_writes_argument(parser)
    parser.add_argument("--rate", type=float, default=RATE, help="changes per second")
    parser.add_argument("--trigger", type=float, default=TRIGGER, help="trigger interval, s")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=DRAIN_TIMEOUT,
        help="seconds a run may take to bring the workload into the lake after the writer "
        "stopped (and for the warm-up) before it is recorded as failed",
    )
    args = parser.parse_args(argv)
    counts = [int(s) for s in args.tables.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not counts or min(counts) < TABLES_PER_TXN[1]:
        parser.error(f"--tables: counts of at least {TABLES_PER_TXN[1]} tables")
    if not modes or set(modes) - {"off", "on"}:
        parser.error(f"--modes takes off and/or on, not {args.modes!r}")
    writes = parse_writes(parser, args.writes)
    result = measure(
        args.scale,
        counts,
        [m == "on" for m in modes],
        writes,
        rate=args.rate,
        trigger=args.trigger,
        drain_timeout=args.drain_timeout,
    )
    path = write_result(NAME, args.scale, result)
    print(
        f"\n{PER_TXN} changes a transaction over {TABLES_PER_TXN[0]} to {TABLES_PER_TXN[1]} "
        f"tables, {args.rate:,.0f} changes/s for {result['seconds']:.0f} s, "
        f"{result['rows_per_table']:,} rows a table (scale {args.scale:g})"
    )
    for r in result["runs"]:
        print(summary(r))
    goals = result["goals"]
    print(
        f"p99 < {GOAL_P99:g} s at {GOAL_P99_TABLES} tables (off): {goals['p99_met']}; median "
        f"equal-changes batch ratio {result['ratio_compares']}: "
        f"{result['ratio_batch_seconds_most_to_fewest_tables']} (<= {GOAL_BATCH_RATIO:g}: "
        f"{goals['batch_seconds_met']}); continuous batches' ratio "
        f"{result['ratio_continuous_batch_seconds_most_to_fewest_tables']}"
    )
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
