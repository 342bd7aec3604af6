"""The kill -9 chaos scenario, shared by the suite (a few kills) and ``make chaos`` (many).

A seeded random workload (tests/lake/workload.py: every type, key changes, deletes, TOAST,
truncates, prepared transactions, rolled-back subtransactions, a streamed transaction, schema
changes) writes to the source while ``python -m pgcdc run`` is started as a subprocess again and
again (continuous or ``--until-caught-up``, at random) and SIGKILLed with its whole process
group (the driver, the JVM and Spark's Python workers) at a random moment: the first time while
the initial snapshot is being copied, later ones anywhere (JVM start, snapshot, streaming, in
the middle of a batch's Delta commits). A last ``run --until-caught-up --verify`` finishes.

The independent record of what happened is a second logical slot using ``test_decoding``,
created before anything else: every committed transaction's xid, end LSN and its changes (table
and operation, in order). At the end:

* every mirror equals its source table (``pgcdc.lake.run.verify.compare_tables``);
* every history's current versions equal the mirror, and closed versions are well formed;
* every changelog holds each change exactly once: ``(table, __commit_lsn, __position)`` is
  unique, its snapshot rows ('S') number what the snapshot copied, and its other rows are, per
  transaction, exactly the audit slot's changes of the transactions that ended after the
  snapshot's consistent point, in order, with the same end LSN.

The seed is printed and replayed with ``PGCDC_CHAOS_SEED``; ``PGCDC_CHAOS_KILLS`` sets the
number of kills.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from pgcdc.lake.config import PipelineConfig, load_config
from pgcdc.lake.run.pipeline import Pipeline
from pgcdc.lake.run.verify import compare_tables
from pgcdc.lake.store.storage import StorageError
from pgcdc.lake.store.tables import LakeLayout, LakeTable
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.lsn import Lsn
from tests.lake.workload import SCHEMA, Workload

SEED_ENV = "PGCDC_CHAOS_SEED"
KILLS_ENV = "PGCDC_CHAOS_KILLS"
AUDIT_SLOT = "chaos_audit"
ROOT = Path(__file__).resolve().parents[2]

BULK = """
CREATE TABLE bulk (id int PRIMARY KEY, payload text);
INSERT INTO bulk SELECT g, md5(g::text) FROM generate_series(1, %(rows)s) g;
"""

CONFIG = """\
[source]
dsn = {dsn}
slot = "chaos_slot"
publication = "chaos_pub"

[lake]
path = {lake}
history = true
changelog = true
{lake_extra}

[spark]
master = "local[2]"

[spark.conf]
"spark.sql.shuffle.partitions" = "4"
"spark.sql.streaming.stopTimeout" = "30s"

[stream]
trigger_interval = {trigger}
max_changes_per_trigger = {max_changes}

[[tables]]
name = "public.*"
"""

_OPS = {"INSERT": "I", "UPDATE": "U", "DELETE": "D", "TRUNCATE": "T"}
_CHANGE = re.compile(r"^table (?P<tables>.+?): (?P<op>INSERT|UPDATE|DELETE|TRUNCATE):")
_BEGIN = re.compile(r"^BEGIN (\d+)$")
_COMMIT = re.compile(r"^COMMIT (\d+)")


#: The suite's seed when ``PGCDC_CHAOS_SEED`` is not set (``make chaos`` draws a fresh one): it
#: once put a column-changing ALTER TABLE into the initial copy, a case worth keeping
SUITE_SEED = 592208799


def chaos_seed() -> int:
    """The seed from ``PGCDC_CHAOS_SEED``, else ``SUITE_SEED`` (printed by the caller)."""
    text = os.environ.get(SEED_ENV)
    return int(text) if text else SUITE_SEED


def chaos_kills(default: int) -> int:
    text = os.environ.get(KILLS_ENV)
    return int(text) if text else default


def write_config(
    directory: Path,
    dsn: str,
    *,
    trigger: float = 1.0,
    max_changes: int = 20_000,
    lake: str = "lake",
    lake_extra: str = "",
) -> Path:
    """The chaos pipeline's ``pipeline.toml``: the lake at ``lake`` (a folder, relative to
    ``directory``, or s3://...; ``lake_extra`` adds to ``[lake]``, e.g. its ``[lake.s3]``)."""
    path = directory / "pipeline.toml"
    path.write_text(
        CONFIG.format(
            dsn=json.dumps(dsn),
            trigger=trigger,
            max_changes=max_changes,
            lake=json.dumps(lake),
            lake_extra=lake_extra,
        ),
        encoding="utf-8",
    )
    return path


# -- the pipeline as a subprocess ----------------------------------------------------------------


def start_run(
    config: Path,
    log: Path,
    *,
    until_caught_up: bool,
    verify: bool = False,
    prefix: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Any:
    """``python -m pgcdc run`` in its own session (process group), output appended to ``log``;
    ``prefix``: a command that runs it (e.g. ``timeout``), the session's leader then; ``env``:
    more environment variables for it."""
    argv = [sys.executable, "-m", "pgcdc", "--log-level", "INFO", "run", "--config", str(config)]
    if until_caught_up:
        argv.append("--until-caught-up")
    if verify:
        argv.append("--verify")
    env = dict(os.environ, **(env or {}), PYTHONPATH=str(ROOT / "src"), COLUMNS="200")
    with open(log, "ab") as out:
        out.write(f"\n===== {' '.join(argv[2:])} =====\n".encode())
        out.flush()
        return subprocess.Popen(
            [*prefix, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=config.parent,
            env=env,
            start_new_session=True,
        )


def session_members(sid: int) -> list[int]:
    """Processes (other than zombies) whose session is ``sid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry))
    return out


def kill_group(proc: Any) -> int:
    """SIGKILL the run's whole process group; returns how many stragglers had to be killed
    separately (processes of its session that left the group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)
    stragglers = 0
    deadline = time.monotonic() + 10
    while members := session_members(proc.pid):
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
                stragglers += 1
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {members} of the killed run survive SIGKILL")
        time.sleep(0.1)
    return stragglers


def log_tail(log: Path, lines: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


# -- the independent record --------------------------------------------------------------------


@dataclass
class AuditTxn:
    xid: int
    end_lsn: int
    changes: list[tuple[str, str]] = field(default_factory=list)  # (table id, op letter)


def create_audit_slot(dsn: str, slot: str = AUDIT_SLOT) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))


def audit_transactions(dsn: str, slot: str = AUDIT_SLOT) -> dict[int, AuditTxn]:
    """Every transaction the audit slot decoded (without consuming it), by xid."""
    out: dict[int, AuditTxn] = {}
    current: AuditTxn | None = None
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT lsn, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
            "'include-xids', '1', 'skip-empty-xacts', '1')",
            (slot,),
        )
        for lsn, data in cur:
            if m := _BEGIN.match(data):
                current = AuditTxn(int(m.group(1)), 0)
            elif m := _COMMIT.match(data):
                assert current is not None and current.xid == int(m.group(1)), data[:80]
                current.end_lsn = int(Lsn.parse(str(lsn)))
                out[current.xid] = current
                current = None
            elif m := _CHANGE.match(data):
                assert current is not None, data[:80]
                for table in m.group("tables").split(", "):
                    current.changes.append((table, _OPS[m.group("op")]))
    return out


# -- the checks ----------------------------------------------------------------------------------


def assert_history_consistent(layout: LakeLayout, table: LakeTable) -> None:
    from pgcdc.lake.store.tables import IS_CURRENT, MIRROR_COLUMNS

    mirror = DeltaTarget(table.path(layout, "mirror")).read()
    history = DeltaTarget(table.path(layout, "history")).read()
    columns = [c for c in mirror.column_names if c not in MIRROR_COLUMNS]
    current = history.filter(history.column(IS_CURRENT))
    assert Counter(repr(list(r.values())) for r in current.select(columns).to_pylist()) == Counter(
        repr(list(r.values())) for r in mirror.select(columns).to_pylist()
    ), f"{table.table_id}: the history's current versions differ from the mirror"
    seen: set[tuple[object, ...]] = set()
    for row in history.to_pylist():
        if row["__end_lsn"] is not None:
            assert row["__end_lsn"] >= row["__start_lsn"], row["__start_lsn"]
            # 'S': ended by a copy anew (pgcdc resync) at its point
            assert row["__end_op"] in ("U", "D", "T", "S") and not row["__is_current"]
        else:
            assert row["__end_op"] is None and row["__is_current"]
        version = (tuple(repr(row[k]) for k in table.keys), row["__start_lsn"])
        if table.replica_identity != "f":
            assert version not in seen, f"{table.table_id}: version {version} twice"
        seen.add(version)


def assert_changelog_exactly_once(
    layout: LakeLayout,
    tables: list[LakeTable],
    consistent_point: int,
    snapshot_rows: dict[str, int],
    audit: dict[int, AuditTxn],
    *,
    copied: dict[str, tuple[int, int]] | None = None,
) -> int:
    """The changelogs against the audit slot (see the module doc); how many changes matched.
    ``copied``: the tables added after the initial copy, each with its copy's point X and
    rows: its snapshot rows are that copy's, and its changes those of the transactions that
    ended after X."""
    copied = copied or {}
    names = {t.table_id for t in tables}
    since = {t: copied[t][0] if t in copied else consistent_point for t in names}
    lake: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
    ends: dict[int, set[int]] = defaultdict(set)
    for table in tables:
        data = DeltaTarget(table.path(layout, "changelog")).read()
        rows = data.select(["__op", "__commit_lsn", "__end_lsn", "__position", "__xid"]).to_pylist()
        snap = [r for r in rows if r["__op"] == "S"]
        expected_rows = (
            copied[table.table_id][1]
            if table.table_id in copied
            else snapshot_rows.get(table.table_id, 0)
        )
        assert len(snap) == expected_rows, (
            f"{table.table_id}: {len(snap)} snapshot rows in the changelog, the snapshot copied "
            f"{expected_rows}"
        )
        assert {r["__commit_lsn"] for r in snap} <= {since[table.table_id]}, table.table_id
        keys = Counter((r["__commit_lsn"], r["__position"]) for r in rows if r["__op"] != "S")
        twice = [k for k, n in keys.items() if n > 1]
        assert not twice, f"{table.table_id}: changes in the changelog twice: {twice[:5]}"
        for r in rows:
            if r["__op"] != "S":
                lake[r["__xid"]].append((r["__position"], table.table_id, r["__op"]))
                ends[r["__xid"]].add(r["__end_lsn"])
    expected: dict[int, list[tuple[str, str]]] = {}
    for txn in audit.values():
        changes = [c for c in txn.changes if c[0] in names and txn.end_lsn > since[c[0]]]
        if changes:
            expected[txn.xid] = changes
    missing = sorted(set(expected) - set(lake))
    extra = sorted(set(lake) - set(expected))
    assert not missing, f"transactions missing from the changelogs: {missing[:10]}"
    assert not extra, f"transactions in the changelogs the audit slot does not have: {extra[:10]}"
    matched = 0
    for xid, changes in expected.items():
        got = [(table, op) for _, table, op in sorted(lake[xid])]
        assert got == changes, f"xid {xid}: changelog {got[:20]} != audit {changes[:20]}"
        assert ends[xid] == {audit[xid].end_lsn}, f"xid {xid}: end LSN {ends[xid]}"
        matched += len(changes)
    return matched


@dataclass
class LakeReport:
    tables: int
    changes: int
    snapshot_rows: int
    generation: int


def check_lake(config: PipelineConfig, audit: dict[int, AuditTxn]) -> LakeReport:
    """Every check of the module doc against the lake ``config`` names."""
    pipeline = Pipeline(config)
    plan = pipeline.check()
    state = pipeline.state
    assert state is not None and state.snapshot_done and state.consistent_point is not None
    for check in compare_tables(pipeline.dsn, pipeline.layout, plan.tables):
        assert check.equal, check.describe()
    tables = list(plan.tables)
    for table in tables:
        if table.history:
            assert_history_consistent(pipeline.layout, table)
    copied = {
        table_id: (int(Lsn.parse(phase.copied_at)), phase.rows or 0)
        for table_id, phase in state.phases.items()
        if phase.copied_at is not None and not phase.again
    }
    # a table copied anew over its lake tables is left out: its changes between the old copy's
    # last batch and the new copy's point are in neither (the mirror and history checks hold)
    again = {t for t, p in state.phases.items() if p.again}
    changes = assert_changelog_exactly_once(
        pipeline.layout,
        [t for t in tables if t.changelog and t.table_id not in again],
        int(Lsn.parse(state.consistent_point)),
        state.snapshot_rows,
        audit,
        copied=copied,
    )
    return LakeReport(len(tables), changes, sum(state.snapshot_rows.values()), state.generation)


# -- the scenario --------------------------------------------------------------------------------


class WorkloadThread:
    """The randomized workload, running until stopped (schema changes once, if asked), and
    beside it a second writer whose transactions stay open while the first commits several:
    their messages then begin before commits already received (and perhaps confirmed)."""

    def __init__(self, dsn: str, seed: int, schema_change_after: int | None) -> None:
        self.workload = Workload(dsn, seed=seed)
        self.rng = random.Random(seed + 1)
        self.overlap_rng = random.Random(seed + 2)
        self.schema_change_after = schema_change_after
        self.transactions = 0
        self.overlapping = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name="chaos-workload", daemon=True),
            threading.Thread(target=self._overlap, name="chaos-overlap", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        try:
            with psycopg.connect(self.workload.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    if self.transactions == self.schema_change_after:
                        self.workload.schema_changes()
                    if self.rng.random() < 0.005:
                        self.workload.big_transaction(conn)
                    else:
                        self.workload.transaction(conn)
                    self.transactions += 1
                    # a few transactions a second: each run has something to catch up on,
                    # and the final run catches up in seconds
                    time.sleep(self.rng.uniform(0.05, 0.5))
        except BaseException as exc:
            self.error = exc

    def _overlap(self) -> None:
        """Long transactions on ``bulk`` (no other writer touches it: no lock waits)."""
        r = self.overlap_rng
        next_id = 10_000_000
        try:
            with psycopg.connect(self.workload.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    with conn.transaction():
                        for _ in range(r.randint(1, 3)):
                            conn.execute(
                                "INSERT INTO bulk VALUES (%s, %s)", (next_id, f"overlap {next_id}")
                            )
                            next_id += 1
                            conn.execute(
                                "UPDATE bulk SET payload = payload || '+' WHERE id = "
                                "(SELECT id FROM bulk ORDER BY random() LIMIT 1)"
                            )
                            # open while the other writer commits a few transactions
                            self._stop.wait(r.uniform(0.2, 2.0))
                    self.overlapping += 1
                    self._stop.wait(r.uniform(0.0, 0.5))
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
        if self.error is not None:
            raise AssertionError(f"the workload failed: {self.error!r}") from self.error


@dataclass
class ChaosReport:
    seed: int
    kills: int = 0
    clean_exits: int = 0
    snapshot_kill: bool = False
    stream_kills: int = 0
    stragglers: int = 0
    transactions: int = 0
    lake: LakeReport | None = None
    seconds: float = 0.0
    events: list[str] = field(default_factory=list)


def _in_snapshot(layout: LakeLayout) -> bool:
    try:
        state = json.loads(layout.state_file.read_text() or "{}")
    except (StorageError, ValueError):
        return False
    return bool(state.get("consistent_point")) and not state.get("snapshot_done")


def _stream_started(log: Path, offset: int) -> bool:
    with open(log, "rb") as f:
        f.seek(offset)
        return b"stream started" in f.read()


def run_chaos(
    dsn: str,
    workdir: Path,
    *,
    kills: int,
    seed: int,
    bulk_rows: int = 20_000,
    max_delay: float = 30.0,
    say: Callable[[str], None] = print,
    lake: str = "lake",
    lake_extra: str = "",
) -> ChaosReport:
    """The whole scenario on database ``dsn`` (empty), in ``workdir``, into the lake ``lake``
    (see ``write_config``); raises on a failed check."""
    started = time.monotonic()
    report = ChaosReport(seed)
    rng = random.Random(seed)
    say(f"chaos: seed {seed} (replay with {SEED_ENV}={seed}), {kills} kills")
    create_audit_slot(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(BULK % {"rows": int(bulk_rows)})  # the snapshot takes a while
    workload = WorkloadThread(dsn, seed, schema_change_after=rng.randint(20, 80))
    workload.workload.run(25)
    config = write_config(workdir, dsn, lake=lake, lake_extra=lake_extra)
    layout = LakeLayout(load_config(config).lake.location())
    log = workdir / "runs.log"
    workload.start()
    try:
        while report.kills < kills:
            until = rng.random() < 0.4
            offset = log.stat().st_size if log.exists() else 0
            proc = start_run(config, log, until_caught_up=until)
            first = report.kills == 0
            # the first kill lands in the initial snapshot, the second (and most later ones)
            # once the stream runs, the others anywhere (JVM start, snapshot, stream)
            streaming = report.kills == 1 or (report.kills > 1 and rng.random() < 0.6)
            if first:
                # the snapshot of the bulk rows takes about 1.2-1.5 s here (seed 37 drew 1.4 s
                # and killed the run after it): early in it, with room for faster machines
                delay = rng.uniform(0.0, 0.6)
            elif streaming:
                delay = rng.uniform(0.0, 8.0)
            else:
                delay = rng.uniform(1.0, max_delay)
            deadline = time.monotonic() + 300
            while first and not _in_snapshot(layout) and proc.poll() is None:
                assert time.monotonic() < deadline, "the snapshot did not start"
                time.sleep(0.05)
            while streaming and not _stream_started(log, offset) and proc.poll() is None:
                assert time.monotonic() < deadline, "the stream did not start"
                time.sleep(0.1)
            killed_at = time.monotonic() + delay
            while time.monotonic() < killed_at and proc.poll() is None:
                time.sleep(0.05)
            if proc.poll() is not None:
                if proc.returncode != 0 or not until:
                    raise AssertionError(
                        f"run exited {proc.returncode} by itself (seed {seed}):\n{log_tail(log)}"
                    )
                report.clean_exits += 1
                report.events.append(f"run {'until' if until else 'cont'} exited 0")
                continue
            if _in_snapshot(layout):
                phase = "snapshot"
            elif _stream_started(log, offset):
                phase = "stream"
                report.stream_kills += 1
            else:
                phase = "start"
            report.snapshot_kill |= phase == "snapshot"
            report.stragglers += kill_group(proc)
            report.kills += 1
            event = (
                f"kill {report.kills}: {'until-caught-up' if until else 'continuous'} run after "
                f"{delay:.1f}s ({phase})"
            )
            report.events.append(event)
            say(event)
    finally:
        workload.stop()
    report.transactions = workload.transactions + workload.overlapping
    proc = start_run(config, log, until_caught_up=True, verify=True)
    try:
        code = proc.wait(600)
    finally:
        kill_group(proc)
    assert code == 0, f"the final run failed (exit {code}, seed {seed}):\n{log_tail(log)}"
    report.lake = check_lake(load_config(config), audit_transactions(dsn))
    report.seconds = time.monotonic() - started
    say(
        f"chaos: seed {seed}: {report.kills} kills ({report.clean_exits} clean exits), "
        f"{report.stream_kills} while streaming, {report.transactions} transactions, "
        f"{report.lake.changes} changes checked exactly once, "
        f"snapshot generation {report.lake.generation}, {report.seconds:.0f}s"
    )
    return report
