"""A lake in an S3 bucket (``lake.path = "s3://bucket/prefix"``), end to end against a real
S3-compatible server (S3Proxy on loopback, ``tests.fix_s3``): ``pgcdc run``, ``status`` and
``drop`` as a user runs them, each in its own process with the credentials in its environment
only; the tables read back by delta-rs and by Spark's Delta reader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.config import load_config
from pgcdc.lake.store.tables import LakeLayout
from pgcdc.lake.store.target import DeltaTarget
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_s3 import S3ProxyServer, s3_client, s3_env

pytestmark = pytest.mark.slow

CONFIG = """
[source]
dsn = "{dsn}"
slot = "s3_slot"
publication = "s3_pub"

[lake]
path = "s3://{bucket}/lakes/one"
history = true
changelog = true

[lake.s3]
endpoint = "{endpoint}"
path_style = true

[spark]
master = "local[2]"

[[tables]]
name = "items"

[[tables]]
name = "notes"
"""


def write_config(tmp_path: Path, pg: PgDatabase, server: S3ProxyServer, bucket: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(CONFIG.format(dsn=pg.dsn(), bucket=bucket, endpoint=server.endpoint))
    return path


def pgcdc(
    server: S3ProxyServer, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``pgcdc *args`` in a process of its own (its own Spark), the store's keys in its
    environment only."""
    environment = {**os.environ, **s3_env(server), **(env or {}), "COLUMNS": "1000"}
    done = subprocess.run(
        [sys.executable, "-m", "pgcdc", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    done.stderr = " ".join(done.stderr.split())  # messages as one line each, unwrapped
    return done


def keys(server: S3ProxyServer, bucket: str, prefix: str = "") -> list[str]:
    client = s3_client(server)
    found: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found += [o["Key"] for o in page.get("Contents", [])]
    return found


def source_rows(pg: PgDatabase, table: str) -> list[tuple[Any, ...]]:
    return sorted(pg.execute(f"SELECT * FROM {table}"))  # noqa: S608 (a test's own name)


def lake_rows(config: Path, table: str, kind: str = "mirror") -> list[tuple[Any, ...]]:
    loaded = load_config(config)
    layout = LakeLayout(loaded.lake.location())
    target = DeltaTarget(layout.table_path("public", table, kind))
    data = target.read()
    names = [n for n in data.column_names if not n.startswith("__")]
    return sorted(zip(*(data.column(n).to_pylist() for n in names), strict=True))


SPARK_READ = """
import json, sys
from pgcdc.lake.config import load_config
from pgcdc.lake.run.pipeline import session_conf
from pgcdc.lake.store.tables import LakeLayout
from pgcdc.spark import spark_session

config = load_config(sys.argv[1])
spark = spark_session(master="local[1]", app_name="s3-read", conf=session_conf(config))
layout = LakeLayout(config.lake.location())
out = {}
for kind in ("mirror", "history", "changelog"):
    path = str(layout.table_path("public", "items", kind))
    out[kind] = spark.read.format("delta").load(path).count()
mirror = layout.table_path("public", "items")
out["versions"] = spark.sql(f"DESCRIBE HISTORY delta.`{mirror}`").count()
print(json.dumps(out))
"""


@newest_server
def test_a_pipeline_into_a_bucket(
    pg: PgDatabase, s3_credentials: S3ProxyServer, s3_bucket: str, tmp_path: Path
) -> None:
    s3_server = s3_credentials  # this process reads with delta-rs too
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
    pg.execute("INSERT INTO items SELECT g, g % 7, 'n' || g FROM generate_series(1, 500) g")
    pg.execute("CREATE TABLE notes (k text PRIMARY KEY, body text)")
    pg.execute("INSERT INTO notes SELECT 'k' || g, repeat('x', 5000) FROM generate_series(1, 20) g")
    config = write_config(tmp_path, pg, s3_server, s3_bucket)

    done = pgcdc(s3_server, "run", "--config", str(config), "--until-caught-up", "--verify")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "public.items: equal; source 500 rows" in done.stderr
    # everything pgcdc keeps is in the bucket, under the prefix: tables, state, checkpoint
    stored = keys(s3_server, s3_bucket)
    assert stored and all(k.startswith("lakes/one/") for k in stored)
    assert "lakes/one/_pgcdc/state.json" in stored
    assert not (tmp_path / "lakes").exists() and not (tmp_path / "lake").exists()

    # the batch reads what the copy wrote (several runs in a row: test_matrix)
    pg.execute("UPDATE items SET qty = qty + 1 WHERE id % 2 = 0")
    pg.execute("DELETE FROM items WHERE id > 450")
    pg.execute("INSERT INTO items VALUES (1000, 1, 'x')")
    pg.execute("UPDATE notes SET body = body || 'y' WHERE k = 'k3'")  # TOASTed values
    pg.execute("UPDATE items SET qty = 0 WHERE id = 7")
    done = pgcdc(s3_server, "run", "--config", str(config), "--until-caught-up", "--verify")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stream: 1 batches" in done.stderr

    assert lake_rows(config, "items") == source_rows(pg, "items")
    assert lake_rows(config, "notes") == source_rows(pg, "notes")
    assert any(k.endswith(".bin") for k in stored + keys(s3_server, s3_bucket)), (
        "the MERGEs wrote deletion vectors"
    )
    checkpoint = [k for k in keys(s3_server, s3_bucket, "lakes/one/_pgcdc/checkpoint-1/commits/")]
    assert checkpoint, "the streaming checkpoint is in the bucket"

    read = subprocess.run(
        [sys.executable, "-c", SPARK_READ, str(config)],
        env={**os.environ, **s3_env(s3_server)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    counts = json.loads(read.stdout.strip().splitlines()[-1])
    assert counts["mirror"] == len(source_rows(pg, "items"))
    assert counts["history"] > counts["mirror"] and counts["changelog"] > 0
    assert counts["versions"] >= 3  # create, the copy's commit, a MERGE per batch

    status = pgcdc(s3_server, "status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    report = json.loads(status.stdout)
    tables = {t["table"]: t for t in report["tables"]}
    assert tables["public.items"]["rows"] == len(source_rows(pg, "items"))
    secret = s3_env(s3_server)["AWS_SECRET_ACCESS_KEY"]
    assert secret not in status.stdout + status.stderr + done.stderr

    dropped = pgcdc(s3_server, "drop", "--config", str(config), "--yes")
    assert dropped.returncode == 0, dropped.stderr[-3000:]
    assert pg.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]
    again = pgcdc(s3_server, "run", "--config", str(config), "--until-caught-up")
    assert again.returncode == 1 and "drop" in again.stderr, again.stderr[-3000:]


@newest_server
def test_wrong_credentials_and_a_missing_bucket_create_nothing(
    pg: PgDatabase, s3_server: S3ProxyServer, s3_bucket: str, tmp_path: Path
) -> None:
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
    pg.execute("CREATE TABLE notes (k text PRIMARY KEY, body text)")
    config = write_config(tmp_path, pg, s3_server, s3_bucket)

    wrong = pgcdc(s3_server, "run", "--config", str(config), env={"AWS_SECRET_ACCESS_KEY": "no"})
    assert wrong.returncode != 0
    assert "refused the credentials" in wrong.stderr and "AWS_SECRET_ACCESS_KEY" in wrong.stderr

    config.write_text(config.read_text().replace(s3_bucket, "pgcdc-no-such-bucket"))
    missing = pgcdc(s3_server, "run", "--config", str(config))
    assert missing.returncode != 0
    assert "'pgcdc-no-such-bucket' does not exist" in missing.stderr, missing.stderr[-3000:]

    check = pgcdc(s3_server, "run", "--config", str(config), "--check")
    assert check.returncode != 0 and "does not exist" in check.stderr

    assert pg.execute("SELECT count(*) FROM pg_publication") == [(0,)]
    assert pg.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]
    assert keys(s3_server, s3_bucket) == []


@newest_server
def test_the_store_down_and_back_mid_stream_loses_and_doubles_nothing(
    pg: PgDatabase, s3_credentials: S3ProxyServer, s3_bucket: str, tmp_path: Path
) -> None:
    """S3Proxy killed (kill -9) under a running ``pgcdc run`` and started again 20 s later:
    the run rides it out (S3A's and boto3's retries), the changes made meanwhile arrive, none
    twice."""
    s3_server = s3_credentials
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
    pg.execute("INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 200) g")
    pg.execute("CREATE TABLE notes (k text PRIMARY KEY, body text)")
    config = write_config(tmp_path, pg, s3_server, s3_bucket)
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "pgcdc", "--log-level", "INFO", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "1000"},
            start_new_session=True,
        )
    stop = threading.Event()

    def workload() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            pg.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (n % 200 + 1,))
            pg.execute("INSERT INTO items VALUES (%s, 0, 'w')", (1000 + n,))
            time.sleep(0.05)

    writer = threading.Thread(target=workload, daemon=True)
    try:
        deadline = time.monotonic() + 300
        while b"stream started" not in log.read_bytes():
            assert run.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the stream did not start"
            time.sleep(0.5)
        writer.start()
        time.sleep(5)
        s3_server.kill()
        try:
            time.sleep(20)
        finally:
            s3_server.start()
        time.sleep(15)  # batches after the outage
        stop.set()
        writer.join(30)
        assert run.poll() is None, f"the run ended in the outage:\n{log.read_text()[-4000:]}"
        run.send_signal(signal.SIGTERM)
        assert run.wait(300) == 0, log.read_text()[-4000:]
    finally:
        stop.set()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    done = pgcdc(s3_server, "run", "--config", str(config), "--until-caught-up", "--verify")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "public.items: equal" in done.stderr
    assert lake_rows(config, "items") == source_rows(pg, "items")


def test_the_demo_into_a_bucket(s3_server: S3ProxyServer, s3_bucket: str, tmp_path: Path) -> None:
    """``pgcdc demo`` with its lake in a bucket: the README's first command on S3."""
    lake = f"s3://{s3_bucket}/demo"
    argv = ["demo", "--seconds", "6", "--lake", lake]
    argv += ["--s3-endpoint", s3_server.endpoint, "--s3-path-style"]
    done = pgcdc(s3_server, *argv)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "mirror equals source" in done.stderr and "DIFFERENT" not in done.stderr
    stored = keys(s3_server, s3_bucket)
    assert "demo/shop/orders.history/_delta_log/00000000000000000000.json" in stored
    # a second demo replaces the first demo's lake, and refuses a prefix holding anything else
    s3_client(s3_server).put_object(Bucket=s3_bucket, Key="other/file", Body=b"x")
    refused = pgcdc(s3_server, *[a.replace("/demo", "/other") for a in argv])
    assert refused.returncode != 0 and "is not a pgcdc demo lake" in refused.stderr
