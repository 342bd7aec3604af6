"""Key types x replica identity x unchanged TOAST values, over several runs in a row.

As supabase/etl tests replica identity: one table per key type (int, bigint, text, varchar,
uuid, numeric, a composite key of text and int) and replica identity (DEFAULT with a primary
key, USING INDEX on a unique index without a primary key, FULL with a primary key), each with a
TOASTed column stored out of line (20 kB of incompressible text) that the updates leave alone,
so it arrives as unchanged TOAST. Every cell runs on one of the two servers, the cells
alternating between them, so each server covers every key type, every replica identity and
every history/changelog combination; history and changelog are on or off per table. Three
``pgcdc run --until-caught-up`` runs, so later batches read the files earlier ones wrote: the
initial copy; an insert and an update of every row; then an update of one row (the issue's
blocker: a text key's files read back as ``string_view``), a key-changing update of another,
the delete of the row the previous run inserted and an update of the row whose key changed.
After each run every mirror equals its source, every history's current versions equal the
mirror, every closed version is well formed, and every changelog holds each change once.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from psycopg import sql

from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.store.target import DeltaTarget
from tests.fix_pg import PgDatabase
from tests.lake.test_pipeline import assert_equal, assert_history_matches_mirror, make_config

pytestmark = pytest.mark.slow

#: key type -> (the key columns' SQL types, the key's value(s) for logical key n)
KEY_TYPES: dict[str, tuple[tuple[str, ...], Callable[[int], tuple[Any, ...]]]] = {
    "int": (("int",), lambda n: (n,)),
    "bigint": (("bigint",), lambda n: (n + 2**40,)),
    "text": (("text",), lambda n: (f"key-{n}",)),
    "varchar": (("varchar(40)",), lambda n: (f"v{n:04d}",)),
    "uuid": (("uuid",), lambda n: (uuid.UUID(int=n * 7919),)),
    "numeric": (("numeric(20,5)",), lambda n: (Decimal(n) + Decimal("0.12345"),)),
    "composite": (("text", "int"), lambda n: (f"k{n}", n)),
}
IDENTITIES = ("default", "index", "full")
#: (history, changelog)
COMBINATIONS = ((False, False), (True, True), (True, False), (False, True))
BIG = 20_000


def incompressible(seed: str, n: int = BIG) -> str:
    out = []
    i = 0
    while len(out) * 64 < n:
        out.append(hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
        i += 1
    return "".join(out)[:n]


def key_columns(kind: str) -> list[str]:
    types, _ = KEY_TYPES[kind]
    return ["k"] if len(types) == 1 else [f"k{i + 1}" for i in range(len(types))]


def table_name(kind: str, identity: str) -> str:
    return f"m_{kind}_{identity}"


def create(pg: PgDatabase, kind: str, identity: str) -> None:
    types, _ = KEY_TYPES[kind]
    keys = key_columns(kind)
    name = sql.Identifier(table_name(kind, identity))
    columns = sql.SQL(", ").join(
        sql.SQL("{} {} NOT NULL").format(sql.Identifier(k), sql.SQL(t))  # fixed type names
        for k, t in zip(keys, types, strict=True)
    )
    key_list = sql.SQL(", ").join(sql.Identifier(k) for k in keys)
    if identity == "index":
        pg.execute(sql.SQL("CREATE TABLE {} ({}, v int, big text)").format(name, columns))
        index = sql.Identifier(f"{table_name(kind, identity)}_key")
        pg.execute(sql.SQL("CREATE UNIQUE INDEX {} ON {} ({})").format(index, name, key_list))
        pg.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX {}").format(name, index))
    else:
        pg.execute(
            sql.SQL("CREATE TABLE {} ({}, v int, big text, PRIMARY KEY ({}))").format(
                name, columns, key_list
            )
        )
        if identity == "full":
            pg.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(name))
    pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN big SET STORAGE EXTERNAL").format(name))


def where_key(kind: str, n: int) -> tuple[sql.Composable, tuple[Any, ...]]:
    _, value = KEY_TYPES[kind]
    condition = sql.SQL(" AND ").join(
        sql.SQL("{} = %s").format(sql.Identifier(k)) for k in key_columns(kind)
    )
    return condition, value(n)


def insert(pg: PgDatabase, kind: str, identity: str, n: int) -> None:
    _, value = KEY_TYPES[kind]
    keys = key_columns(kind)
    query = sql.SQL("INSERT INTO {} ({}, v, big) VALUES ({}, %s, %s)").format(
        sql.Identifier(table_name(kind, identity)),
        sql.SQL(", ").join(sql.Identifier(k) for k in keys),
        sql.SQL(", ").join(sql.Placeholder() for _ in keys),
    )
    with pg.connect() as conn:
        conn.execute(query, (*value(n), n, incompressible(f"{kind}{identity}{n}")))


def update(pg: PgDatabase, kind: str, identity: str, set_sql: str, n: int | None = None) -> None:
    query: sql.Composable = sql.SQL("UPDATE {} SET ").format(
        sql.Identifier(table_name(kind, identity))
    ) + sql.SQL(set_sql)  # test-owned constant text
    params: tuple[Any, ...] = ()
    if n is not None:
        condition, params = where_key(kind, n)
        query = query + sql.SQL(" WHERE ") + condition
    with pg.connect() as conn:
        conn.execute(query, params)


def change_key(pg: PgDatabase, kind: str, identity: str, old: int, new: int) -> None:
    _, value = KEY_TYPES[kind]
    keys = key_columns(kind)
    condition, params = where_key(kind, old)
    query = sql.SQL("UPDATE {} SET {} WHERE {}").format(
        sql.Identifier(table_name(kind, identity)),
        sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in keys),
        condition,
    )
    with pg.connect() as conn:
        conn.execute(query, (*value(new), *params))


def delete(pg: PgDatabase, kind: str, identity: str, n: int) -> None:
    condition, params = where_key(kind, n)
    query = sql.SQL("DELETE FROM {} WHERE {}").format(
        sql.Identifier(table_name(kind, identity)), condition
    )
    with pg.connect() as conn:
        conn.execute(query, params)


def test_key_types_identities_and_unchanged_toast(
    pg: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    shift = 0 if pg.major < 18 else 1  # the odd cells run on the other server
    matrix: list[tuple[str, str]] = []
    tables = []
    for i, kind in enumerate(KEY_TYPES):
        for j, identity in enumerate(IDENTITIES):
            cell = i * len(IDENTITIES) + j
            if (cell + shift) % 2:
                continue  # this cell runs on the other server
            matrix.append((kind, identity))
            history, changelog = COMBINATIONS[cell // 2 % len(COMBINATIONS)]
            create(pg, kind, identity)
            tables.append(
                {
                    "name": f"public.{table_name(kind, identity)}",
                    "history": history,
                    "changelog": changelog,
                }
            )
    config = make_config(pg, tmp_path / "lake", tables, stream={"max_changes_per_trigger": 100_000})
    changes: Counter[str] = Counter()  # changes per table since the snapshot

    def run_and_check() -> None:
        pipeline = Pipeline(config, spark=spark)
        pipeline.run(until_caught_up=True)
        assert_equal(pipeline)
        assert pipeline.plan is not None
        for table in pipeline.plan.tables:
            if table.history:
                assert_history_matches_mirror(pipeline, table)
            if table.changelog:
                log = DeltaTarget(table.path(pipeline.layout, "changelog")).read()
                ops = Counter(log.column("__op").to_pylist())
                assert sum(ops.values()) - ops["S"] == changes[table.name], table.table_id
                # every snapshot row has the consistent point and position -1
                changed = log.filter(pc.not_equal(log.column("__op"), "S"))
                keys = list(
                    zip(changed.column("__commit_lsn"), changed.column("__position"), strict=True)
                )
                assert len(keys) == len(set(keys)), f"{table.table_id}: a change twice"

    for kind, identity in matrix:
        for n in (1, 2):
            insert(pg, kind, identity, n)
    run_and_check()  # the initial copy

    for kind, identity in matrix:
        insert(pg, kind, identity, 3)
        update(pg, kind, identity, "v = v + 10")  # big: unchanged TOAST
        changes[table_name(kind, identity)] += 4
    run_and_check()

    for kind, identity in matrix:
        update(pg, kind, identity, "v = 2", n=1)
        change_key(pg, kind, identity, 2, 20)  # a key change, big unchanged
        delete(pg, kind, identity, 3)  # written by the previous run's batch
        update(pg, kind, identity, "v = v * 3", n=20)
        changes[table_name(kind, identity)] += 4
    run_and_check()
