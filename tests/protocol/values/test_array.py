"""Arrays of every supported type: both wire forms, PostgreSQL's array_out, Arrow lists."""

from __future__ import annotations

import ipaddress
import math
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest

from pgcdc.protocol.values import (
    INFINITY,
    NEG_INFINITY,
    ConversionError,
    Interval,
    PgDate,
    arrow_type,
    oids,
    pg_text,
    python_value,
    to_arrow,
)
from pgcdc.protocol.values.array import parse_text_array, quote_element
from pgcdc.protocol.values.datetime import ymd_to_days
from tests.fix_pg import PgDatabase
from tests.protocol.values.checks import check_samples
from tests.protocol.values.sampling import sample

ONE_DIM: list[tuple[str, list[tuple[str | None, object]], pa.DataType]] = [
    (
        "int4[]",
        [("{1,NULL,-3}", [1, None, -3]), ("{}", []), ("{NULL}", [None]), (None, None)],
        pa.int32(),
    ),
    ("int2[]", [("{32767,-32768}", [32767, -32768])], pa.int16()),
    ("int8[]", [("{9223372036854775807}", [2**63 - 1])], pa.int64()),
    ("oid[]", [("{4294967295,0}", [2**32 - 1, 0])], pa.uint32()),
    (
        "float8[]",
        [("{1.5,NaN,-Infinity,-0,1e+15}", [1.5, math.nan, -math.inf, -0.0, 1e15])],
        pa.float64(),
    ),
    ("float4[]", [("{1.5,Infinity}", [1.5, math.inf])], pa.float32()),
    (
        "numeric(10,2)[]",
        [("{1.5,NULL,-99999999.99}", [Decimal("1.50"), None, Decimal("-99999999.99")])],
        pa.decimal128(10, 2),
    ),
    ("numeric[]", [("{1.500,NaN}", [Decimal("1.500"), Decimal("NaN")])], pa.string()),
    ("bool[]", [("{t,f,NULL}", [True, False, None])], pa.bool_()),
    (
        "text[]",
        [
            (
                '{"a b","",NULL,"NULL","null","x\\"y","back\\\\slash","{braces}","com,ma",plain}',
                [
                    "a b",
                    "",
                    None,
                    "NULL",
                    "null",
                    'x"y',
                    "back\\slash",
                    "{braces}",
                    "com,ma",
                    "plain",
                ],
            ),
            (
                '{" lead","trail ","tab\there","new\nline"}',
                [" lead", "trail ", "tab\there", "new\nline"],
            ),
            ("{ünï,日本}", ["ünï", "日本"]),
        ],
        pa.string(),
    ),
    ("varchar(3)[]", [("{abc,de}", ["abc", "de"])], pa.string()),
    ('"char"[]', [('{a,"\\\\377"}', ["a", "\\377"])], pa.string()),
    ("bytea[]", [('{"\\\\x0102","\\\\x",NULL}', [b"\x01\x02", b"", None])], pa.binary()),
    (
        "uuid[]",
        [
            (
                "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
                [uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")],
            )
        ],
        pa.string(),
    ),
    (
        "date[]",
        [
            (
                '{2024-01-02,infinity,"0044-03-15 BC"}',
                [date(2024, 1, 2), INFINITY, PgDate(ymd_to_days(-43, 3, 15))],
            )
        ],
        pa.date32(),
    ),
    (
        "timestamptz[]",
        [
            (
                '{"2024-01-02 03:04:05.5+00",-infinity}',
                [datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC), NEG_INFINITY],
            )
        ],
        pa.timestamp("us", tz="UTC"),
    ),
    (
        "interval[]",
        [('{"1 year -2 days",00:00:01}', [Interval(12, -2, 0), Interval(0, 0, 1_000_000)])],
        pa.month_day_nano_interval(),
    ),
    (
        "jsonb[]",
        [
            (
                '{"{\\"a\\": [1, 2]}","null",NULL,"\\"s p\\""}',
                ['{"a": [1, 2]}', "null", None, '"s p"'],
            )
        ],
        pa.string(),
    ),
    (
        "inet[]",
        [
            (
                "{::ffff:1.2.3.4,10.0.0.1/8}",
                [ipaddress.ip_address("::ffff:1.2.3.4"), ipaddress.ip_interface("10.0.0.1/8")],
            )
        ],
        pa.string(),
    ),
    ("varbit[]", [('{101,"",1}', ["101", "", "1"])], pa.string()),
    ("money[]", [("{1.5,-2}", [Decimal("1.50"), Decimal("-2.00")])], pa.string()),
    ("macaddr[]", [("{08:00:2b:01:02:03}", ["08:00:2b:01:02:03"])], pa.string()),
]


@pytest.mark.parametrize("type_sql", [t for t, _, _ in ONE_DIM])
def test_one_dimensional(pg: PgDatabase, type_sql: str) -> None:
    _, cases, element = next(entry for entry in ONE_DIM if entry[0] == type_sql)
    with pg.connect() as conn:
        check_samples(conn, type_sql, cases, expected_arrow=pa.list_(element))


def test_timestamptz_array_in_another_zone(pg: PgDatabase) -> None:
    cases: list[tuple[str | None, object]] = [
        (
            '{"2024-07-01 12:00:00+00","1800-01-01 00:00:00+00"}',
            [datetime(2024, 7, 1, 12, tzinfo=UTC), datetime(1800, 1, 1, tzinfo=UTC)],
        )
    ]
    with pg.connect() as conn:
        got = check_samples(conn, "timestamptz[]", cases, timezone="America/New_York")
    assert got.text[0] == '{"2024-07-01 08:00:00-04","1799-12-31 19:03:58-04:56:02"}'


def test_multi_dimensional(pg: PgDatabase) -> None:
    cases: list[tuple[str | None, object]] = [
        ("{{1,2},{3,NULL}}", [[1, 2], [3, None]]),
        ("{{1},{2},{3}}", [[1], [2], [3]]),
        ("{}", []),
        (None, None),
    ]
    with pg.connect() as conn:
        got = check_samples(
            conn,
            "int4[][]",
            cases,
            expected_arrow=pa.list_(pa.list_(pa.int32())),
            arrow_values=[[[1, 2], [3, None]], [[1], [2], [3]], [], None],
            ndims=2,
        )
    for values in (got.text, got.binary):
        with pytest.raises(ConversionError, match=r"2 dimension.*ndims=1"):
            to_arrow(values, got.oid, got.typmod)


def test_three_dimensions_of_text(pg: PgDatabase) -> None:
    cases: list[tuple[str | None, object]] = [
        (
            '{{{a,"b c"},{NULL,"}"}},{{e,f},{g,h}}}',
            [[["a", "b c"], [None, "}"]], [["e", "f"], ["g", "h"]]],
        )
    ]
    with pg.connect() as conn:
        check_samples(
            conn,
            "text[]",
            cases,
            expected_arrow=pa.list_(pa.list_(pa.list_(pa.string()))),
            ndims=3,
        )


def test_lower_bounds(pg: PgDatabase) -> None:
    """Lower bounds other than 1 print as a [lo:hi] decoration; Python and Arrow drop them."""
    cases: list[tuple[str | None, object]] = [
        ("[2:3]={1,2}", [1, 2]),
        ("[-5:-4]={7,NULL}", [7, None]),
        ("{1}", [1]),
    ]
    with pg.connect() as conn:
        got = check_samples(conn, "int4[]", cases, arrow_values=[[1, 2], [7, None], [1]])
        assert got.text[:2] == ["[2:3]={1,2}", "[-5:-4]={7,NULL}"]
        two = check_samples(
            conn, "text[]", [('[0:1][1:2]={{a,b},{c,"d e"}}', [["a", "b"], ["c", "d e"]])], ndims=2
        )
        assert two.text == ['[0:1][1:2]={{a,b},{c,"d e"}}']


def test_box_array_uses_its_delimiter(pg: PgDatabase) -> None:
    """box arrays use ';' between elements (a box's text holds commas)."""
    with pg.connect() as conn:
        got = sample(conn, "box[]", ["{(1,2),(0,0);(3,4),(1,1)}"])
    for values in (got.text, got.binary):
        assert python_value(values[0], got.oid) == ["(1,2),(0,0)", "(3,4),(1,1)"]
        assert to_arrow(values, got.oid).to_pylist() == [["(1,2),(0,0)", "(3,4),(1,1)"]]
    assert pg_text(got.binary[0], got.oid) == "{(1,2),(0,0);(3,4),(1,1)}"  # type: ignore[arg-type]


def test_text_parser_edge_cases() -> None:
    assert parse_text_array('{a, b ,"c" }').elements == ["a", "b", "c"]
    assert parse_text_array("{a\\,b,c}").elements == ["a,b", "c"]
    assert parse_text_array("{\\NULL,NULL,null}").elements == ["NULL", None, None]
    assert parse_text_array("{}").dims == ()
    for bad in ("{1,2", "1,2}", "{{1},2}", "{{1,2},{3}}", "{1,,2}", "[1:2]{1,2}"):
        with pytest.raises(ConversionError, match="text array value is malformed"):
            parse_text_array(bad)
    assert quote_element("") == '""'
    assert quote_element("Null") == '"Null"'
    assert quote_element("a;b", ";") == '"a;b"'
    assert quote_element("a,b", ";") == "a,b"


def test_arrow_type_nesting() -> None:
    assert arrow_type(oids.INT4_ARRAY_OID, -1) == pa.list_(pa.int32())
    assert arrow_type(oids.INT4_ARRAY_OID, -1, ndims=2) == pa.list_(pa.list_(pa.int32()))
    numeric_10_2 = ((10 << 16) | 2) + 4
    assert arrow_type(oids.NUMERIC_ARRAY_OID, numeric_10_2) == pa.list_(pa.decimal128(10, 2))
    with pytest.raises(ValueError, match="ndims must be at least 1"):
        arrow_type(oids.INT4_ARRAY_OID, -1, ndims=0)


def test_binary_array_errors() -> None:
    with pytest.raises(ConversionError, match="truncated"):
        python_value(b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x17", oids.INT4_ARRAY_OID)
    with pytest.raises(ConversionError, match="invalid header"):
        python_value(b"\x00\x00\x00\x09" + bytes(8), oids.INT4_ARRAY_OID)
