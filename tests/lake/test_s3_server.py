"""The S3 test server (tests/fix_s3.py) and the S3 semantics pgcdc's lakes on S3 rely on, against
the real server: conditional PUTs (the lock and state objects are created with If-None-Match
and replaced with If-Match), refused signatures, and objects and ETags that outlive a crash of
the server."""

from __future__ import annotations

import socket
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.fix_s3 import S3ProxyServer, s3_client


def _status(error: ClientError) -> tuple[int, str]:
    response: dict[str, Any] = error.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"].get("Code", "")


def _body(s3: Any, bucket: str, key: str) -> bytes:
    data: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return data


def test_if_none_match_creates_once(s3_server: S3ProxyServer, s3_bucket: str) -> None:
    s3 = s3_client(s3_server)
    first = s3.put_object(Bucket=s3_bucket, Key="lock", Body=b"a", IfNoneMatch="*")
    assert first["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=s3_bucket, Key="lock", Body=b"b", IfNoneMatch="*")
    assert _status(refused.value) == (412, "PreconditionFailed")
    assert _body(s3, s3_bucket, "lock") == b"a"


def test_if_match_replaces_only_the_current_version(
    s3_server: S3ProxyServer, s3_bucket: str
) -> None:
    s3 = s3_client(s3_server)
    old = s3.put_object(Bucket=s3_bucket, Key="state.json", Body=b"1")["ETag"]
    assert s3.head_object(Bucket=s3_bucket, Key="state.json")["ETag"] == old
    new = s3.put_object(Bucket=s3_bucket, Key="state.json", Body=b"2", IfMatch=old)["ETag"]
    assert new != old
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=s3_bucket, Key="state.json", Body=b"3", IfMatch=old)
    assert _status(refused.value) == (412, "PreconditionFailed")
    assert _body(s3, s3_bucket, "state.json") == b"2"


def test_wrong_secret_is_refused(s3_server: S3ProxyServer, s3_bucket: str) -> None:
    bad = s3_client(s3_server, secret_key="not-the-secret")
    with pytest.raises(ClientError) as refused:
        bad.put_object(Bucket=s3_bucket, Key="x", Body=b"x")
    status, code = _status(refused.value)
    assert status == 403
    assert code in {"SignatureDoesNotMatch", "AccessDenied"}
    with pytest.raises(ClientError):
        s3_client(s3_server).head_object(Bucket=s3_bucket, Key="x")


def test_s3_env_is_enough_for_a_client(
    s3_credentials: S3ProxyServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a child process gets: credentials and region from the environment only
    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    s3 = boto3.session.Session().client("s3", endpoint_url=s3_credentials.endpoint)
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"v")
    assert _body(s3, s3_bucket, "k") == b"v"


def test_objects_and_etags_survive_a_crash(s3_server: S3ProxyServer, s3_bucket: str) -> None:
    s3 = s3_client(s3_server)
    etag = s3.put_object(Bucket=s3_bucket, Key="lock", Body=b"owner-a", IfNoneMatch="*")["ETag"]
    s3_server.kill()
    try:
        assert not s3_server.running
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", s3_server.port), timeout=5).close()
    finally:
        # the server is the session's: later tests need it back whatever happened here
        s3_server.start()
    s3 = s3_client(s3_server)
    assert _body(s3, s3_bucket, "lock") == b"owner-a"
    # a lease renewal after the outage: the ETag held from before the crash still matches
    assert s3.head_object(Bucket=s3_bucket, Key="lock")["ETag"] == etag
    s3.put_object(Bucket=s3_bucket, Key="lock", Body=b"owner-a renewed", IfMatch=etag)
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=s3_bucket, Key="lock", Body=b"owner-b", IfNoneMatch="*")
    assert _status(refused.value) == (412, "PreconditionFailed")
