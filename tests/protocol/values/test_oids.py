"""The generated built-in type table matches the servers it describes."""

from __future__ import annotations

from tools import gen_type_oids

from pgcdc.protocol.values import oids
from tests.fix_pg import PgDatabase


def test_generated_module_is_current(pg: PgDatabase) -> None:
    """On PostgreSQL 18 regenerating gives the committed module byte for byte; on 15 every
    built-in type of the server is in the table with the same attributes."""
    with pg.connect() as conn:
        rows = gen_type_oids.fetch_rows(conn)
        display = gen_type_oids.fetch_display_names(conn)
    assert len(rows) > 150
    if pg.major == gen_type_oids.SOURCE_MAJOR:
        assert gen_type_oids.render(rows, display) == gen_type_oids.TARGET.read_text(), (
            "oids.py is stale: run .venv/bin/python -m tools.gen_type_oids"
        )
    else:
        table = {row[0]: row for row in oids.BUILTIN_TYPES}
        for row in rows:
            assert table.get(row.oid) == tuple(row), f"PostgreSQL {pg.major}: {row}"
            assert oids.DISPLAY_NAMES[row.oid] == display[row.oid]


def test_constants() -> None:
    assert oids.INT4_OID == 23
    assert oids.INT4_ARRAY_OID == 1007
    assert oids.TIMESTAMPTZ_OID == 1184
    assert oids.CHAR_OID == 18
    assert oids.JSONB_ARRAY_OID == 3807
    assert (
        gen_type_oids.constant_name(
            gen_type_oids.TypeRow(1, "_x y", "pg_catalog", "array", 2, 0, 0, ",", -1)
        )
        == "X_Y_ARRAY_OID"
    )
