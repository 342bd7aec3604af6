"""Test helpers: pgoutput byte streams built with the codec's Encoder, and recording plugins.

``Wire`` writes messages exactly as a walsender would send them (one payload per message, with
the WAL position it came with), allocating increasing LSNs; ``Recorder`` plugins log every
callback as a tuple so tests can compare whole delivery sequences.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pgcdc.decoding import (
    Assembler,
    Change,
    DecodingContext,
    LogicalMessage,
    OutputPlugin,
    RelationInfo,
    SchemaChange,
    StreamAbortInfo,
    Transaction,
    TruncateChange,
)
from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Encoder,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    ReplicationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    TupleValue,
    Update,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)

T_ID = 16384
U_ID = 16390


def rel(
    xid: int | None = None,
    *,
    relid: int = T_ID,
    name: str = "t",
    columns: tuple[tuple[str, int], ...] = (("id", 23), ("v", 25)),
    key: tuple[str, ...] = ("id",),
    ident: str = "d",
) -> Relation:
    return Relation(
        xid,
        relid,
        "public",
        name,
        ident,
        tuple(Column(1 if n in key else 0, n, oid, -1) for n, oid in columns),
    )


def ins(*values: TupleValue, xid: int | None = None, relid: int = T_ID) -> Insert:
    return Insert(xid, relid, tuple(values))


def upd(
    *values: TupleValue,
    old: tuple[TupleValue, ...] | None = None,
    xid: int | None = None,
    relid: int = T_ID,
) -> Update:
    return Update(xid, relid, "K" if old is not None else None, old, tuple(values))


def dele(*key: TupleValue, xid: int | None = None, relid: int = T_ID) -> Delete:
    return Delete(xid, relid, "K", tuple(key))


def msg(content: bytes, *, transactional: bool = True, xid: int | None = None) -> Message:
    return Message(xid, transactional, Lsn(0), "test", content)  # lsn set by Wire


class Wire:
    """A pgoutput stream under construction: ``out`` is [(payload, data_start)]."""

    def __init__(self, proto: int = 4, start: int = 0x1_0000_0000) -> None:
        self.enc = Encoder(proto)
        self._lsn = start
        self.out: list[tuple[bytes, int]] = []
        self.sent: list[ReplicationMessage] = []

    def tick(self, step: int = 0x40) -> Lsn:
        self._lsn += step
        return Lsn(self._lsn)

    def seek(self, lsn: int) -> None:
        """Continue allocating positions after ``lsn``."""
        self._lsn = lsn

    def put(self, message: ReplicationMessage, lsn: int | None = None) -> None:
        at = self.tick() if lsn is None else lsn
        if isinstance(message, Message):
            message = Message(
                message.xid, message.transactional, Lsn(at), message.prefix, message.content
            )
        self.sent.append(message)
        self.out.append((self.enc.encode(message), at))

    def take(self) -> list[tuple[bytes, int]]:
        out, self.out = self.out, []
        return out

    # -- regular and prepared transactions ---------------------------------------------
    def txn(
        self, xid: int, *messages: ReplicationMessage, origin: str | None = None
    ) -> tuple[Lsn, Lsn]:
        """Begin .. Commit; returns (commit LSN, end LSN)."""
        lsns = [self.tick() for _ in messages]
        commit = self.tick()
        end = self.tick(0x30)
        self.put(Begin(commit, T0, xid), lsns[0] if lsns else commit)
        if origin is not None:
            self.put(Origin(Lsn(0xABCDEF), origin), lsns[0] if lsns else commit)
        for m, at in zip(messages, lsns, strict=True):
            self.put(m, at)
        self.put(Commit(0, commit, end, T0), end)
        return commit, end

    def prepared(
        self, xid: int, gid: str, *messages: ReplicationMessage, origin: str | None = None
    ) -> tuple[Lsn, Lsn]:
        """Begin Prepare .. Prepare; returns (prepare LSN, end LSN)."""
        lsns = [self.tick() for _ in messages]
        prepare = self.tick()
        end = self.tick(0x30)
        self.put(BeginPrepare(prepare, end, T0, xid, gid), lsns[0] if lsns else prepare)
        if origin is not None:
            self.put(Origin(Lsn(0xABCDEF), origin))
        for m, at in zip(messages, lsns, strict=True):
            self.put(m, at)
        self.put(Prepare(0, prepare, end, T0, xid, gid), end)
        return prepare, end

    def commit_prepared(self, xid: int, gid: str) -> tuple[Lsn, Lsn]:
        commit = self.tick()
        end = self.tick(0x30)
        self.put(CommitPrepared(0, commit, end, T0 + timedelta(seconds=1), xid, gid), end)
        return commit, end

    def rollback_prepared(self, xid: int, gid: str, prepare_end: Lsn) -> Lsn:
        self.tick()
        end = self.tick(0x30)
        self.put(
            RollbackPrepared(0, prepare_end, end, T0, T0 + timedelta(seconds=1), xid, gid), end
        )
        return end

    # -- streamed transactions -----------------------------------------------------------
    def block(
        self,
        xid: int,
        *messages: ReplicationMessage,
        first: bool = False,
        origin: str | None = None,
    ) -> None:
        self.put(StreamStart(xid, first))
        if origin is not None:
            self.put(Origin(Lsn(0), origin))
        for m in messages:
            self.put(m)
        self.put(StreamStop())

    def stream_commit(self, xid: int) -> tuple[Lsn, Lsn]:
        commit = self.tick()
        end = self.tick(0x30)
        self.put(StreamCommit(xid, 0, commit, end, T0), end)
        return commit, end

    def stream_abort(self, xid: int, subxid: int, *, info: bool = False) -> None:
        at = self.tick()
        self.put(StreamAbort(xid, subxid, at if info else None, T0 if info else None), at)

    def stream_prepare(self, xid: int, gid: str) -> tuple[Lsn, Lsn]:
        prepare = self.tick()
        end = self.tick(0x30)
        self.put(StreamPrepare(0, prepare, end, T0, xid, gid), end)
        return prepare, end

    def plain_message(self, content: bytes) -> Lsn:
        at = self.tick()
        self.put(Message(None, False, at, "plain", content), at)
        return at


def feed(asm: Assembler, items: list[tuple[bytes, int]]) -> None:
    for payload, lsn in items:
        asm.feed_message(payload, lsn)


Event = tuple[Any, ...]


def _row(change: Change) -> tuple[Any, ...]:
    return change.new if change.new is not None else (change.old or ())


class Recorder(OutputPlugin):
    """Records every callback of a plugin delivered whole transactions."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.txns: list[Transaction] = []
        self.changes: list[Change] = []
        self.schema: list[SchemaChange] = []

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        self.txns.append(txn)
        self.events.append(("begin", txn.xid))

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: RelationInfo, change: Change
    ) -> None:
        assert relation is change.relation
        self.changes.append(change)
        self.events.append(("change", txn.xid, change.action.value, change.position, _row(change)))

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> Lsn | None:
        assert commit_lsn == txn.commit_lsn
        self.events.append(("commit", txn.xid))
        return None

    def schema_change(self, ctx: DecodingContext, txn: Transaction, change: SchemaChange) -> None:
        self.schema.append(change)
        self.events.append(
            (
                "schema",
                txn.xid,
                change.new.name,
                tuple(c.name for c in change.added),
                tuple(c.name for c in change.dropped),
                tuple(o.name for o, _ in change.retyped),
            )
        )

    # helpers for assertions
    def rows(self, xid: int | None = None) -> list[tuple[Any, ...]]:
        return [e[4] for e in self.events if e[0] == "change" and (xid is None or e[1] == xid)]

    def order(self) -> list[int]:
        return [e[1] for e in self.events if e[0] == "commit"]


class FullRecorder(Recorder):
    """Also truncate, message and origin filtering."""

    def __init__(self, skip_origins: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.skip_origins = skip_origins

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: tuple[RelationInfo, ...],
        change: TruncateChange,
    ) -> None:
        self.events.append(
            ("truncate", txn.xid, change.position, tuple(r.name for r in relations), change.cascade)
        )

    def message(
        self, ctx: DecodingContext, txn: Transaction | None, message: LogicalMessage
    ) -> Lsn | None:
        self.events.append(
            ("message", None if txn is None else txn.xid, message.position, message.content)
        )
        return None

    def filter_by_origin(self, ctx: DecodingContext, origin: str) -> bool:
        self.events.append(("filter_by_origin", origin))
        return origin in self.skip_origins


class TwoPhaseRecorder(Recorder):
    def __init__(self, filtered_gids: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.filtered_gids = filtered_gids

    def filter_prepare(self, ctx: DecodingContext, xid: int, gid: str) -> bool:
        return gid in self.filtered_gids

    def begin_prepare(self, ctx: DecodingContext, txn: Transaction) -> None:
        self.txns.append(txn)
        self.events.append(("begin_prepare", txn.xid, txn.gid))

    def prepare(self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn) -> Lsn | None:
        assert prepare_lsn == txn.prepare_lsn
        self.events.append(("prepare", txn.xid, txn.gid))
        return None

    def commit_prepared(
        self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn
    ) -> Lsn | None:
        self.events.append(("commit_prepared", txn.xid, txn.gid))
        return None

    def rollback_prepared(
        self, ctx: DecodingContext, txn: Transaction, prepare_end_lsn: Lsn, prepare_time: datetime
    ) -> Lsn | None:
        self.events.append(("rollback_prepared", txn.xid, txn.gid, prepare_end_lsn))
        return None


class StreamRecorder(Recorder):
    """A streaming plugin that applies subtransaction aborts the way StreamAbortInfo says."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[int, list[Change]] = {}
        self.applied: dict[int, list[tuple[Any, ...]]] = {}

    def stream_start(self, ctx: DecodingContext, txn: Transaction) -> None:
        self.events.append(("stream_start", txn.xid))

    def stream_stop(self, ctx: DecodingContext, txn: Transaction) -> None:
        self.events.append(("stream_stop", txn.xid))

    def stream_change(
        self, ctx: DecodingContext, txn: Transaction, relation: RelationInfo, change: Change
    ) -> None:
        self.pending.setdefault(txn.xid, []).append(change)
        self.events.append(("stream_change", txn.xid, change.position, change.xid, _row(change)))

    def stream_abort(self, ctx: DecodingContext, txn: Transaction, abort: StreamAbortInfo) -> None:
        self.events.append(
            (
                "stream_abort",
                txn.xid,
                abort.subxid,
                abort.top_level,
                abort.discard_from,
                abort.reason,
            )
        )
        kept = [c for c in self.pending.get(txn.xid, []) if c.position < abort.discard_from]
        self.pending[txn.xid] = kept

    def stream_commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> Lsn | None:
        self.events.append(("stream_commit", txn.xid))
        self.applied[txn.xid] = [_row(c) for c in self.pending.pop(txn.xid, [])]
        return None


class StreamTwoPhaseRecorder(StreamRecorder, TwoPhaseRecorder):
    def stream_prepare(
        self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn
    ) -> Lsn | None:
        self.events.append(("stream_prepare", txn.xid, txn.gid))
        return None
