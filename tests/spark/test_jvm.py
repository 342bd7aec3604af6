"""The driver JVM's class data sharing archive (pgcdc.spark.jvm), with real JVMs.

A session's JVM writes the archive when it exits and the next session's JVM maps it; one writer
at a time; an archive that does not map (truncated) is never installed. The JVM is launched deaf
to SIGTERM, and nothing else is.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.spark.jvm import (
    ArchiveWriter,
    JavaLaunch,
    archive_usable,
    deaf_to_sigterm,
    java_binary,
    launch_options,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SESSION = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pyspark import SparkContext
    from pgcdc.spark import spark_session

    spark = spark_session("local[1]", "pgcdc-jvm-test")
    assert spark.range(5).count() == 5
    pid = SparkContext._gateway.proc.pid
    maps = Path(f"/proc/{pid}/maps").read_text()
    print("mapped:" + ",".join(sorted({line.split()[-1] for line in maps.splitlines()
                                      if line.endswith(".jsa")})))
    """
)


def _session(cache: Path) -> str:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT / "src"))
    env.pop("SPARK_HOME", None)
    env.pop("PGCDC_JVM_CDS", None)
    result = subprocess.run(
        [sys.executable, "-c", SESSION],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    mapped = [line for line in result.stdout.splitlines() if line.startswith("mapped:")]
    assert mapped, result.stdout
    return mapped[0].removeprefix("mapped:")


def test_a_session_writes_the_archive_at_exit_and_the_next_one_maps_it(tmp_path: Path) -> None:
    folder = tmp_path / "pgcdc"
    first = _session(tmp_path)
    archives = sorted(folder.glob("spark-classes-*.jsa"))
    assert len(archives) == 1, sorted(p.name for p in folder.iterdir())
    assert str(archives[0]) not in first  # the first JVM wrote it, without one to map
    # nothing left of the writing: no temporary file, no lock
    assert not list(folder.glob(".writing-*")) and not list(folder.glob("*.lock"))
    second = _session(tmp_path)
    assert str(archives[0]) in second.split(",")


def test_one_writer_at_a_time_and_settings_that_choose_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGCDC_JVM_CDS", raising=False)
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "a.jar").write_bytes(b"jar")
    roots = [tmp_path / "cache"]
    launch = launch_options(home, {}, roots)
    assert launch is not None and launch.writer is not None
    assert any(o.startswith("-XX:ArchiveClassesAtExit=") for o in launch.options)
    # the lock names this (live) process: nobody else writes meanwhile
    assert launch_options(home, {}, roots) is None
    assert launch.writer.finish(None) is False  # no JVM: nothing installed, the lock released
    again = launch_options(home, {}, roots)
    assert again is not None and again.writer is not None
    again.writer.finish(None)
    # a lock of a process that is gone is taken over
    again.writer.lock.write_text("999999999")
    taken = launch_options(home, {}, roots)
    assert taken is not None and taken.writer is not None
    taken.writer.finish(None)
    # ... and one of a process gone whose pid came round again (this one: another start time)
    taken.writer.lock.write_text(f"{os.getpid()} 1")
    reused = launch_options(home, {}, roots)
    assert reused is not None and reused.writer is not None
    reused.writer.finish(None)
    assert not reused.writer.lock.exists()
    # a cache folder whose path has white space: Spark would split the JVM option there
    assert launch_options(home, {}, [tmp_path / "my cache"]) is None
    # an archive made for these settings is mapped; other jars make another archive
    archive = again.writer.archive
    archive.write_bytes(b"archive")
    os.utime(archive, (0, 0))
    assert launch_options(home, {}, roots) == JavaLaunch(
        ("-Xlog:cds*=off", f"-XX:SharedArchiveFile={archive}")
    )
    assert archive.stat().st_mtime > time.time() - 60  # touched: in use
    other = launch_options(home, {"spark.jars": "/x.jar"}, roots)
    assert other is not None and other.writer is not None and other.writer.archive != archive
    other.writer.finish(None)
    # settings that choose for themselves, and the switch
    assert launch_options(home, {"spark.driver.extraJavaOptions": "-Xshare:off"}, roots) is None
    monkeypatch.setenv("PGCDC_JVM_CDS", "0")
    assert launch_options(home, {}, roots) is None


def test_an_archive_that_does_not_map_is_never_installed(spark: Any, tmp_path: Path) -> None:
    java = java_binary()
    assert java is not None
    source = tmp_path / "made.jsa"
    made = subprocess.run(
        [str(java), "-Xlog:cds*=off", f"-XX:ArchiveClassesAtExit={source}", "-version"],
        capture_output=True,
        check=False,
        cwd=tmp_path,
    )
    assert made.returncode == 0 and source.stat().st_size > 0, made.stderr
    assert archive_usable(java, source)
    truncated = tmp_path / "truncated.jsa"
    truncated.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    assert not archive_usable(java, truncated)  # it would crash the JVM that maps it
    assert not list(tmp_path.glob("hs_err*"))

    def finish(content: Path) -> tuple[bool, ArchiveWriter]:
        temporary = tmp_path / ".writing-x.1.jsa"
        shutil.copyfile(content, temporary)
        lock = tmp_path / "x.lock"
        lock.write_text(str(os.getpid()))
        writer = ArchiveWriter(java, temporary, tmp_path / "x.jsa", lock)
        # a process that exits 0 when its stdin closes, as Spark's gateway JVM does
        stand_in = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        return writer.finish(stand_in), writer

    installed, writer = finish(truncated)
    assert not installed and not writer.archive.exists()
    assert not writer.temporary.exists() and not writer.lock.exists()
    # installing one removes the archives nobody used for a month, and no other
    old, recent = tmp_path / "spark-classes-old.jsa", tmp_path / "spark-classes-recent.jsa"
    old.write_bytes(b"old")
    recent.write_bytes(b"recent")
    month_ago = time.time() - 31 * 86400
    os.utime(old, (month_ago, month_ago))
    # ... and what writers of other archives, gone, left a day ago or more
    left = [tmp_path / ".writing-spark-classes-gone.77.jsa", tmp_path / "spark-classes-gone.lock"]
    fresh = [tmp_path / ".writing-spark-classes-busy.78.jsa", tmp_path / "spark-classes-busy.lock"]
    for path in left + fresh:
        path.write_bytes(b"x")
    for path in left:
        os.utime(path, (time.time() - 2 * 86400,) * 2)
    installed, writer = finish(source)
    assert installed and writer.archive.read_bytes() == source.read_bytes()
    assert not writer.temporary.exists() and not writer.lock.exists()
    assert not old.exists() and recent.exists()
    assert not any(p.exists() for p in left) and all(p.exists() for p in fresh)
    # finishing leaves this process's Spark alone (spark_session's exit hook stops it first)
    assert spark.range(3).count() == 3


def _child_ignores_sigterm() -> bool:
    """Whether a process started here (as pyspark starts the JVM: with a ``preexec_fn``)
    begins with SIGTERM ignored."""
    status = subprocess.run(
        ["grep", "SigIgn", "/proc/self/status"],
        preexec_fn=lambda: None,  # a fork with at-fork hooks, as pyspark launches the JVM
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return bool(int(status.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def test_only_what_the_launching_thread_starts_is_deaf_to_sigterm() -> None:
    """Inside ``deaf_to_sigterm`` the processes this thread starts ignore SIGTERM; this process
    keeps its own handling, and processes other threads start meanwhile are unaffected."""
    own = signal.getsignal(signal.SIGTERM)
    assert not _child_ignores_sigterm()
    with deaf_to_sigterm():
        assert _child_ignores_sigterm()
        other: list[bool] = []
        thread = threading.Thread(target=lambda: other.append(_child_ignores_sigterm()))
        thread.start()
        thread.join(30)
        assert other == [False]
        assert signal.getsignal(signal.SIGTERM) is own
    assert not _child_ignores_sigterm()
