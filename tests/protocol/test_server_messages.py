"""Decode what real PostgreSQL 15 and 18 servers send, for every message type.

Changes are read through the slot SQL interface (``pg_logical_slot_get_binary_changes``), which
returns exactly one pgoutput message per row, as a walsender's XLogData would carry it.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import psycopg2
import psycopg2.extras
import pytest

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Encoder,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    ReplicationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from tests.fix_pg import PgDatabase

# large and incompressible, so PostgreSQL stores it out of line (TOAST)
_INCOMPRESSIBLE = "".join(f"{(i * 2654435761) % 4294967291:x}" for i in range(2000))


def _slot(pg: PgDatabase, name: str, *, two_phase: bool = False) -> None:
    pg.execute(
        "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)", (name, two_phase)
    )


def _changes(pg: PgDatabase, slot: str, proto: int, **options: str) -> list[tuple[Lsn, bytes]]:
    args: list[str] = ["proto_version", str(proto), "publication_names", "pub"]
    for key, value in options.items():
        args += [key, value]
    placeholders = ", ".join(["%s"] * len(args))
    rows = pg.execute(
        f"SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "  # noqa: S608
        f"{placeholders})",
        (slot, *args),
    )
    return [(Lsn.parse(str(lsn)), bytes(data)) for lsn, data in rows]  # type: ignore[arg-type]


def _decode(rows: list[tuple[Lsn, bytes]], proto: int) -> list[ReplicationMessage]:
    """Decode every row, and check that the encoder reproduces each message byte for byte."""
    decoder = Decoder(proto)
    encoder = Encoder(proto)
    out = []
    for _, data in rows:
        message = decoder.decode(data)
        assert encoder.encode(message) == data, message
        out.append(message)
    assert not decoder.in_stream
    return out


def _kinds(messages: list[ReplicationMessage]) -> list[str]:
    return [type(m).__name__ for m in messages]


def _recent(t: datetime) -> bool:
    return abs(datetime.now(UTC) - t) < timedelta(minutes=5)


@pytest.fixture
def tables(pg: PgDatabase) -> Iterator[PgDatabase]:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, name text, big text, n numeric(10,2), b bytea)")
    pg.execute("CREATE TABLE full_t (id int, v text)")
    pg.execute("ALTER TABLE full_t REPLICA IDENTITY FULL")
    pg.execute("CREATE PUBLICATION pub FOR TABLE t, full_t")
    yield pg


def test_protocol_1_text(tables: PgDatabase) -> None:
    pg = tables
    _slot(pg, "s")
    with pg.connect(autocommit=False) as conn:
        xid = conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO t VALUES (1, 'one', %s, 1.5, '\\x00ff')", (_INCOMPRESSIBLE,))
        conn.execute("INSERT INTO t VALUES (2, NULL, NULL, NULL, NULL)")
        conn.execute("UPDATE t SET name = 'uno' WHERE id = 1")  # big is TOASTed: unchanged
        conn.execute("UPDATE t SET id = 3 WHERE id = 2")  # key change: old key sent
        conn.execute("DELETE FROM t WHERE id = 3")
        conn.execute("INSERT INTO full_t VALUES (1, 'a')")
        conn.execute("UPDATE full_t SET v = 'b'")
        conn.execute("DELETE FROM full_t")
        conn.commit()
    messages = _decode(_changes(pg, "s", 1), 1)
    assert _kinds(messages) == [
        "Begin",
        "Relation",
        "Insert",
        "Insert",
        "Update",
        "Update",
        "Delete",
        "Relation",
        "Insert",
        "Update",
        "Delete",
        "Commit",
    ]
    begin, rel, ins1, ins2, upd1, upd2, del1, rel2, _, upd3, del2, commit = messages
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.xid == xid % (1 << 32)
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
    assert begin.commit_time == commit.commit_time and _recent(commit.commit_time)
    assert isinstance(rel, Relation)
    assert (rel.xid, rel.namespace, rel.name, rel.replica_identity) == (None, "public", "t", "d")
    assert [(c.name, c.type_id, c.type_modifier, c.is_key) for c in rel.columns] == [
        ("id", 23, -1, True),
        ("name", 25, -1, False),
        ("big", 25, -1, False),
        ("n", 1700, (10 << 16 | 2) + 4, False),
        ("b", 17, -1, False),
    ]
    assert ins1 == Insert(None, rel.relation_id, ("1", "one", _INCOMPRESSIBLE, "1.50", "\\x00ff"))
    assert ins2 == Insert(None, rel.relation_id, ("2", None, None, None, None))
    assert upd1 == Update(
        None, rel.relation_id, None, None, ("1", "uno", UNCHANGED_TOAST, "1.50", "\\x00ff")
    )
    # 'K' carries only the key columns, the others as NULL
    assert upd2 == Update(
        None, rel.relation_id, "K", ("2", None, None, None, None), ("3", None, None, None, None)
    )
    assert del1 == Delete(None, rel.relation_id, "K", ("3", None, None, None, None))
    assert isinstance(rel2, Relation) and rel2.replica_identity == "f"
    assert upd3 == Update(None, rel2.relation_id, "O", ("1", "a"), ("1", "b"))
    assert del2 == Delete(None, rel2.relation_id, "O", ("1", "b"))


def test_binary_mode(tables: PgDatabase) -> None:
    pg = tables
    _slot(pg, "s")
    pg.execute("INSERT INTO t VALUES (7, 'seven', NULL, -2.25, '\\x0102')")
    messages = _decode(_changes(pg, "s", 1, binary="true"), 1)
    insert = messages[2]
    assert isinstance(insert, Insert)
    assert insert.new[0] == (7).to_bytes(4, "big")
    assert insert.new[1] == b"seven"
    assert insert.new[2] is None
    assert isinstance(insert.new[3], bytes)  # numeric_send
    assert insert.new[4] == b"\x01\x02"


def test_truncate_options(tables: PgDatabase) -> None:
    pg = tables
    _slot(pg, "s")
    pg.execute("INSERT INTO t VALUES (1)")
    pg.execute("TRUNCATE t, full_t RESTART IDENTITY CASCADE")
    pg.execute("TRUNCATE t")
    messages = _decode(_changes(pg, "s", 1), 1)
    truncates = [m for m in messages if isinstance(m, Truncate)]
    relids = {m.name: m.relation_id for m in messages if isinstance(m, Relation)}
    assert [(m.options, set(m.relation_ids)) for m in truncates] == [
        (3, {relids["t"], relids["full_t"]}),
        (0, {relids["t"]}),
    ]
    assert truncates[0].cascade and truncates[0].restart_identity


def test_logical_messages(tables: PgDatabase) -> None:
    pg = tables
    _slot(pg, "s")
    with pg.connect(autocommit=False) as conn:
        conn.execute("SELECT pg_logical_emit_message(true, 'pfx', 'in txn')")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.commit()
    pg.execute("SELECT pg_logical_emit_message(false, 'other', '\\x00ff'::bytea)")
    # a non-transactional message is not flushed by itself; the next commit flushes it
    pg.execute("INSERT INTO t VALUES (2)")
    messages = _decode(_changes(pg, "s", 1, messages="true"), 1)
    assert _kinds(messages) == [
        "Begin",
        "Message",
        "Relation",
        "Insert",
        "Commit",
        "Message",
        "Begin",
        "Insert",
        "Commit",
    ]
    tx_msg, plain = messages[1], messages[5]
    assert isinstance(tx_msg, Message) and isinstance(plain, Message)
    assert (tx_msg.xid, tx_msg.transactional, tx_msg.prefix, tx_msg.content) == (
        None,
        True,
        "pfx",
        b"in txn",
    )
    assert (plain.transactional, plain.prefix, plain.content) == (False, "other", b"\x00\xff")
    assert tx_msg.lsn < plain.lsn


def test_origin(tables: PgDatabase) -> None:
    pg = tables
    _slot(pg, "s")
    with pg.connect() as conn:
        conn.execute("SELECT pg_replication_origin_create('upstream')")
        conn.execute("SELECT pg_replication_origin_session_setup('upstream')")
        conn.execute("BEGIN")
        conn.execute("SELECT pg_replication_origin_xact_setup('1/ABCDEF', now())")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("COMMIT")
    messages = _decode(_changes(pg, "s", 1), 1)
    assert _kinds(messages)[:2] == ["Begin", "Origin"]
    assert messages[1] == Origin(Lsn("1/ABCDEF"), "upstream")
    if pg.major >= 16:
        assert _kinds(_changes(pg, "s", 4, origin="none")) == []


def test_custom_types(pg: PgDatabase) -> None:
    pg.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    pg.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
    pg.execute("CREATE SCHEMA s")
    pg.execute("CREATE TYPE s.pair AS (a int, b text)")
    pg.execute("CREATE TABLE c (id posint PRIMARY KEY, m mood, p s.pair, ms mood[])")
    pg.execute("CREATE PUBLICATION pub FOR TABLE c")
    _slot(pg, "s")
    pg.execute("INSERT INTO c VALUES (1, 'happy', ROW(1, 'x'), '{sad,ok}')")
    messages = _decode(_changes(pg, "s", 1), 1)
    types = {m.name: m for m in messages if isinstance(m, Type)}
    # a domain's Type message carries the domain's OID but its base type's name
    # (logicalrep_write_typ looks up getBaseType(typoid)): pg_catalog is sent as ''
    assert {(t.namespace, t.name) for t in types.values()} == {
        ("public", "mood"),
        ("", "int4"),
        ("s", "pair"),
        ("public", "_mood"),
    }
    (posint,) = pg.execute("SELECT 'posint'::regtype::oid::int")[0]
    rel = next(m for m in messages if isinstance(m, Relation))
    assert types["int4"].type_id == posint
    assert [c.type_id for c in rel.columns] == [
        posint,
        types["mood"].type_id,
        types["pair"].type_id,
        types["_mood"].type_id,
    ]
    insert = next(m for m in messages if isinstance(m, Insert))
    assert insert.new == ("1", "happy", "(1,x)", "{sad,ok}")


def _big_txn(conn: psycopg.Connection[tuple[object, ...]], start: int, rows: int = 3000) -> None:
    conn.execute(
        "INSERT INTO t SELECT g, repeat('v', 20) FROM generate_series(%s::int, %s::int) g",
        (start, start + rows - 1),
    )


@pytest.mark.parametrize("proto", [2, 4])
def test_streaming(tables: PgDatabase, proto: int) -> None:
    pg = tables
    _slot(pg, "s")
    if proto == 4 and pg.major < 16:
        # PostgreSQL 15 knows protocol versions 1 to 3 only, and says so
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="proto_version=4"):
            _changes(pg, "s", 4, streaming="on")
        return
    with pg.connect(autocommit=False) as conn:
        xid = conn.execute("SELECT txid_current()").fetchone()[0] % (1 << 32)  # type: ignore[index]
        _big_txn(conn, 1)
        conn.execute("SAVEPOINT sp")
        _big_txn(conn, 10_000)
        conn.execute("ROLLBACK TO SAVEPOINT sp")
        _big_txn(conn, 20_000)
        conn.commit()
    streaming = "parallel" if proto == 4 else "on"
    messages = _decode(_changes(pg, "s", proto, streaming=streaming), proto)
    starts = [m for m in messages if isinstance(m, StreamStart)]
    assert starts and starts[0] == StreamStart(xid, True)
    assert all(not s.first_segment for s in starts[1:] if s.xid == xid)
    assert sum(isinstance(m, StreamStop) for m in messages) == len(starts)
    t_id = next(m.relation_id for m in messages if isinstance(m, Relation) and m.name == "t")
    inserts = [m for m in messages if isinstance(m, Insert) and m.relation_id == t_id]
    assert all(m.xid is not None for m in inserts)
    assert {m.xid for m in inserts if m.new[0] == "1"} == {xid}
    # changes inside a subtransaction carry the subtransaction's xid
    subxids = {m.xid for m in inserts if m.new[0] == "10000"}
    assert len(subxids) == 1 and subxids != {xid}
    aborts = [m for m in messages if isinstance(m, StreamAbort)]
    sub_abort = next(a for a in aborts if a.xid == xid)
    assert sub_abort.subxid in subxids
    _check_abort_info(sub_abort, proto)
    commit = next(m for m in messages if isinstance(m, StreamCommit))
    assert commit.xid == xid and commit.flags == 0 and commit.commit_lsn < commit.end_lsn


def _check_abort_info(abort: StreamAbort, proto: int) -> None:
    if proto == 4:  # abort LSN and time only with streaming = parallel
        assert abort.abort_lsn is not None and abort.abort_time is not None
        assert _recent(abort.abort_time)
    else:
        assert abort.abort_lsn is None and abort.abort_time is None


def _walsender_messages(pg: PgDatabase, options: dict[str, str]) -> Iterator[ReplicationMessage]:
    """Messages from a real walsender (psycopg2's replication connection), as they arrive."""
    conn = psycopg2.connect(
        pg.dsn(), connection_factory=psycopg2.extras.LogicalReplicationConnection
    )
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name="s", decode=False, options=options)
        decoder = Decoder(int(options["proto_version"]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = cur.read_message()
            if msg is None:
                select.select([cur], [], [], 0.5)
                continue
            yield decoder.decode(msg.payload)
        raise AssertionError("the walsender did not send the expected message within 60 s")
    finally:
        conn.close()


@pytest.mark.parametrize("proto", [2, 4])
def test_stream_abort_top_level(tables: PgDatabase, proto: int) -> None:
    """A streamed transaction rolled back while the walsender streams it: Stream Abort.

    PostgreSQL 18 no longer streams a transaction already known to be aborted when it is
    decoded, so this needs one live walsender decoding while the transaction is still open.
    """
    pg = tables
    _slot(pg, "s")
    if proto == 4 and pg.major < 16:
        return  # covered by test_streaming's check that PostgreSQL 15 refuses version 4
    options = {
        "proto_version": str(proto),
        "publication_names": "pub",
        "streaming": "parallel" if proto == 4 else "on",
    }
    stream = _walsender_messages(pg, options)
    with pg.connect(autocommit=False) as conn:
        xid = conn.execute("SELECT txid_current()").fetchone()[0] % (1 << 32)  # type: ignore[index]
        _big_txn(conn, 1)
        first = next(stream)
        assert first == StreamStart(xid, True)
        while not isinstance(next(stream), StreamStop):
            pass
        conn.rollback()
    pg.execute("INSERT INTO full_t VALUES (0)")  # an abort record is not flushed by itself
    abort = next(m for m in stream if isinstance(m, StreamAbort))
    stream.close()
    assert abort.xid == abort.subxid == xid
    _check_abort_info(abort, proto)


def _commit_and_roll_back_prepared(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Two prepared transactions: 'gid-1' (id 1) committed, 'gid-2' (id 2) rolled back."""
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.execute("PREPARE TRANSACTION 'gid-1'")
    conn.execute("COMMIT PREPARED 'gid-1'")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES (2)")
    conn.execute("PREPARE TRANSACTION 'gid-2'")
    conn.execute("ROLLBACK PREPARED 'gid-2'")


def test_two_phase(tables: PgDatabase) -> None:
    pg = tables
    _slot(pg, "s", two_phase=True)
    with pg.connect() as conn:
        _commit_and_roll_back_prepared(conn)
    messages = _decode(_changes(pg, "s", 3, two_phase="true"), 3)
    assert _kinds(messages) == [
        "BeginPrepare",
        "Relation",
        "Insert",
        "Prepare",
        "CommitPrepared",
        "BeginPrepare",
        "Insert",
        "Prepare",
        "RollbackPrepared",
    ]
    bp, _, _, prep, cp, bp2, _, prep2, rp = messages
    assert isinstance(bp, BeginPrepare) and isinstance(prep, Prepare)
    assert isinstance(cp, CommitPrepared) and isinstance(rp, RollbackPrepared)
    assert isinstance(bp2, BeginPrepare) and isinstance(prep2, Prepare)
    assert bp.gid == prep.gid == cp.gid == "gid-1"
    assert bp.xid == prep.xid == cp.xid
    assert (bp.prepare_lsn, bp.end_lsn) == (prep.prepare_lsn, prep.end_lsn)
    assert cp.commit_lsn >= prep.end_lsn and _recent(cp.commit_time)
    assert rp.gid == "gid-2" and rp.xid == prep2.xid
    assert rp.prepare_end_lsn == prep2.end_lsn and rp.rollback_end_lsn > rp.prepare_end_lsn
    assert rp.prepare_time == prep2.prepare_time <= rp.rollback_time


@pytest.mark.parametrize("proto", [1, 2, 3])
def test_a_two_phase_slot_sends_prepares_in_every_version(tables: PgDatabase, proto: int) -> None:
    """A slot created with two_phase decodes prepared transactions at PREPARE time whatever
    the protocol version and without the two_phase option (logical.c keeps the slot's
    state); Stream Prepare comes with streaming, from version 2 (issue 26)."""
    pg = tables
    _slot(pg, "s", two_phase=True)
    with pg.connect() as conn:
        _commit_and_roll_back_prepared(conn)
        if proto >= 2:
            conn.execute("BEGIN")
            _big_txn(conn, 10)
            conn.execute("PREPARE TRANSACTION 'big'")
            conn.execute("COMMIT PREPARED 'big'")
    options = {"streaming": "on"} if proto >= 2 else {}
    messages = _decode(_changes(pg, "s", proto, **options), proto)
    kinds = [
        k
        for k in _kinds(messages)
        if k in {"BeginPrepare", "Prepare", "StreamPrepare", "CommitPrepared", "RollbackPrepared"}
    ]
    expected = ["BeginPrepare", "Prepare", "CommitPrepared", "BeginPrepare", "Prepare"]
    expected += ["RollbackPrepared"]
    if proto >= 2:
        expected += ["StreamPrepare", "CommitPrepared"]
    assert kinds == expected
    gids = [m.gid for m in messages if isinstance(m, (Prepare, StreamPrepare, CommitPrepared))]
    assert gids == ["gid-1", "gid-1", "gid-2"] + (["big", "big"] if proto >= 2 else [])


def test_stream_prepare(tables: PgDatabase) -> None:
    pg = tables
    _slot(pg, "s", two_phase=True)
    with pg.connect() as conn:
        conn.execute("BEGIN")
        _big_txn(conn, 1)
        conn.execute("PREPARE TRANSACTION 'big'")
        conn.execute("COMMIT PREPARED 'big'")
    messages = _decode(_changes(pg, "s", 3, two_phase="true", streaming="on"), 3)
    sp = next(m for m in messages if isinstance(m, StreamPrepare))
    cp = next(m for m in messages if isinstance(m, CommitPrepared))
    assert sp.gid == cp.gid == "big" and sp.xid == cp.xid
    assert isinstance(messages[0], StreamStart) and messages[0].xid == sp.xid


def test_relation_in_stream_carries_xid(tables: PgDatabase) -> None:
    pg = tables
    _slot(pg, "s")
    with pg.connect(autocommit=False) as conn:
        _big_txn(conn, 1)
        conn.commit()
    messages = _decode(_changes(pg, "s", 2, streaming="on"), 2)
    assert isinstance(messages[0], StreamStart)
    rel = messages[1]
    assert isinstance(rel, Relation) and rel.xid == messages[0].xid
