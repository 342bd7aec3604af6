"""Spark fixtures for these tests (tests/fix_spark.py; the PostgreSQL ones come from fix_pg)."""

from tests.fix_spark import checkpoint_dir, spark, spark_home

__all__ = ["checkpoint_dir", "spark", "spark_home"]
