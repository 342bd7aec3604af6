"""``[catalog]``: the lake's tables registered in the Spark session's catalog, read by name.

The pipelines run as ``pgcdc run`` in processes of their own (a catalog is a setting of the
JVM's first session), and the tables are read back by name from another process's Spark
session (``catalog_reader.py``) once pgcdc's session stopped: with the embedded (Derby)
metastore under the lake, and with a Hive metastore service (the ``HiveMetaStore`` server of
the Hive 2.3 jars pyspark ships, Spark's own metastore client version) started here. The
registration itself (names, quoting, idempotency, another location) is tested in-process on
the shared session's in-memory catalog, which takes the same calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.config import ConfigError, parse_config
from pgcdc.lake.store.metastore import (
    CatalogError,
    CatalogName,
    Registrar,
    name_problems,
    registrations,
)
from pgcdc.lake.store.tables import LakeLayout, LakeTable
from tests.fix_pg import PgDatabase, newest_server

SRC = Path(__file__).resolve().parents[2] / "src"
READER = Path(__file__).resolve().parent / "catalog_reader.py"

CONFIG = """
[source]
dsn = "{dsn}"
slot = "catalog_slot"
publication = "catalog_pub"

[lake]
path = "lake"

[spark]
master = "local[2]"

[spark.conf]
"spark.log.level" = "ERROR"
{spark_conf}

[catalog]

[[tables]]
name = "shop.*"

[[tables]]
name = "shop.orders"
history = true
changelog = true
"""

SOURCE = """
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id int PRIMARY KEY, note text);
CREATE TABLE shop."Items" (id int PRIMARY KEY, qty int);
INSERT INTO shop.orders SELECT g, 'n' || g FROM generate_series(1, 5) g;
INSERT INTO shop."Items" VALUES (1, 10), (2, 20);
"""


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")


def pgcdc(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pgcdc", *argv],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _reader(conf: dict[str, str], statements: tuple[str, ...], hold: Path | None) -> list[str]:
    argv = [sys.executable, str(READER)]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    if hold is not None:
        argv += ["--hold", str(hold)]
    return [*argv, *statements]


def read(tmp_path: Path, conf: dict[str, str], *statements: str) -> list[list[list[Any]]]:
    """Each statement's rows, read by a Spark session in a process of its own."""
    done = subprocess.run(
        _reader(conf, statements, None),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: list[list[list[Any]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def holding(
    tmp_path: Path, conf: dict[str, str], *statements: str
) -> Iterator[list[list[list[Any]]]]:
    """``read``, with the reader's session (and the catalog it opened) kept open in the
    block."""
    hold = tmp_path / "hold"
    hold.mkdir()
    reader = subprocess.Popen(
        _reader(conf, statements, hold),
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert reader.stdout is not None
        line = reader.stdout.readline()
        assert line, f"the reader failed (exit {reader.wait(60)})"
        deadline = time.monotonic() + 60
        while not (hold / "held").exists():
            assert time.monotonic() < deadline and reader.poll() is None
            time.sleep(0.2)
        yield json.loads(line)
    finally:
        (hold / "release").touch()
        try:
            reader.wait(120)
        except subprocess.TimeoutExpired:
            reader.kill()
            reader.wait()
        if reader.stdout is not None:
            reader.stdout.close()
    assert reader.returncode == 0


def names(rows: list[list[Any]]) -> set[str]:
    """``SHOW TABLES`` rows: the tables' names."""
    return {row[1] for row in rows}


@newest_server
def test_embedded_metastore_registers_reads_evolves_and_drops(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """The default catalog, an embedded metastore under the lake: every table of the copy is
    registered (a history and a changelog under their suffixes, an upper-case source name);
    another process reads them by name, with their history and time travel; a column added on
    the source shows in ``DESCRIBE TABLE``; ``pgcdc drop --catalog`` removes what pgcdc
    registered and nothing else (a table the user registered at a lake table's location stays,
    and so do the files). While a reader holds the embedded metastore, ``run`` stops at once,
    saying so."""
    pg.execute(SOURCE)
    config = tmp_path / "pipeline.toml"
    config.write_text(CONFIG.format(dsn=pg.dsn(), spark_conf=""))
    run = ("run", "--config", str(config), "--until-caught-up")
    pgcdc(tmp_path, *run)
    pg.execute("ALTER TABLE shop.orders ADD COLUMN shipped boolean")
    pg.execute("UPDATE shop.orders SET shipped = true WHERE id = 1")
    pg.execute("INSERT INTO shop.orders VALUES (6, 'n6', false)")
    pgcdc(tmp_path, *run)

    lake = tmp_path / "lake"
    metastore = {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={lake}/_pgcdc/metastore"
        ),
    }
    with holding(
        tmp_path,
        metastore,
        "SHOW TABLES IN shop",
        "SELECT id, note, shipped FROM shop.orders ORDER BY id",
        "DESCRIBE TABLE shop.orders",
        "DESCRIBE TABLE EXTENDED shop.orders_changelog",
        "DESCRIBE HISTORY shop.orders",
        "SELECT count(*) FROM shop.orders VERSION AS OF 1",
        "SELECT count(*) FROM shop.orders_history WHERE __is_current",
        "SELECT id, qty FROM shop.items ORDER BY id",
        f"CREATE TABLE shop.my_orders USING delta LOCATION '{lake}/shop/orders'",
    ) as found:
        # the embedded metastore is open in one process at a time: a run meanwhile is refused
        refused = subprocess.run(
            [sys.executable, "-m", "pgcdc", *run],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert refused.returncode == 1, refused.stderr[-4000:]
    err = " ".join(refused.stderr.split())
    assert f"the embedded metastore {lake}/_pgcdc/metastore is open in another process" in err
    assert "Traceback" not in err
    (tables, rows, described, location, history, copied, current, items, _) = found
    assert names(tables) == {"orders", "orders_history", "orders_changelog", "items"}
    assert rows[0] == ["1", "n1", "True"] and rows[5] == ["6", "n6", "False"] and len(rows) == 6
    assert "shipped" in [r[0] for r in described]  # added after the name was registered
    assert ["Location", f"file:{lake}/shop/orders.changelog", ""] in location
    operations = [r[1] for r in history]  # version, timestamp, ..., operation
    assert len(history) >= 4, operations  # created, copied, a column added, a batch
    assert copied == [["5"]]  # version 1: the initial copy
    assert current == [["6"]]
    assert items == [["1", "10"], ["2", "20"]]

    done = pgcdc(tmp_path, "drop", "--config", str(config), "--yes", "--catalog")
    assert "shop.orders: removed from the catalog" in done.stderr
    assert "database shop: kept (it holds other tables)" in done.stderr
    (tables, mine, databases) = read(
        tmp_path,
        metastore,
        "SHOW TABLES IN shop",
        "SELECT count(*) FROM shop.my_orders",
        "SHOW DATABASES",
    )
    assert names(tables) == {"my_orders"}
    assert mine == [["6"]]
    assert ["shop"] in databases
    assert (lake / "shop" / "orders.history" / "_delta_log").is_dir()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def hive_metastore(folder: Path) -> Iterator[str]:
    """A Hive metastore service (thrift) on a free port, its database in ``folder``: the
    ``HiveMetaStore`` server in pyspark's jars (Hive 2.3, the client version Spark ships)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    port = _free_port()
    folder.mkdir()
    argv = [
        "java",
        "-Xmx512m",
        "-cp",
        f"{jars}/*",
        "-Dhive.async.log.enabled=false",  # Hive's async logger needs a jar Spark lacks
        f"-Djavax.jdo.option.ConnectionURL=jdbc:derby:;databaseName={folder}/db;create=true",
        f"-Dhive.metastore.warehouse.dir={folder}/warehouse",
        "-Ddatanucleus.schema.autoCreateAll=true",
        "-Dhive.metastore.schema.verification=false",
        f"-Dderby.stream.error.file={folder}/derby.log",
        "org.apache.hadoop.hive.metastore.HiveMetaStore",
        "-p",
        str(port),
    ]
    log = (folder / "metastore.log").open("w")
    server = subprocess.Popen(argv, cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert server.poll() is None, (folder / "metastore.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the metastore service did not start"
            time.sleep(0.5)
        yield f"thrift://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@newest_server
def test_metastore_service(pg: PgDatabase, tmp_path: Path) -> None:
    """A remote Hive metastore (``spark.hadoop.hive.metastore.uris``): the tables are
    registered there, and another process reads them by name, with their history."""
    pg.execute(SOURCE)
    with hive_metastore(tmp_path / "hms") as uri:
        config = tmp_path / "pipeline.toml"
        conf = f'"spark.hadoop.hive.metastore.uris" = "{uri}"'
        config.write_text(CONFIG.format(dsn=pg.dsn(), spark_conf=conf))
        pgcdc(tmp_path, "run", "--config", str(config), "--until-caught-up")
        service = {
            "spark.sql.catalogImplementation": "hive",
            "spark.hadoop.hive.metastore.uris": uri,
        }
        (tables, rows, history, location) = read(
            tmp_path,
            service,
            "SHOW TABLES IN shop",
            "SELECT count(*), sum(id) FROM shop.orders_history",
            "DESCRIBE HISTORY shop.items",
            "DESCRIBE TABLE EXTENDED shop.items",
        )
    assert names(tables) == {"orders", "orders_history", "orders_changelog", "items"}
    assert rows == [["5", "15"]]
    assert len(history) == 2  # created, copied
    assert ["Location", f"file:{tmp_path}/lake/shop/Items", ""] in location
    assert not (tmp_path / "lake" / "_pgcdc" / "metastore").exists()  # not the embedded one


# -- registration on the shared session's catalog --------------------------------------------


def _registrar(tmp_path: Path, schema: str) -> tuple[Registrar, list[Any]]:
    layout = LakeLayout(tmp_path / "lake")
    table = LakeTable(schema, "Orders", ("id",), "d", history=True)
    config = parse_config(
        {
            "source": {"dsn": "x", "slot": "s", "publication": "p"},
            "lake": {"path": str(tmp_path / "lake")},
            "catalog": {"history_suffix": "_versions"},
        }
    )
    assert config.catalog is not None
    found = registrations(config.catalog, layout, [table])
    return Registrar(layout, found), found


def _create(spark: Any, path: str) -> None:
    from pyspark.sql import types as T

    from pgcdc.lake.store.delta import create_table

    schema = T.StructType([T.StructField("id", T.LongType())])
    create_table(spark, path, schema, stats_columns=["id"], what="test")


def test_registered_where_created_once_and_never_over_another(spark: Any, tmp_path: Path) -> None:
    """Each table ``create_table`` creates is registered (names quoted: an upper-case schema
    and table); registering again changes nothing; a name the catalog holds at another
    location is an error naming both locations, and is left as it was."""
    registrar, found = _registrar(tmp_path, "Reg_Shop")
    mirror, history = found
    assert (mirror.name, history.name) == (
        CatalogName("Reg_Shop", "Orders"),
        CatalogName("Reg_Shop", "Orders_versions"),
    )
    registrar.start(spark)
    try:
        _create(spark, mirror.location)
    finally:
        registrar.close()
    _create(spark, history.location)  # after close: not registered
    where = registrar.location(spark, mirror.name)
    assert where is not None and where.endswith(f"{tmp_path}/lake/Reg_Shop/Orders")
    assert registrar.location(spark, history.name) is None
    assert not registrar.register(spark, mirror)  # there already: nothing to do

    elsewhere = tmp_path / "elsewhere"
    _create(spark, str(elsewhere))
    spark.catalog.createTable(history.name.sql, path=str(elsewhere), source="delta")
    again = Registrar(registrar.layout, found)
    with pytest.raises(CatalogError) as caught:
        again.start(spark)  # the history exists in the lake: registered at start
    again.close()
    message = str(caught.value)
    assert "as Reg_Shop.Orders_versions: the catalog has Reg_Shop.Orders_versions at" in message
    assert str(elsewhere) in message and history.location in message
    assert str(registrar.location(spark, history.name)).endswith(str(elsewhere))
    # what drop --catalog removes: the recorded names still at their lake table's location
    assert registrar.unregister(spark) == [
        "Reg_Shop.Orders: removed from the catalog",
        "database Reg_Shop: kept (it holds other tables)",  # the other table is not pgcdc's
    ]
    assert registrar.location(spark, mirror.name) is None
    assert str(registrar.location(spark, history.name)).endswith(str(elsewhere))


def test_names_the_catalog_cannot_hold_are_refused_before_anything_is_created(
    tmp_path: Path,
) -> None:
    layout = LakeLayout(tmp_path / "lake")
    config = parse_config(
        {
            "source": {"dsn": "x", "slot": "s", "publication": "p"},
            "lake": {"path": str(tmp_path / "lake")},
            "catalog": {"database": "lake", "names": {'shop."or ders"': "shop.or_ders"}},
        }
    )
    assert config.catalog is not None
    tables = [
        LakeTable("shop", "or ders", ("id",), "d"),
        LakeTable("shop", "ördérs", ("id",), "d"),
        LakeTable("a", "t", ("id",), "d"),
        LakeTable("b", "T", ("id",), "d"),
    ]
    found = registrations(config.catalog, layout, tables)
    assert [str(r.name) for r in found] == ["shop.or_ders", "lake.ördérs", "lake.t", "lake.T"]
    problems = name_problems(found, session_catalog=True)
    assert len(problems) == 2, problems
    assert "shop.ördérs's mirror would be registered as `lake`.`ördérs`" in problems[0][1]
    assert "[catalog.names]" in problems[0][1]
    assert "a.t's mirror and b.T's mirror would both be registered as lake.T" in problems[1][1]
    assert len(name_problems(found, session_catalog=False)) == 1  # a plugin's own rules


def test_catalog_settings_are_checked() -> None:
    base = {"source": {"dsn": "x", "slot": "s", "publication": "p"}}
    with pytest.raises(ConfigError) as caught:
        parse_config({**base, "lake": {"path": "s3://bucket/lake"}, "catalog": {}})
    assert "an s3:// lake cannot hold the embedded metastore" in str(caught.value)
    remote = {"conf": {"spark.hadoop.hive.metastore.uris": "thrift://hms:9083"}}
    parse_config({**base, "lake": {"path": "s3://bucket/lake"}, "catalog": {}, "spark": remote})
    with pytest.raises(ConfigError) as caught:
        parse_config({**base, "lake": {"path": "lake"}, "catalog": {"table": "{name}"}})
    assert "catalog.table: '{name}': only {schema} and {table} can be filled in" in str(
        caught.value
    )
    with pytest.raises(ConfigError) as caught:
        parse_config({**base, "lake": {"path": "lake"}, "catalog": {"names": {"a.b": "c"}}})
    assert 'write the name as "database.table"' in str(caught.value)
