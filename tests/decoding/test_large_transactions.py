"""1M-row transactions from a real server, through a walsender session and the assembler.

Each test writes one transaction of a million rows, then a one-row marker transaction, and reads
the slot with ``ReplicationSession`` into an ``Assembler`` with a 2 MiB memory limit driving
``test_spill``'s counting plugin (it checks every row arrives whole and in order, keeping
nothing). Memory is measured twice: the assembler's own accounting of buffered bytes (its peak
may pass the limit by one message at most), and the process's peak resident size while reading
(``VmHWM`` after resetting it through ``/proc/self/clear_refs``) over its resident size before.
``tracemalloc``, which ``test_spill`` uses, multiplies the time of a million real messages by
five; the resident peak is a coarser but complete measure (it also counts libpq's buffers).

* aborted (streamed, server sends it in blocks of ``logical_decoding_work_mem`` = 64kB, then
  Stream Abort): nothing of it is delivered, its spill file is gone, memory stays bounded;
* a savepoint's 300k rows rolled back inside a committed streamed transaction: exactly the 700k
  surviving rows arrive, in order;
* streaming off: the server buffers (and spills) the transaction and sends it whole after its
  commit; the assembler buffers a regular transaction until its Commit too, so the bound on our
  side is the same: ``memory_limit`` plus one message, the rest spilled to disk (the design never
  hands a plugin a transaction before its commit is known).

The aborted case runs on both servers; the two others, the slowest tests of the suite, on
PostgreSQL 18 only (the protocol path is the same on 15, which test_spill covers).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgcdc.decoding import Assembler
from pgcdc.decoding.spill import ITEM_OVERHEAD
from pgcdc.replication import ReplicationSession, StreamOptions, WalData
from tests.decoding.test_spill import _Counter
from tests.fix_pg import PgDatabase

pytestmark = pytest.mark.slow

ROWS = 1_000_000
LIMIT = 2 * 1024 * 1024
BOUND = 24 * 1024 * 1024  # the resident set's growth allowed while reading
VALUE = "value" + " x" * 10  # the same row size as test_spill's


@dataclass(frozen=True, slots=True)
class Read:
    commits: list[int]
    peak: int  # growth of the resident set's peak over the resident set before, bytes
    largest: int  # largest message, bytes
    messages: int
    inserted: int  # bytes of the Insert messages received (rolled back or aborted ones too)
    seconds: float


def _prepare(pg: PgDatabase) -> None:
    # no primary key: inserts only, and a million index entries would only slow the test
    pg.execute("CREATE TABLE t (id int NOT NULL, v text)")
    pg.execute("CREATE PUBLICATION pub FOR TABLE t")
    pg.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")


def _marker(pg: PgDatabase) -> None:
    pg.execute("INSERT INTO t VALUES (0, 'marker')")


def _resident() -> tuple[int, int]:
    """(peak, current) resident set size of this process, bytes."""
    status = Path("/proc/self/status").read_text()
    peak = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    now = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert peak and now, "no VmHWM / VmRSS in /proc/self/status"
    return int(peak.group(1)) * 1024, int(now.group(1)) * 1024


def _read(
    pg: PgDatabase,
    asm: Assembler,
    plugin: _Counter,
    *,
    streaming: bool,
    marker: int,
    after_rows: Callable[[], None] | None = None,
) -> Read:
    """Feed the slot to ``asm`` until the marker transaction (the ``marker``-th commit);
    ``after_rows`` runs once ``ROWS`` messages have been received."""
    options = StreamOptions(("pub",), streaming="on" if streaming else "off")
    largest = messages = inserted = 0
    started = time.monotonic()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    _, before = _resident()
    with ReplicationSession(pg.dsn(), "s", options, poll_interval=0.2) as session:
        for event in session.events():
            if isinstance(event, WalData):
                messages += 1
                largest = max(largest, len(event.payload))
                if event.payload[:1] == b"I":
                    inserted += len(event.payload)
                if messages == ROWS and after_rows is not None:
                    after_rows()
            asm.feed(event)
            if len(plugin.commits) >= marker or time.monotonic() - started > 300:
                break
    peak, _ = _resident()
    seconds = time.monotonic() - started
    return Read(list(plugin.commits), peak - before, largest, messages, inserted, seconds)


def _assert_bounded(asm: Assembler, read: Read, tmp_path: Path) -> None:
    assert 0 < asm.peak_memory_bytes <= LIMIT + read.largest + ITEM_OVERHEAD
    # every row received went to disk but what was in memory when it ended: at most the limit
    # plus one message, once at the end and once more at a subtransaction's abort (its rows still
    # in memory are dropped, not spilled). Counted from the rows received, not from ROWS: how
    # many rows of a rolled-back savepoint the server streams varies from run to run.
    assert asm.spilled_bytes >= read.inserted - 2 * (LIMIT + read.largest + ITEM_OVERHEAD)
    in_memory = read.inserted + read.messages * ITEM_OVERHEAD  # everything buffered at once
    # the resident peak grew by little more than the limit (interpreter and libpq buffers);
    # holding the transaction would have taken at least twice the bound (700k rows at least)
    assert read.peak < BOUND, f"the resident set grew by {read.peak} bytes"
    assert in_memory > 2 * BOUND
    assert asm.memory_bytes == 0 and asm.open_transactions == 0
    assert os.listdir(asm.spill_directory or tmp_path) == []  # nothing left on disk
    asm.close()
    assert os.listdir(tmp_path) == []


def test_aborted_million_row_streamed_transaction(pg: PgDatabase, tmp_path: Path) -> None:
    _prepare(pg)
    plugin = _Counter()
    asm = Assembler(plugin, memory_limit=LIMIT, spill_dir=str(tmp_path))
    # the transaction stays open until its rows were streamed: the server does not stream a
    # transaction it already knows aborted (PostgreSQL 16+ throws its changes away instead)
    with pg.connect(autocommit=False) as conn:
        conn.execute("INSERT INTO t SELECT g, %s FROM generate_series(0, %s) g", (VALUE, ROWS - 1))

        def abort() -> None:
            assert asm.in_progress and not plugin.commits
            conn.rollback()
            _marker(pg)

        read = _read(pg, asm, plugin, streaming=True, marker=1, after_rows=abort)
    print(f"pg{pg.major} aborted: {read}")
    assert read.commits == [1]  # only the marker: nothing of the aborted transaction
    assert read.messages > ROWS  # the server did stream it
    assert asm.stats.aborted == 1 and asm.stats.changes == 1
    _assert_bounded(asm, read, tmp_path)


@pytest.mark.parametrize("pg_server", [18], indirect=True, ids=["pg18"])
def test_savepoint_rolled_back_in_million_row_streamed_transaction(
    pg: PgDatabase, tmp_path: Path
) -> None:
    _prepare(pg)
    kept, gone = 700_000, 300_000
    with pg.connect(autocommit=False) as conn:
        insert = "INSERT INTO t SELECT g, %s FROM generate_series(%s, %s) g"
        conn.execute(insert, (VALUE, 0, kept // 2 - 1))
        conn.execute("SAVEPOINT s")
        conn.execute(insert, (VALUE, 10 * ROWS, 10 * ROWS + gone - 1))  # ids out of order
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.execute(insert, (VALUE, kept // 2, kept - 1))
        conn.commit()
    _marker(pg)
    plugin = _Counter()
    asm = Assembler(plugin, memory_limit=LIMIT, spill_dir=str(tmp_path))
    read = _read(pg, asm, plugin, streaming=True, marker=2)
    print(f"pg{pg.major} savepoint: {read}")
    # exactly the surviving rows, in order (the counter checks ids 0, 1, 2, ... one by one)
    assert read.commits == [kept, 1]
    # rolled-back rows were streamed too, then thrown away: the server sends a subtransaction's
    # Stream Abort only when some of its changes were streamed. How many it streams before it
    # decodes the ROLLBACK TO varies from run to run (822,907 messages of 1,000,000+ once)
    assert read.messages > kept + 1000
    assert asm.stats.subtransaction_aborts == 1 and asm.stats.changes == kept + 1
    _assert_bounded(asm, read, tmp_path)


@pytest.mark.parametrize("pg_server", [18], indirect=True, ids=["pg18"])
def test_million_row_transaction_without_streaming(pg: PgDatabase, tmp_path: Path) -> None:
    _prepare(pg)
    pg.execute("INSERT INTO t SELECT g, %s FROM generate_series(0, %s) g", (VALUE, ROWS - 1))
    _marker(pg)
    plugin = _Counter()
    asm = Assembler(plugin, memory_limit=LIMIT, spill_dir=str(tmp_path))
    read = _read(pg, asm, plugin, streaming=False, marker=2)
    print(f"pg{pg.major} not streamed: {read}")
    assert read.commits == [ROWS, 1]
    assert asm.stats.changes == ROWS + 1
    _assert_bounded(asm, read, tmp_path)
