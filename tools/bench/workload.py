"""The benchmarks' standard table and workloads.

The table has ten columns of the kinds real tables have (bigint key, integer, bigint,
numeric(12,2), timestamptz, jsonb, text, boolean, float8, date), like ``tools.bench.decode``'s.
The catch-up workload is the issue's: ``inserts`` rows (1M at full scale) in transactions of
``batch`` rows, then ``updates`` rows updated (every 4th row, 250k), then ``deletes`` rows
deleted (every 10th row, 100k), each in transactions of ``batch`` changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
