"""Test-session wiring: fixtures live in tests/fix_*.py (psycopg's layout)."""

import os

import pytest
from hypothesis import settings

pytest_plugins = ["tests.fix_pg", "tests.fix_proxy"]

# CI runs the property tests derandomized (the same examples every run, so a red run is
# reproducible) and without hypothesis's per-example deadline (a stall of the loaded CI machine
# is not a failure: performance lives in the benchmarks); PGCDC_HYPOTHESIS=explore draws fresh
# random examples, for local bug hunting
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("PGCDC_HYPOTHESIS", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with slow tests first: pytest-xdist hands out whole modules in this order, so
    the two workers do not end with one of them alone on a long module."""
    slow_modules = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_modules)  # stable: order kept within
