"""One process per lake on S3: the lease object (``pgcdc.lake.store.storage``) against a real
S3-compatible server. S3 has no flock; Delta's S3 log store is safe for one writer only."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict
from typing import Any

import pytest
from botocore.exceptions import FlexibleChecksumError

from pgcdc.lake.config import LakeSettings
from pgcdc.lake.store import storage
from pgcdc.lake.store.state import (
    PipelineState,
    StateError,
    check_writable,
    load_state,
    run_lock,
    save_state,
)
from pgcdc.lake.store.storage import LakeLocation, LakePath, LeaseLost, S3Settings, StorageError
from pgcdc.lake.store.tables import LakeLayout
from tests.fix_s3 import S3ProxyServer, s3_client


@pytest.fixture
def layout(s3_credentials: S3ProxyServer, s3_bucket: str) -> LakeLayout:
    settings = S3Settings(endpoint=s3_credentials.endpoint, path_style=True)
    return LakeLayout(LakeLocation.parse(f"s3://{s3_bucket}/lake", settings).register())


def lock_body(server: S3ProxyServer, bucket: str) -> dict[str, object]:
    """The lock's body, read again when S3Proxy's non-atomic write of a renewal hands out one
    version's checksum with the next one's bytes."""
    for attempt in range(5):
        got = s3_client(server).get_object(Bucket=bucket, Key="lake/_pgcdc/run.lock")
        try:
            body: dict[str, object] = json.loads(got["Body"].read())
            return body
        except FlexibleChecksumError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def put_lock(server: S3ProxyServer, bucket: str, **body: object) -> None:
    s3_client(server).put_object(
        Bucket=bucket, Key="lake/_pgcdc/run.lock", Body=json.dumps(body).encode()
    )


def take_over(server: S3ProxyServer, bucket: str, lost: threading.Event) -> None:
    """Another process takes the lake over (as after this one stalled longer than the lease),
    until the holder's renewal notices. S3Proxy checks an If-Match and then writes, not
    atomically: a renewal racing the takeover may overwrite it, so it is written again."""
    for _ in range(20):
        put_lock(server, bucket, holder="the other run", host="elsewhere", pid=1, until=0)
        if lost.wait(1):
            return
    raise AssertionError("the holder never noticed the takeover")


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
        pid_namespace=storage._pid_namespace(),
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
        take_over(s3_server, s3_bucket, lost)
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


@pytest.mark.parametrize("client", ["boto3", "arrow"])
def test_both_clients_wait_out_a_store_that_is_down(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str, client: str
) -> None:
    """The lake's two S3 clients (boto3 for its own objects, Arrow for the Parquet files of the
    indexed write and the snapshot) ride out a store down for 8 s; Arrow's default of three
    attempts gave up in 0.2 s, and a batch failed in an outage the run was waiting out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    location = layout.location
    s3_server.kill()
    back = threading.Timer(8, s3_server.start)
    back.start()
    started = time.monotonic()
    try:
        if client == "boto3":
            location.store().write("_pgcdc/probe", b"written in the outage")
        else:
            pq.write_table(
                pa.table({"k": [1, 2, 3]}),
                location.arrow_path(f"{location.root}/t/part-0.parquet"),
                filesystem=location.arrow_filesystem(),
            )
    finally:
        back.join()
    assert time.monotonic() - started >= 8
    keys = [o["Key"] for o in s3_client(s3_server).list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert ("lake/_pgcdc/probe" if client == "boto3" else "lake/t/part-0.parquet") in keys


@pytest.mark.parametrize(
    "path", ["s3://bkt/x//lake", "s3://bkt/x/./lake", "s3://bkt/y/../x/lake", "s3://bkt/x?y"]
)
def test_a_lake_path_spelt_two_ways_is_refused(path: str) -> None:
    """Spark (Hadoop's Path) reads s3a://bkt/x//lake as s3a://bkt/x/lake, boto3 and pyarrow do
    not: the lock and state would not be beside the tables, and two spellings of one lake
    would hold two locks over the same Delta tables (found in review)."""
    with pytest.raises(ValueError, match=r"without empty, '\.' or '\.\.' parts"):
        LakeSettings(path=path, s3={"endpoint": "http://127.0.0.1:1"})
    assert LakeSettings(path="s3://bkt/x/lake/").location().prefix == "x/lake"


def test_a_lease_that_cannot_be_renewed_stops_the_holder(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that fails other than by a conflict (403, expired session keys, the store
    down) must not extend the lease in this process: the one in the store runs out, another
    host takes the lake, and this holder would write on (found in review)."""
    monkeypatch.setattr(storage, "RENEW_SECONDS", 0.1)
    monkeypatch.setattr(storage, "LEASE_SECONDS", 2.0)
    monkeypatch.setattr(storage, "LEASE_MARGIN", 0.5)
    store = layout.location.store()
    real_write = type(store).write

    def failing(self: object, key: str, data: bytes, *, expect: str | None = storage.ANY) -> str:
        if key.endswith("run.lock") and expect not in (None, storage.ANY):  # renewals only
            raise StorageError("cannot write ...: AccessDenied 403")
        return real_write(self, key, data, expect=expect)  # type: ignore[arg-type]

    with run_lock(layout) as lease:
        monkeypatch.setattr(type(store), "write", failing)
        time.sleep(3.0)
        assert float(str(lock_body(s3_server, s3_bucket)["until"])) < time.time()
        with pytest.raises(LeaseLost):
            lease.check()


def test_a_holder_that_lost_the_lake_cannot_overwrite_the_state(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``save_state`` checks the lease too: a run that lost the lake cannot write its old
    generation over the new holder's state (found in review)."""
    monkeypatch.setattr(storage, "RENEW_SECONDS", 0.2)
    mine = PipelineState.new(
        system_identifier="1", database="db", slot="s", publication="p", tables=("public.t",)
    )
    lost = threading.Event()
    with run_lock(layout, on_lost=lambda _h: lost.set()):
        save_state(layout, mine)
        theirs = mine.evolve(generation=mine.generation + 1)
        data = asdict(theirs)
        data["tables"] = list(theirs.tables)
        s3_client(s3_server).put_object(
            Bucket=s3_bucket, Key="lake/_pgcdc/state.json", Body=json.dumps(data).encode()
        )
        take_over(s3_server, s3_bucket, lost)
        with pytest.raises(LeaseLost):
            save_state(layout, mine.evolve(snapshot_done=True))
    state = load_state(layout)
    assert state is not None and state.generation == theirs.generation


def test_a_live_holder_in_another_pid_namespace_is_not_taken_over(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str
) -> None:
    """Containers with host networking share the host name, not the pid namespace: a live
    holder's pid means nothing here, and its lease must not be taken over (found in
    review)."""
    put_lock(
        s3_server,
        s3_bucket,
        holder="pgcdc run (pid 7 on this host, in another container)",
        owner="x",
        host=socket.gethostname(),
        pid=4_000_000,
        process_start="12345",
        pid_namespace="pid:[4026530000] another-boot",
        until=time.time() + 59,
    )
    with pytest.raises(StateError, match="in use by"), run_lock(layout):
        pass


def test_removal_stays_inside_its_prefix_and_unknown_lakes_are_refused(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str
) -> None:
    client = s3_client(s3_server)
    for key in ("lake/a/1", "lake/a/b/2", "lake2/a/1", "lakea", "lake/ab/1"):
        client.put_object(Bucket=s3_bucket, Key=key, Body=b"x")
    assert (layout.root / "a").remove_tree() == 2
    left = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert left == ["lake/ab/1", "lake2/a/1", "lakea"]
    assert sorted(layout.root.names()) == ["ab"]
    assert LakePath.parse(f"s3://{s3_bucket}/lake/ab").location == layout.location
    # a URI in no lake set up here would go to AWS with this store's key id: refused
    with pytest.raises(StorageError, match="in no S3 lake this process set up"):
        LakePath.parse(f"s3://{s3_bucket}/lake2/a")


def test_a_store_that_ignores_conditional_writes_is_refused(
    layout: LakeLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some S3-compatible stores ignore If-None-Match and If-Match on PUT: two runs would then
    both take the lease. The lake is refused, naming the store (found in review)."""
    store = layout.location.store()
    events = store.client._client.meta.events  # type: ignore[attr-defined]

    def strip(request: Any, **_: Any) -> None:
        for name in ("If-None-Match", "If-Match"):
            del request.headers[name]

    events.register("before-sign.s3.PutObject", strip)
    try:
        with pytest.raises(StateError, match="ignores conditional writes"), run_lock(layout):
            pass
        # run --check tries the same (it said "configuration OK")
        with pytest.raises(StateError, match="ignores conditional writes"):
            check_writable(layout)
    finally:
        events.unregister("before-sign.s3.PutObject", strip)


def test_the_write_check_leaves_nothing(
    layout: LakeLayout, s3_server: S3ProxyServer, s3_bucket: str
) -> None:
    """``run --check`` writes a probe object under ``_pgcdc/`` as a run writes its state and
    lease (conditionally), and removes it: the bucket is as it was."""
    check_writable(layout)
    listing = s3_client(s3_server).list_objects_v2(Bucket=s3_bucket, Prefix="lake/")
    assert listing.get("KeyCount", 0) == 0, listing.get("Contents")
