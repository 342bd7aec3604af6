"""A seeded random workload over many column types, for the pipeline's end-to-end tests.

Tables: ``everything`` (one column of most built-in types, an enum, an unknown type and a
TOASTed ``big`` column stored out of line), ``kv`` (composite key, key changes, truncates,
a column widened later) and ``full_t`` (REPLICA IDENTITY FULL, no key, few distinct values:
many identical rows).
Transactions mix inserts, updates (some touching only small columns, so ``big`` arrives as
unchanged TOAST), key changes, deletes, truncates (also between other changes of one
transaction), subtransactions rolled back, prepared transactions (committed and rolled back)
and one large transaction that PostgreSQL streams.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Json, Jsonb

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE everything (
    id int PRIMARY KEY,
    i2 smallint, i8 bigint, n numeric(12,3), nu numeric, f4 real, f8 double precision,
    b bool, t text, vc varchar(20), ch char(4), by bytea, d date, tm time, ttz timetz,
    ts timestamp, tstz timestamptz, iv interval, u uuid, j json, jb jsonb, ip inet, net cidr,
    mac macaddr, bits bit(8), vb varbit, m money, ia int[], ta text[], e mood, pt point,
    big text);
ALTER TABLE everything ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE kv (k1 int, k2 text, v int, big text, PRIMARY KEY (k1, k2));
ALTER TABLE kv ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE full_t (a int, b text, c numeric(6,2));
ALTER TABLE full_t REPLICA IDENTITY FULL;
"""

TABLES = ("public.everything", "public.kv", "public.full_t")


def incompressible(rng: random.Random, n: int) -> str:
    seed = rng.getrandbits(64)
    out: list[str] = []
    i = 0
    while sum(map(len, out)) < n:
        out.append(hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
        i += 1
    return "".join(out)[:n]


class Workload:
    def __init__(self, dsn: str, seed: int) -> None:
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.next_id = 1
        self.next_k = 1
        self.prepared = 0
        self.extra_column = False  # everything.extra, added by schema_changes()
        self.dropped_vc = False

    # -- values ----------------------------------------------------------------------------

    def maybe(self, value: Any, null: float = 0.15) -> Any:
        return None if self.rng.random() < null else value

    def row(self, id_: int) -> dict[str, Any]:
        r = self.rng
        ts = datetime(2000, 1, 1) + timedelta(
            seconds=r.randint(0, 10**9), microseconds=r.randint(0, 999999)
        )
        special_ts = r.random() < 0.05
        values: dict[str, Any] = {
            "id": id_,
            "i2": self.maybe(r.randint(-32768, 32767)),
            "i8": self.maybe(r.randint(-(2**63), 2**63 - 1)),
            "n": self.maybe(Decimal(r.randint(-(10**12) + 1, 10**12 - 1)) / 1000),
            "nu": self.maybe(
                r.choice([Decimal("NaN"), Decimal("1e-30"), Decimal(r.randint(-(10**40), 10**40))])
            ),
            "f4": self.maybe(r.choice([float("nan"), float("inf"), r.uniform(-1e6, 1e6), -0.0])),
            "f8": self.maybe(r.choice([float("-inf"), r.uniform(-1e300, 1e300), 1 / 3])),
            "b": self.maybe(r.random() < 0.5),
            "t": self.maybe(
                r.choice(["", "plain", "ünï©ødé ✓", "quote ' and \\ backslash", "x" * 300])
            ),
            "vc": self.maybe(r.choice(["a", "varchar", "twenty chars exactly"[:20]])),
            "ch": self.maybe(r.choice(["ab", "abcd"])),
            "by": self.maybe(bytes(r.getrandbits(8) for _ in range(r.randint(0, 40)))),
            "d": self.maybe(
                "infinity" if special_ts else date(1900, 1, 1) + timedelta(days=r.randint(0, 73000))
            ),
            "tm": self.maybe(
                time(r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), r.randint(0, 999999))
            ),
            "ttz": self.maybe(
                f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:07.5+0{r.randint(0, 9)}"
            ),
            "ts": self.maybe("-infinity" if special_ts else ts),
            "tstz": self.maybe("infinity" if special_ts else ts.replace(tzinfo=UTC)),
            "iv": self.maybe(
                r.choice(["1 year 2 mons 3 days 04:05:06.789", "-7 days", "00:00:00.000001", "P1M"])
            ),
            "u": self.maybe(uuid.UUID(int=r.getrandbits(128))),
            "j": self.maybe(Json({"a": [1, 2.5, None], "s": "x y"})),
            "jb": self.maybe(Jsonb({"k": r.randint(0, 9), "nested": {"z": [True, False]}})),
            "ip": self.maybe(r.choice(["10.0.0.1", "10.1.2.3/16", "::1", "2001:db8::/32"])),
            "net": self.maybe(r.choice(["10.0.0.0/8", "192.168.1.0/24", "2001:db8::/32"])),
            "mac": self.maybe(f"08:00:2b:01:02:{r.randint(0, 255):02x}"),
            "bits": self.maybe(format(r.getrandbits(8), "08b")),
            "vb": self.maybe(format(r.getrandbits(12), "b")),
            "m": self.maybe(Decimal(r.randint(-(10**8), 10**8)) / 100),
            "ia": self.maybe([r.randint(-5, 5), None, r.randint(0, 9)] if r.random() < 0.8 else []),
            "ta": self.maybe(["a", None, "b c", "{}", 'q"uote']),
            "e": self.maybe(r.choice(["sad", "ok", "happy"])),
            "pt": self.maybe(f"({r.randint(-9, 9)},{r.random():.3f})"),
            "big": self.maybe(incompressible(r, r.randint(3000, 9000)), null=0.3),
        }
        if self.dropped_vc:
            del values["vc"]
        if self.extra_column:
            values["extra"] = self.maybe(r.randint(0, 10**12))
        return values

    # -- statements ------------------------------------------------------------------------

    def insert_everything(self, conn: psycopg.Connection[Any], n: int = 1) -> None:
        for _ in range(n):
            values = self.row(self.next_id)
            self.next_id += 1
            cols = list(values)
            conn.execute(
                f"INSERT INTO everything ({', '.join(cols)}) VALUES "  # noqa: S608 - test code
                f"({', '.join('%s' for _ in cols)})",
                list(values.values()),
            )

    def update_everything(self, conn: psycopg.Connection[Any]) -> None:
        r = self.rng
        choice = r.random()
        if choice < 0.5:  # small columns only: big stays unchanged TOAST
            conn.execute(
                "UPDATE everything SET i2 = %s, t = %s WHERE id IN "
                "(SELECT id FROM everything ORDER BY random() LIMIT 3)",
                (r.randint(0, 99), f"upd {r.randint(0, 999)}"),
            )
        elif choice < 0.7:  # the key changes, big unchanged
            conn.execute(
                "UPDATE everything SET id = id + 1000000 WHERE id = "
                "(SELECT id FROM everything WHERE id < 1000000 ORDER BY random() LIMIT 1)"
            )
        else:
            values = self.row(0)
            del values["id"]
            sets = ", ".join(f"{c} = %s" for c in values)
            conn.execute(
                f"UPDATE everything SET {sets} WHERE id = "  # noqa: S608 - test code
                "(SELECT id FROM everything ORDER BY random() LIMIT 1)",
                list(values.values()),
            )

    def kv_ops(self, conn: psycopg.Connection[Any]) -> None:
        r = self.rng
        choice = r.random()
        if choice < 0.45:
            for _ in range(r.randint(1, 5)):
                conn.execute(
                    "INSERT INTO kv VALUES (%s, %s, %s, %s)",
                    (
                        self.next_k,
                        r.choice(["x", "y", "ü"]),
                        r.randint(0, 1000),
                        self.maybe(incompressible(r, 4000), null=0.5),
                    ),
                )
                self.next_k += 1
        elif choice < 0.65:
            conn.execute(
                "UPDATE kv SET v = v + 1 WHERE (k1, k2) IN "
                "(SELECT k1, k2 FROM kv ORDER BY random() LIMIT 4)"
            )
        elif choice < 0.8:
            conn.execute(
                "UPDATE kv SET k2 = k2 || '+' WHERE (k1, k2) IN "
                "(SELECT k1, k2 FROM kv ORDER BY random() LIMIT 2)"
            )
        elif choice < 0.95:
            conn.execute(
                "DELETE FROM kv WHERE (k1, k2) IN (SELECT k1, k2 FROM kv ORDER BY random() LIMIT 2)"
            )
        else:  # a TRUNCATE between other changes of the same transaction
            conn.execute("INSERT INTO kv VALUES (%s, 'before', 1, NULL)", (self.next_k,))
            self.next_k += 1
            conn.execute("TRUNCATE kv")
            conn.execute("INSERT INTO kv VALUES (%s, 'after', 2, NULL)", (self.next_k,))
            self.next_k += 1

    def full_ops(self, conn: psycopg.Connection[Any]) -> None:
        r = self.rng
        choice = r.random()
        if choice < 0.5:
            conn.execute(
                "INSERT INTO full_t VALUES (%s, %s, %s)",
                # few distinct values: the table holds many identical rows
                (
                    r.randint(0, 3),
                    self.maybe("row"),
                    self.maybe(Decimal(r.randint(0, 2)) / 100),
                ),
            )
        elif choice < 0.8:
            conn.execute(
                "UPDATE full_t SET b = %s WHERE ctid = "
                "(SELECT ctid FROM full_t ORDER BY random() LIMIT 1)",
                (f"b{r.randint(0, 2)}",),
            )
        else:
            conn.execute(
                "DELETE FROM full_t WHERE ctid = "
                "(SELECT ctid FROM full_t ORDER BY random() LIMIT 1)"
            )

    def transaction(self, conn: psycopg.Connection[Any]) -> None:
        r = self.rng
        kind = r.random()
        if kind < 0.08:  # prepared, then committed or rolled back
            self.prepared += 1
            gid = f"pgcdc-test-{self.prepared}-{r.getrandbits(32)}"
            conn.execute("BEGIN")
            self.insert_everything(conn, 2)
            self.kv_ops(conn)
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
            verb = "COMMIT" if r.random() < 0.7 else "ROLLBACK"
            conn.execute(sql.SQL(verb + " PREPARED {}").format(sql.Literal(gid)))
            return
        with conn.transaction():
            if kind < 0.15:  # a subtransaction rolled back
                self.insert_everything(conn)
                try:
                    with conn.transaction():
                        self.insert_everything(conn)
                        self.kv_ops(conn)
                        raise _Rollback
                except _Rollback:
                    pass
            for _ in range(r.randint(1, 4)):
                step = r.random()
                if step < 0.3:
                    self.insert_everything(conn)
                elif step < 0.55:
                    self.update_everything(conn)
                elif step < 0.65:
                    conn.execute(
                        "DELETE FROM everything WHERE id = "
                        "(SELECT id FROM everything ORDER BY random() LIMIT 1)"
                    )
                elif step < 0.88:
                    self.kv_ops(conn)
                else:
                    self.full_ops(conn)

    def big_transaction(self, conn: psycopg.Connection[Any], rows: int = 400) -> None:
        """More than logical_decoding_work_mem: PostgreSQL streams it (when asked to)."""
        with conn.transaction():
            self.insert_everything(conn, rows // 4)
            conn.execute("UPDATE everything SET i8 = coalesce(i8, 0) / 2 + 1")

    def run(self, transactions: int) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for _ in range(transactions):
                self.transaction(conn)

    def schema_changes(self) -> None:
        """Added (with a constant default), widened and dropped columns, with changes after."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE everything ADD COLUMN extra bigint DEFAULT 7")
            self.extra_column = True
            self.run_on(conn, 5)
            conn.execute("ALTER TABLE kv ALTER COLUMN v TYPE bigint")
            conn.execute("UPDATE kv SET v = v + 5000000000 WHERE k1 % 3 = 0")
            conn.execute("ALTER TABLE everything DROP COLUMN vc")
            self.dropped_vc = True
            self.run_on(conn, 5)

    def run_on(self, conn: psycopg.Connection[Any], transactions: int) -> None:
        for _ in range(transactions):
            self.transaction(conn)


class _Rollback(Exception):
    pass
