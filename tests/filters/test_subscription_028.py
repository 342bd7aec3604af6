"""PostgreSQL's own row filter subscription test (src/test/subscription/t/028_row_filter.pl),
its tables, publications and changes: what a subscriber of those publications ends up with
when the server filters (publication WHERE clauses) is what it ends up with when pgcdc filters
the unfiltered stream of the same tables with the filters it reads from the catalog.

The port keeps the test's tables (a REPLICA IDENTITY FULL table, tables in several
publications whose filters are OR-ed or dropped by a publication without one, partitions
published through their own filters and through the root's, an inherited table filtered on a
column outside its replica identity, a TOASTed key in the filter) and its changes, including
the updates that move rows into and out of the filters (sent as INSERTs and DELETEs). Every
publication has an unfiltered twin (same tables, same ``publish_via_partition_root``): the
client filters the twins' stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from pgcdc.filters import StreamFilter, load_publications
from tests.filters import server
from tests.filters.server import Subscriber
from tests.fix_pg import PgDatabase

TABLES = """
CREATE TABLE tab_rowfilter_1 (a int primary key, b text);
ALTER TABLE tab_rowfilter_1 REPLICA IDENTITY FULL;
CREATE TABLE tab_rowfilter_2 (c int primary key);
CREATE TABLE tab_rowfilter_3 (a int primary key, b boolean);
CREATE TABLE tab_rowfilter_4 (c int primary key);
CREATE TABLE tab_rowfilter_partitioned (a int primary key, b integer) PARTITION BY RANGE(a);
CREATE TABLE tab_rowfilter_less_10k (LIKE tab_rowfilter_partitioned);
ALTER TABLE tab_rowfilter_partitioned ATTACH PARTITION tab_rowfilter_less_10k
    FOR VALUES FROM (MINVALUE) TO (10000);
CREATE TABLE tab_rowfilter_greater_10k (LIKE tab_rowfilter_partitioned);
ALTER TABLE tab_rowfilter_partitioned ATTACH PARTITION tab_rowfilter_greater_10k
    FOR VALUES FROM (10000) TO (MAXVALUE);
CREATE TABLE tab_rowfilter_partitioned_2 (a int primary key, b integer) PARTITION BY RANGE(a);
CREATE TABLE tab_rowfilter_partition (LIKE tab_rowfilter_partitioned_2);
ALTER TABLE tab_rowfilter_partitioned_2 ATTACH PARTITION tab_rowfilter_partition DEFAULT;
CREATE TABLE tab_rowfilter_toast (a text NOT NULL, b text NOT NULL);
ALTER TABLE tab_rowfilter_toast ALTER COLUMN a SET STORAGE EXTERNAL;
CREATE UNIQUE INDEX tab_rowfilter_toast_ri_index on tab_rowfilter_toast (a, b);
ALTER TABLE tab_rowfilter_toast REPLICA IDENTITY USING INDEX tab_rowfilter_toast_ri_index;
CREATE TABLE tab_rowfilter_inherited (a int);
CREATE TABLE tab_rowfilter_child (b text) INHERITS (tab_rowfilter_inherited);
CREATE TABLE tab_rowfilter_viaroot_part (a int) PARTITION BY RANGE (a);
CREATE TABLE tab_rowfilter_viaroot_part_1 PARTITION OF tab_rowfilter_viaroot_part
    FOR VALUES FROM (1) TO (20);
"""

#: (name, FOR TABLE list with the filters, WITH options): 028_row_filter.pl's publications
PUBLICATIONS = (
    ("tap_pub_1", "tab_rowfilter_1 WHERE (a > 1000 AND b <> 'filtered'), "
     "tab_rowfilter_2 WHERE (c % 2 = 0), tab_rowfilter_3", ""),
    ("tap_pub_2", "tab_rowfilter_2 WHERE (c % 3 = 0)", ""),
    ("tap_pub_3", "tab_rowfilter_partitioned, tab_rowfilter_less_10k WHERE (a < 6000)", ""),
    ("tap_pub_4a", "tab_rowfilter_4 WHERE (c % 2 = 0)", ""),
    ("tap_pub_4b", "tab_rowfilter_4", ""),
    ("tap_pub_5a", "tab_rowfilter_partitioned_2", ""),
    ("tap_pub_5b", "tab_rowfilter_partition WHERE (a > 10)", ""),
    ("tap_pub_toast", "tab_rowfilter_toast WHERE (a = repeat('1234567890', 200) AND b < '10')",
     ""),
    ("tap_pub_inherits", "tab_rowfilter_inherited WHERE (a > 15)", ""),
    ("tap_pub_viaroot_2", "tab_rowfilter_viaroot_part_1 WHERE (a < 15)",
     "publish_via_partition_root"),
    ("tap_pub_viaroot_1", "tab_rowfilter_viaroot_part WHERE (a > 15)",
     "publish_via_partition_root"),
)  # fmt: skip

#: the test's changes: its initial data (copied by the subscription there) and its stream
CHANGES = """
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1, 'not replicated');
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1500, 'filtered');
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1980, 'not filtered');
INSERT INTO tab_rowfilter_1 (a, b) SELECT x, 'test ' || x FROM generate_series(990,1002) x;
INSERT INTO tab_rowfilter_2 (c) SELECT generate_series(1, 20);
INSERT INTO tab_rowfilter_3 (a, b) SELECT x, (x % 3 = 0) FROM generate_series(1, 10) x;
INSERT INTO tab_rowfilter_4 (c) SELECT generate_series(1, 10);
INSERT INTO tab_rowfilter_partitioned (a, b) VALUES(1, 100),(7000, 101),(15000, 102),(5500, 300);
INSERT INTO tab_rowfilter_less_10k (a, b) VALUES(2, 200),(6005, 201);
INSERT INTO tab_rowfilter_greater_10k (a, b) VALUES(16000, 103);
INSERT INTO tab_rowfilter_partition (a, b) VALUES(1, 1),(20, 20);
INSERT INTO tab_rowfilter_toast(a, b) VALUES(repeat('1234567890', 200), '1234567890');
INSERT INTO tab_rowfilter_child(a, b) VALUES(10, 'a'), (20, 'b'), (30, 'c');
INSERT INTO tab_rowfilter_viaroot_part (a) VALUES (14), (15), (16);
INSERT INTO tab_rowfilter_1 (a, b) VALUES (800, 'test 800');
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1600, 'test 1600');
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1601, 'test 1601');
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1602, 'filtered');
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1700, 'test 1700');
UPDATE tab_rowfilter_1 SET b = NULL WHERE a = 1600;
UPDATE tab_rowfilter_1 SET b = 'test 1601 updated' WHERE a = 1601;
UPDATE tab_rowfilter_1 SET b = 'test 1602 updated' WHERE a = 1602;
DELETE FROM tab_rowfilter_1 WHERE a = 1700;
INSERT INTO tab_rowfilter_2 (c) VALUES (21), (22), (23), (24), (25);
INSERT INTO tab_rowfilter_4 (c) VALUES (0), (11), (12);
INSERT INTO tab_rowfilter_inherited (a) VALUES (14), (16);
INSERT INTO tab_rowfilter_child (a, b) VALUES (13, '13'), (17, '17');
UPDATE tab_rowfilter_toast SET b = '1';
INSERT INTO tab_rowfilter_viaroot_part (a) VALUES (13), (17);
UPDATE tab_rowfilter_partitioned SET a = 4000 WHERE a = 1;
UPDATE tab_rowfilter_partitioned SET a = 4001 WHERE a = 2;
UPDATE tab_rowfilter_partitioned SET a = 8000 WHERE a = 7000;
UPDATE tab_rowfilter_partitioned SET a = 9000 WHERE a = 5500;
DELETE FROM tab_rowfilter_partitioned WHERE a = 6005;
UPDATE tab_rowfilter_partitioned SET b = NULL WHERE a = 15000;
UPDATE tab_rowfilter_partitioned SET a = 5000, b = 555 WHERE a = 16000;
UPDATE tab_rowfilter_partitioned SET a = 16001 WHERE a = 4000;
UPDATE tab_rowfilter_partitioned_2 SET a = 21 WHERE a = 1;
UPDATE tab_rowfilter_partitioned_2 SET a = 5 WHERE a = 20;
TRUNCATE tab_rowfilter_2;
INSERT INTO tab_rowfilter_2 (c) VALUES (42), (43), (44), (45);
"""


def _create(conn: psycopg.Connection[Any]) -> None:
    conn.execute(TABLES)
    for name, tables, options in PUBLICATIONS:
        with_ = f" WITH ({options})" if options else ""
        # the test's own constants; the twin lists the same tables without their filters
        conn.execute(f"CREATE PUBLICATION {name} FOR TABLE {tables}{with_}")
        twin = ", ".join(part.split(" WHERE ")[0].strip() for part in _tables(tables))
        conn.execute(f"CREATE PUBLICATION u_{name} FOR TABLE {twin}{with_}")


def _tables(listing: str) -> Sequence[str]:
    """The entries of a FOR TABLE list (no filter here holds a comma outside parentheses)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(listing):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(listing[start:i])
            start = i + 1
    return [*out, listing[start:]]


def test_028_row_filter_subscription_filters_alike_on_server_and_client(
    pg: PgDatabase,
) -> None:
    names = [name for name, _, _ in PUBLICATIONS]
    with pg.connect() as conn:
        _create(conn)
        server.create_slot(conn, "sub_028")
        conn.execute(CHANGES)
        on_server = Subscriber()
        on_server.apply(server.slot_messages(conn, "sub_028", names, binary=False))
        unfiltered = server.slot_messages(conn, "sub_028", [f"u_{n}" for n in names], binary=False)
        on_client = Subscriber()
        on_client.apply(StreamFilter(load_publications(conn, names)).filter_messages(unfiltered))
        everything = Subscriber()
        everything.apply(unfiltered)
        conn.execute("SELECT pg_drop_replication_slot('sub_028')")
    server_rows, client_rows = on_server.contents(), on_client.contents()
    assert server_rows.keys() == client_rows.keys()
    for table in sorted(server_rows):
        assert client_rows[table] == server_rows[table], table
    # not vacuous: the filters kept some rows and dropped others, table by table as 028 says
    all_rows = everything.contents()
    filtered = {t for t in server_rows if server_rows[t] != all_rows.get(t)}
    assert {
        "tab_rowfilter_1",
        "tab_rowfilter_2",
        "tab_rowfilter_less_10k",
        "tab_rowfilter_inherited",
        "tab_rowfilter_viaroot_part",
    } <= filtered
    # tap_pub_4b has no filter, so tab_rowfilter_4 is not filtered; OR-ed filters of tap_pub_1
    # and tap_pub_2: multiples of 2 or 3
    assert server_rows["tab_rowfilter_4"] == all_rows["tab_rowfilter_4"]
    assert {int(str(r[0])) for r in server_rows["tab_rowfilter_2"]} == {42, 44, 45}
    # the TOASTed value the update left unchanged was filtered on (and arrives whole)
    assert server_rows["tab_rowfilter_toast"] == {("1234567890" * 200, "1")}
    # filtered on a column outside the replica identity: inserts only, accepted
    assert {r[0] for r in server_rows["tab_rowfilter_inherited"]} == {"16"}
