"""Delta Lake's lower-level JVM APIs, wrapped in one place: a table's log, its deletion-vector
store and its commit API, as Delta's own DML commands use them.

pgcdc's write path commits most batches itself instead of running Delta's MERGE (whose cost
follows the table's size, not the batch's): the batch's rows are written as new Parquet files,
the rows they replace are marked in deletion vectors, and the table moves in one commit. Every
step goes through Delta's Spark connector (``io.delta:delta-spark``, pinned with pyspark in
``pgcdc.lake.store.delta.DELTA_VERSION``) over py4j:

* ``DeltaLog.forTable`` / ``update`` for the table's version and metadata (no Spark job);
* the log store's ``read`` for the commits since a version (their JSON files, as
  ``DeltaLog.getChanges`` reads them: application transactions, commit metadata, files added
  and removed; no Spark job);
* ``HadoopFileSystemDVStore`` to read a file's deletion vector and write the new ones (one
  file of deletion vectors per commit, as Delta's DML does), each a ``RoaringBitmapArray`` in
  its portable format (``pgcdc.lake.store.deletion_vectors`` builds the bytes);
* ``OptimisticTransaction.commit`` started from the snapshot the batch read, so that Delta's
  conflict checks see every concurrent commit (a compaction that removed a file this commit
  marks rows of makes it fail; the caller writes again), recorded as the operation Delta's own
  writers would record (``STREAMING UPDATE`` for a batch, ``WRITE`` for the copy's files), so
  that Delta derives the new version's checksum from the previous one instead of rebuilding
  the table's state from its log after the commit.

Nothing here reads rows. The APIs used are those of ``DELTA_VERSION``; tests run them against
Spark's Delta reader and delta-rs, and against the MERGE path, on the pinned version.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]

from pgcdc.lake.store import deletion_vectors
from pgcdc.lake.store.delta import user_metadata

__all__ = [
    "Commit",
    "CommitOperation",
    "DataFile",
    "TableLog",
    "write_checksums",
]

#: per (table path, app id): (table version, the app's transaction version then)
_TXNS: dict[tuple[str, str], tuple[int, int | None]] = {}
_TXN_LOCK = threading.Lock()
#: the Delta logs this process committed to, by table path (``write_checksums``), and the
#: versions whose checksum file it wrote
_COMMITTED: dict[str, Any] = {}
_CHECKSUMMED: dict[str, int] = {}

log = logging.getLogger("pgcdc.lake")

#: What a commit records as its operation (``TableLog.commit``)
CommitOperation = Literal["stream", "write"]


@dataclass(frozen=True, slots=True)
class DataFile:
    """A data file as the table's log lists it (its ``add`` action, as JSON fields)."""

    path: str
    size: int
    #: the rows the file holds, deleted ones included (``numRecords``); -1 when unknown
    records: int
    stats: str | None = None
    modification_time: int = 0
    deletion_vector: Mapping[str, Any] | None = None
    partition_values: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] | None = None

    @property
    def deleted(self) -> int:
        """Rows its deletion vector marks deleted."""
        dv = self.deletion_vector
        return 0 if dv is None else int(dv.get("cardinality", 0))

    @classmethod
    def from_add(cls, add: Mapping[str, Any]) -> DataFile:
        stats = add.get("stats")
        records = -1
        if isinstance(stats, str):
            try:
                records = int(json.loads(stats).get("numRecords", -1))
            except (ValueError, TypeError, AttributeError):
                records = -1
        return cls(
            path=str(add["path"]),
            size=int(add.get("size", 0)),
            records=records,
            stats=stats if isinstance(stats, str) else None,
            modification_time=int(add.get("modificationTime", 0)),
            deletion_vector=add.get("deletionVector"),
            partition_values=dict(add.get("partitionValues") or {}),
            tags=add.get("tags"),
        )

    def add_action(self, *, data_change: bool = True) -> dict[str, Any]:
        add: dict[str, Any] = {
            "path": self.path,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "modificationTime": self.modification_time,
            "dataChange": data_change,
        }
        if self.stats is not None:
            add["stats"] = self.stats
        if self.deletion_vector is not None:
            add["deletionVector"] = dict(self.deletion_vector)
        if self.tags:
            add["tags"] = dict(self.tags)
        return {"add": add}

    def remove_action(self, now: int, *, data_change: bool = True) -> dict[str, Any]:
        remove: dict[str, Any] = {
            "path": self.path,
            "deletionTimestamp": now,
            "dataChange": data_change,
            "extendedFileMetadata": True,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
        }
        if self.stats is not None:
            remove["stats"] = self.stats
        if self.deletion_vector is not None:
            remove["deletionVector"] = dict(self.deletion_vector)
        if self.tags:
            remove["tags"] = dict(self.tags)
        return {"remove": remove}


@dataclass(frozen=True, slots=True)
class Commit:
    """One commit of a table's log, as ``TableLog.commits`` reads it."""

    version: int
    #: application transactions it recorded: app id -> version
    transactions: Mapping[str, int]
    #: pgcdc's commit metadata (``{"pgcdc": ...}`` in its ``userMetadata``), if any
    metadata: Mapping[str, Any] | None
    operation: str | None
    added: tuple[DataFile, ...]
    removed: tuple[str, ...]
    #: whether it changed the table's metadata (schema, properties) or protocol
    changed_metadata: bool
    #: when it was committed (its ``commitInfo``'s timestamp, milliseconds since the epoch)
    timestamp: int | None = None


def _loose_stats(stats: str | None) -> str | None:
    """A file's statistics once some of its rows are marked deleted: its bounds still hold,
    but they need no longer be reached (``tightBounds`` false, as Delta's DML writes them)."""
    if stats is None:
        return None
    try:
        parsed = json.loads(stats)
    except ValueError:
        return stats
    if not isinstance(parsed, dict) or parsed.get("tightBounds") is False:
        return stats
    parsed["tightBounds"] = False
    return json.dumps(parsed, separators=(",", ":"))


class _Classes:
    """The JVM classes (and constants) this module calls, looked up once per gateway: each
    step of a name like ``jvm.org.apache.spark.sql.delta.actions.Action`` is a gateway round
    trip of its own, and a batch's commits made thousands of them."""

    def __init__(self, jvm: Any) -> None:
        delta = jvm.org.apache.spark.sql.delta
        self.DeltaLog = delta.DeltaLog
        self.Action = delta.actions.Action
        self.DeletionVectorDescriptor = delta.actions.DeletionVectorDescriptor
        self.HadoopFileSystemDVStore = delta.storage.dv.HadoopFileSystemDVStore
        self.portable = delta.deletionvectors.RoaringBitmapArrayFormat.Portable()
        self.FileNames = delta.util.FileNames
        self.WriteChecksum = getattr(delta.hooks, "ChecksumHook$WriteChecksum")
        self.StreamingUpdate = delta.DeltaOperations.StreamingUpdate
        self.Write = delta.DeltaOperations.Write
        self.update_mode = jvm.org.apache.spark.sql.streaming.OutputMode.Update()
        self.append = jvm.org.apache.spark.sql.SaveMode.Append
        self.SparkSession = jvm.org.apache.spark.sql.SparkSession
        self.Option = jvm.scala.Option
        self.none = jvm.scala.Option.empty()
        self.converters = jvm.scala.jdk.javaapi.CollectionConverters
        self.ArrayList = jvm.java.util.ArrayList
        self.UUID = jvm.java.util.UUID
        self.String = jvm.java.lang.String
        self.HadoopPath = jvm.org.apache.hadoop.fs.Path
        # static methods called per table or per action, resolved once: a class's member is
        # looked up by a gateway call of its own each time it is named
        self.for_table = self.DeltaLog.forTable
        self.action_from_json = self.Action.fromJson
        self.option = self.Option.apply
        self.as_java = self.converters.asJava
        self.as_scala = self.converters.asScala
        self.set_active_session = self.SparkSession.setActiveSession
        self.random_uuid = self.UUID.randomUUID
        self.dv_path = self.DeletionVectorDescriptor.assembleDeletionVectorPath
        self.on_disk_dv = self.DeletionVectorDescriptor.onDiskWithRelativePath
        self.delta_file = self.FileNames.unsafeDeltaFile
        self.join = self.String.join
        # pgcdc's jar (``jvm/``): a commit's calls per action and per vector as one; None
        # when the session did not load it (py4j names a missing class as a package)
        batched = jvm.dev.pgcdc.delta.BatchedCalls
        self.batched = batched if isinstance(batched, JavaClass) else None


_CLASSES: dict[int, _Classes] = {}
_CLASSES_LOCK = threading.Lock()


def _classes(jvm: Any) -> _Classes:
    with _CLASSES_LOCK:
        found = _CLASSES.get(id(jvm))
        if found is None:
            found = _CLASSES[id(jvm)] = _Classes(jvm)
        return found


class _WrittenVectors:
    """The row indexes of the deletion vectors this process wrote, by table path, vector file
    and offset (those name a vector's bytes for good: Delta never rewrites a file of vectors),
    so that the next batch marking more rows of the same data file merges with them without
    reading them back through the gateway. Bounded by the row indexes held (the oldest go
    first); a vector not held is read by Delta's store."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: OrderedDict[tuple[str, str, int], np.ndarray] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def put(self, key: tuple[str, str, int], values: np.ndarray) -> None:
        with self._lock:
            self._held[key] = values
            self._size += int(values.size)
            while self._size > self.limit and self._held:
                _, gone = self._held.popitem(last=False)
                self._size -= int(gone.size)

    def take(self, key: tuple[str, str, int]) -> np.ndarray | None:
        with self._lock:
            values = self._held.pop(key, None)
            if values is not None:
                self._size -= int(values.size)
            return values


#: 16M row indexes: 128 MiB at most
_WRITTEN_VECTORS = _WrittenVectors(16 << 20)


def _vector_key(path: str, vector: Mapping[str, Any]) -> tuple[str, str, int]:
    return (path, str(vector["pathOrInlineDv"]), int(vector.get("offset") or 0))


_DV_STORES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _dv_store(spark: Any, c: _Classes) -> Any:
    """Delta's deletion-vector store over ``spark``'s Hadoop configuration, one per session (a
    new Hadoop configuration copies every setting: a tenth of the driver's time in a batch's
    commits)."""
    with _CLASSES_LOCK:
        store = _DV_STORES.get(spark)
        if store is None:
            hadoop = spark._jsparkSession.sessionState().newHadoopConf()
            store = _DV_STORES[spark] = c.HadoopFileSystemDVStore(hadoop)
        return store


class TableLog:
    """One Delta table's log through the connector's JVM classes (a driver-side handle; cheap
    to make: Delta caches its ``DeltaLog`` per path)."""

    __slots__ = ("_c", "_jvm", "_log", "_spark", "path")

    def __init__(self, spark: Any, path: str) -> None:
        self._spark = spark
        self._jvm = spark.sparkContext._jvm
        self._c = _classes(self._jvm)
        self.path = str(path)
        self._log = self._c.for_table(spark._jsparkSession, self.path)

    # -- reading ---------------------------------------------------------------------------

    def snapshot(self) -> Any:
        """The table's latest snapshot (a JVM object; the log listed, no Spark job)."""
        return self._log.update(False, self._c.none, self._c.none)

    def version(self) -> int:
        """The table's latest version; -1 when there is no table."""
        return int(self.snapshot().version())

    def checkpoint_version(self, snapshot: Any | None = None) -> int:
        """The version of the snapshot's newest checkpoint; -1 without one."""
        snap = self.snapshot() if snapshot is None else snapshot
        return int(snap.checkpointProvider().version())

    def checkpoint(self, snapshot: Any) -> None:
        """Write a checkpoint of ``snapshot`` (Delta's own: its Parquet file and
        ``_last_checkpoint``; it also removes log files past the log's retention). Safe beside
        commits: a checkpoint describes a version already committed."""
        self._log.checkpoint(snapshot, self._c.none)

    def schema(self, snapshot: Any | None = None) -> dict[str, Any]:
        """The table's schema as Delta's JSON (with column mapping's physical names)."""
        snap = self.snapshot() if snapshot is None else snapshot
        return dict(json.loads(snap.metadata().schemaString()))

    def column_names(self, snapshot: Any | None = None) -> list[str] | None:
        """The table's columns, in order; None when there is no table (no Spark job)."""
        snap = self.snapshot() if snapshot is None else snapshot
        if int(snap.version()) < 0:
            return None
        return [str(field["name"]) for field in self.schema(snap)["fields"]]

    def files(self, snapshot: Any | None = None) -> list[DataFile]:
        """The snapshot's data files (one Spark job over the log's state)."""
        snap = self.snapshot() if snapshot is None else snapshot
        return [
            DataFile.from_add(json.loads(a.json())["add"]) for a in snap.allFiles().collectAsList()
        ]

    def commits(self, start: int, end: int | None = None) -> Iterator[Commit]:
        """The commits from version ``start`` (to ``end``, inclusive; default the latest), in
        order, each read from its JSON file through the table's log store (a few gateway calls
        a commit, whatever its actions). Raises LookupError when a commit of the range is no
        longer in the log."""
        c = self._c
        last = self.version() if end is None else int(end)
        store = self._log.store()
        hadoop = self._log.newDeltaHadoopConf()
        log_path = self._log.logPath()
        for version in range(int(start), last + 1):
            try:
                lines = store.read(c.delta_file(log_path, version), hadoop)
            except Exception as exc:  # py4j's error: the file is gone (or the log unreadable)
                raise LookupError(f"{self.path}: commit {version} is not in the log") from exc
            text = c.join("\n", c.as_java(lines))
            yield _parse_commit(version, [line for line in str(text).split("\n") if line])

    def newest_commits(self, limit: int) -> Iterator[Commit]:
        """The table's latest ``limit`` commits, newest first, read back in growing windows
        of the log's JSON files (stops early where its caller does, or where the JSON files
        were cleaned up after a checkpoint)."""
        end, width, seen = self.version(), 8, 0
        while end >= 0 and seen < limit:
            start = max(0, end - width + 1, end - (limit - seen) + 1)
            try:
                window = list(self.commits(start, end))
            except LookupError:
                return
            for commit in reversed(window):
                seen += 1
                yield commit
            end, width = start - 1, width * 4

    def transaction_version(self, app_id: str) -> int | None:
        """The latest version of application transaction ``app_id`` the table recorded (None:
        none, or no table): from the newest commit that recorded one (each batch's commit
        does; a compaction's or a vacuum's does not), searched back from the latest commit in
        the log's JSON files (no Spark job), remembered per table version. Only when those
        files no longer reach such a commit, from the table's state (a Spark job)."""
        latest = self.version()
        if latest < 0:
            return None
        key = (self.path, app_id)
        with _TXN_LOCK:
            known = _TXNS.get(key)
        if known is not None and known[0] == latest:
            return known[1]
        if known is not None and known[0] < latest:
            newer = self._newest_transaction(app_id, known[0] + 1, latest)
            found = known[1] if newer is None else newer
        else:
            found = self._search_back(app_id, latest)
        with _TXN_LOCK:
            _TXNS[key] = (latest, found)
        return found

    def _newest_transaction(self, app_id: str, start: int, end: int) -> int | None:
        """The version of ``app_id``'s transaction in the newest of commits ``start``..``end``
        that recorded one (raises LookupError when one of them is not in the log)."""
        found = None
        for commit in self.commits(start, end):
            found = commit.transactions.get(app_id, found)
        return found

    def _search_back(self, app_id: str, latest: int) -> int | None:
        end, width = latest, 8
        while end >= 0:
            start = max(0, end - width + 1)
            try:
                found = self._newest_transaction(app_id, start, end)
            except LookupError:  # the JSON files were cleaned up after a checkpoint
                state = self.snapshot().transactions()
                return int(state.get(app_id).get()) if state.contains(app_id) else None
            if found is not None:
                return found
            end, width = start - 1, width * 4
        return None

    def version_before(self, app_id: str, txn_version: int) -> int | None:
        """The table's version just before the commit that recorded application transaction
        ``(app_id, txn_version)``: what the table held before that write. None when the table
        or that commit's entry is no longer in the log's JSON files."""
        latest = self.version()
        start = latest
        step = 8
        while start >= 0:
            try:
                commits = list(self.commits(start, latest))
            except LookupError:
                return None
            for commit in reversed(commits):
                if commit.transactions.get(app_id) == txn_version:
                    return commit.version - 1
            latest = start - 1
            start = max(0, start - step)
            step *= 4
        return None

    # -- deletion vectors ------------------------------------------------------------------

    def mark_deleted(self, marks: Sequence[tuple[DataFile, np.ndarray]]) -> dict[str, DataFile]:
        """Write deletion vectors marking the rows ``marks`` gives (row indexes in each file)
        deleted, each merged with the file's current one, into one new file of deletion
        vectors in the table's folder (Delta's store); each file as it is to be added back.

        A few gateway calls a commit, whatever the files marked (a batch of a hundred tables
        touches thousands): the vectors are encoded here and written by one call. A file's
        current vector is taken from the ones this process wrote (a vector's
        file and offset name its bytes for good: ``_WrittenVectors``), else read by Delta's
        store."""
        if not marks:
            return {}
        c = self._c
        store = _dv_store(self._spark, c)
        table_path = c.HadoopPath(self.path)
        vectors: list[tuple[DataFile, np.ndarray, bytes]] = []
        for data_file, rows in marks:
            values = np.unique(np.asarray(rows, dtype=np.int64))
            if values.size and (values[0] < 0 or values[-1] >= 2**31):
                raise ValueError(f"{self.path}: row index out of range for a deletion vector")
            if data_file.deletion_vector is not None:
                values = np.union1d(values, self._stored_vector(store, table_path, data_file))
            if data_file.records >= 0 and values.size > data_file.records:
                raise RuntimeError(
                    f"{self.path}: a deletion vector of {data_file.path} would mark "
                    f"{values.size} rows of its {data_file.records}"
                )
            vectors.append((data_file, values, deletion_vectors.encode(values)))
        file_id = c.random_uuid()
        dv_file = store.pathWithFileSystem(c.dv_path(table_path, file_id, ""))
        ranges = self._write_vectors(store, dv_file, [encoded for *_, encoded in vectors])
        # the same file of vectors for every file marked: its descriptor's fields asked once
        descriptor = c.on_disk_dv(
            file_id, "", ranges[0][1], int(vectors[0][1].size), c.option(ranges[0][0]), c.none
        )
        storage_type = str(descriptor.storageType())
        path_or_inline = str(descriptor.pathOrInlineDv())
        updated: dict[str, DataFile] = {}
        remembered: list[tuple[tuple[str, str, int], np.ndarray]] = []
        for (data_file, values, _), (offset, length) in zip(vectors, ranges, strict=True):
            vector = {
                "storageType": storage_type,
                "pathOrInlineDv": path_or_inline,
                "offset": offset,
                "sizeInBytes": length,
                "cardinality": int(values.size),
            }
            remembered.append((_vector_key(self.path, vector), values))
            updated[data_file.path] = replace(
                data_file, deletion_vector=vector, stats=_loose_stats(data_file.stats)
            )
        for key, values in remembered:  # only once the file of vectors is whole
            _WRITTEN_VECTORS.put(key, values)
        return updated

    def _write_vectors(
        self, store: Any, dv_file: Any, vectors: list[bytes]
    ) -> list[tuple[int, int]]:
        """Write ``vectors`` (encoded) one after another into the new file of vectors
        ``dv_file`` through Delta's store; each one's (offset, length) in it, once the file is
        whole. One gateway call with pgcdc's jar (``BatchedCalls.writeVectors``), else three a
        vector."""
        batched = self._c.batched
        if batched is not None:
            ranges = str(
                batched.writeVectors(
                    store, dv_file, b"".join(vectors), ",".join(str(len(v)) for v in vectors)
                )
            )
            pairs = [item.split(":") for item in ranges.split(",")]
            return [(int(offset), int(length)) for offset, length in pairs]
        writer = store.createWriter(dv_file)
        try:
            written = [writer.write(v) for v in vectors]
            return [(int(w.offset()), int(w.length())) for w in written]
        finally:
            writer.close()

    def _stored_vector(self, store: Any, table_path: Any, data_file: DataFile) -> np.ndarray:
        """The row indexes ``data_file``'s current deletion vector marks."""
        vector = data_file.deletion_vector
        assert vector is not None
        key = _vector_key(self.path, vector)
        known = _WRITTEN_VECTORS.take(key)  # replaced by this write: not needed again
        if known is not None:
            return known
        descriptor = self._c.action_from_json(json.dumps(data_file.add_action())).deletionVector()
        previous = store.read(descriptor, table_path)
        return deletion_vectors.decode(bytes(previous.serializeAsByteArray(self._c.portable)))

    # -- committing ------------------------------------------------------------------------

    def commit(
        self,
        actions: Sequence[Mapping[str, Any]],
        *,
        snapshot: Any,
        session: Any,
        app_id: str | None,
        txn_version: int | None,
        metadata: Mapping[str, Any],
        operation: CommitOperation = "stream",
    ) -> int:
        """Commit ``actions`` (``add``/``remove`` JSON objects) on top of ``snapshot`` (the
        version they were computed from), with the application transaction ``(app_id,
        txn_version)`` and pgcdc's ``metadata`` as the commit's ``userMetadata``; the version
        committed. ``session``: the Spark session the commit runs in (made the thread's active
        one). Raises Delta's conflict exceptions when a concurrent commit conflicts.

        ``operation`` is what Delta records: ``"stream"`` a streaming writer's micro-batch
        (``STREAMING UPDATE``, as Delta's own streaming sink commits, with the batch's query
        and epoch), ``"write"`` an append of new rows (``WRITE``, the initial copy's files).
        Either is an operation Delta derives the new version's checksum (its protocol,
        metadata and file counts) for from the previous one's and the commit's actions; an
        unsafe ``Manual Update`` is not, and the state of the table after every such commit
        was a Spark job rebuilding it from the log (0.25-0.3 s a commit here)."""
        c = self._c
        now = int(time.time() * 1000)
        lines = [json.dumps(a) for a in actions]
        if app_id is not None and txn_version is not None:
            lines.append(
                json.dumps(
                    {"txn": {"appId": app_id, "version": int(txn_version), "lastUpdated": now}}
                )
            )
        if c.batched is not None:  # one gateway call, not two an action
            java_actions = c.batched.actions(self._log, "\n".join(lines))
        else:
            java_actions = c.ArrayList()
            add = java_actions.add
            from_json = c.action_from_json
            for line in lines:
                add(from_json(line))
        sequence = c.as_scala(java_actions).toSeq()
        meta = c.option(user_metadata(metadata))
        if operation == "stream":
            op = c.StreamingUpdate(c.update_mode, app_id or "", int(txn_version or 0), meta)
        else:
            # Write(mode, partitionBy, predicate, userMetadata, and five options unset)
            none = c.none
            op = c.Write(c.append, none, none, meta, none, none, none, none, none)
        # Delta reads settings (and the WRITE operation its own) from the thread's active session
        c.set_active_session(session._jsparkSession)
        txn = self._log.startTransaction(c.none, c.option(snapshot))
        committed = int(txn.commit(sequence, op))
        with _TXN_LOCK:
            _COMMITTED[self.path] = self._log
        if app_id is not None and txn_version is not None:
            # the newest transaction of the app at that version: the next batch's check of
            # what the table holds reads no commit (``transaction_version``)
            with _TXN_LOCK:
                _TXNS[(self.path, app_id)] = (committed, int(txn_version))
        return committed


def write_checksums(spark: Any) -> int:
    """Write the checksum file (``<version>.crc``: protocol, metadata, file counts) of the
    latest version of each table this process committed to, from the checksum Delta derived
    in memory at the commit (``TableLog.commit``; no state rebuilt: a table without one is
    left out); how many were written. Commits write none (one file more per commit: 40% of a
    commit's time on a local lake); without one, the next process's first commit of each
    table rebuilt the table's state to derive its own (a Spark job a table: 95 s for the
    first batch over 100 tables here), and its start read each table's schema the same way.
    Called when a run stops without a failure."""
    with _TXN_LOCK:
        logs = dict(_COMMITTED)
        done = dict(_CHECKSUMMED)
    if not logs:
        return 0
    c = _classes(spark.sparkContext._jvm)
    session = spark.newSession()
    session.conf.set("spark.databricks.delta.writeChecksumFile.enabled", "true")
    written = 0
    for path, delta_log in logs.items():
        try:
            # the table as its log is now: the snapshot the last commit left, with its checksum,
            # unless something committed since (or the table was removed and made anew)
            snapshot = delta_log.update(False, c.none, c.none)
            version = int(snapshot.version())
            if version < 0 or done.get(path) == version or snapshot.checksumOpt().isEmpty():
                continue
            txn_id = snapshot.checksumOpt().get().txnId()
            c.WriteChecksum(
                session._jsparkSession,
                delta_log,
                str(txn_id.get()) if txn_id.isDefined() else "pgcdc",
                snapshot,
            )
        except Exception as exc:  # optional for every reader: the next commit does without
            log.warning("no checksum file written for %s: %s", path, exc)
            continue
        with _TXN_LOCK:
            _CHECKSUMMED[path] = version
        written += 1
    return written


def _parse_commit(version: int, lines: Sequence[str]) -> Commit:
    transactions: dict[str, int] = {}
    metadata: Mapping[str, Any] | None = None
    operation: str | None = None
    timestamp: int | None = None
    added: list[DataFile] = []
    removed: list[str] = []
    changed_metadata = False
    for line in lines:
        action = json.loads(line)
        if "txn" in action:
            txn = action["txn"]
            transactions[str(txn["appId"])] = int(txn["version"])
        elif "add" in action:
            added.append(DataFile.from_add(action["add"]))
        elif "remove" in action:
            removed.append(str(action["remove"]["path"]))
        elif "commitInfo" in action:
            info = action["commitInfo"]
            operation = info.get("operation")
            if isinstance(info.get("timestamp"), int):
                timestamp = int(info["timestamp"])
            text = info.get("userMetadata")
            if isinstance(text, str):
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict) and isinstance(parsed.get("pgcdc"), dict):
                    metadata = parsed["pgcdc"]
        elif "metaData" in action or "protocol" in action:
            changed_metadata = True
    return Commit(
        version=version,
        transactions=transactions,
        metadata=metadata,
        operation=operation,
        added=tuple(added),
        removed=tuple(removed),
        changed_metadata=changed_metadata,
        timestamp=timestamp,
    )
