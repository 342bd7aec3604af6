"""Changes kept aside for a table copied beside the stream (``pgcdc.lake.write.held``): the
rows of each batch written whole and read back in the source's shape, a batch written again
(a replay) replacing its folder, batches read by range, and folders of two query schemas (a
column added between them) read as one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgcdc.lake.store.tables import LakeLayout, LakeTable
from pgcdc.lake.write.held import HeldTable, held_folder, held_rows, held_tables, keep_rows
from pgcdc.spark import table_column
from pgcdc.spark.schema import METADATA_COLUMNS


def _batch(spark: Any, rows: list[tuple[str, int, int, str | None]], *, extra: bool) -> Any:
    """A micro-batch of two tables (``held`` and ``other``): (table, lsn, id, note) rows;
    ``extra``: ``held``'s struct has a column more (added on the source since)."""
    held_new = "id INT, note STRING" + (", extra INT" if extra else "")
    ddl = (
        "_table_id STRING, _schema STRING, _table STRING, _op STRING, _commit_lsn BIGINT, "
        "_commit_lsn_text STRING, _end_lsn BIGINT, _position INT, _xid BIGINT, "
        f"_commit_time TIMESTAMP, t__public__held STRUCT<new: STRUCT<{held_new}>, "
        f"old: STRUCT<{held_new}>, old_kind: STRING, unchanged: ARRAY<STRING>>, "
        "t__public__other STRUCT<new: STRUCT<id: INT>, old: STRUCT<id: INT>, "
        "old_kind: STRING, unchanged: ARRAY<STRING>>"
    )
    data = []
    for table, lsn, key, note in rows:
        image = (key, note, 7) if extra else (key, note)
        held = ((image, None, None, []) if table == "held" else None,)
        other = (((key,), None, None, []) if table == "other" else None,)
        data.append(
            (f"public.{table}", "public", table, "I", lsn, "0/1", lsn, 0, 1, None, *held, *other)
        )
    return spark.createDataFrame(data, ddl)


def test_kept_rows_read_back_by_batch_range(spark: Any, tmp_path: Path) -> None:
    layout = LakeLayout(tmp_path / "lake")
    table = LakeTable(schema="public", name="held", keys=("id",), replica_identity="d")
    entry = HeldTable(
        table=table,
        column=table_column("public", "held"),
        folder=held_folder(layout, table, 2),
        from_batch=5,
        last_batch=4,
    )
    keep_rows(_batch(spark, [("held", 10, 1, "a"), ("other", 11, 2, None)], extra=False), entry, 5)
    # a replay of batch 6 replaces what an earlier attempt of it wrote
    keep_rows(_batch(spark, [("held", 12, 2, "stale")], extra=False), entry, 6)
    keep_rows(_batch(spark, [("held", 12, 2, "b"), ("held", 13, 3, "c")], extra=False), entry, 6)
    keep_rows(_batch(spark, [("held", 14, 4, "d")], extra=True), entry, 7)
    assert held_rows(spark, entry, 7, 9) is None

    def keys(after: int, through: int) -> list[tuple[int, str]]:
        rows = held_rows(spark, entry, after, through)
        assert rows is not None
        assert list(rows.columns[: len(METADATA_COLUMNS)]) == list(METADATA_COLUMNS)
        assert rows.columns[len(METADATA_COLUMNS) :] == [entry.column]  # not the other table's
        got = rows.select("_commit_lsn", f"{entry.column}.new.note").collect()
        return sorted((r[0], r[1]) for r in got)

    assert keys(4, 5) == [(10, "a")]
    assert keys(5, 6) == [(12, "b"), (13, "c")]
    # a column added between two batches: both read, the earlier ones with it null
    both = held_rows(spark, entry, 4, 7)
    assert both is not None
    extra = sorted(
        (r[0], r[1]) for r in both.select("_commit_lsn", f"{entry.column}.new.extra").collect()
    )
    assert extra == [(10, None), (12, None), (13, None), (14, 7)]
    # the folder of the table's copy attempt: another attempt's is another folder
    assert held_folder(layout, table, 3) != entry.folder
    assert str(entry.folder).startswith(str(held_folder(layout, table)))


def test_held_tables_are_one_registry_per_stream() -> None:
    table = LakeTable(schema="s", name="t", keys=("id",), replica_identity="d")
    entry = HeldTable(table, "t__s__t", held_folder(LakeLayout("/tmp/x"), table, 1), 0, -1)
    held = held_tables("test-registry-app")
    assert held_tables("test-registry-app") is held
    assert held_tables("another-app") is not held
    held.hold(entry)
    assert held.held() == [entry] and held.direct() == [] and held.ids() == {"s.t"}
    entry.direct = True
    assert held.held() == [] and held.direct() == [entry]
    held.drop("s.t")
    assert held.ids() == set()
