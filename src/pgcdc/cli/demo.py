"""``pgcdc demo``: the whole pipeline on an embedded default, with nothing to configure.

Starts a throwaway local PostgreSQL, creates a small shop schema with some data, and runs
``pgcdc run``'s pipeline on a local Spark into a local lake folder while a steady mixed workload
runs (orders placed, paid, shipped, cancelled; customers and stock updated), with live progress.
When the workload ends, the pipeline catches up and the demo shows that every mirror equals its
source table (row counts and a checksum per table). ``shop.orders`` also gets a history (SCD
type 2) table and ``shop.order_items`` a changelog, to look at afterwards with Spark, DuckDB,
Polars or ``deltalake``. The server is removed at the end; the lake folder stays. A local lake's
tables are registered in an embedded metastore under the lake (``[catalog]``), and the demo ends
by printing a ``spark-sql`` command line that reads them by name.

``--lake s3://bucket/prefix`` (with ``--s3-endpoint`` and ``--s3-path-style`` for a store other
than AWS S3, and the keys in the environment) writes the demo's lake into an S3 bucket instead.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from pgcdc.cli.throwaway_server import Cluster, available_versions
from pgcdc.lsn import Lsn

if TYPE_CHECKING:  # the lake (Spark, delta-rs, pyarrow) is imported when the demo runs
    from pgcdc.lake.config import PipelineConfig
    from pgcdc.lake.run.pipeline import Pipeline
    from pgcdc.lake.run.verify import TableCheck

NAME = "demo"

SCHEMA = """
CREATE SCHEMA shop;
CREATE TABLE shop.customers (
    id bigserial PRIMARY KEY, name text NOT NULL, email text UNIQUE, city text,
    created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE shop.products (
    id serial PRIMARY KEY, sku text UNIQUE NOT NULL, title text NOT NULL,
    price numeric(10,2) NOT NULL, stock int NOT NULL, tags text[], attrs jsonb);
CREATE TABLE shop.orders (
    id bigserial PRIMARY KEY, customer_id bigint REFERENCES shop.customers,
    status text NOT NULL, total numeric(12,2) NOT NULL DEFAULT 0,
    placed_at timestamptz NOT NULL DEFAULT now(), note text);
CREATE TABLE shop.order_items (
    order_id bigint REFERENCES shop.orders ON DELETE CASCADE, line int,
    product_id int REFERENCES shop.products, qty int NOT NULL, price numeric(10,2) NOT NULL,
    PRIMARY KEY (order_id, line));
"""

CITIES = ["Lisbon", "Osaka", "Lagos", "Lima", "Oslo", "Perth", "Quito", "Turin"]


def register(sub: Any) -> tuple[str, Callable[[argparse.Namespace], int]]:
    p = sub.add_parser(
        NAME,
        help="run the pipeline on a throwaway PostgreSQL with a demo workload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=20.0, help="how long the workload runs")
    p.add_argument("--rate", type=float, default=20.0, help="transactions per second")
    p.add_argument("--seed", type=int, default=42, help="random seed of the workload")
    p.add_argument("--pg", type=int, default=None, help="PostgreSQL major version (15 or 18)")
    p.add_argument(
        "--lake",
        default="pgcdc-demo-lake",
        help=(
            "lake folder (default ./pgcdc-demo-lake; a previous demo lake there is replaced), "
            "or s3://bucket/prefix"
        ),
    )
    p.add_argument("--s3-endpoint", default=None, help="an s3:// lake's store (default AWS S3)")
    p.add_argument("--s3-region", default="us-east-1", help="an s3:// lake's bucket region")
    p.add_argument(
        "--s3-path-style", action="store_true", help="bucket in the URL's path (most stores)"
    )
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between micro-batches")
    return NAME, run


def _seed_data(conn: psycopg.Connection[Any], rng: random.Random) -> None:
    with conn.transaction():
        for i in range(20):
            conn.execute(
                "INSERT INTO shop.customers (name, email, city) VALUES (%s, %s, %s)",
                (f"Customer {i}", f"c{i}@example.com", rng.choice(CITIES)),
            )
        for i in range(15):
            conn.execute(
                "INSERT INTO shop.products (sku, title, price, stock, tags, attrs)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    f"SKU-{i:04d}",
                    f"Product {i}",
                    round(rng.uniform(1, 200), 2),
                    rng.randint(10, 500),
                    ["demo", rng.choice(["red", "blue", "green"])],
                    Jsonb({"weight_g": rng.randint(50, 5000)}),
                ),
            )


@dataclass
class _Counts:
    transactions: int = 0
    placed: int = 0
    advanced: int = 0
    cancelled: int = 0
    moved: int = 0


def _workload(dsn: str, seconds: float, rate: float, seed: int, counts: _Counts) -> None:
    """Orders placed (with items, stock), paid/shipped, cancelled; customers moving."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            kind = rng.random()
            with conn.transaction():
                if kind < 0.5:
                    row = conn.execute(
                        "INSERT INTO shop.orders (customer_id, status) VALUES (%s, 'placed')"
                        " RETURNING id",
                        (rng.randint(1, 20),),
                    ).fetchone()
                    order_id = row[0] if row else None
                    for line in range(1, rng.randint(2, 4)):
                        product = rng.randint(1, 15)
                        conn.execute(
                            "INSERT INTO shop.order_items SELECT %s, %s, id, %s, price"
                            " FROM shop.products WHERE id = %s",
                            (order_id, line, rng.randint(1, 3), product),
                        )
                        conn.execute(
                            "UPDATE shop.products SET stock = stock - 1 WHERE id = %s", (product,)
                        )
                    conn.execute(
                        "UPDATE shop.orders SET total = (SELECT sum(qty * price)"
                        " FROM shop.order_items WHERE order_id = %s) WHERE id = %s",
                        (order_id, order_id),
                    )
                    counts.placed += 1
                elif kind < 0.8:
                    conn.execute(
                        "UPDATE shop.orders SET status = CASE status WHEN 'placed' THEN 'paid'"
                        " WHEN 'paid' THEN 'shipped' ELSE status END"
                        " WHERE id = (SELECT id FROM shop.orders ORDER BY random() LIMIT 1)"
                    )
                    counts.advanced += 1
                elif kind < 0.9:
                    conn.execute(
                        "DELETE FROM shop.orders WHERE id = (SELECT id FROM shop.orders"
                        " WHERE status = 'placed' ORDER BY random() LIMIT 1)"
                    )
                    counts.cancelled += 1
                else:
                    conn.execute(
                        "UPDATE shop.customers SET city = %s WHERE id = %s",
                        (rng.choice(CITIES), rng.randint(1, 20)),
                    )
                    counts.moved += 1
            counts.transactions += 1
            time.sleep(1.0 / rate)


def _lake_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``[lake]`` of the demo's pipeline: ``--lake`` (a local one made absolute)."""
    from pgcdc.lake.store.storage import is_s3_uri

    if not is_s3_uri(args.lake):
        return {"path": str(Path(args.lake).resolve())}
    s3: dict[str, Any] = {"region": args.s3_region, "path_style": args.s3_path_style}
    if args.s3_endpoint:
        s3["endpoint"] = args.s3_endpoint
    return {"path": args.lake, "s3": s3}


def _config(dsn: str, lake: dict[str, Any], master: str, interval: float) -> PipelineConfig:
    from pgcdc.lake.config import parse_config
    from pgcdc.lake.store.storage import is_s3_uri

    settings: dict[str, Any] = {
        "source": {"dsn": dsn, "slot": "pgcdc_demo", "publication": "pgcdc_demo"},
        "lake": lake,
        "spark": {
            "master": master,
            "app_name": "pgcdc-demo",
            "conf": {"spark.log.level": "ERROR"},
        },
        "stream": {"trigger_interval": interval},
        "tables": [
            {"name": "shop.*"},
            {"name": "shop.orders", "history": True},
            {"name": "shop.order_items", "changelog": True},
        ],
    }
    if not is_s3_uri(str(lake["path"])):  # the embedded metastore lives in a local lake
        settings["catalog"] = {}
    return parse_config(settings)


#: what the demo's closing line asks the catalog
QUERY = "SELECT status, count(*) AS orders, sum(total) AS total FROM shop.orders GROUP BY status"


def query_command(config: PipelineConfig) -> str:
    """One shell line that reads the demo's tables by name with Spark SQL (``spark-sql`` of
    the installed pyspark, Delta's connector, the lake's embedded metastore)."""
    import shlex

    import pyspark

    from pgcdc.lake.store.delta import DELTA_PACKAGE, connector_jars, delta_settings
    from pgcdc.lake.store.metastore import CONNECTION_URL, IMPLEMENTATION, catalog_conf
    from pgcdc.lake.store.tables import LakeLayout

    home = Path(pyspark.__file__).resolve().parent
    argv = [f"SPARK_HOME={shlex.quote(str(home))}", str(home / "bin" / "spark-sql")]
    argv += ["--master", "local[1]"]
    jars = connector_jars()
    if jars and len({jar.parent for jar in jars}) == 1:
        argv += ["--jars", str(jars[0].parent / "*.jar")]  # spark.jars takes globs
    elif jars:
        argv += ["--jars", ",".join(str(jar) for jar in jars)]
    else:
        argv += ["--packages", DELTA_PACKAGE]
    conf: dict[str, str] = {}
    catalog_conf(conf, LakeLayout(config.lake.location()))
    delta = delta_settings({})
    wanted = {
        key: delta[key] for key in ("spark.sql.extensions", "spark.sql.catalog.spark_catalog")
    }
    wanted[IMPLEMENTATION] = conf[IMPLEMENTATION]
    # without create=true: a reader pointed at the wrong place fails rather than making one
    wanted[CONNECTION_URL] = conf[CONNECTION_URL].removesuffix(";create=true")
    wanted["spark.log.level"] = "ERROR"
    for key, value in wanted.items():
        argv += ["--conf", f"{key}={value}"]
    argv += ["-e", QUERY]
    return " ".join(shlex.quote(arg) if i else arg for i, arg in enumerate(argv))


def _prepare_lake(config: PipelineConfig) -> str:
    """Remove a previous demo lake at the configured place (refusing anything else there); the
    lake's place, as the demo names it."""
    from pgcdc.lake.store.tables import LakeLayout

    location = config.lake.location()
    if location.is_s3 and not location.prefix:  # buckets are shared: never empty a whole one
        raise SystemExit(f"{location.root}: give the demo's lake a prefix, s3://bucket/prefix")
    layout = LakeLayout(location)
    root = layout.root
    if root.names():
        if layout.state_file.tag() is None:
            raise SystemExit(
                f"{root} holds files and is not a pgcdc demo lake: choose another --lake"
            )
        root.remove_tree()
    return str(root)


def _status(pipeline: Pipeline, counts: _Counts, started: float, phase: str) -> Table:
    table = Table(title=f"pgcdc demo: {phase}", title_justify="left", expand=False)
    table.add_column("source workload")
    table.add_column("lake", justify="right")
    progress = pipeline.progress
    last = progress.last if progress else None
    lsn = "-" if last is None or last.max_lsn is None else str(Lsn(last.max_lsn))
    table.add_row(
        f"{counts.transactions} transactions: {counts.placed} orders placed, "
        f"{counts.advanced} advanced, {counts.cancelled} cancelled, {counts.moved} moves",
        f"{progress.batches if progress else 0} batches, "
        f"{progress.changes if progress else 0} changes, at {lsn}",
    )
    if progress is not None:
        for name, n in sorted(progress.per_table.items()):
            table.add_row(f"  {name}", f"{n} changes")
    table.caption = f"{time.monotonic() - started:.0f} s"
    return table


def _results(checks: list[TableCheck]) -> Table:
    table = Table(title="mirror = source?", title_justify="left")
    for name in ("table", "source rows", "lake rows", "source checksum", "lake checksum", ""):
        table.add_column(name, justify="right" if "rows" in name else "left")
    for c in checks:
        table.add_row(
            c.table_id,
            str(c.source_rows),
            str(c.lake_rows),
            c.source_checksum[:12],
            c.lake_checksum[:12],
            "[green]equal[/green]" if c.equal else "[red]DIFFERENT[/red]",
        )
    return table


def run(args: argparse.Namespace) -> int:
    from pgcdc.lake.run.pipeline import Pipeline
    from pgcdc.lake.run.verify import compare_tables
    from pgcdc.lake.store.tables import IS_CURRENT
    from pgcdc.lake.store.target import DeltaTarget

    console = Console(stderr=True)
    versions = available_versions()
    if not versions:
        console.print("[red]no PostgreSQL server binaries found: run `make setup`[/red]")
        return 1
    major = args.pg or max(versions)
    lake_settings = _lake_settings(args)
    lake = _prepare_lake(_config("dbname=demo", lake_settings, args.master, args.interval))
    if args.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to loopback" noise
    console.rule(
        f"pgcdc demo: throwaway PostgreSQL {major}, shop schema, {args.seconds:g} s workload"
    )
    with Cluster(major) as cluster:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            _seed_data(conn, random.Random(args.seed))
        config = _config(dsn, lake_settings, args.master, args.interval)
        pipeline = Pipeline(config)
        console.print(f"starting Spark ({args.master}) and copying the shop tables into {lake}")
        counts = _Counts()
        started = time.monotonic()
        failure: list[BaseException] = []
        ready = threading.Event()

        def stream() -> None:
            try:
                pipeline.run(on_started=lambda _p: ready.set())
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)
            finally:
                ready.set()

        streamer = threading.Thread(target=stream, name="pgcdc-pipeline", daemon=True)
        streamer.start()
        ready.wait()
        if failure:
            raise failure[0]
        worker = threading.Thread(
            target=_workload,
            args=(dsn, args.seconds, args.rate, args.seed, counts),
            name="pgcdc-workload",
            daemon=True,
        )
        worker.start()
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            while worker.is_alive() and not failure:
                live.update(_status(pipeline, counts, started, "workload running"))
                time.sleep(0.5)
            live.update(_status(pipeline, counts, started, "workload done, catching up"))
            pipeline.stop()
            streamer.join()
            if failure:
                raise failure[0]
            catch_up = Pipeline(config, spark=pipeline.spark())
            catch_up.run(until_caught_up=True)
            live.update(_status(pipeline, counts, started, "caught up"))
        tables = catch_up.plan.tables if catch_up.plan is not None else ()
        checks = compare_tables(dsn, catch_up.layout, tables)
        console.print()
        console.print(Group(_results(checks)))
        orders = next((t for t in tables if t.table_id == "shop.orders"), None)
        if orders is not None and orders.history:
            history = DeltaTarget(orders.path(catch_up.layout, "history")).read(
                columns=[IS_CURRENT]
            )
            current = sum(1 for v in history.column(IS_CURRENT).to_pylist() if v)
            console.print(
                f"shop.orders history: {history.num_rows} versions, {current} current "
                f"({orders.path(catch_up.layout, 'history')})"
            )
        console.print(f"lake: {lake} (Delta tables; read them with Spark, DuckDB, Polars)")
        pipeline.spark().stop()
    if config.catalog is not None:
        names = ", ".join(f"shop.{t.name}" for t in tables)
        console.print(
            f"registered in the lake's embedded metastore as {names} (and shop.orders_history, "
            "shop.order_items_changelog); read them by name with Spark SQL once the demo ended:",
            highlight=False,
            markup=False,
        )
        # one line, never wrapped, so that it can be pasted as it is
        console.print(query_command(config), soft_wrap=True, highlight=False, markup=False)
    ok = all(c.equal for c in checks)
    console.rule("[green]mirror equals source[/green]" if ok else "[red]mirror differs[/red]")
    return 0 if ok else 1
