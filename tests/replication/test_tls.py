"""TLS: sslmode and sslrootcert pass through to both connections (psycopg2's replication
connection and psycopg 3's SQL connections), against a server with a self-signed certificate
that accepts nothing but TLS."""

from __future__ import annotations

import io
import os
import pwd
import subprocess
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import psycopg
import pytest

from pgcdc.cli import main
from pgcdc.cli.throwaway_server import Cluster


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def tls_server(pg_server: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    hba = [
        "local all all trust",
        "hostssl all all 127.0.0.1/32 trust",
        "hostssl replication all 127.0.0.1/32 trust",
        "host all all 127.0.0.1/32 reject",
        "host replication all 127.0.0.1/32 reject",
    ]
    cluster = Cluster(pg_server.major, settings={"ssl": "on"}, hba=hba)
    cluster.init()
    cert, key = _self_signed(cluster.datadir, "server")
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in (cert, key):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    key.chmod(0o600)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _tail(dsn: str, stderr: io.StringIO | None = None) -> tuple[int, bytes]:
    buffer = io.BytesIO()
    out = io.TextIOWrapper(buffer)
    with redirect_stdout(out), redirect_stderr(stderr or io.StringIO()):
        code = main(
            [
                "tail",
                "--dsn",
                dsn,
                "--slot",
                "s",
                "--publication",
                "p",
                "--create-slot",
                "--until-caught-up",
            ]
        )
    out.flush()
    return code, buffer.getvalue()


def test_tls_verify_full(tls_server: Cluster, tmp_path: Path) -> None:
    root = tls_server.datadir / "server.crt"
    good = tls_server.dsn(sslmode="verify-full", sslrootcert=str(root))
    with psycopg.connect(good, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY)")
        conn.execute("DROP PUBLICATION IF EXISTS p")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        assert conn.execute(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        ).fetchone() == (True,)
    code, _ = _tail(good)  # creates the slot
    assert code == 0
    with psycopg.connect(good, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (1)")
    code, out = _tail(good)
    assert code == 0
    assert out == b"BEGIN\ntable public.t: INSERT: id[integer]:1\nCOMMIT\n"

    # without TLS the server refuses; with a certificate we do not trust, the client refuses
    errors = io.StringIO()
    code, out = _tail(tls_server.dsn(sslmode="disable", password="s3cret"), errors)
    assert (code, out) == (1, b"")
    assert "no encryption" in errors.getvalue() and "s3cret" not in errors.getvalue()
    other, _ = _self_signed(tmp_path, "other")
    errors = io.StringIO()
    code, out = _tail(tls_server.dsn(sslmode="verify-full", sslrootcert=str(other)), errors)
    assert (code, out) == (1, b"")
    assert "certificate verify failed" in errors.getvalue()
