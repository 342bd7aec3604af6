"""``pgcdc tail --row-filter`` gives exactly what server-side publication row filters give.

Seeded random workloads (NULLs, key changes, TOAST, truncates, several replica identities) and
random filter expressions go through two publications of the same tables: one carrying the
filters (PostgreSQL filters on the server), one without them, read by ``pgcdc tail`` with the same
filters client-side. The ``--format test_decoding`` outputs must be identical, byte for byte.
A failing case names its seed in the test id; rerun it with ``-k seed<N>``.
"""

from __future__ import annotations

import random

import pytest

from tests.cli.test_tail_test_decoding import _tail, _tail_run
from tests.fix_pg import PgDatabase

SEEDS = [11, 23, 37, 41]
BIG = "".join(f"{(i * 2654435761) % 4294967291:08x}" for i in range(600))


def _tables() -> str:
    return """
    CREATE TABLE t_full (a int, b int, c text, n numeric(8,2), f bool, big text);
    ALTER TABLE t_full REPLICA IDENTITY FULL;
    CREATE TABLE t_key (k1 int, k2 text, v int, big text, PRIMARY KEY (k1, k2));
    CREATE TABLE t_idx (u int NOT NULL, w text NOT NULL, x int);
    CREATE UNIQUE INDEX t_idx_uw ON t_idx (u, w);
    ALTER TABLE t_idx REPLICA IDENTITY USING INDEX t_idx_uw;
    """


#: columns a filter may use per table (the replica identity, as the publication publishes all)
FILTER_COLUMNS = {
    "t_full": {"a": "int", "b": "int", "c": "text", "n": "num", "f": "bool"},
    "t_key": {"k1": "int", "k2": "text"},
    "t_idx": {"u": "int", "w": "text"},
}


def _atom(rng: random.Random, cols: dict[str, str]) -> str:
    name, kind = rng.choice(sorted(cols.items()))
    if kind == "bool":
        return rng.choice([name, f"NOT {name}", f"{name} IS NOT TRUE", f"{name} IS NULL"])
    if kind == "text":
        pick = rng.randrange(5)
        if pick == 0:
            return f"{name} LIKE '{rng.choice(['a', 'b', 'x'])}%'"
        if pick == 1:
            return f"{name} IN ('a1', 'b2', 'c3', NULL)"
        if pick == 2:
            return f"{name} IS NULL"
        if pick == 3:
            return f"length({name}) > {rng.randint(1, 3)}"
        return f"{name} >= '{rng.choice(['a', 'b', 'c'])}'"
    value = rng.randint(-5, 15)
    pick = rng.randrange(6)
    if pick == 0:
        return f"{name} BETWEEN {value} AND {value + rng.randint(0, 8)}"
    if pick == 1:
        return f"{name} % 3 = {rng.randint(0, 2)}"
    if pick == 2:
        return f"{name} IS DISTINCT FROM {value}"
    if pick == 3:
        return f"{name} + 1 > {value}"
    if kind == "num":
        return f"{name} * 2 < {value}.5"
    return f"{name} {rng.choice(['<', '<=', '>', '>=', '=', '<>'])} {value}"


def _expr(rng: random.Random, cols: dict[str, str], depth: int = 0) -> str:
    if depth >= 2 or rng.random() < 0.4:
        return _atom(rng, cols)
    op = rng.choice(["AND", "OR"])
    left, right = _expr(rng, cols, depth + 1), _expr(rng, cols, depth + 1)
    text = f"({left} {op} {right})"
    return f"NOT {text}" if rng.random() < 0.15 else text


def _value(rng: random.Random, kind: str) -> str:
    if rng.random() < 0.15:
        return "NULL"
    if kind == "int":
        return str(rng.randint(-5, 15))
    if kind == "text":
        return f"'{rng.choice('abcx')}{rng.randint(1, 3)}'"
    if kind == "num":
        return f"{rng.randint(-500, 1500) / 100:.2f}"
    return rng.choice(["true", "false"])


def _workload(pg: PgDatabase, rng: random.Random) -> None:
    with pg.connect() as conn:
        ex = conn.execute
        for step in range(120):
            table = rng.choice(["t_full", "t_key", "t_idx"])
            action = rng.random()
            if table == "t_full":
                if action < 0.5 or step < 10:
                    vals = [_value(rng, k) for k in ("int", "int", "text", "num", "bool")]
                    big = f"'{BIG}'" if rng.random() < 0.3 else "NULL"
                    ex(f"INSERT INTO t_full VALUES ({', '.join(vals)}, {big})")  # noqa: S608
                elif action < 0.85:
                    col, kind = rng.choice(
                        [("a", "int"), ("b", "int"), ("c", "text"), ("f", "bool")]
                    )
                    ex(
                        f"UPDATE t_full SET {col} = {_value(rng, kind)}"  # noqa: S608
                        f" WHERE a IS NOT DISTINCT FROM {_value(rng, 'int')}"
                    )
                else:
                    ex(f"DELETE FROM t_full WHERE b = {_value(rng, 'int')}")  # noqa: S608
            elif table == "t_key":
                k1, k2 = rng.randint(-5, 15), f"'{rng.choice('abcx')}{rng.randint(1, 3)}'"
                if action < 0.5 or step < 10:
                    big = f"'{BIG}'" if rng.random() < 0.3 else "'small'"
                    ex(
                        f"INSERT INTO t_key VALUES ({k1}, {k2}, {rng.randint(0, 9)}, {big})"  # noqa: S608
                        " ON CONFLICT DO NOTHING"
                    )
                elif action < 0.7:  # key unchanged: no old tuple, TOAST column unchanged
                    ex(f"UPDATE t_key SET v = v + 1 WHERE k1 = {k1}")  # noqa: S608
                elif action < 0.9:  # key change
                    ex(
                        f"UPDATE t_key SET k1 = {rng.randint(-5, 15)} WHERE k1 = {k1}"  # noqa: S608
                        " AND NOT EXISTS (SELECT 1 FROM t_key WHERE k1 > 100)"
                    )
                else:
                    ex(f"DELETE FROM t_key WHERE k2 = {k2}")  # noqa: S608
            else:
                u, w = rng.randint(-5, 15), f"'{rng.choice('abcx')}{rng.randint(1, 3)}'"
                if action < 0.5 or step < 10:
                    ex(
                        f"INSERT INTO t_idx VALUES ({u}, {w}, {_value(rng, 'int')})"  # noqa: S608
                        " ON CONFLICT DO NOTHING"
                    )
                elif action < 0.8:
                    ex(f"UPDATE t_idx SET u = u + 1, x = 0 WHERE w = {w}")  # noqa: S608
                else:
                    ex(f"DELETE FROM t_idx WHERE u = {u}")  # noqa: S608
            if rng.random() < 0.02:
                ex(f"TRUNCATE {table}")


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
def test_client_filters_equal_server_filters(pg: PgDatabase, seed: int) -> None:
    rng = random.Random(seed)
    pg.execute(_tables())
    exprs = {
        t: [_expr(rng, cols) for _ in range(rng.randint(1, 2))]
        for t, cols in FILTER_COLUMNS.items()
    }
    # one filtered publication per expression of a table: their filters are OR-ed
    pubs_f = []
    for i in range(2):
        parts = [f"{t} WHERE ({e[i]})" for t, e in exprs.items() if len(e) > i]
        if parts:
            pg.execute(f"CREATE PUBLICATION pf{i} FOR TABLE {', '.join(parts)}")
            pubs_f.append(f"pf{i}")
    pg.execute("CREATE PUBLICATION pu FOR TABLE t_full, t_key, t_idx")
    for slot in ("sf", "su"):
        pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    _workload(pg, rng)

    client = [f"--row-filter=public.{t}={e}" for t, es in exprs.items() for e in es]
    for binary in ([], ["--binary"]):
        server_side = _tail(
            pg, "--slot", "sf", *[a for p in pubs_f for a in ("--publication", p)], *binary
        )
        client_side = _tail(pg, "--slot", "su", "--publication", "pu", *client, *binary)
        assert client_side.decode().splitlines() == server_side.decode().splitlines(), exprs
        assert client_side == server_side
    unfiltered = _tail(pg, "--slot", "su", "--publication", "pu")
    assert unfiltered.count(b"\n") > server_side.count(b"\n"), "the filters filtered nothing"


def test_bad_row_filters_are_refused_before_reading(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    pg.execute("CREATE PUBLICATION p FOR TABLE t")
    pg.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    base = ["--slot", "s", "--publication", "p"]
    assert _tail_run(pg, *base, "--row-filter", "t=v > 1") == (2, b"")  # not schema-qualified
    assert _tail_run(pg, *base, "--row-filter", "public.t=v >") == (2, b"")  # syntax
    assert _tail_run(pg, *base, "--row-filter", "public.t=now() > '2020-01-01'") == (2, b"")


def test_a_filter_outside_the_replica_identity_fails_at_the_first_update(
    pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    """As CREATE PUBLICATION, tail accepts a filter on columns outside the replica identity:
    an insert-only table's changes print as the server filters them; the first UPDATE of the
    table fails as the server fails the statement (issue 26; the server side of the check is
    in PostgreSQL's 028_row_filter.pl)."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    pg.execute("CREATE PUBLICATION pu FOR TABLE t")
    pg.execute("CREATE PUBLICATION pf FOR TABLE t WHERE (v > 1)")  # accepted by the server
    for slot in ("su", "sf"):
        pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    pg.execute("INSERT INTO t SELECT g, g % 4 FROM generate_series(1, 20) g")
    with pytest.raises(Exception, match='cannot update table "t"'):
        pg.execute("UPDATE t SET v = 6")  # the server refuses the statement
    server_side = _tail(pg, "--slot", "sf", "--publication", "pf")
    client = ["--slot", "su", "--publication", "pu", "--row-filter", "public.t=v > 1"]
    assert _tail(pg, *client) == server_side
    assert server_side.count(b"INSERT:") == 10

    pg.execute("DROP PUBLICATION pf")  # now the source lets the UPDATE through
    pg.execute("UPDATE t SET v = 6 WHERE id = 1")
    capsys.readouterr()
    code, output = _tail_run(pg, *client)
    assert code == 2
    assert output == server_side  # the inserts before it, then nothing
    err = capsys.readouterr().err
    assert 'cannot update table "t"' in err, err
    assert "not part of the replica identity" in err, err
