"""One process per lake on S3: the lease object (``pgcdc.lake.storage``) against a real
S3-compatible server. S3 has no flock; Delta's S3 log store is safe for one writer only."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from pgcdc.lake import storage
from pgcdc.lake.state import PipelineState, StateError, load_state, run_lock, save_state
from pgcdc.lake.storage import LakeLocation, LeaseLost, S3Settings
from pgcdc.lake.tables import LakeLayout
from tests.fix_s3 import S3ProxyServer, s3_client, s3_env


@pytest.fixture
def layout(s3_server: S3ProxyServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> LakeLayout:
    for name, value in s3_env(s3_server).items():
        monkeypatch.setenv(name, value)
    settings = S3Settings(endpoint=s3_server.endpoint, path_style=True)
    return LakeLayout(LakeLocation.parse(f"s3://{s3_bucket}/lake", settings).register())


def lock_body(server: S3ProxyServer, bucket: str) -> dict[str, object]:
    got = s3_client(server).get_object(Bucket=bucket, Key="lake/_pgcdc/run.lock")
    body: dict[str, object] = json.loads(got["Body"].read())
    return body


def put_lock(server: S3ProxyServer, bucket: str, **body: object) -> None:
    s3_client(server).put_object(
        Bucket=bucket, Key="lake/_pgcdc/run.lock", Body=json.dumps(body).encode()
    )


def test_a_second_process_is_refused_while_the_first_holds_the_lake(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str
) -> None:
    with run_lock(layout) as lease:
        lease.check()
        body = lock_body(s3_server, s3_bucket)
        assert body["pid"] == os.getpid() and "pgcdc run" in str(body["holder"])
        # another process of this host (its pid and start time differ from the holder's)
        refused = r"in use by pgcdc run \(pid \d+ .*two lake paths"
        with pytest.raises(StateError, match=refused), run_lock(layout, what="pgcdc drop"):
            pass
    # released on a clean exit
    with pytest.raises(Exception, match="NoSuchKey"):
        lock_body(s3_server, s3_bucket)
    with run_lock(layout, what="pgcdc drop"):
        pass


def test_a_killed_holder_on_this_host_is_taken_over_at_once(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str
) -> None:
    """A kill -9 leaves the lock object behind: the next run on the same host sees that its
    process is gone and takes the lake at once, not after the lease runs out."""
    put_lock(
        s3_server,
        s3_bucket,
        holder="pgcdc run (pid 999999 on here)",
        host=socket.gethostname(),
        pid=999_999_999,  # no such process
        process_start="1",
        until=time.time() + 3600,
    )
    with run_lock(layout):
        assert lock_body(s3_server, s3_bucket)["pid"] == os.getpid()


def test_another_hosts_lease_holds_until_it_runs_out(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str
) -> None:
    put_lock(
        s3_server,
        s3_bucket,
        holder="pgcdc run (pid 7 on elsewhere)",
        host="elsewhere",
        pid=7,
        until=time.time() + 3600,
    )
    refused = r"in use by pgcdc run \(pid 7 on elsewhere\)"
    with pytest.raises(StateError, match=refused), run_lock(layout):
        pass
    put_lock(s3_server, s3_bucket, holder="old", host="elsewhere", pid=7, until=time.time() - 1)
    with run_lock(layout):
        assert lock_body(s3_server, s3_bucket)["pid"] == os.getpid()


def test_a_holder_whose_lake_was_taken_over_stops_writing(
    layout: LakeLayout,
    s3_server: S3ProxyServer,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(storage, "RENEW_SECONDS", 0.2)
    lost = threading.Event()
    with run_lock(layout, on_lost=lambda _holder: lost.set()) as lease:
        body = lock_body(s3_server, s3_bucket)
        before = float(str(body["until"]))
        time.sleep(1)
        assert float(str(lock_body(s3_server, s3_bucket)["until"])) > before  # renewed
        # another process took it over (as after this one stalled for longer than the lease)
        put_lock(s3_server, s3_bucket, holder="the other run", host="elsewhere", pid=1, until=0)
        assert lost.wait(10)
        with pytest.raises(LeaseLost, match="taken over by the other run"):
            lease.check()
    # the other's lock is not removed by the one that lost
    assert lock_body(s3_server, s3_bucket)["holder"] == "the other run"


def test_the_state_is_one_object_written_whole(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str
) -> None:
    assert load_state(layout) is None
    state = PipelineState.new(
        system_identifier="1", database="db", slot="s", publication="p", tables=("public.t",)
    )
    save_state(layout, state)
    assert load_state(layout) == state
    keys = [o["Key"] for o in s3_client(s3_server).list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys == ["lake/_pgcdc/state.json"]  # no temporary object, no rename
