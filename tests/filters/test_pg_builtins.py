"""The generated catalog rows (src/pgcdc/filters/pg_builtins_data.py) are those of the servers:
regenerate with ``.venv/bin/python -m tests.filters.gen_pg_builtins`` when this fails."""

from __future__ import annotations

from pgcdc.filters import pg_builtins_data
from tests.filters import gen_pg_builtins
from tests.fix_pg import PgDatabase


def _rows_for(rows: tuple[tuple[object, ...], ...], major: int) -> set[tuple[object, ...]]:
    out = set()
    for row in rows:
        majors = row[-1]
        assert isinstance(majors, tuple)
        if not majors or major in majors:
            out.add(row[:-1])
    return out


def test_generated_catalog_is_current(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        live = gen_pg_builtins.fetch(conn)
    for key, rows in (
        ("types", pg_builtins_data.TYPES),
        ("casts", pg_builtins_data.CASTS),
        ("operators", pg_builtins_data.OPERATORS),
        ("functions", pg_builtins_data.FUNCTIONS),
    ):
        assert set(live[key]) == _rows_for(rows, pg.major), f"{key} differ: regenerate"
    names = {row[0] for row in live["names"]}
    assert names <= pg_builtins_data.BUILTIN_FUNCTIONS
    operators = {row[0] for row in live["operator_names"]}
    assert operators <= pg_builtins_data.BUILTIN_OPERATORS
    mutable = {row[0] for row in live["names"] if row[1] and not (row[2] or row[3] or row[4])}
    assert (
        mutable & names
        <= pg_builtins_data.MUTABLE_FUNCTIONS | pg_builtins_data.SET_RETURNING_FUNCTIONS
    )
    assert "now" in pg_builtins_data.MUTABLE_FUNCTIONS
    assert "sum" in pg_builtins_data.AGGREGATE_FUNCTIONS
