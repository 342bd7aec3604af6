"""Rejections: what CREATE PUBLICATION ... WHERE refuses, pgcdc.filters refuses with the same
SQLSTATE, detail line and position; what it accepts, pgcdc.filters binds. The replica identity
rule is checked against real UPDATEs and DELETEs.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgcdc.filters import (
    FilterSyntaxError,
    InvalidFilterError,
    ReplicaIdentityError,
    RowFilter,
    RowFilterError,
    UnsupportedFilterError,
)
from pgcdc.protocol.messages import Column, Relation
from tests.fix_pg import PgDatabase

ONLY = (
    "Only columns, constants, built-in operators, built-in data types, built-in collations, "
    "and immutable built-in functions are allowed."
)
MUTABLE = "User-defined or built-in mutable functions are not allowed."

SETUP = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE FUNCTION plus1(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 + 1';
CREATE FUNCTION eq3(int, int) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT $1 = $2';
CREATE OPERATOR === (LEFTARG = int, RIGHTARG = int, FUNCTION = eq3);
CREATE COLLATION public.mycoll FROM "C";
CREATE SEQUENCE seq;
CREATE TABLE rt (a int PRIMARY KEY, b bigint, n numeric, t text, v varchar(10), f bool,
                 d float8, dt date, ts timestamp, tz timestamptz, c char(4), m mood, j jsonb);
"""

#: (expression, SQLSTATE, detail or None): what PostgreSQL answers to CREATE PUBLICATION.
REJECTED: list[tuple[str, str, str | None]] = [
    ("now() > ts", "0A000", MUTABLE),
    ("random() > 0.5", "0A000", MUTABLE),
    ("clock_timestamp() > tz", "0A000", MUTABLE),
    ("timeofday() = 'x'", "0A000", MUTABLE),
    ("nextval('seq') > 0", "0A000", MUTABLE),
    ("a > 0 AND extract(year FROM tz) = 2020", "0A000", MUTABLE),
    ("date_part('year', tz) = 2020", "0A000", MUTABLE),
    ("tz::date = '2020-01-01'", "0A000", MUTABLE),
    ("ts < tz", "0A000", MUTABLE),
    ("dt::timestamptz > '2020-01-01 00:00+00'", "0A000", MUTABLE),
    ("t || a = 'x1'", "0A000", MUTABLE),
    ("concat(t, 'x') = 'x'", "0A000", MUTABLE),
    ("to_char(a, '999') = ' 1'", "0A000", MUTABLE),
    ("plus1(a) = 2", "0A000", MUTABLE),
    ("public.plus1(a) = 2", "0A000", MUTABLE),
    ("a === 1", "0A000", "User-defined operators are not allowed."),
    ("a OPERATOR(public.===) 1", "0A000", "User-defined operators are not allowed."),
    ("m = 'happy'", "0A000", "User-defined types are not allowed."),
    ("'happy'::mood IS NOT NULL", "0A000", "User-defined types are not allowed."),
    ("(t COLLATE public.mycoll) = 'x'", "0A000", "User-defined collations are not allowed."),
    ("ctid = '(0,1)'", "0A000", "System columns are not allowed."),
    ("xmin = '5'", "0A000", "System columns are not allowed."),
    ("tableoid > 0", "0A000", "System columns are not allowed."),
    ("a IN (SELECT 1)", "0A000", ONLY),
    ("a = 1 AND EXISTS (SELECT 1)", "0A000", ONLY),
    ("a = (SELECT 1)", "0A000", ONLY),
    ("current_date > dt", "0A000", ONLY),
    ("current_timestamp > tz", "0A000", ONLY),
    ("current_user = 'x'", "0A000", ONLY),
    ("a::text = '1'", "0A000", ONLY),
    ("t::int = 1", "0A000", ONLY),
    ("n::text = '1'", "0A000", ONLY),
    ("v IN ('a', 'b')", "0A000", ONLY),
    ("t = ANY (ARRAY[v, v])", "0A000", ONLY),
    ("sum(a) > 1", "42803", None),
    ("count(*) > 0", "42803", None),
    ("row_number() OVER () > 1", "42P20", None),
    ("generate_series(1, 2) > 1", "0A000", None),
    ("a", "42804", None),
    ("t IS TRUE", "42804", None),
    ("NOT a", "42804", None),
    ("nosuchcol > 1", "42703", None),
    ("other.a > 1", "42P01", None),
    ("a + 'x' > 1", "22P02", None),
    ("dt > '2020-02-30'", "22008", None),
    ("dt + '1' > dt", "42725", None),
    ("'1' + '1' > 1", "42725", None),
    ("a + t > 1", "42883", None),
    ("length(a) > 1", "42883", None),
    ('a = 1 COLLATE "C"', "42804", None),
    ("CASE WHEN a > 0 THEN 1 ELSE 'x' END = 1", "22P02", None),
    ("CASE WHEN a > 0 THEN 1 ELSE true END", "42804", None),
    ("COALESCE(a, t) = 1", "42804", None),
    ("$1 > 1", "42P02", None),
    ("a < b < 1", "42601", None),
    ("a = = 1", "42601", None),
    ("a > 1 AND", "42601", None),
    ('(t COLLATE "C") = (t COLLATE "POSIX")', "42P21", None),
    ("b::numeric(1001, 0) > 0", "22023", None),
]

#: Accepted by PostgreSQL and bound by pgcdc.filters.
ACCEPTED = [
    "a > 5 AND c = 'NSW'",
    "a BETWEEN 1 AND 10 OR a NOT BETWEEN SYMMETRIC 20 AND 10",
    "a IN (1, 2, 3) AND b NOT IN (4, 5)",
    "a IN (b, 1, 2.5)",
    "t LIKE 'a%' AND t NOT ILIKE '%B' AND v LIKE 'x#%' ESCAPE '#'",
    "t IS NOT NULL AND f IS NOT TRUE AND f IS UNKNOWN",
    "a IS DISTINCT FROM b AND t IS NOT DISTINCT FROM NULL",
    "CASE WHEN a > 1 THEN t ELSE v END = 'x'",
    "CASE a WHEN 1 THEN true WHEN 2 THEN false END",
    "COALESCE(n, 0) > 1.5 AND NULLIF(a, 0) IS NULL",
    "GREATEST(a, b, 3) > LEAST(d, 2)",
    "abs(a) + mod(b, 3) - a % 2 * 4 / 2 > 0",
    "lower(t) = upper(v) OR length(t) > char_length(c)",
    "substr(t, 2) = SUBSTRING(t FROM 1 FOR 2) OR left(t, 1) = right(t, 1)",
    "TRIM(BOTH 'x' FROM t) = btrim(v) AND position('a' IN t) > 0",
    "replace(t, 'a', 'b') || reverse(t) = repeat(v, 2)",
    "round(n, 2) > trunc(n) AND floor(d) < ceil(d)",
    "date_part('year', dt) > 2000 AND EXTRACT(month FROM ts) = 1",
    "EXTRACT(epoch FROM ts) > 0 AND date_trunc('day', ts) > dt",
    "dt + 1 > dt AND dt - 1 < dt AND dt - dt = 0",
    "ts::date = dt AND dt::timestamp <= ts",
    "a::numeric / 3 > 0.3 AND n::int > 0 AND d::bigint > 0",
    "CAST(a AS numeric(10, 2)) > 1 AND t::varchar(3) = 'abc'",
    "DATE '2024-01-01' < dt AND TIMESTAMP '2024-01-01 10:00' < ts",
    "tz > '2024-01-01 00:00:00+00'",
    "tz > TIMESTAMP WITH TIME ZONE '2024-01-01 00:00:00+02'",
    "d = 'NaN' OR d > 1e10 OR n = 'Infinity'",
    "a = ANY (ARRAY[1, 2]) AND a <> ALL (ARRAY[3, 4])",
    "(t COLLATE \"C\") < 'x'",
    "f AND NOT f OR f = true",
    "a > -2147483648 AND b < 9223372036854775807",
    "md5(t) = '0' OR starts_with(t, 'a') OR split_part(t, ',', 2) = 'x'",
    "make_date(2024, 1, 1) < dt AND isfinite(ts)",
    "lpad(t, 5, 'x') = rpad(v, 5) OR translate(t, 'ab', 'x') = 'x'",
    "j IS NOT NULL",
    "c = 'ab' AND c < 'b' AND length(c) = 2",
]

_PREFIX = "CREATE PUBLICATION rj FOR TABLE rt WHERE ("


def _relation(conn: psycopg.Connection[Any], table: str) -> Relation:
    """The table as a pgoutput Relation message would describe it."""
    rows = conn.execute(
        """SELECT a.attname::text, a.atttypid::int, a.atttypmod,
                  coalesce(a.attnum = ANY(i.indkey), false), c.relreplident::text
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           LEFT JOIN pg_index i ON i.indrelid = c.oid
                AND (i.indisreplident OR (c.relreplident = 'd' AND i.indisprimary))
           WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY a.attnum""",
        (table,),
    ).fetchall()
    ident = rows[0][4]
    columns = tuple(
        Column(1 if key or ident == "f" else 0, name, oid, typmod)
        for name, oid, typmod, key, _ in rows
    )
    return Relation(None, 1, "public", table, ident, columns)


def _server(conn: psycopg.Connection[Any], expr: str) -> psycopg.Error | None:
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(sql.SQL("{}{})").format(sql.SQL(_PREFIX), sql.SQL(expr)))
    except psycopg.Error as exc:
        return exc
    return None


def _check_rejected(
    conn: psycopg.Connection[Any], rel: Relation, expr: str, sqlstate: str, detail: str | None
) -> str | None:
    """Why the client's refusal of ``expr`` differs from the server's (None: it does not)."""
    error = _server(conn, expr)
    if error is None:
        return "PostgreSQL accepted it"
    if (error.diag.sqlstate, error.diag.message_detail) != (sqlstate, detail):
        return f"PostgreSQL said {error.diag.sqlstate}: {error}"
    try:
        RowFilter.parse(expr).bind(rel, publishes_update_or_delete=False)
    except (InvalidFilterError, FilterSyntaxError) as mine:
        if (mine.sqlstate, mine.detail) != (sqlstate, detail):
            return f"client said {mine.sqlstate}: {mine}"
        if (
            sqlstate == "0A000"
            and detail is not None
            and mine.message != error.diag.message_primary
        ):
            return f"client message {mine.message!r}"
        server_pos = error.diag.statement_position
        expected = None if server_pos is None else int(server_pos) - len(_PREFIX)
        if mine.position != expected:
            return f"server points at {expected}, client at {mine.position}"
        if not str(mine).startswith(mine.message):
            return "str() does not start with the message"
        return None
    except RowFilterError as other:
        return f"client raised {type(other).__name__}: {other}"
    return "client accepted it"


def test_rejected_like_the_server(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        conn.execute(SETUP)
        rel = _relation(conn, "rt")
        failures = [
            f"{expr!r}: {why}"
            for expr, sqlstate, detail in REJECTED
            if (why := _check_rejected(conn, rel, expr, sqlstate, detail)) is not None
        ]
    assert not failures, "\n".join(failures)


def test_accepted_like_the_server(pg: PgDatabase) -> None:
    failures = []
    with pg.connect() as conn:
        conn.execute(SETUP)
        rel = _relation(conn, "rt")
        for expr in ACCEPTED:
            error = _server(conn, expr)
            if error is not None:
                failures.append(f"{expr!r}: PostgreSQL rejected it: {error}")
                continue
            flt = RowFilter.parse(expr)
            try:
                flt.bind(rel, publishes_update_or_delete=False)
            except UnsupportedFilterError as exc:
                if "jsonb" not in str(exc):  # the one column type the client does not read
                    failures.append(f"{expr!r}: {exc}")
            except RowFilterError as exc:
                failures.append(f"{expr!r}: {exc}")
            # the printed SQL is accepted as well
            printed = flt.to_sql()
            if _server(conn, printed) is not None:
                failures.append(f"{expr!r}: printed as {printed!r}, which PostgreSQL rejects")
    assert not failures, "\n".join(failures)


def test_unsupported_is_distinct_from_invalid(pg: PgDatabase) -> None:
    """Valid on the server but not evaluable client-side: UnsupportedFilterError."""
    with pg.connect() as conn:
        conn.execute(SETUP)
        rel = _relation(conn, "rt")
        for expr in ("t ~ 'a.c'", "t SIMILAR TO 'a%'", "sqrt(n) > 1", "j ? 'k'", "t < 'x'"):
            assert _server(conn, expr) is None, expr
            with pytest.raises(UnsupportedFilterError):
                RowFilter.parse(expr).bind(
                    rel, publishes_update_or_delete=False, collation="en_US.UTF-8"
                )


def _update_error(conn: psycopg.Connection[Any], statement: str) -> psycopg.Error | None:
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(statement)
    except psycopg.Error as exc:
        return exc
    return None


REPLICA_IDENTITY_CASES = [
    ("DEFAULT", "insert, update, delete", "k > 1", True),
    ("DEFAULT", "insert, update, delete", "x > 1", False),
    ("DEFAULT", "update", "k > 1 AND x > 1", False),
    ("DEFAULT", "delete", "x IS NULL", False),
    ("DEFAULT", "insert", "x > 1", True),
    ("FULL", "insert, update, delete", "x > 1 AND y = 'a'", True),
    ("USING INDEX rk_x_y", "update, delete", "x > 1 AND y = 'a'", True),
    ("USING INDEX rk_x_y", "update, delete", "k > 1", False),
    ("NOTHING", "insert", "x > 1", True),
    ("DEFAULT", "insert, update", "1 = 1", True),
]


def test_replica_identity_rule(pg: PgDatabase) -> None:
    """The server refuses UPDATE/DELETE when an UPDATE/DELETE publication filters outside the
    replica identity; the client refuses to bind such a filter, with the same detail."""
    with pg.connect() as conn:
        conn.execute(
            "CREATE TABLE rk (k int PRIMARY KEY, x int NOT NULL, y text NOT NULL, z int);"
            "CREATE UNIQUE INDEX rk_x_y ON rk (x, y);"
            "INSERT INTO rk VALUES (1, 2, 'a', 3)"
        )
        for identity, publish, expr, allowed in REPLICA_IDENTITY_CASES:
            conn.execute(sql.SQL("ALTER TABLE rk REPLICA IDENTITY {}").format(sql.SQL(identity)))
            conn.execute(
                sql.SQL(
                    "CREATE PUBLICATION rkp FOR TABLE rk WHERE ({}) WITH (publish = {})"
                ).format(sql.SQL(expr), sql.Literal(publish))
            )
            statement = "DELETE FROM rk" if publish == "delete" else "UPDATE rk SET z = 4"
            error = _update_error(conn, statement)
            rel = _relation(conn, "rk")
            conn.execute("DROP PUBLICATION rkp")
            publishes_ud = "update" in publish or "delete" in publish
            flt = RowFilter.parse(expr)
            case = (identity, publish, expr)
            if allowed:
                assert error is None or "replica identity" not in str(error), (case, error)
                flt.bind(rel, publishes_update_or_delete=publishes_ud)
                continue
            assert error is not None, case
            with pytest.raises(ReplicaIdentityError) as caught:
                flt.bind(rel, publishes_update_or_delete=publishes_ud)
            assert caught.value.detail == error.diag.message_detail, case
            assert caught.value.detail == (
                "Column used in the publication WHERE expression is not part of the replica "
                "identity."
            )


def test_error_text_points_at_the_position() -> None:
    rel = Relation(None, 1, "public", "t", "f", (Column(1, "a", 23, -1), Column(1, "ts", 1184, -1)))
    with pytest.raises(RowFilterError) as caught:
        RowFilter.parse("a > 1 AND\n  now() > ts").bind(rel)
    text = str(caught.value)
    assert text.splitlines() == [
        "invalid publication WHERE expression",
        "DETAIL:  User-defined or built-in mutable functions are not allowed.",
        "    now() > ts",
        "    ^",
    ]
