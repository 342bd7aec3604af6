"""The worked examples of PostgreSQL's "Row Filters" chapter (31.3.7, the seed
row-filters.txt): the rows a subscriber ends up with, when the changes are filtered by the
server (publication WHERE clauses) and when an unfiltered stream is filtered client-side, are
the rows the chapter shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from pgcdc.filters import FilterSet, RowFilter, StreamFilter, load_publications
from tests.filters import server
from tests.filters.server import Subscriber
from tests.fix_pg import PgDatabase

Row = tuple[str | None, ...]


def _subscribers(
    conn: psycopg.Connection[Any],
    filtered_pubs: list[str],
    unfiltered_pubs: list[str],
    config: FilterSet,
) -> list[Subscriber]:
    """Three subscribers fed from the slot's pending changes: server-side filtering, client
    filtering with the catalog's filters, client filtering with a client configuration."""
    server_side = Subscriber()
    server_side.apply(server.slot_messages(conn, "ex_slot", filtered_pubs, binary=False))
    unfiltered = server.slot_messages(conn, "ex_slot", unfiltered_pubs, binary=False)
    from_catalog = Subscriber()
    from_catalog.apply(
        StreamFilter(load_publications(conn, filtered_pubs)).filter_messages(unfiltered)
    )
    from_config = Subscriber()
    from_config.apply(StreamFilter(config).filter_messages(unfiltered))
    return [server_side, from_catalog, from_config]


def _check(
    conn: psycopg.Connection[Any],
    filtered: list[str],
    unfiltered: list[str],
    config: FilterSet,
    expected: dict[str, set[Row]],
) -> None:
    for subscriber, name in zip(
        _subscribers(conn, filtered, unfiltered, config),
        ("server-side", "client-side (catalog)", "client-side (config)"),
        strict=True,
    ):
        for table, rows in expected.items():
            assert subscriber.rows(table) == rows, (name, table)


def test_t1_p1_updates_become_inserts_and_deletes(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        run: Callable[[str], object] = conn.execute
        run("CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c))")
        run("CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d))")
        run("CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g))")
        run("CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW')")
        run("CREATE PUBLICATION p2 FOR TABLE t1, t2 WHERE (e = 99)")
        run("CREATE PUBLICATION p3 FOR TABLE t2 WHERE (d = 10), t3 WHERE (g = 10)")
        run("CREATE PUBLICATION all_t FOR TABLE t1, t2, t3")
        quals = dict(
            conn.execute(
                "SELECT p.pubname || '.' || c.relname, pg_get_expr(r.prqual, r.prrelid) "
                "FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
                "JOIN pg_class c ON c.oid = r.prrelid WHERE p.pubname <> 'all_t'"
            ).fetchall()
        )
        # \dRp+ in the chapter
        assert quals == {
            "p1.t1": "((a > 5) AND (c = 'NSW'::text))",
            "p2.t1": None,
            "p2.t2": "(e = 99)",
            "p3.t2": "(d = 10)",
            "p3.t3": "(g = 10)",
        }
        server.create_slot(conn, "ex_slot")
        p1 = FilterSet.from_config({"public.t1": "a > 5 AND c = 'NSW'"})
        inserts = [(2, 102, "NSW"), (3, 103, "QLD"), (4, 104, "VIC"), (5, 105, "ACT"),
                   (6, 106, "NSW"), (7, 107, "NT"), (8, 108, "QLD"), (9, 109, "NSW")]  # fmt: skip
        for a, b, c in inserts:
            run("INSERT INTO t1 VALUES (%s, %s, %s)", (a, b, c))
        six, nine, moved = ("6", "106", "NSW"), ("9", "109", "NSW"), ("555", "102", "NSW")
        _check(conn, ["p1"], ["all_t"], p1, {"t1": {six, nine}})
        run("UPDATE t1 SET b = 999 WHERE a = 6")  # both rows match: UPDATE
        six = ("6", "999", "NSW")
        _check(conn, ["p1"], ["all_t"], p1, {"t1": {six, nine}})
        run("UPDATE t1 SET a = 555 WHERE a = 2")  # only the new row matches: INSERT
        _check(conn, ["p1"], ["all_t"], p1, {"t1": {six, nine, moved}})
        run("UPDATE t1 SET c = 'VIC' WHERE a = 9")  # only the old row matches: DELETE
        _check(conn, ["p1"], ["all_t"], p1, {"t1": {six, moved}})

        # A subscription to p1, p2 and p3: t1 is unfiltered (p2 publishes it without a
        # filter), t2's filters are OR-ed, t3 has p3's.
        for d, e, f in [(1, 99, 0), (10, 1, 0), (11, 2, 0)]:
            run("INSERT INTO t2 VALUES (%s, %s, %s)", (d, e, f))
        for g in (9, 10, 11):
            run("INSERT INTO t3 VALUES (%s, 0, 0)", (g,))
        config = FilterSet.from_publications(
            [
                _pub("p1", {"public.t1": "a > 5 AND c = 'NSW'"}),
                _pub("p2", {"public.t1": None, "public.t2": "e = 99"}),
                _pub("p3", {"public.t2": "d = 10", "public.t3": "g = 10"}),
            ]
        )
        rule = load_publications(conn, ["p1", "p2", "p3"]).rule("public", "t1")
        assert rule is not None and not rule.is_filtered()
        all_t1 = {
            (str(a), str(b), c)
            for a, b, c in conn.execute("SELECT a::text, b::text, c FROM t1").fetchall()
        }
        _check(
            conn,
            ["p1", "p2", "p3"],
            ["all_t"],
            config,
            {
                "t1": all_t1,
                "t2": {("1", "99", "0"), ("10", "1", "0")},
                "t3": {("10", "0", "0")},
            },
        )


def _pub(name: str, tables: dict[str, str | None]):  # type: ignore[no-untyped-def]
    from pgcdc.filters import Publication

    return Publication(
        name, {t: None if e is None else RowFilter.parse(e) for t, e in tables.items()}
    )


def test_p4_partitioned_both_ways(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        run: Callable[[str], object] = conn.execute
        run("CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a)")
        run("CREATE TABLE child PARTITION OF parent DEFAULT")
        run(
            "CREATE PUBLICATION p4 FOR TABLE parent WHERE (a < 5), child WHERE (a >= 5) "
            "WITH (publish_via_partition_root=true)"
        )
        run("CREATE PUBLICATION u4 FOR TABLE parent WITH (publish_via_partition_root=true)")
        server.create_slot(conn, "ex_slot")
        run("INSERT INTO parent VALUES (2), (4), (6)")
        run("INSERT INTO child VALUES (3), (5), (7)")
        assert [r for (r,) in conn.execute("SELECT a FROM parent ORDER BY a")] == [2, 3, 4, 5, 6, 7]
        config = FilterSet.from_config({"public.parent": "a < 5"})
        _check(conn, ["p4"], ["u4"], config, {"parent": {("2",), ("3",), ("4",)}})
        run("SELECT pg_drop_replication_slot('ex_slot')")

        # the same with publish_via_partition_root = false: the partition's filter applies
        run("DROP PUBLICATION p4")
        run("DROP PUBLICATION u4")
        run(
            "CREATE PUBLICATION p4 FOR TABLE parent, child WHERE (a >= 5) "
            "WITH (publish_via_partition_root=false)"
        )
        run("CREATE PUBLICATION u4 FOR TABLE parent WITH (publish_via_partition_root=false)")
        server.create_slot(conn, "ex_slot")
        run("TRUNCATE parent")
        run("INSERT INTO parent VALUES (2), (4), (6)")
        run("INSERT INTO child VALUES (3), (5), (7)")
        config = FilterSet.from_config({"public.child": "a >= 5"})
        _check(conn, ["p4"], ["u4"], config, {"child": {("5",), ("6",), ("7",)}})
