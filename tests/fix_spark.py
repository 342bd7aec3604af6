"""Fixtures: one real local SparkSession (``local[2]``) for the whole test session.

Spark takes 10-20 s to start on a small machine, so every test shares ``spark`` (with Delta's
Spark connector loaded, as a pipeline's session has it); tests must not stop it or change
session-wide settings they do not restore. Python workers run this
interpreter (``pgcdc.spark.spark_session`` sets PYSPARK_PYTHON and spark.pyspark.python), and
the ``pgcdc`` data source is registered.

``checkpoint_dir`` gives a fresh directory for a streaming query's checkpoint.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


#: the driver JVM options spark-submit adds (tests/conftest.py sets them for the runs tests start)
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pgcdc.lake.store.delta import quiet_logs

    logging.getLogger("py4j").setLevel(logging.WARNING)
    submit_opts = os.environ.pop(SUBMIT_OPTS, None)  # this JVM runs long: both compilers
    try:
        session = _session()
    finally:
        if submit_opts is not None:
            os.environ[SUBMIT_OPTS] = submit_opts
    session.sparkContext.setLogLevel("ERROR")
    quiet_logs(session)  # as pipelines do: Delta's false "Failed to translate filter" errors
    try:
        yield session
    finally:
        session.stop()


def _session() -> SparkSession:
    from pgcdc.lake.store.delta import delta_settings, local_file_system
    from pgcdc.spark import spark_session

    # with Delta's connector and pgcdc's local file system, as every pipeline's session
    conf = delta_settings(
        {
            "spark.sql.streaming.stopTimeout": "30s",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
            "spark.python.worker.reuse": "true",
            # as pipelines run local sessions (pgcdc.lake.run.pipeline.session_conf)
            "spark.sql.adaptive.enabled": "false",
            "spark.scheduler.mode": "FAIR",
            # one JVM for the hundreds of lakes of a test session (Delta caches each
            # table's log for an hour): more heap than one pipeline's
            "spark.driver.memory": "2g",
        }
    )
    local_file_system(conf)
    session: SparkSession = spark_session(
        "local[2]",
        "pgcdc-tests",
        conf=conf,
        # the tests' own JVM runs the whole session: the pgcdc runs they start write the
        # class data archive (and map it) instead
        class_data_sharing=False,
    )
    return session


@pytest.fixture
def checkpoint_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pgcdc-ckpt-") as path:
        yield Path(path)


@pytest.fixture(scope="session")
def spark_home() -> Path:
    """pyspark's own Spark distribution (bin/spark-class, jars)."""
    import pyspark

    home = Path(os.path.dirname(pyspark.__file__))
    assert (home / "bin" / "spark-class").exists(), home
    return home
