"""``pgcdc run`` and ``pgcdc demo`` as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgcdc.cli import main
from tests.fix_pg import PgDatabase, newest_server

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[source]
dsn = "{dsn}"
slot = "cli_slot"
publication = "cli_pub"

[lake]
path = "lake"
history = true

[spark]
master = "local[2]"

[[tables]]
name = "{table}"
{extra}
"""


def write_config(tmp_path: Path, pg: PgDatabase, table: str, extra: str = "") -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(CONFIG.format(dsn=pg.dsn(), table=table, extra=extra))
    return path


def nothing_created(pg: PgDatabase, tmp_path: Path) -> None:
    assert pg.execute("SELECT count(*) FROM pg_publication") == [(0,)]
    assert pg.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]
    assert not (tmp_path / "lake").exists()


def test_wrong_configuration_is_refused_before_anything_is_created(
    pg: PgDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
    config = write_config(tmp_path, pg, "itemz")
    assert main(["run", "--config", str(config), "--until-caught-up"]) == 2
    err = capsys.readouterr().err
    assert "tables[0].name" in err and "'itemz' names no table" in err
    nothing_created(pg, tmp_path)

    config = write_config(tmp_path, pg, "items", 'row_filter = "qty > 5"')
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "tables[0].row_filter" in err and "replica identity" in err
    nothing_created(pg, tmp_path)

    config.write_text(config.read_text().replace('slot = "cli_slot"', 'slot = "Cli-Slot"'))
    assert main(["run", "--config", str(config)]) == 2
    assert "source.slot" in capsys.readouterr().err
    nothing_created(pg, tmp_path)

    config = write_config(tmp_path, pg, "items", 'row_filter = "id > 5"')
    assert main(["run", "--config", str(config), "--check"]) == 0
    assert "configuration OK: 1 tables (public.items), first start" in capsys.readouterr().err
    nothing_created(pg, tmp_path)


@newest_server
def test_run_until_caught_up_and_verify(
    pg: PgDatabase, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
    pg.execute("INSERT INTO items SELECT g, g % 7, 'n' || g FROM generate_series(1, 50) g")
    config = write_config(tmp_path, pg, "items", 'row_filter = "id > 5"')
    argv = ["run", "--config", str(config), "--until-caught-up", "--verify"]
    assert main(argv) == 0
    assert "public.items: equal; source 45 rows" in capsys.readouterr().err
    pg.execute("UPDATE items SET qty = qty + 1 WHERE id % 2 = 0")
    pg.execute("DELETE FROM items WHERE id > 40")
    pg.execute("INSERT INTO items VALUES (100, 1, 'x'), (-3, 1, 'filtered out')")
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "public.items: equal; source 36 rows" in err
    assert "stream: 1 batches" in err


def pgcdc_without_java(
    tmp_path: Path, *argv: str, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``python -m pgcdc ARGV`` (after ``prefix``) with ``JAVA_HOME`` at a folder with no Java:
    a command that starts Spark fails with "Spark did not start", so one that fails otherwise
    did so before any JVM was launched."""
    env = dict(os.environ, COLUMNS="200", JAVA_HOME=str(tmp_path / "no-java"))
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    return subprocess.run(
        [*prefix, sys.executable, "-m", "pgcdc", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@newest_server
def test_a_held_lake_is_refused_before_spark_starts(pg: PgDatabase, tmp_path: Path) -> None:
    """A second run on a lake another process holds is refused at once, naming the holder,
    without starting Spark (issue 41: it was refused after Spark's 35 s start)."""
    from pgcdc.lake.store.state import run_lock
    from pgcdc.lake.store.storage import LakeLocation
    from pgcdc.lake.store.tables import LakeLayout

    pg.execute("CREATE TABLE items (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg, "items")
    with run_lock(LakeLayout(LakeLocation.parse(tmp_path / "lake"))):
        done = pgcdc_without_java(tmp_path, "run", "--config", str(config))
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"is in use by pgcdc run (pid {os.getpid()} " in done.stderr, done.stderr[-3000:]
    assert "Spark did not start" not in done.stderr
    assert pg.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]


@newest_server
def test_a_read_only_lake_is_refused_by_check_and_before_spark_starts(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """A lake on a read-only mount: ``--check`` says so (it said "configuration OK"), and
    ``run`` fails naming the path and the fix before starting Spark, without a traceback (it
    failed with OSError: [Errno 30] after Spark's start-up; issue 41). The read-only mount is
    a bind mount in a mount namespace of the command's own (``unshare``), gone with it."""
    pg.execute("CREATE TABLE items (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg, "items")
    lake = tmp_path / "lake"
    lake.mkdir()
    read_only = (
        "unshare",
        "--mount",
        "sh",
        "-ec",
        f'mount --bind "{lake}" "{lake}"; mount -o remount,bind,ro "{lake}"; exec "$@"',
        "read-only-lake",
    )
    for argv in (("run", "--config", str(config), "--check"), ("run", "--config", str(config))):
        done = pgcdc_without_java(tmp_path, *argv, prefix=read_only)
        assert done.returncode == 1, done.stderr[-3000:]
        err = " ".join(done.stderr.split())  # as one line: the console wraps long ones
        assert f"cannot write to the lake {lake}: {lake}/_pgcdc: Read-only file system" in err
        assert "Fix: make the lake writable" in err and "lake.path" in err, err[-3000:]
        assert "Traceback" not in err and "Spark did not start" not in err, err[-3000:]
        assert "configuration OK" not in err
    assert list(lake.iterdir()) == []
    assert pg.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]
    assert pg.execute("SELECT count(*) FROM pg_publication") == [(0,)]


@pytest.mark.slow
def test_demo(tmp_path: Path) -> None:
    """The README's first command, end to end, in its own process (its own Spark), and the
    Spark SQL command line it ends with, reading the tables by name."""
    env = dict(os.environ, COLUMNS="160")
    done = subprocess.run(
        [sys.executable, "-m", "pgcdc", "demo", "--seconds", "6", "--lake", str(tmp_path / "lake")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for table in ("shop.customers", "shop.products", "shop.orders", "shop.order_items"):
        assert table in done.stderr
    assert "mirror equals source" in done.stderr
    assert "DIFFERENT" not in done.stderr
    assert (tmp_path / "lake" / "shop" / "orders.history" / "_delta_log").is_dir()
    # a new user sees pgcdc's words only: not the JVM's start-up notices or Spark's log4j
    # profile and warnings (issue 41), nor terminal escapes in a captured output
    for noise in ("NativeCodeLoader", "log4j", "incubator", "WARN ", "\x1b"):
        assert noise not in done.stdout + done.stderr, noise

    # its closing line, pasted into a shell: the tables by name from the embedded metastore
    line = next(x for x in done.stderr.splitlines() if x.startswith("SPARK_HOME="))
    assert " spark.sql.catalogImplementation=hive " in line
    query = subprocess.run(
        ["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert query.returncode == 0, query.stderr[-4000:]
    statuses = {row.split("\t")[0] for row in query.stdout.splitlines()}
    assert statuses and statuses <= {"placed", "paid", "shipped"}, query.stdout


@pytest.mark.slow
@newest_server
def test_every_line_is_json_with_log_format_json(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """``pgcdc --log-format json``: every line the process writes, to stdout and stderr, is a
    JSON object, the Spark JVM's included: what Delta's VACUUM prints ("Deleted N files", with
    Scala's println) and Spark's log arrive as records of logger ``pgcdc.spark.jvm`` (issue
    41). Spark's default log4j profile and its NativeCodeLoader warning are gone."""
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
    pg.execute("INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 50) g")
    config = write_config(tmp_path, pg, "items")
    # compaction after each batch leaves files for a vacuum, due at once, to delete
    lake = "history = true\ncompact_files = 2\nvacuum_retention_hours = 0\nvacuum_interval = 0"
    config.write_text(config.read_text().replace("history = true", lake))
    assert main(["run", "--config", str(config), "--until-caught-up"]) == 0  # the copy
    pg.execute("UPDATE items SET qty = qty + 1")
    json_logs = ["--log-format", "json", "--log-level", "DEBUG"]
    run = ["run", "--config", str(config), "--until-caught-up"]
    done = subprocess.run(
        [sys.executable, "-m", "pgcdc", *json_logs, *run],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = []
    for line in (done.stdout + done.stderr).splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    assert all(isinstance(r, dict) and "level" in r and "message" in r for r in records)
    assert any(r["message"].startswith("vacuumed public.items") for r in records)
    printed = [r for r in records if r["logger"] == "pgcdc.spark.jvm" and r.get("jvm_stream")]
    assert any(r["message"].startswith("Deleted ") for r in printed), printed
    for noise in ("NativeCodeLoader", "log4j", "\x1b"):
        assert noise not in done.stdout + done.stderr, noise


@pytest.mark.slow
@newest_server
def test_a_transaction_larger_than_the_driver_heap_passes(pg: PgDatabase, tmp_path: Path) -> None:
    """With a 512 MiB driver heap, a transaction of about 120 MB of values into a table with a
    history table is applied in one commit per Delta table: no batch passes through the
    driver's Python or is collected to it, the MERGEs run in the executors (in a local session,
    the same JVM, spilling to disk). With the earlier driver-side writes this ran the heap out
    unless staged in chunks."""
    pg.execute("CREATE TABLE wide (id bigint PRIMARY KEY, payload text)")
    config = write_config(tmp_path, pg, "wide", '\n[spark.conf]\n"spark.driver.memory" = "512m"\n')
    argv = [sys.executable, "-m", "pgcdc", "--log-level", "INFO", "run", "--config", str(config)]
    argv.append("--until-caught-up")

    def run(*extra: str) -> str:
        done = subprocess.run(
            [*argv, *extra],
            cwd=tmp_path,
            env=dict(os.environ, COLUMNS="160"),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stderr

    run()
    pg.execute(
        "INSERT INTO wide SELECT g, repeat(md5(g::text), 31) FROM generate_series(1, 120000) g"
    )
    err = run("--verify")
    assert "stream: 1 batches" in err, err[-3000:]
    assert "public.wide: equal; source 120000 rows" in err


@pytest.mark.skipif(
    shutil.which("mvn") is None, reason="no Maven (set-up installs it to fetch jars)"
)
def test_the_set_up_fetches_jars_without_a_word_of_maven(tmp_path: Path) -> None:
    """``make demo`` first sets up; it fetches the jars with ``tools/maven.sh``, which shows
    nothing of Maven's (Debian's Maven 3.8.7 writes ESC[0m even with -q -B
    -Dstyle.color=never, issue 41) unless Maven fails: then its words, without escapes."""
    maven = str(ROOT / "tools" / "maven.sh")
    jars = tmp_path / "jars"
    pom = ROOT / "tools" / "jars" / "pom.xml"
    done = subprocess.run(
        [maven, "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={jars}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert any(jar.name.startswith("delta-spark_") for jar in jars.iterdir())
    missing = tmp_path / "missing.xml"
    failed = subprocess.run(
        [maven, "-f", str(missing), "validate"], capture_output=True, text=True, check=False
    )
    assert failed.returncode != 0 and str(missing) in failed.stderr, failed.stderr
    assert "\x1b" not in failed.stdout + failed.stderr
