"""The driver-side machinery without Spark: receiver, spool, index, data endpoint, decoding of a
partition, against real PostgreSQL 15 and 18 (the stream reader's methods are called the way
Spark's streaming runner and executors call them, in this process)."""

from __future__ import annotations

import pickle
import time
import tracemalloc
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
)

from pgcdc.lsn import Lsn
from pgcdc.protocol.message_types import MessageType, peek
from pgcdc.replication import create_publication, create_slot_with_snapshot, slot_info
from pgcdc.spark.catalog import load_catalog
from pgcdc.spark.endpoint import fetch_messages
from pgcdc.spark.errors import EndpointError, SparkSourceError
from pgcdc.spark.options import stream_settings
from pgcdc.spark.receiver import Receiver, ReceiverSettings
from pgcdc.spark.schema import source_schema, table_column
from pgcdc.spark.stream import PgcdcStreamReader, StreamPartition, parse_offset
from tests.fix_pg import PgDatabase


def _reader(pg: PgDatabase, **options: str) -> PgcdcStreamReader:
    settings = stream_settings(
        {
            "dsn": pg.dsn(),
            "slot": "s",
            "publications": "pub",
            **{k.lower(): v for k, v in options.items()},
        }
    )
    catalog = load_catalog(pg.dsn(), publications=("pub",))
    return PgcdcStreamReader(settings, catalog, source_schema(catalog))


def _read_all(reader: PgcdcStreamReader, partitions: Any) -> list[pa.RecordBatch]:
    """What executors do: a fresh, unpickled reader reads each pickled partition."""
    remote = pickle.loads(pickle.dumps(reader))
    return [b for p in partitions for b in remote.read(pickle.loads(pickle.dumps(p)))]


def test_large_transaction_memory_stays_bounded(pg: PgDatabase, tmp_path):
    """~25 MB of pgoutput in one streamed transaction (with rolled-back subtransactions): the
    receiver keeps offsets only, and a partition decodes chunk by chunk."""
    pg.execute("CREATE TABLE big (id int PRIMARY KEY, pad text)")
    create_publication(pg.dsn(), "pub", tables=["big"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    reader = _reader(pg, spoolDir=str(tmp_path), decodeChunkBytes="1m", spoolSegmentBytes="4m")
    start = reader.initialOffset()
    receiver = reader._rt().receiver
    tracemalloc.start()
    try:
        with pg.connect() as conn, conn.transaction():
            for k in range(10):
                conn.execute(
                    "INSERT INTO big SELECT g, repeat('x', 120) "
                    "FROM generate_series(%s::int, %s::int) g",
                    (k * 20000 + 1, (k + 1) * 20000),
                )
                if k % 3 == 0:
                    conn.execute("SAVEPOINT s")
                    conn.execute(
                        "INSERT INTO big SELECT g, 'gone' FROM generate_series(-5000, -1) g"
                    )
                    conn.execute("ROLLBACK TO SAVEPOINT s")
        deadline = time.monotonic() + 120
        while not len(receiver.index) and time.monotonic() < deadline:
            time.sleep(0.05)
        _, receiving_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(receiver.index) == 1
    entry = receiver.index.entry(0)
    assert entry.streamed and entry.rows == 200000
    assert entry.spool_bytes > 25_000_000
    assert receiver.spool.disk_bytes >= entry.spool_bytes
    assert receiving_peak < 4_000_000  # Python memory while ~30 MB went by, most of it to disk

    end = reader.latestOffset(start, ReadMaxRows(10))  # one whole transaction, whatever the limit
    partitions = reader.partitions(start, end)
    assert len(partitions) == 1
    remote = pickle.loads(pickle.dumps(reader))
    pool = pa.default_memory_pool()
    peaks = []
    ids = []
    column = table_column("public", "big")
    for batch in remote.read(partitions[0]):
        peaks.append(pool.bytes_allocated())
        ids.extend(batch.column(column).field("new").field("id").to_pylist())
        assert batch.column("_position").to_pylist() == list(
            range(len(ids) - batch.num_rows, len(ids))
        )
    assert len(peaks) > 10  # decoded a chunk at a time
    assert max(peaks) < 12_000_000  # Arrow memory held while a 1 MB chunk is out
    assert ids == list(range(1, 200001))
    reader.commit(end)
    reader.stop()


def test_reconnect_and_restart_keep_each_transaction_once(pg: PgDatabase):
    """The replication connection drops mid-stream (the session reconnects and the server sends
    the unconfirmed transactions again); then the reader process itself restarts: every
    transaction is indexed once, batches are the same, and the slot moves only on commit."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    reader = _reader(pg)
    start = reader.initialOffset()
    for i in range(3):
        pg.execute("INSERT INTO t VALUES (%s)", (i,))
    receiver = reader._rt().receiver
    _wait_rows(receiver, 3)
    pg.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'"
    )
    for i in range(3, 6):
        pg.execute("INSERT INTO t VALUES (%s)", (i,))
    _wait_rows(receiver, 6)
    assert receiver.framer is not None and receiver.framer.stats.skipped == 3
    first = reader.latestOffset(start, ReadMaxRows(4))
    batch = reader.partitions(start, first)
    rows = _read_all(reader, batch)
    assert sum(b.num_rows for b in rows) == 4
    reader.stop()  # the reader process ends before Spark committed the batch
    info = slot_info(pg.dsn(), "s")
    # the slot moved only over WAL before the first transaction (a keepalive's WAL end, reported
    # as flushed while nothing was pending), never over a transaction Spark did not commit
    first_commit = _labels(batch)[0][0]
    assert info is not None
    assert Lsn.parse(start["end_lsn"]) <= info.confirmed_flush_lsn < first_commit

    again = _reader(pg)
    replay = again.partitions(start, first)  # waits for the new receiver to get there
    assert _labels(replay) == _labels(batch)
    assert _table(_read_all(again, replay)) == _table(rows)
    again.commit(first)
    rest = again.latestOffset(first, ReadAllAvailable())
    assert rest["lsn"] != first["lsn"]
    tail = _table(_read_all(again, again.partitions(first, rest)))
    assert tail.column("_table").to_pylist() == ["t", "t"]
    again.commit(rest)
    info = slot_info(pg.dsn(), "s")
    assert info is not None and info.confirmed_flush_lsn >= Lsn.parse(rest["end_lsn"])
    again.stop()


def _small_segments_reader(pg: PgDatabase, tmp_path: Any) -> PgcdcStreamReader:
    """A reader of table t (id, pad) whose spool has 64 kB segments, in ``tmp_path``."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    return _reader(pg, spoolDir=str(tmp_path), spoolSegmentBytes="64k")


def test_a_confirm_between_a_message_spooled_and_framed_keeps_it(pg: PgDatabase, tmp_path):
    """Spark confirms a batch (releasing the spool below what is still needed) at any moment,
    also between the receiver writing a message to the spool and the framer taking it. When
    that message was the first of a streamed transaction's block, the release went past it,
    and reading the transaction at its commit failed (spool range not available)."""
    reader = _small_segments_reader(pg, tmp_path)
    start = reader.initialOffset()
    receiver = reader._rt().receiver
    pg.execute("INSERT INTO t VALUES (0, 'first')")
    _wait_rows(receiver, 1)
    with receiver.lock:
        first = receiver.index.entry(0)
    spool = receiver.spool
    append = spool.append
    state = {"in_block": False, "confirmed": False}

    def append_then_confirm(payload: bytes) -> int:
        offset = append(payload)
        if state["confirmed"]:
            return offset
        if state["in_block"]:
            # the block's first message, in the spool and not yet framed: Spark confirms now
            receiver.confirm_through(first.end_lsn, first.commit_lsn, wait=0)
            state["confirmed"] = True
        elif peek(payload, in_stream=False).kind == MessageType.STREAM_START:
            state["in_block"] = True
        return offset

    spool.append = append_then_confirm  # type: ignore[method-assign]
    # more than logical_decoding_work_mem (64kB): streamed, over several spool segments
    pg.execute("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
    _wait_rows(receiver, 5000)
    assert state["confirmed"]
    after = reader.latestOffset(start, ReadAllAvailable())
    rows = _read_all(reader, reader.partitions(start, after))
    assert sum(b.num_rows for b in rows) == 5000
    reader.stop()


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_transactions_with_no_rows_for_the_query_do_not_pin_the_slot(
    pg: PgDatabase, ending: str
) -> None:
    """A transaction larger than logical_decoding_work_mem on an unpublished table arrives as an
    empty streamed transaction, and one rolled back as a Stream Abort: neither is a row for
    Spark, so Spark never confirms it. While nothing Spark read is unconfirmed, the receiver
    confirms them itself; before, the slot stayed at Spark's last batch, keeping WAL."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg.execute("CREATE TABLE u (id int, pad text)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    reader = _reader(pg)
    start = reader.initialOffset()
    receiver = reader._rt().receiver
    pg.execute("INSERT INTO t VALUES (1)")
    _wait_rows(receiver, 1)
    end = reader.latestOffset(start, ReadAllAvailable())
    _read_all(reader, reader.partitions(start, end))
    reader.commit(end)
    with pg.connect(autocommit=False) as conn:
        conn.execute("INSERT INTO u SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
        if ending == "rollback":  # rows of t streamed while it is open, then aborted
            conn.execute("INSERT INTO t SELECT g FROM generate_series(10, 5000) g")
            deadline = time.monotonic() + 30
            while receiver.framer is None or not receiver.framer.stats.messages > 100:
                assert time.monotonic() < deadline, "the open transaction was not streamed"
                time.sleep(0.2)
            conn.rollback()
        else:
            conn.commit()
    after = Lsn.parse(str(pg.execute("SELECT pg_current_wal_lsn()::text")[0][0]))
    deadline = time.monotonic() + 30
    while True:
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # no row for Spark
        info = slot_info(pg.dsn(), "s")
        assert info is not None
        if info.confirmed_flush_lsn >= after:
            break
        assert time.monotonic() < deadline, f"the slot stays at {info.confirmed_flush_lsn}"
        time.sleep(0.5)
    assert receiver.framer is not None
    assert receiver.framer.stats.empty if ending == "commit" else receiver.framer.stats.aborted
    reader.stop()


def test_an_open_streamed_transaction_keeps_only_its_own_spool_segments(
    pg: PgDatabase, tmp_path
) -> None:
    """A transaction streamed while it stays open (a long ETL job, or one prepared): its blocks
    stay in the spool until it ends, and everything Spark committed meanwhile goes. Before, its
    first block was the release floor and the spool kept all that came after it."""
    reader = _small_segments_reader(pg, tmp_path)
    start = reader.initialOffset()
    receiver = reader._rt().receiver
    with pg.connect(autocommit=False) as long:
        long.execute("INSERT INTO t SELECT -g, repeat('x', 200) FROM generate_series(1, 2000) g")
        for batch in range(20):
            pg.execute(
                "INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series(%s::int, %s::int) g",
                (batch * 200 + 1, batch * 200 + 200),
            )
            _wait_rows(receiver, 200)
            end = reader.latestOffset(start, ReadAllAvailable())
            _read_all(reader, reader.partitions(start, end))
            reader.commit(end)
            start = end
        reader.latestOffset(start, ReadAllAvailable())
        assert receiver.framer is not None and receiver.framer.stats.messages > 4000
        # the open transaction's ~0.5 MB, and the segment being written; not the other ~1 MB
        assert receiver.spool.disk_bytes < 800_000, receiver.spool.disk_bytes
        long.commit()
    _wait_rows(receiver, 2000)
    end = reader.latestOffset(start, ReadAllAvailable())
    rows = _read_all(reader, reader.partitions(start, end))
    assert sum(b.num_rows for b in rows) == 2000  # its blocks were kept
    reader.commit(end)
    reader.stop()


def _labels(partitions: Any) -> list[tuple[int, ...]]:
    return [
        (t.commit_lsn, t.end_lsn, t.commit_time, t.xid, t.rows, t.nbytes)
        for p in partitions
        for t in p.transactions
    ]


def _table(batches: list[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(batches)


def _wait_rows(receiver: Receiver, rows: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while receiver.index.total_rows < rows:
        receiver.raise_if_failed()
        assert time.monotonic() < deadline, f"only {receiver.index.total_rows} rows indexed"
        time.sleep(0.05)


def test_read_limits_and_endpoint_refusals(pg: PgDatabase):
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    reader = _reader(pg, maxChangesPerTrigger="5", maxBytesPerTrigger="100k")
    assert reader.getDefaultReadLimit() == ReadMaxRows(5)
    start = reader.initialOffset()
    sizes = [3, 4, 1, 9, 2]
    first = 0
    for n in sizes:
        pg.execute(
            "INSERT INTO t SELECT g, repeat('z', 1000) FROM generate_series(%s::int, %s::int) g",
            (first, first + n - 1),
        )
        first += n
    receiver = reader._rt().receiver
    _wait_rows(receiver, sum(sizes))
    # bytes: 3 rows of ~1 kB each fit under 4.5 kB, whole transactions again
    end = reader.latestOffset(start, ReadMaxBytes(4500))
    assert sum(b.num_rows for b in _read_all(reader, reader.partitions(start, end))) == 3
    # nothing limits ReadAllAvailable (Trigger.Once)
    everything = reader.latestOffset(start, ReadAllAvailable())
    assert sum(b.num_rows for b in _read_all(reader, reader.partitions(start, everything))) == 19
    partition = reader.partitions(start, end)[0]
    # rows: whole transactions, at least one, at most 5 rows unless one transaction is bigger;
    # in Spark's order: latestOffset(start) (start's batch is committed), then partitions
    offsets = [start]
    counts = []
    while True:
        end = reader.latestOffset(offsets[-1], reader.getDefaultReadLimit())
        if end == offsets[-1]:
            break
        counts.append(
            sum(b.num_rows for b in _read_all(reader, reader.partitions(offsets[-1], end)))
        )
        offsets.append(end)
    assert counts == [3, 5, 9, 2]  # 3+4 > 5; 4+1 = 5; 9 alone; 2
    assert offsets[-1] == everything

    assert isinstance(partition, StreamPartition)
    wrong = StreamPartition(**{**_fields(partition), "token": b"x" * 32})
    with pytest.raises(EndpointError, match="wrong token"):
        list(pickle.loads(pickle.dumps(reader)).read(wrong))
    # Spark committed everything: the data is released
    with pytest.raises(EndpointError, match="not available any more"):
        list(fetch_messages(partition.host, partition.port, partition.token, [(0, 10)]))

    # ReadMinRows waits for enough rows, at most maxTriggerDelay
    last = offsets[-1]
    pg.execute("INSERT INTO t VALUES (100, 'm')")
    _wait_rows(receiver, 1)
    assert reader.latestOffset(last, ReadMinRows(2)) == last
    # Trigger.AvailableNow: nothing committed after the trigger started
    reader.prepareForTriggerAvailableNow()
    pg.execute("INSERT INTO t VALUES (101, 'late')")
    _wait_rows(receiver, 2)
    target = reader.latestOffset(last, ReadAllAvailable())
    batch = _table(_read_all(reader, reader.partitions(last, target)))
    column = batch.column(table_column("public", "t")).combine_chunks()
    assert column.field("new").field("id").to_pylist() == [100]
    reader.stop()


def test_available_now_runs_a_full_batch_before_the_target_is_received(pg: PgDatabase):
    """Trigger.AvailableNow with a row limit: a batch the limit cut is final, so latestOffset
    gives it without waiting for the receiver to reach the trigger's target; a batch that could
    still grow (or ReadAllAvailable) waits for the target."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    reader = _reader(pg, availableNowTimeout="1")
    start = reader.initialOffset()
    for k in range(3):
        pg.execute("INSERT INTO t SELECT g FROM generate_series(%s::int, %s::int) g", (k, k))
    receiver = reader._rt().receiver
    _wait_rows(receiver, 3)
    reader.prepareForTriggerAvailableNow()
    # a target far ahead: the receiver is still behind it (as while catching up a long backlog)
    reader._rt().target = int(Lsn.parse("FF/0"))
    end = reader.latestOffset(start, ReadMaxRows(2))
    assert end != start
    rows = sum(b.num_rows for b in _read_all(reader, reader.partitions(start, end)))
    assert rows == 2
    # one row left: the batch is not full, so it waits for the target (and gives up here)
    with pytest.raises(SparkSourceError, match="did not reach FF/0"):
        reader.latestOffset(end, ReadMaxRows(2))
    with pytest.raises(SparkSourceError, match="did not reach FF/0"):
        reader.latestOffset(start, ReadAllAvailable())
    reader.stop()


def _fields(partition: StreamPartition) -> dict[str, Any]:
    return {name: getattr(partition, name) for name in partition.__dataclass_fields__}


def test_receiver_refuses_a_busy_slot_after_waiting(pg: PgDatabase):
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    settings = ReceiverSettings(pg.dsn(), "s", ("pub",), slot_wait=0.5)
    one = Receiver(settings)
    one.start()
    one.wait_connected(30)
    two = Receiver(settings)
    two.start()
    with pytest.raises(Exception, match="in use"):
        two.wait_connected(30)
    two.stop()
    one.stop()


def test_receiver_first_connect_waits_out_a_server_restart(pg: PgDatabase):
    """The receiver's first connection follows the reconnect policy of a running stream: a
    query started (or restarted after a network cut) while the server restarts waits for it
    instead of failing (it failed at once: the chaos suite's network test under load)."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    receiver = Receiver(ReceiverSettings(pg.dsn(), "s", ("pub",), slot_wait=0.5))
    pg.cluster.stop_server()
    try:
        receiver.start()
        time.sleep(2)
    finally:
        pg.cluster.start_server()
    receiver.wait_connected(120)
    pg.execute("INSERT INTO t VALUES (1)")
    receiver.stop()


def test_receiver_refuses_a_two_phase_slot_at_start(pg: PgDatabase):
    """A two-phase slot sends prepared transactions at PREPARE time in every protocol
    version; the source refuses it before streaming, naming the fix (issue 26)."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    pg.execute("SELECT pg_create_logical_replication_slot('s2pc', 'pgoutput', false, true)")
    receiver = Receiver(ReceiverSettings(pg.dsn(), "s2pc", ("pub",), slot_wait=0.5))
    with pytest.raises(SparkSourceError, match="created with two_phase") as raised:
        receiver.start()
    assert "without two_phase" in str(raised.value)
    receiver.stop()


def test_pause_file_plans_no_batch_while_it_exists(pg: PgDatabase, tmp_path):
    """``pauseFile``: while the file exists, latestOffset confirms the committed batch it starts
    from but plans no new one (a pipeline stopping between batches under load); without the
    file the waiting transactions make the next batch."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    create_slot_with_snapshot(pg.dsn(), "s").release()
    pause = tmp_path / "pause"
    reader = _reader(pg, pauseFile=str(pause))
    start = reader.initialOffset()
    pg.execute("INSERT INTO t VALUES (1)")
    receiver = reader._rt().receiver
    _wait_rows(receiver, 1)
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first != start
    pg.execute("INSERT INTO t VALUES (2)")
    _wait_rows(receiver, 2)
    pause.touch()
    assert reader.latestOffset(first, ReadAllAvailable()) == first  # data waits: no batch
    _, first_end = parse_offset(first)
    deadline = time.monotonic() + 10
    while slot_confirmed(pg) < first_end:  # ... but the committed batch was confirmed
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pause.unlink()
    second = reader.latestOffset(first, ReadAllAvailable())
    batch = _table(_read_all(reader, reader.partitions(first, second)))
    column = batch.column(table_column("public", "t")).combine_chunks()
    assert column.field("new").field("id").to_pylist() == [2]
    reader.stop()


def slot_confirmed(pg: PgDatabase) -> Lsn:
    return Lsn.parse(
        str(pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots")[0][0])
    )
