"""Identifier and literal quoting match the server's quote_ident / quote_literal exactly."""

from __future__ import annotations

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.cli.throwaway_server import Cluster
from pgcdc.protocol.identifiers import quote_identifier, quote_literal, quote_qualified_identifier
from pgcdc.protocol.keywords import QUOTED_KEYWORDS
from tests.fix_pg import PgDatabase

SAMPLES = [
    "t",
    "user",
    "name",
    "between",
    "Abc",
    "a b",
    "é",
    "_x1",
    "1x",
    'we"ird',
    "select",
    "order",
    "json_table",
    "merge_action",
    "",
    "x$",
]


def test_matches_server(pg: PgDatabase) -> None:
    words = [w for (w,) in pg.execute("SELECT word FROM pg_get_keywords()")]
    names = [*SAMPLES, *words]
    rows = pg.execute(
        "SELECT n, quote_ident(n), quote_literal(n) FROM unnest(%s::text[]) n", (names,)
    )
    for name, ident, literal in rows:
        assert quote_identifier(str(name), pg.major) == ident, name
        assert quote_literal(str(name)) == literal, name


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.text(st.characters(codec="utf-8", blacklist_characters="\0"), max_size=8),
        min_size=1,
        max_size=40,
    )
)
def test_random_names_match_server(pg_server: Cluster, names: list[str]) -> None:
    with psycopg.connect(pg_server.dsn()) as conn:
        rows = conn.execute(
            "SELECT n, quote_ident(n), quote_literal(n) FROM unnest(%s::text[]) n", (names,)
        ).fetchall()
    for name, ident, literal in rows:
        assert quote_identifier(str(name), pg_server.major) == ident, name
        assert quote_literal(str(name)) == literal, name


def test_qualified() -> None:
    assert quote_qualified_identifier("public", "t") == "public.t"
    assert quote_qualified_identifier("My Schema", "user") == '"My Schema"."user"'
    assert quote_qualified_identifier("", "t") == "t"
    assert set(QUOTED_KEYWORDS) == {15, 18}
