"""Differential test: random filter expressions evaluated by PostgreSQL and by pgcdc.filters.

For each batch, hypothesis draws rows (with NULLs and edge values) and expressions; the
server says whether CREATE PUBLICATION ... WHERE accepts each expression (and with which
error) and evaluates the accepted ones over the rows; the client binds and evaluates the same
expressions on the rows as pgoutput sends them, in text and in binary format. Outcomes
(rejection SQLSTATE and detail; per row true, false, NULL or error SQLSTATE) must be equal,
and the server must evaluate the client's SQL rendering of each expression (``to_sql``) the
same way as the original text.
A failure prints the hypothesis reproduction blob.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.filters import RowFilter, RowFilterError
from tests.filters import server
from tests.filters.strategies import expressions, rows
from tests.fix_pg import PgDatabase

EXAMPLES = int(os.environ.get("PGCDC_FILTER_EXAMPLES", "300"))
BATCH = 30


def _printed(expr: str) -> str | None:
    """The client's SQL rendering of ``expr`` (None if the client cannot parse it)."""
    try:
        return RowFilter.parse(expr).to_sql()
    except RowFilterError:
        return None


def _check_batch(conn: psycopg.Connection[Any], table_rows: list[tuple[str | None, ...]],
                 exprs: list[str]) -> None:  # fmt: skip
    server.load_rows(conn, table_rows)
    text_rows = server.tuples(conn, binary=False)
    binary_rows = server.tuples(conn, binary=True)
    printed = [_printed(e) for e in exprs]
    outcomes = server.server_outcomes(conn, exprs + [p for p in printed if p is not None])
    expected = outcomes[: len(exprs)]
    printed_outcomes = iter(outcomes[len(exprs) :])
    failures = []
    for expr, sql_text, want in zip(exprs, printed, expected, strict=True):
        if sql_text is not None:
            again = next(printed_outcomes)
            if again != want:
                failures.append(f"\n  {expr}\n    printed as {sql_text}\n    which gives {again}")
        got_text = server.client_outcome(expr, text_rows)
        got_binary = server.client_outcome(expr, binary_rows)
        if got_text != want or got_binary != want:
            failures.append(
                f"\n  {expr}\n    server: {want}\n    text:   {got_text}\n    binary: {got_binary}"
            )
    assert not failures, f"{len(failures)} of {len(exprs)} expressions differ:" + "".join(failures)


def test_random_expressions_match_server(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        server.create_rows_table(conn)

        @settings(
            max_examples=EXAMPLES,
            derandomize=os.environ.get("PGCDC_FILTER_RANDOM") is None,
            print_blob=True,
            database=None,
            deadline=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.large_base_example,
            ],
        )
        @given(
            table_rows=st.lists(rows(), min_size=4, max_size=8),
            exprs=st.lists(expressions(), min_size=BATCH // 2, max_size=BATCH),
        )
        def run(table_rows: list[tuple[str | None, ...]], exprs: list[str]) -> None:
            _check_batch(conn, table_rows, exprs)

        run()
