"""Pure pieces of pgcdc.spark: column naming, options, the batch selection of the index, Arrow
conformance, the COPY binary stream's framing. No server, no Spark."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.lsn import Lsn
from pgcdc.protocol.arrow.columnar import ColumnarDecoder
from pgcdc.protocol.encoder import Encoder
from pgcdc.protocol.errors import CopyFormatError
from pgcdc.protocol.messages import Column, Relation
from pgcdc.spark import (
    CopyAgain,
    OptionError,
    SchemaChanged,
    SparkSourceError,
    is_schema_changed,
    raised_as,
)
from pgcdc.spark.catalog import CatalogColumn, CatalogTable, SourceCatalog
from pgcdc.spark.conform import conform
from pgcdc.spark.index import TransactionIndex, TxnEntry
from pgcdc.spark.options import (
    SnapshotSettings,
    parse_qualified_names,
    parse_size,
    renamed_columns,
    snapshot_settings,
    stream_settings,
    text_columns,
    type_choices,
)
from pgcdc.spark.schema import TypeChoices, parse_table_column, table_column
from pgcdc.spark.session import local_cores
from pgcdc.spark.snapshot import (
    PgcdcSnapshotReader,
    SnapshotPartition,
    _generate,
    copy_tuples,
    split_copy_tuples,
)
from pgcdc.spark.stream import MIN_SPLIT_BYTES, partition_target

names = st.text(min_size=1, max_size=12).filter(lambda s: "\x00" not in s)


@settings(max_examples=300, deadline=None)
@given(names, names, names, names)
def test_table_columns_are_legal_unique_and_reversible(s1: str, t1: str, s2: str, t2: str):
    a, b = table_column(s1, t1), table_column(s2, t2)
    assert re.fullmatch(r"t__[a-z0-9_]+", a)
    assert parse_table_column(a) == (s1, t1)
    if (s1, t1) != (s2, t2):
        assert a.lower() != b.lower()  # unique even for Spark's case-insensitive resolution


def test_the_executors_modules_do_not_import_the_replication_layer() -> None:
    """A Spark Python worker that reads a partition imports the source's modules: neither the
    replication layer nor psycopg/psycopg2 (a tenth of a second or more per worker process);
    the driver-side parts import them where they run."""
    code = (
        "import sys, pgcdc.spark, pgcdc.spark.source, pgcdc.spark.stream, pgcdc.spark.decode, "
        "pgcdc.spark.endpoint, pgcdc.spark.catalog; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('psycopg', 'psycopg2') or m.startswith('pgcdc.replication')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_source_errors_never_carry_a_password() -> None:
    error = SparkSourceError("could not connect with host=h password=abc", "fix password=x")
    assert "abc" not in str(error) and "password=***" in str(error)
    assert error.fix == "fix password=***"


def test_table_column_examples():
    assert table_column("public", "order_items") == "t__public__order_items"
    assert table_column("public", "Orders") == "t__public___4f7264657273"
    assert table_column("a__b", "c") != table_column("a", "b__c")
    assert parse_table_column("_table_id") is None
    assert parse_table_column("t__x") is None


def test_options_are_checked_with_the_fix():
    with pytest.raises(OptionError, match=r"needs the option 'slot'.*Fix: \.option\(\"slot\""):
        stream_settings({"dsn": "dbname=x", "publications": "p"})
    with pytest.raises(OptionError, match="maxChangesPerTrigger='-3' is not a positive integer"):
        stream_settings(
            {"dsn": "d", "slot": "s", "publications": "p", "maxchangespertrigger": "-3"}
        )
    with pytest.raises(OptionError, match="minChangesPerTrigger is larger"):
        stream_settings(
            {
                "dsn": "d",
                "slot": "s",
                "publications": "p",
                "minchangespertrigger": "10",
                "maxchangespertrigger": "5",
            }
        )
    settings = stream_settings(
        {"dsn": "d", "slot": "s", "publications": '["a", "b,c"]', "maxbytespertrigger": "2m"}
    )
    assert settings.publications == ("a", "b,c") and settings.max_bytes == 2 << 20
    assert parse_size("x", "64k") == 65536
    with pytest.raises(OptionError, match="not a size"):
        parse_size("partitionBytes", "lots")
    assert parse_qualified_names("tables", 'public.a, "Odd.Schema"."T,1", b') == (
        ("public", "a"),
        ("Odd.Schema", "T,1"),
        ("public", "b"),
    )
    with pytest.raises(OptionError, match="needs the LSN it was exported at"):
        snapshot_settings({"dsn": "d", "tables": "t", "snapshot": "00000003-0000000A-1"})
    snap = snapshot_settings(
        {
            "dsn": "d",
            "tables": "t",
            "rowfilter.public.t": "a > 1",
            "rowFilters": '{"public.u": ["b", "c"]}',
        }
    )
    assert snap.row_filters == {("public", "t"): ["a > 1"], ("public", "u"): ["b", "c"]}


def test_a_boolean_option_is_true_or_false_as_spark_spells_it():
    """Issue 41: "yes", "1" and "on" were taken as true (and "no", "0", "off" as false), a
    rule documented nowhere; Spark's own sources read true or false, in any case."""
    base = {"dsn": "d", "slot": "s", "publications": "p"}
    assert type_choices({"jsonasvariant": " TRUE ", "timeastime": "False"}) == TypeChoices(
        json_as_variant=True, time_as_time=False
    )
    assert stream_settings({**base, "binary": "true"}).binary == "true"
    assert stream_settings({**base, "binary": "Auto"}).binary == "auto"
    for text in ("yes", "1", "on", "no", "0", "off", ""):
        with pytest.raises(OptionError, match=r"is not true or false.*Fix: set jsonAsVariant=true"):
            type_choices({"jsonasvariant": text or " "})
        with pytest.raises(OptionError, match="option binary="):
            stream_settings({**base, "binary": text or " "})


def test_min_partitions_shrinks_the_partition_target_down_to_a_floor():
    mb = 1 << 20
    settings = stream_settings({"dsn": "d", "slot": "s", "publications": "p"})
    assert settings.min_partitions == 1
    assert (
        stream_settings(
            {"dsn": "d", "slot": "s", "publications": "p", "minpartitions": "4"}
        ).min_partitions
        == 4
    )
    with pytest.raises(OptionError, match="minPartitions='0' is not a positive integer"):
        stream_settings({"dsn": "d", "slot": "s", "publications": "p", "minPartitions": "0"})
    assert partition_target(100 * mb, 64 * mb, 1) == 64 * mb
    assert partition_target(100 * mb, 64 * mb, 2) == 50 * mb
    assert partition_target(101, 64 * mb, 2) == MIN_SPLIT_BYTES  # small batches stay whole
    assert partition_target(3 * mb + 1, 64 * mb, 3) == mb + 1  # rounded up: never a 4th
    assert partition_target(1000 * mb, 64 * mb, 2) == 64 * mb  # partitionBytes still caps
    assert partition_target(100 * mb, 2048, 2) == 2048  # ... even below the floor


def test_local_masters_name_their_cores():
    assert local_cores("local") == 1
    assert local_cores("local[3]") == 3
    assert local_cores("local[2,4]") == 2
    assert local_cores("local[*]") == (os.cpu_count() or 1)
    assert local_cores("spark://h:7077") == 1


def _entry(commit: int, rows: int, nbytes: int) -> TxnEntry:
    return TxnEntry(
        commit, commit + 8, 0, commit, False, ((commit * 10, commit * 10 + 5),), rows, nbytes
    )


def test_index_batches_whole_transactions_within_limits():
    index = TransactionIndex()
    for commit, rows in ((100, 3), (200, 4), (300, 1), (400, 9), (500, 2)):
        index.append(_entry(commit, rows, rows * 100))
    assert index.select(99, max_rows=5)[:3] == (0, 1, 3)
    assert index.select(100, max_rows=5)[:3] == (1, 3, 5)
    assert index.select(300, max_rows=5)[:3] == (3, 4, 9)  # one transaction, over the limit
    assert index.select(99, max_bytes=750)[:2] == (0, 2)
    assert index.select(99, end_lsn_limit=300)[:2] == (0, 2)  # 300 ends at 308
    assert index.select(500)[:2] == (5, 5)
    assert index.available(150) == (16, 4)
    index.note_definitions({("R", 1): b"R1"})
    index.append(_entry(600, 1, 10))
    assert index.definitions_before(5) == {("R", 1): b"R1"}
    assert index.definitions_before(4) == {}
    assert index.drop_through(450) == 4
    assert index.lowest_offset() == 5000
    assert index.definitions_before(1) == {("R", 1): b"R1"}
    with pytest.raises(ValueError, match="not after"):
        index.append(_entry(600, 1, 1))


def test_conform_fits_spark_arrow_types():
    month_day_nano = pa.array([pa.MonthDayNano([14, 3, 7_000_000_000]), None])
    target = pa.struct([("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())])
    assert conform(month_day_nano, target).to_pylist() == [
        {"months": 14, "days": 3, "microseconds": 7_000_000},
        None,
    ]
    lists = pa.array([[1, None], None, []], pa.list_(pa.uint32()))
    out = conform(lists, pa.list_(pa.field("element", pa.int64())))
    assert out.type.value_field.name == "element" and out.to_pylist() == [[1, None], None, []]
    wide = pa.array([None], pa.decimal256(40, 2))
    assert conform(wide, pa.string()).type == pa.string()
    big = pa.array([np.iinfo(np.int64).max], pa.int64()).view(pa.timestamp("us", tz="UTC"))
    assert conform(big, pa.timestamp("us", tz="UTC")).to_pylist()[0].year == 9999


def _copy_stream() -> tuple[bytes, bytes, bytes, bytes]:
    header = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
    row1 = struct.pack("!h", 2) + struct.pack("!i", 4) + b"\x00\x00\x00\x07" + struct.pack("!i", -1)
    row2 = (
        struct.pack("!h", 2)
        + struct.pack("!i", 4)
        + b"\x00\x00\x00\x08"
        + struct.pack("!i", 2)
        + b"hi"
    )
    return header, row1, row2, struct.pack("!h", -1)


def _copy_decoder() -> Callable[[list[bytes]], list[dict[str, Any]]]:
    relation = Relation(
        None, 16384, "public", "t", "d", (Column(1, "id", 23, -1), Column(0, "note", 25, -1))
    )
    decoder = ColumnarDecoder(1)
    decoder.decode([Encoder(1).encode(relation)])
    return lambda tuples: (
        decoder.decode_copy(16384, tuples, text_columns={1})
        .batch.select(["id", "note"])
        .to_pylist()
    )


def test_copy_stream_as_postgresql_sends_it_is_decoded_block_by_block():
    header, row1, row2, trailer = _copy_stream()
    calls: list[int] = []
    decode = _copy_decoder()

    def counted(tuples: list[bytes]) -> list[dict[str, Any]]:
        calls.append(len(tuples))
        return decode(tuples)

    blocks = [header + row1, row2, trailer]  # one tuple per CopyData message
    got = [r for rows in copy_tuples(blocks, 2, counted) for r in rows]
    assert got == [{"id": 7, "note": None}, {"id": 8, "note": "hi"}]
    assert calls == [2]
    # in chunks of about chunk_bytes
    calls.clear()
    got = [r for rows in copy_tuples(blocks, 2, counted, chunk_bytes=1) for r in rows]
    assert got == [{"id": 7, "note": None}, {"id": 8, "note": "hi"}] and calls == [1, 1]
    # an empty table: the header and the trailer in one message
    assert list(copy_tuples([header + trailer], 2, counted)) == []


def test_copy_stream_cut_anywhere_is_reassembled_into_tuples():
    header, row1, row2, trailer = _copy_stream()
    data = header + row1 + row2 + trailer
    for chunk_bytes in (1, 1 << 20):
        for cut in range(1, len(data)):
            blocks = [data[:cut], data[cut:]]
            got = [
                r
                for rows in copy_tuples(blocks, 2, _copy_decoder(), chunk_bytes=chunk_bytes)
                for r in rows
            ]
            assert got == [{"id": 7, "note": None}, {"id": 8, "note": "hi"}], (cut, chunk_bytes)
    assert split_copy_tuples(row1 + row2[:5], 2) == ([row1], len(row1), False)
    assert split_copy_tuples(row1 + trailer, 2) == ([row1], len(row1) + 2, True)


def test_copy_streams_that_are_damaged_are_refused():
    header, row1, row2, trailer = _copy_stream()
    decode = _copy_decoder()
    cases = [
        ([b"PGCOPY\n\xff\r\n\x01" + header[11:] + row1, trailer], "binary format"),
        ([header + row1, row2], "without its trailer"),
        ([header + row1, row2[:5]], "in the middle of a tuple"),
        ([header + row1, trailer, row2], "after its trailer"),
        ([header + row1 + trailer + row2], "after its trailer"),
        ([header + struct.pack("!h", 3) + row1[2:], trailer], "3 columns, expected 2"),
    ]
    for blocks, reason in cases:
        with pytest.raises(SparkSourceError, match=reason):
            list(copy_tuples(blocks, 2, decode))
    # a value its type cannot take (an int4 of 3 bytes), numbered from the start of the COPY
    bad = struct.pack("!h", 2) + struct.pack("!i", 3) + b"\x00\x00\x07" + struct.pack("!i", -1)
    for chunk_bytes in (1, 1 << 20):
        with pytest.raises(CopyFormatError) as caught:
            list(
                copy_tuples([header + row1, row2, bad, trailer], 2, decode, chunk_bytes=chunk_bytes)
            )
        assert (caught.value.row, caught.value.offset) == (2, 6)
        assert "'id'" in caught.value.reason


def test_generate_yields_what_the_callback_gets_and_raises_what_run_raises():
    def run(emit: Callable[[int], None]) -> None:
        for i in range(50):
            emit(i)

    assert list(_generate(run)) == list(range(50))

    def failing(emit: Callable[[int], None]) -> None:
        emit(1)
        raise CopyFormatError(3, 4, "bad value")

    got: list[int] = []
    with pytest.raises(CopyFormatError, match="bad value"):
        for item in _generate(failing):
            got.append(item)
    assert got == [1]


def test_closing_generate_stops_the_run_at_its_next_callback():
    stopped: list[BaseException] = []
    emitted = 0

    def endless(emit: Callable[[int], None]) -> None:
        nonlocal emitted
        try:
            while True:
                emit(emitted)
                emitted += 1
        except BaseException as exc:
            stopped.append(exc)
            raise

    items = _generate(endless, ahead=2)
    assert [next(items) for _ in range(5)] == [0, 1, 2, 3, 4]
    items.close()  # joins the thread: the run has ended by now
    assert len(stopped) == 1 and type(stopped[0]).__name__ == "_Stopped"
    assert emitted <= 5 + 2 + 1  # at most ``ahead`` items beyond those taken


def test_snapshot_partitions_come_largest_first_each_tables_in_page_order():
    column = (CatalogColumn("id", 20, -1, "bigint", 0, True),)
    small = CatalogTable(1, "public", "small", "d", column, pages=30, size_bytes=30 * 8192)
    big = CatalogTable(2, "public", "big", "d", column, pages=100, size_bytes=100 * 8192)
    catalog = SourceCatalog((small, big), (), 150000)
    reader = PgcdcSnapshotReader(
        SnapshotSettings("dbname=x", target_partition_bytes=40 * 8192), catalog, None, Lsn(1)
    )
    got = [
        (p.relid, p.first_page, p.stop_page)
        for p in reader.partitions()
        if isinstance(p, SnapshotPartition)
    ]
    # big: 3 ranges of 34, 34 and 32 pages; small: one of 30 pages
    assert got == [(2, None, 34), (2, 34, 68), (2, 68, None), (1, None, None)]


def test_schema_changed_is_recognised_through_wrapping():
    error = SchemaChanged("public.t", "column 'w' added (integer)")
    assert is_schema_changed(error)
    wrapped = RuntimeError(f"Py4J ... pyspark.errors... {error} ...")
    assert is_schema_changed(wrapped)
    assert not is_schema_changed(RuntimeError("other"))
    import pickle

    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.table == "public.t"


def test_tagged_errors_are_recovered_by_class_through_wrapping():
    """What crosses the JVM is text: the class comes back from the message's tag, whatever the
    wording around it; untagged errors and unknown tags recover nothing."""
    copy_again = CopyAgain("public.t changed its columns during the initial copy", "copy again")
    assert str(copy_again).startswith("[pgcdc:CopyAgain] ")
    wrapped = RuntimeError(f"org.apache.spark.SparkException: ... PythonException: {copy_again}")
    outer = RuntimeError("the initial copy failed")  # as pgcdc run wraps it
    outer.__cause__ = wrapped
    assert raised_as(outer) is CopyAgain and not is_schema_changed(outer)
    assert raised_as(SchemaChanged("public.t", "x")) is SchemaChanged
    assert raised_as(OptionError("bad option")) is None  # not a decision: untagged
    assert raised_as(RuntimeError("[pgcdc:OptionError] bad")) is None
    assert raised_as(RuntimeError("[pgcdc:Nothing] x")) is None
    assert raised_as(None) is None


def test_rows_written_before_a_column_was_added_read_its_missing_value():
    """A Relation without a column the query has: a column after the last one the Relation has
    was added after the row was written, and reads PostgreSQL's missing value for it (NULL
    without one); a column before one it has was dropped (or is not published): NULL."""
    from pgcdc.protocol.messages import Begin, Commit, Insert, Update
    from pgcdc.spark.decode import ChangeDecoder, Label, decode_transactions
    from pgcdc.spark.schema import source_schema

    def column(name: str, oid: int, missing: str | None = None):
        # REPLICA IDENTITY FULL: every column is in the key, as pgoutput flags them
        return CatalogColumn(name, oid, -1, "t", 1 if oid == 1007 else 0, True, missing)

    table = CatalogTable(
        16384,
        "public",
        "t",
        "f",
        (
            column("id", 23),
            column("doomed", 25, "never read"),
            column("v", 25),
            column("extra", 20, "7"),
            column("tags", 1007, "{1,NULL,3}"),
            column("plain", 25),
        ),
    )
    catalog = SourceCatalog((table,), (), 180000)
    decoder = ChangeDecoder(catalog, source_schema(catalog), 1)
    encoder = Encoder(1)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    relation = Relation(
        None, 16384, "public", "t", "f", (Column(1, "id", 23, -1), Column(1, "v", 25, -1))
    )
    messages = [
        encoder.encode(m)
        for m in (
            Begin(Lsn(0x100), when, 5),
            relation,
            Insert(None, 16384, ("1", "a")),
            Update(None, 16384, "O", ("1", "a"), ("1", "b")),
            Commit(0, Lsn(0x100), Lsn(0x108), when),
        )
    ]
    label = Label(0x100, 0x108, 0, 5)
    batches = list(decode_transactions(decoder, [(label, False, 5, iter(messages[1:4]))]))
    rows = pa.Table.from_batches(batches).column(table_column("public", "t")).to_pylist()
    written_before = {"id": 1, "doomed": None, "extra": 7, "tags": [1, None, 3], "plain": None}
    assert rows[0]["new"] == {**written_before, "v": "a"}
    assert rows[1]["new"] == {**written_before, "v": "b"}
    assert rows[1]["old_kind"] == "O" and rows[1]["old"] == {**written_before, "v": "a"}


def test_spool_releases_the_segments_no_needed_range_touches(tmp_path: Any) -> None:
    """Segments below the framed end that no kept range touches go, wherever they lie; a range
    over a released segment is refused, not read from another file."""
    from pgcdc.spark.spool import RECORD_HEADER, Spool, SpoolReleasedError

    spool = Spool(str(tmp_path), segment_bytes=4096)
    record = RECORD_HEADER.size + 1000
    offsets = [spool.append(bytes([i]) * 1000) for i in range(20)]  # 4 records a segment
    spool.flush()
    assert offsets[4] == 4 * record  # segment starts: 0, 4016, 8032, ...
    keep = [(offsets[1], offsets[2]), (offsets[9], offsets[10])]  # in segments 0 and 2
    removed = spool.release_unneeded(keep, offsets[16])
    assert removed == 2  # segments 1 and 3; segment 4 ends beyond the framed end
    assert spool.readable(offsets[1], offsets[2]) and spool.readable(offsets[9], offsets[10])
    assert list(spool.iter_records(offsets[9], offsets[10])) == [bytes([9]) * 1000]
    assert not spool.readable(offsets[5], offsets[6])
    with pytest.raises(SpoolReleasedError):
        spool.read_range(offsets[5], offsets[6])
    assert spool.disk_bytes == spool.size - 2 * 4 * record
    # once nothing needs the head, it goes too, and below it nothing is readable
    spool.release_unneeded([], offsets[16])
    assert not spool.readable(offsets[1], offsets[2])
    assert spool.released == offsets[16]
    assert list(spool.iter_records(offsets[16], offsets[17])) == [bytes([16]) * 1000]
    spool.close()


def test_a_live_spool_is_never_swept_whatever_its_process_id(tmp_path: Any) -> None:
    """A spool's folder is named after its process id, and the sweep removed the folders of
    ids that were not alive: a driver in another PID namespace (a container sharing the
    folder) has ids this one cannot see, so its live spool was deleted under it. Liveness is
    now the owner's lock on the folder, which the kernel drops when the owner ends."""
    from pgcdc.spark.spool import Spool

    code = (
        "import sys, time; from pgcdc.spark.spool import Spool; "
        f"s = Spool({str(tmp_path)!r}); s.append(b'x'); print(s.directory, flush=True); "
        "sys.stdin.read()"
    )
    owners = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    live, ended = (Path(p.stdout.readline().strip()) for p in owners)  # type: ignore[union-attr]
    dead_pid = owners[0].pid + 1_000_000  # beyond pid_max: no process here has it
    elsewhere = live.with_name(f"pgcdc-spool-{dead_pid}-other")
    live.rename(elsewhere)  # as a driver in another PID namespace would name it
    owners[1].kill()
    owners[1].wait()
    try:
        mine = Spool(str(tmp_path))
        assert elsewhere.exists(), "the live spool was swept"
        assert not ended.exists(), "the ended process's spool was kept"
        mine.close()
    finally:
        for owner in owners:
            owner.communicate("")


def test_a_spool_without_an_owner_file_is_judged_by_its_process_id(tmp_path: Any) -> None:
    """An earlier pgcdc's spools have no owner file: they were never swept again. One an hour
    old whose process is gone is removed; one whose process lives, or a fresh one, stays."""
    from pgcdc.spark.spool import Spool

    old = time.time() - 7200
    gone = tmp_path / f"pgcdc-spool-{os.getpid() + 1_000_000}-old"
    live = tmp_path / f"pgcdc-spool-{os.getppid()}-old"
    fresh = tmp_path / f"pgcdc-spool-{os.getpid() + 1_000_001}-new"
    for folder in (gone, live, fresh):
        folder.mkdir()
        (folder / "00000000000000000000.seg").write_bytes(b"x")
    for folder in (gone, live):
        os.utime(folder, (old, old))
    Spool(str(tmp_path)).close()
    assert not gone.exists() and live.exists() and fresh.exists()


def test_skipped_tables_leave_the_catalog_and_are_known_by_oid_or_name() -> None:
    """``skipTables`` (pgcdc run's parked tables): out of the schema, their rows dropped by
    OID (a rename) or by name (dropped and created again); a name not published is ignored."""
    column = (CatalogColumn("id", 23, -1, "integer", 0, True),)
    kept = CatalogTable(1, "public", "kept", "d", column)
    parked = CatalogTable(2, "public", "parked", "d", column)
    catalog = SourceCatalog((kept, parked), (), 180000).without(
        [("public", "parked"), ("public", "gone")]
    )
    assert catalog.tables == (kept,) and catalog.skipped == (parked,)
    assert catalog.skips(2, "public", "renamed") and catalog.skips(99, "public", "parked")
    assert not catalog.skips(1, "public", "kept")
    from pgcdc.spark.schema import source_schema

    names = [f.name for f in source_schema(catalog).fields]
    assert table_column("public", "kept") in names
    assert table_column("public", "parked") not in names
    assert SourceCatalog((kept,), (), 180000).without([]).skipped == ()


def test_per_table_options_parse_json_objects_and_name_what_is_wrong() -> None:
    """``textColumns`` and ``renamedColumns``: a JSON object of table -> value; a table named
    with and without its schema is one table; anything else is an error naming the option,
    the table as written and an example."""
    assert text_columns({}) == {}
    assert renamed_columns({"renamedColumns": ""}) == {}
    got = text_columns({"textColumns": '{"t": ["a"], "public.t": ["b"], "s.u": ["c"]}'})
    assert got == {("public", "t"): frozenset({"a", "b"}), ("s", "u"): frozenset({"c"})}
    renames = renamed_columns({"renamedColumns": '{"public.t": {"a": "b", "b": "c"}}'})
    assert renames == {("public", "t"): {"a": "b", "b": "c"}}
    assert list(renames[("public", "t")]) == ["a", "b"]  # the order the renames happened
    with pytest.raises(OptionError, match=r"option textColumns is not a JSON object.*Fix"):
        text_columns({"textColumns": "[1]"})
    with pytest.raises(OptionError, match="option renamedColumns is not a JSON object"):
        renamed_columns({"renamedColumns": "{nope"})
    with pytest.raises(OptionError, match="the columns of 't' are not a list of column names"):
        text_columns({"textColumns": '{"t": "a"}'})
    with pytest.raises(OptionError, match=r"the renames of 's\.t' are not an object of column"):
        renamed_columns({"renamedColumns": '{"s.t": {"a": ""}}'})
