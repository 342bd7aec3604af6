"""The benchmarks' standard table and workloads.

The table has ten columns of the kinds real tables have (bigint key, integer, bigint,
numeric(12,2), timestamptz, jsonb, text, boolean, float8, date), like ``tools.bench.decode``'s.
The catch-up workload is the issue's: ``inserts`` rows (1M at full scale) in transactions of
``batch`` rows, then ``updates`` rows updated (every 4th row, 250k), then ``deletes`` rows
deleted (every 10th row, 100k), each in transactions of ``batch`` changes.

The mixed workload (``bench-scale`` and the latency benchmark's second line) has a table of its
own, rows of about 100 bytes loaded before the run, and a writer at a steady rate: 70% updates
and 10% deletes of uniformly random existing keys, 20% inserts of new keys, 20 changes a
transaction (``MixedWriter``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, TypeAlias

import psycopg
from psycopg import sql

COLUMNS = ("id", "qty", "amount", "price", "created", "attrs", "note", "active", "score", "day")

_TABLE = """
CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    qty integer NOT NULL,
    amount bigint,
    price numeric(12,2),
    created timestamptz,
    attrs jsonb,
    note text,
    active boolean,
    score float8,
    day date
)
"""

_INSERT = """
INSERT INTO {table}
SELECT g, g %% 1000, g * 7919, ((g %% 100000) / 100.0 + 0.01)::numeric(12,2),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1.000123 second',
       jsonb_build_object('k', g, 'tag', 't' || (g %% 17), 'ok', g %% 2 = 0),
       CASE WHEN g %% 13 = 0 THEN NULL ELSE 'note ' || md5(g::text) END,
       g %% 3 = 0, g::float8 / 7, date '2024-01-01' + (g %% 3650)::int
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""

_UPDATE = """
UPDATE {table} SET qty = qty + 1, price = price + 1, created = created + interval '1 hour',
                   attrs = attrs || '{{"v": 2}}', note = coalesce(note, 'was null')
WHERE id BETWEEN %(first)s AND %(last)s AND id %% 4 = 0
"""

_DELETE = "DELETE FROM {table} WHERE id BETWEEN %(first)s AND %(last)s AND id %% 10 = 1"


def _q(template: str, table: str) -> sql.Composed:
    return sql.SQL(template).format(table=sql.Identifier(table))


def create_table(conn: psycopg.Connection[Any], table: str) -> None:
    conn.execute(_q(_TABLE, table))


def insert_rows(conn: psycopg.Connection[Any], table: str, first: int, last: int) -> None:
    """Rows ``first..last`` in one statement (one transaction in autocommit)."""
    conn.execute(_q(_INSERT, table), {"first": first, "last": last})


@dataclass(frozen=True, slots=True)
class CatchUpWorkload:
    """1M inserts, then 250k updates, then 100k deletes (at scale 1)."""

    inserts: int = 1_000_000
    batch: int = 10_000  # changes per transaction

    @classmethod
    def at_scale(cls, scale: float) -> CatchUpWorkload:
        return cls(inserts=max(1000, round(1_000_000 * scale)))

    @property
    def updates(self) -> int:
        return self.inserts // 4

    @property
    def deletes(self) -> int:
        return (self.inserts + 9) // 10

    @property
    def changes(self) -> int:
        return self.inserts + self.updates + self.deletes

    @property
    def final_rows(self) -> int:
        return self.inserts - self.deletes

    def run(self, conn: psycopg.Connection[Any], table: str) -> None:
        rows, batch = self.inserts, self.batch
        for first in range(1, rows + 1, batch):
            insert_rows(conn, table, first, min(first + batch - 1, rows))
        # every 4th row: `batch` updates per transaction
        for first in range(1, rows + 1, 4 * batch):
            conn.execute(_q(_UPDATE, table), {"first": first, "last": first + 4 * batch - 1})
        # every 10th row: `batch` deletes per transaction
        for first in range(1, rows + 1, 10 * batch):
            conn.execute(_q(_DELETE, table), {"first": first, "last": first + 10 * batch - 1})


# -- the mixed workload (bench-scale, and the latency benchmark's second line) -----------------

#: the mixed workload's table: rows of about 100 bytes (``pg_column_size`` of a row: its 24-byte
#: header, 8 + 4 + 8 + 8 bytes of numbers and a 48-character text)
_MIXED_TABLE = """
CREATE TABLE {table} (
    id bigint NOT NULL,
    grp integer NOT NULL,
    amount bigint NOT NULL,
    updated_at timestamptz NOT NULL,
    note text NOT NULL
)
"""

#: a row's values from its id ``g`` (the load and the workload's inserts)
_MIXED_VALUES = """
g, (g %% 1000)::int, g * 7919, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',
left(md5(g::text) || md5((g + 1)::text), 48)
"""

_MIXED_LOAD = (
    "INSERT INTO {table} SELECT {values} "
    "FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g"
)

#: one transaction of the workload: its updates, inserts and deletes, then a row of the tick
#: table (the native subscriber's clock, see ``tools.bench.scale``); returns the transaction's
#: id and the WAL insert position after its changes, before its commit record, as
#: ``'<xid> <lsn>'`` (``MixedWriter``)
_MIXED_FUNCTION = """
CREATE FUNCTION bench_mixed_txn(seq bigint, upd bigint[], ins bigint[], del bigint[])
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {table} SET amount = amount + 1, grp = grp + 1, updated_at = clock_timestamp()
    WHERE id = ANY (upd);
    INSERT INTO {table} SELECT {values} FROM unnest(ins) AS g;
    DELETE FROM {table} WHERE id = ANY (del);
    INSERT INTO {tick} (seq) VALUES (seq);
    RETURN pg_current_xact_id()::text || ' ' || pg_current_wal_insert_lsn()::text;
END
$$
"""

_TICK_TABLE = "CREATE TABLE {tick} (seq bigint PRIMARY KEY, applied_at timestamptz)"


def create_tick_table(conn: psycopg.Connection[Any], tick: str) -> None:
    """The tick table: a row per transaction of the workload, published to the native
    subscriber only (``harness.subscribe_natively`` stamps it there)."""
    conn.execute(sql.SQL(_TICK_TABLE).format(tick=sql.Identifier(tick)))


def create_mixed_tables(
    conn: psycopg.Connection[Any], table: str, tick: str, *, primary_key: bool = True
) -> None:
    """The mixed workload's table (with its primary key unless ``primary_key`` is false: the
    load adds it after the rows) and its tick table."""
    conn.execute(_q(_MIXED_TABLE, table))
    if primary_key:
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(sql.Identifier(table)))
    create_tick_table(conn, tick)


def load_mixed_table(conn: psycopg.Connection[Any], table: str, tick: str, rows: int) -> float:
    """Creates the tables with ``rows`` rows (ids 1..rows; one ``INSERT ... SELECT
    generate_series`` per million rows, then the primary key, ``VACUUM FREEZE`` and ``ANALYZE``)
    and the workload's function; returns a row's average size in bytes (``pg_column_size``)."""
    create_mixed_tables(conn, table, tick, primary_key=False)
    ident = sql.Identifier(table)
    insert = sql.SQL(_MIXED_LOAD).format(table=ident, values=sql.SQL(_MIXED_VALUES.strip()))
    step = 1_000_000
    for first in range(1, rows + 1, step):
        conn.execute(insert, {"first": first, "last": min(rows, first + step - 1)})
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(ident))
    conn.execute(sql.SQL("VACUUM (FREEZE, ANALYZE) {}").format(ident))
    conn.execute(
        sql.SQL(_MIXED_FUNCTION.replace("%%", "%")).format(
            table=ident,
            tick=sql.Identifier(tick),
            values=sql.SQL(_MIXED_VALUES.replace("%%", "%").strip()),
        )
    )
    sample = conn.execute(
        sql.SQL("SELECT avg(pg_column_size(t.*)) FROM (SELECT * FROM {} LIMIT 10000) AS t").format(
            ident
        )
    ).fetchone()
    return float(sample[0]) if sample and sample[0] is not None else 0.0


@dataclass
class MixedKeys:
    """The keys the mixed workload picks: ``live[:n]`` are the table's existing ids (in no
    order), new ids count up from ``next_id``. Seeded, so a run is repeatable."""

    rows: int
    seed: int = 20_000
    live: Any = None
    n: int = 0
    next_id: int = 0
    rng: Any = None

    def __post_init__(self) -> None:
        import numpy as np

        self.live = np.arange(1, self.rows + 1, dtype=np.int64)
        self.n = self.rows
        self.next_id = self.rows + 1
        self.rng = np.random.default_rng(self.seed)

    def transaction(self, updates: int, inserts: int, deletes: int) -> tuple[Any, Any, Any]:
        """(ids to update, new ids to insert, ids to delete): updates and deletes are distinct
        existing ids drawn uniformly at random; the deleted ones leave ``live``, the new ones
        join it."""
        import numpy as np

        picks = updates + deletes
        if picks > self.n:
            raise RuntimeError(f"the table has {self.n} rows, fewer than {picks} to pick")
        if picks * picks > self.n:  # draws with repeats would rarely come out distinct
            positions = self.rng.choice(self.n, size=picks, replace=False)
        else:
            while True:
                positions = self.rng.integers(0, self.n, size=picks)
                if len(np.unique(positions)) == picks:
                    break
        upd = self.live[positions[:updates]].copy()
        gone = positions[updates:]
        dels = self.live[gone].copy()
        for position in sorted(gone.tolist(), reverse=True):  # swap with the last, then drop it
            self.n -= 1
            self.live[position] = self.live[self.n]
        ins = np.arange(self.next_id, self.next_id + inserts, dtype=np.int64)
        self.next_id += inserts
        if self.n + inserts > len(self.live):
            grown = np.empty(max(2 * len(self.live), self.n + inserts), dtype=np.int64)
            grown[: self.n] = self.live[: self.n]
            self.live = grown
        self.live[self.n : self.n + inserts] = ins
        self.n += inserts
        return upd, ins, dels


@dataclass(frozen=True, slots=True)
class MixedTxn:
    """One committed transaction of a writer: its number, its transaction id (``xid8``), the
    WAL insert position read in it after its changes (below its commit record's LSN, above every
    earlier transaction's), the wall-clock time its COMMIT returned (the server's commit
    timestamp is read afterwards, ``commit_times``), and the tables it changed when the
    workload has several (``tools.bench.wide``)."""

    seq: int
    xid: int
    lsn: int
    committed_at: float
    tables: tuple[str, ...] = ()

    @classmethod
    def parse(
        cls, seq: int, text: str, committed_at: float, tables: tuple[str, ...] = ()
    ) -> MixedTxn:
        """From the workload function's result (``'<xid> <lsn>'``, ``bench_mixed_txn``)."""
        from pgcdc.lsn import Lsn

        xid, _, lsn = text.partition(" ")
        return cls(seq, int(xid), int(Lsn.parse(lsn)), committed_at, tables)


def commit_times(conn: psycopg.Connection[Any], txns: list[MixedTxn]) -> dict[int, float]:
    """Each transaction's commit timestamp (``pg_xact_commit_timestamp``, epoch seconds) by its
    number; empty without ``track_commit_timestamp``."""
    if not txns:
        return {}
    rows = conn.execute(
        "SELECT x.seq, extract(epoch FROM pg_xact_commit_timestamp(x.xid::text::xid))::float8 "
        "FROM unnest(%s::bigint[], %s::bigint[]) AS x(seq, xid)",
        ([t.seq for t in txns], [t.xid & 0xFFFFFFFF for t in txns]),
    ).fetchall()
    return {int(seq): float(at) for seq, at in rows if at is not None}


#: one transaction's call of the workload's server function: the query, its parameters and the
#: tables it changes
TxnCall: TypeAlias = tuple[sql.SQL | sql.Composed, tuple[Any, ...], tuple[str, ...]]


class PacedWriter(threading.Thread):
    """A workload at a steady pace: ``rate`` changes/s in transactions of ``per_txn`` changes
    for ``seconds`` (each transaction starts at its due time; a late one starts at once), one
    transaction per round trip on one connection: a server function whose result is
    ``'<xid> <lsn>'`` (``MixedTxn.parse``). ``call`` makes each transaction's call."""

    def __init__(
        self, dsn: str, *, rate: float, seconds: float, per_txn: int, first_seq: int = 1
    ) -> None:
        super().__init__(name="bench-writer", daemon=True)
        self.dsn, self.rate, self.seconds = dsn, rate, seconds
        self.per_txn = per_txn
        self.first_seq = first_seq
        self.commits: list[MixedTxn] = []
        self.error: BaseException | None = None
        self.elapsed = 0.0
        self.late = 0  # transactions that started after their due time + one interval
        self._stopping = threading.Event()

    def stop(self) -> None:
        """End the workload after the transaction in progress (before ``seconds``)."""
        self._stopping.set()

    def call(self, seq: int) -> TxnCall:
        """Transaction ``seq``: the query, its parameters and the tables it changes."""
        raise NotImplementedError

    @property
    def changes(self) -> int:
        return len(self.commits) * self.per_txn

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                self.commits = self._write(conn)
        except BaseException as exc:
            self.error = exc

    def _write(self, conn: psycopg.Connection[Any]) -> list[MixedTxn]:
        interval = self.per_txn / self.rate
        commits: list[MixedTxn] = []
        started = time.perf_counter()
        k = 0
        while True:
            due = started + k * interval
            if due - started >= self.seconds or self._stopping.is_set():
                break
            seq = self.first_seq + k
            query, params, tables = self.call(seq)
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            elif pause < -interval:
                self.late += 1
            row = conn.execute(query, params).fetchone()
            committed = time.time()
            assert row is not None
            commits.append(MixedTxn.parse(seq, row[0], committed, tables))
            k += 1
        self.elapsed = time.perf_counter() - started
        return commits


class MixedWriter(PacedWriter):
    """The mixed workload: ``rate`` changes/s in transactions of ``per_txn`` changes (70%
    updates, 20% inserts, 10% deletes: 14, 4 and 2 of 20) for ``seconds``
    (``bench_mixed_txn``)."""

    def __init__(
        self,
        dsn: str,
        keys: MixedKeys,
        *,
        rate: float,
        seconds: float,
        per_txn: int = 20,
        first_seq: int = 1,
    ) -> None:
        super().__init__(dsn, rate=rate, seconds=seconds, per_txn=per_txn, first_seq=first_seq)
        self.keys = keys
        self.updates = round(per_txn * 0.7)
        self.inserts = round(per_txn * 0.2)
        self.deletes = per_txn - self.updates - self.inserts

    def call(self, seq: int) -> TxnCall:
        upd, ins, dels = self.keys.transaction(self.updates, self.inserts, self.deletes)
        query = sql.SQL("SELECT bench_mixed_txn(%s, %s, %s, %s)")
        return query, (seq, upd.tolist(), ins.tolist(), dels.tolist()), ()
