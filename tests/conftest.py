"""Test-session wiring: fixtures live in tests/fix_*.py (psycopg's layout)."""

pytest_plugins = ["tests.fix_pg", "tests.fix_proxy"]
