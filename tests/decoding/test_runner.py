"""``pgcdc.decoding.run`` on real servers, through ``pgcdc.replication``'s ReplicationSession
(a walsender connection) and SqlSlotReader (the SQL interface)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from pgcdc.decoding import DecodingContext, Transaction, run
from pgcdc.lsn import Lsn
from pgcdc.protocol import StreamStart, StreamStop
from pgcdc.replication import ReplicationSession, SqlSlotReader, StreamOptions
from tests.decoding.wire import Recorder, Wire, ins, rel
from tests.fix_pg import PgDatabase

TOP = 700


@pytest.fixture
def db(pg: PgDatabase) -> Iterator[PgDatabase]:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("CREATE PUBLICATION pub FOR TABLE t")
    yield pg


def _slot(pg: PgDatabase, *, two_phase: bool = False) -> None:
    pg.execute(
        "SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, %s)", (two_phase,)
    )


def _current_lsn(pg: PgDatabase) -> Lsn:
    ((lsn,),) = pg.execute("SELECT pg_current_wal_lsn()::text")
    return Lsn.parse(str(lsn))


def _slot_confirmed(pg: PgDatabase) -> Lsn:
    ((lsn,),) = pg.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'"
    )
    return Lsn.parse(str(lsn))


class Lifecycle(Recorder):
    def startup(self, ctx: DecodingContext) -> None:
        self.events.append(("startup", ctx.slot_name))

    def shutdown(self, ctx: DecodingContext) -> None:
        self.events.append(("shutdown",))


def _workload(pg: PgDatabase) -> None:
    pg.execute("INSERT INTO t VALUES (1, 'one')")
    with pg.connect(autocommit=False) as conn:
        conn.execute(
            "INSERT INTO t SELECT g, repeat('x', 20) FROM generate_series(100, 3099) g"
        )  # streamed
        conn.execute("SAVEPOINT s")
        conn.execute("INSERT INTO t SELECT g, 'gone' FROM generate_series(5000, 5999) g")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.commit()
    pg.execute("UPDATE t SET v = 'uno' WHERE id = 1")


@pytest.mark.parametrize("source", ["session", "sql"])
def test_run_until_lsn(db: PgDatabase, source: str) -> None:
    pg = db
    _slot(pg)
    _workload(pg)
    pg.execute("SELECT pg_logical_emit_message(false, 'pfx', 'not transactional')")
    # WAL the slot does not publish: the end is only learnt from the server's position
    pg.execute("CREATE TABLE other (id int)")
    pg.execute("INSERT INTO other SELECT generate_series(1, 100)")
    until = _current_lsn(pg)
    options = StreamOptions(("pub",), streaming="on", messages=True)
    plugin = Lifecycle()
    reader: ReplicationSession | SqlSlotReader
    if source == "session":
        reader = ReplicationSession(pg.dsn(), "s", options, poll_interval=0.2)
    else:
        reader = SqlSlotReader(pg.dsn(), "s", options, poll_interval=0.2)
    with reader:
        result = run(plugin, reader, until_lsn=until, memory_limit=64 * 1024)
        assert reader.proto_version == (4 if pg.major >= 16 else 3)
    assert result.reason == "until"
    assert reader.server_wal_end >= until
    assert plugin.events[0] == ("startup", "s") and plugin.events[-1] == ("shutdown",)
    assert len(plugin.order()) == 3
    ids = [int(str(r[0])) for r in plugin.rows()]
    assert ids == [1, *range(100, 3100), 1]
    assert plugin.txns[1].streamed
    assert result.stats.transactions == 3 and result.stats.subtransaction_aborts >= 1
    last_end = plugin.txns[-1].end_lsn
    assert last_end is not None and result.confirmed_lsn >= last_end
    # the position reached the server: the slot moved past everything delivered
    assert _slot_confirmed(pg) >= last_end


class Batching(Recorder):
    """Makes transactions durable in pairs: confirms every second one."""

    auto_confirm = False

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> Lsn | None:
        super().commit(ctx, txn, commit_lsn)
        if len(self.order()) % 2 == 0:
            assert txn.end_lsn is not None
            ctx.confirm(txn.end_lsn)
        if len(self.order()) == 3:
            ctx.request_stop()
        return None


def test_manual_confirmation_and_plugin_stop(db: PgDatabase) -> None:
    pg = db
    _slot(pg)
    for i in range(5):
        pg.execute("INSERT INTO t VALUES (%s, 'v')", (i,))
    plugin = Batching()
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), poll_interval=0.2) as s:
        result = run(plugin, s)
    assert result.reason == "plugin" and len(plugin.order()) == 3
    second = plugin.txns[1].end_lsn
    assert result.confirmed_lsn == second  # the third is delivered but not durable
    # resuming from the confirmed position: the third transaction comes again
    again = Recorder()
    with ReplicationSession(
        pg.dsn(), "s", StreamOptions(("pub",)), start_lsn=result.confirmed_lsn, poll_interval=0.2
    ) as s:
        run(again, s, until_lsn=_current_lsn(pg))
    assert [r[0] for r in again.rows()] == ["2", "3", "4"]


def test_held_prepared_transaction_is_not_confirmed_past(db: PgDatabase) -> None:
    pg = db
    _slot(pg, two_phase=True)
    with pg.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1, 'prepared')")
        conn.execute("PREPARE TRANSACTION 'g'")
    pg.execute("INSERT INTO t VALUES (2, 'plain')")
    options = StreamOptions(("pub",), two_phase=True)
    first = Recorder()
    with ReplicationSession(pg.dsn(), "s", options, poll_interval=0.2) as s:
        result = run(first, s, until_lsn=_current_lsn(pg))
    assert first.rows() == [("2", "plain")]
    plain_end = first.txns[0].end_lsn
    assert plain_end is not None and result.confirmed_lsn < plain_end
    assert result.durable_lsn >= plain_end
    pg.execute("COMMIT PREPARED 'g'")
    # a new process: the prepared transaction comes again, with its COMMIT PREPARED
    second = Recorder()
    with ReplicationSession(pg.dsn(), "s", options, poll_interval=0.2) as s:
        result = run(second, s, until_lsn=_current_lsn(pg))
    assert second.rows() == [("2", "plain"), ("1", "prepared")]
    assert second.txns[-1].gid == "g"
    assert result.confirmed_lsn == second.txns[-1].end_lsn


def test_stop_event(db: PgDatabase) -> None:
    import threading

    pg = db
    _slot(pg)
    pg.execute("INSERT INTO t VALUES (1, 'one')")
    stop = threading.Event()

    class StopAfterFirst(Recorder):
        def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
            super().commit(ctx, txn, commit_lsn)
            stop.set()

    plugin = StopAfterFirst()
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("pub",)), poll_interval=0.2) as s:
        result = run(plugin, s, stop=stop)
    assert result.reason == "stop" and plugin.order() and result.confirmed_lsn > 0


# -- the runner's own logic, on a source that replays a stream built with the Encoder --------
@dataclass(frozen=True, slots=True)
class WalData:
    data_start: Lsn
    wal_end: Lsn
    payload: bytes


@dataclass(frozen=True, slots=True)
class Idle:
    server_wal_end: Lsn


class ListSource:
    """Replays events; answers request_status() with an Idle at ``wal_end``."""

    def __init__(self, events: list[object], wal_end: Lsn) -> None:
        self._events = list(events)
        self.wal_end = wal_end
        self.confirmed: list[Lsn] = []
        self.status_requests = 0
        self.proto_version = 2
        self.server_version = 180000
        self.slot = "replayed"
        self.sent = Lsn(0)
        self.server_wal_end = Lsn(0)

    def events(self) -> Iterator[object]:
        while self._events:
            event = self._events.pop(0)
            if isinstance(event, WalData):
                self.sent = max(self.sent, event.data_start)
            elif isinstance(event, Idle):
                self.server_wal_end = max(self.server_wal_end, event.server_wal_end)
            yield event

    def confirm(self, lsn: Lsn) -> None:
        # like the real sources: nothing beyond what was sent
        assert lsn <= max(self.sent, self.server_wal_end), (lsn, self.sent)
        self.confirmed.append(lsn)

    def request_status(self) -> None:
        self.status_requests += 1
        self._events.insert(0, Idle(self.wal_end))


def _events(w: Wire) -> list[object]:
    return [WalData(Lsn(lsn), Lsn(lsn), payload) for payload, lsn in w.take()]


def test_until_waits_for_open_transactions_and_asks_for_the_server_position() -> None:
    w = Wire(proto=2)
    _, end1 = w.txn(100, rel(), ins("1", "a"))
    w.block(TOP, rel(TOP), ins("2", "b", xid=TOP), first=True)
    w.put(StreamStart(TOP, False))
    w.put(ins("3", "c", xid=TOP))
    until = Lsn(w.tick())
    w.put(StreamStop())
    _, end2 = w.stream_commit(TOP)
    events = _events(w)
    beyond = Lsn(end2 + 0x1000)
    # 'until' is reached inside a streamed block: the runner reads on to the block's end; the
    # streamed transaction, still open, commits after 'until' and is not waited for
    src = ListSource([*events, Idle(Lsn(0))], wal_end=beyond)
    plugin = Recorder()
    result = run(plugin, src, until_lsn=until)
    assert result.reason == "until" and plugin.order() == [100]
    assert src.confirmed == [end1]
    # beyond all data: stopped once the server's position (asked for when idle) passes it
    src = ListSource([*events, Idle(Lsn(0))], wal_end=beyond)
    plugin = Recorder()
    result = run(plugin, src, until_lsn=beyond)
    assert result.reason == "until" and plugin.order() == [100, TOP]
    assert src.status_requests == 1 and src.confirmed == [end1, end2]
    # the source ran out first
    src = ListSource(events, wal_end=end2)
    result = run(Recorder(), src, until_lsn=Lsn(beyond + 1))
    assert result.reason == "end"


def test_a_message_is_confirmed_once_something_later_was_sent() -> None:
    w = Wire(proto=2)
    _, end = w.txn(100, rel(), ins("1", "a"))
    message = w.plain_message(b"last")
    src = ListSource([*_events(w), Idle(Lsn(0))], wal_end=Lsn(message + 0x100))
    result = run(Recorder(), src, until_lsn=Lsn(message + 0x80))
    assert src.confirmed == [end, message, message + 1]
    assert result.confirmed_lsn == message + 1


def test_shutdown_is_called_when_a_callback_fails() -> None:
    class Failing(Lifecycle):
        def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
            raise RuntimeError("sink down")

    w = Wire(proto=2)
    w.txn(100, rel(), ins("1", "a"))
    plugin = Failing()
    src = ListSource(_events(w), wal_end=Lsn(0))
    with pytest.raises(RuntimeError, match="sink down"):
        run(plugin, src)
    assert plugin.events[0] == ("startup", "replayed") and plugin.events[-1] == ("shutdown",)
    assert src.confirmed == []
