"""How the driver JVM is launched: with a class data sharing archive (Spark's classes mapped
from one file at start), and deaf to SIGTERM (``deaf_to_sigterm``, at the end).

A JVM starting a Spark session loads, parses and verifies some 15,000 classes from Spark's jars:
most of a local session's start-up, and most of its CPU on a small machine. Since JDK 13 a JVM
can write the classes it loaded to an archive when it exits (``-XX:ArchiveClassesAtExit``), and
a later JVM maps that archive instead (``-XX:SharedArchiveFile``), which starts faster and
with less CPU.

``launch_options`` gives the options for the JVM about to be launched, under a cache folder (the
one ``pgcdc.spark.session.python_spark_home`` uses; ``spark_session`` applies them):

* an archive made for this JDK, these Spark jars and this class path and these JVM options (its
  name is their digest) is mapped;
* else one JVM at a time (a lock file naming its process) writes one when it exits, to a
  temporary file. At Python exit, Spark is stopped and ``ArchiveWriter.finish`` lets the JVM
  exit and, if it exited cleanly, checks the file with a throwaway JVM (a truncated archive
  crashes the JVM that maps it) before renaming it into place. Writing takes a while, once;
  temporary files of writers that died are removed by later ones, and so are
  archives unused for ``UNUSED_DAYS`` (each use touches its archive).

The JVM ignores an archive it cannot use (another JDK, class path or options), quietly: the
options turn its ``cds`` log off. ``PGCDC_JVM_CDS=0`` (or ``class_data_sharing=False``) turns
the archive off.

``deaf_to_sigterm``: the driver JVM launched inside it starts with SIGTERM ignored, and so does
every process it starts (Spark's Python daemons and workers inherit the disposition; the daemon
module ``pgcdc.spark.daemon`` keeps it). A service manager's stop signal, sent to the process
group (``timeout``, a terminal's job control, an init that forwards it) or to every process of
the service (systemd's ``KillMode=control-group``), then reaches only the Python process that
started Spark, which stops it after the batch in progress. Spark's processes still end with
that process, however it ends: the JVM exits when its standard input (a pipe from its parent)
closes, and its Python processes when the JVM closes their sockets or pipes. SIGKILL reaches
them all. pyspark launches the JVM with SIGINT ignored already, for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ArchiveWriter",
    "JavaLaunch",
    "archive_usable",
    "deaf_to_sigterm",
    "java_binary",
    "launch_options",
]

log = logging.getLogger("pgcdc.spark")

#: the settings that change the class path or the JVM the archive is made for
_CLASS_PATH_SETTINGS = (
    "spark.jars",
    "spark.jars.packages",
    "spark.jars.repositories",
    "spark.driver.extraClassPath",
    "spark.driver.userClassPathFirst",
    "spark.driver.extraJavaOptions",
)
#: quiet: an archive the JVM cannot use is ignored without a warning, and writing one does not
#: list every class it skips
QUIET = "-Xlog:cds*=off"
#: temporary archives are named ``.writing-<stem>.<pid>.jsa`` (the writer's process)
_TEMPORARY_PREFIX = ".writing-"
#: archives (for other JDKs, jars or options) not used for this long are removed when another
#: is written; each use touches its archive
UNUSED_DAYS = 30


def java_binary() -> Path | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return candidate if candidate.is_file() else None
    found = shutil.which("java")
    return Path(found) if found else None


def _stat_line(path: Path) -> str:
    try:
        info = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path.resolve()}:{info.st_size}:{info.st_mtime_ns}"


def archive_digest(java: Path, spark_home: Path, conf: Mapping[str, str]) -> str:
    """What an archive is made for: the JDK, every jar of Spark, the class path settings."""
    parts = [_stat_line(java)]
    jars = spark_home / "jars"
    with contextlib.suppress(OSError):
        parts += sorted(_stat_line(entry) for entry in jars.iterdir())
    parts += [f"{key}={conf.get(key, '')}" for key in _CLASS_PATH_SETTINGS]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22), or ''."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else ""


def _lock_token() -> str:
    """What a lock file of this process holds: its pid and start time, so that another process
    given the same pid later (a writer killed, in a container) does not pass for the writer."""
    return f"{os.getpid()} {_started(os.getpid())}".strip()


def _lock_owner_alive(token: str) -> bool:
    parts = token.split()
    if not parts or not parts[0].isdigit() or int(parts[0]) <= 0:
        return False
    pid = int(parts[0])
    if not _alive(pid):
        return False
    return len(parts) < 2 or _started(pid) in ("", parts[1])


def _take_lock(lock: Path) -> bool:
    """Whether this process may write the archive: a lock file naming it, taken atomically; a
    lock whose process is gone is taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = lock.read_text()
            except OSError:
                owner = ""
            if not owner.strip():  # being written this very moment by the process that took it
                time.sleep(0.05)
                with contextlib.suppress(OSError):
                    owner = lock.read_text()
            if _lock_owner_alive(owner):
                return False
            with contextlib.suppress(OSError):
                lock.unlink()
            continue
        except OSError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(_lock_token())
        return True
    return False


def _remove_stale(folder: Path, stem: str) -> None:
    """Temporary archives of writers that are gone (killed before they finished)."""
    with contextlib.suppress(OSError):
        for entry in folder.glob(f"{_TEMPORARY_PREFIX}{stem}.*"):
            try:
                pid = int(entry.name.rsplit(".", 2)[-2])
            except (IndexError, ValueError):
                pid = 0
            if not pid or not _alive(pid):
                with contextlib.suppress(OSError):
                    entry.unlink()


def _remove_unused(kept: Path) -> None:
    """Other archives nobody used for ``UNUSED_DAYS`` (made for a JDK, jars or options since
    replaced): each is a few hundred MB; and what writers of other archives that are gone
    left a day ago or more (temporary archives, locks)."""
    now = time.time()
    cutoff = now - UNUSED_DAYS * 86400
    with contextlib.suppress(OSError):
        for entry in kept.parent.glob("spark-classes-*.jsa"):
            if entry != kept and entry.stat().st_mtime < cutoff:
                with contextlib.suppress(OSError):
                    entry.unlink()
    with contextlib.suppress(OSError):
        leftovers = [
            *kept.parent.glob(f"{_TEMPORARY_PREFIX}spark-classes-*.jsa"),
            *kept.parent.glob("spark-classes-*.lock"),
        ]
        for entry in leftovers:
            if kept.stem not in entry.name and entry.stat().st_mtime < now - 86400:
                with contextlib.suppress(OSError):
                    entry.unlink()


def archive_usable(java: Path, archive: Path, timeout: float = 60.0) -> bool:
    """Whether a JVM maps ``archive`` without crashing (a truncated archive makes the JVM die
    of SIGBUS; one for another class path is ignored, which is fine)."""
    with tempfile.TemporaryDirectory(prefix="pgcdc-cds-check-") as scratch:
        try:
            result = subprocess.run(
                [
                    str(java),
                    QUIET,
                    f"-XX:ErrorFile={scratch}/hs_err_%p.log",
                    f"-XX:SharedArchiveFile={archive}",
                    "-version",
                ],
                cwd=scratch,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    return result.returncode == 0


@dataclass
class ArchiveWriter:
    """A JVM launched to write the archive at exit: ``finish`` installs it."""

    java: Path
    temporary: Path
    archive: Path
    lock: Path

    def finish(self, gateway_process: Any | None, timeout: float = 300.0) -> bool:
        """Let the JVM exit (it writes the archive then: stop its SparkContext first) and
        install the archive if the JVM exited cleanly and the archive maps; whether it was
        installed. Always releases the lock and removes the temporary file."""
        try:
            if gateway_process is None:
                return False
            started = time.monotonic()
            with contextlib.suppress(OSError, ValueError):
                gateway_process.stdin.close()  # the JVM exits when its stdin closes
            try:
                code = gateway_process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.debug("the JVM did not exit within %gs: no class data archive", timeout)
                return False
            if code != 0 or not self.temporary.is_file() or self.temporary.stat().st_size == 0:
                log.debug("the JVM exited %s: no class data archive", code)
                return False
            if not archive_usable(self.java, self.temporary):
                log.debug("the class data archive %s does not map: not kept", self.temporary)
                return False
            os.replace(self.temporary, self.archive)
            _remove_unused(self.archive)
            log.debug(
                "class data archive %s written (%.0f MB, %.1f s at JVM exit)",
                self.archive,
                self.archive.stat().st_size / 1e6,
                time.monotonic() - started,
            )
            return True
        except OSError as exc:
            log.debug("class data archive not written: %s", exc)
            return False
        finally:
            with contextlib.suppress(OSError):
                self.temporary.unlink()
            with contextlib.suppress(OSError):
                if self.lock.read_text().split()[:1] == [str(os.getpid())]:
                    self.lock.unlink()


@dataclass(frozen=True)
class JavaLaunch:
    """JVM options to add, and the writer to finish at exit when this JVM writes the archive."""

    options: tuple[str, ...]
    writer: ArchiveWriter | None = None


def launch_options(
    spark_home: Path, conf: Mapping[str, str], roots: Sequence[Path]
) -> JavaLaunch | None:
    """The class data sharing options for a driver JVM about to be launched with ``conf``
    from ``spark_home``; None when there is no JDK to make an archive for, the settings already
    choose (``-Xshare``, an archive of their own), ``PGCDC_JVM_CDS=0``, or no cache folder can
    be written."""
    if os.environ.get("PGCDC_JVM_CDS", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    own = conf.get("spark.driver.extraJavaOptions", "")
    if "-Xshare" in own or "SharedArchiveFile" in own or "ArchiveClassesAtExit" in own:
        return None
    java = java_binary()
    if java is None:
        return None
    stem = f"spark-classes-{archive_digest(java, spark_home, conf)}"
    for root in roots:
        if any(c.isspace() or c in "\"'\\" for c in str(root)):
            # Spark splits spark.driver.extraJavaOptions at white space: the JVM would not start
            log.debug("no class data archive in %s: its path has white space or quotes", root)
            continue
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        archive = root / f"{stem}.jsa"
        if archive.is_file():
            with contextlib.suppress(OSError):
                os.utime(archive)  # in use: not removed as unused
            return JavaLaunch((QUIET, f"-XX:SharedArchiveFile={archive}"))
        if not os.access(root, os.W_OK):
            continue
        lock = root / f"{stem}.lock"
        if not _take_lock(lock):
            return None  # another JVM is writing it: this one runs without
        _remove_stale(root, stem)
        temporary = root / f"{_TEMPORARY_PREFIX}{stem}.{os.getpid()}.jsa"
        return JavaLaunch(
            (QUIET, f"-XX:ArchiveClassesAtExit={temporary}"),
            ArchiveWriter(java, temporary, archive, lock),
        )
    return None


#: the threads inside ``deaf_to_sigterm``
_launchers: set[int] = set()
_launchers_lock = threading.Lock()
_registered = False


def _ignore_sigterm_in_child() -> None:
    """After a fork in a thread inside ``deaf_to_sigterm``: the child (spark-submit, which
    execs the JVM) starts ignoring SIGTERM. A disposition set to ignore survives exec, a
    handler does not; pyspark's own ``preexec_fn`` (SIGINT ignored) cannot be replaced, and a
    fork runs the interpreter's at-fork hooks right before it."""
    if threading.get_ident() in _launchers:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextlib.contextmanager
def deaf_to_sigterm() -> Iterator[None]:
    """Processes this thread starts with ``os.fork``, or through ``subprocess`` with a
    ``preexec_fn`` (as pyspark's ``launch_gateway`` does), start with SIGTERM ignored (see the
    module doc); this process's own SIGTERM handling is unchanged throughout."""
    global _registered
    me = threading.get_ident()
    with _launchers_lock:
        if not _registered:
            os.register_at_fork(after_in_child=_ignore_sigterm_in_child)
            _registered = True
        nested = me in _launchers
        _launchers.add(me)
    try:
        yield
    finally:
        if not nested:
            with _launchers_lock:
                _launchers.discard(me)
