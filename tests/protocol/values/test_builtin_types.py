"""Binary geometric, full-text search and bookkeeping values printed as the server prints them
(issue 26): ``pg_text`` reads point, line, lseg, box, path, polygon, circle, tsvector, tsquery,
pg_lsn, pg_snapshot, txid_snapshot, tid, oidvector and int2vector itself, and must print what
their output functions print, on both servers, arrays included."""

from __future__ import annotations

import pytest
from psycopg import sql
from tools.type_coverage import coverage

from pgcdc.protocol.values import pg_text
from pgcdc.protocol.values.adapt import SERVER_RENDERED
from pgcdc.protocol.values.errors import ConversionError
from tests.fix_pg import PgDatabase
from tests.protocol.values.sampling import raw_column

CASES = (
    "'(1,2)'::point",
    "'(-0.5,1e300)'::point",
    "'(1.1,NaN)'::point",
    "point('Infinity', '-Infinity')",
    "'{1,-1,0.3333333333333333}'::line",
    "'[(0,0),(1.5,2)]'::lseg",
    "'(3,4),(1,2)'::box",
    "'((0,0),(1,1),(2,0))'::path",
    "'[(0,0),(1,1)]'::path",
    "'((0,0),(0,1),(1,1),(1,0))'::polygon",
    "'<(1,2),3.25>'::circle",
    "ARRAY['(1,2),(0,0)'::box, '(5,5),(4,4)']",
    "ARRAY['(1,2)'::point, NULL]",
    "to_tsvector('english', 'The quick brown foxes jumped over the lazy dogs')",
    "'a:1A,2B,3C,4 b c:5'::tsvector",
    "$$'it''s' 'back\\slash' 'x y'$$::tsvector",
    "''::tsvector",
    "ARRAY['a b'::tsvector, '']",
    "'a & b'::tsquery",
    "'a & (b | c)'::tsquery",
    "'(a | b) & !c'::tsquery",
    "'!(a & b)'::tsquery",
    "'!!a'::tsquery",
    "'a <-> b <2> c'::tsquery",
    "'a <-> (b <-> c)'::tsquery",
    "'(a <-> b) & c:*AB'::tsquery",
    "'x:*' ::tsquery",
    "'d:D & e:ABCD'::tsquery",
    "$$'it''s' | 'back\\slash'$$::tsquery",
    "''::tsquery",
    "to_tsquery('english', 'fat & (rat | cat) & !dog')",
    "phraseto_tsquery('english', 'the quick brown fox')",
    "'0/0'::pg_lsn",
    "'16/B374D848'::pg_lsn",
    "'FFFFFFFF/FFFFFFFF'::pg_lsn",
    "'10:20:10,14,15'::pg_snapshot",
    "'10:10:'::pg_snapshot",
    "'3:5:4'::txid_snapshot",
    "'(0,1)'::tid",
    "'(4294967295,65535)'::tid",
    "'1 2 3'::oidvector",
    "''::oidvector",
    "'-1 0 32767'::int2vector",
    "ARRAY['1 2'::int2vector, '']",
    "ARRAY['0/1'::pg_lsn, NULL]",
    "(SELECT ev_action FROM pg_rewrite ORDER BY oid LIMIT 1)",  # a pg_node_tree
)


def test_binary_values_of_more_built_in_types_print_as_the_server(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        for expression in CASES:
            query = sql.SQL("SELECT " + expression)  # the test's own constants
            oid, _, text, binary = raw_column(conn, query)
            assert text[0] is not None and binary[0] is not None, expression
            # no server_text: the codec reads every one of these itself
            assert pg_text(binary[0], oid) == text[0].decode(), expression


@pytest.mark.parametrize(
    ("oid", "data"),
    [
        (600, b"\x00" * 15),  # a point one byte short
        (602, b"\x02\x00\x00\x00\x00"),  # a path with a bad closed flag
        (604, b"\x00\x00\x00\x02" + b"\x00" * 16),  # a polygon missing a point
        (3614, b"\x00\x00\x00\x01ab"),  # a lexeme without its terminator
        (3615, b"\x00\x00\x00\x03\x02\x02"),  # an AND without its operands
        (3615, b"\x00\x00\x00\x01\x07"),  # an item of unknown type
        (3220, b"\x00" * 7),  # a short pg_lsn
        (5038, b"\x00\x00\x00\x02" + b"\x00" * 24),  # a snapshot missing its ids
        (27, b"\x00" * 5),  # a short tid
    ],
)
def test_malformed_values_raise_conversion_error(oid: int, data: bytes) -> None:
    with pytest.raises(ConversionError):
        pg_text(data, oid)


def test_every_built_in_type_is_read_natively_or_left_to_the_server_by_name(
    pg: PgDatabase,
) -> None:
    """The server's own pg_type decides what there is to cover (``tools.type_coverage``): every
    built-in base type with a binary send function has a converter, or is one of
    ``SERVER_RENDERED`` (types whose output needs the catalog, or that user tables do not
    hold). Types without a send function (aclitem, gtsvector) reach pgoutput's clients in text
    format even in binary mode."""
    rows = coverage(pg.dsn())
    assert [name for _, name, how in rows if how == "MISSING"] == []
    assert {name for _, name, how in rows if how == "server"} <= set(SERVER_RENDERED)
    assert {name for _, name, how in rows if how == "text"} == {"aclitem", "gtsvector"}
    assert len([1 for *_, how in rows if how == "codec"]) >= 50
