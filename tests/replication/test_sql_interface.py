"""SqlSlotReader: the same stream as the replication session, each row exactly once."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from psycopg import sql

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Begin,
    Commit,
    Encoder,
    Insert,
    Message,
    Relation,
    StreamCommit,
    StreamStart,
)
from pgcdc.replication import (
    Idle,
    ReplicationSession,
    SqlSlotReader,
    StreamOptions,
    WalData,
)
from pgcdc.replication.sql_interface import _group
from tests.fix_pg import PgDatabase
from tests.replication.streams import (
    FAST,
    Reading,
    assemble,
    current_lsn,
    read,
    slot_row,
)

MARKER = -1  # the id of the last row of every workload


def _tables(pg: PgDatabase, *slots: str) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE u (id int PRIMARY KEY, w text)")
    pg.execute("CREATE TABLE other (id int)")
    pg.execute("CREATE PUBLICATION pub FOR TABLE t, u")
    for slot in slots:
        pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def _workload(pg: PgDatabase, *, big: int = 0) -> None:
    """Small transactions of every kind, interleaved ones, and optionally a big one."""
    with pg.connect() as a, pg.connect() as b:
        a.execute("INSERT INTO t SELECT g, 'multi' FROM generate_series(1, 20) g")  # one record
        a.execute("SELECT pg_logical_emit_message(false, 'loose', 'one')")
        for i in range(30):
            a.execute("INSERT INTO u VALUES (%s, 'u')", (i,))
        # interleaved: b starts first, a commits in between, b commits last
        b.execute("BEGIN")
        b.execute("INSERT INTO t VALUES (100, 'b first')")
        if big:
            b.execute(
                "INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1000, %s) g",
                (1000 + big - 1,),
            )
        a.execute("UPDATE t SET v = 'updated' WHERE id <= 5")
        with a.transaction():
            a.execute("SELECT pg_logical_emit_message(true, 'txn', 'two')")
            a.execute("DELETE FROM u WHERE id < 10")
        b.execute("INSERT INTO t VALUES (101, 'b last')")
        for i in range(30, 40):
            a.execute("INSERT INTO u VALUES (%s, 'u')", (i,))
        b.execute("COMMIT")
        a.execute("TRUNCATE u")
        a.execute("SELECT pg_logical_emit_message(false, 'loose', 'two')")
        a.execute("INSERT INTO t VALUES (%s, 'marker')", (MARKER,))


def _done(r: Reading) -> bool:
    return MARKER in r.inserted_ids() and isinstance(r.messages[-1], Commit)


def _confirming(source: SqlSlotReader | ReplicationSession, lag: int) -> object:
    """An on_event callback that confirms, at each commit, the one ``lag`` commits before.

    So whenever the slot moves, transactions already delivered lie beyond its new position,
    and the next peek returns them again.
    """
    ends: list[Lsn] = []

    def on_event(event: object, msg: object) -> None:
        if isinstance(msg, Commit | StreamCommit):
            ends.append(msg.end_lsn)
            if len(ends) > lag:
                source.confirm(ends[-1 - lag])

    return on_event


@pytest.mark.parametrize("streaming", ["off", "on"])
def test_same_stream_as_the_replication_session(pg: PgDatabase, streaming: str) -> None:
    _tables(pg, "s_repl", "s_sql")
    options = StreamOptions(("pub",), messages=True, streaming=streaming)  # type: ignore[arg-type]
    _workload(pg, big=3000 if streaming == "on" else 0)
    with ReplicationSession(pg.dsn(), "s_repl", options, **FAST) as session:
        wal = read(session, _done)
    reader = SqlSlotReader(pg.dsn(), "s_sql", options, poll_interval=0.1, batch_size=3)
    with reader:
        sql = read(reader, _done, on_event=_confirming(reader, 2))  # type: ignore[arg-type]
        assert reader.rows_skipped > 0  # it did re-read (and skip) rows after moving the slot
    # every row once: the same transactions, changes and messages, in the same order
    wal_txns, wal_loose = assemble(wal.messages)
    sql_txns, sql_loose = assemble(sql.messages)
    assert [(t.commit_lsn, t.end_lsn, t.changes) for t in sql_txns] == [
        (t.commit_lsn, t.end_lsn, t.changes) for t in wal_txns
    ]
    assert sql_loose == wal_loose == [("M", "loose", b"one", False), ("M", "loose", b"two", False)]
    assert len(wal_txns) == 46
    if streaming == "on":
        assert reader.advances_deferred > 0  # confirmed while the big transaction was open
        assert wal.of(StreamStart) and sql.of(StreamStart)
        assert len({s.xid for s in sql.of(StreamStart) if s.first_segment}) == 1
    else:
        # without streaming even the raw stream is identical, but for Relation messages (each
        # peek is a new decoding session that describes each table again before first use)
        def plain(r: Reading) -> list[object]:
            return [m for m in r.messages if not isinstance(m, Relation)]

        assert plain(sql) == plain(wal)
        assert len(sql.of(Relation)) > len(wal.of(Relation))
    # rows sharing an LSN: all 20 rows of the multi-row insert, once each
    multi = [m.new[0] for m in sql.of(Insert) if m.new[1] == "multi"]
    assert multi == [str(i) for i in range(1, 21)]
    # the slot ends where the consumer confirmed
    confirmed = slot_row(pg, "s_sql")["confirmed_flush_lsn"]
    assert confirmed <= sql.commits[-1].end_lsn


def test_rows_sharing_an_lsn_across_peeks(pg: PgDatabase) -> None:
    """Many small transactions, one peek per transaction, confirming some: nothing twice."""
    _tables(pg, "s")
    with pg.connect() as conn:
        for i in range(40):
            conn.execute("INSERT INTO t VALUES (%s, 'x'), (%s, 'y')", (2 * i, 2 * i + 1))
        conn.execute("INSERT INTO t VALUES (%s, 'marker')", (MARKER,))
    reader = SqlSlotReader(pg.dsn(), "s", StreamOptions(("pub",)), poll_interval=0.1, batch_size=1)
    with reader:
        got = read(reader, _done, on_event=_confirming(reader, 3))  # type: ignore[arg-type]
    assert got.inserted_ids() == [*range(80), MARKER]
    assert len(got.commits) == 41
    # the property that makes LSNs useless as row identities: neighbours share them
    lsns = [d.data_start for d in got.data]
    assert len(set(lsns)) < len(lsns)
    begins_at_previous_commit = sum(
        1
        for prev, cur in zip(got.data, got.data[1:], strict=False)
        if prev.payload[:1] == b"C"
        and cur.payload[:1] == b"B"
        and prev.data_start == cur.data_start
    )
    assert begins_at_previous_commit > 0


def test_confirm_moves_the_slot_and_idle_advances(pg: PgDatabase) -> None:
    _tables(pg, "s")
    start = slot_row(pg)["confirmed_flush_lsn"]
    with pg.connect() as conn:
        for i in range(3):
            conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
    reader = SqlSlotReader(pg.dsn(), "s", StreamOptions(("pub",)), poll_interval=0.1)
    with reader:
        got = read(reader, lambda r: len(r.commits) == 3)
        ends = [c.end_lsn for c in got.commits]
        for _ in range(3):  # idle polls, nothing confirmed: the slot stays
            assert isinstance(next(iter(reader.events())), Idle)
        assert slot_row(pg)["confirmed_flush_lsn"] == start
        reader.confirm(ends[0])  # applied before the next peek
        assert isinstance(next(iter(reader.events())), Idle)
        assert slot_row(pg)["confirmed_flush_lsn"] == ends[0] == reader.confirmed_lsn
        with pytest.raises(ValueError, match="beyond anything delivered"):
            reader.confirm(Lsn(ends[2] + 10**9))
        for i in range(20):
            pg.execute("INSERT INTO other VALUES (%s)", (i,))
        for _ in range(3):
            assert isinstance(next(iter(reader.events())), Idle)
        assert slot_row(pg)["confirmed_flush_lsn"] == ends[0]  # two are still unconfirmed
        reader.confirm(ends[2])
        target = current_lsn(pg)
        deadline = time.monotonic() + 10
        for event in reader.events():
            assert not isinstance(event, WalData)
            if slot_row(pg)["confirmed_flush_lsn"] >= target:
                break
            assert time.monotonic() < deadline, "the idle slot did not advance"


def test_reconnect(pg: PgDatabase) -> None:
    _tables(pg, "s")
    with pg.connect() as conn:
        for i in range(10):
            conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
    dsn = pg.dsn(application_name="pgcdc_sql_reader")
    reader = SqlSlotReader(dsn, "s", StreamOptions(("pub",)), poll_interval=0.1, batch_size=4)
    with reader:
        got = read(reader, lambda r: len(r.commits) >= 4)
        reader.confirm(got.commits[1].end_lsn)
        pg.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'pgcdc_sql_reader'"
        )
        pg.execute("INSERT INTO t VALUES (%s, 'marker')", (MARKER,))
        got = read(reader, _done, reading=got)
    assert len(got.reconnects) == 1
    assert got.inserted_ids() == [*range(10), MARKER]  # delivered ones are not repeated


def test_group_units() -> None:
    """Unit boundaries and ordering keys straight from message bytes (no server needed)."""
    enc = Encoder(1)
    now = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [
        (Lsn(10), 5, enc.encode(Begin(Lsn(40), now, 5))),
        (Lsn(10), 5, enc.encode(Insert(None, 1, ("a",)))),
        (Lsn(50), 5, enc.encode(Commit(0, Lsn(40), Lsn(50), now))),
        (Lsn(50), 0, enc.encode(Message(None, False, Lsn(50), "p", b""))),
        (Lsn(60), 6, enc.encode(Begin(Lsn(70), now, 6))),
    ]
    units, covered = _group(rows)
    assert covered == 4  # the last transaction is incomplete: left for the next peek
    assert [(u.kind, u.xid, u.key) for u in units] == [
        ("txn", 5, (40, 1)),
        ("single", None, (50, 0)),
    ]


def test_two_phase_same_stream(pg: PgDatabase) -> None:
    _tables(pg)
    for slot in ("s_repl", "s_sql"):
        pg.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", (slot,)
        )
    with pg.connect() as conn:
        for i in range(6):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (%s, 'prepared')", (i,))
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(f"g{i}")))
            conn.execute("INSERT INTO u VALUES (%s, 'between')", (i,))
            verb = sql.SQL("COMMIT" if i % 2 else "ROLLBACK")
            conn.execute(sql.SQL("{} PREPARED {}").format(verb, sql.Literal(f"g{i}")))
        conn.execute("INSERT INTO t VALUES (%s, 'marker')", (MARKER,))
    options = StreamOptions(("pub",), two_phase=True)
    with ReplicationSession(pg.dsn(), "s_repl", options, **FAST) as session:
        wal = read(session, _done)
    reader = SqlSlotReader(pg.dsn(), "s_sql", options, poll_interval=0.1, batch_size=2)
    with reader:
        got = read(reader, _done, on_event=_confirming(reader, 2))  # type: ignore[arg-type]

    def plain(r: Reading) -> list[object]:
        return [m for m in r.messages if not isinstance(m, Relation)]

    assert plain(got) == plain(wal)
    kinds = {type(m).__name__ for m in plain(got)}
    assert {"BeginPrepare", "Prepare", "CommitPrepared", "RollbackPrepared"} <= kinds
