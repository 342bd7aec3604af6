"""The generated catalog rows (src/pgcdc/filters/catalog_data.py) are those of the servers:
regenerate with ``.venv/bin/python -m tests.filters.gen_catalog`` when this fails."""

from __future__ import annotations

from pgcdc.filters import catalog_data
from tests.filters import gen_catalog
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
        live = gen_catalog.fetch(conn)
    for key, rows in (
        ("types", catalog_data.TYPES),
        ("casts", catalog_data.CASTS),
        ("operators", catalog_data.OPERATORS),
        ("functions", catalog_data.FUNCTIONS),
    ):
        assert set(live[key]) == _rows_for(rows, pg.major), f"{key} differ: regenerate"
    names = {row[0] for row in live["names"]}
    assert names <= catalog_data.BUILTIN_FUNCTIONS
    operators = {row[0] for row in live["operator_names"]}
    assert operators <= catalog_data.BUILTIN_OPERATORS
    mutable = {row[0] for row in live["names"] if row[1] and not (row[2] or row[3] or row[4])}
    assert mutable & names <= catalog_data.MUTABLE_FUNCTIONS | catalog_data.SET_RETURNING_FUNCTIONS
    assert "now" in catalog_data.MUTABLE_FUNCTIONS
    assert "sum" in catalog_data.AGGREGATE_FUNCTIONS
