"""Row filter text never runs as SQL of its own (issue 24, item 2).

A filter reaches the server only as ``RowFilterSQL``: ``pgcdc.filters`` prints its parse tree
back, so the SQL is exactly one expression, every identifier double-quoted, every constant a
literal, and no comment or unparsed text survives. Here: the injection texts are refused by the
parser; random mixes of SQL fragments, injection pieces and valid expressions (hypothesis)
either are refused or print as one such expression, and against real servers the whole path
(``pipeline.toml`` -> ``plan_source``, the ``--check`` dry run -> CREATE PUBLICATION) changes
the catalog by exactly that one publication, or not at all. The source tree is scanned so that
only the printer makes a ``RowFilterSQL`` and no other text is pasted into ``sql.SQL``.
"""

from __future__ import annotations

import ast as pyast
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pgcdc
from pgcdc.filters import RowFilter, RowFilterError
from pgcdc.filters.lexer import tokenize
from pgcdc.lake.config import ConfigError, PipelineConfig, parse_config
from pgcdc.lake.run.catalog import plan_source
from pgcdc.replication import (
    PublicationTable,
    ReplicationError,
    RowFilterSQL,
    create_publication,
    drop_publication,
)
from tests.catalog_snapshot import catalog_snapshot, changes
from tests.filters import server
from tests.filters.injections import HARMLESS, REFUSED_BY_PARSER, REFUSED_BY_SERVER
from tests.filters.strategies import expressions
from tests.fix_pg import PgDatabase

SRC = Path(pgcdc.__file__).parent


@pytest.mark.parametrize("text", REFUSED_BY_PARSER)
def test_what_is_not_one_expression_is_refused(text: str) -> None:
    with pytest.raises(RowFilterError):
        RowFilter.parse(text).sql()


@pytest.mark.parametrize("text", [*REFUSED_BY_SERVER, HARMLESS])
def test_what_looks_like_sql_inside_one_expression_stays_a_constant(text: str) -> None:
    rendered = RowFilter.parse(text).sql()
    _check_rendering(rendered)
    assert "--" not in rendered.text or "'" in rendered.text  # a comment only inside a string


def test_the_config_names_the_key_before_any_connection() -> None:
    """parse_config refuses each bad filter under its own key; the DSN names no server, so
    nothing could have connected."""
    tables: list[dict[str, Any]] = [{"name": "items", "row_filter": t} for t in REFUSED_BY_PARSER]
    tables.append({"name": "items", "row_filter": ["id = 1", "id = 2); DROP TABLE x; --"]})
    with pytest.raises(ConfigError) as info:
        _config("host=/nonexistent dbname=none", tables)
    problems = dict(info.value.problems)
    for i in range(len(tables)):
        assert f"tables[{i}].row_filter" in problems, i
    assert "filter 1 of the list" in problems[f"tables[{len(tables) - 1}].row_filter"]
    assert len(problems) == len(tables)


# keywords the printer writes unquoted; every other name it writes is double-quoted
_PRINTED_KEYWORDS = frozenset([
    "and", "or", "not", "is", "null", "true", "false", "unknown", "distinct", "from",
    "between", "symmetric", "in", "like", "ilike", "escape", "array", "any", "all", "case",
    "when", "then", "else", "end", "cast", "as", "collate", "operator", "coalesce", "nullif",
    "greatest", "least", "extract", "pg_catalog", "integer", "smallint", "bigint", "real",
    "boolean", "json", "double", "precision", "numeric", "character", "varying", "bit",
    "timestamp", "time", "with", "without", "zone", "current_date", "current_time",
    "current_timestamp", "localtime", "localtimestamp", "current_role", "current_user",
    "session_user", "user", "current_catalog", "current_schema", "system_user"
])  # fmt: skip


def _check_rendering(rendered: RowFilterSQL) -> None:
    """What the server is given is one expression: no ';', no parameter, no comment, no bare
    name but the printer's keywords, parentheses that never close what encloses them; and
    printing is a fixed point (the text parses back to the same tree)."""
    text = rendered.text
    tokens = tokenize(text)
    depth = 0
    previous_end = 0
    for tok in tokens:
        gap = text[previous_end : tok.pos]
        assert gap.strip() == "", f"text between tokens (a comment?) {gap!r} in {text!r}"
        previous_end = tok.end
        assert not (tok.kind == "punct" and tok.value == ";"), text
        assert tok.kind != "param", text
        if tok.kind == "ident":
            assert tok.value in _PRINTED_KEYWORDS, f"bare name {tok.value!r} in {text!r}"
        if tok.kind == "punct" and tok.value in "([":
            depth += 1
        elif tok.kind == "punct" and tok.value in ")]":
            depth -= 1
            assert depth >= 0, f"closes a parenthesis it did not open: {text!r}"
    assert depth == 0, text
    assert RowFilter.parse(text).sql() == rendered


_PIECES = [
    "id",
    "i",
    "t",
    '"t"',
    "1",
    "-1",
    "2.5",
    "'x'",
    "''",
    "E'\\''",
    "E'\\\\'",
    "'a''b'",
    "=",
    "<>",
    ">",
    "+",
    "-",
    "*",
    "/",
    "||",
    "AND",
    "OR",
    "NOT",
    "IS NULL",
    "IN",
    "(",
    ")",
    "((",
    "))",
    ",",
    ";",
    "--",
    "\n",
    "/*",
    "*/",
    "$$",
    "$a$",
    "$1",
    "'",
    '"',
    "U&'\\0041'",
    "COMMIT",
    "ROLLBACK",
    "BEGIN",
    "END",
    "CASE WHEN",
    "THEN",
    "ELSE",
    "DROP TABLE rf_victim",
    "CREATE TABLE pwned (x int)",
    "SELECT 1",
    "EXISTS (SELECT 1)",
    "lower(t)",
    "pg_sleep(0)",
    "::int",
    "::text",
    "ARRAY[1, 2]",
    "ANY",
    "\\",
    "\x00",
    'COLLATE "C"',
    "OPERATOR(pg_catalog.=)",
]

_fragments = st.lists(
    st.one_of(st.sampled_from(_PIECES), st.text(alphabet="ab();'\"$-/*\\ \n=", max_size=4)),
    min_size=1,
    max_size=12,
).map(" ".join)

#: valid expressions, fragment soups, and valid expressions with an injection around them
filter_texts = st.one_of(
    expressions(max_depth=2),
    _fragments,
    st.tuples(expressions(max_depth=2), _fragments).map(lambda p: p[0] + " " + p[1]),
    st.tuples(_fragments, expressions(max_depth=2)).map(lambda p: p[0] + " " + p[1]),
    st.tuples(expressions(max_depth=2), st.sampled_from(REFUSED_BY_PARSER)).map(
        lambda p: f"{p[0]} AND ({p[1]})"
    ),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(filter_texts)
def test_any_text_is_refused_or_printed_as_one_expression(text: str) -> None:
    try:
        rendered = RowFilter.parse(text).sql()
    except RowFilterError:
        return
    _check_rendering(rendered)


def _config(dsn: str, tables: list[dict[str, Any]]) -> PipelineConfig:
    return parse_config(
        {
            "source": {"dsn": dsn, "slot": "fuzz_slot", "publication": "fuzz_pub"},
            "lake": {"path": "/tmp/pgcdc-unused-lake"},
            "tables": tables,
        }
    )


@pytest.fixture(scope="module")
def fuzz_db(pg_module: PgDatabase) -> PgDatabase:
    with pg_module.connect() as conn:
        server.create_rows_table(conn)
        conn.execute("CREATE TABLE rf_victim (x int PRIMARY KEY)")
        conn.execute("INSERT INTO rf_victim VALUES (1), (2)")
    return pg_module


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.booleans().flatmap(lambda valid: expressions(max_depth=2) if valid else filter_texts)
)  # half of them valid
def test_the_whole_path_creates_one_publication_at_most(fuzz_db: PgDatabase, text: str) -> None:
    """pipeline.toml -> plan_source (what --check runs) changes nothing; the configured
    filter -> CREATE PUBLICATION adds that publication (and its table) or nothing."""
    try:
        config = _config(fuzz_db.dsn(), [{"name": "rf_rows", "row_filter": text}])
    except ConfigError as exc:
        assert [key for key, _ in exc.problems] == ["tables[0].row_filter"]
        event("refused by the configuration")
        return
    with fuzz_db.connect() as conn:
        before = catalog_snapshot(conn)
        try:
            plan_source(fuzz_db.dsn(), config)
        except ConfigError as exc:
            assert all(key.startswith("tables[0]") for key, _ in exc.problems), exc.problems
        assert changes(before, catalog_snapshot(conn)) == {}, "plan_source left something"

        where = config.tables[0].combined_filter()
        assert where is not None
        _check_rendering(where)
        try:
            create_publication(conn, "fuzz_pub", tables=[PublicationTable("rf_rows", where=where)])
        except ReplicationError:
            assert changes(before, catalog_snapshot(conn)) == {}, "a refused statement did work"
            event("refused by the server")
            return
        event("publication created")
        try:
            diff = changes(before, catalog_snapshot(conn))
            assert set(diff) == {"pg_publication", "pg_publication_rel"}, diff
            (pub,) = diff["pg_publication"][1]
            assert pub[1] == "fuzz_pub" and diff["pg_publication"][0] == []
            (rel,) = diff["pg_publication_rel"][1]
            assert rel[0] == pub[0] and rel[2] is not None
        finally:
            drop_publication(conn, "fuzz_pub")


def _calls(path: Path) -> list[tuple[str, str, bool]]:
    """(callee, first argument, whether it is a constant) of every call in ``path`` with one."""
    tree = pyast.parse(path.read_text(), filename=str(path))
    found = []
    for node in pyast.walk(tree):
        if isinstance(node, pyast.Call) and node.args:
            arg = node.args[0]
            found.append(
                (pyast.unparse(node.func), pyast.unparse(arg), isinstance(arg, pyast.Constant))
            )
    return found


def test_only_the_printer_makes_row_filter_sql() -> None:
    """A RowFilterSQL is built from text in pgcdc.filters.sql only (and combined from others
    in its own module): nothing else can turn text into what CREATE PUBLICATION takes."""
    makers = {
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        for callee, _, _ in _calls(path)
        if callee.split(".")[-1] == "RowFilterSQL"
    }
    assert makers == {"filters/sql.py"}
    own = [c[1] for c in _calls(SRC / "protocol" / "filter_sql.py") if c[0] == "cls"]
    assert own == ["'(' + ' OR '.join((f'({p.text})' for p in distinct)) + ')'"]


#: Every sql.SQL() of something other than a string constant in src, and why it is safe.
_SQL_FROM_VALUES = {
    ("lake/run/verify.py", "where.text"): "a RowFilterSQL",
    ("replication/publication.py", "self.where.text"): "a RowFilterSQL",
    ("replication/publication.py", "'true' if via_partition_root else 'false'"): "constants",
    ("replication/slot.py", "'TEMPORARY ' if temporary else ''"): "constants",
    ("replication/transport.py", "str(Lsn(start_lsn))"): "an LSN printed by Lsn",
    ("replication/transport.py", "_repl_literal(value)"): "quoted by _repl_literal",
    ("spark/snapshot.py", "table.row_filter.text"): "a RowFilterSQL",
    ("spark/snapshot.py", "casts[i]"): "the constants 'text' and 'text[]'",
}


def test_no_other_text_is_pasted_into_sql() -> None:
    """A new sql.SQL(<not a constant>) fails here until it is shown safe and listed above."""
    found = {
        (str(path.relative_to(SRC)), arg)
        for path in SRC.rglob("*.py")
        for callee, arg, constant in _calls(path)
        if callee in ("sql.SQL", "SQL", "psycopg.sql.SQL") and not constant
    }
    assert found == set(_SQL_FROM_VALUES)
