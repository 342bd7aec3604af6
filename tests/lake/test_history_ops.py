"""The history's operations at the version boundaries, against a real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.config import ConfigError
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.target import DeltaTarget
from tests.fix_pg import PgDatabase, newest_server
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, make_config

pytestmark = pytest.mark.slow


@newest_server
def test_a_transaction_that_updates_then_deletes_a_key_ends_its_version_with_d(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """One transaction updating a key and then deleting it leaves no version of the key: the
    version it ends was deleted. The history read ``__end_op`` 'U' (the transaction's first
    change), an update with no version after it, both when the ended version was stored before
    the batch (key 1) and when the batch wrote it (key 2)."""
    pg.execute("CREATE TABLE h (id int PRIMARY KEY, v int); INSERT INTO h VALUES (1, 1), (2, 2)")
    config = make_config(pg, tmp_path / "lake", [{"name": "h", "history": True}])
    Pipeline(config, spark=spark).run(until_caught_up=True)
    pg.execute("BEGIN; UPDATE h SET v = 10 WHERE id = 1; DELETE FROM h WHERE id = 1; COMMIT")
    pg.execute("UPDATE h SET v = 20 WHERE id = 2")
    pg.execute("BEGIN; UPDATE h SET v = 21 WHERE id = 2; DELETE FROM h WHERE id = 2; COMMIT")
    pipeline = Pipeline(config, spark=spark)
    pipeline.run(until_caught_up=True)
    assert_equal(pipeline)
    assert pipeline.plan is not None
    table = pipeline.plan.table("public.h")
    assert_history_matches_mirror(pipeline, table)
    rows = DeltaTarget(table.path(pipeline.layout, "history")).read().to_pylist()
    versions = sorted((r["id"], r["v"], r["__start_op"], r["__end_op"]) for r in rows)
    assert versions == [(1, 1, "S", "D"), (2, 2, "S", "U"), (2, 20, "U", "D")]
    starts = {(r["id"], r["__start_lsn"]) for r in rows}
    for r in rows:  # a version ended by an update has a version starting where it ends
        if r["__end_op"] == "U":
            assert (r["id"], r["__end_lsn"]) in starts, r


@newest_server
def test_a_history_turned_on_after_the_copy_is_refused(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """``history = true`` added to a running pipeline's table: the stream created the history
    at the next change of the table, with a version of each key changed since and of no other
    (key 2 had none, key 1's started with 'U'): its current versions were not the table, and
    nothing said so."""
    pg.execute("CREATE TABLE h (id int PRIMARY KEY, v int); INSERT INTO h VALUES (1, 1), (2, 2)")
    lake = tmp_path / "lake"
    Pipeline(make_config(pg, lake, [{"name": "h"}]), spark=spark).run(until_caught_up=True)
    pg.execute("UPDATE h SET v = 10 WHERE id = 1")
    config = make_config(pg, lake, [{"name": "h", "history": True}])
    with pytest.raises(ConfigError, match="h has no history table"):
        Pipeline(config, spark=spark).run(until_caught_up=True)
    pipeline = Pipeline(make_config(pg, lake, [{"name": "h"}]), spark=spark)
    pipeline.run(until_caught_up=True)  # without it, the pipeline goes on
    assert_equal(pipeline)


@newest_server
def test_a_history_turned_off_and_on_again_is_refused(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """The history of runs with history off missed their changes (key 1's delete here): its
    current versions were no longer the table, and nothing said so (found by review)."""
    pg.execute("CREATE TABLE h (id int PRIMARY KEY, v int); INSERT INTO h VALUES (1, 1), (2, 2)")
    lake = tmp_path / "lake"
    on = make_config(pg, lake, [{"name": "h", "history": True}])
    off = make_config(pg, lake, [{"name": "h"}])
    Pipeline(on, spark=spark).run(until_caught_up=True)
    Pipeline(off, spark=spark).run(until_caught_up=True)
    pg.execute("DELETE FROM h WHERE id = 1")
    Pipeline(off, spark=spark).run(until_caught_up=True)
    with pytest.raises(ConfigError, match="turned off and on again"):
        Pipeline(on, spark=spark).run(until_caught_up=True)
