"""``pgcdc demo``: pgcdc on an embedded default, with nothing to configure.

Starts a throwaway local PostgreSQL, creates a small shop schema, runs a steady mixed workload
(orders placed, paid, shipped, cancelled; customers and stock updated), and streams the changes
with pgcdc while it runs, printing them as ``pgcdc tail`` would; at the end it checks that every
committed change was received. The server and its data are removed afterwards.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from rich.console import Console

from pgcdc.cluster import Cluster, available_versions
from pgcdc.decoding import run as run_plugin
from pgcdc.decoding.plugin import DecodingContext, OutputPlugin
from pgcdc.decoding.printers import JsonPrinter, TestDecodingPrinter
from pgcdc.decoding.relations import RelationInfo
from pgcdc.decoding.transaction import Change, LogicalMessage, Transaction, TruncateChange
from pgcdc.lsn import Lsn
from pgcdc.protocol.values.registry import TypeRegistry
from pgcdc.replication import ReplicationSession, StreamOptions, create_slot

NAME = "demo"
END_PREFIX = "pgcdc-demo-end"

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
CREATE PUBLICATION shop_pub FOR TABLES IN SCHEMA shop;
"""

CITIES = ["Lisbon", "Osaka", "Lagos", "Lima", "Oslo", "Perth", "Quito", "Turin"]


def register(sub: Any) -> tuple[str, Callable[[argparse.Namespace], int]]:
    p = sub.add_parser(NAME, help="run pgcdc on a throwaway PostgreSQL with a demo workload")
    p.add_argument("--seconds", type=float, default=8.0, help="how long the workload runs")
    p.add_argument("--rate", type=float, default=20.0, help="transactions per second")
    p.add_argument("--format", choices=["test_decoding", "json"], default="test_decoding")
    p.add_argument("--seed", type=int, default=42, help="random seed of the workload")
    p.add_argument("--pg", type=int, default=None, help="PostgreSQL major version (15 or 18)")
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


def _workload(dsn: str, seconds: float, rate: float, seed: int) -> None:
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
                elif kind < 0.8:
                    conn.execute(
                        "UPDATE shop.orders SET status = CASE status WHEN 'placed' THEN 'paid'"
                        " WHEN 'paid' THEN 'shipped' ELSE status END"
                        " WHERE id = (SELECT id FROM shop.orders ORDER BY random() LIMIT 1)"
                    )
                elif kind < 0.9:
                    conn.execute(
                        "DELETE FROM shop.orders WHERE id = (SELECT id FROM shop.orders"
                        " WHERE status = 'placed' ORDER BY random() LIMIT 1)"
                    )
                else:
                    conn.execute(
                        "UPDATE shop.customers SET city = %s WHERE id = %s",
                        (rng.choice(CITIES), rng.randint(1, 20)),
                    )
            time.sleep(1.0 / rate)
        # the end marker: a transactional logical message in its own transaction
        with conn.transaction():
            conn.execute("SELECT pg_logical_emit_message(true, %s, 'done')", (END_PREFIX,))


class _Counting(OutputPlugin):
    """Forwards to a printer, counts, and stops at the workload's end marker."""

    def __init__(self, inner: OutputPlugin) -> None:
        self.inner = inner
        self.transactions = 0
        self.changes = 0
        self.last_commit = Lsn(0)

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        self.inner.begin(ctx, txn)

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: RelationInfo, change: Change
    ) -> None:
        self.changes += 1
        self.inner.change(ctx, txn, relation, change)

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: tuple[RelationInfo, ...],
        change: TruncateChange,
    ) -> None:
        self.inner.truncate(ctx, txn, relations, change)

    def message(
        self, ctx: DecodingContext, txn: Transaction | None, message: LogicalMessage
    ) -> None:
        if message.prefix == END_PREFIX:
            ctx.request_stop()
        else:
            self.inner.message(ctx, txn, message)

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        self.transactions += 1
        self.last_commit = commit_lsn
        self.inner.commit(ctx, txn, commit_lsn)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    versions = available_versions()
    if not versions:
        console.print("[red]no PostgreSQL server binaries found: run `make setup`[/red]")
        return 1
    major = args.pg or max(versions)
    out = sys.stdout.buffer

    def write(line: bytes) -> None:
        out.write(line + b"\n")

    console.rule(f"pgcdc demo: throwaway PostgreSQL {major}, shop schema, {args.seconds:g} s")
    with Cluster(major) as cluster:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            _seed_data(conn, random.Random(args.seed))
            registry = TypeRegistry()
            registry.load(conn)
        create_slot(dsn, "demo_slot")
        printer: OutputPlugin
        if args.format == "json":
            printer = JsonPrinter(write, registry=registry, flush=out.flush)
        else:
            printer = TestDecodingPrinter(write, major=major, registry=registry, flush=out.flush)
        plugin = _Counting(printer)
        worker = threading.Thread(
            target=_workload, args=(dsn, args.seconds, args.rate, args.seed), daemon=True
        )
        worker.start()
        options = StreamOptions(publication_names=("shop_pub",), streaming="on", messages=True)
        with ReplicationSession(dsn, "demo_slot", options, poll_interval=0.2) as session:
            result = run_plugin(plugin, session, registry=registry)
        worker.join()
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM shop.orders").fetchone()
        out.flush()
        console.rule("done")
        console.print(
            f"received [bold]{plugin.transactions}[/bold] transactions with "
            f"[bold]{plugin.changes}[/bold] changes, confirmed up to {result.confirmed_lsn}; "
            f"the source has {row[0] if row else 0} orders"
        )
    return 0
