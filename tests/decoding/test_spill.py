"""Bounded memory: spilling buffered transactions to disk, truncating and reading them back."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcdc.decoding import Assembler, Change, DecodingContext, OutputPlugin, Transaction
from pgcdc.decoding.relations import RelationInfo
from pgcdc.decoding.spill import ITEM_OVERHEAD, SpillPool
from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Encoder,
    Insert,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from tests.decoding.wire import T0, T_ID, Recorder, Wire, feed, ins, rel

TOP, SUB1, SUB2 = 700, 710, 711


def test_buffer_spills_truncates_and_reads_back_in_order(tmp_path: Path) -> None:
    pool = SpillPool(limit=10 * (ITEM_OVERHEAD + 10), directory=tmp_path)
    big = pool.buffer("big")
    small = pool.buffer("small")
    small.append(b"s" * 10, 1)
    marks = {}
    for i in range(25):
        if i in (7, 12, 23):
            marks[i] = big.mark()
        big.append(f"item-{i:05d}".encode(), 100 + i)
    # the limit is 10 items: the largest buffer (big) spilled, the small one stayed in memory
    assert big.spilled >= 10 and small.spilled == 0 and pool.spills >= 2
    assert pool.memory_bytes <= pool.limit
    assert pool.memory_bytes == big.memory_bytes + small.memory_bytes
    assert [(p.decode(), lsn) for p, lsn in big][:3] == [
        ("item-00000", 100),
        ("item-00001", 101),
        ("item-00002", 102),
    ]
    big.truncate(marks[23])  # in memory
    assert [p.decode() for p, _ in big] == [f"item-{i:05d}" for i in range(23)]
    big.truncate(marks[12])  # on disk: the file is cut at the mark's offset
    assert [p.decode() for p, _ in big] == [f"item-{i:05d}" for i in range(12)]
    big.append(b"after", 999)
    assert [(p, lsn) for p, lsn in big][-2:] == [(b"item-00011", 111), (b"after", 999)]
    big.truncate(marks[7])
    assert len(big) == 7 and [p for p, _ in big][-1] == b"item-00006"
    spill_dir = pool.spill_directory
    assert spill_dir is not None and spill_dir.parent == tmp_path and any(spill_dir.iterdir())
    big.close()
    assert not any(spill_dir.iterdir())
    pool.close()
    assert not spill_dir.exists() and pool.memory_bytes == 0


def test_subtransaction_abort_truncates_spilled_changes(tmp_path: Path) -> None:
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), *(ins(str(i), "top", xid=TOP) for i in range(5)), first=True)
    w.block(TOP, *(ins(str(i), "sub1", xid=SUB1) for i in range(5, 10)))
    w.block(TOP, *(ins(str(i), "sub2", xid=SUB2) for i in range(10, 15)))
    w.stream_abort(TOP, SUB2)  # its changes are on disk by now
    w.block(TOP, ins("15", "top", xid=TOP))
    w.stream_commit(TOP)
    p = Recorder()
    asm = Assembler(p, proto_version=2, memory_limit=200, spill_dir=str(tmp_path))
    feed(asm, w.take())
    assert [r[0] for r in p.rows()] == [str(i) for i in [*range(10), 15]]
    assert asm.spilled_bytes > 0 and asm.memory_bytes == 0
    assert not any(tmp_path.iterdir().__next__().iterdir())  # the transaction's file is gone
    asm.close()
    assert not any(tmp_path.iterdir())


class _Counter(OutputPlugin):
    """Checks that rows arrive whole and in order, keeping nothing."""

    def __init__(self) -> None:
        self.expected = 0
        self.commits: list[int] = []

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        self.expected = 0

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: RelationInfo, change: Change
    ) -> None:
        assert change.position == self.expected
        assert change.new is not None and int(change.new[0]) == self.expected
        self.expected += 1

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        self.commits.append(self.expected)


def _huge_stream(
    rows: int, *, streamed: bool, block_rows: int = 20_000
) -> Iterator[tuple[bytes, int]]:
    """One transaction of ``rows`` inserts, produced lazily, streamed or not."""
    from pgcdc.protocol import Begin, Commit

    enc = Encoder(2)
    lsn = 0x1_0000_0000
    xid = TOP if streamed else None
    commit = Lsn(lsn + 0x40 * (rows + 10))
    end = Lsn(commit + 0x30)
    if streamed:
        yield enc.encode(StreamStart(TOP, True)), lsn
    else:
        yield enc.encode(Begin(commit, T0, TOP)), lsn
    yield enc.encode(rel(xid)), lsn
    encode = enc.encode
    # every Insert exactly as the Encoder writes it, made by overwriting the id digits of one
    # encoded message (few allocations per row: tracemalloc's cost is per allocation)
    value = "value" + " x" * 10
    template = bytearray(encode(Insert(xid, T_ID, ("0000000", value))))
    digits = template.index(b"0000000")
    template[digits : digits + 7] = b"%07d" % 42
    assert bytes(template) == encode(Insert(xid, T_ID, ("0000042", value)))
    stop, cont = encode(StreamStop()), encode(StreamStart(TOP, False))
    for i in range(rows):
        if streamed and i and i % block_rows == 0:
            yield stop, lsn
            yield cont, lsn
        lsn += 0x40
        template[digits : digits + 7] = b"%07d" % i
        yield bytes(template), lsn
    if streamed:
        yield encode(StreamStop()), lsn
        yield encode(StreamCommit(TOP, 0, commit, end, T0)), end
    else:
        yield encode(Commit(0, commit, end, T0)), end


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rows", "streamed"), [(250_000, True), (200_000, False)], ids=["streamed", "regular"]
)
def test_huge_transaction_memory_is_bounded(tmp_path: Path, rows: int, streamed: bool) -> None:
    limit = 2 * 1024 * 1024
    plugin = _Counter()
    asm = Assembler(plugin, proto_version=2, memory_limit=limit, spill_dir=str(tmp_path))
    largest = 0
    tracemalloc.start()
    try:
        for payload, lsn in _huge_stream(rows, streamed=streamed):
            largest = max(largest, len(payload))
            asm.feed_message(payload, lsn)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert plugin.commits == [rows]  # whole and in order (checked row by row)
    # the assembler's own accounting never went past the limit by more than one message
    assert 0 < asm.peak_memory_bytes <= limit + largest + ITEM_OVERHEAD
    # buffered all at once, the messages alone would take rows * (payload + overhead) bytes
    in_memory = rows * (largest + ITEM_OVERHEAD)
    assert asm.spilled_bytes > in_memory // 2
    assert peak < 3 * limit, f"tracemalloc peak {peak} bytes"
    assert in_memory > 5 * peak
    assert asm.memory_bytes == 0 and os.listdir(asm.spill_directory or tmp_path) == []
    asm.close()
    assert os.listdir(tmp_path) == []
