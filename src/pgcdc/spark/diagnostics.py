"""Logging from Spark's Python workers, which log nowhere by default.

With the environment variable ``PGCDC_SPARK_LOG`` set (Spark passes the driver's environment to
local workers; set ``spark.executorEnv.PGCDC_SPARK_LOG`` for executors elsewhere), every worker
appends pgcdc's INFO log to that file, each line with its process id. Log lines carry LSNs,
counts and names, never row values.
"""

from __future__ import annotations

import logging
import os

__all__ = ["LOG_ENV", "worker_logging"]

LOG_ENV = "PGCDC_SPARK_LOG"


class _Handler(logging.FileHandler):
    pass


def worker_logging() -> None:
    """Attach the file handler once per process, if ``PGCDC_SPARK_LOG`` is set."""
    path = os.environ.get(LOG_ENV)
    logger = logging.getLogger("pgcdc")
    if not path or any(isinstance(h, _Handler) for h in logger.handlers):
        return
    handler = _Handler(path)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s [pid {os.getpid()}] %(name)s %(levelname)s %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
