"""Tables joining and leaving a running lake (``pgcdc.lake.run.table_set``): real PostgreSQL, real
Spark, Delta tables read back.

* A table created on the source and matched by a pattern joins at the next start: copied in a
  temporary slot's snapshot while a writer keeps committing to it, then streamed from that
  snapshot's consistent point X: every change lands exactly once (the copy holds those
  committed before X, the stream the others), the mirror and history equal the source, and the
  tables the lake had are not copied again. ``run --check`` only says so.
* A table removed from the configuration leaves the publication and keeps its lake tables;
  added back, it is copied anew; a copy that fails between two tables' commits (as a kill
  would leave it) is redone from scratch by the next start. A table created while ``run``
  streams joins at the next start and does not stop the running one.
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

from pgcdc.cli import main
from pgcdc.cli.status import collect
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.monitor import RunObserver
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.state import load_state
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lsn import Lsn
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_pipeline import Background
from tests.lake.test_pipeline import (
    assert_equal,
    assert_history_matches_mirror,
    batch_commits,
    make_config,
)

pytestmark = pytest.mark.slow

SHOP = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id int PRIMARY KEY, qty int, note text);
INSERT INTO shop.orders SELECT g, g, 'o' || g FROM generate_series(1, 40) g;
"""

#: a writer's keys start here (the table's own rows are below)
FIRST_KEY = 1000


class Writer:
    """Commits to ``shop.audit`` in a thread until stopped: each transaction inserts the next
    key (v = 0) and adds 1 to the previous key's v, so that a key's v counts the updates it
    had after its insert."""

    def __init__(self, pg: PgDatabase) -> None:
        self.dsn = pg.dsn()
        self.stopping = threading.Event()
        self.next = FIRST_KEY
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                while not self.stopping.is_set():
                    key = self.next
                    conn.execute("INSERT INTO shop.audit VALUES (%s, 0, 'w')", (key,))
                    conn.execute("UPDATE shop.audit SET v = v + 1 WHERE id = %s", (key - 1,))
                    conn.commit()
                    self.next += 1
                    time.sleep(0.005)
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(60)
        assert not self.errors, self.errors


def write_toml(path: Path, pg: PgDatabase, lake: Path) -> Path:
    path.write_text(
        f"[source]\ndsn = '{pg.dsn()}'\nslot = 'lake_slot'\npublication = 'lake_pub'\n"
        f"[lake]\npath = '{lake}'\n"
        "[[tables]]\nname = 'shop.*'\nhistory = true\nchangelog = true\n"
        "[[tables]]\nname = 'shop.orders'\nchangelog = true\n"
    )
    return path


def published(pg: PgDatabase) -> list[str]:
    return [
        f"{schema}.{name}"
        for schema, name in pg.execute(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables "
            "WHERE pubname = 'lake_pub' ORDER BY 1, 2"
        )
    ]


def commit_kinds(target: DeltaTarget) -> list[str]:
    """Each data commit of a Delta table, oldest first: 'snapshot' (a copy) or 'batch'."""
    return [
        "snapshot" if "snapshot" in meta else "batch"
        for _, _, meta in reversed(target.commits())
        if isinstance(meta, dict) and ("snapshot" in meta or "batch" in meta)
    ]


def assert_once_across_copy(pg: PgDatabase, lake: Path, point: int, *, later: bool) -> None:
    """Exactly once across an added table's handover at ``point`` (X): the copy holds what
    committed before X (its rows are 'S' at X), the stream what committed at or after X,
    nothing of it before X; ``later``: every third key had 100 added after the writer."""
    changelog = DeltaTarget(lake / "shop" / "audit.changelog").read().to_pylist()
    assert {r["__commit_lsn"] for r in changelog if r["__op"] == "S"} == {point}
    streamed = [r for r in changelog if r["__op"] != "S"]
    assert streamed and min(r["__commit_lsn"] for r in streamed) >= point
    source = dict(pg.execute("SELECT id, v FROM shop.audit WHERE id >= %s", (FIRST_KEY,)))
    copied = {r["id"]: r["v"] for r in changelog if r["__op"] == "S" and r["id"] >= FIRST_KEY}
    inserted = Counter(r["id"] for r in streamed if r["__op"] == "I")
    updates = Counter(r["id"] for r in streamed if r["__op"] == "U")
    assert copied and inserted, "the writer committed on both sides of the copy's point"
    for key, v in source.items():
        assert (key in copied) + inserted[key] == 1, f"key {key} inserted twice or never"
        bump = 100 * (later and key % 3 == 0)
        assert copied.get(key, 0) + updates[key] == v - bump + (later and key % 3 == 0), key


@newest_server  # the handover's server side on both: test_table_sync's open transaction
def test_a_table_created_on_the_source_joins_the_lake_with_no_gap_and_no_duplicate(
    pg: PgDatabase, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pg.execute(SHOP)
    lake = tmp_path / "lake"
    toml = write_toml(tmp_path / "pipeline.toml", pg, lake)
    # the added table with a history (its MERGE path), the old one without (cheaper batches)
    config = make_config(
        pg,
        lake,
        [
            {"name": "shop.*", "history": True, "changelog": True},
            {"name": "shop.orders", "changelog": True},
        ],
    )
    Pipeline(config, spark=spark).run(until_caught_up=True)  # the initial copy: orders

    pg.execute("CREATE TABLE shop.audit (id int PRIMARY KEY, v int, note text)")
    pg.execute("INSERT INTO shop.audit SELECT g, 0, 'a' || g FROM generate_series(1, 30) g")
    pg.execute("UPDATE shop.audit SET v = 5 WHERE id <= 10")
    pg.execute("DELETE FROM shop.audit WHERE id > 25")
    pg.execute("UPDATE shop.orders SET qty = -qty WHERE id % 4 = 0")
    pg.execute("DELETE FROM shop.orders WHERE id > 35")

    # --check says what the next run does, and changes nothing
    assert main(["run", "--config", str(toml), "--check"]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "copy the added tables shop.audit and stream them" in said, said
    assert published(pg) == ["shop.orders"]

    orders = {
        kind: DeltaTarget(lake / "shop" / f"orders{suffix}")
        for kind, suffix in (("mirror", ""), ("changelog", ".changelog"))
    }
    assert all(commit_kinds(t) == ["snapshot"] for t in orders.values())

    # the copy is taken while a writer keeps committing: some of its transactions commit
    # before the temporary slot's consistent point, some after, some between the publication
    # gaining the table and that point (which the main slot streams and the copy also holds)
    with Writer(pg) as writer:
        while writer.next < FIRST_KEY + 20:
            time.sleep(0.05)
        added = Pipeline(config, spark=spark)
        result = added.run(until_caught_up=True)
    assert set(result.added_rows) == {"shop.audit"} and result.added_rows["shop.audit"] >= 25
    assert added.state is not None
    phase = added.state.phases["shop.audit"]
    assert phase.phase == "streaming" and phase.copied_at is not None
    assert "shop.audit" in added.state.tables
    assert published(pg) == ["shop.audit", "shop.orders"]
    point = int(Lsn.parse(phase.copied_at))
    assert pg.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name <> 'lake_slot'"
    ) == [(0,)], "the temporary slot is gone"

    # the rest of the writer's changes, and more of both tables', by the next runs
    pg.execute("UPDATE shop.audit SET v = v + 100, note = 'later' WHERE id % 3 = 0")
    pg.execute("UPDATE shop.orders SET note = 'later' WHERE id < 5")
    final = Pipeline(config, spark=spark)
    assert final.run(until_caught_up=True).added_rows == {}
    assert_equal(final)
    assert final.plan is not None
    for table in final.plan.tables:
        if table.history:
            assert_history_matches_mirror(final, table)
        for kind in table.kinds():
            ids = batch_commits(DeltaTarget(table.path(final.layout, kind)))
            assert len(ids) == len(set(ids)), f"{table.table_id} {kind}: a batch applied twice"
    for target in orders.values():  # the old table's copy was not redone
        kinds = commit_kinds(target)
        assert kinds[0] == "snapshot" and "snapshot" not in kinds[1:], kinds

    assert_once_across_copy(pg, lake, point, later=True)


@newest_server
def test_a_removed_table_is_kept_and_added_again_is_copied_anew(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
) -> None:
    pg.execute(SHOP)
    pg.execute("CREATE TABLE shop.audit (id int PRIMARY KEY, v int, note text)")
    pg.execute("INSERT INTO shop.audit SELECT g, g, 'a' || g FROM generate_series(1, 30) g")
    lake = tmp_path / "lake"
    # a pattern's text_columns reach every table it matches, the one created later too
    note = {"text_columns": ["note"]}
    every = make_config(pg, lake, [{"name": "shop.*", **note}])
    Pipeline(every, spark=spark).run(until_caught_up=True)
    audit = DeltaTarget(lake / "shop" / "audit")
    kept = audit.version()

    # removed: out of the publication, its lake table kept and no longer written
    orders_only = make_config(pg, lake, [{"name": "shop.orders", **note}])
    pg.execute("UPDATE shop.audit SET v = -v")
    pg.execute("UPDATE shop.orders SET qty = 0 WHERE id < 10")
    removed = Pipeline(orders_only, spark=spark)
    assert removed.run(until_caught_up=True).removed == ("shop.audit",)
    assert published(pg) == ["shop.orders"]
    assert removed.state is not None and removed.state.tables == ("shop.orders",)
    assert removed.state.phases["shop.audit"].phase == "removed"
    assert_equal(removed)
    pg.execute("UPDATE shop.audit SET v = 7")
    pg.execute("DELETE FROM shop.orders WHERE id = 1")
    again = Pipeline(orders_only, spark=spark)
    again.run(until_caught_up=True)
    assert_equal(again)
    assert audit.version() == kept and audit.read().num_rows == 30
    report = collect(orders_only)
    rows = {t["table"]: t for t in report["tables"]}
    assert rows["shop.audit"]["phase"] == "removed" and not rows["shop.audit"]["mirrored"]
    assert rows["shop.audit"]["exists"] and rows["shop.orders"]["mirrored"]

    # added back, with a new table: each one's copy fails after its mirror's commit (what a
    # kill after the commit leaves), and with on_table_failure = "stop" the run stops ...
    pg.execute("CREATE TABLE shop.audit2 (id int PRIMARY KEY, w text)")
    pg.execute("INSERT INTO shop.audit2 SELECT g, 'b' || g FROM generate_series(1, 20) g")

    class FailAfterTheCommit(RunObserver):
        def snapshot_progress(self, table: str | None, rows: int) -> None:
            if table is not None:
                raise RuntimeError("injected failure after the copy's commit (tests)")

    stopping = make_config(
        pg, lake, [{"name": "shop.*", **note}], lake_options={"on_table_failure": "stop"}
    )
    failing = Pipeline(stopping, spark=spark, observer=FailAfterTheCommit())
    with pytest.raises(PipelineError, match=r"the copy of shop\.audit2? failed"):
        failing.run(until_caught_up=True)
    saved = load_state(failing.layout)
    assert saved is not None and saved.tables == ("shop.orders",)
    phases = saved.phases
    assert (phases["shop.audit"].phase, phases["shop.audit"].attempt) == ("copying", 2)
    assert phases["shop.audit"].again  # its lake tables replaced in place, never removed
    assert (phases["shop.audit2"].phase, phases["shop.audit2"].attempt) == ("copying", 1)
    assert not phases["shop.audit2"].again
    assert set(audit.read().column("v").to_pylist()) == {7}  # copied anew: one commit
    assert audit.version() == kept + 1
    pg.execute("UPDATE shop.audit2 SET w = 'changed' WHERE id <= 5")

    # ... and the next start copies again, from scratch, what is still configured, and removes
    # what the copy left of a new table no longer configured
    audit_only = make_config(
        pg, lake, [{"name": "shop.orders", **note}, {"name": "shop.audit", **note}]
    )
    done = Pipeline(audit_only, spark=spark)
    assert done.run(until_caught_up=True).added_rows == {"shop.audit": 30}
    assert done.state is not None
    assert done.state.tables == ("shop.audit", "shop.orders")
    assert {t: (p.phase, p.attempt) for t, p in done.state.phases.items()} == {
        "shop.audit": ("streaming", 3)
    }
    assert published(pg) == ["shop.audit", "shop.orders"]
    assert not (lake / "shop" / "audit2").exists()
    assert_equal(done)
    assert commit_kinds(audit) == ["snapshot"] * 3  # the copy, then two copies replacing it

    # by default a failed copy parks its table, and the run goes on without it
    parking = Pipeline(every, spark=spark, observer=FailAfterTheCommit())
    parking.run(until_caught_up=True)
    assert parking.state is not None
    assert parking.state.phases["shop.audit2"].phase == "parked"
    assert "the copy of shop.audit2 failed" in str(parking.state.phases["shop.audit2"].reason)
    assert "pgcdc resync" in str(parking.state.phases["shop.audit2"].reason)
    Pipeline(audit_only, spark=spark).run(until_caught_up=True)  # audit2 leaves again

    # the table whose copy was given up on is added again later like any other; a table
    # created while that run streams joins at the next start, without disturbing it (not even
    # when a schema change restarts its query, which plans the tables again)
    pg.execute("UPDATE shop.audit SET v = v + 1 WHERE id < 5")
    running = Pipeline(every, spark=spark)
    run = background(running).start()
    assert running.state is not None and running.state.phases["shop.audit2"].attempt == 2
    pg.execute("CREATE TABLE shop.late (id int PRIMARY KEY, n numeric(6, 2), note text)")
    pg.execute("INSERT INTO shop.late SELECT g, g, 'l' FROM generate_series(1, 10) g")
    pg.execute("ALTER TABLE shop.orders ADD COLUMN extra int DEFAULT 1")
    pg.execute("UPDATE shop.orders SET extra = 2 WHERE id = 2")
    deadline = time.monotonic() + 240
    while running.restarts == 0 and time.monotonic() < deadline and not run.failures:
        time.sleep(1)
    run.stop()
    assert not run.failures and running.restarts >= 1
    last = Pipeline(every, spark=spark)
    assert last.run(until_caught_up=True).added_rows == {"shop.late": 10}
    assert_equal(last)
    assert commit_kinds(audit)[-2:] == ["snapshot", "batch"]


@newest_server
def test_a_table_created_while_run_streams_joins_it(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
) -> None:
    """``[source] table_discovery_interval``: a running ``run`` finds a table created on the
    source that a pattern matches, stops its stream between two batches, copies the table
    while a writer keeps committing to it, and streams on with it, exactly once across the
    handover; the other table's changes before, during and after keep landing."""
    pg.execute(SHOP)
    lake = tmp_path / "lake"
    config = make_config(
        pg,
        lake,
        [{"name": "shop.*", "changelog": True}],
        source={"table_discovery_interval": 1},
    )
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    pg.execute("UPDATE shop.orders SET qty = -qty WHERE id % 4 = 0")
    pg.execute("CREATE TABLE shop.audit (id int PRIMARY KEY, v int, note text)")
    pg.execute("INSERT INTO shop.audit SELECT g, 0, 'a' || g FROM generate_series(1, 30) g")
    with Writer(pg) as writer:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not run.failures:
            state = load_state(running.layout)
            phase = None if state is None else state.phases.get("shop.audit")
            if phase is not None and phase.phase == "streaming" and writer.next > FIRST_KEY + 40:
                break
            time.sleep(0.5)
        pg.execute("DELETE FROM shop.orders WHERE id > 35")
    assert not run.failures, [str(f)[:2000] for f in run.failures]
    assert phase is not None and phase.phase == "streaming" and phase.copied_at is not None
    assert published(pg) == ["shop.audit", "shop.orders"]
    # the stream applies what the writer committed after the copy, then stops
    deadline = time.monotonic() + 240
    done = False
    while not done and time.monotonic() < deadline and not run.failures:
        time.sleep(1)
        rows = DeltaTarget(lake / "shop" / "audit").read().num_rows
        done = rows == pg.execute("SELECT count(*) FROM shop.audit")[0][0]
    run.stop()
    assert done and not run.failures and run.result is not None
    assert run.result.added_rows.get("shop.audit", 0) >= 30
    final = Pipeline(config, spark=spark)
    assert final.run(until_caught_up=True).added_rows == {}
    assert_equal(final)
    orders = DeltaTarget(lake / "shop" / "orders")
    kinds = commit_kinds(orders)
    assert kinds[0] == "snapshot" and "snapshot" not in kinds[1:], kinds
    assert_once_across_copy(pg, lake, int(Lsn.parse(phase.copied_at)), later=False)
