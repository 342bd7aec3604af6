"""Test-session wiring: fixtures live in tests/fix_*.py (psycopg's layout)."""

import os

import pytest
from hypothesis import settings

from tests.fix_spark import SUBMIT_OPTS

pytest_plugins = ["tests.fix_pg", "tests.fix_pipeline", "tests.fix_proxy", "tests.fix_s3"]

# CI runs the property tests derandomized (the same examples every run, so a red run is
# reproducible) and without hypothesis's per-example deadline (a stall of the loaded CI machine
# is not a failure: performance lives in the benchmarks); PGCDC_HYPOTHESIS=explore draws fresh
# random examples, for local bug hunting
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("PGCDC_HYPOTHESIS", "ci"))

# The pgcdc runs tests start are short: their driver JVMs (launched by spark-submit, which reads
# this) compile with C1 only, which starts a run some 15% faster on two cores. The tests' own
# session, which runs for the whole test session, keeps both compilers (tests/fix_spark.py).
# C1 alone shrinks the JIT's code cache to 48 MB, which a long run over S3 (Hadoop's S3A and
# the AWS SDK beside Spark and Delta) fills: the cache keeps the default size of a tiered JVM.
os.environ.setdefault(SUBMIT_OPTS, "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m")


#: The longest modules (their tests' seconds summed over a CI run, longest first), handed out
#: first.
LONGEST = (
    "chaos/test_kill.py",
    "lake/test_s3_lake.py",
    "lake/test_indexed.py",
    "spark/test_standalone.py",
    "cli/test_catalog.py",
    "lake/test_table_sync.py",
    "cli/test_run_signals.py",
    "chaos/test_kill_points.py",
    "cli/test_run_and_demo.py",
    "lake/test_matrix.py",
    "lake/test_pipeline.py",
    "lake/test_multiset.py",
    "chaos/test_network.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first, then the others with slow tests: pytest-xdist hands out
    whole modules in this order, so the two workers do not end with one of them alone on a
    long module."""
    slow_modules = {item.path for item in items if item.get_closest_marker("slow")}

    def order(item: pytest.Item) -> tuple[int, int]:
        rank = next((i for i, m in enumerate(LONGEST) if item.path.match(m)), len(LONGEST))
        return (0 if item.path in slow_modules else 1, rank)

    items.sort(key=order)  # stable: the order within a module is kept
