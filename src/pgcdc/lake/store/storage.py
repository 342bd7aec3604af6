"""Where a lake lives and how pgcdc reaches it: a local (or mounted) folder, or a prefix of an
S3 bucket.

A ``LakeLocation`` is the lake's root and, for S3, how to reach the store (``S3Settings``: endpoint,
region, addressing style; never credentials, which come from the environment or the standard AWS
chain). It is a small picklable value: the snapshot's tasks get it on the executors. It gives
each engine its own view of the same place:

- Spark (Delta's connector, the streaming checkpoint): URIs (``s3a://bucket/prefix/...`` or a
  local path) and the Hadoop settings of the S3A file system (``spark_settings``);
- delta-rs (``pgcdc status``, ``--verify``): the same URIs and its ``storage_options``;
- pyarrow (the snapshot's Parquet files): a ``pyarrow.fs`` file system;
- pgcdc's own files (state, lock, the checkpoint's logs read without Spark): ``LakePath``, a
  path in the lake with the few operations pgcdc needs, over a ``LakeStore``.

On S3 a write of one object is atomic (readers see the old object or the new one) and
conditional writes (``If-None-Match``/``If-Match``) make compare-and-set; there is no atomic
rename. ``LakeStore.write`` therefore writes a whole object in one request, and ``lease`` holds
a lake for one process with a lock object renewed by compare-and-set (see ``S3Store.lease``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pwd
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pgcdc.errors import PgcdcError

__all__ = [
    "ANY",
    "LakeLocation",
    "LakePath",
    "LakeStore",
    "Lease",
    "LeaseLost",
    "S3Settings",
    "StorageError",
    "StoreConflict",
    "is_s3_uri",
]

log = logging.getLogger("pgcdc.lake")


class StorageError(PgcdcError, RuntimeError):
    """The lake's store refused or failed a request; the message names the setting to fix."""


class StoreConflict(StorageError):
    """A conditional write lost: the object is not in the state the writer expected."""


class LeaseLost(StorageError):
    """Another process took the lake over while this one held it."""


#: ``LakeStore.write``'s ``expect`` for an unconditional write
ANY = "*any*"

_S3_SCHEMES = ("s3://", "s3a://")


def is_s3_uri(text: str) -> bool:
    return text.startswith(_S3_SCHEMES)


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach an S3-compatible store (``[lake.s3]``). No credentials: those come from the
    environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``) or the
    standard AWS chain (profiles, instance roles)."""

    endpoint: str | None = None  # None: AWS's own endpoint for the region
    region: str = "us-east-1"
    path_style: bool = False  # bucket in the path, not the host name (most self-hosted stores)

    @property
    def uses_tls(self) -> bool:
        return self.endpoint is None or not self.endpoint.startswith("http://")


@dataclass(frozen=True, slots=True)
class LakeLocation:
    """The lake's root: an absolute local path, or ``s3a://bucket[/prefix]`` with ``s3``."""

    root: str
    s3: S3Settings | None = None

    def register(self) -> LakeLocation:
        """Make this lake's settings the ones its URIs are reached with in this process
        (``LakePath.parse``: Delta tables named by URI); itself."""
        if self.s3 is not None:
            with _STORES_LOCK:
                _KNOWN[self.root] = self
        return self

    @classmethod
    def parse(cls, path: str | Path, s3: S3Settings | None = None) -> LakeLocation:
        text = str(path)
        if is_s3_uri(text):
            rest = text.split("://", 1)[1].strip("/")
            return cls(f"s3a://{rest}", s3 or S3Settings())
        return cls(str(Path(text)), None)

    @property
    def is_s3(self) -> bool:
        return self.s3 is not None

    @property
    def bucket(self) -> str:
        return self.root[len("s3a://") :].split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The root's key prefix in the bucket ('' at the bucket's top)."""
        parts = self.root[len("s3a://") :].split("/", 1)
        return parts[1] if len(parts) > 1 else ""

    def uri(self, key: str = "") -> str:
        """The URI Spark and delta-rs read ``key`` (a '/'-separated path in the lake) at."""
        return f"{self.root}/{key}" if key else self.root

    def key(self, uri: str) -> str:
        """The inverse of ``uri``."""
        if uri == self.root:
            return ""
        if not uri.startswith(self.root + "/"):
            raise ValueError(f"{uri} is not in the lake {self.root}")
        return uri[len(self.root) + 1 :]

    def path(self, key: str = "") -> LakePath:
        return LakePath(self, key.strip("/"))

    def store(self) -> LakeStore:
        return _store(self)

    def spark_settings(self) -> dict[str, str]:
        """The Hadoop settings Spark's S3A file system needs for this lake (none locally)."""
        s3 = self.s3
        if s3 is None:
            return {}
        settings = {
            # the AWS SDK's own chain (environment, profile, web identity, container and
            # instance roles), as boto3 and pyarrow use: S3A's default chain has no profiles
            "spark.hadoop.fs.s3a.aws.credentials.provider": (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider,"
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider,"
                "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
            ),
            "spark.hadoop.fs.s3a.endpoint.region": s3.region,
            "spark.hadoop.fs.s3a.path.style.access": str(s3.path_style).lower(),
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(s3.uses_tls).lower(),
        }
        if s3.endpoint is not None:
            settings["spark.hadoop.fs.s3a.endpoint"] = s3.endpoint
        return settings

    def delta_rs_options(self) -> dict[str, str] | None:
        """delta-rs's ``storage_options`` for this lake (None locally). Credentials are read
        from the environment here, at the call, so that they are never kept in a setting."""
        s3 = self.s3
        if s3 is None:
            return None
        options = {
            "AWS_REGION": s3.region,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not s3.path_style).lower(),
            "AWS_ALLOW_HTTP": str(not s3.uses_tls).lower(),
        }
        if s3.endpoint is not None:
            options["AWS_ENDPOINT_URL"] = s3.endpoint
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            value = os.environ.get(name)
            if value:
                options[name] = value
        return options

    def arrow_path(self, uri: str) -> str:
        """``uri`` (in this lake) as a path of ``arrow_filesystem``."""
        return uri[len("s3a://") :] if self.is_s3 else uri

    def arrow_filesystem(self) -> Any:
        """A ``pyarrow.fs`` file system for this lake (the snapshot's writers)."""
        from pyarrow import fs

        s3 = self.s3
        if s3 is None:
            return fs.LocalFileSystem()
        options: dict[str, Any] = {
            "region": s3.region,
            "retry_strategy": fs.AwsDefaultS3RetryStrategy(max_attempts=_arrow_attempts()),
        }
        if s3.endpoint is not None:
            scheme, _, host = s3.endpoint.partition("://")
            options.update(endpoint_override=host, scheme=scheme)
        return fs.S3FileSystem(**options)


@dataclass(frozen=True, slots=True)
class Stored:
    """An object's bytes and its version tag (the ETag on S3) for a conditional write."""

    data: bytes
    tag: str


class LakeStore(Protocol):
    """The few operations pgcdc's own files need; keys are '/'-separated paths in the lake.

    ``write`` replaces the whole object at once (readers never see part of it); ``expect`` makes
    it conditional: ``None``, only if the object does not exist; a tag from ``read``, only if
    it is still that version; ``ANY``, always. A lost condition raises ``StoreConflict``.
    ``sync=False`` lets a local store skip flushing the file to disk before it is in place:
    for files a reader checks and rebuilds from the Delta table when they are damaged (Delta's
    own commits on a local lake are not flushed either).
    ``probe`` does what a run does to the folder ``key`` (a file written, then removed) and
    leaves nothing behind; a ``StorageError`` naming the path and the fix if refused."""

    def read(self, key: str) -> Stored | None: ...

    def tag(self, key: str) -> str | None: ...

    def write(
        self, key: str, data: bytes, *, expect: str | None = ANY, sync: bool = True
    ) -> str: ...

    def names(self, key: str) -> list[str]: ...

    def is_dir(self, key: str) -> bool: ...

    def remove(self, key: str) -> None: ...

    def remove_tree(self, key: str) -> int: ...

    def probe(self, key: str) -> None: ...

    def lease(
        self, key: str, holder: str, *, on_lost: Callable[[str], None]
    ) -> contextlib.AbstractContextManager[Lease]: ...


@dataclass(frozen=True, slots=True)
class LakePath:
    """A path in a lake: ``/`` joins, ``str()`` is the URI Spark and delta-rs read it at."""

    location: LakeLocation
    key: str = ""

    @classmethod
    def parse(cls, text: str | Path) -> LakePath:
        """The path a URI (or local path) names: a local path, or one in the S3 lake this
        process set up (``LakeLocation.register``) whose root holds it, with that lake's
        settings. An S3 URI in no such lake is an error."""
        text = str(text)
        if is_s3_uri(text):
            uri = f"s3a://{text.split('://', 1)[1].rstrip('/')}"
            with _STORES_LOCK:
                roots = [r for r in _KNOWN if uri == r or uri.startswith(r + "/")]
            if not roots:  # with defaults it would go to AWS with a private store's key id
                raise StorageError(
                    f"{uri} is in no S3 lake this process set up: read it through the lake's "
                    "configuration ([lake.s3]), so that its store is known"
                )
            location = _KNOWN[max(roots, key=len)]
            return cls(location, location.key(uri))
        return LakeLocation.parse(text).path()

    def __truediv__(self, name: str) -> LakePath:
        return LakePath(self.location, f"{self.key}/{name}" if self.key else name)

    def __str__(self) -> str:
        return self.location.uri(self.key)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    def with_name(self, name: str) -> LakePath:
        parent = self.key.rsplit("/", 1)[0] if "/" in self.key else ""
        return LakePath(self.location, f"{parent}/{name}" if parent else name)

    def local(self) -> Path:
        """The local path of a path in a local lake."""
        if self.location.is_s3:
            raise ValueError(f"{self} is on S3, not a local path")
        return Path(str(self))

    def read_bytes(self) -> bytes | None:
        found = self.location.store().read(self.key)
        return None if found is None else found.data

    def read_text(self) -> str | None:
        data = self.read_bytes()
        return None if data is None else data.decode("utf-8")

    def tag(self) -> str | None:
        """The file's version tag (None if there is no such file)."""
        return self.location.store().tag(self.key)

    def is_dir(self) -> bool:
        return self.location.store().is_dir(self.key)

    def names(self) -> list[str]:
        """The names directly under this path (files and folders); [] when there is none."""
        return self.location.store().names(self.key)

    def remove(self) -> None:
        self.location.store().remove(self.key)

    def remove_tree(self) -> int:
        """Remove everything under this path; how many files were removed."""
        return self.location.store().remove_tree(self.key)


# -- local ---------------------------------------------------------------------------------


def _local_tag(st: os.stat_result) -> str:
    return f"{st.st_dev}-{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"


class LocalStore:
    """A lake in a local (or mounted) folder. Writes are a temporary file renamed over the old
    one; the lease is an flock, which the kernel drops however its holder ends."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def read(self, key: str) -> Stored | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from None
        return Stored(data, _local_tag(st))

    def tag(self, key: str) -> str | None:
        try:
            return _local_tag(self._path(key).stat())
        except OSError:
            return None

    def write(self, key: str, data: bytes, *, expect: str | None = ANY, sync: bool = True) -> str:
        path = self._path(key)
        if expect != ANY:  # the lake's flock (``lease``) keeps other writers out
            found = self.read(key)
            if (found is None) != (expect is None) or (found and found.tag != expect):
                raise StoreConflict(f"{path} changed under this process")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as out:
                out.write(data)
                if sync:
                    out.flush()
                    os.fsync(out.fileno())
        except OSError as exc:  # a full disk's error names no file: say which
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise OSError(exc.errno, f"{exc.strerror or exc} (writing {path.as_uri()})") from exc
        os.replace(tmp, path)
        return _local_tag(path.stat())

    def names(self, key: str) -> list[str]:
        try:
            return [p.name for p in self._path(key).iterdir()]
        except OSError:  # no such folder (yet)
            return []

    def is_dir(self, key: str) -> bool:
        return self._path(key).is_dir()

    def remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def remove_tree(self, key: str) -> int:
        import shutil

        path = self._path(key)
        if not path.exists():
            return 0
        count = sum(1 for p in path.rglob("*") if not p.is_dir())
        shutil.rmtree(path)
        return count

    def _not_writable(self, exc: OSError, path: Path) -> StorageError:
        where = exc.filename or path
        return StorageError(
            f"cannot write to the lake {self.root}: {where}: {exc.strerror or exc}. pgcdc keeps "
            "its state, lock and checkpoint under _pgcdc/ there and writes the tables. Fix: make "
            f"the lake writable for this user ({_user()}), e.g. mount it read-write, or point "
            "lake.path at a writable folder"
        )

    def probe(self, key: str) -> None:
        folder = self._path(key)
        made: list[Path] = []  # the folders made for the probe, deepest first
        parent = folder
        while not parent.exists() and parent != parent.parent:
            made.append(parent)
            parent = parent.parent
        probe = folder / f".probe-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            for each in reversed(made):
                each.mkdir(exist_ok=True)
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            probe.unlink()
        except OSError as exc:
            raise self._not_writable(exc, probe) from None
        finally:
            for each in made:
                with contextlib.suppress(OSError):
                    each.rmdir()

    @contextlib.contextmanager
    def lease(self, key: str, holder: str, *, on_lost: Callable[[str], None]) -> Iterator[Lease]:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise self._not_writable(exc, path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise StoreConflict(other) from None
        except OSError as exc:  # a filesystem without flock (some network filesystems)
            os.close(fd)
            raise StorageError(
                f"cannot lock {path} ({exc.strerror or exc}): pgcdc holds a lake with a file "
                "lock, so that two processes never write it at once. Fix: put the lake on a "
                "filesystem with working flock (a local disk)"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
            yield Lease()
        finally:
            os.close(fd)


# -- S3 ------------------------------------------------------------------------------------

#: How long a lease on an S3 lake lasts unless renewed, how often its holder renews it, and
#: how long before its end the holder stops writing (clocks of two hosts differ a little)
LEASE_SECONDS = 60.0
RENEW_SECONDS = 10.0
LEASE_MARGIN = 15.0


def _process_start(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), telling it from a later one with the
    same pid; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Lease:
    """A held lake, as its holder checks it before each write (``check``). Locally an flock,
    which nobody takes over: always valid."""

    def check(self) -> None:
        """Raise ``LeaseLost`` if this process may no longer write the lake."""


@dataclass
class _Lease(Lease):
    """A lease on an S3 lake: valid while renewed, until ``until`` (this host's clock) less a
    margin, and not taken over."""

    key: str
    body: dict[str, Any]
    tag: str
    stop: threading.Event = field(default_factory=threading.Event)
    lost: str | None = None

    def check(self) -> None:
        if self.lost is not None:
            raise LeaseLost(f"the lake was taken over by {self.lost}: this process stopped writing")
        left = float(self.body["until"]) - time.time()
        if left < LEASE_MARGIN:
            raise LeaseLost(
                f"the lake's lease was not renewed for {LEASE_SECONDS - left:.0f} s (the store "
                "did not answer): writing now could race a process that took it over"
            )


class S3Store:
    """A lake under ``s3a://bucket/prefix``, through boto3 (the one Python client with S3's
    conditional writes and ETags)."""

    def __init__(self, location: LakeLocation) -> None:
        import boto3
        from botocore.config import Config

        s3 = location.s3
        assert s3 is not None
        self.location = location
        self.bucket = location.bucket
        self.prefix = location.prefix
        client = boto3.client(
            "s3",
            endpoint_url=s3.endpoint,
            region_name=s3.region,
            config=Config(
                s3={"addressing_style": "path" if s3.path_style else "auto"},
                retries={"mode": "standard", "max_attempts": 3},
                connect_timeout=5,
                read_timeout=30,
            ),
        )
        self.client: Any = _Patient(client, location)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}".strip("/") if self.prefix else key

    def _fail(self, exc: Exception, what: str) -> StorageError:
        return s3_error(exc, self.location, what)

    def read(self, key: str) -> Stored | None:
        for attempt in range(3):
            try:
                got = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
                return Stored(got["Body"].read(), str(got["ETag"]))
            except Exception as exc:
                if _missing(exc):
                    return None
                # a store whose writes are not atomic (S3Proxy on a file system) may serve
                # one version's checksum with the next one's body: read it again
                if type(exc).__name__ == "FlexibleChecksumError" and attempt < 2:
                    continue
                raise self._fail(exc, f"read {self.location.uri(key)}") from None
        raise AssertionError("unreachable")

    def tag(self, key: str) -> str | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if _missing(exc):
                return None
            raise self._fail(exc, f"read {self.location.uri(key)}") from None
        return str(head["ETag"])

    def write(self, key: str, data: bytes, *, expect: str | None = ANY, sync: bool = True) -> str:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": data}
        if expect is None:
            args["IfNoneMatch"] = "*"
        elif expect != ANY:
            args["IfMatch"] = expect
        try:
            put = self.client.put_object(**args)
        except Exception as exc:
            if _code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise StoreConflict(
                    f"{self.location.uri(key)} changed under this process"
                ) from None
            raise self._fail(exc, f"write {self.location.uri(key)}") from None
        return str(put["ETag"])

    def _folder(self, key: str) -> str:
        """The key prefix of everything under ``key`` ('' for the bucket's top)."""
        prefix = self._key(key)
        return f"{prefix}/" if prefix else ""

    def _list(self, key: str, *, delimiter: bool) -> Iterator[dict[str, Any]]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._folder(key)}
        if delimiter:
            args["Delimiter"] = "/"
        while True:
            try:
                page = self.client.list_objects_v2(**args)
            except Exception as exc:
                raise self._fail(exc, f"list {self.location.uri(key)}") from None
            yield page
            if not page.get("IsTruncated"):
                return
            args["ContinuationToken"] = page["NextContinuationToken"]

    def names(self, key: str) -> list[str]:
        found: list[str] = []
        for page in self._list(key, delimiter=True):
            found += [
                p["Prefix"].rstrip("/").rsplit("/", 1)[-1] for p in page.get("CommonPrefixes", [])
            ]
            found += [o["Key"].rsplit("/", 1)[-1] for o in page.get("Contents", [])]
        return found

    def is_dir(self, key: str) -> bool:
        try:
            page = self.client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._folder(key), MaxKeys=1
            )
        except Exception as exc:
            raise self._fail(exc, f"list {self.location.uri(key)}") from None
        return bool(page.get("KeyCount", 0))

    def remove(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if not _missing(exc):
                raise self._fail(exc, f"remove {self.location.uri(key)}") from None

    def remove_tree(self, key: str) -> int:
        count = 0
        for page in self._list(key, delimiter=False):
            objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if not objects:
                continue
            try:
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
                )
            except Exception as exc:
                raise self._fail(exc, f"remove {self.location.uri(key)}") from None
            count += len(objects)
        return count

    @contextlib.contextmanager
    def lease(self, key: str, holder: str, *, on_lost: Callable[[str], None]) -> Iterator[Lease]:
        """Hold the lake for this process: a lock object created with ``If-None-Match: *``
        and renewed every ``RENEW_SECONDS`` with ``If-Match`` its own last ETag. One held by
        a process gone from this host, or not renewed for ``LEASE_SECONDS``, is taken over
        (``If-Match`` the ETag read: one contender wins). A renewal that loses means another
        process took the lake: ``on_lost`` is called (the holder must stop writing). Take it
        after ``probe``: a store that ignores conditional writes cannot keep a lease."""
        lease = self._acquire(key, holder)
        thread = threading.Thread(
            target=self._renew, args=(lease, on_lost), name="pgcdc-lease", daemon=True
        )
        thread.start()
        try:
            yield lease
        finally:
            lease.stop.set()
            thread.join(timeout=30)
            with contextlib.suppress(StorageError):
                found = self.read(key)
                if found is not None and found.tag == lease.tag:
                    self.remove(key)

    def probe(self, key: str) -> None:
        """Write a probe object under ``key`` (conditionally, as the lease and the state are
        written) and remove it; refuse a store that ignores If-None-Match/If-Match on PUT
        (several S3-compatible ones do): the lease would then let two processes hold the lake
        at once."""
        probe = f"{key}/.probe-{uuid.uuid4().hex}" if key else f".probe-{uuid.uuid4().hex}"
        written = False
        try:
            tag = self.write(probe, b"1", expect=None)
            written = True
            for expect in (None, tag + "x"):  # exists; another version
                try:
                    self.write(probe, b"2", expect=expect)
                except StoreConflict:
                    continue
                endpoint = (self.location.s3.endpoint if self.location.s3 else None) or "AWS S3"
                raise StorageError(
                    f"the store at {endpoint} ignores conditional writes (If-None-Match and "
                    "If-Match on PUT): pgcdc cannot keep a second process off the lake there. "
                    "Fix: use a store that supports them (AWS S3, a recent MinIO), or a local "
                    "lake"
                )
        except BaseException:
            if written:
                with contextlib.suppress(StorageError):
                    self.remove(probe)
            raise
        self.remove(probe)  # a run removes objects too (the lease, vacuums): refused, it fails

    def _body(self, holder: str) -> dict[str, Any]:
        return {
            "holder": holder,
            "owner": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "process_start": _process_start(os.getpid()),
            "pid_namespace": _pid_namespace(),
            "until": time.time() + LEASE_SECONDS,
        }

    def _acquire(self, key: str, holder: str) -> _Lease:
        body = self._body(holder)
        for _ in range(5):
            try:
                tag = self.write(key, json.dumps(body).encode(), expect=None)
                return _Lease(key, body, tag)
            except StoreConflict:
                pass
            found = self.read(key)
            if found is None:
                continue  # released meanwhile
            try:
                other = json.loads(found.data)
            except ValueError:
                other = {}
            if other.get("owner") == body["owner"]:  # a retried PUT whose first try landed
                return _Lease(key, body, found.tag)
            if not _expired(other):
                until = datetime.fromtimestamp(float(other.get("until", 0)), UTC)
                raise StoreConflict(
                    f"{other.get('holder', 'another process')} on {other.get('host', '?')} "
                    f"(its lease runs until {until:%Y-%m-%d %H:%M:%S} UTC unless renewed)"
                )
            body["until"] = time.time() + LEASE_SECONDS
            try:
                tag = self.write(key, json.dumps(body).encode(), expect=found.tag)
            except StoreConflict:
                continue  # another contender took it first: read again
            log.info("took over the lake's lease of %s", other.get("holder", "a gone process"))
            return _Lease(key, body, tag)
        raise StoreConflict("another process (the lease changed hands during five attempts)")

    def _renew(self, lease: _Lease, on_lost: Callable[[str], None]) -> None:
        while not lease.stop.wait(RENEW_SECONDS):
            # the lease runs on only once the store has the renewal: a failed PUT must not
            # extend it in this process (``check`` would pass while the stored one ran out)
            body = {**lease.body, "until": time.time() + LEASE_SECONDS}
            try:
                lease.tag = self.write(lease.key, json.dumps(body).encode(), expect=lease.tag)
                lease.body = body
            except StoreConflict:
                holder = "another process"
                with contextlib.suppress(StorageError, ValueError, AttributeError):
                    found = self.read(lease.key)
                    if found is not None:
                        other = json.loads(found.data)
                        if other.get("owner") == lease.body["owner"]:
                            lease.tag = found.tag  # a retried PUT whose first try landed
                            lease.body["until"] = other["until"]
                            continue
                        holder = other.get("holder", holder)
                lease.lost = holder
                on_lost(holder)
                return
            except StorageError as exc:  # the store unreachable: try again, the lease runs on
                log.warning("could not renew the lake's lease: %s", exc)


#: How long pgcdc waits for a store that does not answer (or answers 5xx) before a request
#: fails: about as long as S3A's own retries in Spark's writes last
STORE_PATIENCE = 180.0

_UNREACHABLE = (
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ConnectionError",
)
_BUSY = ("500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown")


def _arrow_attempts() -> int:
    """Attempts of Arrow's S3 requests for them to wait out a store down for
    ``STORE_PATIENCE`` seconds as boto3's do: the AWS SDK's default strategy waits 25 ms x
    2^n before its n-th retry (Arrow's default of 3 attempts gives up in 0.2 s)."""
    attempts, waited = 1, 0.0
    while waited < STORE_PATIENCE:
        attempts += 1
        waited += 0.025 * 2 ** (attempts - 1)
    return attempts


def _transient(exc: Exception) -> bool:
    return type(exc).__name__ in _UNREACHABLE or _code(exc) in _BUSY


class _Patient:
    """A boto3 client whose requests wait out a store that is down or overloaded for up to
    ``STORE_PATIENCE`` seconds (botocore's own retries give up after a few seconds)."""

    def __init__(self, client: Any, location: LakeLocation) -> None:
        self._client = client
        self._location = location

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        def call(**kwargs: Any) -> Any:
            deadline = time.monotonic() + STORE_PATIENCE
            delay = 0.5
            while True:
                try:
                    return method(**kwargs)
                except Exception as exc:
                    if not _transient(exc) or time.monotonic() + delay > deadline:
                        raise
                    log.warning(
                        "the lake's store %s: %s; trying again in %.1f s",
                        self._location.root,
                        type(exc).__name__,
                        delay,
                    )
                    time.sleep(delay)
                    delay = min(delay * 2, 10.0)

        return call


def _expired(body: dict[str, Any]) -> bool:
    """Whether a lease's holder is gone: its time ran out, or it was a process of this host
    that no longer runs."""
    try:
        if float(body.get("until", 0)) < time.time():
            return True
    except (TypeError, ValueError):
        return True
    if (
        body.get("host") == socket.gethostname()
        and isinstance(body.get("pid"), int)
        # a host name is shared by containers with host networking, a pid namespace is not:
        # only a holder of this very namespace can be seen to be gone
        and body.get("pid_namespace") is not None
        and body.get("pid_namespace") == _pid_namespace()
    ):
        return _process_start(body["pid"]) != body.get("process_start")
    return False


def _user() -> str:
    """This process's user, for messages about permissions."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _pid_namespace() -> str | None:
    """This process's pid namespace and boot (pids mean something only within both)."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f"{ns} {f.read().strip()}"
    except OSError:
        return None


def _missing(exc: Exception) -> bool:
    """Whether a request failed because the object is not there (GET, HEAD, DELETE)."""
    return _code(exc) in ("NoSuchKey", "404", "NotFound")


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        code = error.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(code)
    return ""


def s3_error(exc: Exception, location: LakeLocation, what: str) -> StorageError:
    """A store's failure as pgcdc's error, naming the setting or step that fixes it."""
    code = _code(exc)
    bucket = location.bucket
    if code in ("NoSuchBucket",):
        return StorageError(
            f"cannot {what}: the bucket {bucket!r} does not exist. Fix: create it, or correct "
            "lake.path (pgcdc creates no buckets)"
        )
    if code in ("AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "403"):
        return StorageError(
            f"cannot {what}: the store refused the credentials ({code}). Fix: set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in pgcdc's "
            f"environment to keys that may read and write s3://{bucket}"
        )
    if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return StorageError(
            f"cannot {what}: no AWS credentials found. Fix: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in pgcdc's environment"
        )
    if type(exc).__name__ in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionError"):
        endpoint = location.s3.endpoint if location.s3 else None
        return StorageError(
            f"cannot {what}: the store at {endpoint or 'AWS S3'} did not answer. Fix: check "
            "lake.s3.endpoint and that the store runs"
        )
    return StorageError(f"cannot {what}: {type(exc).__name__} {code}".rstrip())


_STORES: dict[LakeLocation, LakeStore] = {}
#: the S3 lakes this process set up, by root: how to reach a URI in one (``LakePath.parse``)
_KNOWN: dict[str, LakeLocation] = {}
_STORES_LOCK = threading.Lock()


def _store(location: LakeLocation) -> LakeStore:
    with _STORES_LOCK:
        store = _STORES.get(location)
        if store is None:
            store = S3Store(location) if location.is_s3 else LocalStore(location.root)
            _STORES[location] = store
        return store
