"""Compaction, purges and vacuum of the lake's Delta tables (pgcdc.lake.write.maintenance) with
Delta's own operations: real Delta tables, and a real pipeline whose batches each add files."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.delta import CHECKPOINT_EVERY, conflicts, create_table
from pgcdc.lake.store.deltalog import TableLog
from pgcdc.lake.store.storage import LeaseLost
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lake.write.batch import CONFLICT_ATTEMPTS, again_on_conflict
from pgcdc.lake.write.maintenance import (
    COMPACT_METADATA,
    EXCLUSIVE_AFTER,
    GAVE_WAY_WARNING,
    PURGE_METADATA,
    BatchGate,
    Maintenance,
    MaintenanceWorker,
    deleted_share,
)
from tests.fix_pg import PgDatabase, newest_server
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, make_config


def _parquet_on_disk(path: Path) -> int:
    """Data files in a table's folder (column mapping spreads them over random subfolders)."""
    return sum(1 for f in path.rglob("*.parquet") if "_delta_log" not in f.parts)


def _appended(spark: Any, path: Path, files: int, start: int = 0) -> str:
    from pyspark.sql import types as T

    if not path.exists():
        schema = T.StructType([T.StructField("id", T.LongType())])
        create_table(spark, path, schema, stats_columns=["id"], what="test")
    for i in range(start, start + files):
        rows = spark.createDataFrame([(j,) for j in range(i * 10, i * 10 + 10)], "id bigint")
        rows.coalesce(1).write.format("delta").mode("append").save(str(path))
    return str(path)


def _operations(path: str) -> list[tuple[str, dict[str, Any] | None]]:
    return [(op, meta) for _, op, meta in DeltaTarget(path).commits()]


def test_small_files_are_compacted_and_replaced_files_vacuumed(spark: Any, tmp_path: Path) -> None:
    path = _appended(spark, tmp_path / "t", 6)
    target = DeltaTarget(path)
    rows = sorted(target.read().column("id").to_pylist())
    Maintenance(compact_files=7, vacuum=False).after_batch(spark, [("t", path)])
    assert len(target.files()) == 6  # fewer small files than the threshold
    maintenance = Maintenance(compact_files=6, vacuum_retention_hours=0, vacuum_interval=0)
    assert maintenance.small_files(spark, path) == 6
    maintenance.after_batch(spark, [("t", path)])
    assert len(target.files()) == 1
    assert sorted(target.read().column("id").to_pylist()) == rows
    assert ("OPTIMIZE", COMPACT_METADATA) in _operations(path)
    # the replaced files were deleted (retention 0): only the compacted one is left on disk
    assert _parquet_on_disk(tmp_path / "t") == 1
    # at most one vacuum per vacuum_interval and table
    _appended(spark, tmp_path / "t", 2, start=6)
    Maintenance(compact_files=2, vacuum_retention_hours=0).after_batch(spark, [("t", path)])
    assert len(target.files()) == 1 and _parquet_on_disk(tmp_path / "t") == 4
    # past the interval after the vacuums above, whose time is the real monotonic clock
    later = Maintenance(compact_files=0, vacuum_retention_hours=1)
    clock = time.monotonic()
    assert later.vacuum_if_due(spark, "t", path, now=clock + later.vacuum_interval * 20)
    assert sorted(target.read().column("id").to_pylist()) == sorted(rows + list(range(60, 80)))


def test_commits_leave_checkpoints_to_maintenance(spark: Any, tmp_path: Path) -> None:
    """Tables pgcdc creates do not checkpoint in the committing thread (a batch would wait for
    it, even at Delta's own interval of 10 commits); maintenance checkpoints every
    ``checkpoint_commits`` commits, beside the batches, and Delta's reader and delta-rs read the
    table from it."""
    assert Maintenance().checkpoint_commits == CHECKPOINT_EVERY
    maintenance = Maintenance(checkpoint_commits=10, compact_files=0, vacuum=False)
    every = maintenance.checkpoint_interval(str(tmp_path / "t"))
    assert 5 < every <= 10 < CHECKPOINT_EVERY // 2
    path = _appended(spark, tmp_path / "t", every + 2)
    log_ = TableLog(spark, path)
    assert log_.version() == every + 2  # the creation, then one commit a file
    assert log_.checkpoint_version() == -1, "a commit wrote a checkpoint"
    assert not Maintenance(compact_files=0, vacuum=False).checkpoint_if_due(spark, "t", path)
    assert maintenance.checkpoint_if_due(spark, "t", path)
    assert log_.checkpoint_version() == every + 2
    assert (tmp_path / "t" / "_delta_log" / "_last_checkpoint").is_file()
    assert not maintenance.checkpoint_if_due(spark, "t", path)  # not due again yet
    _appended(spark, tmp_path / "t", every - 1, start=every + 2)
    assert not maintenance.checkpoint_if_due(spark, "t", path)
    _appended(spark, tmp_path / "t", 1, start=2 * every + 1)
    maintenance.after_batch(spark, [("t", path)])  # as a batch's maintenance
    assert log_.checkpoint_version() == 2 * every + 2
    expected = list(range(10 * (2 * every + 2)))
    assert sorted(DeltaTarget(path).read().column("id").to_pylist()) == expected
    spark_rows = spark.read.format("delta").load(path).collect()
    assert sorted(r["id"] for r in spark_rows) == expected


def test_checkpoints_of_tables_committed_together_are_spread() -> None:
    """A hundred tables that every batch commits reach their checkpoint interval in the same
    batch; each table's interval is shortened by up to half, by its path, so that their
    checkpoints do not all come in one batch."""
    maintenance = Maintenance(checkpoint_commits=50)
    paths = [f"/lake/probe/t{i:03d}" for i in range(100)]
    intervals = [maintenance.checkpoint_interval(p) for p in paths]
    assert all(26 <= n <= 50 for n in intervals)
    assert len(set(intervals)) >= 20
    assert max(intervals.count(n) for n in set(intervals)) <= 12
    assert intervals == [maintenance.checkpoint_interval(p) for p in paths]  # stable
    assert Maintenance(checkpoint_commits=1).checkpoint_interval(paths[0]) == 1


def test_a_lake_taken_over_is_not_maintained_by_the_run_that_lost_it(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Batches checked the lease before each commit; the maintenance thread beside them did
    not, and went on compacting and vacuuming a lake another process had taken over. Now each
    step checks it first, and a lost lease stops the worker."""
    path = _appended(spark, tmp_path / "t", 6)
    before = _operations(path)
    lost = False
    checks = 0

    def fence() -> None:
        nonlocal checks
        checks += 1
        if lost:
            raise LeaseLost("the lake was taken over by pgcdc run (pid 1 on another-host)")

    maintenance = Maintenance(compact_files=2, vacuum_retention_hours=0, vacuum_interval=0)
    worker = MaintenanceWorker(maintenance)
    try:
        lost = True
        with caplog.at_level(logging.WARNING, logger="pgcdc"):
            worker.submit(spark, [("t", path)], fence)
            assert worker.drain(120)
        assert checks == 1 and worker.stopped
        assert _operations(path) == before  # no OPTIMIZE, no VACUUM
        assert _parquet_on_disk(tmp_path / "t") == 6
        assert any("maintenance stopped" in r.getMessage() for r in caplog.records)
        # a lease held: the same tables are compacted
        lost = False
        worker = MaintenanceWorker(maintenance)
        worker.submit(spark, [("t", path)], fence)
        assert worker.drain(120)
        assert ("OPTIMIZE", COMPACT_METADATA) in _operations(path)
    finally:
        worker.stop()


def test_an_exclusive_vacuum_that_waited_for_a_batch_checks_the_lease_again(
    spark: Any, tmp_path: Path
) -> None:
    """A vacuum of short retention waits for the batch in flight; the lease was checked
    before the wait only, so a lake taken over during it was vacuumed under its new holder."""
    path = _appended(spark, tmp_path / "t", 6)
    Maintenance(compact_files=6, vacuum=False).after_batch(spark, [("t", path)])
    on_disk = _parquet_on_disk(tmp_path / "t")
    assert on_disk == 7  # the compacted file and the six it replaced, for a vacuum to delete
    gate = BatchGate()
    at_vacuum = threading.Event()
    lost = threading.Event()
    checks = 0

    def stopping() -> bool:
        nonlocal checks
        checks += 1
        if checks == 3:  # before compact, purge, then the vacuum, which waits for the batch
            at_vacuum.set()
        return lost.is_set()

    maintenance = Maintenance(compact_files=100, vacuum_retention_hours=0, vacuum_interval=0)
    with gate.batch():
        worker = threading.Thread(
            target=maintenance.after_batch,
            args=(spark, [("t", path)], gate),
            kwargs={"stopping": stopping},
        )
        worker.start()
        assert at_vacuum.wait(120)
        lost.set()  # the batch in flight fails on its fence and leaves the gate
    worker.join(120)
    assert not worker.is_alive()
    assert _parquet_on_disk(tmp_path / "t") == on_disk  # nothing vacuumed
    Maintenance(compact_files=100, vacuum_retention_hours=0, vacuum_interval=0).after_batch(
        spark, [("t", path)]
    )
    assert _parquet_on_disk(tmp_path / "t") == 1  # the same vacuum, with the lake held


def test_a_vacuum_counts_for_the_next_process_through_the_tables_log(
    spark: Any, tmp_path: Path
) -> None:
    """Scheduled runs (``--until-caught-up`` every few minutes) vacuum a table once per
    ``vacuum_interval``, not once per run: a process that never vacuumed the table reads the
    last vacuum's time from its log."""
    from pgcdc.lake.write import maintenance

    path = _appended(spark, tmp_path / "t", 2)
    assert maintenance.last_vacuum(spark, path) is None
    first = Maintenance(compact_files=0)
    # a new table is first vacuumed one interval after its creation
    assert not first.vacuum_if_due(spark, "t", path)
    maintenance._vacuumed.clear()
    created = time.monotonic() + first.vacuum_interval + 1
    assert first.vacuum_if_due(spark, "t", path, now=created)
    maintenance._vacuumed.clear()  # as in the next process
    ended = maintenance.last_vacuum(spark, path)
    assert ended is not None and abs(time.monotonic() - ended) < 120
    assert not Maintenance(compact_files=0).vacuum_if_due(spark, "t", path)
    maintenance._vacuumed.clear()
    later = time.monotonic() + first.vacuum_interval + 1
    assert Maintenance(compact_files=0).vacuum_if_due(spark, "t", path, now=later)


def test_rows_marked_deleted_are_purged_past_the_share(spark: Any, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    path = _appended(spark, tmp_path / "t", 4)
    DeltaTable.forPath(spark, path).delete("id % 10 < 2")  # 20% marked in deletion vectors
    assert deleted_share(spark, path) == pytest.approx(0.2)
    purge = Maintenance(purge_deleted_share=0.1)
    interval = purge.vacuum_interval
    clock = time.monotonic()
    # a new table is first checked one interval after its creation
    assert not purge.purge_if_due(spark, "t", path, now=clock)
    checked = clock + interval + 1
    assert not Maintenance(purge_deleted_share=0.25).purge_if_due(spark, "t", path, now=checked)
    # checked at most every vacuum_interval: the check above counts for this table
    assert not purge.purge_if_due(spark, "t", path, now=checked + 1)
    assert purge.purge_if_due(spark, "t", path, now=checked + interval + 1)
    assert deleted_share(spark, path) == 0.0
    assert ("REORG", PURGE_METADATA) in _operations(path)
    assert DeltaTarget(path).count() == 32


def test_maintenance_that_fails_never_fails_the_batch(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _appended(spark, tmp_path / "t", 3)
    # the next commit of the log is garbage: loading the table fails
    version = DeltaTarget(path).version()
    assert version is not None
    (tmp_path / "t" / "_delta_log" / f"{version + 1:020d}.json").write_text("not json\n")
    with caplog.at_level(logging.WARNING, logger="pgcdc.lake"):
        Maintenance(compact_files=2).after_batch(spark, [("public.t mirror", path)])
    assert "maintenance (compact) of public.t mirror failed" in caplog.text


@dataclasses.dataclass(frozen=True, slots=True)
class _Crowded(Maintenance):
    """Maintenance whose compaction loses every commit race while ``lose`` holds (as under a
    busy stream), and whose other steps are not due."""

    lose: list[bool] = dataclasses.field(default_factory=lambda: [True])
    gate: BatchGate | None = None
    #: per compaction: whether it held the batches off
    held: list[bool] = dataclasses.field(default_factory=list)

    def compact(self, spark: Any, name: str, path: str) -> bool:
        from delta.exceptions import ConcurrentAppendException

        self.held.append(self.gate is not None and self.gate._exclusive)
        if self.lose[0] and not self.held[-1]:
            raise ConcurrentAppendException(message="Files were added by a concurrent update")
        return True

    def checkpoint_if_due(self, spark: Any, name: str, path: str) -> bool:
        return False

    def purge_if_due(self, spark: Any, name: str, path: str) -> bool:
        return False

    def vacuum_if_due(self, spark: Any, name: str, path: str) -> bool:
        return False


def test_maintenance_that_keeps_giving_way_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One lost race is routine (INFO); a step that loses every race never runs, and the
    small files pile up: that is a warning, with what to do (it was INFO, every time)."""
    crowded = _Crowded()
    tables = [("public.t mirror", str(tmp_path / "t"))]
    with caplog.at_level(logging.INFO, logger="pgcdc.lake"):
        for _ in range(GAVE_WAY_WARNING - 1):
            crowded.after_batch(None, tables)
        assert "gave way to a batch's commit" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        crowded.after_batch(None, tables)
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1 and f"{GAVE_WAY_WARNING} times in a row" in warned[0]
        crowded.lose[0] = False  # it ran: the count starts again
        crowded.after_batch(None, tables)
        crowded.lose[0] = True
        for _ in range(GAVE_WAY_WARNING - 1):
            crowded.after_batch(None, tables)
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


@pytest.mark.slow
@newest_server
def test_a_pipeline_compacts_what_its_batches_add(
    pg: PgDatabase, spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = make_config(
        pg,
        tmp_path / "lake",
        [{"name": "t", "history": True, "changelog": True}],
        stream={"max_changes_per_trigger": 20},
        lake_options={"compact_files": 3, "vacuum_retention_hours": 0, "vacuum_interval": 0},
    )
    Pipeline(config, spark=spark).run(until_caught_up=True)
    for i in range(4):  # four transactions of 20 changes: four batches
        pg.execute(
            "INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
            (i * 10 + 1, i * 10 + 10),
        )
        pg.execute(
            "UPDATE t SET v = v || '+' WHERE id BETWEEN %s AND %s", (i * 10 + 1, i * 10 + 10)
        )
    pipeline = Pipeline(config, spark=spark)
    with caplog.at_level(logging.INFO, logger="pgcdc.lake"):
        result = pipeline.run(until_caught_up=True)
    assert result.batches >= 4
    # beside the batches, never inside one: the compactions ran in the maintenance thread
    compactions = [r for r in caplog.records if r.getMessage().startswith("compacted ")]
    assert compactions
    assert {r.threadName for r in compactions} == {"pgcdc-maintenance"}
    pipeline.check()
    assert_equal(pipeline)
    (table,) = pipeline.plan.tables if pipeline.plan else ()
    assert_history_matches_mirror(pipeline, table)
    for kind in ("mirror", "history", "changelog"):
        target = DeltaTarget(table.path(pipeline.layout, kind))
        operations = _operations(str(target.path))
        assert ("OPTIMIZE", COMPACT_METADATA) in operations, kind
        assert len(target.files()) < 3 + 3, kind  # compacted as the batches went
        assert _parquet_on_disk(target.path.local()) == len(target.files()), kind  # vacuumed
    changelog = DeltaTarget(table.path(pipeline.layout, "changelog")).read()
    assert changelog.num_rows == 80


def test_a_write_that_loses_to_a_compaction_is_written_again(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A MERGE whose commit comes after a compaction of the files it read fails with Delta's
    conflict and nothing of it written; ``again_on_conflict`` writes it again."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    path = _appended(spark, tmp_path / "t", 4)
    started, release = tmp_path / "merge-started", tmp_path / "release"

    @F.udf(T.LongType(), useArrow=False)  # type: ignore[misc]
    def held(value: int) -> int:
        # the first attempt's source waits (in the executor) until the compaction committed
        if not release.exists():
            started.touch()
            deadline = time.monotonic() + 120
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return value

    attempts = []

    def merge() -> None:
        attempts.append(1)
        source = spark.range(0, 20).coalesce(1).select(held(F.col("id")).alias("id"))
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedDelete()
            .execute()
        )

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            again_on_conflict(merge, "test merge")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    with caplog.at_level(logging.INFO, logger="pgcdc.lake"):
        writer = threading.Thread(target=run)
        writer.start()
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the MERGE's source never ran"
        assert Maintenance(compact_files=4, vacuum=False).compact(spark, "t", path)
        release.touch()
        writer.join(180)
    assert outcome == [None]
    assert len(attempts) == 2  # the first lost to the compaction
    assert "test merge: a concurrent commit" in caplog.text
    assert sorted(DeltaTarget(path).read().column("id").to_pylist()) == list(range(20, 40))


def test_a_write_that_keeps_conflicting_fails_after_its_attempts() -> None:
    from delta.exceptions import ConcurrentAppendException

    attempts = []

    def write() -> None:
        attempts.append(1)
        raise ConcurrentAppendException("a concurrent append")  # type: ignore[no-untyped-call]

    assert issubclass(ConcurrentAppendException, conflicts())
    with pytest.raises(ConcurrentAppendException):
        again_on_conflict(write, "test write")
    assert len(attempts) == CONFLICT_ATTEMPTS
    # anything but a conflict is not written again
    attempts.clear()

    def broken() -> None:
        attempts.append(1)
        raise ValueError("not a conflict")

    with pytest.raises(ValueError, match="not a conflict"):
        again_on_conflict(broken, "test write")
    assert len(attempts) == 1


def test_exclusive_maintenance_waits_for_batches_in_flight_and_holds_off_new_ones() -> None:
    gate = BatchGate()
    order: list[str] = []
    batch_in = threading.Event()
    batch_out = threading.Event()

    def batch() -> None:
        with gate.batch():
            order.append("batch starts")
            batch_in.set()
            batch_out.wait(10)
            order.append("batch ends")

    vacuum_in = threading.Event()

    def exclusive() -> None:
        with gate.exclusive():
            order.append("vacuum")
            vacuum_in.set()
            time.sleep(0.2)
            order.append("vacuum ends")

    first = threading.Thread(target=batch)
    first.start()
    batch_in.wait(10)
    vacuum = threading.Thread(target=exclusive)
    vacuum.start()
    time.sleep(0.2)
    assert order == ["batch starts"]  # the vacuum waits for the batch in flight
    batch_out.set()
    first.join(10)
    vacuum.join(10)
    assert order == ["batch starts", "batch ends", "vacuum", "vacuum ends"]
    # a batch that starts during an exclusive step waits for its end
    order.clear()
    batch_in.clear()
    vacuum_in.clear()
    vacuum = threading.Thread(target=exclusive)
    vacuum.start()
    assert vacuum_in.wait(10)  # the vacuum holds the gate before the batch tries it
    second = threading.Thread(target=batch)
    second.start()
    second.join(10)
    vacuum.join(10)
    assert order == ["vacuum", "vacuum ends", "batch starts", "batch ends"]


def test_a_step_cancelled_by_the_runs_stop_is_not_reported_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that stops cancels the maintenance step in flight (its Spark jobs fail as
    cancelled): logged as cancelled, not as a failure to try again after a later batch, and no
    further step starts."""
    calls: list[str] = []
    stopped = threading.Event()

    def checkpoint_if_due(self: Maintenance, spark: Any, name: str, path: str) -> None:
        calls.append("checkpoint")
        stopped.set()  # what MaintenanceWorker.stop does, then Spark fails the step's job
        raise RuntimeError("[SPARK_JOB_CANCELLED] Job 262 cancelled part of cancelled job group")

    def compact(self: Maintenance, spark: Any, name: str, path: str) -> None:
        calls.append("compact")

    monkeypatch.setattr(Maintenance, "checkpoint_if_due", checkpoint_if_due)
    monkeypatch.setattr(Maintenance, "compact", compact)
    with caplog.at_level(logging.INFO, logger="pgcdc"):
        Maintenance().after_batch(None, [("t", str(tmp_path / "t"))], stopping=stopped.is_set)
    assert calls == ["checkpoint"]
    assert "maintenance (checkpoint_if_due) of t cancelled: the run stops" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_compaction_that_keeps_giving_way_holds_the_batches_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Under updates scattered over a table every batch marks rows in the files a compaction
    rewrites: bench-scale's compactions gave way every time. After ``EXCLUSIVE_AFTER`` lost
    races the step waits for the batch in flight and holds off the next one, and lands; then
    it runs beside the batches again."""
    gate = BatchGate()
    crowded = _Crowded(gate=gate)
    tables = [("public.t mirror", str(tmp_path / "t"))]
    with caplog.at_level(logging.INFO, logger="pgcdc.lake"):
        for _ in range(EXCLUSIVE_AFTER):
            crowded.after_batch(None, tables, gate)
        assert crowded.held == [False] * EXCLUSIVE_AFTER
        in_flight = threading.Event()
        done = threading.Event()

        def batch() -> None:
            with gate.batch():
                in_flight.set()
                time.sleep(0.5)
                done.set()  # still in the batch: a step that did not wait would see it unset

        thread = threading.Thread(target=batch)
        thread.start()
        assert in_flight.wait(10)
        crowded.after_batch(None, tables, gate)  # waits for the batch, then holds the gate
        assert done.is_set()
        thread.join(10)
        assert crowded.held[-1] is True
        assert "holds off the next batch while it runs" in caplog.text
        crowded.after_batch(None, tables, gate)  # it landed: beside the batches again
        assert crowded.held[-1] is False
