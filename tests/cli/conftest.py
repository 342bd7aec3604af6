"""Fixtures of the command tests: the shared SparkSession (tests/fix_spark.py); PostgreSQL
comes from tests/fix_pg.py."""

from tests.fix_spark import spark

__all__ = ["spark"]
