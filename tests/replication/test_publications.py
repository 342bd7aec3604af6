"""Publications of each kind, with row filters, column lists and publish options."""

from __future__ import annotations

import pytest

from pgcdc.filters import RowFilter
from pgcdc.protocol import Delete, Insert, Relation, Update
from pgcdc.replication import (
    PublicationExistsError,
    PublicationNotFoundError,
    PublicationTable,
    ReplicationError,
    ReplicationSession,
    RowFilterSQL,
    StreamOptions,
    check_publication_name,
    create_publication,
    create_slot,
    drop_publication,
    publication_info,
)
from tests.fix_pg import PgDatabase
from tests.replication.streams import FAST, commits_at_least, read

SCHEMA = 'Sch "ema" ü'
TABLE = 'My "Tab"le, ü'
PUB = 'pub, "x" ü'


def _weird_table(pg: PgDatabase) -> None:
    pg.execute('CREATE SCHEMA "Sch ""ema"" ü"')
    pg.execute(
        'CREATE TABLE "Sch ""ema"" ü"."My ""Tab""le, ü" '
        '(id int PRIMARY KEY, "Größe" int, "secret col" text)'
    )


def test_tables_with_row_filter_and_column_list(pg: PgDatabase) -> None:
    _weird_table(pg)
    pg.execute("CREATE TABLE plain (id int PRIMARY KEY)")
    create_publication(
        pg.dsn(),
        PUB,
        tables=[
            PublicationTable(
                TABLE,
                schema=SCHEMA,
                where=RowFilter.parse('"Größe" > 10').sql(),
                columns=("id", "Größe"),
            ),
            "plain",
        ],
    )
    info = publication_info(pg.dsn(), PUB)
    assert info is not None
    assert (info.name, info.all_tables, info.schemas) == (PUB, False, ())
    assert info.publish == {"insert", "update", "delete", "truncate"}
    assert set(info.listed_tables) == {("public", "plain"), (SCHEMA, TABLE)}
    weird, plain = sorted(info.tables, key=lambda t: t.schema != SCHEMA)
    assert (weird.schema, weird.name, weird.columns, weird.column_list) == (
        SCHEMA,
        TABLE,
        ("id", "Größe"),
        True,
    )
    assert weird.row_filter == '("Größe" > 10)'
    assert (plain.name, plain.columns, plain.column_list, plain.row_filter) == (
        "plain",
        ("id",),
        False,
        None,
    )
    if pg.major >= 18:
        assert info.generated_columns == "none"
    else:
        assert info.generated_columns is None

    create_slot(pg.dsn(), "s")
    with ReplicationSession(pg.dsn(), "s", StreamOptions((PUB,)), **FAST) as session:
        pg.execute(
            'INSERT INTO "Sch ""ema"" ü"."My ""Tab""le, ü" VALUES (1, 5, \'no\'), (2, 50, \'a\')'
        )
        pg.execute("INSERT INTO plain VALUES (3)")
        got = read(session, commits_at_least(2))
    relation = got.of(Relation)[0]
    assert (relation.namespace, relation.name) == (SCHEMA, TABLE)
    assert [c.name for c in relation.columns] == ["id", "Größe"]  # the column list
    assert [m.new for m in got.of(Insert)] == [("2", "50"), ("3",)]  # the row filter


def test_all_tables_and_schemas(pg: PgDatabase) -> None:
    _weird_table(pg)
    pg.execute("CREATE TABLE plain (id int PRIMARY KEY)")
    create_publication(pg.dsn(), "everything", all_tables=True)
    create_publication(pg.dsn(), "by_schema", schemas=[SCHEMA])
    create_publication(pg.dsn(), "mixed", tables=[("public", "plain")], schemas=[SCHEMA])
    everything = publication_info(pg.dsn(), "everything")
    by_schema = publication_info(pg.dsn(), "by_schema")
    mixed = publication_info(pg.dsn(), "mixed")
    assert everything is not None and by_schema is not None and mixed is not None
    assert everything.all_tables and everything.schemas == ()
    assert {(t.schema, t.name) for t in everything.tables} == {
        (SCHEMA, TABLE),
        ("public", "plain"),
    }
    assert not by_schema.all_tables and by_schema.schemas == (SCHEMA,)
    assert [(t.schema, t.name) for t in by_schema.tables] == [(SCHEMA, TABLE)]
    assert by_schema.listed_tables == ()
    assert mixed.schemas == (SCHEMA,) and mixed.listed_tables == (("public", "plain"),)
    create_slot(pg.dsn(), "s")
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("by_schema",)), **FAST) as session:
        pg.execute("INSERT INTO plain VALUES (1)")
        pg.execute('INSERT INTO "Sch ""ema"" ü"."My ""Tab""le, ü" VALUES (2, 1, \'x\')')
        got = read(session, commits_at_least(1))
    assert [m.new[0] for m in got.of(Insert)] == ["2"]


def test_publish_options(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute(
        "CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id);"
        "CREATE TABLE parted_low PARTITION OF parted FOR VALUES FROM (0) TO (100)"
    )
    create_publication(pg.dsn(), "ins", tables=["t"], publish=["insert", "delete"])
    create_publication(pg.dsn(), "root", tables=["parted"], via_partition_root=True)
    ins = publication_info(pg.dsn(), "ins")
    root = publication_info(pg.dsn(), "root")
    assert ins is not None and root is not None
    assert ins.publish == {"insert", "delete"} and not ins.via_partition_root
    assert root.via_partition_root
    assert [(t.schema, t.name) for t in root.tables] == [("public", "parted")]
    create_slot(pg.dsn(), "s")
    with ReplicationSession(pg.dsn(), "s", StreamOptions(("ins", "root")), **FAST) as session:
        pg.execute("INSERT INTO t VALUES (1, 'a')")
        pg.execute("UPDATE t SET v = 'b'")
        pg.execute("DELETE FROM t")
        pg.execute("INSERT INTO parted VALUES (5)")
        got = read(session, commits_at_least(3))  # the update's transaction is empty: skipped
    assert got.of(Update) == []
    assert len(got.of(Delete)) == 1
    names = {r.relation_id: r.name for r in got.of(Relation)}
    assert [names[m.relation_id] for m in got.of(Insert)] == ["t", "parted"]  # as its root


def test_create_errors_and_drop(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with pytest.raises(ValueError, match="needs tables, schemas or all_tables"):
        create_publication(pg.dsn(), "p")
    with pytest.raises(ValueError, match="cannot be combined"):
        create_publication(pg.dsn(), "p", tables=["t"], all_tables=True)
    with pytest.raises(ValueError, match="unknown publish operation"):
        create_publication(pg.dsn(), "p", tables=["t"], publish=["upsert"])  # type: ignore[list-item]
    create_publication(pg.dsn(), "p", tables=["t"])
    with pytest.raises(PublicationExistsError, match="'p' already exists"):
        create_publication(pg.dsn(), "p", tables=["t"])
    assert drop_publication(pg.dsn(), "p") is True
    assert publication_info(pg.dsn(), "p") is None
    assert drop_publication(pg.dsn(), "p", missing_ok=True) is False
    with pytest.raises(PublicationNotFoundError, match="'p' does not exist"):
        drop_publication(pg.dsn(), "p")


def test_a_row_filter_is_never_text() -> None:
    """Only a RowFilterSQL (pgcdc.filters' rendering of its parse tree) is accepted: a caller
    cannot hand raw text to CREATE PUBLICATION, even by mistake."""
    with pytest.raises(TypeError, match=r"must be a RowFilterSQL rendered by pgcdc\.filters"):
        PublicationTable("t", where="id = 1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not RowFilter"):
        PublicationTable("t", where=RowFilter.parse("id = 1"))  # type: ignore[arg-type]
    assert PublicationTable("t", where=RowFilter.parse("id = 1").sql()).where == RowFilterSQL(
        '("id" = 1)'
    )


def _catalog(pg: PgDatabase) -> list[tuple[object, ...]]:
    return pg.execute(
        "SELECT 'class', relname::text FROM pg_class "
        "UNION ALL SELECT 'pub', pubname::text FROM pg_publication "
        "UNION ALL SELECT 'rel', prrelid::regclass::text FROM pg_publication_rel ORDER BY 1, 2"
    )


@pytest.mark.parametrize(
    "forged",
    [
        "id = 1); CREATE TABLE public.pwned (x int); --",
        "id = 1); COMMIT; CREATE TABLE public.pwned (x int); --",
        "id = 1); DROP TABLE t; --",
    ],
)
def test_one_statement_even_for_forged_sql(pg: PgDatabase, forged: str) -> None:
    """The second line of defence: were text ever to get into a RowFilterSQL (here forged by
    hand, which pgcdc's own code never does), the extended protocol runs one statement at most:
    the server refuses the whole string and nothing else happens."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    before = _catalog(pg)
    spec = PublicationTable("t", where=RowFilterSQL(forged))
    with pytest.raises(ReplicationError, match="cannot insert multiple commands"):
        create_publication(pg.dsn(), "p", tables=[spec])
    assert _catalog(pg) == before
    assert publication_info(pg.dsn(), "p") is None


def test_publication_names_follow_the_slot_names_rule() -> None:
    assert check_publication_name("pgcdc_shop_2") == "pgcdc_shop_2"
    for bad in ("", "Shop", "a-b", "a b", 'a"b', "a;b", "x" * 64, "ü"):
        with pytest.raises(ValueError, match="invalid publication name"):
            check_publication_name(bad)
