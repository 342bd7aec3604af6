"""Failures ``pgcdc run`` cannot repair by itself, through the CLI: each exits non-zero with a
message naming the cause and the fix, and commits nothing partial to the lake (no new Delta
version, no new table folder, no state change).

Slot invalidated (max_slot_wal_keep_size), publication dropped under a running pipeline, a
table dropped between runs, server not reachable, a Spark that cannot start. Wrong passwords,
missing privileges (and passwords in output) are in test_roles.py, which runs a server with
password authentication.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgcdc.cli import main
from pgcdc.cli.throwaway_server import free_port
from pgcdc.lake.config import load_config
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.state import RUN_LOCK
from pgcdc.lake.store.target import DeltaTarget
from tests.fix_pg import PgDatabase
from tests.fix_pipeline import Background

pytestmark = pytest.mark.slow

CONFIG = """\
[source]
dsn = "{dsn}"
slot = "err_slot"
publication = "err_pub"

[lake]
path = "lake"
history = true
changelog = true

[spark]
master = "local[2]"

[stream]
trigger_interval = 0.5

[[tables]]
name = "public.*"
"""


def write_config(tmp_path: Path, dsn: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(CONFIG.format(dsn=dsn))
    return path


def lake_snapshot(lake: Path) -> dict[str, object]:
    """Every file under the lake except the streaming checkpoint, with each Delta table's
    version: what a failed run must leave as it was."""
    out: dict[str, object] = {}
    for path in sorted(lake.rglob("*")):
        rel = path.relative_to(lake).as_posix()
        if rel.startswith("_pgcdc/checkpoint-"):
            continue
        if path.is_dir() and (path / "_delta_log").is_dir():
            out[rel + "@version"] = DeltaTarget(path).version()
        elif path.is_file() and "_delta_log" in rel:
            out[rel] = path.stat().st_size
        elif path.is_file() and rel.startswith("_pgcdc/") and path.name != RUN_LOCK:
            out[rel] = path.read_bytes()
    return out


def run_cli(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["run", "--config", str(config), "--until-caught-up", *extra])
    return code, capsys.readouterr().err


def setup_pipeline(
    pg: PgDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[Path, Path]:
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    pg.execute("CREATE TABLE other (id int PRIMARY KEY, note text)")
    pg.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 20) g")
    pg.execute("INSERT INTO other VALUES (1, 'x')")
    config = write_config(tmp_path, pg.dsn())
    code, err = run_cli(config, capsys, "--verify")
    assert code == 0, err
    return config, tmp_path / "lake"


def test_server_not_reachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()  # a port nothing listens on
    config = write_config(
        tmp_path, f"host=127.0.0.1 port={port} dbname=x user=u password=Secr3tPw connect_timeout=3"
    )
    code, err = run_cli(config, capsys)
    assert code == 1, err
    low = err.lower()
    assert f"127.0.0.1:{port}" in err and ("refused" in low or "not reachable" in low), err
    assert "check" in low, err  # the fix: check host, port, that the server runs
    assert "Secr3tPw" not in err
    assert not (tmp_path / "lake").exists()


def test_table_dropped_between_runs(
    pg: PgDatabase, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table a pattern matched, dropped on the source, leaves the pipeline (issue 43): its
    lake tables are kept as they were, the others stream on."""
    config, lake = setup_pipeline(pg, tmp_path, capsys)
    pg.execute("INSERT INTO other VALUES (2, 'y')")
    pg.execute("DROP TABLE items")
    before = lake_snapshot(lake)
    code, err = run_cli(config, capsys)
    assert code == 0, err
    assert "removed tables: public.items" in err, err
    kept = {k: v for k, v in lake_snapshot(lake).items() if k.startswith("public/items")}
    assert kept == {k: v for k, v in before.items() if k.startswith("public/items")}
    assert kept, "the dropped table's lake tables are gone"
    other = DeltaTarget(lake / "public" / "other").read()
    assert sorted(other.column("id").to_pylist()) == [1, 2]


def test_publication_dropped_under_a_running_pipeline(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    background: Callable[[Pipeline], Background],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # PostgreSQL 15 fails the stream ("publication ... does not exist"); 16+ skips a dropped
    # publication with a WARNING in the server log, so pgcdc's slot monitor checks that the
    # publication exists: either way the pipeline stops with an error naming the fix.
    config, lake = setup_pipeline(pg, tmp_path, capsys)
    pipeline = Pipeline(load_config(config), spark=spark)
    run = background(pipeline).start(120)
    failures = run.failures
    pg.execute("INSERT INTO items VALUES (100, 1)")
    deadline = time.monotonic() + 60
    while pipeline.progress is None or pipeline.progress.changes == 0:
        assert time.monotonic() < deadline and not failures, failures
        time.sleep(0.2)
    before = lake_snapshot(lake)
    pg.execute("DROP PUBLICATION err_pub")
    pg.execute("INSERT INTO items VALUES (101, 1)")
    if not run.join(60):
        run.stop(60)
        pytest.fail("the pipeline kept running without its publication")
    assert failures, "the pipeline ended without an error"
    message = " ".join(str(failures[0]).split())
    assert "err_pub" in message, message
    assert ("does not exist" in message and "create it" in message) or (
        "is gone" in message and "move the lake away" in message
    ), message  # the cause and the fix
    assert message.count("Fix:") <= 1, message  # one fix, not a fix per layer
    assert lake_snapshot(lake) == before
    # a later start refuses at once, with the same clear error (no traceback, no new copy)
    code, err = run_cli(config, capsys)
    err = " ".join(err.split())
    assert code == 1, err
    assert "publication 'err_pub' is gone" in err and "Traceback" not in err, err
    assert lake_snapshot(lake) == before


def test_slot_invalidated(
    pg: PgDatabase, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, lake = setup_pipeline(pg, tmp_path, capsys)
    pg.execute("CREATE SCHEMA junk")  # outside the configured public.*
    pg.execute("CREATE TABLE junk.filler (x text)")
    before = lake_snapshot(lake)
    try:
        pg.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        pg.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while pg.execute(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'err_slot'"
        ) != [("lost",)]:
            assert time.monotonic() < deadline, "the slot was not invalidated"
            pg.execute(
                "INSERT INTO junk.filler SELECT repeat('w', 1000) FROM generate_series(1, 5000)"
            )
            pg.execute("SELECT pg_switch_wal()")
            pg.execute("CHECKPOINT")
    finally:
        pg.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        pg.execute("SELECT pg_reload_conf()")
    code, err = run_cli(config, capsys)
    err = " ".join(err.split())
    assert code == 1, err
    assert "err_slot" in err and "invalidated" in err, err
    assert "max_slot_wal_keep_size" in err and "move the lake" in err, err
    assert lake_snapshot(lake) == before


@pytest.mark.parametrize("pg_server", [18], indirect=True, ids=["pg18"])
def test_spark_that_cannot_start(pg: PgDatabase, tmp_path: Path) -> None:
    """A Spark driver that cannot start (here: too little memory) stops ``run`` with Spark's
    reason and the fix, before anything is created on the server or in the lake."""
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    config = write_config(tmp_path, pg.dsn())
    config.write_text(config.read_text() + '\n[spark.conf]\n"spark.driver.memory" = "64m"\n')
    done = subprocess.run(
        [sys.executable, "-m", "pgcdc", "run", "--config", str(config), "--until-caught-up"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    err = " ".join(done.stderr.split())
    assert done.returncode == 1, err
    assert "Spark did not start" in err and "spark.driver.memory" in err, err
    assert "[spark.conf]" in err and "Traceback" not in err, err
    assert pg.execute("SELECT count(*) FROM pg_publication") == [(0,)]
    assert pg.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]
    assert not (tmp_path / "lake").exists()
