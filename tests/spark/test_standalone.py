"""The source on a real Spark standalone cluster: a master and a worker JVM started from pyspark's
own launcher (bin/spark-class), executors in their own JVMs with their own Python workers, that
reach the driver's data only over the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcdc.cli.throwaway_server import free_port
from pgcdc.replication import create_publication, create_slot_with_snapshot
from tests.fix_pg import PgDatabase, newest_server
from tests.fix_s3 import S3ProxyServer, s3_env
from tests.spark.streams import wait_slot_released

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {log} after {timeout}s:\n{log.read_text()[-3000:]}")


#: the work folder of each running cluster, by master URL
_WORK: dict[str, Path] = {}


def standalone_work(master: str) -> Path:
    """The folder of a cluster's logs and its worker's work folder (``worker/``)."""
    return _WORK[master]


@pytest.fixture(scope="module")
def standalone(
    spark_home: Path, tmp_path_factory: pytest.TempPathFactory, s3_server: S3ProxyServer
) -> Iterator[str]:
    """``spark://127.0.0.1:<port>``: a master and one worker (2 cores) on loopback. The worker's
    environment holds the keys of the tests' S3 server, as a cluster's machines hold theirs
    (or an instance role): its executors write S3 lakes."""
    work = tmp_path_factory.mktemp("standalone")
    env = dict(os.environ)
    env.update(s3_env(s3_server))
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_HOME=str(spark_home),
        SPARK_WORKER_DIR=str(work / "worker"),
    )
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    _WORK[url] = work
    spark_class = str(spark_home / "bin" / "spark-class")
    master_cmd = [
        spark_class, "org.apache.spark.deploy.master.Master",
        "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port()),
    ]  # fmt: skip
    worker_cmd = [
        spark_class, "org.apache.spark.deploy.worker.Worker", url,
        "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
        "--webui-port", str(free_port()), "--work-dir", str(work / "worker"),
    ]  # fmt: skip
    master_log = work / "master.log"
    worker_log = work / "worker.log"
    processes: list[subprocess.Popen[bytes]] = []
    with master_log.open("wb") as master_out, worker_log.open("wb") as worker_out:
        try:
            master = subprocess.Popen(
                master_cmd, stdout=master_out, stderr=subprocess.STDOUT, env=env
            )
            processes.append(master)
            _wait_for(master_log, "I have been elected leader", master, 90)
            worker = subprocess.Popen(
                worker_cmd, stdout=worker_out, stderr=subprocess.STDOUT, env=env
            )
            processes.append(worker)
            _wait_for(worker_log, "Successfully registered with master", worker, 90)
            yield url
        finally:
            for process in reversed(processes):
                process.terminate()
            for process in processes:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()


@newest_server
def test_stream_and_snapshot_on_a_standalone_cluster(
    pg: PgDatabase, standalone: str, tmp_path: Path
):
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    pg.execute("INSERT INTO t SELECT g, repeat('s', 200) FROM generate_series(1, 3000) g")
    create_publication(pg.dsn(), "pub", tables=["t"])
    with create_slot_with_snapshot(pg.dsn(), "cluster_slot") as exported:
        # changes after the consistent point: the stream's part
        pg.execute("INSERT INTO t SELECT g, 'new' FROM generate_series(3001, 3200) g")
        pg.execute("UPDATE t SET pad = 'upd' WHERE id <= 10")
        pg.execute("DELETE FROM t WHERE id BETWEEN 11 AND 20")
        out = tmp_path / "out.json"
        driver = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.spark.standalone_driver",
                standalone,
                pg.dsn(),
                "cluster_slot",
                "pub",
                exported.snapshot_name,
                str(exported.consistent_point),
                str(tmp_path / "checkpoint"),
                str(out),
            ],
            cwd=ROOT,
            check=False,
            capture_output=True,
            timeout=420,
        )
    assert driver.returncode == 0, driver.stderr.decode(errors="replace")[-5000:]
    result = json.loads(out.read_text())
    wait_slot_released(pg.dsn(), "cluster_slot")
    assert result["error"] is None
    assert result["master"] == standalone
    assert result["block_managers"] >= 2  # the driver and at least one executor
    assert result["executor_pids"] and result["driver_pid"] not in result["executor_pids"]
    assert sorted(result["copied"]) == list(range(1, 3001))
    rows = result["rows"]
    assert [r["id"] for r in rows if r["op"] == "I"] == list(range(3001, 3201))
    assert sorted(r["id"] for r in rows if r["op"] == "U") == list(range(1, 11))
    assert sorted(r["id"] for r in rows if r["op"] == "D") == list(range(11, 21))
    assert len({r["batch"] for r in rows}) >= 2  # maxChangesPerTrigger, whole transactions


LAKE_CONFIG = """
[source]
dsn = {dsn}
slot = "cluster_lake_slot"
publication = "cluster_lake_pub"

[lake]
path = {lake}
history = true
changelog = true
{lake_extra}

[spark]
master = "{master}"
driver_host = "127.0.0.1"

[spark.conf]
"spark.driver.bindAddress" = "127.0.0.1"
"spark.executor.cores" = "1"
"spark.cores.max" = "2"
"spark.executor.memory" = "512m"
"spark.sql.shuffle.partitions" = "2"

[stream]
max_changes_per_trigger = 400

[[tables]]
name = "public.lt"
"""


@newest_server
@pytest.mark.parametrize("store", ["s3"])
def test_pipeline_writes_the_lake_from_the_cluster_executors(
    pg: PgDatabase,
    standalone: str,
    tmp_path: Path,
    store: str,
    request: pytest.FixtureRequest,
) -> None:
    """``pgcdc run`` against the standalone cluster: the initial copy and every MERGE and append
    run in the worker's executors (the driver of a standalone cluster runs no task), which get
    Delta's connector (and S3A's, for a lake in a bucket: no folder is shared) through
    ``spark.jars`` from the driver. A lake in a bucket is how a cluster shares one; ``local``
    (a folder every worker sees) runs the same code with a local path: the suite leaves it
    out for its time (add it to the list to run it)."""
    pg.execute("CREATE TABLE lt (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO lt SELECT g, 'v' || g FROM generate_series(1, 2000) g")
    config = tmp_path / "pipeline.toml"
    lake, extra, env = json.dumps("lake"), "", dict(os.environ)
    if store == "s3":
        s3_server: S3ProxyServer = request.getfixturevalue("s3_server")
        s3_bucket: str = request.getfixturevalue("s3_bucket")
        lake = json.dumps(f"s3://{s3_bucket}/lake")
        extra = f'[lake.s3]\nendpoint = "{s3_server.endpoint}"\npath_style = true\n'
        env.update(s3_env(s3_server))
    config.write_text(
        LAKE_CONFIG.format(dsn=json.dumps(pg.dsn()), master=standalone, lake=lake, lake_extra=extra)
    )
    argv = [sys.executable, "-m", "pgcdc", "run", "--config", str(config)]

    def run() -> str:
        done = subprocess.run(
            [*argv, "--until-caught-up", "--verify"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-5000:]
        return done.stderr

    assert "public.lt: equal; source 2000 rows" in run()
    pg.execute("UPDATE lt SET v = v || '+' WHERE id % 3 = 0")
    pg.execute("DELETE FROM lt WHERE id > 1900")
    pg.execute("INSERT INTO lt SELECT g, 'new' FROM generate_series(3001, 3500) g")
    assert "public.lt: equal; source 2400 rows" in run()
    # the executors fetched Delta's jars from the driver and ran the lake's tasks
    logs = "".join(
        p.read_text(errors="replace")
        for p in (standalone_work(standalone) / "worker").rglob("stderr")
    )
    assert "delta-spark_4.2_2.13" in logs
    assert "Finished task" in logs
    if store == "s3":
        assert "hadoop-aws-" in logs
        assert not (tmp_path / "lake").exists()
