"""Test helpers: values of one PostgreSQL type as the server sends them, in text and in binary.

``sample`` stores literals in a temporary table column of the given type and reads the column
back twice, in text and in binary result format, taking the raw bytes straight from libpq (no
psycopg loaders in between): exactly what pgoutput sends for the column in text mode and with
the ``binary`` option (both come from the type's output and send functions).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

_tables = itertools.count()


@dataclass(frozen=True)
class Sampled:
    """One column read back: its type OID and modifier, and the values in both formats."""

    oid: int
    typmod: int
    text: list[str | None]
    binary: list[bytes | None]


def set_timezone(conn: psycopg.Connection[Any], timezone: str) -> None:
    conn.execute("SELECT set_config('TimeZone', %s, false)", [timezone])


def raw_column(
    conn: psycopg.Connection[Any], query: sql.Composable, params: Sequence[Any] = ()
) -> tuple[int, int, list[bytes | None], list[bytes | None]]:
    """(type OID, typmod, text values, binary values) of a query's first column."""
    out: list[list[bytes | None]] = []
    oid = typmod = 0
    for binary in (False, True):
        cur = conn.cursor(binary=binary)
        cur.execute(query, params)
        res = cur.pgresult
        assert res is not None
        values = []
        for row in range(res.ntuples):
            raw = res.get_value(row, 0)
            values.append(None if raw is None else bytes(raw))
        out.append(values)
        oid, typmod = res.ftype(0), res.fmod(0)
    return oid, typmod, out[0], out[1]


def sample(
    conn: psycopg.Connection[Any],
    type_sql: str,
    literals: Sequence[str | None],
    *,
    timezone: str = "UTC",
) -> Sampled:
    """The literals (PostgreSQL input text, None for NULL) as a column of ``type_sql``."""
    set_timezone(conn, timezone)
    table = sql.Identifier(f"sample_{next(_tables)}")
    typ = sql.SQL(type_sql)
    conn.execute(sql.SQL("CREATE TEMP TABLE {} (i int, v {})").format(table, typ))
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT i, v::{} FROM unnest(%s::text[]) WITH ORDINALITY AS u(v, i)"
        ).format(table, typ),
        [list(literals)],
    )
    oid, typmod, text, binary = raw_column(
        conn, sql.SQL("SELECT v FROM {} ORDER BY i").format(table)
    )
    return Sampled(oid, typmod, [None if t is None else t.decode() for t in text], binary)


def assert_same(actual: object, expected: object, where: str = "value") -> None:
    """Equal, of the same type, with NaN equal to NaN, -0.0 unlike 0.0 and Decimal scale kept."""
    assert type(actual) is type(expected), f"{where}: {actual!r} is not a {type(expected)}"
    if isinstance(expected, list):
        assert isinstance(actual, list)
        assert len(actual) == len(expected), f"{where}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, Decimal):
        assert isinstance(actual, Decimal)
        assert str(actual) == str(expected), f"{where}: {actual!r} != {expected!r}"
    elif isinstance(expected, float):
        assert isinstance(actual, float)
        if math.isnan(expected):
            assert math.isnan(actual), f"{where}: {actual!r} is not NaN"
        else:
            assert actual == expected, f"{where}: {actual!r} != {expected!r}"
            assert math.copysign(1, actual) == math.copysign(1, expected), f"{where}: sign"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"
        if hasattr(expected, "tzinfo"):
            assert getattr(actual, "tzinfo", None) == expected.tzinfo, f"{where}: zone"
