"""What every ``make bench`` benchmark shares: scale, throwaway servers, ``pgcdc run`` as a user
runs it, process-tree memory sampling and the JSON result files.

* ``--scale`` (or ``BENCH_SCALE``): a factor on every size (rows, bytes, seconds); 1 is the
  issue's full sizes, 0.05 a quick run. Results record the scale they were measured at.
* ``bench_cluster``: a throwaway PostgreSQL server tuned for bulk work (``BENCH_PG`` picks the
  major version, default 15: its Debian install also has ``psql`` and ``pg_recvlogical``).
* ``PgcdcRun``: a ``pipeline.toml`` in a scratch folder and ``python -m pgcdc run`` in a
  subprocess (its own JVM and Spark, as a user runs it), timed, optionally with its process
  tree's memory sampled from ``/proc``.
* ``write_result``: ``bench-results/<name>.json`` with the scale and the machine
  (``BENCH_RESULTS=<dir>``: another folder, for trial runs that must not replace results).
* ``BENCH_PROFILE=<dir>``: every ``pgcdc run`` is recorded by ``py-spy record --subprocesses``
  (collapsed stacks in ``<dir>``; ``python -m tools.bench.profile <file>`` sums them up).
* ``BENCH_SPARK_CONF='{"key": "value"}'``: Spark settings added to every ``pgcdc run`` (e.g.
  ``spark.eventLog.enabled`` and ``spark.eventLog.dir`` for per-stage times).
* What the steady-state benchmarks (``bench-scale``, ``bench-wide``) measure with: the
  pipeline's ``batch N: ...`` log lines (``batch_lines``), each Delta table's batch commits read
  from its log alone (``LakeLog``: ``userMetadata`` and ``commitInfo.timestamp``, nothing of
  how the batch wrote them) and when a transaction reached them, and PostgreSQL's native
  subscriber on a second server with its tick table (``subscribe_natively``, ``tick_times``).

Benchmarks are not tests: nothing here fails on speed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from pgcdc.cli.throwaway_server import Cluster, find_server
from pgcdc.lsn import Lsn

ROOT = Path(__file__).resolve().parents[2]
#: where results go: ``bench-results/``, or ``BENCH_RESULTS`` (a trial run's results kept apart)
RESULTS_DIR = Path(os.environ.get("BENCH_RESULTS") or ROOT / "bench-results")

#: Server settings for bulk work (on top of the Cluster defaults: wal_level=logical, fsync off).
BENCH_SETTINGS: Mapping[str, str] = {
    "shared_buffers": "512MB",
    "max_wal_size": "16GB",
    "min_wal_size": "1GB",
    "checkpoint_timeout": "1h",
    "logical_decoding_work_mem": "64MB",  # PostgreSQL's default (the test clusters use 64kB)
    "wal_sender_timeout": "0",
    "wal_receiver_timeout": "0",
    "max_worker_processes": "16",
    "max_logical_replication_workers": "8",
    "work_mem": "64MB",
    "maintenance_work_mem": "512MB",
}


def log(name: str, text: str) -> None:
    print(f"[bench-{name}] {text}", file=sys.stderr, flush=True)


# -- scale and results ---------------------------------------------------------------------


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get("BENCH_SCALE", "1")
    parser.add_argument(
        "--scale",
        type=float,
        default=float(default),
        help=f"factor on every size (1: the full sizes; 0.05: a quick run); default {default} "
        "(BENCH_SCALE)",
    )


#: ``[lake] write`` of a benchmark's runs (``--writes``)
WRITES = ("indexed", "merge")


def add_writes_argument(parser: argparse.ArgumentParser) -> None:
    """``--writes``: the ``[lake] write`` modes to run, the first the goals are read from."""
    parser.add_argument(
        "--writes",
        default="indexed",
        help="[lake] write: indexed, merge or both (comma-separated; the first is the one the "
        "goals are read from, the others run beside it); default indexed",
    )


def parse_writes(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The modes ``--writes`` names, in order; a usage error for anything else."""
    writes = [w.strip() for w in text.split(",") if w.strip()]
    if not writes or set(writes) - set(WRITES):
        parser.error(f"--writes takes indexed and/or merge, not {text!r}")
    return writes


def scaled(value: float, scale: float, minimum: int = 1) -> int:
    return max(minimum, round(value * scale))


def stats(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p90, p99, max and mean of ``values`` (None when there are none)."""
    if not len(values):
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    array = np.asarray(values, dtype=float)
    return {
        "n": len(array),
        "p50": float(np.percentile(array, 50)),
        "p90": float(np.percentile(array, 90)),
        "p99": float(np.percentile(array, 99)),
        "max": float(array.max()),
        "mean": float(array.mean()),
    }


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gb"] = round(int(line.split()[1]) / 2**20, 1)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    return info


def write_result(name: str, scale: float, result: Mapping[str, Any]) -> Path:
    """``bench-results/<name>.json``: the result with the benchmark's name, time, scale and
    machine."""
    data = {
        "benchmark": name,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "scale": scale,
        **result,
        "machine": machine_info(),
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


# -- servers and client programs -----------------------------------------------------------


def bench_major() -> int:
    return int(os.environ.get("BENCH_PG", "15"))


@contextlib.contextmanager
def bench_cluster(extra: Mapping[str, str] | None = None) -> Iterator[Cluster]:
    """A throwaway server for one benchmark, stopped and removed afterwards (even on failure)."""
    settings = dict(BENCH_SETTINGS)
    settings.update(extra or {})
    cluster = Cluster(bench_major(), settings=settings)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def client_program(name: str) -> Path:
    """A PostgreSQL client program (``psql``, ``pg_recvlogical``) of the benchmark's major
    version or, failing that, of any Debian install."""
    candidates = [find_server(bench_major()).program(name)]
    candidates += sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(f"{name} not found: install the PostgreSQL client programs (postgresql-15)")


def connect(cluster: Cluster) -> psycopg.Connection[Any]:
    return psycopg.connect(cluster.dsn(), autocommit=True)


def scalar(conn: psycopg.Connection[Any], query: Any, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


@contextlib.contextmanager
def scratch_dir(name: str) -> Iterator[Path]:
    """A scratch folder (lakes, configurations, logs), removed afterwards unless
    ``BENCH_KEEP`` is set."""
    path = Path(tempfile.mkdtemp(prefix=f"pgcdc-bench-{name}-"))
    try:
        yield path
    finally:
        if os.environ.get("BENCH_KEEP"):
            print(f"kept {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


# -- process-tree memory ---------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and its descendants (``tree``: ``_children()``, read now when not given)."""
    if tree is None:
        tree = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, ()))
    return out


#: ``PF_FORKNOEXEC`` in ``/proc/<pid>/stat``'s flags: the process was forked and has not called
#: exec since (the kernel sets it at fork, clears it at exec)
_PF_FORKNOEXEC = 0x40


@dataclass(frozen=True, slots=True)
class _Memory:
    """One process's memory in kB, from ``/proc/<pid>/smaps_rollup``."""

    rss: int = 0
    pss: int = 0
    private: int = 0  # Private_Clean + Private_Dirty: pages no other process maps


def _read_memory(pid: int) -> _Memory:
    """(zeros if the process is gone)"""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return _Memory()
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
            values[key] = int(rest.split()[0])
    return _Memory(
        values.get("Rss", 0),
        values.get("Pss", 0),
        values.get("Private_Clean", 0) + values.get("Private_Dirty", 0),
    )


def _memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in kB (0, 0 if it is gone)."""
    memory = _read_memory(pid)
    return memory.rss, memory.pss


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _not_execed(pid: int) -> bool:
    """Whether the process was forked and has not called exec since (``PF_FORKNOEXEC``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    flags = int(stat[stat.rfind(")") + 2 :].split()[6])
    return bool(flags & _PF_FORKNOEXEC)


def _forks_workers(pid: int) -> bool:
    """Whether the process is one of Spark's Python worker daemons (``pyspark.daemon``), which
    fork their workers for good: processes of their own that never exec."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"pyspark.daemon") for arg in argv)


@dataclass
class TreeMemory:
    """One sample of a process tree's memory in kB: the sums, each process kind's share
    (``java``, ``python3``, ...; the root as ``driver (python)``), and the children counted once
    with their parent because they were caught between fork and exec (see ``tree_memory``)."""

    rss: int = 0
    pss: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    pre_exec: int = 0  # such children in the sample
    pre_exec_rss: int = 0  # what they would have added to the RSS sum counted in full
    pre_exec_kinds: set[str] = field(default_factory=set)  # "parent > child" process names


def tree_memory(root: int) -> TreeMemory:
    """The memory of ``root``'s process tree, each page counted as its processes' RSS counts it,
    except for children caught between fork and exec.

    A child between fork and exec (``PF_FORKNOEXEC``) is its parent's memory, not memory of its
    own: after ``vfork`` or ``posix_spawn`` (``CLONE_VM``: how a JVM starts a process) it runs on
    its parent's very address space, and after ``fork`` (how pyspark's driver starts the JVM,
    with a ``preexec_fn``) on copy-on-write copies of its parent's pages, until exec replaces
    them a moment later. ``smaps_rollup`` reports all of those pages for the child too, so a
    sample that catches one counted its parent (the driver, or a JVM) twice. Such a child adds
    only the pages it wrote since the fork (its private pages), and nothing when it shares its
    parent's address space (one ``mm``: its figures read the same as its parent's, and most of
    its pages are private, the parent's own, where a forked child's pages are still mostly
    shared with its parent). The PSS sum gets the same rule (a ``CLONE_VM`` child's PSS
    is its parent's whole PSS; a forked child's is its share of the pages, kept as is).

    The exception to the exception: the workers that Spark's Python daemons (``pyspark.daemon``)
    fork never exec; they are processes of their own, counted in full as before (RSS counts the
    pages they share with their daemon in each; PSS splits them).
    """
    children = _children()
    tree = process_tree(root, children)
    parents = {pid: parent for parent, kids in children.items() for pid in kids}
    sample = TreeMemory()
    memory = {pid: _read_memory(pid) for pid in tree}
    for pid in tree:
        mine = memory[pid]
        rss, pss = mine.rss, mine.pss
        parent = parents.get(pid)
        if pid != root and parent in memory and _not_execed(pid) and not _forks_workers(parent):
            theirs = memory[parent]
            # one address space: the same figures (read a moment apart, a running parent's
            # may differ a little), and pages that no other address space maps; a forked
            # child's pages are still mostly its parent's (shared), its private ones few
            shared_mm = (mine.rss == theirs.rss and mine.pss == theirs.pss) or (
                mine.private > mine.rss // 2
            )
            rss = 0 if shared_mm else mine.private
            pss = 0 if shared_mm else mine.pss
            sample.pre_exec += 1
            sample.pre_exec_rss += mine.rss
            sample.pre_exec_kinds.add(f"{_name(parent)} > {_name(pid)}")
        sample.rss += rss
        sample.pss += pss
        kind = "driver (python)" if pid == root else _name(pid)
        sample.by_kind[kind] = sample.by_kind.get(kind, 0) + rss
    return sample


@dataclass
class MemorySampler:
    """Samples the RSS and PSS (summed over the process tree of ``pid``, ``tree_memory``'s rule
    for children caught between fork and exec) every ``interval`` seconds on a thread;
    ``peak_*`` are the largest sums seen, ``by_process`` each process kind's largest RSS (java,
    python, ...), ``pre_exec_*`` how often such a child was caught and the most it would have
    added to the RSS sum counted in full."""

    pid: int
    interval: float = 0.2
    peak_rss_kb: int = 0
    peak_pss_kb: int = 0
    by_process: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    pre_exec_samples: int = 0
    pre_exec_max_rss_kb: int = 0
    pre_exec_kinds: dict[str, int] = field(default_factory=dict)  # samples per parent > child
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> MemorySampler:
        self._thread = threading.Thread(target=self._loop, name="bench-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            sample = tree_memory(self.pid)
            self.peak_rss_kb = max(self.peak_rss_kb, sample.rss)
            self.peak_pss_kb = max(self.peak_pss_kb, sample.pss)
            for kind, value in sample.by_kind.items():
                self.by_process[kind] = max(self.by_process.get(kind, 0), value)
            if sample.pre_exec:
                self.pre_exec_samples += 1
                self.pre_exec_max_rss_kb = max(self.pre_exec_max_rss_kb, sample.pre_exec_rss)
                for kind in sample.pre_exec_kinds:
                    self.pre_exec_kinds[kind] = self.pre_exec_kinds.get(kind, 0) + 1
            self.timeline.append((round(time.monotonic() - started, 2), sample.rss))
            self._stop.wait(self.interval)


# -- pgcdc run, as a user runs it --------------------------------------------------------------

PIPELINE_TOML = """\
[source]
dsn = "{dsn}"
slot = "{slot}"
publication = "{publication}"
{source_extra}
[lake]
path = "{lake}"
{lake_extra}
[spark]
master = "{master}"

[stream]
{stream}
{tables}
"""


@functools.cache
def cli_module() -> str:
    """``pgcdc`` (the real command line), or ``tools.bench.runner`` (the same ``run``
    handler) when ``python -m pgcdc`` cannot start."""
    proc = subprocess.run(
        [sys.executable, "-m", "pgcdc", "run", "--help"],
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        check=False,
    )
    if proc.returncode == 0:
        return "pgcdc"
    print("`python -m pgcdc` fails to start: using tools.bench.runner", file=sys.stderr)
    return "tools.bench.runner"


_SNAPSHOT_LINE = re.compile(r"snapshot: (\d+) rows of (\d+) tables in ([0-9.]+) s")
_BATCH_LINE = re.compile(
    r"batch (\d+): (\d+) changes of (\d+) tables?, LSN (\S+) to (\S+), ([0-9.]+) s\b"
)
_ERROR_LINE = re.compile(r"OutOfMemory|maxResultSize|Killed|pgcdc run: |\w+(Error|Exception): ")
_STREAM_LINE = re.compile(r"stream: (\d+) batches, (\d+) changes")


def _lsn_or_none(text: str) -> int | None:
    return None if text == "-" else int(Lsn.parse(text))


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One ``batch N: C changes of T tables, LSN a to b, S s`` line of the pipeline's log: the
    batch, its changes, the tables it wrote, its LSN range (None: ``-``) and its seconds."""

    batch: int
    changes: int
    tables: int
    min_lsn: int | None
    max_lsn: int | None
    seconds: float


def batch_lines(output: str) -> list[BatchLine]:
    """Every batch line of a ``pgcdc run``'s output, in order."""
    return [
        BatchLine(
            int(m[1]), int(m[2]), int(m[3]), _lsn_or_none(m[4]), _lsn_or_none(m[5]), float(m[6])
        )
        for m in _BATCH_LINE.finditer(output)
    ]


@dataclass
class RunOutcome:
    """One ``pgcdc run`` process: wall time, exit code, what it printed, its memory."""

    seconds: float
    returncode: int
    output: str
    peak_rss_kb: int = 0
    peak_pss_kb: int = 0
    rss_by_process_kb: dict[str, int] = field(default_factory=dict)
    #: samples that caught a child between fork and exec, and the most it would have added
    pre_exec_samples: int = 0
    pre_exec_max_rss_kb: int = 0

    @property
    def snapshot_seconds(self) -> float | None:
        match = _SNAPSHOT_LINE.search(self.output)
        return float(match.group(3)) if match else None

    @property
    def stream_changes(self) -> int | None:
        match = _STREAM_LINE.search(self.output)
        return int(match.group(2)) if match else None

    @property
    def stream_batches(self) -> int | None:
        match = _STREAM_LINE.search(self.output)
        return int(match.group(1)) if match else None

    @property
    def batches(self) -> list[tuple[int, float]]:
        """``(changes, seconds)`` of each batch the pipeline logged (``batch N: ...``)."""
        return [(b.changes, b.seconds) for b in batch_lines(self.output)]

    def error_lines(self, limit: int = 3) -> str:
        """The distinct error lines of a failed run, the root causes first (out of memory,
        ``Caused by: ...``), for the results."""
        found: list[str] = []
        for line in self.output.splitlines():
            text = line.strip()
            if text.startswith(("at ", "pgcdc run: source ")) or text in found:
                continue
            if _ERROR_LINE.search(text):
                found.append(text[:300])
        found.sort(key=lambda t: 0 if "OutOfMemory" in t else 1 if "Caused by" in t else 2)
        return " | ".join(found[:limit]) or f"exit {self.returncode}"

    def check(self, what: str) -> RunOutcome:
        if self.returncode != 0:
            tail = "\n".join(self.output.splitlines()[-40:])
            raise RuntimeError(f"pgcdc run ({what}) exited {self.returncode}:\n{tail}")
        return self


@dataclass
class PgcdcRun:
    """A pipeline (configuration and lake in ``workdir``) run with ``python -m pgcdc run``."""

    workdir: Path
    dsn: str
    tables: Sequence[str]
    slot: str = "pgcdc_bench"
    publication: str = "pgcdc_bench"
    master: str = "local[2]"
    stream: Mapping[str, Any] = field(default_factory=dict)
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    #: the lake somewhere else than ``workdir/lake`` (an s3:// URI), and more of ``[lake]``
    lake_uri: str | None = None
    lake_extra: str = ""
    #: more of ``[source]`` (TOML lines)
    source_extra: str = ""

    @property
    def lake(self) -> Path:
        return self.workdir / "lake"

    def table_uri(self, table: str, schema: str = "public") -> str:
        """Where the mirror of ``schema.table`` is (its lake's settings registered, so that
        ``DeltaTarget`` reads it)."""
        from pgcdc.lake.config import load_config
        from pgcdc.lake.store.tables import LakeLayout

        layout = LakeLayout(load_config(self.write_config()).lake.location())
        return str(layout.table_path(schema, table))

    @property
    def config_path(self) -> Path:
        return self.workdir / "pipeline.toml"

    def write_config(self) -> Path:
        tables = "".join(f'\n[[tables]]\nname = "{name}"\n' for name in self.tables)
        stream = "\n".join(f"{k} = {json.dumps(v)}" for k, v in self.stream.items())
        text = PIPELINE_TOML.format(
            dsn=self.dsn,
            slot=self.slot,
            publication=self.publication,
            source_extra=self.source_extra,
            lake=self.lake_uri or self.lake,
            lake_extra=self.lake_extra,
            master=self.master,
            stream=stream,
            tables=tables,
        )
        spark_conf = {**self.spark_conf, **json.loads(os.environ.get("BENCH_SPARK_CONF") or "{}")}
        if spark_conf:
            conf = "\n".join(f'"{k}" = "{v}"' for k, v in spark_conf.items())
            text += f"\n[spark.conf]\n{conf}\n"
        self.config_path.write_text(text)
        return self.config_path

    def argv(self, until_caught_up: bool = True) -> list[str]:
        level = os.environ.get("BENCH_LOG_LEVEL", "INFO")  # DEBUG: Spark/Delta time per batch
        argv = [sys.executable, "-m", cli_module(), "--log-level", level, "run"]
        argv += ["--config", str(self.write_config())]
        if until_caught_up:
            argv.append("--until-caught-up")
        profile = os.environ.get("BENCH_PROFILE")
        if profile:
            # py-spy over the whole tree (driver and Spark's Python workers), collapsed stacks
            out = Path(profile) / f"{self.workdir.name}-{time.time_ns()}.txt"
            out.parent.mkdir(parents=True, exist_ok=True)
            spy = str(Path(sys.executable).parent / "py-spy")
            argv = [spy, "record", "--subprocesses", "--format", "raw", "--rate", "50",
                    "-o", str(out), "--", *argv]  # fmt: skip
        return argv

    def env(self) -> dict[str, str]:
        env = dict(os.environ, COLUMNS="200", PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")) if p
        )
        return env

    def run(self, *, sample_memory: bool = False, timeout: float = 3 * 3600) -> RunOutcome:
        """``pgcdc run --until-caught-up``; its wall time includes starting Python, the JVM
        and Spark (what a scheduled run pays)."""
        logfile = self.workdir / f"run-{time.time_ns()}.log"
        with open(logfile, "w+") as out:
            started = time.perf_counter()
            proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, env=self.env()
            )
            sampler = MemorySampler(proc.pid).start() if sample_memory else None
            try:
                returncode = proc.wait(timeout=timeout)
            finally:
                if proc.poll() is None:
                    stop_process(proc)
                if sampler is not None:
                    sampler.stop()
            seconds = time.perf_counter() - started
            out.seek(0)
            output = out.read()
        outcome = RunOutcome(seconds, returncode, output)
        if sampler is not None:
            outcome.peak_rss_kb = sampler.peak_rss_kb
            outcome.peak_pss_kb = sampler.peak_pss_kb
            outcome.rss_by_process_kb = dict(sampler.by_process)
            outcome.pre_exec_samples = sampler.pre_exec_samples
            outcome.pre_exec_max_rss_kb = sampler.pre_exec_max_rss_kb
        return outcome

    def start(self) -> subprocess.Popen[bytes]:
        """A continuous ``pgcdc run`` (stop it with ``stop_process``); output goes to
        ``run-continuous.log``."""
        out = open(self.workdir / "run-continuous.log", "wb")  # noqa: SIM115 - owned by proc
        return subprocess.Popen(
            self.argv(until_caught_up=False), stdout=out, stderr=subprocess.STDOUT, env=self.env()
        )


def stop_process(proc: subprocess.Popen[Any], grace: float = 60.0) -> None:
    """Ctrl-C (the pipeline stops after the current batch), then kill if it lingers; and any
    of its children left behind."""
    if proc.poll() is not None:
        return
    tree = process_tree(proc.pid)
    proc.send_signal(2)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in tree[1:]:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


def wait_for(what: str, check: Any, timeout: float, interval: float = 0.05) -> float:
    """Poll ``check()`` until true; the seconds it took. TimeoutError names ``what``."""
    started = time.perf_counter()
    deadline = started + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:g} s")
        time.sleep(interval)
    return time.perf_counter() - started


# -- the lake's Delta logs: when a transaction reached the lake -------------------------------


def log_entry(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A Delta log entry (``_delta_log/<version>.json``): its ``commitInfo`` and its actions."""
    info: dict[str, Any] = {}
    actions = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
        actions.append(action)
    return info, actions


def pgcdc_metadata(info: Mapping[str, Any]) -> dict[str, Any] | None:
    """pgcdc's part of a commit's ``userMetadata`` (``{"pgcdc": {...}}``; None without it)."""
    text = info.get("userMetadata")
    if not isinstance(text, str):
        return None
    try:
        meta = json.loads(text).get("pgcdc")
    except (ValueError, AttributeError):
        return None
    return meta if isinstance(meta, dict) else None


def commit_time(info: Mapping[str, Any], path: Path) -> float:
    """A commit's time in seconds: ``commitInfo.timestamp``, else its log entry's mtime."""
    stamp = info.get("timestamp")
    return (stamp if stamp is not None else path.stat().st_mtime * 1000) / 1000.0


@dataclass(frozen=True, slots=True)
class BatchCommit:
    """A commit of one of pgcdc's batches in a Delta table's log: its version and time, and its
    ``userMetadata``'s batch, changes and LSN range (``max_lsn``: the largest commit LSN of the
    table's changes in the batch)."""

    version: int
    time: float
    batch: int
    changes: int
    min_lsn: int
    max_lsn: int

    @classmethod
    def of(cls, version: int, info: Mapping[str, Any], path: Path) -> BatchCommit | None:
        """The batch commit a log entry is (None for another commit: the initial copy's,
        compaction, purge, vacuum)."""
        meta = pgcdc_metadata(info)
        if not meta or "batch" not in meta or meta.get("max_lsn") in (None, "-"):
            return None
        return cls(
            version,
            commit_time(info, path),
            int(meta["batch"]),
            int(meta.get("changes", 0)),
            int(Lsn.parse(meta["min_lsn"])),
            int(Lsn.parse(meta["max_lsn"])),
        )


class LakeLog:
    """The batch commits of some Delta tables (``name -> folder``), read from their logs alone
    as new entries appear: each ``refresh`` reads only the entries written since the last.

    A transaction touching a table is in that Delta table with its first batch commit whose
    ``max_lsn`` reaches the WAL insert position read in the transaction after its changes
    (below its commit LSN, above every earlier transaction's when one writer commits them in
    turn; the pipeline applies whole transactions in commit order), exactly, not as a bound;
    and in the lake when every Delta table of every table it touched has it: ``arrival``, the
    latest of those commits' times."""

    def __init__(self, tables: Mapping[str, Path]) -> None:
        self.tables = dict(tables)
        self._next: dict[str, int] = {}
        self._commits: dict[str, list[BatchCommit]] = {name: [] for name in self.tables}
        self._reach: dict[str, list[int]] = {name: [] for name in self.tables}

    def refresh(self, names: Iterable[str] | None = None) -> LakeLog:
        for name in self.tables if names is None else names:
            log_dir = self.tables[name] / "_delta_log"
            version = self._next.get(name)
            if version is None:  # the first entry the log still has
                found = [int(p.stem) for p in log_dir.glob("*.json") if p.stem.isdigit()]
                if not found:
                    continue
                version = min(found)
            while True:
                path = log_dir / f"{version:020d}.json"
                try:
                    info, _ = log_entry(path)
                except (OSError, ValueError):  # not written yet
                    break
                commit = BatchCommit.of(version, info, path)
                if commit is not None:
                    reach = self._reach[name]
                    reach.append(max(commit.max_lsn, reach[-1] if reach else commit.max_lsn))
                    self._commits[name].append(commit)
                version += 1
            self._next[name] = version
        return self

    def commits(self, name: str) -> list[BatchCommit]:
        return self._commits[name]

    def reached(self, name: str, lsn: int) -> float | None:
        """When ``name`` first had a batch commit whose ``max_lsn`` reaches ``lsn`` (None: not
        yet, as of the last ``refresh``)."""
        reach = self._reach[name]
        i = bisect_left(reach, lsn)
        return self._commits[name][i].time if i < len(reach) else None

    def arrival(self, lsn: int, names: Iterable[str]) -> float | None:
        """When a transaction at ``lsn`` was in every one of ``names``: the latest of their
        first commits reaching it (None while one has none)."""
        latest: float | None = None
        for name in names:
            at = self.reached(name, lsn)
            if at is None:
                return None
            latest = at if latest is None else max(latest, at)
        return latest

    def has_all(self, last_lsn: Mapping[str, int]) -> bool:
        """Whether each named Delta table has its position (the last transaction that touched
        it), refreshing those that did not have it yet."""
        missing = [n for n, lsn in last_lsn.items() if self.reached(n, lsn) is None]
        self.refresh(missing)
        return all(self.reached(n, last_lsn[n]) is not None for n in missing)


# -- PostgreSQL's native subscriber: the steady-state benchmarks' anchor ------------------------

_TICK_STAMP = """
CREATE FUNCTION bench_tick_applied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.applied_at := clock_timestamp();
    RETURN NEW;
END
$$
"""


def subscribe_natively(
    src: psycopg.Connection[Any],
    dst: psycopg.Connection[Any],
    source: Cluster,
    tick: str,
    tables: sql.Composable,
) -> None:
    """PostgreSQL's native subscriber on ``dst``, whose tables exist already (empty), the tick
    table ``tick`` among them: a publication ``FOR`` ``tables`` (its tick table included) and a
    subscription copying them first. A ``BEFORE INSERT`` trigger on the tick table, ``ENABLE
    ALWAYS`` so that it fires in the apply worker, stamps each row with ``clock_timestamp()`` as
    the worker applies it, just before it commits its transaction (``tick_times``)."""
    ident = sql.Identifier(tick)
    dst.execute(_TICK_STAMP)
    dst.execute(
        sql.SQL(
            "CREATE TRIGGER bench_tick_applied BEFORE INSERT ON {} "
            "FOR EACH ROW EXECUTE FUNCTION bench_tick_applied()"
        ).format(ident)
    )
    dst.execute(sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER bench_tick_applied").format(ident))
    src.execute(sql.SQL("CREATE PUBLICATION native_pub FOR {}").format(tables))
    dst.execute(
        sql.SQL(
            "CREATE SUBSCRIPTION native CONNECTION {} PUBLICATION native_pub WITH "
            "(copy_data = true, slot_name = 'native_sub')"
        ).format(sql.Literal(source.dsn()))
    )


def subscription_ready(dst: psycopg.Connection[Any]) -> bool:
    """Whether the subscriber has copied every table of its subscription."""
    pending = scalar(dst, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'")
    tables = scalar(dst, "SELECT count(*) FROM pg_subscription_rel")
    return bool(tables) and pending == 0


def at_subscriber(dst: psycopg.Connection[Any], tick: str, seq: int) -> bool:
    """Whether the subscriber applied the transaction numbered ``seq`` (its tick row)."""
    query = sql.SQL("SELECT count(*) FROM {} WHERE seq = %s").format(sql.Identifier(tick))
    return bool(scalar(dst, query, (seq,)))


def tick_times(dst: psycopg.Connection[Any], tick: str) -> dict[int, float]:
    """When the subscriber applied each transaction (epoch seconds), by its number."""
    query = sql.SQL("SELECT seq, extract(epoch FROM applied_at)::float8 FROM {}").format(
        sql.Identifier(tick)
    )
    return {int(seq): float(at) for seq, at in dst.execute(query).fetchall()}
