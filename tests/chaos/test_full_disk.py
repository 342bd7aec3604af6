"""A full disk under a running pipeline (issue 41): the lake is a small tmpfs, filled while
``pgcdc run`` streams, so that the next batch (or its checkpoint) fails with ENOSPC. The run
stops with "No space left on device", the path and the fix, and no Java stack trace; ``pgcdc
status`` shows the failure although the lake's state could not take it (it was kept outside
the lake); once the space is free again, the next run applies everything and the mirror equals
the source."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcdc.cli import main
from pgcdc.lake.config import load_config
from pgcdc.lake.store.state import load_state
from pgcdc.lake.store.tables import LakeLayout
from tests.fix_pg import PgDatabase, newest_server

pytestmark = pytest.mark.slow

CONFIG = """\
[source]
dsn = "{dsn}"
slot = "disk_slot"
publication = "disk_pub"

[lake]
path = "{lake}"

[spark]
master = "local[2]"

[stream]
trigger_interval = 0.5

[[tables]]
name = "items"
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs: a file system of its own that fills for real."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the suite runs as root)")
    folder = tmp_path / "lake"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "pgcdc-small-disk", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def streaming(pg: PgDatabase, layout: LakeLayout) -> bool:
    """Whether the copy is done, the stream's query started (its checkpoint's metadata) and
    its source reads the slot."""
    state = load_state(layout)
    if state is None or not state.snapshot_done:
        return False
    if not (state.checkpoint(layout) / "metadata").local().is_file():
        return False
    active = "SELECT active FROM pg_replication_slots WHERE slot_name = 'disk_slot'"
    return pg.execute(active) == [(True,)]


def status(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["status", "--config", str(config), "--json"])
    return code, json.loads(capsys.readouterr().out)


@newest_server
@pytest.mark.usefixtures("spark")  # the runs share the suite's Spark
def test_a_full_disk_names_its_cause_and_status_shows_it(
    pg: PgDatabase,
    small_disk: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    notes = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(notes))  # where the failure is kept
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
    pg.execute("INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 500) g")
    config = tmp_path / "pipeline.toml"
    config.write_text(CONFIG.format(dsn=pg.dsn(), lake=small_disk))
    layout = LakeLayout(load_config(config).lake.location())

    codes: list[int] = []
    run = threading.Thread(
        target=lambda: codes.append(main(["run", "--config", str(config)])), daemon=True
    )
    run.start()  # the copy, then the stream
    deadline = time.monotonic() + 300
    while not streaming(pg, layout):
        assert run.is_alive() and time.monotonic() < deadline, capsys.readouterr().err[-3000:]
        time.sleep(0.2)
    # all but two pages: the next batch's offset log may still fit, its Parquet files do not
    room = os.statvfs(small_disk)
    with open(small_disk / "filler", "wb") as filler:
        os.posix_fallocate(filler.fileno(), 0, room.f_bavail * room.f_frsize - 8192)
    pg.execute(  # 320 kB that do not compress
        "UPDATE items SET note = array_to_string("
        "ARRAY(SELECT md5(random()::text || id) FROM generate_series(1, 20)), '')"
    )
    run.join(300)
    assert not run.is_alive(), "the run went on with a full disk"
    err = capsys.readouterr().err
    said = " ".join(err.split())
    assert codes == [1], said[-3000:]
    assert "No space left on device" in said, said[-3000:]
    # the path, in the lake: a table's folder, or the checkpoint if the batch was not planned
    where = rf"writing (the streaming checkpoint in )?{re.escape(str(small_disk))}/"
    assert re.search(where, said), said[-3000:]
    assert "Fix: free space on the file system that holds" in said, said[-3000:]
    for java in ("Traceback", "\tat ", "Caused by", "Py4J", "SparkException"):
        assert java not in err, err[-3000:]

    code, report = status(config, capsys)
    assert code == 1 and report["state"] == "failing", report["problems"]
    failure = report["stream"]["last_failure"]
    assert failure["standing"] and "No space left on device" in failure["cause"], failure
    assert "free space" in failure["fix"]
    # the lake's state could not be written: the failure was kept outside the lake
    kept = Path(failure["kept_outside_lake"])
    assert kept.parent == notes / "pgcdc" and kept.is_file(), failure
    assert "No space left on device" in failure["state_error"], failure
    (problem,) = report["problems"]
    assert "could not be written" in problem and "Fix: free space" in problem, problem

    (small_disk / "filler").unlink()
    argv = ["run", "--config", str(config), "--until-caught-up", "--verify"]
    assert main(argv) == 0
    assert "public.items: equal; source 500 rows" in capsys.readouterr().err
    code, report = status(config, capsys)
    assert code == 0 and report["stream"]["last_failure"] is None, report["problems"]
    assert not kept.exists()
