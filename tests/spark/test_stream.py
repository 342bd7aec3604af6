"""The pgcdc stream on a real local Spark against real PostgreSQL 15 and 18."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pgcdc.lsn import Lsn
from pgcdc.replication import create_publication, create_slot_with_snapshot, slot_info
from pgcdc.spark import METADATA_COLUMNS, read_stream, table_changes, table_column
from tests.fix_pg import PgDatabase
from tests.spark.streams import Collected, run_stream, wait_slot_released

pytestmark = pytest.mark.slow


def _slot(pg: PgDatabase, name: str = "spark_slot") -> Lsn:
    snapshot = create_slot_with_snapshot(pg.dsn(), name)
    snapshot.release()
    return snapshot.consistent_point


def _incompressible(n: int) -> str:
    out = []
    i = 0
    while sum(map(len, out)) < n:
        out.append(hashlib.sha256(str(i).encode()).hexdigest())
        i += 1
    return "".join(out)[:n]


def test_inserts_updates_deletes_truncates(pg: PgDatabase, spark: SparkSession, checkpoint_dir):
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, name text, qty int, big text)")
    pg.execute("CREATE TABLE full_t (k int, v text)")
    pg.execute("ALTER TABLE full_t REPLICA IDENTITY FULL")
    pg.execute('CREATE TABLE "Mixed Case" ("Key" int PRIMARY KEY, "a.b" text)')
    create_publication(pg.dsn(), "pub", tables=["items", "full_t", "Mixed Case"])
    _slot(pg)
    big = _incompressible(20000)
    with pg.connect() as conn:
        with conn.transaction():
            conn.execute("INSERT INTO items VALUES (1, 'one', 1, NULL), (2, 'two', 2, NULL)")
            conn.execute("INSERT INTO items VALUES (3, 'three', 3, NULL)")
            conn.execute("INSERT INTO full_t VALUES (1, 'a')")
        with conn.transaction():
            conn.execute("UPDATE items SET qty = 11 WHERE id = 1")
            conn.execute("UPDATE items SET id = 20 WHERE id = 2")
        conn.execute("INSERT INTO items VALUES (4, 'four', 4, %s)", (big,))
        conn.execute("UPDATE items SET qty = 44 WHERE id = 4")
        with conn.transaction():
            conn.execute("DELETE FROM items WHERE id = 3")
            conn.execute("UPDATE full_t SET v = 'b'")
            conn.execute("DELETE FROM full_t")
        conn.execute("TRUNCATE items, full_t")
        conn.execute("""INSERT INTO "Mixed Case" VALUES (7, 'x.y')""")

    got = run_stream(spark, pg.dsn(), "spark_slot", ["pub"], checkpoint_dir).rows
    items, full, mixed = (
        table_column("public", "items"),
        table_column("public", "full_t"),
        table_column("public", "Mixed Case"),
    )
    assert mixed == "t__public___" + b"Mixed Case".hex()

    def image(row: dict[str, Any], col: str, which: str) -> Any:
        return row[col][which]

    summary = [
        (
            r["_table"],
            r["_op"],
            r["_position"],
            r[table_column(r["_schema"], r["_table"])]["old_kind"],
        )
        for r in got
    ]
    assert summary == [
        ("items", "I", 0, None),
        ("items", "I", 1, None),
        ("items", "I", 2, None),
        ("full_t", "I", 3, None),
        ("items", "U", 0, None),
        ("items", "U", 1, "K"),
        ("items", "I", 0, None),
        ("items", "U", 0, None),
        ("items", "D", 0, "K"),
        ("full_t", "U", 1, "O"),
        ("full_t", "D", 2, "O"),
        ("items", "T", 0, None),
        ("full_t", "T", 1, None),
        ("Mixed Case", "I", 0, None),
    ]
    # every row of a transaction shares its labels; transactions come in commit order
    lsns = [r["_commit_lsn"] for r in got]
    assert lsns == sorted(lsns)
    assert all(str(Lsn(r["_commit_lsn"])) == r["_commit_lsn_text"] for r in got)
    assert all(r["_end_lsn"] > r["_commit_lsn"] for r in got)
    assert len({(r["_commit_lsn"], r["_xid"], r["_commit_time"]) for r in got}) == 7
    # only the row's own table struct is set
    for r in got:
        own = table_column(r["_schema"], r["_table"])
        assert r["_table_id"] == f"{r['_schema']}.{r['_table']}"
        assert all(r[c] is None for c in (items, full, mixed) if c != own)
    assert image(got[0], items, "new") == {"id": 1, "name": "one", "qty": 1, "big": None}
    assert image(got[5], items, "new") == {"id": 20, "name": "two", "qty": 2, "big": None}
    assert image(got[5], items, "old") == {"id": 2, "name": None, "qty": None, "big": None}
    assert image(got[6], items, "new")["big"] == big
    # the update left the TOASTed value out: null, and named in 'unchanged'
    assert image(got[7], items, "new") == {"id": 4, "name": "four", "qty": 44, "big": None}
    assert got[7][items]["unchanged"] == ["big"]
    assert image(got[8], items, "new") is None
    assert image(got[9], full, "old") == {"k": 1, "v": "a"}
    assert image(got[9], full, "new") == {"k": 1, "v": "b"}
    assert image(got[10], full, "old") == {"k": 1, "v": "b"}
    assert got[11][items]["new"] is None and got[11][items]["old"] is None
    assert image(got[13], mixed, "new") == {"Key": 7, "a.b": "x.y"}

    # the slot was acknowledged up to the last transaction Spark processed, not beyond
    info = slot_info(pg.dsn(), "spark_slot")
    assert info is not None and info.confirmed_flush_lsn is not None
    assert info.confirmed_flush_lsn >= max(r["_end_lsn"] for r in got)

    # table_changes: one table, flat
    df = read_stream(spark, pg.dsn(), "spark_slot", ["pub"])
    flat = table_changes(df, "public.items")
    assert flat.columns == [
        *METADATA_COLUMNS,
        "id",
        "name",
        "qty",
        "big",
        "_old_id",
        "_old_name",
        "_old_qty",
        "_old_big",
        "_old_kind",
        "_unchanged",
    ]
    assert table_changes(df, ("public", "Mixed Case")).columns[len(METADATA_COLUMNS) :] == [
        "Key",
        "a.b",
        "_old_Key",
        "_old_a.b",
        "_old_kind",
        "_unchanged",
    ]
    with pytest.raises(ValueError, match=r"no table public\.nope"):
        table_changes(df, "public.nope")


def _batches(collected: Any) -> list[list[tuple[int, int]]]:
    return [
        [(r["_commit_lsn"], r[table_column("public", "t")]["new"]["id"]) for r in rows]
        for _, rows in sorted(collected.batches.items())
    ]


def test_restart_replays_the_uncommitted_batch_exactly(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir
):
    """Batches of at most 4 rows (whole transactions); the second batch fails after Spark
    planned and read it; the restarted query reads exactly the same rows again, then goes on."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    _slot(pg)
    for k in range(5):  # five transactions of two rows
        pg.execute("INSERT INTO t VALUES (%s, 'a'), (%s, 'b')", (2 * k, 2 * k + 1))

    first = Collected()
    with pytest.raises(Exception, match="test failure injected in batch 1"):
        run_stream(
            spark,
            pg.dsn(),
            "spark_slot",
            ["pub"],
            checkpoint_dir,
            collected=first,
            fail_on=lambda batch_id, rows: batch_id == 1,
            maxChangesPerTrigger=4,
        )
    failed_batch = first.batches[1]
    assert [len(b) for b in _batches(first)] == [4, 4]
    # nothing of the failed batch was acknowledged
    info = slot_info(pg.dsn(), "spark_slot")
    assert info is not None and info.confirmed_flush_lsn is not None
    assert info.confirmed_flush_lsn <= min(r["_commit_lsn"] for r in failed_batch)
    assert info.confirmed_flush_lsn >= max(r["_end_lsn"] for r in first.batches[0])

    pg.execute("INSERT INTO t VALUES (10, 'c'), (11, 'd')")  # arrives after the failure
    second = run_stream(
        spark, pg.dsn(), "spark_slot", ["pub"], checkpoint_dir, maxChangesPerTrigger=4
    )
    assert sorted(second.batches) == [1, 2]
    assert second.batches[1] == failed_batch  # the same rows, labels, positions, order
    assert [len(b) for b in _batches(second)] == [4, 4]
    ids = [i for b in (_batches(first)[0], *_batches(second)) for _, i in b]
    assert ids == list(range(12))  # exactly once, in commit order
    info = slot_info(pg.dsn(), "spark_slot")
    assert info is not None and info.confirmed_flush_lsn is not None
    assert info.confirmed_flush_lsn >= max(r["_end_lsn"] for r in second.batches[2])


def test_a_batch_is_read_in_parallel_partitions_with_the_same_rows(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir, tmp_path
):
    """A batch of many transactions is split into ``minPartitions`` input partitions (whole
    transactions each): the rows are exactly those of the same batch read in one partition."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    _slot(pg, "split_slot")
    _slot(pg, "whole_slot")
    for k in range(30):  # 30 transactions of about 100 kB of pgoutput each
        pg.execute(
            "INSERT INTO t SELECT g, repeat(md5(g::text), 6) "
            "FROM generate_series(%s::int, %s::int) g",
            (k * 500, k * 500 + 499),
        )
        pg.execute("UPDATE t SET v = 'u' WHERE id = %s", (k * 500,))
    split = run_stream(spark, pg.dsn(), "split_slot", ["pub"], checkpoint_dir, minPartitions=2)
    whole = run_stream(spark, pg.dsn(), "whole_slot", ["pub"], tmp_path / "whole", minPartitions=1)
    assert list(split.partitions.values()) == [2]
    assert list(whole.partitions.values()) == [1]
    assert len(split.rows) == 30 * 501
    assert split.rows == whole.rows  # labels, positions and values alike, in stream order


def test_large_streamed_transaction_arrives_whole(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir
):
    """A transaction far over logical_decoding_work_mem (64kB here) is streamed by the server in
    blocks, interleaved with other transactions and with a rolled-back subtransaction; it still
    arrives whole, in one batch, despite maxChangesPerTrigger."""
    pg.execute("CREATE TABLE big (id int PRIMARY KEY, pad text)")
    pg.execute("CREATE TABLE small (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "pub", tables=["big", "small"])
    _slot(pg)
    with pg.connect() as conn, pg.connect() as other:
        # streamed, then aborted: nothing of it
        with pytest.raises(RuntimeError, match="aborted on purpose"), conn.transaction():
            conn.execute("INSERT INTO big SELECT -g, 'a' FROM generate_series(1, 3000) g")
            raise RuntimeError("aborted on purpose")
        with conn.transaction():
            conn.execute(
                "INSERT INTO big SELECT g, repeat('p', 100) FROM generate_series(1, 4000) g"
            )
            other.execute("INSERT INTO small VALUES (1)")  # commits while 'big' is open
            with pytest.raises(RuntimeError, match="rolled back on purpose"), conn.transaction():
                conn.execute("INSERT INTO big SELECT g, 'x' FROM generate_series(100001, 103000) g")
                raise RuntimeError("rolled back on purpose")
            conn.execute(
                "INSERT INTO big SELECT g, repeat('q', 100) FROM generate_series(4001, 8000) g"
            )
            conn.execute("UPDATE big SET pad = 'u' WHERE id <= 1000")
        other.execute("INSERT INTO small VALUES (2)")
    got = run_stream(
        spark,
        pg.dsn(),
        "spark_slot",
        ["pub"],
        checkpoint_dir,
        maxChangesPerTrigger=500,
        decodeChunkBytes="256k",
    )
    per_batch = [{r["_table"] for r in rows} for _, rows in sorted(got.batches.items())]
    assert per_batch == [{"small"}, {"big"}, {"small"}]
    big_rows = got.batches[sorted(got.batches)[1]]
    assert len(big_rows) == 9000
    assert len({r["_commit_lsn"] for r in big_rows}) == 1
    assert [r["_position"] for r in big_rows] == list(range(9000))
    column = table_column("public", "big")
    ids = [r[column]["new"]["id"] for r in big_rows]
    assert ids[:8000] == list(range(1, 8001))
    assert [r["_op"] for r in big_rows[8000:]] == ["U"] * 1000
    assert max(ids) == 8000  # nothing of the rolled-back subtransaction


def test_continuous_trigger_follows_new_commits(
    pg: PgDatabase, spark: SparkSession, checkpoint_dir
):
    """A processing-time trigger: changes committed while the query runs arrive in later
    batches; each committed batch is acknowledged; stopping releases the slot."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "pub", tables=["t"])
    _slot(pg)
    seen: list[int] = []
    ends: list[int] = []
    column = table_column("public", "t")

    def each(batch: Any, batch_id: int) -> None:
        for r in batch.collect():
            seen.append(r[column]["new"]["id"])
            ends.append(r["_end_lsn"])

    query = (
        read_stream(spark, pg.dsn(), "spark_slot", ["pub"])
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime="0.5 seconds")
        .start()
    )
    try:
        for i in range(3):
            pg.execute("INSERT INTO t VALUES (%s)", (i,))
            deadline = time.monotonic() + 60
            while len(seen) <= i and time.monotonic() < deadline:
                assert query.exception() is None
                time.sleep(0.1)
        assert seen == [0, 1, 2]
        # planning the third batch acknowledged the second: the slot follows Spark's commits
        info = slot_info(pg.dsn(), "spark_slot")
        assert info is not None and info.confirmed_flush_lsn is not None
        assert info.confirmed_flush_lsn >= ends[1]
    finally:
        query.stop()
    wait_slot_released(pg.dsn(), "spark_slot")
    assert query.exception() is None
