"""Tables without a key (REPLICA IDENTITY FULL, no primary key): the lake holds the source's
rows as a multiset, copy by copy, as PostgreSQL's own subscriber applies them.

* the issue's reproduction: identical rows copied, then an identical insert, a delete of one
  copy and an update of one of two copies, each in its own run;
* a seeded random workload (the seed is printed; ``PGCDC_TEST_SEED`` replays one) over a few
  distinct values, so most rows have twins: inserts, deletes and updates of one copy (also
  turning a row into another's twin, and back), several changes of one value in a transaction,
  TRUNCATEs between other changes, over several runs in a row, with history and changelog.
  After every run the mirror equals the source as a multiset and the history's current versions
  equal the mirror. (Kills in between are the chaos suite's: its workload's ``full_t`` is such a
  table.)
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.tables import MIRROR_COLUMNS
from pgcdc.lake.store.target import DeltaTarget
from tests.fix_pg import PgDatabase, newest_server
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, make_config

pytestmark = pytest.mark.slow


def mirror_multiset(pipeline: Pipeline, table_id: str) -> Counter[tuple[Any, ...]]:
    assert pipeline.plan is not None
    table = pipeline.plan.table(table_id)
    data = DeltaTarget(table.path(pipeline.layout)).read()
    columns = [c for c in data.column_names if c not in MIRROR_COLUMNS]
    return Counter(tuple(row[c] for c in columns) for row in data.select(columns).to_pylist())


def run_checked(config: Any, spark: Any, table_id: str) -> Counter[tuple[Any, ...]]:
    """One run until caught up; the mirror equals the source and the history's current versions
    equal the mirror; the mirror's rows as a multiset."""
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert_equal(pipeline)
    assert pipeline.plan is not None
    assert_history_matches_mirror(pipeline, pipeline.plan.table(table_id))
    return mirror_multiset(pipeline, table_id)


@newest_server
def test_identical_rows_are_kept_copy_by_copy(pg: PgDatabase, spark: Any, tmp_path: Path) -> None:
    pg.execute(
        "CREATE TABLE d (a int, b text); ALTER TABLE d REPLICA IDENTITY FULL; "
        "INSERT INTO d VALUES (1, 'x'), (1, 'x'), (2, 'y')"
    )
    config = make_config(
        pg, tmp_path / "lake", [{"name": "public.d", "history": True, "changelog": True}]
    )

    def run() -> Counter[tuple[Any, ...]]:
        return run_checked(config, spark, "public.d")

    assert run() == Counter({(1, "x"): 2, (2, "y"): 1})
    pg.execute("INSERT INTO d VALUES (1, 'x')")
    assert run() == Counter({(1, "x"): 3, (2, "y"): 1})
    pg.execute("DELETE FROM d WHERE ctid = (SELECT ctid FROM d WHERE a = 1 LIMIT 1)")
    assert run() == Counter({(1, "x"): 2, (2, "y"): 1})
    pg.execute("UPDATE d SET b = 'z' WHERE ctid = (SELECT ctid FROM d WHERE a = 1 LIMIT 1)")
    assert run() == Counter({(1, "x"): 1, (1, "z"): 1, (2, "y"): 1})
    # a copy updated into its twin's values, and one of two twins deleted, in one transaction
    with pg.connect() as conn, conn.transaction():
        conn.execute("UPDATE d SET b = 'x' WHERE b = 'z'")
        conn.execute("DELETE FROM d WHERE ctid = (SELECT ctid FROM d WHERE b = 'x' LIMIT 1)")
        conn.execute("INSERT INTO d VALUES (2, 'y'), (2, 'y')")
    assert run() == Counter({(1, "x"): 1, (2, "y"): 3})


def _one(conn: Any, rng: random.Random) -> None:
    """One random change of ``m``: mostly of values that have twins."""
    a, b = rng.randint(0, 2), rng.choice(["p", "q", None])
    choice = rng.random()
    if choice < 0.45:
        conn.execute("INSERT INTO m VALUES (%s, %s, %s)", (a, b, rng.randint(0, 1)))
    elif choice < 0.7:
        conn.execute(
            "DELETE FROM m WHERE ctid = (SELECT ctid FROM m WHERE a = %s ORDER BY ctid LIMIT 1)",
            (a,),
        )
    elif choice < 0.98:
        conn.execute(
            "UPDATE m SET b = %s, c = %s WHERE ctid = "
            "(SELECT ctid FROM m WHERE a = %s ORDER BY ctid DESC LIMIT 1)",
            (b, rng.randint(0, 1), a),
        )
    else:
        conn.execute("TRUNCATE m")


@newest_server
def test_random_workload_on_identical_rows(pg: PgDatabase, spark: Any, tmp_path: Path) -> None:
    seed = int(os.environ.get("PGCDC_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (replay with PGCDC_TEST_SEED={seed})")
    rng = random.Random(seed)
    pg.execute("CREATE TABLE m (a int, b text, c int); ALTER TABLE m REPLICA IDENTITY FULL")
    with pg.connect() as conn:
        for _ in range(40):
            conn.execute(
                "INSERT INTO m VALUES (%s, %s, %s)",
                (rng.randint(0, 2), rng.choice(["p", "q", None]), rng.randint(0, 1)),
            )
    config = make_config(
        pg,
        tmp_path / "lake",
        [{"name": "public.m", "history": True, "changelog": True}],
        stream={"max_changes_per_trigger": 60},  # several batches per run
    )
    for run in range(3):
        if run:
            with pg.connect() as conn:
                for _ in range(25):
                    with conn.transaction():
                        for _ in range(rng.randint(1, 4)):
                            _one(conn, rng)
        multiset = run_checked(config, spark, "public.m")  # equal as multisets
        ((rows,),) = pg.execute("SELECT count(*) FROM m")
        assert sum(multiset.values()) == rows, f"seed {seed}"


@newest_server
def test_a_deferrable_key_swapped_by_one_update(pg: PgDatabase, spark: Any, tmp_path: Path) -> None:
    """A DEFERRABLE primary key is unique only at commit: one UPDATE swapping two keys has two
    rows holding key 2 for a moment. Mirrored by that key, the lake lost a row (the delete half
    of the second row's move won over the first row's arrival); the table is a multiset."""
    pg.execute(
        "CREATE TABLE s (id int PRIMARY KEY DEFERRABLE INITIALLY IMMEDIATE, v text); "
        "ALTER TABLE s REPLICA IDENTITY FULL; INSERT INTO s VALUES (1, 'a'), (2, 'b')"
    )
    config = make_config(
        pg, tmp_path / "lake", [{"name": "public.s", "history": True, "changelog": True}]
    )

    def run() -> Counter[tuple[Any, ...]]:
        return run_checked(config, spark, "public.s")

    assert run() == Counter({(1, "a"): 1, (2, "b"): 1})
    pg.execute("UPDATE s SET id = 3 - id WHERE id IN (1, 2)")
    assert run() == Counter({(2, "a"): 1, (1, "b"): 1})
    pg.execute(
        "BEGIN; SET CONSTRAINTS ALL DEFERRED; UPDATE s SET id = 2 WHERE v = 'b'; "
        "UPDATE s SET id = 1 WHERE v = 'a'; COMMIT"
    )
    assert run() == Counter({(1, "a"): 1, (2, "b"): 1})
