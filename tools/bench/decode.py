"""`make bench-decode`: how fast pgoutput changes decode into typed Arrow batches.

The stream is real: a throwaway PostgreSQL server runs 1.3 million changes (inserts, updates,
key-changing updates, deletes; big and small transactions) on a ten-column table (bigint key,
integer, bigint, numeric(12,2), timestamptz, jsonb, text, boolean, float8, date), and two logical
replication slots record them through pgoutput, one in text format, one with ``binary 'true'``.
``pg_logical_slot_get_binary_changes`` reads them in chunks; the messages are stored once under
``.cache/bench/`` (length-prefixed, keyed by ``STREAM_VERSION``) and reused by later runs.

Then, in one run, over the same messages (best of N, whole stream each time):

* pypgoutput: its per-message decoders (``pypgoutput.decoders.Insert(payload)`` and so on, one
  call per message chosen by type byte), the anchor; it yields the text of each value;
* pgcdc ``Decoder``: the row decoder, one dataclass per message with text values (reference);
* pgcdc ``ColumnarDecoder``: typed Arrow record batches per relation, fed chunks of 100,000
  messages as a streaming consumer would, in text and in binary format.

Changes per second count Insert, Update and Delete messages over the time to decode every
message (Begin, Commit and Relation too). The figures and ratios are printed and written to
``bench-results/decode.json``. A benchmark, not a test: it reports, it never fails on speed.
"""

from __future__ import annotations

import argparse
import gc
import json
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa

from pgcdc.cli.throwaway_server import Cluster, available_versions
from pgcdc.protocol import Decoder
from pgcdc.protocol.arrow.columnar import ColumnarDecoder
from tools.bench.harness import machine_info

ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = ROOT / ".cache" / "bench"
RESULT_PATH = ROOT / "bench-results" / "decode.json"

#: Bump when the workload or the file format changes: cached streams of other versions are
#: ignored (and can be deleted).
STREAM_VERSION = "decode-stream-v1"
_MAGIC = b"PGCDC-STREAM\n"
_LENGTH = struct.Struct("!I")

LABELS = {
    "pypgoutput_decoders": "pypgoutput decoders (text values)",
    "pgcdc_row_decoder": "pgcdc Decoder, row by row (text values)",
    "pgcdc_columnar_text": "pgcdc ColumnarDecoder -> typed Arrow (text)",
    "pgcdc_columnar_binary": "pgcdc ColumnarDecoder -> typed Arrow (binary)",
}
COLUMNAR = ("pgcdc_columnar_text", "pgcdc_columnar_binary")

GOAL_RATIO = 10.0
GOAL_RATE = 1_000_000.0

TABLE_SQL = """
CREATE TABLE bench (
    id bigint PRIMARY KEY,
    qty integer NOT NULL,
    amount bigint,
    price numeric(12,2),
    created timestamptz,
    attrs jsonb,
    note text,
    active boolean,
    score float8,
    day date
)
"""

INSERT_SQL = """
INSERT INTO bench
SELECT g, g %% 1000, g * 7919, ((g %% 100000) / 100.0 + 0.01)::numeric(12,2),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1.000123 second',
       jsonb_build_object('k', g, 'tag', 't' || (g %% 17), 'ok', g %% 2 = 0),
       CASE WHEN g %% 13 = 0 THEN NULL ELSE 'note ' || md5(g::text) END,
       g %% 3 = 0, g::float8 / 7, date '2024-01-01' + (g %% 3650)::int
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""

UPDATE_SQL = """
UPDATE bench SET qty = qty + 1, price = price + 1, created = created + interval '1 hour',
                 attrs = attrs || '{"v": 2}', note = coalesce(note, 'was null')
WHERE id BETWEEN %(first)s AND %(last)s AND id %% 4 = 0
"""

DELETE_SQL = "DELETE FROM bench WHERE id BETWEEN %(first)s AND %(last)s AND id %% 10 = 1"

KEY_UPDATE_SQL = """
UPDATE bench SET id = id + 100000000 WHERE id BETWEEN %(first)s AND %(last)s AND id %% 100 = 2
"""

SMALL_SQL = "UPDATE bench SET score = score + 1 WHERE id BETWEEN %(first)s AND %(last)s"


@dataclass(frozen=True, slots=True)
class Workload:
    """The changes the recorded stream holds."""

    rows: int = 1_000_000  # inserted in transactions of `batch` rows
    batch: int = 10_000
    small_transactions: int = 2_000  # 10-row updates, one transaction each
    read_chunk: int = 100_000  # upto_nchanges per pg_logical_slot_get_binary_changes call


@dataclass(frozen=True, slots=True)
class Stream:
    """A recorded stream: its messages and where it came from."""

    messages: list[bytes]
    meta: dict[str, Any]


# -- recording ---------------------------------------------------------------------------------


def _stream_path(fmt: str) -> Path:
    return CACHE_DIR / f"{STREAM_VERSION}-{fmt}.bin"


def write_stream(path: Path, messages: Sequence[bytes], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    header = json.dumps(meta).encode()
    with open(tmp, "wb") as f:
        f.write(_MAGIC + _LENGTH.pack(len(header)) + header)
        f.write(_LENGTH.pack(len(messages)))
        for message in messages:
            f.write(_LENGTH.pack(len(message)))
            f.write(message)
    tmp.replace(path)


def read_stream(path: Path) -> Stream:
    blob = path.read_bytes()
    if not blob.startswith(_MAGIC):
        raise ValueError(f"{path} is not a recorded stream; delete it to record again")
    pos = len(_MAGIC)
    (size,) = _LENGTH.unpack_from(blob, pos)
    meta = json.loads(blob[pos + 4 : pos + 4 + size])
    pos += 4 + size
    (count,) = _LENGTH.unpack_from(blob, pos)
    pos += 4
    messages = []
    unpack = _LENGTH.unpack_from
    for _ in range(count):
        (length,) = unpack(blob, pos)
        pos += 4
        messages.append(blob[pos : pos + length])
        pos += length
    if pos != len(blob):
        raise ValueError(f"{path} has {len(blob) - pos} trailing bytes; delete it to record again")
    return Stream(messages, meta)


def _run_workload(conn: psycopg.Connection[Any], work: Workload) -> None:
    log = _log
    rows, batch = work.rows, work.batch
    for first in range(1, rows + 1, batch):
        conn.execute(INSERT_SQL, {"first": first, "last": min(first + batch - 1, rows)})
    log(f"inserted {rows:,} rows")
    # 25% of the rows updated, in transactions of `batch` updates
    for first in range(1, rows + 1, 4 * batch):
        conn.execute(UPDATE_SQL, {"first": first, "last": first + 4 * batch - 1})
    log("updated every 4th row")
    for first in range(1, work.small_transactions * 10, 10):
        conn.execute(SMALL_SQL, {"first": first, "last": first + 9})
    log(f"ran {work.small_transactions:,} small transactions")
    for first in range(1, rows + 1, 10 * batch):
        conn.execute(DELETE_SQL, {"first": first, "last": first + 10 * batch - 1})
    log("deleted every 10th row")
    conn.execute(KEY_UPDATE_SQL, {"first": 1, "last": rows})
    log("changed the key of every 100th row")


def _read_slot(conn: psycopg.Connection[Any], slot: str, binary: bool, chunk: int) -> list[bytes]:
    query = (
        "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, %s, 'proto_version', '1', "
        "'publication_names', 'bench_pub', 'binary', %s)"
    )
    messages: list[bytes] = []
    while True:
        rows = conn.execute(query, (slot, chunk, "true" if binary else "false")).fetchall()
        if not rows:
            return messages
        messages.extend(bytes(row[0]) for row in rows)


def record(work: Workload) -> None:
    """Run the workload on a throwaway server and store both recorded streams."""
    versions = available_versions((18, 15))
    if not versions:
        raise SystemExit("no PostgreSQL 18 or 15 server found: run `make setup` first")
    major = versions[0]
    settings = {
        "logical_decoding_work_mem": "512MB",
        "shared_buffers": "256MB",
        "max_wal_size": "8GB",
        "checkpoint_timeout": "30min",
    }
    started = time.perf_counter()
    _log(f"recording the stream on PostgreSQL {major} (once; cached under {CACHE_DIR})")
    with (
        Cluster(major, settings=settings) as cluster,
        psycopg.connect(cluster.dsn(), autocommit=True) as conn,
    ):
        conn.execute(TABLE_SQL)
        conn.execute("CREATE PUBLICATION bench_pub FOR TABLE bench")
        for slot in ("bench_text", "bench_binary"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        _run_workload(conn, work)
        version = conn.execute("SHOW server_version").fetchone()
        for fmt in ("text", "binary"):
            messages = _read_slot(conn, f"bench_{fmt}", fmt == "binary", work.read_chunk)
            meta = {
                "version": STREAM_VERSION,
                "format": fmt,
                "server_version": version[0] if version else "?",
                "workload": asdict(work),
                "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            write_stream(_stream_path(fmt), messages, meta)
            _log(f"stored {len(messages):,} {fmt} messages")
    _log(f"recorded in {time.perf_counter() - started:.0f} s")


def load_streams(regenerate: bool) -> dict[str, Stream]:
    paths = {fmt: _stream_path(fmt) for fmt in ("text", "binary")}
    if regenerate or not all(p.exists() for p in paths.values()):
        record(Workload())
    return {fmt: read_stream(path) for fmt, path in paths.items()}


# -- measuring ---------------------------------------------------------------------------------


def _best_of(repeat: int, run: Callable[[], object]) -> tuple[float, float]:
    """The shortest wall-clock and CPU times of ``repeat`` runs (CPU time is steadier on a
    shared machine; wall-clock time is what the rates use)."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        gc.collect()
        started, cpu_started = time.perf_counter(), time.process_time()
        run()
        wall = min(wall, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - cpu_started)
    return wall, cpu


def run_pypgoutput(messages: Sequence[bytes]) -> int:
    from pypgoutput import decoders

    by_type: dict[int, Callable[[bytes], object]] = {
        ord("B"): decoders.Begin,
        ord("C"): decoders.Commit,
        ord("R"): decoders.Relation,
        ord("I"): decoders.Insert,
        ord("U"): decoders.Update,
        ord("D"): decoders.Delete,
        ord("T"): decoders.Truncate,
    }
    count = 0
    for message in messages:
        by_type[message[0]](message)
        count += 1
    return count


def run_row_decoder(messages: Sequence[bytes]) -> int:
    decode = Decoder(1).decode
    for message in messages:
        decode(message)
    return len(messages)


def run_columnar(chunks: Sequence[Sequence[bytes]]) -> int:
    decoder = ColumnarDecoder(1)
    changes = 0
    for chunk in chunks:
        changes += decoder.decode(chunk).change_count
    return changes


def check_columnar(chunks: Sequence[Sequence[bytes]], changes: int) -> None:
    """Before timing: the columnar output has every change, typed, and its first chunk agrees
    with the row decoder's text values (ids, prices, notes, documents)."""
    decoder = ColumnarDecoder(1)
    total = 0
    for chunk in chunks:
        total += decoder.decode(chunk).change_count
    if total != changes:
        raise SystemExit(f"columnar decoder returned {total} changes, the stream has {changes}")
    first = ColumnarDecoder(1).decode(chunks[0])
    row = Decoder(1)
    texts = {i: row.decode(m) for i, m in enumerate(chunks[0])}
    for part in first.changes:
        records = part.batch
        wanted = {"id": pa.int64(), "price": pa.decimal128(12, 2), "day": pa.date32(),
                  "created": pa.timestamp("us", tz="UTC"), "attrs": pa.string()}  # fmt: skip
        for name, arrow_type in wanted.items():
            if records.schema.field(name).type != arrow_type:
                raise SystemExit(f"column {name} is {records.schema.field(name).type}")
        columns = records.select(["_seq", "id", "price", "note", "attrs"]).to_pydict()
        for r, seq in enumerate(columns["_seq"]):
            new = getattr(texts[seq], "new", None)
            if new is None:
                continue
            got = (str(columns["id"][r]), columns["price"][r], columns["note"][r])
            if got != (new[0], None if new[3] is None else Decimal(new[3]), new[6]) or (
                columns["attrs"][r] != new[5]
            ):
                raise SystemExit(f"columnar and row decoders disagree on message {seq}")


def _counts(messages: Sequence[bytes]) -> dict[str, int]:
    kinds = Counter(chr(m[0]) for m in messages)
    return dict(sorted(kinds.items()))


def _log(text: str) -> None:
    print(f"[bench-decode] {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.decode", description=__doc__)
    parser.add_argument("--regenerate", action="store_true", help="record the stream again")
    parser.add_argument("--repeat", type=int, default=5, help="runs per pgcdc decoder (best of)")
    parser.add_argument(
        "--repeat-anchor", type=int, default=2, help="runs of pypgoutput (best of; it is slow)"
    )
    parser.add_argument("--chunk", type=int, default=100_000, help="messages per decode call")
    args = parser.parse_args(argv)

    streams = load_streams(args.regenerate)
    text = streams["text"]
    messages = text.messages
    counts = _counts(messages)
    changes = sum(counts.get(k, 0) for k in "IUD")
    stream_bytes = sum(map(len, messages))
    _log(f"stream: {len(messages):,} messages, {changes:,} changes, {stream_bytes / 1e6:.0f} MB")

    def chunked(msgs: list[bytes]) -> list[list[bytes]]:
        return [msgs[i : i + args.chunk] for i in range(0, len(msgs), args.chunk)]

    text_chunks = chunked(messages)
    binary_chunks = chunked(streams["binary"].messages)
    check_columnar(text_chunks, changes)

    timings = {
        "pgcdc_columnar_text": (args.repeat, lambda: run_columnar(text_chunks)),
        "pgcdc_columnar_binary": (args.repeat, lambda: run_columnar(binary_chunks)),
        "pgcdc_row_decoder": (max(1, args.repeat // 2), lambda: run_row_decoder(messages)),
        "pypgoutput_decoders": (args.repeat_anchor, lambda: run_pypgoutput(messages)),
    }
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for key, (repeat, run) in timings.items():
        _log(f"timing {LABELS[key]}, best of {repeat}")
        wall[key], cpu[key] = _best_of(repeat, run)

    rates = {key: changes / seconds for key, seconds in wall.items()}
    anchor = rates["pypgoutput_decoders"]
    columnar = rates["pgcdc_columnar_text"]
    ratio = columnar / anchor
    result = {
        "benchmark": "decode",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "stream": {
            **text.meta,
            "messages": len(messages),
            "changes": changes,
            "bytes": stream_bytes,
            "message_types": counts,
        },
        "chunk_messages": args.chunk,
        "best_of": {key: repeat for key, (repeat, _) in timings.items()},
        "seconds": wall,
        "cpu_seconds": cpu,
        "changes_per_second": rates,
        "changes_per_cpu_second": {key: changes / seconds for key, seconds in cpu.items()},
        "ratio_columnar_to_pypgoutput": ratio,
        "ratio_columnar_to_pypgoutput_cpu": cpu["pypgoutput_decoders"] / cpu["pgcdc_columnar_text"],
        "goals": {
            "ratio_at_least": GOAL_RATIO,
            "rate_at_least": GOAL_RATE,
            "ratio_met": ratio >= GOAL_RATIO,
            "rate_met": columnar >= GOAL_RATE,
        },
        "machine": {**machine_info(), "numpy": np.__version__, "pyarrow": pa.__version__},
    }
    RESULT_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULT_PATH.write_text(json.dumps(result, indent=2) + "\n")

    print(f"\npgoutput decoding: {changes:,} changes in {len(messages):,} messages, best of runs")
    print(f"{'decoder':<48}{'seconds':>9}{'cpu s':>8}{'changes/s':>13}{'vs pypgoutput':>15}")
    for key in ("pypgoutput_decoders", "pgcdc_row_decoder", *COLUMNAR):
        rate = rates[key]
        print(
            f"{LABELS[key]:<48}{wall[key]:>9.2f}{cpu[key]:>8.2f}{rate:>13,.0f}"
            f"{rate / anchor:>14.1f}x"
        )
    print(
        f"\ncolumnar (text) vs pypgoutput: {ratio:.1f}x (goal {GOAL_RATIO:.0f}x, "
        f"{'met' if ratio >= GOAL_RATIO else 'NOT met'}); "
        f"{columnar:,.0f} changes/s (goal {GOAL_RATE:,.0f}, "
        f"{'met' if columnar >= GOAL_RATE else 'NOT met'})"
    )
    print(f"written to {RESULT_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
