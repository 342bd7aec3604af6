"""Every column type through the stream (binary and text pgoutput) and the snapshot, into Spark."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from decimal import Decimal
from typing import Any

import pytest
from psycopg import sql
from pyspark.sql import SparkSession

from pgcdc.replication import create_publication, create_slot_with_snapshot
from pgcdc.spark import read_snapshot, table_column
from tests.fix_pg import PgDatabase
from tests.spark.streams import ordered, run_stream

pytestmark = pytest.mark.slow

KINDS = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN money2 AS numeric(8,2);
CREATE TYPE pair AS (a int, b text);
CREATE TABLE kinds (
    id int PRIMARY KEY,
    b bool, i2 int2, i4 int4, i8 int8, o oid, x8 xid8,
    f4 float4, f8 float8, n numeric(10,2), nwide numeric(45,5), nany numeric, m money,
    t text, vc varchar(10), bc char(3), nm name, ch "char", xm xml, u uuid,
    js json, jb jsonb, jp jsonpath, ip inet, net cidr, mac macaddr, mac8 macaddr8,
    bt bit(3), vb varbit, by bytea, d date, tm time, ttz timetz, ts timestamp, tstz timestamptz,
    iv interval, ai int[], at text[], an numeric(5,1)[], e mood, ea mood[], dm posint,
    dn money2, tinf timestamptz
);
CREATE TABLE odd (id int PRIMARY KEY, p point, r int4range, c pair, pa point[]);
"""

ROW = """
INSERT INTO kinds VALUES (
    1, true, -2, 40000, 9000000000, 4000000000, '18446744073709551615',
    1.5, -2.25e-300, 12.34, '1234567890123456789012345678901234567890.12345', '-0.000100',
    '$1,234.56',
    'tëxt ✓', 'varchar', 'ab', 'name', 'c', '<a>x</a>', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
    '{"k": [1, 2.5, "z"]}', '{"k": [1, 2.5, "z"]}', '$.k[*]', '192.168.0.1/24', '10.0.0.0/8',
    '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05',
    B'101', B'1100', '\\x00ff10', '2024-02-29', '23:59:59.123456', '12:00:00+05:30',
    '2024-01-02 03:04:05.678901', '2024-01-02 03:04:05.678901+02',
    '1 year 2 mons 3 days 04:05:06.7',
    '{1,NULL,3}', '{"a,b","c\\"d",NULL}', '{1.5,-2.0}', 'happy', '{sad,happy}', 7,
    123456.78, 'infinity'
);
INSERT INTO kinds (id) VALUES (2);
INSERT INTO odd VALUES (1, '(1,2)', '[1,5)', '(3,"x y")', '{"(1,2)","(3,4)"}'),
    (2, NULL, NULL, NULL, NULL);
"""

KINDS_TYPE = (
    "struct<id:int,b:boolean,i2:smallint,i4:int,i8:bigint,o:bigint,x8:decimal(20,0),f4:float,"
    "f8:double,n:decimal(10,2),nwide:string,nany:string,m:string,t:string,vc:string,bc:string,"
    "nm:string,ch:string,xm:string,u:string,js:string,jb:string,jp:string,ip:string,net:string,"
    "mac:string,mac8:string,bt:string,vb:string,by:binary,d:date,tm:string,ttz:string,"
    "ts:timestamp_ntz,tstz:timestamp,iv:struct<months:int,days:int,microseconds:bigint>,"
    "ai:array<int>,at:array<string>,an:array<decimal(5,1)>,e:string,ea:array<string>,dm:int,"
    "dn:decimal(8,2),tinf:timestamp>"
)


def _new(rows: list[dict[str, Any]], table: str) -> dict[int, dict[str, Any]]:
    column = table_column("public", table)
    return {r[column]["new"]["id"]: r[column]["new"] for r in rows if r["_table"] == table}


#: Database defaults under which the text form of dates, intervals and floats differs from what
#: the codec reads (new sessions, the replication connection's included, start with them)
HOSTILE_DEFAULTS = (
    ("datestyle", "SQL, DMY"),
    ("intervalstyle", "sql_standard"),
    ("extra_float_digits", "0"),
    ("bytea_output", "escape"),
)


@pytest.mark.parametrize("defaults", ["server", "hostile"])
def test_every_type_stream_binary_text_and_snapshot(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir, defaults: str
):
    """Under the server's defaults, and under database defaults that print dates, intervals,
    floats and bytea differently: the text form is read under pgcdc's own output settings."""
    with pg.connect() as conn:
        if defaults == "hostile":
            database = conn.execute("SELECT current_database()").fetchone()[0]
            for name, value in HOSTILE_DEFAULTS:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        sql.Identifier(database), sql.Identifier(name), sql.Literal(value)
                    )
                )
    with pg.connect() as conn:
        if defaults == "hostile":  # the new session has them
            assert conn.execute("SHOW datestyle").fetchone()[0] == "SQL, DMY"
        conn.execute(KINDS)
    create_publication(pg.dsn(), "p_known", tables=["kinds"])
    create_publication(pg.dsn(), "p_all", tables=["kinds", "odd"])
    for slot in ("s_binary", "s_text"):
        create_slot_with_snapshot(pg.dsn(), slot).release()
    with pg.connect() as conn:
        conn.execute(ROW)

    binary = run_stream(spark, pg.dsn(), "s_binary", ["p_known"], checkpoint_dir / "b").rows
    text = run_stream(spark, pg.dsn(), "s_text", ["p_all"], checkpoint_dir / "t").rows
    snapshot_df = read_snapshot(spark, pg.dsn(), publications=["p_all"])
    snapshot = ordered(snapshot_df)

    kinds_field = snapshot_df.schema[table_column("public", "kinds")]
    assert kinds_field.dataType["new"].dataType.simpleString() == KINDS_TYPE
    assert kinds_field.metadata["pgcdc_key"] == ["id"]
    odd_type = snapshot_df.schema[table_column("public", "odd")].dataType["new"].dataType
    assert odd_type.simpleString() == ("struct<id:int,p:string,r:string,c:string,pa:array<string>>")

    via_binary = _new(binary, "kinds")
    via_text = _new(text, "kinds")
    via_copy = _new(snapshot, "kinds")
    # three decoders of three encodings agree on every value
    assert via_binary == via_text == via_copy
    assert _new(text, "odd") == _new(snapshot, "odd")

    row = via_binary[1]
    expected = {
        "b": True,
        "i2": -2,
        "i4": 40000,
        "i8": 9000000000,
        "o": 4000000000,
        "x8": Decimal("18446744073709551615"),
        "f4": 1.5,
        "f8": -2.25e-300,
        "n": Decimal("12.34"),
        "nwide": "1234567890123456789012345678901234567890.12345",
        "nany": "-0.000100",
        "m": "$1,234.56",
        "t": "tëxt ✓",
        "vc": "varchar",
        "bc": "ab ",
        "nm": "name",
        "ch": "c",
        "xm": "<a>x</a>",
        "u": str(uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
        "js": '{"k": [1, 2.5, "z"]}',
        "jb": '{"k": [1, 2.5, "z"]}',
        "jp": '$."k"[*]',
        "ip": "192.168.0.1/24",
        "net": "10.0.0.0/8",
        "mac": "08:00:2b:01:02:03",
        "mac8": "08:00:2b:01:02:03:04:05",
        "bt": "101",
        "vb": "1100",
        "by": bytearray(b"\x00\xff\x10"),
        "d": dt.date(2024, 2, 29),
        "tm": "23:59:59.123456",
        "ttz": "12:00:00+05:30",
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
        "iv": {"months": 14, "days": 3, "microseconds": 14706700000},
        "ai": [1, None, 3],
        "at": ["a,b", 'c"d', None],
        "an": [Decimal("1.5"), Decimal("-2.0")],
        "e": "happy",
        "ea": ["sad", "happy"],
        "dm": 7,
        "dn": Decimal("123456.78"),
    }
    assert {k: row[k] for k in expected} == expected
    # timestamptz: PySpark gives the instant as a naive datetime in the process's zone
    assert row["tstz"].astimezone(dt.UTC) == dt.datetime(2024, 1, 2, 1, 4, 5, 678901, dt.UTC)
    # infinity: clamped to Spark's last instant
    assert row["tinf"].astimezone(dt.UTC) == dt.datetime(9999, 12, 31, 23, 59, 59, 999999, dt.UTC)
    assert all(v is None for k, v in via_binary[2].items() if k != "id")
    odd = _new(text, "odd")[1]
    assert odd == {"id": 1, "p": "(1,2)", "r": "[1,5)", "c": '(3,"x y")', "pa": ["(1,2)", "(3,4)"]}

    # snapshot rows: inserts at the consistent point, before any streamed change there
    assert {r["_op"] for r in snapshot} == {"I"}
    assert {r["_position"] for r in snapshot} == {-1}
    assert all(r["_xid"] is None and r["_commit_time"] is None for r in snapshot)


def test_json_as_variant_time_as_time_and_row_filters(pg: PgDatabase, spark: SparkSession):
    pg.execute("CREATE TABLE docs (id int PRIMARY KEY, body jsonb, tags json[], at time)")
    pg.execute(
        """INSERT INTO docs SELECT g, jsonb_build_object('n', g, 'even', g % 2 = 0),
           ARRAY['{"t": 1}'::json], '01:02:03.5' FROM generate_series(1, 30) g"""
    )
    if pg.major >= 15:
        create_publication(pg.dsn(), "p_docs", tables=[("public", "docs")])
        pg.execute("ALTER PUBLICATION p_docs SET TABLE docs WHERE (id <= 10)")
    else:  # pragma: no cover - the suite runs 15 and 18
        pytest.skip("row filters need PostgreSQL 15")
    create_publication(pg.dsn(), "p_docs2", tables=["docs"])
    pg.execute("ALTER PUBLICATION p_docs2 SET TABLE docs WHERE (id > 25)")
    spark.conf.set("spark.sql.timeType.enabled", "true")
    try:
        df = read_snapshot(
            spark,
            pg.dsn(),
            publications=["p_docs", "p_docs2"],
            row_filters={"public.docs": "id = 17"},
            jsonAsVariant=True,
            timeAsTime=True,
            partitionsPerTable=3,
        )
        column = table_column("public", "docs")
        assert df.schema[column].dataType["new"].dataType.simpleString() == (
            "struct<id:int,body:variant,tags:array<variant>,at:time(6)>"
        )
        rows = df.selectExpr(
            f"{column}.new.id AS id",
            f"variant_get({column}.new.body, '$.n', 'int') AS n",
            f"cast({column}.new.tags[0] AS string) AS tag",
            f"{column}.new.at AS at",
        ).collect()
    finally:
        spark.conf.unset("spark.sql.timeType.enabled")
    # the OR of the two publications' filters and the option's
    assert sorted(r.id for r in rows) == [*range(1, 11), 17, *range(26, 31)]
    assert all(r.n == r.id for r in rows)
    assert {r.tag for r in rows} == {'{"t":1}'}
    assert {r.at for r in rows} == {dt.time(1, 2, 3, 500000)}


TEXT_COLUMNS = """
CREATE TABLE tc (
    id int PRIMARY KEY, n numeric(10,2), m int[], bc char(4), ip inet, tz timestamptz, tm time,
    pt point, tms time[]
);
"""
TEXT_ROWS = """
INSERT INTO tc VALUES
    (1, 'NaN', '{{1,2},{3,4}}', 'ab', '10.0.0.1/32', '2024-01-02 03:04:05.5+02', '24:00:00',
     '(1,2)', '{12:00:00.25}'),
    (2, -3.5, '[0:1]={5,6}', NULL, '::1/128', 'infinity', '00:00:01', NULL, NULL)
"""


def test_text_columns_read_as_the_output_function_prints(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir
) -> None:
    """``textColumns``: the stream in binary and in text format and the snapshot agree, and each
    value is what PostgreSQL's output function prints (under UTC); a time column is read that
    way without the option (``24:00:00``)."""
    pg.execute(TEXT_COLUMNS)
    create_publication(pg.dsn(), "p_tc", tables=["tc"])
    for slot in ("s_binary", "s_text"):
        create_slot_with_snapshot(pg.dsn(), slot).release()
    pg.execute(TEXT_ROWS)
    texts = {"public.tc": ["n", "m", "bc", "ip", "tz", "pt", "tms"]}
    binary = run_stream(
        spark, pg.dsn(), "s_binary", ["p_tc"], checkpoint_dir / "b", textColumns=texts
    ).rows
    text = run_stream(
        spark,
        pg.dsn(),
        "s_text",
        ["p_tc"],
        checkpoint_dir / "t",
        textColumns=texts,
        binary=False,
    ).rows
    snapshot_df = read_snapshot(spark, pg.dsn(), publications=["p_tc"], textColumns=texts)
    image = snapshot_df.schema[table_column("public", "tc")].dataType["new"].dataType
    assert image.simpleString() == (
        "struct<id:int,n:string,m:string,bc:string,ip:string,tz:string,tm:string,pt:string,"
        "tms:string>"
    )
    with pg.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        names = ["n", "m", "bc", "ip", "tz", "tm", "pt", "tms"]
        printed = sql.SQL(", ").join(
            sql.SQL("CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END").format(
                c=sql.Identifier(c)
            )
            for c in names
        )
        query = sql.SQL("SELECT id, {} FROM tc").format(printed)
        expected = {
            row[0]: {"id": row[0], **dict(zip(names, row[1:], strict=True))}
            for row in conn.execute(query)
        }
    assert expected[1]["tm"] == "24:00:00" and expected[1]["bc"] == "ab  "
    via_copy = _new(ordered(snapshot_df), "tc")
    assert _new(binary, "tc") == _new(text, "tc") == via_copy == expected


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ({"public.tc": ["nope"]}, "textColumns names column(s) 'nope' of public.tc"),
        ({"public.other": ["n"]}, "textColumns names table public.other"),
        ({"public.tc": "n"}, "the columns of 'public.tc' are not a list"),
    ],
)
def test_text_columns_option_errors(
    pg: PgDatabase, spark: SparkSession, texts: dict[str, Any], message: str
) -> None:
    pg.execute(TEXT_COLUMNS)
    with pytest.raises(Exception, match=re.escape(message)):
        read_snapshot(spark, pg.dsn(), tables=["public.tc"], textColumns=texts).schema  # noqa: B018


def test_text_columns_agree_in_a_text_stream_under_database_defaults(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir
) -> None:
    """A database whose TimeZone is not UTC and whose bytea_output is escape: the text-format
    stream (binary=auto takes it for the composite) gives what the copy gives, the text each
    type's output function prints under pgcdc's settings (UTC, hex), user types included."""
    with pg.connect() as conn:
        database = conn.execute("SELECT current_database()").fetchone()[0]
        for name, value in (("TimeZone", "America/New_York"), ("bytea_output", "escape")):
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(database), sql.Identifier(name), sql.Literal(value)
                )
            )
    pg.execute(
        """
        CREATE TYPE mood AS ENUM ('sad', 'a b');
        CREATE DOMAIN dnum AS numeric(8,2);
        CREATE DOMAIN darr AS int[];
        CREATE TYPE pair AS (a int, t timestamptz);
        CREATE TABLE tu (id int PRIMARY KEY, tz timestamptz, by bytea, e mood, ea mood[],
            dn dnum, da darr, iv interval, pr pair);
        """
    )
    create_publication(pg.dsn(), "p_tu", tables=["tu"])
    create_slot_with_snapshot(pg.dsn(), "s_tu").release()
    pg.execute(
        """INSERT INTO tu VALUES (1, '2024-01-02 03:04:05.5+00', '\\x00ff41', 'a b',
        '{sad,"a b",NULL}', 'NaN', '[2:3][0:1]={{1,2},{3,4}}', '-1 year +3 days -04:00:00.5',
        '(1,"2024-01-01 00:00+00")')"""
    )
    names = ["tz", "by", "e", "ea", "dn", "da", "iv", "pr"]
    texts = {"public.tu": names}
    stream = run_stream(
        spark, pg.dsn(), "s_tu", ["p_tu"], checkpoint_dir / "t", textColumns=texts
    ).rows
    snapshot = ordered(read_snapshot(spark, pg.dsn(), publications=["p_tu"], textColumns=texts))
    with pg.connect() as conn:
        for name, value in (("TimeZone", "UTC"), ("bytea_output", "hex")):
            conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        printed = sql.SQL(", ").join(
            sql.SQL("format('%s', {})").format(sql.Identifier(c)) for c in names
        )
        row = conn.execute(sql.SQL("SELECT {} FROM tu").format(printed)).fetchone()
    expected = {1: {"id": 1, **dict(zip(names, row, strict=True))}}
    assert expected[1]["tz"] == "2024-01-02 03:04:05.5+00" and expected[1]["by"] == "\\x00ff41"
    assert _new(stream, "tu") == _new(snapshot, "tu") == expected
