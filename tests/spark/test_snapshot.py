"""The snapshot reader and its handoff to the stream; schema changes during a stream."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pgcdc.replication import create_publication, create_slot_with_snapshot
from pgcdc.spark import is_schema_changed, read_snapshot, read_stream, table_column
from tests.fix_pg import PgDatabase, newest_server
from tests.spark.streams import ordered, run_stream

pytestmark = pytest.mark.slow


class Writer(threading.Thread):
    """Small random transactions (insert, update, delete, a mix) until stopped."""

    def __init__(self, pg: PgDatabase, first_new_id: int, limit: int = 5000) -> None:
        super().__init__(daemon=True)
        self.pg = pg
        self.next_id = first_new_id
        self.stop_event = threading.Event()
        self.limit = limit
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(5)
        try:
            with self.pg.connect() as conn:
                while not self.stop_event.is_set() and self.transactions < self.limit:
                    with conn.transaction():
                        for _ in range(rng.randint(1, 4)):
                            op = rng.random()
                            key = rng.randint(1, self.next_id)
                            if op < 0.4:
                                conn.execute(
                                    "INSERT INTO acct VALUES (%s, 0, 'new')", (self.next_id,)
                                )
                                self.next_id += 1
                            elif op < 0.85:
                                conn.execute(
                                    "UPDATE acct SET v = v + 1, note = 'upd' WHERE id = %s", (key,)
                                )
                            else:
                                conn.execute("DELETE FROM acct WHERE id = %s", (key,))
                    self.transactions += 1
                    time.sleep(0.01)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def test_snapshot_then_stream_under_concurrent_writes(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir
):
    """Copy the table in parallel inside the slot's exported snapshot while writes go on, then
    stream from the slot: applying the stream to the copy gives the table exactly (an insert of
    a key already copied, or a change to a key never seen, fails the test)."""
    pg.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL, note text)")
    pg.execute("INSERT INTO acct SELECT g, g, repeat('n', 40) FROM generate_series(1, 20000) g")
    create_publication(pg.dsn(), "pub", tables=["acct"])
    pg.execute("ALTER PUBLICATION pub SET TABLE acct WHERE (id % 5 <> 0)")
    writer = Writer(pg, 20001)
    writer.start()
    while writer.transactions < 100 and writer.is_alive():
        time.sleep(0.01)
    with create_slot_with_snapshot(pg.dsn(), "spark_slot") as exported:
        df = read_snapshot(
            spark, pg.dsn(), exported=exported, publications=["pub"], partitionsPerTable=4
        )
        assert df.rdd.getNumPartitions() == 4
        copied = ordered(df)
        during = writer.transactions
    time.sleep(0.5)
    writer.stop_event.set()
    writer.join()
    assert writer.error is None
    assert during < writer.transactions  # writes went on during and after the copy

    # small partitions: each starts from the table definitions in effect before it
    got = run_stream(spark, pg.dsn(), "spark_slot", ["pub"], checkpoint_dir, partitionBytes="2k")
    streamed = got.rows
    assert max(got.partitions.values()) > 1
    column = table_column("public", "acct")
    point = exported.consistent_point
    assert {(r["_op"], r["_commit_lsn"], r["_position"]) for r in copied} == {("I", point, -1)}
    assert all(r["_commit_lsn"] >= point for r in streamed)

    state: dict[int, tuple[int, str]] = {}
    for r in copied:
        new = r[column]["new"]
        assert new["id"] % 5 != 0  # the publication's row filter applied to the copy
        assert new["id"] not in state
        state[new["id"]] = (new["v"], new["note"])
    for r in sorted(streamed, key=lambda r: (r["_commit_lsn"], r["_position"])):
        change: dict[str, Any] = r[column]
        if r["_op"] == "I":
            assert change["new"]["id"] not in state, "duplicate: the copy already had it"
            state[change["new"]["id"]] = (change["new"]["v"], change["new"]["note"])
        elif r["_op"] == "U":
            key = (change["old"] or change["new"])["id"]
            assert key in state, "gap: an update of a row the copy did not have"
            del state[key]
            state[change["new"]["id"]] = (change["new"]["v"], change["new"]["note"])
        elif r["_op"] == "D":
            assert change["old"]["id"] in state, "gap: a delete of a row the copy did not have"
            del state[change["old"]["id"]]
    actual = {
        row[0]: (row[1], row[2])
        for row in pg.execute("SELECT id, v, note FROM acct WHERE id % 5 <> 0")
    }
    assert state == actual


@newest_server
def test_schema_change_fails_the_batch_until_restart(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir
):
    pg.execute("CREATE TABLE sc (id int PRIMARY KEY, v text)")
    create_publication(pg.dsn(), "pub", tables=["sc"])
    create_slot_with_snapshot(pg.dsn(), "spark_slot").release()
    column = table_column("public", "sc")

    # a column added and dropped again before the query reads it: ignored
    df = read_stream(spark, pg.dsn(), "spark_slot", ["pub"])
    pg.execute("ALTER TABLE sc ADD COLUMN tmp int")
    pg.execute("INSERT INTO sc VALUES (1, 'a', 5)")
    pg.execute("ALTER TABLE sc DROP COLUMN tmp")
    pg.execute("INSERT INTO sc VALUES (2, 'b')")
    rows = run_stream(spark, pg.dsn(), "spark_slot", ["pub"], checkpoint_dir, df=df).rows
    assert [r[column]["new"] for r in rows] == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]

    # a column the catalog still has: the batch fails until the query is defined again
    df = read_stream(spark, pg.dsn(), "spark_slot", ["pub"])
    pg.execute("ALTER TABLE sc ADD COLUMN w int")
    pg.execute("INSERT INTO sc VALUES (3, 'c', 7)")
    with pytest.raises(Exception) as failure:
        run_stream(spark, pg.dsn(), "spark_slot", ["pub"], checkpoint_dir, df=df)
    assert is_schema_changed(failure.value)
    assert "table public.sc: column 'w' added (integer)" in str(failure.value)

    rows = run_stream(spark, pg.dsn(), "spark_slot", ["pub"], checkpoint_dir).rows
    assert [r[column]["new"] for r in rows] == [{"id": 3, "v": "c", "w": 7}]


@newest_server
def test_a_rewrite_check_never_waits_on_a_lock_behind_the_copy(
    pg: PgDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a partition of a table published via its root was truncated (a rewrite), the
    copy's check read the current columns on a second connection with pg_partition_tree,
    which locks every partition: it waited for a TRUNCATE of another partition, which waited
    for the copy's lock, which waited for the check. PostgreSQL cannot see that cycle, so it
    hung for good. The check now reads pg_inherits, which locks nothing."""
    import psycopg

    from pgcdc.replication.copy import CopyConnection
    from pgcdc.spark import snapshot, snapshot_options, snapshot_reader

    pg.execute(
        "CREATE TABLE m (id int, k int, PRIMARY KEY (id, k)) PARTITION BY LIST (k);"
        "CREATE TABLE m1 PARTITION OF m FOR VALUES IN (1);"
        "CREATE TABLE m2 PARTITION OF m FOR VALUES IN (2);"
        "INSERT INTO m SELECT g, 1 + g % 2 FROM generate_series(1, 100) g;"
        "CREATE PUBLICATION pub FOR TABLE m WITH (publish_via_partition_root = true)"
    )
    exported = create_slot_with_snapshot(pg.dsn(), "rewrite_slot")
    outcome: list[str] = []

    def truncate_m2() -> None:
        try:
            with psycopg.connect(pg.dsn(), autocommit=True) as conn:
                conn.execute("SET lock_timeout = '20s'")
                conn.execute("TRUNCATE m2")
            outcome.append("truncated")
        except psycopg.Error as exc:
            outcome.append(f"TRUNCATE m2 failed: {exc}")

    class LockedThenTruncated(CopyConnection):
        """Another session truncates m2 once the copy holds its lock on m."""

        def execute(self, statement: Any) -> list[tuple[Any, ...]]:
            result = super().execute(statement)
            text = statement if isinstance(statement, str) else statement.as_string(None)
            if text.startswith("LOCK TABLE"):
                threading.Thread(target=truncate_m2, daemon=True).start()
                time.sleep(1)  # the TRUNCATE now waits for this transaction's lock
            return result

    try:
        reader = snapshot_reader(
            snapshot_options(pg.dsn(), exported=exported, publications=["pub"])
        )
        pg.execute("TRUNCATE m1")  # after the snapshot: a rewrite the copy must check
        monkeypatch.setattr(snapshot, "CopyConnection", LockedThenTruncated)
        started = time.monotonic()
        rows = 0
        for partition in reader.partitions():
            batches: list[Any] = []
            reader.copy(partition, batches.append)
            rows += sum(b.num_rows for b in batches)
        took = time.monotonic() - started
    finally:
        exported.release()
    deadline = time.monotonic() + 30
    while not outcome and time.monotonic() < deadline:
        time.sleep(0.1)
    assert outcome == ["truncated"] and took < 15, (outcome, took)
    assert rows == 50  # m2's: m1's heap is the truncated one (the streamed TRUNCATE follows)


@newest_server
def test_columns_renamed_after_the_catalog_was_read_are_not_copied_under_the_old_names(
    pg: PgDatabase, spark: SparkSession
) -> None:
    """The DataFrame's schema comes from the catalog when it is defined; the COPY selects by
    name later. Two columns swapping names in between made the copy read each one's values
    as the other's: an int4 and a float4 have the same width, so the floats' bits came back
    as integers, with no error."""
    pg.execute("CREATE TABLE sw (id int PRIMARY KEY, a int4, b float4)")
    pg.execute("INSERT INTO sw SELECT g, g, g + 0.5 FROM generate_series(1, 10) g")
    df = read_snapshot(spark, pg.dsn(), tables=["public.sw"])
    column = table_column("public", "sw")
    pg.execute("ALTER TABLE sw RENAME COLUMN a TO tmp")
    pg.execute("ALTER TABLE sw RENAME COLUMN b TO a")
    pg.execute("ALTER TABLE sw RENAME COLUMN tmp TO b")
    with pytest.raises(Exception, match="were renamed"):
        df.select(f"{column}.new.*").collect()
    # read again: the new catalog, the new names (in attnum order: b is the int4 now)
    rows = read_snapshot(spark, pg.dsn(), tables=["public.sw"]).select(f"{column}.new.*")
    assert rows.columns == ["id", "b", "a"]
    assert sorted(tuple(r) for r in rows.collect())[0] == (1, 1, 1.5)
