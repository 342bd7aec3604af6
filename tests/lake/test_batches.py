"""Micro-batches in the source's DataFrame schema applied to Delta tables: the semantics.

The input is built by hand in the exact contract schema of ``pgcdc.spark`` (metadata columns,
one struct column per table), so that each rule is exercised deterministically: per-key
reduction by LSN order, key-changing updates, unchanged TOAST values taken from earlier changes
of the same row (also across key changes, chained), TRUNCATE in the middle of a transaction,
history versions and their closing, the changelog, and replays (idempotent by Delta
application transactions, also after a failure between two tables' commits). Every write goes
through Delta's Spark connector.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.store.tables import LakeLayout, LakeTable, TableKind
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lake.write.batch import LakeBatchWriter
from pgcdc.spark import table_column

T0 = datetime(2024, 1, 1, tzinfo=UTC)
COLUMN = table_column("public", "t")


def schema() -> Any:
    from pyspark.sql import types as T

    image = T.StructType(
        [
            T.StructField("id", T.IntegerType()),
            T.StructField("v", T.StringType()),
            T.StructField("big", T.StringType()),
        ]
    )
    table = T.StructType(
        [
            T.StructField("new", image),
            T.StructField("old", image),
            T.StructField("old_kind", T.StringType()),
            T.StructField("unchanged", T.ArrayType(T.StringType())),
        ]
    )
    return T.StructType(
        [
            T.StructField("_table_id", T.StringType(), False),
            T.StructField("_schema", T.StringType(), False),
            T.StructField("_table", T.StringType(), False),
            T.StructField("_op", T.StringType(), False),
            T.StructField("_commit_lsn", T.LongType(), False),
            T.StructField("_commit_lsn_text", T.StringType(), False),
            T.StructField("_end_lsn", T.LongType(), False),
            T.StructField("_position", T.IntegerType(), False),
            T.StructField("_xid", T.LongType()),
            T.StructField("_commit_time", T.TimestampType()),
            T.StructField(COLUMN, table),
        ]
    )


def ch(
    op: str,
    lsn: int,
    pos: int,
    new: tuple[Any, ...] | None = None,
    *,
    old_key: int | None = None,
    unchanged: tuple[str, ...] = (),
) -> tuple[Any, ...]:
    """One source row: ``old_key`` gives a 'K' old image with just the key."""
    old = None if old_key is None else (old_key, None, None)
    struct = None if op == "T" else (new, old, None if old is None else "K", list(unchanged))
    return (
        "public.t",
        "public",
        "t",
        op,
        lsn,
        f"0/{lsn:X}",
        lsn + 8,
        pos,
        lsn // 10,
        T0 + timedelta(seconds=lsn),
        struct,
    )


BATCHES: list[list[tuple[Any, ...]]] = [
    # 0: three rows with big (TOASTed) values
    [
        ch("I", 100, 0, (1, "a", "BIG1")),
        ch("I", 100, 1, (2, "b", "BIG2")),
        ch("I", 100, 2, (3, "c", "BIG3")),
    ],
    # 1: two updates of 1 in one transaction (big unchanged: stored value); 2 re-keyed to 20
    #    with big unchanged (taken from 2's stored row); 3 deleted and inserted again
    [
        ch("U", 200, 0, (1, "a2", None), unchanged=("big",)),
        ch("U", 200, 1, (1, "a3", None), unchanged=("big",)),
        ch("U", 300, 0, (20, "b", None), old_key=2, unchanged=("big",)),
        ch("D", 300, 1, old_key=3),
        ch("I", 300, 2, (3, "c-new", "BIG3b")),
    ],
    # 2: 1 -> 10 -> 11 (chained re-keys, big unchanged); 30 inserted, deleted, and 3 re-keyed
    #    to 30 with big unchanged: 3's value, not the deleted 30's
    [
        ch("U", 350, 0, (10, "x", None), old_key=1, unchanged=("big",)),
        ch("U", 350, 1, (11, "y", None), old_key=10, unchanged=("big",)),
        ch("I", 360, 0, (30, "z", "BIG30")),
        ch("D", 360, 1, old_key=30),
        ch("U", 360, 2, (30, "w", None), old_key=3, unchanged=("big",)),
    ],
    # 3: insert 5, TRUNCATE in the same transaction, insert 6; then update 6 (big unchanged)
    [
        ch("I", 400, 0, (5, "e", "BIG5")),
        ch("T", 400, 1),
        ch("I", 400, 2, (6, "f", "BIG6")),
        ch("U", 500, 0, (6, "f2", None), unchanged=("big",)),
    ],
]

MIRRORS = [
    {1: ("a", "BIG1"), 2: ("b", "BIG2"), 3: ("c", "BIG3")},
    {1: ("a3", "BIG1"), 20: ("b", "BIG2"), 3: ("c-new", "BIG3b")},
    {11: ("y", "BIG1"), 20: ("b", "BIG2"), 30: ("w", "BIG3b")},
    {6: ("f2", "BIG6")},
]

# (id, v, big, start, end, start_op, end_op) after all batches
HISTORY = {
    (1, "a", "BIG1", 100, 200, "I", "U"),
    (1, "a3", "BIG1", 200, 350, "U", "D"),
    (11, "y", "BIG1", 350, 400, "U", "T"),
    (2, "b", "BIG2", 100, 300, "I", "D"),
    (20, "b", "BIG2", 300, 400, "U", "T"),
    (3, "c", "BIG3", 100, 300, "I", "D"),
    (3, "c-new", "BIG3b", 300, 360, "U", "D"),
    (30, "w", "BIG3b", 360, 400, "I", "T"),
    (6, "f", "BIG6", 400, 500, "I", "U"),
    (6, "f2", "BIG6", 500, None, "U", None),
}

TABLE = LakeTable("public", "t", ("id",), "d", history=True, changelog=True)


def targets(lake: Path) -> dict[TableKind, DeltaTarget]:
    layout = LakeLayout(lake)
    return {kind: DeltaTarget(TABLE.path(layout, kind)) for kind in TABLE.kinds()}


def mirror(lake: Path) -> dict[int, tuple[str, str]]:
    rows = targets(lake)["mirror"].read().to_pylist()
    assert len({r["id"] for r in rows}) == len(rows)
    return {r["id"]: (r["v"], r["big"]) for r in rows}


def history(lake: Path) -> set[tuple[Any, ...]]:
    rows = targets(lake)["history"].read().to_pylist()
    for r in rows:
        assert r["__is_current"] == (r["__end_lsn"] is None)
        assert r["__start_at"] == T0 + timedelta(seconds=r["__start_lsn"])
    return {
        (
            r["id"],
            r["v"],
            r["big"],
            r["__start_lsn"],
            r["__end_lsn"],
            r["__start_op"],
            r["__end_op"],
        )
        for r in rows
    }


def versions(lake: Path) -> dict[TableKind, int | None]:
    return {kind: target.version() for kind, target in targets(lake).items()}


def writer(lake: Path, fail_after: int | None = None) -> LakeBatchWriter:
    return LakeBatchWriter(
        lake=str(lake),
        tables=(TABLE,),
        table_columns=(("public.t", COLUMN),),
        app_id="test-app",
        fail_after=fail_after,
    )


def test_batches_mirror_history_changelog_and_replays(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    frames = [spark.createDataFrame(rows, schema()) for rows in BATCHES]
    for batch_id, (df, expected) in enumerate(zip(frames, MIRRORS, strict=True)):
        writer(lake)(df, batch_id)
        assert mirror(lake) == expected, f"mirror after batch {batch_id}"
        current = {(r[0], (r[1], r[2])) for r in history(lake) if r[4] is None}
        assert current == set(expected.items()), f"history's current rows after {batch_id}"
    assert history(lake) == HISTORY
    changelog = targets(lake)["changelog"].read().to_pylist()
    assert len(changelog) == sum(len(b) for b in BATCHES)
    truncate = [r for r in changelog if r["__op"] == "T"]
    assert [(r["__commit_lsn"], r["__position"]) for r in truncate] == [(400, 1)]
    rekey = next(r for r in changelog if r["__commit_lsn"] == 300 and r["__position"] == 0)
    assert (rekey["id"], rekey["big"], rekey["__unchanged"], rekey["__old_kind"]) == (
        20,
        None,
        ["big"],
        "K",
    )
    assert rekey["__old"]["id"] == 2

    # a replayed batch is skipped: no new Delta commit anywhere, same content
    before, rows = versions(lake), mirror(lake)
    result = writer(lake).apply(frames[3], 3)
    assert result.skipped
    assert versions(lake) == before and mirror(lake) == rows


def test_replay_of_the_history_reads_the_mirror_from_before_the_batch(
    spark: Any, tmp_path: Path
) -> None:
    """A batch whose mirror and changelog committed but whose history did not (the three are
    written at the same time): the replay's history takes unchanged TOAST values from the
    mirror as it was before the batch, not from the batch's own mirror commit (where key 2,
    re-keyed to 20, is gone and key 1 holds the batch's last value)."""
    lake = tmp_path / "lake"
    frames = [spark.createDataFrame(rows, schema()) for rows in BATCHES]
    writer(lake)(frames[0], 0)
    without_history = LakeBatchWriter(
        lake=str(lake),
        tables=(LakeTable("public", "t", ("id",), "d", history=False, changelog=True),),
        table_columns=(("public.t", COLUMN),),
        app_id="test-app",
    )
    without_history(frames[1], 1)
    assert not targets(lake)["history"].applied("test-app", 1)
    before = versions(lake)
    writer(lake)(frames[1], 1)
    after = versions(lake)
    assert after == {**before, "history": (before["history"] or 0) + 1}
    for batch_id in (2, 3):
        writer(lake)(frames[batch_id], batch_id)
    assert history(lake) == HISTORY
    assert mirror(lake) == MIRRORS[3]


def test_failure_between_commits_then_replay(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    frames = [spark.createDataFrame(rows, schema()) for rows in BATCHES]
    writer(lake)(frames[0], 0)
    with pytest.raises(RuntimeError, match="injected failure"):
        writer(lake, fail_after=1)(frames[1], 1)  # some of the three commits are there
    done = {kind: t.applied("test-app", 1) for kind, t in targets(lake).items()}
    assert any(done.values())
    committed = versions(lake)
    writer(lake)(frames[1], 1)  # the replay writes the others only
    after = versions(lake)
    for kind, version in committed.items():
        assert after[kind] == (version if done[kind] else (version or 0) + 1), kind
    assert mirror(lake) == MIRRORS[1]
    for batch_id in (2, 3):
        writer(lake)(frames[batch_id], batch_id)
    assert mirror(lake) == MIRRORS[3]
    assert history(lake) == HISTORY
    assert len(targets(lake)["changelog"].read()) == sum(len(b) for b in BATCHES)


def test_the_overview_counts_each_tables_changes_truncates_and_unchanged_columns(
    spark: Any,
) -> None:
    """Per table: counts per operation, the LSN range, the truncates in LSN order, the columns
    some change left as unchanged TOAST (rows whose list is empty or null add none) and the
    updates with an old image and unchanged values."""
    from pgcdc.lake.write.changes import Truncate, batch_overview

    other = ch("I", 150, 0, (9, "other", "x"))
    other = ("public.u", "public", "u", *other[3:-1], None)
    no_list = ch("I", 120, 0, (7, "g", "BIG7"))
    no_list = (*no_list[:-1], (no_list[-1][0], None, None, None))  # unchanged: null, not []
    rows = BATCHES[1] + BATCHES[3] + [no_list, other]
    overview = batch_overview(spark.createDataFrame(rows, schema()), {"public.t": COLUMN})
    info = overview.tables["public.t"]
    assert (info.inserts, info.updates, info.deletes) == (4, 4, 1)
    # Spark collects timestamps as naive datetimes in the session time zone (UTC)
    naive = T0.replace(tzinfo=None) + timedelta(seconds=400)
    assert info.truncates == (Truncate(400, 1, naive),)
    assert (info.min_lsn, info.max_lsn) == (120, 500)
    assert info.unchanged_columns == frozenset({"big"})
    assert info.old_with_unchanged == 1  # 2 re-keyed to 20, big unchanged
    assert info.changes == 10
    assert overview.tables["public.u"].inserts == 1
    assert overview.tables["public.u"].unchanged_columns == frozenset()
    assert (overview.changes, overview.min_lsn, overview.max_lsn) == (11, 120, 500)

    plain = batch_overview(spark.createDataFrame(BATCHES[0] + [no_list], schema()), {})
    assert plain.tables["public.t"].unchanged_columns == frozenset()  # no struct column known


def test_tables_of_a_batch_written_in_parallel_each_record_the_batch(
    spark: Any, tmp_path: Path
) -> None:
    """Several tables in one batch are written at the same time, each in a Spark session of its
    own: every Delta table still records the batch's application transaction (so that a
    replay is recognised per table), a failure in one thread fails the batch, and the replay
    writes only what is missing."""
    from pyspark.sql import types as T

    names = ("t", "u", "w")
    columns = {f"public.{n}": table_column("public", n) for n in names}
    base = schema()
    struct = base[COLUMN].dataType
    fields = [f for f in base.fields if f.name != COLUMN]
    fields += [T.StructField(c, struct) for c in columns.values()]
    tables = tuple(
        LakeTable("public", n, ("id",), "d", history=True, changelog=True) for n in names
    )
    layout = LakeLayout(tmp_path / "lake")

    def rows(batch: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        out = []
        for n in names:
            for row in batch:
                cells = [None] * len(columns)
                cells[names.index(n)] = row[-1]
                out.append((f"public.{n}", "public", n, *row[3:-1], *cells))
        return out

    def make(fail_after: int | None = None) -> LakeBatchWriter:
        return LakeBatchWriter(
            lake=str(layout.root),
            tables=tables,
            table_columns=tuple(columns.items()),
            app_id="test-app",
            fail_after=fail_after,
        )

    frames = [spark.createDataFrame(rows(b), T.StructType(fields)) for b in BATCHES]
    make()(frames[0], 0)
    with pytest.raises(RuntimeError, match="injected failure"):
        make(fail_after=2)(frames[1], 1)
    make()(frames[1], 1)
    make()(frames[2], 2)
    for table in tables:
        for kind in table.kinds():
            target = DeltaTarget(table.path(layout, kind))
            assert target.applied("test-app", 2), f"{table.table_id} {kind}"
        got = DeltaTarget(table.path(layout, "mirror")).read().to_pylist()
        assert {r["id"]: (r["v"], r["big"]) for r in got} == MIRRORS[2], table.table_id
        changelog = DeltaTarget(table.path(layout, "changelog")).read()
        assert len(changelog) == sum(len(b) for b in BATCHES[:3]), table.table_id
    assert make().apply(frames[2], 2).skipped


def test_a_writer_that_lost_the_lake_commits_nothing(spark: Any, tmp_path: Path) -> None:
    """The fence (the run's lease on the lake, ``Lease.check``) is checked before each Delta
    commit: a run whose S3 lake another process took over writes nothing more."""
    from pgcdc.lake.store.storage import LeaseLost

    lake = tmp_path / "lake"
    frames = [spark.createDataFrame(rows, schema()) for rows in BATCHES[:2]]
    writer(lake)(frames[0], 0)
    before = versions(lake)

    def lost() -> None:
        raise LeaseLost("the lake was taken over by another run")

    fenced = dataclasses.replace(writer(lake), fence=lost)
    with pytest.raises(LeaseLost, match="taken over"):
        fenced(frames[1], 1)
    assert versions(lake) == before
    writer(lake)(frames[1], 1)  # the process that holds the lake writes the batch
    assert mirror(lake) == MIRRORS[1]
