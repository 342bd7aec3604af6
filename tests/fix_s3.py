"""Fixtures: a real S3 server on loopback (S3Proxy) for the test session, and a fresh bucket per
test.

S3Proxy (tools/s3proxy/pom.xml, fetched by ``make setup`` into .cache/s3proxy) behaves like S3
where pgcdc relies on it: it checks request signatures against one key pair, honours conditional
writes (If-None-Match, If-Match), and its filesystem backend keeps objects in a folder, so they
survive a crash and restart of the server (``kill()`` then ``start()``). ``s3_env`` gives the
environment a client process (``pgcdc run``, Spark, delta-rs) needs to reach it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import boto3
import pytest
from botocore.config import Config

_PROJECT_ROOT = Path(__file__).resolve().parents[1]
S3PROXY_JARS = _PROJECT_ROOT / ".cache" / "s3proxy"

#: S3Proxy's default logging (its jar has no logback.xml) is every request at DEBUG: slow and
#: noisy, so warnings and errors only
_LOGBACK_XML = (
    "<configuration><appender name='O' class='ch.qos.logback.core.ConsoleAppender'>"
    "<encoder><pattern>%d %-5level %logger{20} - %msg%n</pattern></encoder></appender>"
    "<root level='WARN'><appender-ref ref='O'/></root></configuration>\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class S3ProxyServer:
    """S3Proxy on 127.0.0.1:<a free port>, a subprocess in its own process group, with its
    objects, properties and log in ``workdir``."""

    access_key = "pgcdcTestAccessKey"
    secret_key = "pgcdcTestSecretKey"
    region = "us-east-1"
    #: seconds ``start()`` waits for the port
    start_timeout = 60.0

    def __init__(self, workdir: Path, jars: Path = S3PROXY_JARS) -> None:
        self.workdir = workdir
        self.jars = jars
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.data = workdir / "data"
        self.log = workdir / "s3proxy.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.data.mkdir(parents=True, exist_ok=True)
        self._properties = workdir / "s3proxy.properties"
        self._properties.write_text(
            f"s3proxy.endpoint={self.endpoint}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={self.access_key}\n"
            f"s3proxy.credential={self.secret_key}\n"
            "jclouds.provider=filesystem-nio2\n"
            f"jclouds.filesystem.basedir={self.data}\n"
        )
        self._logback = workdir / "logback.xml"
        self._logback.write_text(_LOGBACK_XML)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [
            "java",
            "-Xmx256m",
            # C1 only: it starts in about 1 s instead of 2-3 s, and tests send few requests
            "-XX:TieredStopAtLevel=1",
            f"-Dlogback.configurationFile={self._logback}",
            "-cp",
            f"{self.jars}/*",
            "org.gaul.s3proxy.Main",
            "--properties",
            str(self._properties),
        ]

    def start(self) -> None:
        """Start the server (again: the same port and data folder) and wait until its port
        accepts connections; fails the test, with the log's tail, when it does not in time."""
        assert not self.running, "S3Proxy is running already"
        if shutil.which("java") is None:
            pytest.fail("S3Proxy needs Java (17), which is not on PATH: run `make setup`")
        with self.log.open("ab") as log:
            log.write(f"--- start on port {self.port}\n".encode())
            log.flush()
            # a session of its own: kill() signals its process group, never pytest's
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"S3Proxy exited with status {self.proc.returncode} at start")
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                # the listener is ours only if the process is still alive (another process may
                # have taken the port between _free_port() and now)
                if self.proc.poll() is None:
                    return
            time.sleep(0.05)
        self.kill()
        self._fail(f"S3Proxy did not listen on 127.0.0.1:{self.port} in {self.start_timeout:.0f} s")

    def kill(self) -> None:
        """SIGKILL the server, as a crash would: nothing is flushed or closed cleanly."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _fail(self, what: str) -> NoReturn:
        pytest.fail(f"{what}; the tail of {self.log}:\n{self.log_tail()}", pytrace=False)


def s3_client(server: S3ProxyServer, secret_key: str | None = None) -> Any:
    """A boto3 S3 client of ``server`` (``secret_key``: another one, to test refusals)."""
    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name=server.region,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key if secret_key is None else secret_key,
        # path style: bucket.127.0.0.1 host names do not resolve
        config=Config(s3={"addressing_style": "path"}),
    )


def s3_env(server: S3ProxyServer) -> dict[str, str]:
    """The environment variables that give a client process ``server``'s credentials and
    region (the endpoint is the client's own setting)."""
    return {
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_REGION": server.region,
        # no SDK may look for credentials or a region at the EC2 instance-metadata service
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3ProxyServer]:
    """S3Proxy on loopback for the whole test session (one per xdist worker)."""
    # missing jars are a broken set-up, never a reason to skip the S3 tests
    if not any(S3PROXY_JARS.glob("s3proxy-*.jar")):
        pytest.fail(
            f"no S3Proxy jars in {S3PROXY_JARS}: run `make setup` (tools/setup.sh fetches "
            "tools/s3proxy/pom.xml from Maven Central)",
            pytrace=False,
        )
    server = S3ProxyServer(tmp_path_factory.mktemp("s3proxy"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_credentials(s3_server: S3ProxyServer, monkeypatch: pytest.MonkeyPatch) -> S3ProxyServer:
    """``s3_server``, its keys and region in this test's environment (``s3_env``): what this
    process's readers and the processes it starts use."""
    for name, value in s3_env(s3_server).items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_bucket(s3_server: S3ProxyServer) -> str:
    """A fresh, empty bucket for one test; its name. Buckets are left behind: each test has its
    own, and the data folder goes with the session's temporary folder."""
    # S3's rules: 3-63 characters, lower-case letters, digits and hyphens
    name = f"pgcdc-{uuid.uuid4().hex[:8]}"
    s3_client(s3_server).create_bucket(Bucket=name)
    return name
