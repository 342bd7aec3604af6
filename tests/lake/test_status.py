"""``pgcdc status``: what it reports matches the server and the lake, in both output forms; it
says "not started" for a new lake and names the fix (exit 1) when the slot is gone; the
password of the connection string never appears, and ``--log-format json`` logs are JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from pgcdc.cli import main
from pgcdc.lake.store.tables import LakeLayout
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lsn import Lsn
from tests.fix_pg import PgDatabase, newest_server

PASSWORD = "Sw0rdfish-9f3k"

CONFIG = """
[source]
dsn = "{dsn}"
slot = "ops_slot"
publication = "{publication}"
{source}

[lake]
path = "lake"

[spark]
master = "local[2]"

{extra}

[[tables]]
name = "{table}"
"""


def write_config(
    tmp_path: Path,
    dsn: str,
    table: str = "items",
    *,
    source: str = "",
    extra: str = "",
    publication: str = "ops_pub",
) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(
        CONFIG.format(dsn=dsn, table=table, source=source, extra=extra, publication=publication)
    )
    return path


@pytest.fixture
def secret_dsn(pg: PgDatabase) -> Iterator[str]:
    """A DSN of a role with a password (the servers trust loopback, so libpq never sends it,
    but it is in the connection string every command reads)."""
    role = f"ops_{pg.dbname}"
    with pg.connect() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(PASSWORD)
            )
        )
    try:
        yield pg.dsn(user=role, password=PASSWORD)
    finally:
        with pg.connect() as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def status_json(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["status", "--config", str(config), "--json"])
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err
    return code, json.loads(out.out)


def test_status_of_a_new_lake(
    pg: PgDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pg.execute("CREATE TABLE items (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg.dsn(password=PASSWORD))
    assert main(["status", "--config", str(config)]) == 0
    out = capsys.readouterr()
    assert "not started" in out.out and "ops_slot: missing" in out.out
    assert PASSWORD not in out.out + out.err
    code, report = status_json(config, capsys)
    assert code == 0
    assert report["state"] == "not started" and report["ok"] is True
    assert report["pipeline"] is None and report["tables"] == []
    assert report["slot"]["exists"] is False
    current = pg.execute("SELECT pg_current_wal_lsn()::text")[0][0]
    assert Lsn.parse(report["server"]["current_wal_lsn"]) <= Lsn.parse(str(current))
    assert not (tmp_path / "lake").exists()  # status creates nothing


@pytest.mark.slow
@newest_server
def test_status_after_runs_then_without_slot(
    pg: PgDatabase,
    spark: Any,
    secret_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
    pg.execute("INSERT INTO items SELECT g, g % 7, 'n' || g FROM generate_series(1, 40) g")
    config = write_config(tmp_path, secret_dsn)
    assert main(["run", "--config", str(config), "--until-caught-up"]) == 0
    pg.execute("UPDATE items SET qty = qty + 1 WHERE id <= 10")
    pg.execute("DELETE FROM items WHERE id > 35")
    pg.execute("INSERT INTO items VALUES (100, 1, 'x')")
    capsys.readouterr()
    # the second run logs as JSON: every line of stderr is one object, LSNs included
    argv = ["--log-format", "json", "--log-level", "INFO", "run", "--config", str(config)]
    assert main([*argv, "--until-caught-up"]) == 0
    err = capsys.readouterr().err
    assert PASSWORD not in err
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    batches = [r for r in records if "batch" in r and "max_lsn" in r]
    assert batches and all(r["changes"] > 0 for r in batches)
    assert any("lsn" in r and r["lsn"] for r in records)  # resuming / stream started
    assert any(r["message"].startswith("stream: ") for r in records)

    # the walsender of the run that just ended may take a moment to exit
    deadline = time.monotonic() + 30
    while pg.execute("SELECT bool_or(active) FROM pg_replication_slots") == [(True,)]:
        assert time.monotonic() < deadline, "the finished run's walsender did not exit"
        time.sleep(0.05)
    code, report = status_json(config, capsys)
    assert code == 0, report["problems"]
    assert report["state"] == "stopped" and report["ok"] is True
    slot = pg.execute(
        "SELECT confirmed_flush_lsn::text, restart_lsn::text, active FROM pg_replication_slots "
        "WHERE slot_name = 'ops_slot'"
    )[0]
    assert report["slot"]["confirmed_flush_lsn"] == str(Lsn.parse(str(slot[0])))
    assert report["slot"]["confirmed_flush_lsn_int"] == int(Lsn.parse(str(slot[0])))
    assert report["slot"]["restart_lsn"] == str(Lsn.parse(str(slot[1])))
    assert report["slot"]["active"] is False and report["slot"]["wal_status"] == "reserved"
    assert report["slot"]["retained_wal_bytes"] >= 0
    assert report["lag"]["bytes"] >= 0 and report["lag"]["seconds"] >= 0
    assert (
        report["server"]["current_wal_lsn_int"] - report["slot"]["confirmed_flush_lsn_int"]
        == report["lag"]["bytes"]
    )
    assert report["pipeline"]["snapshot_done"] is True and report["pipeline"]["generation"] == 1
    assert report["publication"] == {"name": "ops_pub", "exists": True, "created_by_pgcdc": True}
    (table,) = report["tables"]
    mirror = DeltaTarget(LakeLayout(tmp_path / "lake").table_path("public", "items"))
    assert table["table"] == "public.items"
    assert table["rows"] == mirror.count() == pg.execute("SELECT count(*) FROM items")[0][0] == 36
    assert table["last_batch"] is not None and table["last_batch"] == report["stream"]["last_batch"]
    newest = max(mirror.read(columns=["__commit_lsn"]).column(0).to_pylist())
    assert table["newest_change_lsn_int"] == newest
    assert table["delta_version"] == mirror.version()

    assert main(["status", "--config", str(config)]) == 0
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err
    assert "pgcdc status: stopped" in out.out
    assert report["slot"]["confirmed_flush_lsn"] in out.out
    assert "public.items" in out.out and " 36 " in out.out

    pg.execute("SELECT pg_drop_replication_slot('ops_slot')")
    code, report = status_json(config, capsys)
    assert code == 1 and report["ok"] is False and report["state"] == "slot missing"
    assert main(["status", "--config", str(config)]) == 1
    out = capsys.readouterr()
    assert "slot 'ops_slot' is gone" in out.out and "move the lake" in out.out
    assert PASSWORD not in out.out + out.err


@pytest.mark.slow
def test_status_reports_a_failing_batch_until_one_is_applied(
    pg: PgDatabase,
    spark: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run failing on a batch (fault injection before the batch's Delta commits): the
    state records the batch, its LSN range and the error's class, kept through a second failed
    run; ``status`` shows it and exits 1 while it stands; a run that applies the batch clears
    it and ``status`` exits 0 again (issue 24)."""
    from pgcdc.lake.config import load_config
    from pgcdc.lake.results import PipelineError
    from pgcdc.lake.run.pipeline import Pipeline
    from pgcdc.lake.store.state import load_state

    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    pg.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 20) g")
    config = write_config(tmp_path, pg.dsn())
    # three Delta tables, written at the same time
    text = config.read_text().replace('path = "lake"', 'path = "lake"\nhistory = true')
    config.write_text(text.replace("history = true", "history = true\nchangelog = true"))
    assert main(["run", "--config", str(config), "--until-caught-up"]) == 0
    pg.execute("INSERT INTO items VALUES (21, 21)")
    assert main(["run", "--config", str(config), "--until-caught-up"]) == 0
    code, report = status_json(config, capsys)
    assert code == 0 and report["stream"]["last_failure"] is None, report["problems"]
    last = report["stream"]["last_batch"]
    assert last is not None
    applied = Lsn.parse(report["slot"]["confirmed_flush_lsn"])

    pg.execute("UPDATE items SET qty = -qty WHERE id <= 5")
    pg.execute("INSERT INTO items VALUES (22, 22)")
    after = Lsn.parse(str(pg.execute("SELECT pg_current_wal_lsn()::text")[0][0]))
    settings = load_config(config)
    for _ in range(2):  # the batch fails every run (a bug in writing, say)
        with pytest.raises(PipelineError, match="injected failure"):
            Pipeline(settings, spark=spark, fail_after_commits=0).run(until_caught_up=True)
    state = load_state(LakeLayout(tmp_path / "lake"))
    assert state is not None and state.last_failure is not None
    failure = state.last_failure
    assert failure.batch == last + 1 and failure.error == "RuntimeError"
    assert failure.attempts == 2
    assert failure.first_at <= failure.at
    assert failure.start_lsn is not None and failure.end_lsn is not None
    # from the end of the last batch applied (the slot may be confirmed further, up to the
    # server's WAL end while idle) through the failed batch's last transaction
    assert Lsn.parse(failure.start_lsn) <= applied < Lsn.parse(failure.end_lsn) <= after

    capsys.readouterr()
    code, report = status_json(config, capsys)
    assert code == 1 and report["ok"] is False and report["state"] == "failing"
    shown = report["stream"]["last_failure"]
    assert shown["standing"] is True and shown["batch"] == last + 1 and shown["attempts"] == 2
    assert shown["error"] == "RuntimeError"
    assert (shown["start_lsn"], shown["end_lsn"]) == (failure.start_lsn, failure.end_lsn)
    assert shown["start_lsn_int"] == int(Lsn.parse(failure.start_lsn))
    (problem,) = report["problems"]
    assert f"batch {last + 1}" in problem and "RuntimeError" in problem
    assert failure.end_lsn in problem
    assert report["slot"]["confirmed_flush_lsn"] == str(applied)  # nothing of it confirmed
    assert main(["status", "--config", str(config)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "pgcdc status: failing" in out and "failed batch" in out, out
    assert f"LSN {failure.start_lsn} to {failure.end_lsn}: RuntimeError" in out, out

    assert main(["run", "--config", str(config), "--until-caught-up", "--verify"]) == 0
    state = load_state(LakeLayout(tmp_path / "lake"))
    assert state is not None and state.last_failure is None
    code, report = status_json(config, capsys)
    assert code == 0 and report["ok"] is True, report["problems"]
    assert report["stream"]["last_failure"] is None
    assert report["state"] in ("stopped", "running")  # the run's walsender may not be gone yet
    assert report["stream"]["last_batch"] == last + 1
