"""Kill -9 of ``pgcdc run`` at each dangerous point of the indexed write, then a restart: the
lake loses and doubles nothing (issue 44).

The chaos suite (test_kill.py) kills runs at random moments; these kills land where a crash
leaves the indexed write half done (``pgcdc.lake.write.batch.KILL_POINTS``, asked for through
``$PGCDC_TEST_KILL_AT``: the run logs a marker line, then SIGKILLs its process group):

* ``index-rebuild``: the key indexes (their folder deleted first) rebuilt from the tables by
  the Spark job, not saved;
* ``data-files``: every Delta table's new Parquet files written, no index segment, no commit;
* ``index-segment``: a table's deletion vectors and index segment written, not its commit;
* ``between-commits``: a Delta table's commit about to start once another commit of the
  batch is in (a third table joins that batch: nine Delta tables, more than the commits that
  run at a time, so that the ninth waits for one of the others to end);
* ``closed-copies``: the histories' ended versions copied into new files, not committed.

One lake (tables with keys, one of them composite, one of text; TOASTed values; mirror,
history and changelog each) goes through the points in turn, each kill in a batch of its own:
the batch's changes (updates that leave the TOASTed value unchanged, key changes, deletes, a
key deleted and inserted again in one transaction, a key updated twice, inserts), then a run
that restarts after the previous kill (it applies the killed batch again, all of it: checked)
and is killed at the point in the next batch (``point@N``). Each kill is checked: the run died
by SIGKILL after the marker line, and the lake is in the state the point names. A last run
restarts after the last kill, then the chaos suite's checks (``check_lake``): every mirror
equals its source, every history's current versions equal the mirror, every changelog holds
each change the audit slot decoded exactly once. A lost or doubled change stays in the lake
until that check (the changelogs are append-only; a doubled key of a mirror or history stays
doubled), so one check at the end sees what any kill did.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pgcdc.cli import main
from pgcdc.lake.config import ConfigError, load_config
from pgcdc.lake.store.state import load_state
from pgcdc.lake.store.tables import LakeLayout
from pgcdc.lake.write.batch import COMMIT_THREADS, KILL_ENV, KILL_POINTS, SYNC_KILL_POINTS
from tests.chaos.harness import (
    audit_transactions,
    check_lake,
    create_audit_slot,
    kill_group,
    log_tail,
    start_run,
    write_config,
)
from tests.fix_pg import PgDatabase, newest_server

SCHEMA = """
CREATE TABLE a (id int PRIMARY KEY, v int, t text, big text);
ALTER TABLE a ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE b (k1 int, k2 text, v bigint, big text, PRIMARY KEY (k1, k2));
ALTER TABLE b ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE c (k text PRIMARY KEY, v int);
INSERT INTO c SELECT 'k' || g, g FROM generate_series(1, 50) g;
INSERT INTO a SELECT g, g, 'row ' || g,
    CASE WHEN g % 3 = 0 THEN repeat(md5(g::text), 200) END FROM generate_series(1, 300) g;
INSERT INTO b SELECT g, CASE WHEN g % 2 = 0 THEN 'x' ELSE 'ü' END, g,
    CASE WHEN g % 4 = 0 THEN repeat(md5(g::text), 200) END FROM generate_series(1, 100) g;
"""


def delta_tables(*names: str) -> frozenset[str]:
    """The Delta tables (folders under the lake) of source tables ``names``."""
    return frozenset(f"public/{t}{kind}" for t in names for kind in ("", ".history", ".changelog"))


#: the Delta tables most batches write, and those the batch of "between-commits" writes
TABLES = delta_tables("a", "b")
EVERY_TABLE = delta_tables("a", "b", "c")
HISTORIES = {"public/a.history", "public/b.history"}
INDEXES = "_pgcdc/index"

#: the kills in order: the rebuild first, in a run that starts after a clean one (a run that
#: restarts after a kill has its indexes in memory by the time its next batch starts)
SEQUENCE = ("index-rebuild", "data-files", "index-segment", "between-commits", "closed-copies")
#: which of them a run takes (comma-separated; ``all``): ``make chaos`` takes all, the suite
#: (``make test``) two of the three where a batch is half committed, each run of a JVM being
#: costly: which two turns with the day (printed; ask for them again through ``POINTS_ENV``)
POINTS_ENV = "PGCDC_CHAOS_KILL_POINTS"
HALF_COMMITTED = ("data-files", "index-segment", "between-commits")


def suite_points(day: int) -> tuple[str, ...]:
    """The two half-committed points the suite kills at on ``day`` (a date's ordinal)."""
    left_out = HALF_COMMITTED[day % len(HALF_COMMITTED)]
    return tuple(point for point in HALF_COMMITTED if point != left_out)


def chosen_points() -> tuple[str, ...]:
    """The points of ``SEQUENCE`` this run kills at (``POINTS_ENV``), in its order."""
    default = ",".join(suite_points(datetime.date.today().toordinal()))
    asked = os.environ.get(POINTS_ENV, default).strip()
    if asked == "all":
        return SEQUENCE
    names = {name.strip() for name in asked.split(",") if name.strip()}
    unknown = names - set(SEQUENCE)
    assert not unknown, f"{POINTS_ENV}: no kill point {sorted(unknown)} (known: {SEQUENCE})"
    return tuple(point for point in SEQUENCE if point in names)


def make_changes(dsn: str, step: int) -> None:
    """One batch's changes of both tables (``step``: which kill's, so that keys differ)."""
    s = step
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():  # TOASTed values unchanged
            conn.execute("UPDATE a SET v = v + 1, t = %s WHERE id %% 7 = %s", (f"step {s}", s))
            conn.execute(
                "INSERT INTO a SELECT g, g, 'new', repeat(md5(g::text), 200) "
                "FROM generate_series(%s::int, %s::int) g",
                (1000 * (s + 1), 1000 * (s + 1) + 4),
            )
        with conn.transaction():  # a key change (its TOASTed value unchanged), deletes
            conn.execute("UPDATE a SET id = id + 100000 WHERE id = %s", (99 + s * 3,))
            conn.execute("DELETE FROM a WHERE id IN (%s, %s)", (200 + s, 250 + s))
        with conn.transaction():  # a key deleted and inserted again
            conn.execute("DELETE FROM a WHERE id = %s", (150 + s,))
            conn.execute("INSERT INTO a VALUES (%s, -1, 'again', NULL)", (150 + s,))
        for _ in range(2):  # a key's version opened and ended in the batch
            conn.execute("UPDATE a SET v = v + 10 WHERE id = 2")
        with conn.transaction():
            conn.execute("UPDATE b SET v = v * 2 WHERE k1 %% 5 = %s", (s,))
            conn.execute("UPDATE b SET k2 = k2 || '+' WHERE k1 = %s", (50 + s,))
            conn.execute("DELETE FROM b WHERE k1 = %s", (80 + s,))
            conn.execute(
                "INSERT INTO b SELECT g, 'n', g, repeat(md5(g::text), 200) "
                "FROM generate_series(%s::int, %s::int) g",
                (1000 * (s + 1), 1000 * (s + 1) + 2),
            )


def change_c(dsn: str) -> None:
    """Changes of table ``c``: its three Delta tables join the batch."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("UPDATE c SET v = -v WHERE v % 4 = 0")
        conn.execute("UPDATE c SET k = k || '+' WHERE k = 'k7'")
        conn.execute("DELETE FROM c WHERE k = 'k9'")
        conn.execute("INSERT INTO c VALUES ('new', 1)")


def held(lake: Path, app_id: str) -> dict[str, int]:
    """Each Delta table's newest batch (its commits' application transaction ``app_id``)."""
    out = {}
    for table in EVERY_TABLE:
        newest = -1
        for path in (lake / table / "_delta_log").glob("*.json"):
            for line in path.read_text().splitlines():
                txn = json.loads(line).get("txn")
                if txn is not None and txn["appId"] == app_id:
                    newest = max(newest, int(txn["version"]))
        out[table] = newest
    return out


def written(lake: Path, tag: str) -> set[str]:
    """The Delta tables with data files a writer task tagged ``tag`` (``b<batch>``: the
    batch's rows; ``b<batch>c``: a history's ended versions) wrote."""
    return {
        str(p.parent.relative_to(lake)) for p in lake.glob(f"public/*/part-*-{tag}.snappy.parquet")
    }


def orphan_segments(lake: Path) -> dict[Path, str]:
    """Index segments no commit of their Delta table names (the segment's token is in the
    commit's metadata), with their Delta table."""
    out = {}
    for seg in sorted((lake / INDEXES).rglob("seg-*.json")):
        table = str(seg.parent.relative_to(lake / INDEXES))
        token = seg.name[len("seg-") : -len(".json")]
        logs = (lake / table / "_delta_log").glob("*.json")
        if not any(token in p.read_text() for p in logs):
            out[seg] = table
    return out


def assert_killed_state(
    point: str, lake: Path, *, batch: int, app_id: str, orphans_before: set[Path], marker: str
) -> None:
    """The lake as a kill at ``point`` of ``batch`` leaves it: what the point names is
    written, what comes after it is not (``orphans_before``: segments no commit names that
    earlier kills left; ``marker``: the kill's marker line)."""
    holding = {t for t, b in held(lake, app_id).items() if b >= batch}
    new = {p: t for p, t in orphan_segments(lake).items() if p not in orphans_before}
    orphans = set(new.values())
    if point == "index-rebuild":
        assert not holding, holding
        assert not [p for p in (lake / INDEXES).rglob("*") if p.is_file()], "an index was saved"
        assert not written(lake, f"b{batch}"), "the batch's files were written"
    elif point == "data-files":
        assert not holding, holding
        assert written(lake, f"b{batch}") == TABLES
        assert not orphans, f"index segments written: {sorted(orphans)}"
    elif point == "index-segment":
        # the killing thread's table: its deletion vectors and segment, no commit (the other
        # tables' commits run beside it: some may be in)
        assert orphans - holding, f"segments of {sorted(orphans)}, commits of {holding}"
        # the rows the batch replaced are marked: files with new deletion vectors
        changed = [json.loads(p.read_text())["updated"] for p, t in new.items() if t not in holding]
        assert any(changed), "no deletion vector in the segments"
    elif point == "between-commits":
        assert holding, "no Delta table has the batch's commit"
        # the table whose commit was to start (``public.c changelog``) has not
        table, kind = re.findall(r"\(public\.(\w+) (\w+)\)", marker)[0]
        waiting = f"public/{table}" + ("" if kind == "mirror" else f".{kind}")
        assert waiting not in holding, (waiting, holding)
    elif point == "closed-copies":
        assert not holding, holding
        assert written(lake, f"b{batch}") == TABLES
        assert written(lake, f"b{batch}c") == set(HISTORIES)
        assert not orphans, f"index segments written: {sorted(orphans)}"


def run_to_end(config: Path, log: Path) -> None:
    """``pgcdc run --until-caught-up``, which must end well."""
    proc = start_run(config, log, until_caught_up=True)
    try:
        code = proc.wait(600)
    finally:
        kill_group(proc)
    assert code == 0, f"the run failed (exit {code}):\n{log_tail(log)}"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # seven runs, each starting a JVM: past 600 s on a busy machine
@newest_server
def test_kill_9_at_each_point_of_the_indexed_write_loses_and_doubles_nothing(
    pg: PgDatabase, tmp_path: Path
) -> None:
    assert sorted(SEQUENCE) == sorted(KILL_POINTS)
    dsn = pg.dsn()
    create_audit_slot(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    config = write_config(tmp_path, dsn)
    lake, log = tmp_path / "lake", tmp_path / "runs.log"
    run_to_end(config, log)  # the initial copy
    state = load_state(LakeLayout(load_config(config).lake.location()))
    assert state is not None
    app_id = state.stream_app_id
    killed: int | None = None
    timings = []
    touched: frozenset[str] = frozenset()  # the Delta tables the killed batch writes
    points = chosen_points()
    print("kill points:", ", ".join(points))
    for step, point in enumerate(points):
        make_changes(dsn, step)
        if point == "between-commits":
            assert len(EVERY_TABLE) > COMMIT_THREADS, "the ninth commit would not wait"
            change_c(dsn)
        if point == "index-rebuild":  # every index is then rebuilt from its table
            shutil.rmtree(lake / INDEXES)
        offset = log.stat().st_size
        started = time.monotonic()
        kill = point if killed is None else f"{point}@{killed + 1}"
        orphans = set(orphan_segments(lake))
        proc = start_run(config, log, until_caught_up=True, env={KILL_ENV: kill})
        try:
            code = proc.wait(600)
        finally:
            # pyspark's daemon and its workers lead a process group of their own: they end
            # when the JVM's sockets close, as after any crash; reaped here as the chaos
            # suite reaps them
            kill_group(proc)
        timings.append(f"{point} {time.monotonic() - started:.0f}s")
        with open(log, "rb") as f:
            f.seek(offset)
            output = f.read().decode(errors="replace")
        assert code == -signal.SIGKILL, f"{point}: the run ended {code}:\n{log_tail(log)}"
        marker = re.search(rf"test kill point {point} reached in batch (\d+).*", output)
        assert marker is not None, f"{point}: no marker line:\n{log_tail(log)}"
        batch = int(marker.group(1))
        if killed is not None:  # this run restarted after the previous kill: its batch is in
            assert batch > killed
            holding = held(lake, app_id)
            assert all(holding[t] >= killed for t in touched), (point, killed, holding)
        assert_killed_state(
            point, lake, batch=batch, app_id=app_id, orphans_before=orphans, marker=marker.group(0)
        )
        killed = batch
        touched = EVERY_TABLE if point == "between-commits" else TABLES
    run_to_end(config, log)
    report = check_lake(load_config(config), audit_transactions(dsn))
    assert report.changes > 0
    print("kill runs:", ", ".join(timings))


#: a table created after the initial copy: the next run copies it beside the stream
JOINING = """
CREATE TABLE d (id int PRIMARY KEY, v int, big text);
ALTER TABLE d ALTER COLUMN big SET STORAGE EXTERNAL;
INSERT INTO d SELECT g, g, CASE WHEN g % 5 = 0 THEN repeat(md5(g::text), 200) END
    FROM generate_series(1, 3000) g;
"""


class JoiningLoad:
    """Changes of ``d`` (inserts, updates leaving its TOASTed value unchanged, deletes) and of
    ``a``, a transaction every 20 ms, until stopped: the stream keeps ``d``'s aside while it is
    copied, and applies ``a``'s. Its keys start at ``first``."""

    def __init__(self, dsn: str, first: int = 100_000) -> None:
        self.dsn = dsn
        self.first = first
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        key = self.first
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stopping.is_set():
                    with conn.transaction():
                        conn.execute("INSERT INTO d VALUES (%s, 0, NULL)", (key,))
                        conn.execute("UPDATE d SET v = v + 1 WHERE id = %s", (key % 3000 + 1,))
                        conn.execute("DELETE FROM d WHERE id = %s", (key - 50,))
                        conn.execute("UPDATE a SET v = v + 1 WHERE id = %s", (key % 300 + 1,))
                    key += 1
                    time.sleep(0.02)
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> JoiningLoad:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(60)
        assert not self.errors, self.errors


@pytest.mark.slow
@pytest.mark.timeout(1800)
@newest_server
def test_kill_9_while_a_table_joins_loses_and_doubles_nothing(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """A table created after the initial copy, copied beside the stream while it and another
    table take changes: a run killed as its copy landed (not recorded: the next run copies it
    again), then one killed as the last changes kept aside were applied (the table not yet
    recorded as streamed: the next run goes on from what its Delta tables hold), then a run
    to the end; the chaos checks hold (the changelog of the joining table holds its copy's
    rows and each change committed after the copy's point once). Then ``pgcdc resync`` of
    that table under the same load, its run killed as the new copy replaced the old one in
    its Delta tables (not recorded: the next run copies it anew again); the mirror and
    history checks hold."""
    dsn = pg.dsn()
    create_audit_slot(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    config = write_config(tmp_path, dsn)
    lake, log = tmp_path / "lake", tmp_path / "runs.log"
    run_to_end(config, log)
    layout = LakeLayout(load_config(config).lake.location())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(JOINING)
    with JoiningLoad(dsn):
        time.sleep(1)
        expected = {"sync-landed": "copying", "sync-caught-up": "catching-up"}
        for point in SYNC_KILL_POINTS:
            offset = log.stat().st_size
            proc = start_run(config, log, until_caught_up=True, env={KILL_ENV: point})
            try:
                code = proc.wait(600)
            finally:
                kill_group(proc)
            with open(log, "rb") as f:
                f.seek(offset)
                output = f.read().decode(errors="replace")
            assert code == -signal.SIGKILL, f"{point}: the run ended {code}:\n{log_tail(log)}"
            assert f"test kill point {point} reached (public.d)" in output, log_tail(log)
            state = load_state(layout)
            assert state is not None and "public.d" not in state.tables
            assert state.phases["public.d"].phase == expected[point], state.phases
        time.sleep(2)
    assert (lake / "_pgcdc" / "held").exists()
    run_to_end(config, log)
    state = load_state(layout)
    assert state is not None and state.phases["public.d"].phase == "streaming"
    assert state.phases["public.d"].attempt == 2  # copied again after the first kill
    report = check_lake(load_config(config), audit_transactions(dsn))
    assert report.changes > 0
    assert not [p for p in (lake / "_pgcdc" / "held").rglob("*.parquet")]

    with JoiningLoad(dsn, first=200_000):  # keys the first load did not reach
        assert main(["resync", "--config", str(config), "public.d"]) == 0
        time.sleep(1)
        proc = start_run(config, log, until_caught_up=True, env={KILL_ENV: "sync-landed"})
        try:
            code = proc.wait(600)
        finally:
            kill_group(proc)
        assert code == -signal.SIGKILL, f"the resync's run ended {code}:\n{log_tail(log)}"
        state = load_state(layout)
        assert state is not None and state.phases["public.d"].phase == "copying"
        assert state.phases["public.d"].again
        time.sleep(2)
    run_to_end(config, log)
    state = load_state(layout)
    assert state is not None and state.phases["public.d"].phase == "streaming"
    assert state.phases["public.d"].attempt == 4  # the resync's copy, killed, then again
    check_lake(load_config(config), audit_transactions(dsn))


def test_an_unknown_kill_point_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt kill point fails the run instead of running without the kill."""
    from pgcdc.lake.run.pipeline import Pipeline
    from pgcdc.lake.write.batch import KillAt

    config = load_config(write_config(tmp_path, "host=/nowhere dbname=none"))
    for wrong in ("data_files", "data-files@", "data-files@x"):
        monkeypatch.setenv(KILL_ENV, wrong)
        with pytest.raises(ConfigError, match="no kill point"):
            Pipeline(config)
    monkeypatch.setenv(KILL_ENV, "data-files@3")
    assert Pipeline(config).kill_at == KillAt("data-files", 3)
    monkeypatch.delenv(KILL_ENV)
    assert Pipeline(config).kill_at is None
