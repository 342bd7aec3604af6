"""Reading changes through ReplicationSession with each option the servers support."""

from __future__ import annotations

import pathlib
import struct
import time

import pytest

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Update,
)
from pgcdc.replication import (
    ReplicationSession,
    StreamOptions,
    UnsupportedOptionError,
    WalData,
    create_publication,
    create_slot_with_snapshot,
    max_proto_version,
)
from tests.fix_pg import PgDatabase
from tests.replication.streams import FAST, commits_at_least, read, setup_table

BIG = 3000  # rows: far more than logical_decoding_work_mem (64kB) holds, so it gets streamed


def _session(pg: PgDatabase, **options: object) -> ReplicationSession:
    return ReplicationSession(
        pg.dsn(), "s", StreamOptions(publication_names=("pub",), **options), **FAST
    )


@pytest.mark.parametrize("proto", [1, 2, 3, 4, None])
def test_each_protocol_version(pg: PgDatabase, proto: int | None) -> None:
    setup_table(pg)
    session = _session(pg, proto_version=proto)
    highest = max_proto_version(pg.major * 10000)
    assert highest == (3 if pg.major == 15 else 4)
    if proto is not None and proto > highest:
        with pytest.raises(UnsupportedOptionError) as err:
            session.connect()
        assert f"proto_version {proto} is not supported by PostgreSQL {pg.major}" in str(err.value)
        assert f"proto_version={highest}" in str(err.value)
        return
    with session:
        assert session.proto_version == (proto or highest)
        assert session.server_version // 10000 == pg.major
        pg.execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
        pg.execute("UPDATE t SET v = 'uno' WHERE id = 1")
        pg.execute("DELETE FROM t WHERE id = 2")
        got = read(session, commits_at_least(3))
    kinds = [type(m).__name__ for m in got.messages]
    assert kinds == [
        "Begin", "Relation", "Insert", "Insert", "Commit",
        "Begin", "Update", "Commit",
        "Begin", "Delete", "Commit",
    ]  # fmt: skip
    relation = got.of(Relation)[0]
    assert (relation.namespace, relation.name) == ("public", "t")
    assert [c.name for c in relation.columns] == ["id", "v"]
    assert [m.new for m in got.of(Insert)] == [("1", "one"), ("2", "two")]
    assert got.of(Update)[0].new == ("1", "uno")
    assert got.of(Delete)[0].old == ("2", None)
    # XLogData positions: a Commit's dataStart is its end_lsn; Relation comes with dataStart 0
    for data, msg in zip(got.data, got.messages, strict=True):
        if isinstance(msg, Commit):
            assert data.data_start == msg.end_lsn
        if isinstance(msg, Relation):
            assert data.data_start == 0
    begins = got.of(Begin)
    assert [b.final_lsn for b in begins] == [c.commit_lsn for c in got.commits]


@pytest.mark.parametrize("binary", [False, True])
def test_binary(pg: PgDatabase, binary: bool) -> None:
    setup_table(pg)
    with _session(pg, binary=binary) as session:
        pg.execute("INSERT INTO t VALUES (7, 'seven')")
        got = read(session, commits_at_least(1))
    (insert,) = got.of(Insert)
    if binary:
        assert insert.new == ((7).to_bytes(4, "big"), b"seven")
    else:
        assert insert.new == ("7", "seven")


@pytest.mark.parametrize("messages", [False, True])
def test_messages(pg: PgDatabase, messages: bool) -> None:
    setup_table(pg)
    with _session(pg, messages=messages) as session:
        with pg.connect() as conn, conn.transaction():
            conn.execute("SELECT pg_logical_emit_message(true, 'pfx', 'in a transaction')")
            conn.execute("INSERT INTO t VALUES (1, 'x')")
        pg.execute("SELECT pg_logical_emit_message(false, 'pfx', 'on its own')")
        pg.execute("INSERT INTO t VALUES (2, 'marker')")
        got = read(session, lambda r: 2 in r.inserted_ids())
    found = [(m.transactional, m.prefix, m.content) for m in got.of(Message)]
    if messages:
        assert found == [(True, "pfx", b"in a transaction"), (False, "pfx", b"on its own")]
        # a non-transactional message's dataStart is the end of its WAL record (= its lsn)
        data = [d for d, m in zip(got.data, got.messages, strict=True) if isinstance(m, Message)]
        assert data[1].data_start == got.of(Message)[1].lsn
    else:
        assert found == []
    assert got.inserted_ids() == [1, 2]


def _big_transaction(pg: PgDatabase, *, commit: bool = True) -> None:
    with pg.connect() as conn:
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1000, %s) g",
            (1000 + BIG - 1,),
        )
        conn.execute("COMMIT" if commit else "ROLLBACK")


@pytest.mark.parametrize("streaming", ["on", "parallel"])
def test_streaming(pg: PgDatabase, streaming: str) -> None:
    setup_table(pg)
    session = _session(pg, streaming=streaming)
    if streaming == "parallel" and pg.major < 16:
        with pytest.raises(
            UnsupportedOptionError, match=r"streaming='parallel' needs PostgreSQL 16"
        ):
            session.connect()
        return
    with session, pg.connect() as aborted:
        # abort only once blocks were streamed (PostgreSQL 18 skips already-aborted ones)
        aborted.execute("BEGIN")
        aborted.execute(
            "INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(-%s, -1) g", (BIG,)
        )
        got = read(session, lambda r: bool(r.of(StreamStart)))
        aborted.execute("ROLLBACK")
        _big_transaction(pg)
        pg.execute("INSERT INTO t VALUES (1, 'small')")
        read(
            session,
            lambda r: 1 in r.inserted_ids() and isinstance(r.messages[-1], Commit),
            reading=got,
        )
    starts = got.of(StreamStart)
    assert len(starts) >= 4  # two transactions, each in more than one block
    assert len(got.of(StreamStop)) == len(starts)
    (abort,) = got.of(StreamAbort)
    (commit,) = got.of(StreamCommit)
    assert abort.xid != commit.xid
    if streaming == "parallel":
        assert abort.abort_lsn is not None  # protocol 4 + parallel sends the abort position
    else:
        assert abort.abort_lsn is None
    streamed = [m for m in got.of(Insert) if m.xid == commit.xid]
    assert len(streamed) == BIG
    assert all(m.xid == abort.xid for m in got.of(Insert) if int(str(m.new[0])) < 0)
    # the small transaction is an ordinary one
    assert got.inserted_ids()[-1] == 1
    assert isinstance(got.messages[-1], Commit)


def test_no_streaming_sends_whole_transactions(pg: PgDatabase) -> None:
    setup_table(pg)
    with _session(pg) as session:
        _big_transaction(pg)
        got = read(session, commits_at_least(1))
    assert got.of(StreamStart) == []
    assert len(got.of(Insert)) == BIG


def test_two_phase(pg: PgDatabase) -> None:
    setup_table(pg, slot=None)
    pg.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, true)")
    with _session(pg, two_phase=True) as session:
        with pg.connect() as conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (1, 'prepared')")
            conn.execute("PREPARE TRANSACTION 'gid1'")
            conn.execute("COMMIT PREPARED 'gid1'")
        got = read(session, lambda r: bool(r.of(CommitPrepared)))
    (begin,) = got.of(BeginPrepare)
    (prepare,) = got.of(Prepare)
    (commit,) = got.of(CommitPrepared)
    assert begin.gid == prepare.gid == commit.gid == "gid1"
    assert got.inserted_ids() == [1]


def test_two_phase_needs_protocol_3(pg: PgDatabase) -> None:
    setup_table(pg)
    with pytest.raises(UnsupportedOptionError, match="two_phase needs protocol version 3"):
        _session(pg, two_phase=True, proto_version=2).connect()


def test_origin(pg: PgDatabase) -> None:
    setup_table(pg)
    if pg.major < 16:
        with pytest.raises(UnsupportedOptionError, match="origin option needs PostgreSQL 16"):
            _session(pg, origin="none").connect()
        return
    pg.execute("SELECT pg_create_logical_replication_slot('s_any', 'pgoutput')")
    with (
        _session(pg, origin="none") as only_local,
        ReplicationSession(
            pg.dsn(), "s_any", StreamOptions(("pub",), origin="any"), **FAST
        ) as everything,
    ):
        with pg.connect() as conn:
            conn.execute("SELECT pg_replication_origin_create('elsewhere')")
            conn.execute("SELECT pg_replication_origin_session_setup('elsewhere')")
            with conn.transaction():
                conn.execute("SELECT pg_replication_origin_xact_setup('0/10', now())")
                conn.execute("INSERT INTO t VALUES (1, 'replicated')")
        pg.execute("INSERT INTO t VALUES (2, 'local')")
        local = read(only_local, lambda r: 2 in r.inserted_ids())
        both = read(everything, lambda r: 2 in r.inserted_ids())
    assert local.inserted_ids() == [2]
    assert both.inserted_ids() == [1, 2]
    assert [o.name for o in both.of(Origin)] == ["elsewhere"]


def test_publication_names_are_quoted(pg: PgDatabase) -> None:
    """Names with capitals, commas and quotes reach pgoutput intact."""
    pg.execute("CREATE TABLE a (id int PRIMARY KEY)")
    pg.execute("CREATE TABLE b (id int PRIMARY KEY)")
    pg.execute('CREATE PUBLICATION "Pub, ""One""" FOR TABLE a')
    pg.execute('CREATE PUBLICATION "pub two ü" FOR TABLE b')
    pg.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    options = StreamOptions(publication_names=('Pub, "One"', "pub two ü"))
    with ReplicationSession(pg.dsn(), "s", options, **FAST) as session:
        pg.execute("INSERT INTO a VALUES (1)")
        pg.execute("INSERT INTO b VALUES (2)")
        got = read(session, commits_at_least(2))
    assert [r.name for r in got.of(Relation)] == ["a", "b"]
    assert got.inserted_ids() == [1, 2]


def test_start_lsn_skips_earlier_transactions(pg: PgDatabase) -> None:
    setup_table(pg)
    pg.execute("INSERT INTO t VALUES (1, 'before')")
    middle = Lsn.parse(str(pg.execute("SELECT pg_current_wal_lsn()::text")[0][0]))
    pg.execute("INSERT INTO t VALUES (2, 'after')")
    session = ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), start_lsn=middle, **FAST)
    with session:
        got = read(session, commits_at_least(1))
    assert got.inserted_ids() == [2]


def test_events_resume_after_the_consumer_breaks_out(pg: PgDatabase) -> None:
    setup_table(pg)
    pg.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 5) g")
    with _session(pg) as session:
        first = []
        for event in session.events():
            if isinstance(event, WalData):
                first.append(event)
            if len(first) == 3:
                break
        second = read(session, commits_at_least(1))
    assert len(first) + len(second.data) == 8  # Begin, Relation, 5 Inserts, Commit


def test_options_validation() -> None:
    with pytest.raises(TypeError, match="not the string"):
        StreamOptions(publication_names="pub")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        StreamOptions(publication_names=())
    with pytest.raises(ValueError, match="proto_version must be"):
        StreamOptions(("p",), proto_version=5)
    with pytest.raises(ValueError, match="streaming must be"):
        StreamOptions(("p",), streaming="maybe")  # type: ignore[arg-type]


def test_psycopg2_is_only_in_the_copy_module() -> None:
    """Only the copy module (COPY's C loop) imports psycopg2; the replication connection is
    libpq through psycopg 3 (psycopg2's replication loop advanced the slot on its own)."""
    root = pathlib.Path(__file__).resolve().parents[2] / "src" / "pgcdc"
    importers = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "import psycopg2" in p.read_text() or "from psycopg2" in p.read_text()
    )
    assert importers == ["replication/copy.py"]


def _t1_and_t2_within_a(pg: PgDatabase) -> None:
    """Slot "s" over table t; transaction A (40,001 rows of 1 kB: more than the socket buffers
    hold) begins, T1 and T2 commit, then A commits."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    with pg.connect(autocommit=False) as a:
        a.execute(
            "INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(1000000, 1040000) g"
        )
        pg.execute("INSERT INTO t VALUES (1, 'T1')")
        pg.execute("INSERT INTO t VALUES (2, 'T2')")
        a.commit()


@pytest.mark.parametrize("reply", [False, True], ids=["status", "status-asking-a-reply"])
def test_a_confirm_never_moves_the_slot_past_what_was_confirmed(
    pg: PgDatabase, reply: bool
) -> None:
    """Transaction A begins, T1 and T2 commit, A commits: A arrives after T2 with messages that
    start at its first LSN, before T1's end. Confirming T1's end while A's messages are being
    received must leave the slot there, whether the status asks for a keepalive or not. With
    psycopg2's replication loop, the keepalive arriving amid A made it report the server's WAL
    end as flushed, T2 included (seen on both servers: the slot at T2's end)."""
    _t1_and_t2_within_a(pg)
    session = ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), status_interval=1.0)
    ends: list[Lsn] = []
    for event in session.events():
        if isinstance(event, WalData) and event.payload[:1] == b"C":
            ends.append(Lsn(struct.unpack_from("!Q", event.payload, 10)[0]))
            if len(ends) == 1:
                session.confirm(ends[0])
                session.request_status(reply=reply)
                time.sleep(3)  # not reading: the walsender blocks amid A, then reads the status
            if len(ends) == 3:
                break
    session.request_status(reply=False)
    session.close()
    row = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots")
    assert str(row[0][0]) == str(ends[0]), (row, ends)


def test_a_keepalive_amid_a_transaction_never_moves_the_slot(pg: PgDatabase) -> None:
    """The same order of commits, but the keepalive is the server's own: a walsender blocked
    amid A on a consumer busy elsewhere asks for a reply after half of ``wal_sender_timeout``
    without a status. Its WAL end (past T2) must not be reported as flushed when only T1 was
    confirmed; psycopg2's replication loop reported it (the last message, within A, began
    before T1's end), and a crash then would have lost T2."""
    _t1_and_t2_within_a(pg)
    dsn = pg.dsn(options="-c wal_sender_timeout=4s")
    session = ReplicationSession(dsn, "s", StreamOptions(("pub",)), status_interval=30.0)
    ends: list[Lsn] = []
    stalled = False
    for event in session.events():
        if not isinstance(event, WalData):
            continue
        kind = event.payload[:1]
        if kind == b"C":
            ends.append(Lsn(struct.unpack_from("!Q", event.payload, 10)[0]))
            if len(ends) == 1:
                session.confirm(ends[0])
                session.request_status(reply=False)
            if len(ends) == 3:
                break
        elif kind == b"I" and len(ends) == 2 and not stalled:
            # amid A, which began before T1's end: busy for longer than half the timeout
            stalled = True
            time.sleep(3)
    assert stalled
    row = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots")
    session.close()
    assert str(row[0][0]) == str(ends[0]), (row, ends)
    row = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots")
    assert str(row[0][0]) == str(ends[0]), (row, ends)
