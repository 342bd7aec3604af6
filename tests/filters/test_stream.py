"""Stream differential: the same WAL decoded by pgoutput through publications with row filters
and through unfiltered publications of the same tables and actions; the unfiltered stream,
run through StreamFilter with the filters read from the server's catalog, must equal the
filtered stream message for message (decoded dataclasses, relation ids, tuples), in text and in
binary format.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgcdc.filters import FilterSet, StreamFilter, load_publications
from pgcdc.protocol import Delete, Insert, Relation, ReplicationMessage, Truncate, Update
from pgcdc.protocol.messages import UNCHANGED_TOAST, Column
from tests.filters import server
from tests.fix_pg import PgDatabase

# large and incompressible enough to be stored out of line (TOAST)
BIG = "".join(f"{(i * 2654435761) % 4294967291:x}" for i in range(2000))

SCHEMA = """
CREATE TABLE s_default (k int PRIMARY KEY, x int, y text, big text);
CREATE TABLE s_full (k int, x int, y text, big text);
ALTER TABLE s_full REPLICA IDENTITY FULL;
CREATE TABLE s_index (k int NOT NULL, x int NOT NULL, y text, big text);
CREATE UNIQUE INDEX s_index_x_k ON s_index (x, k);
ALTER TABLE s_index REPLICA IDENTITY USING INDEX s_index_x_k;
CREATE TABLE s_plain (k int PRIMARY KEY, v text);

CREATE PUBLICATION fp1 FOR TABLE
    s_default WHERE (k % 3 = 0 OR k > 1000),
    s_full WHERE (x > 10 AND y LIKE 'a%' AND length(big) > 100),
    s_index WHERE (x BETWEEN 5 AND 50),
    s_plain;
CREATE PUBLICATION fp2 FOR TABLE s_default WHERE (k < 0), s_full WHERE (y IS NULL)
    WITH (publish = 'insert, update');
CREATE PUBLICATION fp3 FOR TABLE s_full WHERE (x IS DISTINCT FROM 7) WITH (publish = 'delete');
CREATE PUBLICATION up FOR TABLE s_default, s_full, s_index, s_plain;
"""


def _workload(conn: psycopg.Connection[Any]) -> None:
    """Inserts, updates in every direction of the filters, key changes, deletes, TOAST, NULLs,
    truncates; one statement per transaction plus a few multi-statement transactions."""
    ex = conn.execute
    ex("INSERT INTO s_plain VALUES (1, 'one')")
    # s_default: filter on the key (k % 3 = 0 OR k > 1000), OR k < 0 for insert/update
    ex("INSERT INTO s_default SELECT g, g * 2, 'y' || g, NULL FROM generate_series(-2, 12) g")
    ex("INSERT INTO s_default VALUES (30, 1, 'toast', %s)", (BIG,))
    ex("INSERT INTO s_default VALUES (31, 1, 'toast', %s)", (BIG,))
    ex("UPDATE s_default SET x = x + 1 WHERE k IN (3, 4)")  # key unchanged: no old tuple
    ex("UPDATE s_default SET k = 1003 WHERE k = 3")  # match -> match (key change)
    ex("UPDATE s_default SET k = 1004 WHERE k = 4")  # no match -> match: INSERT
    ex("UPDATE s_default SET k = 101 WHERE k = 6")  # match -> no match: DELETE
    ex("UPDATE s_default SET k = 104 WHERE k = 5")  # no match -> no match: nothing
    ex("UPDATE s_default SET x = 0 WHERE k = 30")  # TOASTed big unchanged, key unchanged
    ex("UPDATE s_default SET k = 33 WHERE k = 31")  # key change with TOAST unchanged: INSERT
    ex("UPDATE s_default SET k = 34 WHERE k = 30")  # key change, match -> no match: DELETE
    ex("UPDATE s_default SET y = NULL, x = NULL WHERE k = 9")
    ex("DELETE FROM s_default WHERE k IN (9, 10, -1)")
    with conn.transaction():
        ex("UPDATE s_default SET k = k - 100 WHERE k IN (1, 2)")  # into the k < 0 filter
        ex("INSERT INTO s_default VALUES (2000, 0, NULL, NULL)")
    # s_full: REPLICA IDENTITY FULL, filters on non-key columns and TOASTed text
    ex("INSERT INTO s_full VALUES (1, 20, 'abc', %s), (2, 5, 'abc', %s)", (BIG, BIG))
    ex("INSERT INTO s_full VALUES (3, 20, NULL, 'short'), (4, 7, 'a', NULL), (5, NULL, 'a', 'x')")
    ex("UPDATE s_full SET x = 30 WHERE k = 1")  # match -> match, big unchanged TOAST
    ex("UPDATE s_full SET x = 1 WHERE k = 1")  # match -> no match: DELETE
    ex("UPDATE s_full SET x = 40 WHERE k = 1")  # no match -> match: INSERT (patched new)
    ex("UPDATE s_full SET x = 50 WHERE k = 2")  # no match -> match via big
    ex("UPDATE s_full SET y = 'b' WHERE k = 2")  # match -> no match
    ex("UPDATE s_full SET y = 'zz' WHERE k = 3")  # y IS NULL -> not
    ex("UPDATE s_full SET big = %s WHERE k = 3", (BIG,))
    ex("UPDATE s_full SET x = x WHERE k IN (4, 5)")
    ex("DELETE FROM s_full WHERE k IN (1, 4, 5)")
    # s_index: identity index (x, k)
    ex("INSERT INTO s_index SELECT g, g * 3, NULL, NULL FROM generate_series(1, 20) g")
    ex("UPDATE s_index SET x = 100 WHERE k = 2")  # match -> no match
    ex("UPDATE s_index SET x = 10 WHERE k = 20")  # no match -> match
    ex("UPDATE s_index SET y = 'only y' WHERE k IN (3, 19)")  # identity unchanged
    ex("UPDATE s_index SET big = %s WHERE k = 4", (BIG,))
    ex("UPDATE s_index SET x = 11 WHERE k = 4")  # identity change with TOAST unchanged
    ex("DELETE FROM s_index WHERE k IN (3, 19)")
    with conn.transaction():
        ex("INSERT INTO s_plain VALUES (2, 'two')")
        ex("INSERT INTO s_default VALUES (-50, 1, 'x', NULL)")
        ex("DELETE FROM s_plain WHERE k = 1")
    ex("TRUNCATE s_full")
    ex("TRUNCATE s_index, s_plain")
    ex("INSERT INTO s_index VALUES (7, 7, 'after truncate', NULL)")


def _changes(messages: list[ReplicationMessage]) -> list[ReplicationMessage]:
    return [m for m in messages if isinstance(m, Insert | Update | Delete | Truncate)]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_client_filters_equal_server_filters(pg: PgDatabase, binary: bool) -> None:
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        server.create_slot(conn, "rf_slot")
        _workload(conn)
        filtered = server.slot_messages(conn, "rf_slot", ["fp1", "fp2", "fp3"], binary=binary)
        unfiltered = server.slot_messages(conn, "rf_slot", ["up"], binary=binary)
        filters = load_publications(conn, ["fp1", "fp2", "fp3"])
    assert {r.table for r in filters} == {
        "public.s_default",
        "public.s_full",
        "public.s_index",
        "public.s_plain",
    }
    assert not filters.rule("public", "s_plain").is_filtered()  # type: ignore[union-attr]

    # the workload exercised what it claims to
    kinds = {type(m).__name__ for m in filtered}
    assert {"Insert", "Update", "Delete", "Truncate", "Relation", "Begin", "Commit"} <= kinds
    assert len(_changes(filtered)) < len(_changes(unfiltered))
    assert any(
        isinstance(m, Update) and UNCHANGED_TOAST in m.new and m.old is not None for m in unfiltered
    ), "no UPDATE with an unchanged TOAST value and an old tuple"
    inserts_from_updates = [m for m in filtered if isinstance(m, Insert) and m not in unfiltered]
    deletes_from_updates = [m for m in filtered if isinstance(m, Delete) and m not in unfiltered]
    assert inserts_from_updates, "no UPDATE became an INSERT"
    assert deletes_from_updates, "no UPDATE became a DELETE"
    big = BIG.encode() if binary else BIG
    assert any(big in m.new for m in inserts_from_updates), "no INSERT with a patched TOAST value"

    stream = StreamFilter(filters)
    assert list(stream.filter_messages(unfiltered)) == filtered

    # apply() alone gives the same changes (framing aside)
    per_message = StreamFilter(filters)
    applied = [per_message.apply(m) for m in unfiltered]
    assert _changes([m for m in applied if m is not None]) == _changes(filtered)


def test_partitioned_p4_both_ways(pg: PgDatabase) -> None:
    """The seed's p4 example: the root's filter with publish_via_partition_root, the
    partition's own without (a partition published only through its parent: unfiltered)."""
    with pg.connect() as conn:
        conn.execute(
            "CREATE TABLE parent (a int PRIMARY KEY) PARTITION BY RANGE (a);"
            "CREATE TABLE child PARTITION OF parent DEFAULT;"
            "CREATE TABLE other (a int PRIMARY KEY) PARTITION BY RANGE (a);"
            "CREATE TABLE other_child PARTITION OF other DEFAULT;"
            "CREATE PUBLICATION p4_root FOR TABLE parent WHERE (a < 5), child WHERE (a >= 5)"
            " WITH (publish_via_partition_root = true);"
            "CREATE PUBLICATION p4_leaf FOR TABLE parent, child WHERE (a >= 5)"
            " WITH (publish_via_partition_root = false);"
            "CREATE PUBLICATION p4_parent_only FOR TABLE other"
            " WITH (publish_via_partition_root = false);"
            "CREATE PUBLICATION u4_root FOR TABLE parent WITH (publish_via_partition_root = true);"
            "CREATE PUBLICATION u4_leaf FOR TABLE parent WITH (publish_via_partition_root = false);"
            "CREATE PUBLICATION u4_other FOR TABLE other WITH (publish_via_partition_root = false)"
        )
        server.create_slot(conn, "p4_slot")
        conn.execute("INSERT INTO parent VALUES (2), (4), (6)")
        conn.execute("INSERT INTO child VALUES (3), (5), (7)")
        conn.execute("UPDATE parent SET a = a + 10 WHERE a IN (3, 4)")
        conn.execute("DELETE FROM parent WHERE a IN (2, 13, 14)")
        conn.execute("TRUNCATE parent")
        conn.execute("INSERT INTO other VALUES (1), (9)")
        cases = [("p4_root", "u4_root", {"public.parent"}),
                 ("p4_leaf", "u4_leaf", {"public.child"}),
                 ("p4_parent_only", "u4_other", {"public.other_child"})]  # fmt: skip
        for filtered_pub, unfiltered_pub, tables in cases:
            for binary in (False, True):
                filtered = server.slot_messages(conn, "p4_slot", [filtered_pub], binary=binary)
                unfiltered = server.slot_messages(conn, "p4_slot", [unfiltered_pub], binary=binary)
                filters = load_publications(conn, [filtered_pub])
                assert {r.table for r in filters} >= tables
                got = list(StreamFilter(filters).filter_messages(unfiltered))
                assert got == filtered, (filtered_pub, binary)
        root_rule = load_publications(conn, ["p4_root"]).rule("public", "parent")
        leaf_rule = load_publications(conn, ["p4_leaf"]).rule("public", "child")
        other_rule = load_publications(conn, ["p4_parent_only"]).rule("public", "other_child")
    assert root_rule is not None and root_rule.filters["insert"][0].filter.text == "(a < 5)"
    assert leaf_rule is not None and leaf_rule.filters["insert"][0].filter.text == "(a >= 5)"
    assert other_rule is not None and not other_rule.is_filtered()


def test_filter_set_combination_rules() -> None:
    """pgoutput_row_filter_init: per action OR of filters; an unfiltered publication of an
    action, FOR ALL TABLES or FOR TABLES IN SCHEMA makes that action unfiltered."""
    from pgcdc.filters import Publication, RowFilter

    f1, f2 = RowFilter.parse("a > 1"), RowFilter.parse("a < 0")
    rules = FilterSet.from_publications(
        [
            Publication("p1", {"s.t": f1}),
            Publication("p2", {"s.t": f2}, actions=frozenset({"insert"})),
            Publication("p3", {"s.t": None}, actions=frozenset({"delete", "truncate"})),
            Publication("p4", {"s.u": f1}),
            Publication("p5", schemas=frozenset({"s"}), actions=frozenset({"update"})),
        ]
    )
    t = rules.rule("s", "t")
    assert t is not None
    assert [p.filter for p in t.filters["insert"]] == [f1, f2]
    assert "update" not in t.filters and "delete" not in t.filters  # p5, p3
    assert t.actions == {"insert", "update", "delete", "truncate"}
    u = rules.rule("s", "u")
    assert u is not None and set(u.filters) == {"insert", "delete"}
    assert rules.rule("s", "nope") is None
    config = FilterSet.from_config({"public.t1": ["a > 5", "c = 'NSW'"]}, actions=["insert"])
    rule = config.rule("public", "t1")
    assert rule is not None and len(rule.filters["insert"]) == 2
    assert rule.actions == {"insert"}
    with pytest.raises(ValueError, match=r"schema\.table"):
        FilterSet.from_config({"t1": "a > 5"})


def test_relations_are_required() -> None:
    from pgcdc.filters import UnknownRelationError

    stream = StreamFilter(FilterSet.from_config({"public.t": "a > 1"}))
    with pytest.raises(UnknownRelationError):
        stream.apply(Insert(None, 42, ("1",)))
    rel = Relation(None, 42, "public", "t", "d", (Column(1, "a", 23, -1),))
    assert stream.apply(Insert(None, 42, ("1",)), rel) is None
    assert stream.apply(Insert(None, 42, ("2",))) == Insert(None, 42, ("2",))


def test_all_tables_and_schema_publications_make_filters_redundant(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        conn.execute(
            "CREATE SCHEMA sx;"
            "CREATE TABLE sx.a (k int PRIMARY KEY, v int);"
            "CREATE TABLE public.b (k int PRIMARY KEY, v int);"
            "CREATE PUBLICATION f_ab FOR TABLE sx.a WHERE (k > 5), public.b WHERE (k > 5);"
            "CREATE PUBLICATION s_x FOR TABLES IN SCHEMA sx WITH (publish = 'insert');"
            "CREATE PUBLICATION all_upd FOR ALL TABLES WITH (publish = 'update');"
            "CREATE PUBLICATION u_ab FOR TABLE sx.a, public.b"
        )
        server.create_slot(conn, "rf_slot")
        for schema, name in (("sx", "a"), ("public", "b")):
            table = sql.Identifier(schema, name)
            conn.execute(
                sql.SQL("INSERT INTO {} SELECT g, g FROM generate_series(1, 10) g").format(table)
            )
            conn.execute(sql.SQL("UPDATE {} SET v = v + 1 WHERE k IN (2, 8)").format(table))
            conn.execute(sql.SQL("DELETE FROM {} WHERE k IN (3, 9)").format(table))
        conn.execute("TRUNCATE sx.a, public.b")
        names = ["f_ab", "s_x", "all_upd"]
        filtered = server.slot_messages(conn, "rf_slot", names, binary=False)
        unfiltered = server.slot_messages(conn, "rf_slot", ["u_ab"], binary=False)
        filters = load_publications(conn, names)
    a, b = filters.rule("sx", "a"), filters.rule("public", "b")
    assert a is not None and b is not None
    assert set(a.filters) == {"delete"}  # insert: IN SCHEMA, update: ALL TABLES
    assert set(b.filters) == {"insert", "delete"}
    assert list(StreamFilter(filters).filter_messages(unfiltered)) == filtered


COLLATED = """
CREATE TABLE c_utf8 (k int PRIMARY KEY, name text COLLATE "C.utf8");
ALTER TABLE c_utf8 REPLICA IDENTITY FULL;
CREATE TABLE c_icu (k int PRIMARY KEY, name text COLLATE "en-x-icu");
ALTER TABLE c_icu REPLICA IDENTITY FULL;
CREATE PUBLICATION cf_utf8 FOR TABLE c_utf8 WHERE (upper(name) = 'É');
CREATE PUBLICATION cf_icu FOR TABLE c_icu WHERE (name < 'a');
CREATE PUBLICATION cu FOR TABLE c_utf8, c_icu;
"""


def test_a_columns_own_collation_is_the_filters(pg: PgDatabase) -> None:
    """A text column declared with a collation of its own compares and maps case under it,
    not under the database's (C here): the client upper-cased 'é' as ASCII and dropped the
    row the server sent, and ordered text under ICU by code point, letting through rows the
    server dropped. C.UTF-8's case mapping is now evaluated as the server does; ordering under
    ICU is refused, as under an ICU database."""
    from pgcdc.filters import CollationError

    with pg.connect() as conn:
        conn.execute(COLLATED)
        server.create_slot(conn, "coll_slot")
        conn.execute("INSERT INTO c_utf8 VALUES (1, 'é'), (2, 'e'), (3, 'É')")
        conn.execute("INSERT INTO c_icu VALUES (1, 'B'), (2, 'A'), (3, '0')")
        filtered = server.slot_messages(conn, "coll_slot", ["cf_utf8"], binary=False)
        unfiltered = server.slot_messages(conn, "coll_slot", ["cu"], binary=False)
        utf8 = load_publications(conn, ["cf_utf8"])
        icu = load_publications(conn, ["cf_icu"])
    assert utf8.rule("public", "c_utf8").collations == {"name": ("C.utf8", "pg_catalog")}  # type: ignore[union-attr]
    assert [m.new[0] for m in _changes(filtered)] == ["1", "3"]  # type: ignore[union-attr]
    only_utf8 = [m for m in unfiltered if not isinstance(m, Insert) or m.new[1] in "éeÉ"]
    assert list(StreamFilter(utf8).filter_messages(only_utf8)) == filtered
    with pytest.raises(CollationError, match="text ordering under collation en-x-icu"):
        list(StreamFilter(icu).filter_messages(unfiltered))
