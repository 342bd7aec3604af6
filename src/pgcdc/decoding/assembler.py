"""Transaction assembly: any pgoutput stream in, whole committed transactions out, in order.

The ``Assembler`` is sans-I/O: it is fed events (``WalData`` / ``Reconnected`` / ``Idle`` from
``pgcdc.replication``, or raw message bytes with their LSNs) and calls an output plugin's
callbacks, like PostgreSQL's reorder buffer does for a C output plugin. Which transaction each
message belongs to, and the order a stream must follow, is ``pgcdc.protocol.transactions``'
framer (shared with the Spark source); the assembler is its reader, with buffers and callbacks:

* Regular transactions (Begin .. Commit) are buffered until their Commit, then delivered
  (begin, changes, commit). A streaming plugin receives them the same way.
* Streamed transactions (``streaming = on`` / ``parallel``, protocol 2+): blocks (Stream Start ..
  Stream Stop) of many transactions interleave. For a plugin without streaming callbacks each
  top-level transaction's changes are buffered and delivered whole at its Stream Commit, in
  commit order. A Stream Abort of a subtransaction drops that subtransaction's changes exactly
  as PostgreSQL's apply worker does (``stream_abort_internal``: everything from the
  subtransaction's first change on, which covers its nested subtransactions); one of the
  top-level transaction drops all. A plugin with streaming callbacks receives the blocks live.
* Two-phase (protocol 3+): a plugin with two-phase callbacks receives a prepared transaction at
  its Prepare / Stream Prepare, then commit_prepared or rollback_prepared. For any other plugin
  the assembler holds the prepared transaction (spilled to disk if large) and delivers it as an
  ordinary transaction at Commit Prepared, or drops it at Rollback Prepared. While it holds one,
  ``safe_confirm_lsn`` never passes its prepare LSN, so after a reconnect the server sends it
  again rather than only its Commit Prepared.
* Transactional logical messages are delivered inside their transaction, non-transactional ones
  at once. Origin messages set ``Transaction.origin`` and are offered to ``filter_by_origin``
  (True skips the whole transaction, as PostgreSQL does).
* Relation and Type messages feed the relation cache; a relation whose definition changed is
  announced with the ``schema_change`` callback before the first change that uses it.

Reconnects: a ``Reconnected`` event drops every transaction still in progress (the server sends
it again from its start; a streaming plugin gets ``stream_abort`` with reason 'reconnect'),
keeps prepared transactions already complete, and from then on skips anything already
delivered: transactions whose commit LSN is before the end of the last finished one, streamed
transactions already finished (by xid), prepares already processed (by xid and prepare LSN),
non-transactional messages at or before the last one.

Memory: buffered messages are kept as their raw bytes (decoded again at delivery) and
accounted across all transactions against ``memory_limit``; beyond it the largest transaction
spills to a temporary file (``pgcdc.decoding.spill``), read back in order at delivery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from pgcdc.decoding.durability import Ledger
from pgcdc.decoding.errors import DecodingError
from pgcdc.decoding.plugin import Capabilities, DecodingContext, capabilities
from pgcdc.decoding.relations import RelationCache, RelationInfo, SchemaChange, TypeLookup
from pgcdc.decoding.spill import DEFAULT_MEMORY_LIMIT, ItemBuffer, Mark, SpillPool
from pgcdc.decoding.transaction import (
    Change,
    ChangeAction,
    LogicalMessage,
    StreamAbortInfo,
    Transaction,
    TruncateChange,
)
from pgcdc.lsn import Lsn
from pgcdc.protocol.decoder import MAX_PROTO_VERSION, Decoder
from pgcdc.protocol.errors import MESSAGE_NAMES
from pgcdc.protocol.message_types import MessageType, peek, relation_id
from pgcdc.protocol.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
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
    Truncate,
    Type,
    Update,
)
from pgcdc.protocol.transactions import Discard, TransactionFramer

if TYPE_CHECKING:
    from pgcdc.protocol.values.registry import TypeRegistry

__all__ = ["Assembler", "AssemblerStats"]

_Reason = Literal["abort", "reconnect", "restart", "duplicate"]

log = logging.getLogger(__name__)

_CODE_R = MessageType.RELATION
_CODE_Y = MessageType.TYPE
_CODE_T = MessageType.TRUNCATE
_CODE_M = MessageType.MESSAGE
_CODE_O = MessageType.ORIGIN

_REGULAR = "regular"
_PREPARED = "prepared"
_STREAM = "stream"


@dataclass(slots=True)
class AssemblerStats:
    """Counters of what the assembler did (for logs and metrics; no values)."""

    transactions: int = 0
    changes: int = 0
    messages: int = 0
    filtered: int = 0
    duplicates: int = 0
    aborted: int = 0
    subtransaction_aborts: int = 0
    rolled_back_prepared: int = 0
    reconnects: int = 0
    schema_changes: int = 0


class _Sub:
    """Where a subtransaction's first message went: the buffer, the relation definitions and
    the live position."""

    __slots__ = ("mark", "overlay_len", "position")

    def __init__(self, mark: Mark | None, overlay_len: int, position: int) -> None:
        self.mark = mark
        self.overlay_len = overlay_len
        self.position = position


class _Txn:
    """A transaction being received (or a prepared one held until it is resolved)."""

    __slots__ = (
        "block_open",
        "block_pending",
        "buffer",
        "commit_time",
        "filtered",
        "final_lsn",
        "gid",
        "info",
        "initial",
        "kind",
        "live",
        "next_position",
        "origin",
        "origin_lsn",
        "overlay",
        "overlay_log",
        "prepare_end_lsn",
        "prepare_lsn",
        "prepare_time",
        "skip",
        "started",
        "xid",
    )

    def __init__(self, xid: int, kind: str, buffer: ItemBuffer | None) -> None:
        self.xid = xid
        self.kind = kind
        self.buffer = buffer
        self.final_lsn: Lsn | None = None
        self.commit_time: datetime | None = None
        self.gid: str | None = None
        self.prepare_lsn: Lsn | None = None
        self.prepare_end_lsn: Lsn | None = None
        self.prepare_time: datetime | None = None
        self.origin: str | None = None
        self.origin_lsn: Lsn | None = None
        self.filtered = False
        self.skip = False
        # relation definitions: bound at first use from the cache, or given inside the txn
        self.initial: dict[int, RelationInfo] = {}
        self.overlay: dict[int, RelationInfo] = {}
        self.overlay_log: list[RelationInfo] = []
        # streaming plugins (live delivery of streamed blocks)
        self.live = False
        self.started = False
        self.block_open = False
        self.block_pending = False
        self.next_position = 0
        self.info: Transaction | None = None

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None


class _Reader:
    """The assembler as its framer's ``FrameReader``, without making the reader's methods part
    of the assembler's public interface: each is one of the assembler's private methods."""

    __slots__ = (
        "begin",
        "between",
        "block_start",
        "block_stop",
        "data",
        "discard",
        "end",
        "mark",
        "resolved",
        "stream_abort",
        "stream_data",
        "stream_end",
        "stream_finished",
        "stream_open",
    )

    def __init__(self, a: Assembler) -> None:
        self.begin = a._begin
        self.data = a._regular_data
        self.end = a._end
        self.between = a._between
        self.resolved = a._resolved
        self.stream_finished = a._stream_finished
        self.stream_open = a._stream_open
        self.block_start = a._block_start
        self.stream_data = a._stream_data
        self.block_stop = a._block_stop
        self.mark = a._mark
        self.stream_abort = a._stream_abort
        self.stream_end = a._stream_end
        self.discard = a._discard


def _name(code: int) -> str:
    return MESSAGE_NAMES.get(chr(code), f"type {chr(code)!r}")


class Assembler:
    """Reorder buffer and callback dispatcher for one replication stream.

    ``plugin`` is validated with ``pgcdc.decoding.plugin.capabilities`` (PluginError if a
    required callback is missing). ``proto_version`` is the stream's pgoutput protocol version
    (default: the highest, which decodes every version's messages); ``encoding`` the client
    encoding of text. ``memory_limit`` bounds the buffered message bytes of all transactions
    together; ``spill_dir`` is where the spill directory is made. ``registry`` (a
    ``TypeRegistry``) and ``type_lookup`` name column types (see ``RelationCache``).
    """

    def __init__(
        self,
        plugin: object,
        *,
        ctx: DecodingContext | None = None,
        proto_version: int | None = None,
        encoding: str = "utf-8",
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        spill_dir: str | None = None,
        registry: TypeRegistry | None = None,
        type_lookup: TypeLookup | None = None,
    ) -> None:
        self.caps: Capabilities = capabilities(plugin)
        self.plugin = plugin
        if ctx is None:
            ctx = DecodingContext(
                proto_version=proto_version,
                registry=registry,
                relations=RelationCache(registry, type_lookup),
            )
        elif type_lookup is not None:
            ctx.relations.type_lookup = type_lookup
        self.ctx = ctx
        self.relations: RelationCache = ctx.relations
        self._ledger = Ledger(auto=self.caps.auto_confirm)
        ctx._on_confirm = self._ledger.confirm
        self._pool = SpillPool(memory_limit, spill_dir)
        self._encoding = encoding
        self._proto_version: int | None = proto_version
        self._framer: TransactionFramer[_Txn, _Sub] = TransactionFramer(
            _Reader(self),
            Decoder(proto_version or MAX_PROTO_VERSION, encoding=encoding),
            where=lambda lsn: f" at {Lsn(lsn)}",
            error=DecodingError,
        )
        self._replay_decoder = Decoder(proto_version or MAX_PROTO_VERSION, encoding=encoding)
        self.stats = AssemblerStats()

        self._held: dict[int, _Txn] = {}
        self._prepared_seen: dict[int, Lsn] = {}
        self._stream_done: dict[int, Lsn] = {}
        self._hwm = Lsn(0)
        self._last_message_lsn = Lsn(0)
        self._delivered_view: dict[int, RelationInfo] = {}
        self._last_data = 0
        self._received = 0
        #: Latest walsender position reported by an Idle event.
        self.server_wal_end = Lsn(0)
        self._event_handlers: dict[type, Callable[[Any], None]] = {}

        p = plugin
        has = self.caps.has

        def cb(name: str) -> Callable[..., Any] | None:
            return getattr(p, name) if has(name) else None

        self._cb_begin: Callable[..., Any] = getattr(p, "begin")  # noqa: B009
        self._cb_change: Callable[..., Any] = getattr(p, "change")  # noqa: B009
        self._cb_commit: Callable[..., Any] = getattr(p, "commit")  # noqa: B009
        self._cb_truncate = cb("truncate")
        self._cb_message = cb("message")
        self._cb_filter_origin = cb("filter_by_origin")
        self._cb_filter_prepare = cb("filter_prepare")
        self._cb_begin_prepare = cb("begin_prepare")
        self._cb_prepare = cb("prepare")
        self._cb_commit_prepared = cb("commit_prepared")
        self._cb_rollback_prepared = cb("rollback_prepared")
        self._cb_stream_start = cb("stream_start")
        self._cb_stream_stop = cb("stream_stop")
        self._cb_stream_abort = cb("stream_abort")
        self._cb_stream_prepare = cb("stream_prepare")
        self._cb_stream_commit = cb("stream_commit")
        self._cb_stream_change = cb("stream_change")
        self._cb_stream_message = cb("stream_message")
        self._cb_stream_truncate = cb("stream_truncate")
        self._cb_schema_change = cb("schema_change")

    # -- public state --------------------------------------------------------------------
    @property
    def proto_version(self) -> int:
        return self._framer.decoder.proto_version

    def set_proto_version(self, proto_version: int) -> None:
        """Set the stream's protocol version (once known, before its first message)."""
        if proto_version == self._framer.decoder.proto_version:
            return
        if self.in_progress:
            raise RuntimeError("the protocol version cannot change in the middle of a stream")
        self._framer.decoder = Decoder(proto_version, encoding=self._encoding)
        self._replay_decoder = Decoder(proto_version, encoding=self._encoding)
        self._proto_version = proto_version
        self.ctx.proto_version = proto_version

    @property
    def last_data_lsn(self) -> Lsn:
        """Highest XLogData position received (dataStart or walEnd)."""
        return Lsn(self._last_data)

    @property
    def received_lsn(self) -> Lsn:
        """Highest XLogData dataStart received: a source accepts confirmations up to it."""
        return Lsn(self._received)

    @property
    def in_progress(self) -> bool:
        """Inside a transaction (Begin without its end) or a streamed block."""
        return self._framer.in_progress

    @property
    def open_transactions(self) -> int:
        """Transactions begun and not finished (a regular one and streamed ones)."""
        framer = self._framer
        return len(framer.streams()) + (1 if framer.current is not None else 0)

    @property
    def held_prepared(self) -> tuple[tuple[int, str | None, Lsn | None], ...]:
        """(xid, gid, prepare LSN) of prepared transactions held until COMMIT/ROLLBACK PREPARED."""
        return tuple((t.xid, t.gid, t.prepare_lsn) for t in self._held.values() if not t.filtered)

    @property
    def memory_bytes(self) -> int:
        """Buffered message bytes in memory now (payloads plus per-message overhead)."""
        return self._pool.memory_bytes

    @property
    def peak_memory_bytes(self) -> int:
        return self._pool.peak_memory_bytes

    @property
    def spilled_bytes(self) -> int:
        """Bytes written to spill files so far."""
        return self._pool.spilled_bytes

    @property
    def memory_limit(self) -> int:
        return self._pool.limit

    @property
    def spill_directory(self) -> str | None:
        d = self._pool.spill_directory
        return None if d is None else str(d)

    @property
    def durable_lsn(self) -> Lsn:
        """Everything finished before this position is durable (see ``durability.Ledger``)."""
        return self._ledger.durable

    @property
    def processed_lsn(self) -> Lsn:
        """End of the latest finished transaction or message, delivered or skipped."""
        return self._ledger.processed

    @property
    def unconfirmed(self) -> int:
        """Transactions delivered to an ``auto_confirm = False`` plugin and not yet confirmed."""
        return self._ledger.unconfirmed

    def safe_confirm_lsn(self, durable_lsn: int) -> Lsn:
        """``durable_lsn``, but never past the prepare LSN of a prepared transaction held here.

        Confirming past it would make the server skip the prepared transaction's changes after
        a reconnect (only its COMMIT PREPARED would come), and they exist only in this process.
        """
        lsn = Lsn(durable_lsn)
        for t in self._held.values():
            if not t.filtered and t.prepare_lsn is not None and t.prepare_lsn < lsn:
                lsn = t.prepare_lsn
        return lsn

    def note_confirmed(self, lsn: int) -> None:
        """The position ``lsn`` was confirmed to the server: forget what it can never resend."""
        self._prune(Lsn(lsn))

    # -- input ---------------------------------------------------------------------------
    def feed(self, event: object) -> None:
        """Feed one event: ``WalData``, ``Reconnected``, ``Idle`` (any objects with their
        attributes), or the bytes of one message."""
        handler = self._event_handlers.get(type(event))
        if handler is None:
            handler = self._classify(event)
        handler(event)

    def _classify(self, event: object) -> Callable[[Any], None]:
        cls = type(event)
        handler: Callable[[Any], None]
        if isinstance(event, bytes | bytearray | memoryview):
            handler = self.feed_message
        elif hasattr(event, "payload") and hasattr(event, "data_start"):

            def handler(e: Any) -> None:
                self.feed_message(e.payload, e.data_start, getattr(e, "wal_end", None))

        elif hasattr(event, "resume_lsn"):

            def handler(e: Any) -> None:
                self.reconnected(e.resume_lsn)

        elif hasattr(event, "server_wal_end"):

            def handler(e: Any) -> None:
                self.idle(e.server_wal_end)

        else:
            raise TypeError(
                f"cannot feed a {cls.__name__} to the assembler: expected WalData, Reconnected "
                "or Idle from pgcdc.replication, or the bytes of one pgoutput message"
            )
        self._event_handlers[cls] = handler
        return handler

    def idle(self, server_wal_end: int) -> None:
        """Nothing arrived for a while; the server has sent everything before this position."""
        if server_wal_end > self.server_wal_end:
            self.server_wal_end = Lsn(server_wal_end)

    def reconnected(self, resume_lsn: int) -> None:
        """The connection was re-established; the server resends from ``resume_lsn``."""
        resume = Lsn(resume_lsn)
        dropped = self.open_transactions
        block = self._framer.block
        if block is not None and block.block_open and self._cb_stream_stop is not None:
            block.block_open = False
            assert block.info is not None
            self._cb_stream_stop(self.ctx, block.info)
        self._framer.reset()  # discards every unfinished transaction
        self._prune(resume)
        self.stats.reconnects += 1
        log.info(
            "reconnected: resuming at %s; dropped %d transactions in progress, holding %d "
            "prepared, last finished transaction ended at %s",
            resume,
            dropped,
            len(self.held_prepared),
            self._hwm,
        )

    def feed_message(
        self,
        payload: bytes | bytearray | memoryview,
        data_start: int = 0,
        wal_end: int | None = None,
    ) -> None:
        """Feed the bytes of one pgoutput message and the WAL position it was sent with."""
        if not isinstance(payload, bytes):
            payload = bytes(payload)
        if data_start > self._received:
            self._received = data_start
            self._last_data = max(self._last_data, data_start)
        if wal_end is not None and wal_end > self._last_data:
            self._last_data = wal_end
        self._framer.feed(payload, data_start)

    # -- data messages -------------------------------------------------------------------
    def _decode(self, payload: bytes) -> ReplicationMessage:
        return self._framer.decoder.decode(payload)

    def _between(self, code: int, payload: bytes, lsn: int) -> None:
        """A Relation, Type or non-transactional Message outside any transaction."""
        message = self._decode(payload)
        if isinstance(message, Type):
            self.relations.add_type(message)
        elif isinstance(message, Relation):
            self.relations.apply(message)
        else:
            assert isinstance(message, Message)
            self._plain_message(message)

    def _bind(self, t: _Txn, relation_id: int, lsn: int, code: int) -> None:
        """Make sure a buffered change's relation will be known at delivery."""
        if relation_id in t.overlay or relation_id in t.initial:
            return
        info = self.relations.get(relation_id)
        if info is None:
            raise DecodingError(
                f"{_name(code)} at {Lsn(lsn)} in transaction {t.xid} changes relation id "
                f"{relation_id}, which no Relation message has described"
            )
        t.initial[relation_id] = info

    def _regular_data(self, t: _Txn, code: int, payload: bytes, lsn: int) -> None:
        if code == _CODE_O:
            self._origin(t, payload)
            return
        if code == _CODE_Y:
            message = self._decode(payload)
            assert isinstance(message, Type)
            self.relations.add_type(message)
            return
        if code == _CODE_R:
            # the server assumes the subscriber knows a relation once sent: apply it now
            relation = self._decode(payload)
            assert isinstance(relation, Relation)
            info = self.relations.apply(relation)
            if t.buffer is not None:
                t.overlay[info.relation_id] = info
                t.buffer.append(payload, lsn)
            return
        if code == _CODE_M:
            if not peek(payload, in_stream=False).transactional:
                message = self._decode(payload)
                assert isinstance(message, Message)
                self._plain_message(message)
                return
            if t.buffer is None or self._cb_message is None:
                return
        elif t.buffer is None:
            return
        elif code == _CODE_T:
            if self._cb_truncate is None:
                return
            truncate = self._decode(payload)
            assert isinstance(truncate, Truncate)
            for relid in truncate.relation_ids:
                self._bind(t, relid, lsn, code)
        else:
            self._bind(t, relation_id(payload, in_stream=False), lsn, code)
        t.buffer.append(payload, lsn)

    def _stream_data(self, st: _Txn, code: int, payload: bytes, lsn: int) -> None:
        if code == _CODE_O:
            self._origin(st, payload)
            return
        if st.block_pending:
            self._open_block(st)
        if code == _CODE_Y:
            message = self._decode(payload)
            assert isinstance(message, Type)
            self.relations.add_type(message)
            return
        if code == _CODE_M and not peek(payload, in_stream=True).transactional:
            message = self._decode(payload)
            assert isinstance(message, Message)
            self._plain_message(message)
            return
        if len(payload) < 9:
            self._decode(payload)  # too short for any streamed data message: raises
        if code == _CODE_R:
            relation = self._decode(payload)
            assert isinstance(relation, Relation)
            info = self.relations.build(relation)
            st.overlay_log.append(info)
            st.overlay[info.relation_id] = info
            if st.buffer is not None:
                st.buffer.append(payload, lsn)
            return
        if st.filtered:
            return
        if st.live:
            self._live_item(st, payload, lsn)
            return
        buffer = st.buffer
        assert buffer is not None
        if code == _CODE_M:
            if self._cb_message is None:
                return
        elif code == _CODE_T:
            if self._cb_truncate is None:
                return
            truncate = self._decode(payload)
            assert isinstance(truncate, Truncate)
            for relid in truncate.relation_ids:
                self._bind(st, relid, lsn, code)
        else:
            relid = relation_id(payload, in_stream=True)
            if relid not in st.overlay and relid not in st.initial:
                self._bind(st, relid, lsn, code)
        buffer.append(payload, lsn)

    def _resolve(self, t: _Txn, relation_id: int, lsn: int, code: int) -> RelationInfo:
        info = t.overlay.get(relation_id) or t.initial.get(relation_id)
        if info is None:
            self._bind(t, relation_id, lsn, code)
            info = t.initial[relation_id]
        return info

    def _live_item(self, st: _Txn, payload: bytes, lsn: int) -> None:
        message = self._decode(payload)
        txn = st.info
        assert txn is not None
        ctx = self.ctx
        change_lsn = Lsn(lsn) if lsn else None
        if isinstance(message, Insert | Update | Delete):
            rel = self._resolve(st, message.relation_id, lsn, payload[0])
            self._announce(txn, rel)
            change = self._make_change(message, rel, st.next_position, change_lsn)
            st.next_position += 1
            self.stats.changes += 1
            assert self._cb_stream_change is not None
            self._cb_stream_change(ctx, txn, rel, change)
        elif isinstance(message, Truncate):
            if self._cb_stream_truncate is None:
                return
            rels = tuple(self._resolve(st, r, lsn, payload[0]) for r in message.relation_ids)
            for rel in rels:
                self._announce(txn, rel)
            truncate = TruncateChange(
                rels,
                message.cascade,
                message.restart_identity,
                st.next_position,
                change_lsn,
                message.xid,
            )
            st.next_position += 1
            self._cb_stream_truncate(ctx, txn, rels, truncate)
        elif isinstance(message, Message):
            if self._cb_stream_message is None:
                return
            logical = LogicalMessage(
                message.lsn,
                True,
                message.prefix,
                message.content,
                st.next_position,
                message.xid,
            )
            st.next_position += 1
            self.stats.messages += 1
            self._cb_stream_message(ctx, txn, logical)

    def _plain_message(self, message: Message) -> None:
        """A non-transactional logical message: delivered at once."""
        if message.lsn <= self._last_message_lsn:
            self.stats.duplicates += 1
            return
        self._last_message_lsn = message.lsn
        end = Lsn(message.lsn + 1)
        if self._cb_message is None:
            self._ledger.passed(end)
            return
        logical = LogicalMessage(message.lsn, False, message.prefix, message.content)
        self.stats.messages += 1
        returned = self._cb_message(self.ctx, None, logical)
        self._ledger.delivered(end, returned)

    # -- delivery ------------------------------------------------------------------------
    def _announce(self, txn: Transaction, rel: RelationInfo) -> None:
        """Tell the plugin when the definition it will see for a relation changed."""
        view = self._delivered_view
        seen = view.get(rel.relation_id)
        if seen is rel:
            return
        view[rel.relation_id] = rel
        if seen is None or seen == rel:
            return
        change = SchemaChange.between(seen, rel)
        self.stats.schema_changes += 1
        log.info("schema change in transaction %d: %s", txn.xid, change.describe())
        if self._cb_schema_change is not None:
            self._cb_schema_change(self.ctx, txn, change)

    def _make_change(
        self, message: Insert | Update | Delete, rel: RelationInfo, position: int, lsn: Lsn | None
    ) -> Change:
        ncols = len(rel.columns)
        if isinstance(message, Insert):
            if len(message.new) != ncols:
                self._width_error("Insert", message.new, rel, lsn)
            return Change(
                ChangeAction.INSERT, rel, None, None, message.new, position, lsn, message.xid
            )
        if isinstance(message, Update):
            if len(message.new) != ncols:
                self._width_error("Update", message.new, rel, lsn)
            if message.old is not None and len(message.old) != ncols:
                self._width_error("Update (old row)", message.old, rel, lsn)
            return Change(
                ChangeAction.UPDATE,
                rel,
                message.old_kind,
                message.old,
                message.new,
                position,
                lsn,
                message.xid,
            )
        if len(message.old) != ncols:
            self._width_error("Delete", message.old, rel, lsn)
        return Change(
            ChangeAction.DELETE,
            rel,
            message.old_kind,
            message.old,
            None,
            position,
            lsn,
            message.xid,
        )

    @staticmethod
    def _width_error(
        what: str, values: tuple[object, ...], rel: RelationInfo, lsn: Lsn | None
    ) -> NoReturn:
        raise DecodingError(
            f"{what} at {lsn} on {rel.qualified_name} has {len(values)} values, but its "
            f"Relation message describes {len(rel.columns)} columns"
        )

    def _replay(self, t: _Txn, txn: Transaction) -> None:
        """Deliver a buffered transaction's changes (between its begin and commit callbacks)."""
        buffer = t.buffer
        if buffer is None:
            return
        decoder = self._replay_decoder
        decoder.stream_xid = t.xid if t.kind == _STREAM else None
        local = dict(t.initial)
        ctx = self.ctx
        on_change = self._cb_change
        on_truncate = self._cb_truncate
        on_message = self._cb_message
        announce = self._announce
        make = self._make_change
        view = self._delivered_view
        position = 0
        changes = 0
        new_lsn = int.__new__  # positions from the buffer are valid LSNs already
        for payload, lsn in buffer:
            message = decoder.decode(payload)
            change_lsn = new_lsn(Lsn, lsn) if lsn else None
            if isinstance(message, Insert | Update | Delete):
                rel = local.get(message.relation_id)
                if rel is None:
                    raise DecodingError(
                        f"change at {change_lsn} in transaction {t.xid} to relation id "
                        f"{message.relation_id}, which no Relation message has described"
                    )
                if view.get(rel.relation_id) is not rel:
                    announce(txn, rel)
                on_change(ctx, txn, rel, make(message, rel, position, change_lsn))
                position += 1
                changes += 1
            elif isinstance(message, Relation):
                info = self.relations.build(message)
                local[info.relation_id] = info
                announce(txn, info)
            elif isinstance(message, Truncate):
                assert on_truncate is not None
                rels = []
                for relid in message.relation_ids:
                    rel = local.get(relid)
                    if rel is None:
                        raise DecodingError(
                            f"Truncate at {change_lsn} in transaction {t.xid} of relation id "
                            f"{relid}, which no Relation message has described"
                        )
                    announce(txn, rel)
                    rels.append(rel)
                truncated = tuple(rels)
                on_truncate(
                    ctx,
                    txn,
                    truncated,
                    TruncateChange(
                        truncated,
                        message.cascade,
                        message.restart_identity,
                        position,
                        change_lsn,
                        message.xid,
                    ),
                )
                position += 1
            elif isinstance(message, Message):
                assert on_message is not None
                on_message(
                    ctx,
                    txn,
                    LogicalMessage(
                        message.lsn,
                        True,
                        message.prefix,
                        message.content,
                        position,
                        message.xid,
                    ),
                )
                position += 1
                self.stats.messages += 1
            else:  # pragma: no cover - only the types above are ever buffered
                raise DecodingError(f"unexpected buffered {type(message).__name__}")
        self.stats.changes += changes

    def _deliver_commit(self, t: _Txn, txn: Transaction) -> None:
        """begin, changes, commit; or nothing for a filtered transaction."""
        assert txn.end_lsn is not None and txn.commit_lsn is not None
        try:
            if t.filtered:
                self.stats.filtered += 1
                self._ledger.passed(txn.end_lsn)
                return
            self._cb_begin(self.ctx, txn)
            self._replay(t, txn)
            returned = self._cb_commit(self.ctx, txn, txn.commit_lsn)
            self.stats.transactions += 1
            self._ledger.delivered(txn.end_lsn, returned)
        finally:
            t.close()

    def _advance(self, end: Lsn) -> None:
        self._hwm = max(self._hwm, end)

    def _prune(self, lsn: Lsn) -> None:
        """Forget finished transactions the server can no longer send again."""
        for xid in [x for x, final in self._stream_done.items() if final < lsn]:
            del self._stream_done[xid]
        for xid in [x for x, p in self._prepared_seen.items() if p < lsn and x not in self._held]:
            del self._prepared_seen[xid]

    # -- regular transactions ------------------------------------------------------------
    def _begin(self, m: Begin | BeginPrepare, position: int) -> _Txn:
        if isinstance(m, Begin):
            skip = m.final_lsn < self._hwm
            t = _Txn(m.xid, _REGULAR, None if skip else self._pool.buffer(str(m.xid)))
            t.final_lsn = m.final_lsn
            t.commit_time = m.commit_time
        else:
            skip = self._prepared_seen.get(m.xid) == m.prepare_lsn
            t = _Txn(m.xid, _PREPARED, None if skip else self._pool.buffer(str(m.xid)))
            t.gid = m.gid
            t.prepare_lsn = m.prepare_lsn
            t.prepare_end_lsn = m.end_lsn
            t.prepare_time = m.prepare_time
        t.skip = skip
        return t

    def _origin(self, t: _Txn, payload: bytes) -> None:
        m = self._decode(payload)
        assert isinstance(m, Origin)
        t.origin = m.name
        t.origin_lsn = m.commit_lsn or None
        if t.filtered or t.skip or self._cb_filter_origin is None:
            return
        if self._cb_filter_origin(self.ctx, m.name):
            if t.started:
                log.warning(
                    "origin %r of transaction %d arrived after changes were streamed; not filtered",
                    m.name,
                    t.xid,
                )
                return
            t.filtered = True
            t.close()

    def _end(self, t: _Txn, m: Commit | Prepare, position: int) -> None:
        if isinstance(m, Commit):
            self._on_commit(t, m)
        else:
            self._on_prepare(t, m)

    def _on_commit(self, t: _Txn, m: Commit) -> None:
        if t.skip:
            t.close()
            self.stats.duplicates += 1
            return
        if m.commit_lsn != t.final_lsn:
            t.close()
            raise DecodingError(
                f"Commit at {m.commit_lsn} does not match the final LSN {t.final_lsn} of the "
                f"Begin of transaction {t.xid}"
            )
        txn = Transaction(
            xid=t.xid,
            commit_lsn=m.commit_lsn,
            end_lsn=m.end_lsn,
            commit_time=m.commit_time,
            origin=t.origin,
            origin_lsn=t.origin_lsn,
        )
        self._deliver_commit(t, txn)
        self._advance(m.end_lsn)

    # -- two-phase -----------------------------------------------------------------------
    def _two_phase_for(self, xid: int, gid: str) -> bool:
        """Does the plugin take this prepared transaction at PREPARE time?"""
        if not self.caps.two_phase:
            return False
        return not (
            self._cb_filter_prepare is not None and self._cb_filter_prepare(self.ctx, xid, gid)
        )

    def _on_prepare(self, t: _Txn, m: Prepare) -> None:
        if t.skip:
            t.close()
            self.stats.duplicates += 1
            return
        self._finish_prepare(t, m.prepare_lsn, m.end_lsn, m.prepare_time, m.gid)

    def _finish_prepare(
        self, t: _Txn, prepare_lsn: Lsn, end_lsn: Lsn, prepare_time: datetime, gid: str
    ) -> None:
        t.gid = gid
        t.prepare_lsn = prepare_lsn
        t.prepare_end_lsn = end_lsn
        t.prepare_time = prepare_time
        self._prepared_seen[t.xid] = prepare_lsn
        if t.filtered:
            t.close()
            self._held[t.xid] = t  # so that its COMMIT / ROLLBACK PREPARED are skipped too
            self.stats.filtered += 1
            self._ledger.passed(end_lsn)
        elif self._two_phase_for(t.xid, gid):
            txn = Transaction(
                xid=t.xid,
                end_lsn=end_lsn,
                origin=t.origin,
                origin_lsn=t.origin_lsn,
                gid=gid,
                prepare_lsn=prepare_lsn,
                prepare_end_lsn=end_lsn,
                prepare_time=prepare_time,
                streamed=t.kind == _STREAM,
            )
            try:
                if t.live:
                    assert self._cb_stream_prepare is not None
                    returned = self._cb_stream_prepare(self.ctx, txn, prepare_lsn)
                else:
                    assert self._cb_begin_prepare is not None and self._cb_prepare is not None
                    self._cb_begin_prepare(self.ctx, txn)
                    self._replay(t, txn)
                    returned = self._cb_prepare(self.ctx, txn, prepare_lsn)
            finally:
                t.close()
            self.stats.transactions += 1
            self._ledger.delivered(end_lsn, returned)
        else:
            self._held[t.xid] = t
            log.debug(
                "holding prepared transaction %d (gid %r, prepare LSN %s) until it is resolved",
                t.xid,
                gid,
                prepare_lsn,
            )
            self._ledger.passed(end_lsn)
        self._advance(end_lsn)

    def _resolved(self, m: CommitPrepared | RollbackPrepared) -> None:
        if isinstance(m, CommitPrepared):
            self._on_commit_prepared(m)
        else:
            self._on_rollback_prepared(m)

    def _on_commit_prepared(self, m: CommitPrepared) -> None:
        if m.commit_lsn < self._hwm:
            self.stats.duplicates += 1
            return
        t = self._held.pop(m.xid, None)
        if t is None:
            if not self._two_phase_for(m.xid, m.gid):
                raise DecodingError(
                    f"COMMIT PREPARED of xid {m.xid} (gid {m.gid!r}) at {m.commit_lsn}, but its "
                    "PREPARE was never received: the slot was confirmed past the prepare by "
                    "another consumer (pgcdc never confirms past a prepared transaction it "
                    "holds). Its changes cannot be delivered; advance the slot past "
                    f"{m.end_lsn} if losing them is acceptable"
                )
            txn = Transaction(
                xid=m.xid,
                commit_lsn=m.commit_lsn,
                end_lsn=m.end_lsn,
                commit_time=m.commit_time,
                gid=m.gid,
            )
            assert self._cb_commit_prepared is not None
            returned = self._cb_commit_prepared(self.ctx, txn, m.commit_lsn)
            self._ledger.delivered(m.end_lsn, returned)
        else:
            txn = Transaction(
                xid=m.xid,
                commit_lsn=m.commit_lsn,
                end_lsn=m.end_lsn,
                commit_time=m.commit_time,
                origin=t.origin,
                origin_lsn=t.origin_lsn,
                gid=m.gid,
                prepare_lsn=t.prepare_lsn,
                prepare_end_lsn=t.prepare_end_lsn,
                prepare_time=t.prepare_time,
                streamed=t.kind == _STREAM,
            )
            if t.live and not t.filtered:
                assert self._cb_stream_commit is not None
                returned = self._cb_stream_commit(self.ctx, txn, m.commit_lsn)
                self.stats.transactions += 1
                self._ledger.delivered(m.end_lsn, returned)
            else:
                self._deliver_commit(t, txn)
        self._advance(m.end_lsn)

    def _on_rollback_prepared(self, m: RollbackPrepared) -> None:
        if m.rollback_end_lsn <= self._hwm:
            self.stats.duplicates += 1
            return
        t = self._held.pop(m.xid, None)
        self.stats.rolled_back_prepared += 1
        if t is None:
            if self._two_phase_for(m.xid, m.gid):
                txn = Transaction(
                    xid=m.xid,
                    end_lsn=m.rollback_end_lsn,
                    gid=m.gid,
                    prepare_end_lsn=m.prepare_end_lsn,
                    prepare_time=m.prepare_time,
                    rollback_time=m.rollback_time,
                )
                assert self._cb_rollback_prepared is not None
                returned = self._cb_rollback_prepared(
                    self.ctx, txn, m.prepare_end_lsn, m.prepare_time
                )
                self._ledger.delivered(m.rollback_end_lsn, returned)
            else:
                self._ledger.passed(m.rollback_end_lsn)
        else:
            if t.live and t.started and not t.filtered:
                assert self._cb_stream_abort is not None and t.info is not None
                self._cb_stream_abort(self.ctx, t.info, StreamAbortInfo(t.xid, True, 0, "abort"))
            t.close()
            self._ledger.passed(m.rollback_end_lsn)
        self._advance(m.rollback_end_lsn)

    # -- streamed transactions -----------------------------------------------------------
    def _stream_open(self, m: StreamStart) -> _Txn:
        live = self.caps.streaming
        st = _Txn(m.xid, _STREAM, None if live else self._pool.buffer(str(m.xid)))
        st.live = live
        return st

    def _discard(self, t: _Txn, reason: Discard) -> None:
        if t.kind != _STREAM:
            t.close()
            return
        if reason == "restart":
            log.warning(
                "streamed transaction %d started over from its first block; dropping the "
                "%d messages received before",
                t.xid,
                0 if t.buffer is None else len(t.buffer),
            )
        self._drop_stream(t, reason)

    def _drop_stream(self, st: _Txn, reason: _Reason) -> None:
        """Forget an unfinished streamed transaction; a streaming plugin is told to discard it."""
        if st.live and st.started and not st.filtered:
            assert st.info is not None
            if st.block_open:
                st.block_open = False
                assert self._cb_stream_stop is not None
                self._cb_stream_stop(self.ctx, st.info)
            assert self._cb_stream_abort is not None
            self._cb_stream_abort(
                self.ctx,
                st.info,
                StreamAbortInfo(st.xid, True, 0, reason),
            )
        st.close()

    def _stream_finished(self, m: StreamStart | StreamCommit | StreamPrepare) -> bool:
        if isinstance(m, StreamStart):
            return m.xid in self._stream_done  # sent again after a reconnect
        final_lsn = m.commit_lsn if isinstance(m, StreamCommit) else m.prepare_lsn
        if (isinstance(m, StreamPrepare) and self._prepared_seen.get(m.xid) == m.prepare_lsn) or (
            m.xid in self._stream_done or final_lsn < self._hwm
        ):
            self.stats.duplicates += 1
            return True
        return False

    def _block_start(self, st: _Txn) -> None:
        st.block_pending = True

    def _open_block(self, st: _Txn) -> None:
        """The first message after Stream Start that is not an Origin: the block begins."""
        if not st.block_pending:
            return
        st.block_pending = False
        if not st.live or st.filtered:
            return
        if st.info is None:
            st.info = Transaction(
                xid=st.xid, origin=st.origin, origin_lsn=st.origin_lsn, streamed=True
            )
        st.started = True
        st.block_open = True
        assert self._cb_stream_start is not None
        self._cb_stream_start(self.ctx, st.info)

    def _block_stop(self, st: _Txn) -> None:
        self._open_block(st)
        if st.block_open:
            st.block_open = False
            assert self._cb_stream_stop is not None and st.info is not None
            self._cb_stream_stop(self.ctx, st.info)

    def _mark(self, st: _Txn) -> _Sub:
        return _Sub(
            st.buffer.mark() if st.buffer is not None else None,
            len(st.overlay_log),
            st.next_position,
        )

    def _abort_subxact(self, st: _Txn, sub: _Sub | None) -> _Sub | None:
        """Drop everything from the subtransaction's first message on (worker.c)."""
        if sub is None:
            return None  # an empty subtransaction: nothing of it was streamed
        if st.buffer is not None and sub.mark is not None:
            st.buffer.truncate(sub.mark)
        if len(st.overlay_log) > sub.overlay_len:
            del st.overlay_log[sub.overlay_len :]
            st.overlay = {info.relation_id: info for info in st.overlay_log}
        return sub

    def _stream_abort(self, st: _Txn, m: StreamAbort, mark: _Sub | None) -> None:
        notify = st.live and st.started and not st.filtered
        if m.xid == m.subxid:
            self.stats.aborted += 1
            if notify:
                assert self._cb_stream_abort is not None and st.info is not None
                self._cb_stream_abort(
                    self.ctx,
                    st.info,
                    StreamAbortInfo(m.subxid, True, 0, "abort", m.abort_lsn, m.abort_time),
                )
            st.close()
            return
        self.stats.subtransaction_aborts += 1
        sub = self._abort_subxact(st, mark)
        if notify:
            assert self._cb_stream_abort is not None and st.info is not None
            discard_from = st.next_position if sub is None else sub.position
            self._cb_stream_abort(
                self.ctx,
                st.info,
                StreamAbortInfo(m.subxid, False, discard_from, "abort", m.abort_lsn, m.abort_time),
            )

    def _merge_overlay(self, st: _Txn) -> None:
        """The server now assumes the subscriber knows these definitions."""
        for info in st.overlay.values():
            self.relations.store(info)

    def _stream_end(self, st: _Txn, m: StreamCommit | StreamPrepare) -> None:
        if isinstance(m, StreamCommit):
            self._on_stream_commit(st, m)
        else:
            self._on_stream_prepare(st, m)

    def _on_stream_commit(self, st: _Txn, m: StreamCommit) -> None:
        self._merge_overlay(st)
        if m.commit_lsn < self._hwm:
            self.stats.duplicates += 1
            self._drop_stream(st, "duplicate")
            return
        txn = Transaction(
            xid=m.xid,
            commit_lsn=m.commit_lsn,
            end_lsn=m.end_lsn,
            commit_time=m.commit_time,
            origin=st.origin,
            origin_lsn=st.origin_lsn,
            streamed=True,
        )
        if st.live:
            if st.filtered:
                self.stats.filtered += 1
                self._ledger.passed(m.end_lsn)
            else:
                assert self._cb_stream_commit is not None
                returned = self._cb_stream_commit(self.ctx, txn, m.commit_lsn)
                self.stats.transactions += 1
                self._ledger.delivered(m.end_lsn, returned)
            st.close()
        else:
            self._deliver_commit(st, txn)
        self._stream_done[m.xid] = m.commit_lsn
        self._advance(m.end_lsn)

    def _on_stream_prepare(self, st: _Txn, m: StreamPrepare) -> None:
        if self._prepared_seen.get(m.xid) == m.prepare_lsn:
            self._drop_stream(st, "duplicate")
            self.stats.duplicates += 1
            return
        self._merge_overlay(st)
        self._stream_done[m.xid] = m.prepare_lsn
        self._finish_prepare(st, m.prepare_lsn, m.end_lsn, m.prepare_time, m.gid)

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Drop everything buffered and remove spill files."""
        framer = self._framer
        for t in [framer.current, *framer.streams()]:
            if t is not None:
                t.close()
        framer.clear()
        for t in self._held.values():
            t.close()
        self._held.clear()
        self._pool.close()

    def __enter__(self) -> Assembler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
