"""Binary ranges, multiranges and composite values printed as the server prints them (issue 26):
``pg_text`` reads range_send, multirange_send and record_send itself, with no server to ask, and
must print what range_out, multirange_out and record_out print, on both servers: every built-in
range and multirange, empty and infinite bounds, bounds and columns that need quoting, NULL
columns, nested composites, arrays of all of these, user-defined ranges and composites."""

from __future__ import annotations

import pytest
from psycopg import sql

from pgcdc.protocol.values import TypeRegistry, pg_text
from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.registry import BUILTIN_RANGES
from tests.fix_pg import PgDatabase
from tests.protocol.values.sampling import raw_column

USER_TYPES = r"""
CREATE TYPE pair AS (a int, b text);
CREATE TYPE nest AS (p pair, r int4range, tags text[], n numeric);
CREATE TYPE textrange AS RANGE (subtype = text, collation = "C");
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE DOMAIN posrange AS int4range CHECK (NOT isempty(VALUE));
"""

#: SQL expressions; each is read back in binary and printed by pg_text
CASES = (
    "'[3,7)'::int4range",
    "'empty'::int4range",
    "'(,5]'::int4range",
    "'(,)'::int4range",
    "'[-2147483648,2147483647)'::int4range",
    "'(1,)'::int8range",
    "'(1.5,2.25]'::numrange",
    "'[-1e20,NaN)'::numrange",
    "'[\"2024-01-01 10:00\",infinity)'::tsrange",
    '\'["2024-01-01 10:00:00.5+00","2024-02-01 00:00+05")\'::tstzrange',
    "'[2024-01-01,2024-01-31]'::daterange",
    "'(-infinity,infinity)'::daterange",
    "'{}'::int4multirange",
    "'{[1,3), [5,8)}'::int4multirange",
    "'{[1,2], (10,)}'::int8multirange",
    "'{(1.5,2), [3,)}'::nummultirange",
    "'{[2024-01-01,2024-01-05), [2024-02-01,2024-02-02]}'::datemultirange",
    '\'{["2024-01-01 10:00","2024-01-01 11:00")}\'::tsmultirange',
    "'{[\"2024-01-01 10:00+00\",)}'::tstzmultirange",
    "ARRAY['[1,2)'::int4range, 'empty', NULL]",
    "ARRAY['{[1,2)}'::int4multirange, '{}']",
    "ROW(1, 'x y', NULL, '', 'a\"b\\c', ARRAY[1, 2], '[1,2)'::int4range, ROW(2, 'z'))",
    "ROW()",
    "ROW(NULL::int)",
    "'(1,\"x y\")'::pair",
    "'(,)'::pair",
    "'(3,\"\")'::pair",
    '\'("(2,z)","[3,7)","{a,\\"b c\\"}",1.50)\'::nest',
    "ARRAY['(1,a)'::pair, NULL, '(,)']",
    "ARRAY[ROW(1, 'a b')::pair]",
    "'[\"a b\",c)'::textrange",
    "textrange('a\"b', 'c\\d')",
    "textrange('', 'z', '[]')",
    "textrange('(x)', '[y]')",
    "'[1.5,2.5]'::floatrange",
    "'[1,5)'::posrange",
    '\'{"[1,2)","[3,4)"}\'::posrange[]',
)


def test_binary_ranges_multiranges_and_composites_print_as_the_server(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        conn.execute(USER_TYPES)
        registry = TypeRegistry()
        registry.load(conn)
        for expression in CASES:
            query = sql.SQL("SELECT " + expression)  # the test's own constants
            oid, _, text, binary = raw_column(conn, query)
            assert text[0] is not None and binary[0] is not None, expression
            expected = text[0].decode()
            # no server_text: the codec reads every one of these itself
            assert pg_text(binary[0], oid, registry=registry) == expected, expression


def test_the_built_in_ranges_subtypes_are_the_servers(pg: PgDatabase) -> None:
    rows = pg.execute(
        "SELECT rngtypid::int, rngsubtype::int, rngmultitypid::int FROM pg_range "
        "WHERE rngtypid < 10000 ORDER BY 1"
    )
    assert sorted(rows) == sorted(BUILTIN_RANGES)


@pytest.mark.parametrize(
    ("oid", "data"),
    [
        (3904, b""),  # no flags byte
        (3904, b"\x02\x00\x00\x00\x04\x00\x00"),  # a truncated bound
        (3904, b"\x01\x00"),  # an empty range with trailing bytes
        (4451, b"\x00\x00\x00\x01"),  # a multirange missing its range
        (2249, b"\x00\x00\x00\x01\x00\x00\x00\x17\x00\x00\x00\x08\x00"),  # a short column
    ],
)
def test_malformed_values_raise_conversion_error(oid: int, data: bytes) -> None:
    with pytest.raises(ConversionError):
        pg_text(data, oid)
