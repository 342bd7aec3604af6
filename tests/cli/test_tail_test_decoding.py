"""``pgcdc tail --format test_decoding`` prints exactly what contrib/test_decoding prints.

The same workload is decoded by a test_decoding slot (include-xids '0', skip-empty-xacts '1')
and by a pgoutput slot read with ``pgcdc tail``, for every protocol version the server has,
streaming off / on / parallel, text and binary values, with and without two-phase decoding; the
outputs must be equal byte for byte. The workload covers many column types, replica identity
default / full / index / nothing-with-inserts-only, key-changing updates, TOAST, truncate with
cascade and restart identity, subtransactions rolled back inside large streamed transactions,
prepared transactions committed and rolled back, logical messages, schema changes mid-stream,
and origins.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass

import pytest

from pgcdc.cli import main
from tests.fix_pg import PgDatabase

# large and incompressible, so it is stored out of line (TOAST)
BIG = "".join(f"{(i * 2654435761) % 4294967291:08x}" for i in range(1500))

SETUP = r'''
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE SCHEMA "Odd Schema";
CREATE TABLE types (
    id int PRIMARY KEY, b bool, i2 smallint, i8 bigint, n numeric(12,3), nn numeric,
    f4 real, f8 double precision, t text, vc varchar(20), c char(4), nm name, by bytea,
    u uuid, d date, tm time, ttz timetz, ts timestamp, tstz timestamptz, iv interval,
    j json, jb jsonb, ip inet, cidr_ cidr, mac macaddr, bt bit(4), vb varbit,
    ia int[], ta text[], m mood, p posint, "user" text, "Mixed Case" int);
CREATE TABLE full_t (id int, v text, big text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE idx_t (a int NOT NULL, b text NOT NULL, c text);
CREATE UNIQUE INDEX idx_t_ab ON idx_t (a, b);
ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_ab;
CREATE TABLE toast_t (id int PRIMARY KEY, note text, big text);
CREATE TABLE parent_t (id int PRIMARY KEY);
CREATE TABLE child_t (id int PRIMARY KEY, parent int REFERENCES parent_t);
CREATE TABLE seq_t (id serial PRIMARY KEY, v text);
CREATE TABLE "Odd Schema"."Tab ""q""" (k int PRIMARY KEY, "é" text);
CREATE TABLE big_t (id int PRIMARY KEY, v text);
CREATE TABLE evolving (id int PRIMARY KEY, a text);
CREATE PUBLICATION pub FOR ALL TABLES;
'''

ROWS = [
    "(1, true, 1, 10, 1.5, 'NaN', 'Infinity', -0.0, 'it''s', 'v', 'ab', 'nm', '\\x00ff',"
    " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29', '12:34:56.789', '01:02:03+05:30',"
    " '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05+02', '1 year 2 mons 3 days 04:05:06.7',"
    " '{\"a\": [1, 2]}', '{\"b\": {\"c\": null}, \"a\": 1}', '192.168.0.1/24', '10.0.0.0/8',"
    " '08:00:2b:01:02:03', B'1010', B'10', '{1,NULL,3}', '{\"a b\",NULL,\"c,d\",\"\\\\\"}',"
    " 'happy', 5, 'u', 7)",
    "(2, false, -32768, -9223372036854775808, -0.001, 123456789.123456789, 1e-40, 1e+300,"
    " E'line\\nbreak\\ttab', '', ' ', 'x', '\\x', '00000000-0000-0000-0000-000000000000',"
    " 'infinity', '24:00:00', '00:00:00-12', '-infinity', '0044-03-15 12:00:00+00 BC',"
    " '-178000000 years', 'null', '[]', '::ffff:1.2.3.4', '::/0', 'ff:ff:ff:ff:ff:ff', B'0000',"
    " B'', '{{1,2},{3,4}}', '{}', 'sad', 1, NULL, NULL)",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL)",
]


def _workload(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        ex = conn.execute
        for row in ROWS:
            ex(f"INSERT INTO types VALUES {row}")  # noqa: S608 - fixed test literals
        ex("UPDATE types SET t = 'changed', n = 2.25 WHERE id = 1")
        ex("UPDATE types SET id = 10 WHERE id = 2")  # key change: old-key
        ex("DELETE FROM types WHERE id = 3")
        # REPLICA IDENTITY FULL: old tuples whole, NULLs skipped in old-key
        ex("INSERT INTO full_t VALUES (1, 'a', NULL), (2, NULL, %s)", (BIG,))
        ex("UPDATE full_t SET v = 'b' WHERE id = 1")
        ex("UPDATE full_t SET v = 'c' WHERE id = 2")
        ex("DELETE FROM full_t WHERE id = 1")
        # REPLICA IDENTITY USING INDEX
        ex("INSERT INTO idx_t VALUES (1, 'x', 'c1'), (2, 'y', NULL)")
        ex("UPDATE idx_t SET c = 'c2' WHERE a = 1")
        ex("UPDATE idx_t SET b = 'z' WHERE a = 2")
        ex("DELETE FROM idx_t WHERE a = 1")
        # TOAST: unchanged out-of-line values are not sent
        ex("INSERT INTO toast_t VALUES (1, 'n', %s)", (BIG,))
        ex("UPDATE toast_t SET note = 'm' WHERE id = 1")
        ex("UPDATE toast_t SET big = %s WHERE id = 1", (BIG[::-1],))
        ex("DELETE FROM toast_t")
        # truncate flags
        ex("INSERT INTO parent_t VALUES (1)")
        ex("INSERT INTO child_t VALUES (1, 1)")
        ex("INSERT INTO seq_t (v) VALUES ('a')")
        ex("TRUNCATE parent_t CASCADE")
        ex("TRUNCATE seq_t RESTART IDENTITY")
        ex("TRUNCATE seq_t, big_t")
        # quoted identifiers
        ex('INSERT INTO "Odd Schema"."Tab ""q""" VALUES (1, %s)', ("ü",))
        # logical messages
        ex("SELECT pg_logical_emit_message(false, 'plain', 'not in a txn')")
        with conn.transaction():
            ex("SELECT pg_logical_emit_message(true, 'pfx', 'in a txn')")
            ex("INSERT INTO seq_t (v) VALUES ('after message')")
        with conn.transaction():
            ex("SELECT pg_logical_emit_message(true, 'only', 'message only')")
        # a large transaction that streams, with savepoints rolled back inside it
        with conn.transaction():
            ex("INSERT INTO big_t SELECT g, 'kept ' || g FROM generate_series(1, 2500) g")
            ex("SAVEPOINT s1")
            ex("INSERT INTO big_t SELECT g, 'gone ' || g FROM generate_series(5001, 7500) g")
            ex("SAVEPOINT s2")
            ex("UPDATE big_t SET v = 'nested gone' WHERE id < 100")
            ex("ROLLBACK TO SAVEPOINT s1")
            ex("SAVEPOINT s3")
            ex("UPDATE big_t SET v = 'released' WHERE id % 10 = 0")
            ex("RELEASE SAVEPOINT s3")
            ex("DELETE FROM big_t WHERE id % 7 = 0")
        # a large transaction rolled back
        with conn.transaction(force_rollback=True):
            ex("INSERT INTO big_t SELECT g, 'rolled back' FROM generate_series(10001, 13000) g")
        # an empty transaction and one touching nothing published
        with conn.transaction():
            ex("SELECT 1")
        # schema changes mid-stream
        ex("INSERT INTO evolving VALUES (1, 'a')")
        ex("ALTER TABLE evolving ADD COLUMN b int")
        ex("INSERT INTO evolving VALUES (2, 'b', 2)")
        ex("ALTER TABLE evolving DROP COLUMN a")
        ex("INSERT INTO evolving VALUES (3, 3)")
        ex("ALTER TABLE evolving ALTER COLUMN b TYPE bigint")
        ex("UPDATE evolving SET b = b + 1")
        # prepared transactions, committed and rolled back
        ex("BEGIN")
        ex("INSERT INTO seq_t (v) VALUES ('prepared 1')")
        ex("PREPARE TRANSACTION 'p1'")
        ex("COMMIT PREPARED 'p1'")
        ex("BEGIN")
        ex("INSERT INTO seq_t (v) VALUES ('prepared 2')")
        ex("PREPARE TRANSACTION 'p''2'")
        ex("ROLLBACK PREPARED 'p''2'")
        ex("BEGIN")
        ex("INSERT INTO big_t SELECT g, 'big prepared' FROM generate_series(20001, 23000) g")
        ex("PREPARE TRANSACTION 'p3'")
        ex("COMMIT PREPARED 'p3'")
        # a replayed transaction from another origin
        ex("SELECT pg_replication_origin_create('elsewhere')")
        ex("SELECT pg_replication_origin_session_setup('elsewhere')")
        with conn.transaction():
            ex("SELECT pg_replication_origin_xact_setup('0/1234', now())")
            ex("INSERT INTO seq_t (v) VALUES ('from elsewhere')")
        ex("SELECT pg_replication_origin_session_reset()")
        ex("INSERT INTO seq_t (v) VALUES ('last')")


@dataclass
class Decoded:
    pg: PgDatabase
    expected: dict[bool, bytes]  # two_phase -> test_decoding output


def _test_decoding(pg: PgDatabase, slot: str) -> bytes:
    rows = pg.execute(
        "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL,"
        " 'include-xids', '0', 'skip-empty-xacts', '1')",
        (slot,),
    )
    return b"".join(str(data).encode("utf-8") + b"\n" for (data,) in rows)


@pytest.fixture(scope="module")
def decoded(pg_module: PgDatabase) -> Iterator[Decoded]:
    pg = pg_module
    pg.execute(SETUP)
    for name, plugin, two_phase in [
        ("td", "test_decoding", False),
        ("td2pc", "test_decoding", True),
        ("po", "pgoutput", False),
        ("po2pc", "pgoutput", True),
    ]:
        pg.execute(
            "SELECT pg_create_logical_replication_slot(%s, %s, false, %s)",
            (name, plugin, two_phase),
        )
    _workload(pg)
    expected = {False: _test_decoding(pg, "td"), True: _test_decoding(pg, "td2pc")}
    assert expected[False].count(b"\nCOMMIT\n") > 20
    yield Decoded(pg, expected)


def _tail_run(pg: PgDatabase, *args: str) -> tuple[int, bytes]:
    buffer = io.BytesIO()
    out = io.TextIOWrapper(buffer, encoding="utf-8")
    with redirect_stdout(out):
        code = main(["tail", "--dsn", pg.dsn(), "--until-caught-up", "--no-ack", *args])
    out.flush()
    return code, buffer.getvalue()


def _tail(pg: PgDatabase, *args: str) -> bytes:
    code, output = _tail_run(pg, *args)
    assert code == 0
    return output


def _variants() -> Iterator[tuple[int, str, bool]]:
    for proto in (1, 2, 3, 4):
        for streaming in ("off", "on", "parallel"):
            if proto == 1 and streaming != "off":
                continue
            if streaming == "parallel" and proto < 4:
                continue
            for binary in (False, True):
                yield proto, streaming, binary


@pytest.mark.parametrize(("proto", "streaming", "binary"), list(_variants()))
def test_same_as_test_decoding(decoded: Decoded, proto: int, streaming: str, binary: bool) -> None:
    pg = decoded.pg
    if proto == 4 and pg.major < 16:
        # PostgreSQL 15 has protocol versions 1 to 3: tail says so and fails cleanly
        code, output = _tail_run(pg, "--slot", "po", "--publication", "pub", "--proto-version", "4")
        assert (code, output) == (1, b"")
        return
    args = ["--slot", "po", "--publication", "pub", "--messages", "--proto-version", str(proto)]
    args += ["--streaming", streaming] + (["--binary"] if binary else [])
    got = _tail(pg, *args)
    assert got.decode("utf-8").splitlines() == decoded.expected[False].decode("utf-8").splitlines()
    assert got == decoded.expected[False]


@pytest.mark.parametrize(
    ("proto", "streaming", "binary"), [(3, "off", False), (3, "on", True), (4, "parallel", False)]
)
def test_two_phase_same_as_test_decoding(
    decoded: Decoded, proto: int, streaming: str, binary: bool
) -> None:
    pg = decoded.pg
    if proto == 4 and pg.major < 16:
        proto, streaming = 3, "on"
    args = ["--slot", "po2pc", "--publication", "pub", "--messages", "--two-phase"]
    args += ["--proto-version", str(proto), "--streaming", streaming]
    args += ["--binary"] if binary else []
    got = _tail(pg, *args)
    assert got.decode("utf-8").splitlines() == decoded.expected[True].decode("utf-8").splitlines()
    assert got == decoded.expected[True]


@pytest.mark.parametrize(("proto", "streaming"), [(1, "off"), (2, "on")])
def test_a_two_phase_slot_below_version_3_same_as_test_decoding(
    decoded: Decoded, proto: int, streaming: str
) -> None:
    """A slot created with two_phase sends prepared transactions at PREPARE time in every
    protocol version, without the two_phase option: tail prints them as test_decoding does on
    such a slot (it stopped at the first Begin Prepare; issue 26)."""
    args = ["--slot", "po2pc", "--publication", "pub", "--messages"]
    args += ["--proto-version", str(proto), "--streaming", streaming]
    got = _tail(decoded.pg, *args)
    assert got.decode("utf-8").splitlines() == decoded.expected[True].decode("utf-8").splitlines()


def test_binary_values_of_every_kind_print_as_test_decoding(pg: PgDatabase) -> None:
    """``--binary`` on composites, ranges, multiranges, an enum, a domain, geometric, text
    search and bookkeeping types and arrays of them, printed by the codec itself, and a
    regclass, whose text needs the catalog and comes from the server's own receive and output
    functions: the output is test_decoding's and the stream never stops (it stopped at the
    first composite; issue 26)."""
    pg.execute(
        """
        CREATE TYPE pair AS (a int, b text);
        CREATE TYPE nest AS (p pair, r int4range, tags text[]);
        CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
        CREATE DOMAIN pos AS int CHECK (VALUE > 0);
        CREATE TABLE odd (id int PRIMARY KEY, pr pair, ns nest, rg int4range, nr numrange,
                          ts tstzrange, m mood, d pos, prs pair[], rgs int4range[],
                          pt point, bx box, ls pg_lsn, tv tsvector, mo money,
                          ci circle, tq tsquery, sn pg_snapshot, rc regclass);
        CREATE PUBLICATION podd FOR TABLE odd;
        """
    )
    if pg.major >= 14:
        pg.execute("ALTER TABLE odd ADD COLUMN mr int4multirange")
    for plugin in ("test_decoding", "pgoutput"):
        pg.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (f"odd_{plugin}", plugin))
    pg.execute(
        """
        INSERT INTO odd VALUES
          (1, '(1,"x y")', '("(2,z)","[3,7)","{a,\\"b c\\"}")', '[3,7)', '(1.5,2.25]',
           '["2024-01-01 10:00+00",infinity)', 'happy', 5, ARRAY['(1,a)', NULL, '(,)']::pair[],
           '{"[1,2)",empty}', '(1.5,-2)', '((0,0),(1,1))', '16/B374D848', 'a:1 b:2', '12.34',
           '<(1,2),3>', 'a & !(b | c:*)', '10:20:12', 'odd'),
          (2, NULL, NULL, 'empty', '(,)', NULL, NULL, NULL, '{}', NULL, NULL, NULL, NULL, '',
           NULL, NULL, '', NULL, NULL);
        UPDATE odd SET rg = '(,5]', pr = '(3,)' WHERE id = 1;
        DELETE FROM odd WHERE id = 2;
        """
    )
    if pg.major >= 14:
        pg.execute("UPDATE odd SET mr = '{[1,3), [5,8)}' WHERE id = 1")
    expected = _test_decoding(pg, "odd_test_decoding")
    assert b"pr[pair]:'(1,\"x y\")'" in expected and b"rg[int4range]:'[3,7)'" in expected
    for binary in ([], ["--binary"]):
        got = _tail(pg, "--slot", "odd_pgoutput", "--publication", "podd", *binary)
        assert got.decode().splitlines() == expected.decode().splitlines(), binary


def test_columns_the_publication_does_not_send_are_named(
    pg: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """test_decoding prints stored generated columns; pgoutput sends them only from PostgreSQL
    18 on with ``publish_generated_columns = stored``, and no column outside a column list.
    tail printed such rows without them and said nothing; it now names the columns, and on
    PostgreSQL 18 with the option prints what test_decoding prints."""
    pg.execute(
        "CREATE TABLE g (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED);"
        "CREATE TABLE l (id int PRIMARY KEY, shown text, hidden text);"
        "CREATE PUBLICATION pub FOR TABLE g, l (id, shown)"
    )
    for name, plugin in (("gen_td", "test_decoding"), ("gen_po", "pgoutput")):
        pg.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (name, plugin))
    pg.execute("INSERT INTO g VALUES (1, 21); INSERT INTO l VALUES (1, 'x', 'y')")
    with caplog.at_level("WARNING", logger="pgcdc.tail"):
        got = _tail(pg, "--slot", "gen_po", "--publication", "pub")
    assert b"twice" not in got and b"hidden" not in got
    warned = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len(warned) == 2
    assert warned[0].startswith("public.g: column(s) twice are not sent") and "18" in warned[0]
    assert warned[1].startswith("public.l: column(s) hidden are not sent")
    if pg.major >= 18:
        pg.execute("ALTER PUBLICATION pub SET TABLE g, l")
        pg.execute("ALTER PUBLICATION pub SET (publish_generated_columns = stored)")
        for name, plugin in (("gen_td18", "test_decoding"), ("gen_po18", "pgoutput")):
            pg.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (name, plugin))
        pg.execute("INSERT INTO g VALUES (2, 5); UPDATE l SET hidden = 'z'")
        caplog.clear()
        with caplog.at_level("WARNING", logger="pgcdc.tail"):
            got = _tail(pg, "--slot", "gen_po18", "--publication", "pub")
        assert not [r for r in caplog.records if "not sent" in r.getMessage()]
        assert b"twice[integer]:10" in got and b"hidden[text]:'z'" in got
        assert got == _test_decoding(pg, "gen_td18")
