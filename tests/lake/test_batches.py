"""Micro-batches in the source's DataFrame schema applied to Delta tables: the semantics.

The input is built by hand in the exact contract schema of ``pgcdc.spark`` (metadata columns,
one struct column per table), so that each rule is exercised deterministically: per-key
reduction by LSN order, key-changing updates, unchanged TOAST values taken from earlier changes
of the same row (also across key changes, chained), TRUNCATE in the middle of a transaction,
history versions and their closing, the changelog, and replays (idempotent by Delta
application transactions, also after a failure between two tables' commits).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.batch import LakeBatchWriter, commit_bytes, driver_heap
from pgcdc.lake.tables import LakeLayout, LakeTable, TableKind
from pgcdc.lake.target import DeltaTarget
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


def writer(
    lake: Path, fail_after: int | None = None, rows_per_commit: int = 250_000
) -> LakeBatchWriter:
    return LakeBatchWriter(
        lake=str(lake),
        tables=(TABLE,),
        table_columns=(("public.t", COLUMN),),
        app_id="test-app",
        fail_after=fail_after,
        rows_per_commit=rows_per_commit,
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


def test_failure_between_commits_then_replay(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    frames = [spark.createDataFrame(rows, schema()) for rows in BATCHES]
    writer(lake)(frames[0], 0)
    with pytest.raises(RuntimeError, match="injected failure"):
        writer(lake, fail_after=1)(frames[1], 1)  # the mirror committed, history did not
    assert mirror(lake) == MIRRORS[1]
    committed = versions(lake)
    writer(lake)(frames[1], 1)  # the replay completes history and changelog only
    after = versions(lake)
    assert after["mirror"] == committed["mirror"]
    assert after["history"] == (committed["history"] or 0) + 1
    assert after["changelog"] == (committed["changelog"] or 0) + 1
    for batch_id in (2, 3):
        writer(lake)(frames[batch_id], batch_id)
    assert mirror(lake) == MIRRORS[3]
    assert history(lake) == HISTORY
    assert len(targets(lake)["changelog"].read()) == sum(len(b) for b in BATCHES)


def test_chunked_commits_and_replay_after_a_failure_between_chunks(
    spark: Any, tmp_path: Path
) -> None:
    """Batches above ``rows_per_commit`` (here: every batch of more than one change) are
    staged by the executors and committed chunk by chunk (one commit per chunk, empty chunks
    included); the re-keyed rows whose unchanged values come from another key's stored row,
    and the TRUNCATE, give the same lake as one commit per table. A failure after some chunks,
    then a replay: each chunk lands once."""
    lake = tmp_path / "lake"
    frames = [spark.createDataFrame(rows, schema()) for rows in BATCHES]
    writer(lake, rows_per_commit=1)(frames[0], 0)
    assert mirror(lake) == MIRRORS[0]
    # created by the first chunk's schema step (version 0), then one commit per chunk
    first = versions(lake)
    assert first == {"mirror": 3, "history": 3, "changelog": 3}, first
    with pytest.raises(RuntimeError, match="injected failure"):
        writer(lake, fail_after=2, rows_per_commit=1)(frames[1], 1)  # 2 of 5 mirror chunks
    mirror_target = targets(lake)["mirror"]
    assert mirror_target.version() == 5
    assert not mirror_target.applied("test-app", 1)
    assert mirror_target.chunk_applied("test-app", 1, 1)
    assert not mirror_target.chunk_applied("test-app", 1, 2)
    # the replay runs with other settings (one commit per table): the interrupted mirror is
    # still split as before (its remaining 3 chunks), the rest follows the new settings; the
    # history is in one piece anyway (a key change fills values from another key's row)
    writer(lake)(frames[1], 1)
    assert versions(lake) == {"mirror": 8, "history": 4, "changelog": 4}
    assert mirror_target.applied("test-app", 1)
    assert mirror(lake) == MIRRORS[1]
    for batch_id in (2, 3):
        writer(lake, rows_per_commit=1)(frames[batch_id], batch_id)
        assert mirror(lake) == MIRRORS[batch_id], f"mirror after batch {batch_id}"
    assert history(lake) == HISTORY
    changelog = targets(lake)["changelog"].read().to_pylist()
    assert sorted((r["__commit_lsn"], r["__position"]) for r in changelog) == sorted(
        (row[4], row[7]) for rows in BATCHES for row in rows
    )
    # batch 2 in 5 chunks, batch 3 in 4; their history in one piece (key changes, TRUNCATE)
    assert versions(lake) == {"mirror": 17, "history": 6, "changelog": 13}
    assert not any(LakeLayout(lake).stage_dir.rglob("*.arrow"))
    before = versions(lake)
    assert writer(lake, rows_per_commit=1).apply(frames[3], 3).skipped
    assert versions(lake) == before


def test_the_overview_counts_each_tables_changes_truncates_and_unchanged_columns(
    spark: Any,
) -> None:
    """Per table: counts per operation, the LSN range, the truncates in LSN order, the columns
    some change left as unchanged TOAST (rows whose list is empty or null add none) and the
    updates with an old image and unchanged values."""
    from pgcdc.lake.changes import Truncate, batch_overview

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


def test_chunks_follow_the_rows_or_their_weight(spark: Any) -> None:
    """The chunk count of a table in a batch: by its change count or by its values' size."""
    from pgcdc.lake.changes import batch_overview

    overview = batch_overview(spark.createDataFrame(BATCHES[0], schema()), {"public.t": COLUMN})
    info = overview.tables["public.t"]
    assert info.image_bytes == 3 * (8 + 1 + 4)  # id (fixed width), v, big
    plain = LakeBatchWriter(lake="x", tables=(TABLE,), table_columns=(), app_id="a")
    assert plain._chunks(info) == 1
    assert replace(plain, rows_per_commit=2)._chunks(info) == 2
    assert replace(plain, bytes_per_commit=20)._chunks(info) == 2
    assert replace(plain, rows_per_commit=1, bytes_per_commit=20)._chunks(info) == 3


def _chunk_commits(target: DeltaTarget, batch_id: int) -> list[dict[str, Any]]:
    """The MERGE commits of ``batch_id``'s chunks, in chunk order."""
    commits = [
        c
        for c in target.table().history()  # type: ignore[union-attr]
        if c.get("operation") == "MERGE" and c.get("pgcdc", {}).get("batch") == batch_id
    ]
    return sorted(commits, key=lambda c: c["pgcdc"]["chunk"])


def test_range_chunks_read_only_their_own_keys(spark: Any, tmp_path: Path) -> None:
    """A large batch of new keys is split into runs of keys in order: each chunk's MERGE is
    limited to its own key range (delta-rs skips the files of the other chunks), and every
    key lands once."""
    import re

    lake = tmp_path / "lake"
    keys = list(range(1, 41))
    rows = [ch("I", 100 + k, 0, (k, f"v{k}", None)) for k in reversed(keys)]
    writer(lake, rows_per_commit=10)(spark.createDataFrame(rows, schema()), 0)
    assert mirror(lake) == {k: (f"v{k}", None) for k in keys}
    commits = _chunk_commits(targets(lake)["mirror"], 0)
    assert [c["pgcdc"]["chunk"] for c in commits] == [0, 1, 2, 3]
    assert {c["pgcdc"]["split"] for c in commits} == {"range"}
    ranges = []
    for c in commits:
        found = re.fullmatch(r"id >= (\d+) AND id <= (\d+)", c["operationParameters"]["predicate"])
        assert found, c["operationParameters"]
        ranges.append((int(found[1]), int(found[2])))
    assert ranges == [(1, 10), (11, 20), (21, 30), (31, 40)]


def resolved_events(spark: Any, rows: list[tuple[Any, ...]]) -> tuple[Any, list[str], Any]:
    """A batch of ``rows``: its overview of the table, the table's column names and its events
    with unchanged TOAST values resolved (the input of ``mirror_rows`` and ``history_rows``)."""
    from pgcdc.lake.changes import batch_overview, image_columns, resolve_unchanged, table_events

    df = spark.createDataFrame(rows, schema())
    info = batch_overview(df, {"public.t": COLUMN}).tables["public.t"]
    _, names = image_columns(df, COLUMN)
    resolved = resolve_unchanged(
        table_events(df, TABLE, COLUMN, names),
        names,
        info.unchanged_columns,
        TABLE.keys,
        rekeyed=info.old_with_unchanged > 0,
    )
    return info, names, resolved


def test_range_boundaries_from_the_events_keys_are_the_rows_boundaries(spark: Any) -> None:
    """A staged mirror or history split by key ranges finds its boundaries in the events' key
    columns (``mirror_keys``, ``history_keys``) rather than in its rows (an aggregation of
    every event's values): the same distinct keys, so every row gets the chunk the rows'
    own boundaries give it (as a replay of a batch an older pgcdc split must)."""
    from pyspark.sql import functions as F

    from pgcdc.lake.history import history_keys, history_rows
    from pgcdc.lake.mirror import mirror_keys, mirror_rows
    from pgcdc.lake.stage import range_chunks

    many = [ch("I", 900, k, (k, f"v{k}", None)) for k in range(40, 0, -1)]
    many += [ch("U", 910, k, (k, f"w{k}", None)) for k in range(1, 41, 3)]
    many += [ch("D", 920, k, old_key=k) for k in range(2, 41, 5)]
    many += [ch("D", 930, 0, old_key=77), ch("I", 930, 1, (None, "n", None))]
    many += [ch("I", 940, 0, (50, "x", None)), ch("T", 940, 1), ch("I", 940, 2, (60, "y", None))]

    def distinct(frame: Any) -> set[int]:
        return {r[0] for r in frame.select("id").where("id IS NOT NULL").distinct().collect()}

    splits = 0
    for rows in [*BATCHES, many, many[:-3]]:
        info, names, resolved = resolved_events(spark, rows)
        for build, keys in ((mirror_rows, mirror_keys), (history_rows, history_keys)):
            frame = build(resolved, TABLE, names, info)
            key_frame = keys(resolved, TABLE, info)
            assert distinct(key_frame) == distinct(frame)
            n = 4
            chunked = frame.select(
                range_chunks(frame, "id", n).alias("by_rows"),
                range_chunks(frame, "id", n, keys=key_frame).alias("by_keys"),
            )
            assert chunked.where(F.col("by_rows") != F.col("by_keys")).count() == 0
            splits += chunked.select("by_rows").distinct().count() == n
    assert splits >= 2  # the batch of 40 keys, in each of mirror and history


def test_a_replay_splits_the_batch_as_the_interrupted_attempt_did(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt that split its mirror by hash (a key Spark cannot sort, or a pgcdc before
    range splits) and failed after its first chunk: the replay, where the key can be sorted,
    still splits by hash, so no row falls between the chunks of the two attempts."""
    import pgcdc.lake.batch as batch_module

    lake = tmp_path / "lake"
    keys = list(range(1, 41))
    frame = spark.createDataFrame([ch("I", 100 + k, 0, (k, f"v{k}", None)) for k in keys], schema())
    with monkeypatch.context() as patched:
        patched.setattr(batch_module, "range_splittable", lambda df, columns: False)
        with pytest.raises(RuntimeError, match="injected failure"):
            writer(lake, fail_after=1, rows_per_commit=10)(frame, 0)
    mirror_target = targets(lake)["mirror"]
    assert mirror_target.partial_chunks("test-app", 0) == (4, "hash")
    writer(lake, rows_per_commit=10)(frame, 0)
    commits = _chunk_commits(mirror_target, 0)
    assert [c["pgcdc"]["chunk"] for c in commits] == [0, 1, 2, 3]
    assert {c["pgcdc"]["split"] for c in commits} == {"hash"}
    assert mirror(lake) == {k: (f"v{k}", None) for k in keys}
    assert mirror_target.applied("test-app", 0)


def test_the_driver_reduction_gives_the_rows_of_the_spark_reduction(spark: Any) -> None:
    """A batch committed in one piece is reduced per key on the driver (``last_per_key`` over
    ``mirror_events``): the same MERGE source as ``mirror_rows``' Spark aggregation, for every
    batch above and one with NULL keys (equal to each other, as under REPLICA IDENTITY FULL)
    and a key deleted and inserted again."""
    from pgcdc.lake.mirror import last_per_key, mirror_events, mirror_rows, reducible_keys

    extra = [
        ch("I", 600, 0, (None, "n1", "B1")),
        ch("U", 600, 1, (None, "n2", None), unchanged=("big",)),
        ch("I", 700, 0, (7, "g", "B7")),
        ch("D", 700, 1, old_key=7),
        ch("I", 700, 2, (7, "g2", "B7b")),
        ch("U", 800, 0, (8, "h", None), old_key=7, unchanged=("big",)),
    ]
    reduced = []
    for rows in [*BATCHES, extra]:
        info, names, resolved = resolved_events(spark, rows)
        events = mirror_events(resolved, TABLE, names, info)
        assert reducible_keys(events, TABLE)
        collected = events.toArrow()
        on_driver = last_per_key(collected, TABLE.keys)
        in_spark = mirror_rows(resolved, TABLE, names, info).toArrow()
        assert on_driver.column_names == in_spark.column_names

        def key(row: dict[str, Any]) -> tuple[bool, int]:
            return (row["id"] is None, row["id"] or 0)

        assert sorted(on_driver.to_pylist(), key=key) == sorted(in_spark.to_pylist(), key=key)
        reduced.append((collected.num_rows, on_driver.num_rows))
    assert reduced[-1] == (7, 3)  # NULL; 7 deleted; 8 (7 re-keyed: a delete and an upsert)
    assert any(events > rows for events, rows in reduced[:-1])
    floats = spark.createDataFrame([(1.5,)], "id double")
    assert not reducible_keys(floats, TABLE)  # Spark's GROUP BY makes NaNs equal: left to it


def test_commit_bytes_follow_the_driver_heap(spark: Any) -> None:
    mib = 1 << 20
    assert commit_bytes(None) == 128 * mib  # Spark Connect: no heap to read
    assert commit_bytes(1 << 30) == commit_bytes(8 << 30) == 128 * mib
    assert commit_bytes(512 * mib) == 128 * mib * 212 // 724  # 37.5 MiB
    assert 37 * mib < commit_bytes(768 * mib) < 128 * mib
    assert commit_bytes(300 * mib) == 16 * mib  # never below 16 MiB
    heap = driver_heap(spark)  # the tests' session: Spark's default 1 GiB driver heap
    assert heap is not None and 900 * mib < heap <= 1 << 30
