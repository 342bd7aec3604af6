"""The assembler on what real PostgreSQL 15 and 18 servers send, read through the SQL interface.

``pg_logical_slot_{get,peek}_binary_changes`` returns one pgoutput message per row with its LSN,
exactly what a walsender sends as XLogData. With ``logical_decoding_work_mem = 64kB`` (the test
servers' setting) a transaction of a few thousand rows is streamed in blocks.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from pgcdc.decoding import Assembler
from pgcdc.lsn import Lsn
from tests.decoding.wire import (
    FullRecorder,
    Recorder,
    StreamRecorder,
    StreamTwoPhaseRecorder,
    TwoPhaseRecorder,
)
from tests.fix_pg import PgDatabase

Conn = psycopg.Connection[tuple[object, ...]]


def _proto(pg: PgDatabase) -> int:
    return 4 if pg.major >= 16 else 3


def _streaming(pg: PgDatabase) -> str:
    return "parallel" if pg.major >= 16 else "on"


def read(
    pg: PgDatabase,
    slot: str = "s",
    *,
    peek: bool = False,
    conn: Conn | None = None,
    **options: str,
) -> list[tuple[bytes, int]]:
    """Every pending message of the slot as (payload, lsn)."""
    args = ["proto_version", str(_proto(pg)), "publication_names", "pub"]
    for key, value in options.items():
        args += [key, value]
    function = (
        "pg_logical_slot_peek_binary_changes" if peek else "pg_logical_slot_get_binary_changes"
    )
    query = sql.SQL("SELECT lsn::text, data FROM {}(%s, NULL, NULL, {})").format(
        sql.Identifier(function), sql.SQL(", ").join([sql.Placeholder()] * len(args))
    )
    if conn is None:
        rows = pg.execute(query, (slot, *args))
    else:
        rows = conn.execute(query, (slot, *args)).fetchall()
    return [(bytes(data), Lsn.parse(str(lsn))) for lsn, data in rows]  # type: ignore[call-overload]


def feed(asm: Assembler, items: list[tuple[bytes, int]]) -> None:
    for payload, lsn in items:
        asm.feed_message(payload, lsn)


def kinds(items: list[tuple[bytes, int]]) -> str:
    return "".join(chr(p[0]) for p, _ in items)


@pytest.fixture
def db(pg: PgDatabase) -> Iterator[PgDatabase]:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE u (id int PRIMARY KEY, w text)")
    pg.execute("CREATE PUBLICATION pub FOR TABLE t, u")
    yield pg


def _slot(pg: PgDatabase, *, two_phase: bool = False) -> None:
    pg.execute(
        "SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, %s)", (two_phase,)
    )


def _insert(conn: Conn, first: int, count: int, value: str, table: str = "t") -> None:
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, %s FROM generate_series(%s::int, %s::int) g").format(
            sql.Identifier(table)
        ),
        (value, first, first + count - 1),
    )


def _ids(rows: list[tuple[object, ...]]) -> list[int]:
    return [int(str(r[0])) for r in rows]


def test_streamed_transactions_with_savepoints(db: PgDatabase) -> None:
    """Interleaved streamed transactions, nested savepoints rolled back, a small commit
    in between: delivered whole, in commit order, without the rolled-back rows."""
    pg = db
    _slot(pg)
    with pg.connect(autocommit=False) as a, pg.connect(autocommit=False) as b:
        _insert(a, 1, 1500, "a-top")
        _insert(b, 100_000, 1500, "b-top", "u")
        a.execute("SAVEPOINT s1")
        _insert(a, 10_000, 1500, "a-s1")
        a.execute("SAVEPOINT s2")
        _insert(a, 20_000, 1500, "a-s2")
        a.execute("ROLLBACK TO SAVEPOINT s1")  # drops s2 and s1's work
        _insert(a, 30_000, 500, "a-s1-again")
        a.execute("RELEASE SAVEPOINT s1")
        a.execute("SAVEPOINT s3")
        _insert(a, 40_000, 1500, "a-s3")
        a.execute("SAVEPOINT s4")
        _insert(a, 50_000, 1500, "a-s4")
        a.execute("ROLLBACK TO SAVEPOINT s4")  # drops s4 only
        a.execute("RELEASE SAVEPOINT s3")
        _insert(b, 101_500, 1500, "b-more", "u")
        pg.execute("INSERT INTO t VALUES (0, 'small')")
        b.commit()
        _insert(a, 60_000, 100, "a-last")
        a.commit()
    items = read(pg, streaming=_streaming(pg))
    k = kinds(items)
    assert k.count("S") > 2 and "A" in k and "c" in k  # streamed, with subtransaction aborts
    starts = [p for p, _ in items if p[0] == ord("S")]
    assert len({p[1:5] for p in starts}) == 2  # blocks of both transactions

    p = Recorder()
    asm = Assembler(p, proto_version=_proto(pg), memory_limit=256 * 1024)
    feed(asm, items)
    small, b_xid, a_xid = p.order()
    assert p.rows(small) == [("0", "small")]
    expected_a = [
        *range(1, 1501),
        *range(30_000, 30_500),
        *range(40_000, 41_500),
        *range(60_000, 60_100),
    ]
    assert [int(str(r[0])) for r in p.rows(a_xid)] == expected_a
    assert [int(str(r[0])) for r in p.rows(b_xid)] == list(range(100_000, 103_000))
    # what was delivered is exactly what the tables hold, in commit order
    assert sorted([int(str(r[0])) for r in p.rows()]) == sorted(
        _ids(pg.execute("SELECT id FROM t UNION ALL SELECT id FROM u"))
    )
    assert all(t.streamed for t in p.txns[1:]) and not p.txns[0].streamed
    assert asm.spilled_bytes > 0 and asm.memory_bytes == 0 and asm.open_transactions == 0

    # a streaming plugin gets the blocks live and, following StreamAbortInfo, ends up with the
    # same rows
    live = StreamRecorder()
    feed(Assembler(live, proto_version=_proto(pg)), items)
    assert [int(str(r[0])) for r in live.applied[a_xid]] == expected_a
    assert [e[0] for e in live.events if e[0] in ("begin", "commit")] == ["begin", "commit"]


def test_streamed_transaction_aborted(db: PgDatabase) -> None:
    pg = db
    _slot(pg)
    with pg.connect(autocommit=False) as a:
        _insert(a, 1, 3000, "doomed")
        pg.execute("INSERT INTO u VALUES (0, 'flush')")  # flushes the WAL written so far
        # read while the transaction is open: its blocks are streamed already
        early = read(pg, peek=True, streaming=_streaming(pg))
        a.rollback()
    pg.execute("INSERT INTO t VALUES (0, 'after')")
    items = read(pg, streaming=_streaming(pg))
    assert kinds(early).startswith("SR")
    p = Recorder()
    asm = Assembler(p, proto_version=_proto(pg))
    feed(asm, items)
    assert p.rows() == [("0", "flush"), ("0", "after")]
    if "A" in kinds(items):  # PostgreSQL 15 streams it, then aborts it
        assert asm.stats.aborted == 1


def test_prepared_transactions(db: PgDatabase) -> None:
    pg = db
    _slot(pg, two_phase=True)
    with pg.connect() as conn:
        conn.execute("BEGIN")
        _insert(conn, 1, 5, "prepared")
        conn.execute("PREPARE TRANSACTION 'small'")
        conn.execute("BEGIN")
        _insert(conn, 100, 5, "rolled back")
        conn.execute("PREPARE TRANSACTION 'doomed'")
        conn.execute("BEGIN")
        _insert(conn, 1000, 3000, "big")  # streamed, then stream-prepared
        conn.execute("SAVEPOINT s")
        _insert(conn, 10_000, 1000, "sub, rolled back")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.execute("PREPARE TRANSACTION 'big'")
        conn.execute("INSERT INTO t VALUES (0, 'plain')")
        conn.execute("COMMIT PREPARED 'big'")
        conn.execute("ROLLBACK PREPARED 'doomed'")
        conn.execute("COMMIT PREPARED 'small'")
    items = read(pg, two_phase="on", streaming="on")
    k = kinds(items)
    assert "b" in k and "p" in k and "K" in k and "r" in k

    # without two-phase callbacks: ordinary transactions at COMMIT PREPARED
    plain = Recorder()
    feed(Assembler(plain, proto_version=_proto(pg)), items)
    first, big, small = plain.order()
    assert plain.rows(first) == [("0", "plain")]
    assert _ids(plain.rows(big)) == list(range(1000, 4000))
    assert _ids(plain.rows(small)) == list(range(1, 6))
    assert [t.gid for t in plain.txns] == [None, "big", "small"]

    # with them: at PREPARE time
    two = TwoPhaseRecorder()
    feed(Assembler(two, proto_version=_proto(pg)), items)
    events = [e[:3] for e in two.events if e[0] not in ("change", "schema")]
    assert [e[0] for e in events] == [
        "begin_prepare",
        "prepare",  # small
        "begin_prepare",
        "prepare",  # doomed
        "begin_prepare",
        "prepare",  # big (streamed, delivered at its Stream Prepare)
        "begin",
        "commit",
        "commit_prepared",
        "rollback_prepared",
        "commit_prepared",
    ]
    assert [e[2] for e in events if e[0] == "prepare"] == ["small", "doomed", "big"]

    # a streaming two-phase plugin: stream_prepare
    live = StreamTwoPhaseRecorder()
    feed(Assembler(live, proto_version=_proto(pg)), items)
    assert [e[2] for e in live.events if e[0] == "stream_prepare"] == ["big"]


def test_commit_prepared_after_reconnect(db: PgDatabase) -> None:
    """A prepared transaction held by pgcdc is never confirmed past: after a reconnect (or in
    a new process) the server sends it again with its COMMIT PREPARED."""
    pg = db
    _slot(pg, two_phase=True)
    with pg.connect() as conn:
        conn.execute("BEGIN")
        _insert(conn, 1, 3, "prepared")
        conn.execute("PREPARE TRANSACTION 'g'")
        conn.execute("INSERT INTO t VALUES (0, 'plain')")
    p = Recorder()
    asm = Assembler(p, proto_version=_proto(pg))
    feed(asm, read(pg, peek=True, two_phase="on"))
    ((xid, gid, prepare_lsn),) = asm.held_prepared
    assert gid == "g" and p.rows() == [("0", "plain")]
    safe = asm.safe_confirm_lsn(asm.durable_lsn)
    assert prepare_lsn is not None and safe == prepare_lsn < asm.durable_lsn
    pg.execute("SELECT pg_replication_slot_advance('s', %s::text::pg_lsn)", (str(safe),))
    pg.execute("COMMIT PREPARED 'g'")

    # same process, after a reconnect: the resent prepare is recognised
    asm.reconnected(safe)
    items = read(pg, peek=True, two_phase="on")
    assert kinds(items).startswith("b")  # the server sent the prepared transaction again
    feed(asm, items)
    assert p.order()[-1] == xid and _ids(p.rows(xid)) == [1, 2, 3]
    assert len(p.order()) == 2  # 'plain' was not delivered twice

    # a new process: everything after the confirmed position, the prepared transaction whole
    again = Recorder()
    feed(Assembler(again, proto_version=_proto(pg)), items)
    assert again.order()[-1] == xid and _ids(again.rows(xid)) == [1, 2, 3]


def test_truncate_messages_and_schema_change(db: PgDatabase) -> None:
    pg = db
    _slot(pg)
    pg.execute("INSERT INTO t VALUES (1, 'one')")
    with pg.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_logical_emit_message(true, 'pfx', 'in txn')")
        conn.execute("INSERT INTO t VALUES (2, 'two')")
        conn.execute("TRUNCATE t, u")
        conn.execute("COMMIT")
    pg.execute("SELECT pg_logical_emit_message(false, 'pfx', 'plain')")
    pg.execute("ALTER TABLE t ADD COLUMN w int")
    pg.execute("ALTER TABLE t ALTER COLUMN v TYPE varchar(20)")
    pg.execute("INSERT INTO t VALUES (3, 'three', 33)")
    p = FullRecorder()
    feed(Assembler(p, proto_version=_proto(pg)), read(pg, messages="true"))
    names = [e[0] for e in p.events]
    assert names == [
        "begin",
        "change",
        "commit",
        "begin",
        "message",
        "change",
        "truncate",
        "commit",
        "message",
        "begin",
        "schema",
        "change",
        "commit",
    ]
    truncate = next(e for e in p.events if e[0] == "truncate")
    assert set(truncate[3]) == {"t", "u"} and truncate[2] == 2  # after the message and insert
    schema = next(e for e in p.events if e[0] == "schema")
    assert schema[2:] == ("t", ("w",), (), ("v",))
    (change,) = p.schema
    assert change.retyped[0][1].type_name == "varchar"
    assert change.retyped[0][1].type_modifier == 24  # varchar(20): 20 + VARHDRSZ
    last = p.changes[-1]
    assert last.raw_values() == {"id": "3", "v": "three", "w": "33"}


def test_origin_filter(db: PgDatabase) -> None:
    pg = db
    _slot(pg)
    with pg.connect() as conn:
        conn.execute("SELECT pg_replication_origin_create('upstream')")
        conn.execute("SELECT pg_replication_origin_session_setup('upstream')")
        conn.execute("BEGIN")
        conn.execute("SELECT pg_replication_origin_xact_setup('1/ABCDEF', now())")
        conn.execute("INSERT INTO t VALUES (1, 'replayed')")
        conn.execute("COMMIT")
        conn.execute("SELECT pg_replication_origin_session_reset()")
    pg.execute("INSERT INTO t VALUES (2, 'local')")
    items = read(pg)
    kept = FullRecorder()
    feed(Assembler(kept, proto_version=_proto(pg)), items)
    assert [t.origin for t in kept.txns] == ["upstream", None]
    assert kept.txns[0].origin_lsn == Lsn("1/ABCDEF")
    skipping = FullRecorder(skip_origins=("upstream",))
    asm = Assembler(skipping, proto_version=_proto(pg))
    feed(asm, items)
    assert skipping.rows() == [("2", "local")] and asm.stats.filtered == 1


def test_immediate_streaming_in_the_reading_session(db: PgDatabase) -> None:
    """PostgreSQL 16+: the SQL interface decodes in the calling backend, so a session-level
    ``debug_logical_replication_streaming = immediate`` streams even a three-row transaction
    (one block per change); PostgreSQL 15 does not have the setting."""
    pg = db
    _slot(pg)
    with pg.connect() as conn:
        conn.execute("BEGIN")
        _insert(conn, 1, 3, "x")
        conn.execute("SAVEPOINT s")
        _insert(conn, 10, 3, "rolled back")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        _insert(conn, 20, 1, "y")
        conn.execute("COMMIT")
    with pg.connect() as reader:
        if pg.major < 16:
            with pytest.raises(psycopg.errors.UndefinedObject):
                reader.execute("SET debug_logical_replication_streaming = immediate")
            return
        reader.execute("SET debug_logical_replication_streaming = immediate")
        items = read(pg, conn=reader, streaming="on")
    k = kinds(items)
    assert k.count("S") >= 4 and "A" in k and k.endswith("c")
    p = Recorder()
    feed(Assembler(p, proto_version=_proto(pg)), items)
    assert _ids(p.rows()) == [1, 2, 3, 20]
