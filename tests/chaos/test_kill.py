"""Kill -9 of ``pgcdc run`` at random moments during a randomized workload (tests/chaos/harness.py):
every mirror equals its source, histories are consistent, every changelog holds each change
exactly once. The suite runs a shortened form (3 kills, on PostgreSQL 18 only: each run starts
a JVM); ``make chaos`` runs 20+ kills on both versions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.harness import chaos_kills, chaos_seed, run_chaos
from tests.fix_pg import PgDatabase
from tests.fix_s3 import S3ProxyServer

pytestmark = pytest.mark.slow

#: the suite's shortened form runs on one version; `make chaos` sets PGCDC_CHAOS_VERSIONS=15,18
VERSIONS = [int(v) for v in os.environ.get("PGCDC_CHAOS_VERSIONS", "18").split(",")]


@pytest.mark.parametrize("pg_server", VERSIONS, indirect=True, ids=lambda v: f"pg{v}")
def test_kill_9_loses_and_doubles_nothing(pg: PgDatabase, tmp_path: Path) -> None:
    seed = chaos_seed()
    kills = chaos_kills(3)
    report = run_chaos(pg.dsn(), tmp_path, kills=kills, seed=seed)
    assert report.kills == kills
    assert report.snapshot_kill, "the first kill should land in the initial snapshot"
    assert report.stream_kills >= 1, "the second kill should land in the stream"
    assert report.lake is not None and report.lake.changes > 0
    assert report.lake.generation >= 2  # the killed snapshot was copied again


@pytest.mark.parametrize("pg_server", [VERSIONS[-1]], indirect=True, ids=lambda v: f"pg{v}")
def test_kill_9_into_a_bucket_loses_and_doubles_nothing(
    pg: PgDatabase,
    tmp_path: Path,
    s3_credentials: S3ProxyServer,
    s3_bucket: str,
) -> None:
    """The same on a lake in an S3 bucket: no atomic rename there (Spark's checkpoint files
    are copied, pgcdc's state written whole), and a killed run's lease on the lake is taken
    over by the next run."""
    s3_server = s3_credentials  # the runs' environment, and this process's
    seed = chaos_seed()
    kills = chaos_kills(2)  # one in the snapshot, one in the stream (make chaos: 20)
    store = f'[lake.s3]\nendpoint = "{s3_server.endpoint}"\npath_style = true\n'
    report = run_chaos(
        pg.dsn(), tmp_path, kills=kills, seed=seed, lake=f"s3://{s3_bucket}/lake", lake_extra=store
    )
    assert report.kills == kills
    assert report.stream_kills >= 1
    assert report.lake is not None and report.lake.changes > 0
    assert not (tmp_path / "lake").exists()
