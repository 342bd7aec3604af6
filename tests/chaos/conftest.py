"""Fixtures of the chaos tests: the shared SparkSession (tests/fix_spark.py); PostgreSQL and the
loopback proxy come from tests/fix_pg.py and tests/fix_proxy.py."""

from tests.fix_spark import spark

__all__ = ["spark"]
