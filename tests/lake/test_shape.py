"""DDL the lake cannot follow stops ``pgcdc run`` (or parks the table: ``on_table_failure =
"park"``) before a batch of it is written, naming the fix.

Each case was a silent divergence (found by a review helper): a renamed column read NULL for
every row not updated since; a table dropped and created again kept the old table's rows; a
new key or a key dropped lost deletes; a type change PostgreSQL made with its own cast
(rounding, ``USING``) left the lake's values as Spark cast them, or stalled on values in flight.
Each case runs twice in a row: the first run after the DDL stops, and so does the next one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgcdc.cli import main
from pgcdc.cli.status import collect
from pgcdc.lake.config import load_config
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.run.verify import compare_tables
from pgcdc.lake.store.state import load_state, resync_requests
from pgcdc.lake.store.target import DeltaTarget
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_pipeline import Background
from tests.lake.test_pipeline import assert_equal, make_config, mirror_rows

pytestmark = pytest.mark.slow

CASES = {
    "rename key column": (
        ["ALTER TABLE t RENAME COLUMN id TO ident", "UPDATE t SET z = 1 WHERE ident = 1"],
        "the key of public.t changed from (id) to (ident)",
    ),
    "recreated": (
        [
            "DROP TABLE t",
            "CREATE TABLE t (id int PRIMARY KEY, z int, a text, u int NOT NULL UNIQUE)",
            "ALTER PUBLICATION lake_pub ADD TABLE t",
            "INSERT INTO t VALUES (10, 0, 'new', 10)",
        ],
        "public.t was dropped and created again",
    ),
    "identity moved": (
        ["DELETE FROM t WHERE id = 1", "ALTER TABLE t REPLICA IDENTITY USING INDEX t_u_key"],
        "the key of public.t changed from (id) to (u)",
    ),
    "key dropped": (
        [
            "ALTER TABLE t REPLICA IDENTITY FULL",
            "ALTER TABLE t DROP CONSTRAINT t_pkey",
            "DELETE FROM t WHERE id = 2",
        ],
        "public.t lost its key",
    ),
    "retyped": (
        ["INSERT INTO t VALUES (3, 3, 'x', 30)", "ALTER TABLE t ALTER COLUMN z TYPE text"],
        "column 'z' of public.t changed type",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@newest_server
def test_ddl_the_lake_cannot_follow_stops_the_run(
    pg: PgDatabase, spark: Any, tmp_path: Path, case: str
) -> None:
    statements, message = CASES[case]
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, z int, a text, u int NOT NULL UNIQUE)")
    pg.execute("INSERT INTO t VALUES (1, 0, 'one', 10), (2, 0, 'two', 20)")
    config = make_config(
        pg,
        tmp_path / "lake",
        [{"name": "t", "history": True}],
        lake_options={"on_table_failure": "stop"},
    )
    first = Pipeline(config, spark=spark)
    first.run(until_caught_up=True)
    before = mirror_rows(first, "public.t")
    for statement in statements:
        pg.execute(statement)
    for _ in range(2):
        with pytest.raises(PipelineError, match="Fix: pgcdc resync") as raised:
            Pipeline(config, spark=spark).run(until_caught_up=True)
        assert message in str(raised.value)
    assert mirror_rows(first, "public.t") == before  # nothing written after the DDL


@newest_server
def test_widening_columns_and_adding_them_goes_on(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """What the lake can follow keeps running: types widened with their values unchanged,
    columns added and dropped."""
    pg.execute(
        "CREATE TABLE t (id int PRIMARY KEY, i smallint, n numeric(6,2), v varchar(4), "
        "ts timestamp(0), gone int)"
    )
    pg.execute("INSERT INTO t VALUES (1, 1, 1.25, 'ab', '2024-01-01 10:00:00', 7)")
    config = make_config(pg, tmp_path / "lake", [{"name": "t"}])
    Pipeline(config, spark=spark).run(until_caught_up=True)
    for statement in (
        "ALTER TABLE t ALTER COLUMN i TYPE bigint",
        "ALTER TABLE t ALTER COLUMN n TYPE numeric(12,2)",
        "ALTER TABLE t ALTER COLUMN v TYPE varchar(10)",
        "ALTER TABLE t ALTER COLUMN ts TYPE timestamp(3)",
        "ALTER TABLE t DROP COLUMN gone",
        "ALTER TABLE t ADD COLUMN extra text DEFAULT 'x'",
        "INSERT INTO t VALUES (2, 2, 2.5, 'abcdef', '2024-01-01 10:00:00.123', 'y')",
    ):
        pg.execute(statement)
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert_equal(pipeline)


@pytest.mark.parametrize(
    "ddl",
    [
        "ALTER TABLE t RENAME TO t_renamed",
        "ALTER TABLE t REPLICA IDENTITY USING INDEX t_u_key",
    ],
    ids=["table renamed", "identity moved"],
)
@newest_server
def test_ddl_while_a_query_runs_stops_it_before_the_next_batch(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
    ddl: str,
) -> None:
    """While a continuous query ran, a renamed table's changes came under its new name: the
    batch skipped them as another table's and the slot moved past them. A replica identity
    moved to another index sent old keys of other columns: deletes matched nothing. The query
    now restarts on either and stops before the batch."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, z int, a text, u int NOT NULL UNIQUE)")
    pg.execute("INSERT INTO t VALUES (1, 0, 'one', 10), (2, 0, 'two', 20)")
    config = make_config(
        pg,
        tmp_path / "lake",
        [{"name": "t"}],
        stream={"trigger_interval": 1},
        lake_options={"on_table_failure": "stop"},
    )
    pipeline = Pipeline(config, spark=spark)
    run = background(pipeline).start()
    pg.execute(ddl)
    pg.execute(
        "DELETE FROM t_renamed WHERE id = 1" if "RENAME" in ddl else "DELETE FROM t WHERE id = 1"
    )
    assert run.join(240), "the run went on"
    assert len(run.failures) == 1 and isinstance(run.failures[0], PipelineError)
    assert "Fix: pgcdc resync" in str(run.failures[0])
    assert [r[0] for r in mirror_rows(pipeline, "public.t")] == [1, 2]  # nothing skipped past


def test_a_key_in_another_column_order_is_the_same_key() -> None:
    """The lake matches rows on the set of key columns: a primary key rebuilt as (b, a), or the
    replica identity moved to a unique index over (b, a), changes nothing there."""
    from pgcdc.lake.run.shape import shape_problem
    from pgcdc.lake.store.tables import LakeTable
    from pgcdc.replication.source_catalog import TableShape

    now = TableShape(42, {"a": (1, 23, -1), "b": (2, 23, -1)})
    before = {"oid": 42, "keys": ["a", "b"], "multiset": False, "columns": {"a": [1, 23, -1]}}
    assert shape_problem(LakeTable("public", "t", ("b", "a"), "i"), before, now) is None
    moved = shape_problem(LakeTable("public", "t", ("b",), "i"), before, now)
    assert moved is not None and "changed from (a, b) to (b)" in moved


def test_a_state_from_before_shapes_still_catches_a_rename() -> None:
    """A lake written before shapes were recorded has column numbers only: a column renamed
    while the older pgcdc was stopped is still found (its number under another name) and
    followed, a key column's refused, and nothing else is judged."""
    from pgcdc.lake.run.shape import renamed_columns, shape_problem
    from pgcdc.lake.store.tables import LakeTable
    from pgcdc.replication.source_catalog import TableShape

    table = LakeTable("public", "t", ("id",), "d")
    before = {"columns": {"id": [1], "a": [2]}}
    renamed = TableShape(7, {"id": (1, 23, -1), "b": (2, 25, -1)})
    assert shape_problem(table, before, renamed) is None
    assert renamed_columns(table, before, renamed) == {"a": "b"}
    swapped = TableShape(7, {"id": (1, 23, -1), "a": (3, 25, -1), "b": (2, 25, -1)})
    assert (
        shape_problem(table, before, swapped)
        == "column 'a' of public.t was dropped and added again"
    )
    assert renamed_columns(table, before, swapped) == {}
    rekeyed = LakeTable("public", "t", ("ident",), "d")
    moved = TableShape(7, {"ident": (1, 23, -1), "a": (2, 25, -1)})
    before_keys = {"columns": {"id": [1], "a": [2]}, "keys": ["id"]}
    assert renamed_columns(rekeyed, before_keys, moved) == {}
    assert "the key of public.t changed" in (shape_problem(rekeyed, before_keys, moved) or "")
    retyped = TableShape(7, {"id": (1, 20, -1), "a": (2, 25, -1)})
    assert shape_problem(table, before, retyped) is None


@newest_server
def test_a_table_the_lake_cannot_follow_is_parked_and_resync_brings_it_back(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
) -> None:
    """``[lake] on_table_failure = "park"``: DDL the lake cannot follow on one
    table parks that table, with the reason and the fix; the other table streams on and the
    slot advances; ``status`` and ``run --until-caught-up`` say so (exit 1). ``pgcdc
    resync`` brings the table back, copied anew, by a running run or the next start."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, z int, a text, u int NOT NULL UNIQUE)")
    pg.execute("INSERT INTO t VALUES (1, 0, 'one', 10), (2, 0, 'two', 20)")
    pg.execute("CREATE TABLE other (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO other SELECT g, 'o' || g FROM generate_series(1, 5) g")
    lake = tmp_path / "lake"
    toml = tmp_path / "pipeline.toml"
    toml.write_text(
        f"[source]\ndsn = '{pg.dsn()}'\nslot = 'lake_slot'\npublication = 'lake_pub'\n"
        f"[lake]\npath = '{lake}'\non_table_failure = 'park'\n"
        "[[tables]]\nname = 't'\nhistory = true\n"
        "[[tables]]\nname = 'other'\n"
    )
    config = load_config(toml)
    first = Pipeline(config, spark=spark)
    first.run(until_caught_up=True)
    before = mirror_rows(first, "public.t")

    pg.execute("ALTER TABLE t ALTER COLUMN z TYPE text")
    pg.execute("UPDATE t SET z = 1 WHERE id = 1")
    pg.execute("UPDATE other SET v = 'changed' WHERE id < 3")
    pg.execute("INSERT INTO other VALUES (6, 'six')")
    parked = Pipeline(config, spark=spark)
    parked.run(until_caught_up=True)  # does not raise: the other table went on
    assert parked.state is not None and "public.t" not in parked.state.tables
    phase = parked.state.parked()["public.t"]
    assert "column 'z' of public.t changed type" in (phase.reason or "")
    assert "pgcdc resync --config pipeline.toml public.t" in (phase.reason or "")
    assert phase.parked_at is not None
    assert mirror_rows(parked, "public.t") == before  # nothing written after the DDL
    other = compare_tables(parked.dsn, parked.layout, [parked.plan.table("public.other")])
    assert all(c.equal for c in other), [c.describe() for c in other]
    report = collect(config)
    assert not report["ok"] and any("public.t is parked" in p for p in report["problems"])
    rows = {t["table"]: t for t in report["tables"]}
    assert rows["public.t"]["phase"] == "parked" and not rows["public.t"]["mirrored"]
    assert rows["public.t"]["parked_at"] == phase.parked_at

    # a scheduled run says so and fails while the table is parked; the slot still advances
    pg.execute("DELETE FROM other WHERE id = 6")
    slot = "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'lake_slot'"
    confirmed = pg.execute(slot)[0][0]
    assert main(["run", "--config", str(toml), "--until-caught-up"]) == 1
    assert pg.execute(slot)[0][0] > confirmed

    # resync asks; a running run copies the table anew and streams on with it
    assert main(["resync", "--config", str(toml), "public.nope"]) == 2
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    pg.execute("UPDATE t SET a = 'tw' WHERE id = 2")
    assert main(["resync", "--config", str(toml), "public.t"]) == 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not run.failures:
        state = load_state(running.layout)
        if state is not None and "public.t" in state.tables:
            break
        time.sleep(0.5)
    pg.execute("UPDATE t SET z = 7 WHERE id = 1")
    run.stop()
    assert not run.failures and run.result is not None
    assert run.result.added_rows == {"public.t": 2}
    final = Pipeline(config, spark=spark)
    assert final.run(until_caught_up=True).added_rows == {}
    assert final.state is not None and final.state.parked() == {}
    assert_equal(final)
    assert resync_requests(final.layout) == {}
    assert main(["run", "--config", str(toml), "--until-caught-up"]) == 0


@newest_server
def test_a_renamed_column_is_followed_in_place(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
) -> None:
    """A column renamed in the source is renamed in the mirror, history and changelog
    (Delta's column mapping: no file rewritten, old versions keep their values), between runs
    and while a run streams; changes from before the rename, read after it, fill the column
    under its new name."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, z int, a text)")
    pg.execute("INSERT INTO t VALUES (1, 0, 'one'), (2, 0, 'two'), (3, 0, 'three')")
    config = make_config(pg, tmp_path / "lake", [{"name": "t", "history": True, "changelog": True}])
    Pipeline(config, spark=spark).run(until_caught_up=True)

    pg.execute("UPDATE t SET a = 'before' WHERE id = 1")  # its Relation names 'a'
    pg.execute("ALTER TABLE t RENAME COLUMN a TO b")
    pg.execute("UPDATE t SET b = 'after', z = 1 WHERE id = 2")
    pg.execute("INSERT INTO t VALUES (4, 4, 'four')")
    second = Pipeline(config, spark=spark)
    second.run(until_caught_up=True)
    assert second.state is not None and second.state.parked() == {}
    assert mirror_rows(second, "public.t") == [
        (1, 0, "before"),
        (2, 1, "after"),
        (3, 0, "three"),
        (4, 4, "four"),
    ]
    assert_equal(second)

    # while a run streams: the query restarts for the schema change and renames again
    running = Pipeline(config, spark=spark)
    run = background(running).start()
    pg.execute("UPDATE t SET b = 'b1' WHERE id = 1")
    pg.execute(
        "BEGIN; UPDATE t SET b = 'b3' WHERE id = 3; ALTER TABLE t RENAME COLUMN b TO c;"
        " UPDATE t SET c = 'c4' WHERE id = 4; COMMIT"
    )
    pg.execute("DELETE FROM t WHERE id = 2")
    want = [(1, 0, "b1"), (3, 0, "b3"), (4, 4, "c4")]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not run.failures:
        if mirror_rows(running, "public.t") == want:
            break
        time.sleep(1)
    run.stop()
    assert not run.failures, [str(f)[:2000] for f in run.failures]
    final = Pipeline(config, spark=spark)
    final.run(until_caught_up=True)
    assert final.state is not None and final.state.parked() == {}
    assert mirror_rows(final, "public.t") == want
    assert_equal(final)
    assert final.plan is not None
    table = final.plan.table("public.t")
    history = DeltaTarget(table.path(final.layout, "history")).read()
    assert "c" in history.column_names and "a" not in history.column_names
    # the copy's version of row 1 kept its value through both renames
    assert "one" in history.column("c").to_pylist()
    changelog = DeltaTarget(table.path(final.layout, "changelog")).read()
    assert "c" in changelog.column_names and "b" not in changelog.column_names
