"""Tables copied while the stream runs (``pgcdc.lake.run.table_sync``): real PostgreSQL, real
Spark, Delta tables read back by delta-rs and Spark's Delta reader.

* A table created on the source joins a running pipeline while the other table keeps
  streaming: the other's mirror moves on while the new one is copied, and every change of the
  new one lands exactly once across the handover (the copy holds those committed before the
  temporary slot's consistent point X, the stream the others, none twice).
* A transaction open on the table across the publication change (the case PostgreSQL's
  decoding of publication changes has had bugs with) lands once, on both servers.
* ``pgcdc resync`` of a table under load: readers of its mirror (delta-rs and Spark, in a
  loop) never see fewer rows than it had, nor a key twice; the mirror is replaced in one
  commit, the history's versions end at X ('S') and new ones start there, the changelog gets
  the copy as 'S' rows.
* DDL on one table under load (a column renamed: followed; the key changed, or the table
  dropped and created again: parked), the other table streaming on; ``pgcdc resync`` brings
  the parked one back equal to its source.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgcdc.cli import main
from pgcdc.lake.config import load_config
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.state import PipelineState, load_state
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lsn import Lsn
from pgcdc.metrics import TABLE_PHASES
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_pipeline import Background
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, batch_commits

pytestmark = pytest.mark.slow


class Load:
    """Commits to ``table`` in a thread until stopped: each transaction inserts the next key
    (``v`` 0, a TOASTed ``big`` value on every third) and adds 1 to ``v`` of the key before,
    leaving ``big`` unchanged; with ``deletes``, every tenth transaction deletes a key. Keys
    start at ``first``."""

    def __init__(
        self,
        pg: PgDatabase,
        table: str,
        first: int,
        *,
        deletes: bool = False,
        search_path: str | None = None,
    ) -> None:
        self.dsn = (
            pg.dsn()
            if search_path is None
            else f"{pg.dsn()} options='-c search_path={search_path}'"
        )
        self.table = table
        self.first = self.next = first
        self.deletes = deletes
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        table = sql.Identifier(*self.table.split("."))
        insert = sql.SQL(
            "INSERT INTO {} (id, v, big) VALUES (%s, 0, CASE WHEN %s %% 3 = 0 THEN "
            "repeat(md5(%s::text), 300) END)"
        ).format(table)
        bump = sql.SQL("UPDATE {} SET v = v + 1 WHERE id = %s").format(table)
        delete = sql.SQL("DELETE FROM {} WHERE id = %s").format(table)
        try:
            with psycopg.connect(self.dsn) as conn:
                while not self.stopping.is_set():
                    key = self.next
                    conn.execute(insert, (key, key, key))
                    conn.execute(bump, (key - 1,))
                    if self.deletes and key % 10 == 0:
                        conn.execute(delete, (key - 5,))
                    conn.commit()
                    self.next += 1
                    time.sleep(0.01)
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(60)
        assert not self.errors, self.errors

    def wait_for(self, keys: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.next < self.first + keys:
            assert time.monotonic() < deadline and not self.errors, self.errors
            time.sleep(0.05)


def create(pg: PgDatabase, table: str, rows: int) -> None:
    """Table ``table`` (id, v, big: TOASTed on every thousandth row) with ``rows`` rows."""
    name = sql.Identifier(*table.split("."))
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int, big text)").format(name))
    pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN big SET STORAGE EXTERNAL").format(name))
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 0, CASE WHEN g %% 1000 = 0 THEN repeat(md5(g::text), 300) "
            "END FROM generate_series(1, %s) g"
        ).format(name),
        (rows,),
    )


def write_toml(path: Path, pg: PgDatabase, lake: Path, tables: str, **source: Any) -> Path:
    extra = "".join(f"{k} = {v!r}\n" for k, v in source.items())
    path.write_text(
        f"[source]\ndsn = '{pg.dsn()}'\nslot = 'lake_slot'\npublication = 'lake_pub'\n{extra}"
        f"[lake]\npath = '{lake}'\n[stream]\ntrigger_interval = 0.5\n{tables}"
    )
    return path


def phase_of(pipeline: Pipeline, table_id: str) -> str | None:
    state = load_state(pipeline.layout)
    phase = None if state is None else state.phases.get(table_id)
    return None if phase is None else phase.phase


def metric_phases(pipeline: Pipeline, table_id: str) -> set[str]:
    """The phases ``pgcdc_table_state`` gives ``table_id`` (one, once the table is known)."""
    registry = pipeline.metrics.registry
    return {
        phase
        for phase in TABLE_PHASES
        if registry.get_sample_value(
            "pgcdc_table_state",
            {"slot": pipeline.config.source.slot, "table": table_id, "state": phase},
        )
        == 1
    }


def wait_until(
    check: Callable[[], bool], run: Background, timeout: float = 240, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        causes = [str(f)[:3000] for f in run.failures]
        assert not run.failures, causes
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def changelog_once(
    lake: Path, schema_table: str, point: int, *, again: bool = False
) -> list[dict[str, Any]]:
    """The changelog's rows of ``schema_table`` after checking: its copy at ``point`` is one
    group of 'S' rows at ``point`` (``again``: the newest of several), no change is there twice,
    and (a new table) none committed before ``point``. The streamed rows."""
    schema, name = schema_table.split(".")
    rows = DeltaTarget(lake / schema / f"{name}.changelog").read().to_pylist()
    snaps = {r["__commit_lsn"] for r in rows if r["__op"] == "S"}
    assert point in snaps and (again or snaps == {point}), (snaps, point)
    streamed = [r for r in rows if r["__op"] != "S"]
    counts = Counter((r["__commit_lsn"], r["__position"]) for r in streamed)
    twice = [k for k, n in counts.items() if n > 1]
    assert not twice, f"changes in the changelog twice: {twice[:5]}"
    if not again:
        assert all(r["__commit_lsn"] >= point for r in streamed)
    return streamed


@newest_server
def test_an_added_table_is_copied_while_the_others_stream(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
) -> None:
    create(pg, "orders", 50)
    lake = tmp_path / "lake"
    toml = write_toml(
        tmp_path / "pipeline.toml",
        pg,
        lake,
        "[[tables]]\nname = 'public.*'\nhistory = true\nchangelog = true\n",
        table_discovery_interval=1,
    )
    config = load_config(toml)
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    orders = DeltaTarget(lake / "public" / "orders")
    with Load(pg, "orders", 1000, deletes=True) as load_orders:
        # batches of the other table come one after the other before the new table appears
        wait_until(lambda: orders.version() >= 3, run, what="the first batches")
        # a copy of seconds, not milliseconds, and a load on it before the pipeline sees it (a
        # copy's snapshot taken before the load's first commit would copy none of its rows)
        pg.execute("CREATE SCHEMA staging")
        create(pg, "staging.big", 400_000)
        with Load(pg, "big", 500_000, deletes=True, search_path="staging,public") as load_big:
            load_big.wait_for(20)
            pg.execute("ALTER TABLE staging.big SET SCHEMA public")
            # the other table's mirror while the new one is copied and caught up
            seen: list[int] = []
            shown: set[str] = set()  # the phases pgcdc_table_state showed
            deadline = time.monotonic() + 300
            phase = None
            while phase != "streaming":
                assert time.monotonic() < deadline and not run.failures, run.failures
                phase = phase_of(running, "public.big")
                if phase in ("copying", "catching-up"):
                    seen.append(orders.version())
                shown |= metric_phases(running, "public.big")
                time.sleep(0.2)
            assert len(set(seen)) >= 2, f"the other table did not move during the copy: {seen}"
            assert "copying" in shown, shown
            assert metric_phases(running, "public.big") == {"streaming"}
            assert metric_phases(running, "public.orders") == {"streaming"}
            load_big.wait_for(load_big.next - load_big.first + 20)  # streamed after the join
        load_orders.wait_for(50)
    run.stop()
    assert not run.failures and run.result is not None
    assert run.result.added_rows.get("public.big", 0) >= 400_000
    final = Pipeline(config, spark=spark)
    assert final.run(until_caught_up=True).added_rows == {}
    assert_equal(final)
    assert final.plan is not None and final.state is not None
    for table in final.plan.tables:
        assert_history_matches_mirror(final, table)
        for kind in table.kinds():
            ids = batch_commits(DeltaTarget(table.path(final.layout, kind)))
            assert len(ids) == len(set(ids)), f"{table.table_id} {kind}: a batch applied twice"
    phase_big = final.state.phases["public.big"]
    assert phase_big.phase == "streaming" and phase_big.copied_at is not None
    point = int(Lsn.parse(phase_big.copied_at))
    streamed = changelog_once(lake, "public.big", point)
    # each key the load inserted: in the copy, or inserted by the stream, once
    copied = {
        r["id"]
        for r in DeltaTarget(lake / "public" / "big.changelog").read().to_pylist()
        if r["__op"] == "S" and r["id"] >= 500_000
    }
    inserted = Counter(r["id"] for r in streamed if r["__op"] == "I")
    assert copied and inserted, "the load committed on both sides of the copy's point"
    assert all(n == 1 for n in inserted.values()) and not copied & set(inserted)
    assert not (held := lake / "_pgcdc" / "held").exists() or not any(held.rglob("*.parquet"))


@pytest.mark.parametrize("pg_server", [15, 18], indirect=True, ids=["pg15", "pg18"])
def test_a_transaction_open_across_the_publication_change_lands_once(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
) -> None:
    """A transaction writing the new table stays open while the running pipeline adds it to
    the publication: the temporary slot's consistent point X waits for it, so it is in the
    copy, and whatever the main slot's decoding of it holds of the table is left out (it
    commits before X). Transactions committed after the change, before and after X, land once."""
    create(pg, "orders", 20)
    lake = tmp_path / "lake"
    toml = write_toml(
        tmp_path / "pipeline.toml",
        pg,
        lake,
        "[[tables]]\nname = 'public.*'\nchangelog = true\n",
        table_discovery_interval=1,
    )
    config = load_config(toml)
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    pg.execute("CREATE TABLE audit (id int PRIMARY KEY, v int, big text)")
    published = (
        "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'lake_pub' "
        "AND tablename = 'audit'"
    )
    with psycopg.connect(pg.dsn()) as open_txn:
        open_txn.execute("INSERT INTO audit SELECT g, 1, 'open' FROM generate_series(1, 5) g")
        wait_until(lambda: pg.execute(published) == [(1,)], run, what="the publication")
        pg.execute("INSERT INTO audit SELECT g, 2, 'after' FROM generate_series(6, 10) g")
        open_txn.execute("UPDATE audit SET v = v + 10 WHERE id <= 3")
        open_txn.execute("INSERT INTO audit VALUES (11, 3, 'open, later')")
        time.sleep(1)  # the copy waits for this transaction
        assert phase_of(running, "public.audit") == "copying"
        open_txn.commit()
    with Load(pg, "audit", 100) as load:
        wait_until(lambda: phase_of(running, "public.audit") == "streaming", run, what="handover")
        load.wait_for(30)
    run.stop()
    assert not run.failures
    final = Pipeline(config, spark=spark)
    final.run(until_caught_up=True)
    assert_equal(final)
    assert final.state is not None
    phase = final.state.phases["public.audit"]
    assert phase.copied_at is not None
    streamed = changelog_once(lake, "public.audit", int(Lsn.parse(phase.copied_at)))
    assert not [r for r in streamed if r["id"] <= 11], "the open transaction was streamed too"


class Readers:
    """Read ``table``'s mirror in a loop (delta-rs, then Spark's Delta reader) until
    stopped: each read's row count must be ``floor`` or more, and no key there twice."""

    def __init__(self, lake: Path, spark: Any, table: str, floor: int) -> None:
        self.path = lake / "public" / table
        self.spark = spark
        self.floor = floor
        self.problems: list[str] = []
        self.reads = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        path = str(self.path)
        while not self.stopping.is_set():
            try:
                ids = DeltaTarget(self.path).read().column("id").to_pylist()
                rows = self.spark.read.format("delta").load(path).select("id").collect()
            except Exception as exc:  # a read must never fail either
                self.problems.append(f"a read failed: {exc!r}"[:500])
                continue
            for who, got in (("delta-rs", ids), ("spark", [r[0] for r in rows])):
                if len(got) < self.floor:
                    self.problems.append(f"{who} read {len(got)} rows, fewer than {self.floor}")
                if len(set(got)) != len(got):
                    self.problems.append(f"{who} read a key twice")
            self.reads += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(120)


@newest_server
def test_resync_under_load_replaces_the_mirror_in_one_commit(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
) -> None:
    create(pg, "orders", 20_000)
    create(pg, "other", 10)
    lake = tmp_path / "lake"
    toml = write_toml(
        tmp_path / "pipeline.toml",
        pg,
        lake,
        "[[tables]]\nname = 'public.orders'\nhistory = true\nchangelog = true\n"
        "[[tables]]\nname = 'public.other'\n",
    )
    config = load_config(toml)
    Pipeline(config, spark=spark).run(until_caught_up=True)
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    mirror = DeltaTarget(lake / "public" / "orders")
    with Load(pg, "orders", 100_000) as load, Load(pg, "other", 1000):
        load.wait_for(20)
        floor = int(pg.execute("SELECT count(*) FROM orders")[0][0])  # inserts only: it grows
        wait_until(lambda: mirror.read().num_rows >= floor, run, what="the mirror to catch up")
        reader = Readers(lake, spark, "orders", floor)
        before = mirror.version()
        assert main(["resync", "--config", str(toml), "public.orders"]) == 0

        def resynced() -> bool:
            state = load_state(running.layout)
            phase = None if state is None else state.phases.get("public.orders")
            return phase is not None and phase.phase == "streaming" and phase.attempt == 1

        wait_until(resynced, run, what="the resync")
        load.wait_for(load.next - load.first + 20)
        reader.stop()
    run.stop()
    assert not run.failures
    assert not reader.problems, reader.problems[:5]
    assert reader.reads >= 3
    final = Pipeline(config, spark=spark)
    final.run(until_caught_up=True)
    assert_equal(final)
    assert final.plan is not None and final.state is not None
    table = final.plan.table("public.orders")
    assert_history_matches_mirror(final, table)
    phase = final.state.phases["public.orders"]
    assert phase.again and phase.copied_at is not None
    point = int(Lsn.parse(phase.copied_at))
    # the mirror's copy replaced its rows in one commit: no version after ``before`` held
    # fewer rows than the source had then (the readers checked), and it is one commit
    replaced = [
        meta
        for version, _, meta in mirror.commits()
        if version > before and isinstance(meta, dict) and meta.get("replaced")
    ]
    assert len(replaced) == 1 and replaced[0]["consistent_point"] == phase.copied_at
    history = DeltaTarget(lake / "public" / "orders.history").read().to_pylist()
    ended = [r for r in history if r["__end_op"] == "S"]
    assert ended and all(r["__end_lsn"] == point for r in ended)
    started = [r for r in history if r["__start_op"] == "S" and r["__start_lsn"] == point]
    assert len(started) == phase.rows
    changelog_once(lake, "public.orders", point, again=True)


def _state(pipeline: Pipeline) -> PipelineState:
    state = load_state(pipeline.layout)
    assert state is not None
    return state


DDL = {
    "renamed": ("ALTER TABLE t RENAME COLUMN v TO w", "followed"),
    "key": ("ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id, v)", "parked"),
    "recreated": (
        "DROP TABLE t; CREATE TABLE t (id int PRIMARY KEY, v int, big text); "
        "INSERT INTO t SELECT g, 5, NULL FROM generate_series(1, 30) g",
        "parked",
    ),
}


@pytest.mark.parametrize("case", list(DDL))
@newest_server
def test_ddl_on_one_table_under_load_leaves_the_others_streaming(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
    case: str,
) -> None:
    ddl, outcome = DDL[case]
    create(pg, "t", 50)
    create(pg, "other", 10)
    lake = tmp_path / "lake"
    toml = write_toml(
        tmp_path / "pipeline.toml",
        pg,
        lake,
        "[[tables]]\nname = 'public.t'\nhistory = true\n[[tables]]\nname = 'public.other'\n",
        table_discovery_interval=1,  # a table created again is found by the catalog's check
    )
    config = load_config(toml)
    Pipeline(config, spark=spark).run(until_caught_up=True)
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    with Load(pg, "other", 1000) as load_other:
        # the DDL between changes of the table, the other table written all along
        pg.execute("UPDATE t SET v = v + 1 WHERE id <= 10")
        load_other.wait_for(10)
        pg.execute(ddl)
        column = sql.Identifier("w" if case == "renamed" else "v")
        pg.execute(sql.SQL("UPDATE t SET {0} = {0} + 1 WHERE id <= 20").format(column))
        pg.execute(sql.SQL("INSERT INTO t (id, {}) VALUES (500, 1)").format(column))
        if outcome == "parked":
            wait_until(lambda: phase_of(running, "public.t") == "parked", run, what="the park")
            state = _state(running)
            reason = state.phases["public.t"].reason or ""
            assert "pgcdc resync --config pipeline.toml public.t" in reason, reason
            parked = {"parked"}
            wait_until(lambda: metric_phases(running, "public.t") == parked, run, what="metric")
            assert main(["resync", "--config", str(toml), "public.t"]) == 0
            wait_until(
                lambda: "public.t" in _state(running).tables, run, what="the resync's handover"
            )
        pg.execute(sql.SQL("UPDATE t SET {} = -1 WHERE id = 500").format(column))
        load_other.wait_for(load_other.next - load_other.first + 20)
    run.stop()
    assert not run.failures, [str(f)[:2000] for f in run.failures]
    final = Pipeline(config, spark=spark)
    final.run(until_caught_up=True)
    assert_equal(final)
    assert final.state is not None and final.state.parked() == {}
    assert final.plan is not None
    assert_history_matches_mirror(final, final.plan.table("public.t"))
    if outcome == "followed":
        schema = DeltaTarget(lake / "public" / "t").arrow_schema()
        assert schema is not None and "w" in schema.names and "v" not in schema.names
