"""The output plugin callback API: PostgreSQL's OutputPluginCallbacks, in Python.

A plugin subclasses ``OutputPlugin`` and overrides the callbacks it needs (any object with
methods of these names works too). ``capabilities(plugin)`` validates it the way PostgreSQL's
``LoadOutputPlugin`` / ``StartupDecodingContext`` do and says how it wants transactions:

* ``begin``, ``change`` and ``commit`` are required; ``startup``, ``shutdown``, ``truncate``,
  ``message`` and ``filter_by_origin`` are optional. A TRUNCATE is ignored without ``truncate``,
  a logical message without ``message``.
* Streaming: a plugin implementing any ``stream_*`` callback must implement ``stream_start``,
  ``stream_stop``, ``stream_abort``, ``stream_commit`` and ``stream_change`` (and
  ``stream_prepare`` if it is also two-phase); ``stream_message`` and ``stream_truncate`` are
  optional. Such a plugin receives blocks of in-progress transactions as they arrive (low
  latency; undoing aborted work is its responsibility). A plugin without them receives every
  transaction whole, in commit order, at commit.
* Two-phase: ``begin_prepare``, ``prepare``, ``commit_prepared`` and ``rollback_prepared`` are
  required together, ``filter_prepare`` is optional. Such a plugin receives a prepared
  transaction at PREPARE time; a plugin without them (or whose ``filter_prepare`` returns True
  for it) receives it as an ordinary transaction at COMMIT PREPARED, and never if it is rolled
  back.
* ``schema_change`` (pgcdc's own, optional) is told when a relation's definition changed, just
  before the first change that uses the new definition.

Durability: with ``auto_confirm = True`` (the default, right for plugins that print or forward
synchronously) a transaction is durable once ``commit`` (``stream_commit``, ``prepare`` ...)
returns. A plugin that buffers sets ``auto_confirm = False`` and reports what it made durable
with ``ctx.confirm(lsn)`` (or by returning an LSN from the finishing callback): confirming
``txn.end_lsn`` covers that transaction and everything delivered before it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgcdc.decoding.errors import PluginError
from pgcdc.decoding.relations import RelationCache, RelationInfo, SchemaChange
from pgcdc.decoding.transaction import (
    Change,
    LogicalMessage,
    StreamAbortInfo,
    Transaction,
    TruncateChange,
)
from pgcdc.lsn import Lsn

if TYPE_CHECKING:
    from pgcdc.protocol.values.registry import TypeRegistry

__all__ = [
    "CALLBACKS",
    "OPTIONAL",
    "REQUIRED",
    "STREAM_REQUIRED",
    "TWO_PHASE_REQUIRED",
    "Capabilities",
    "DecodingContext",
    "OutputPlugin",
    "capabilities",
]

REQUIRED = ("begin", "change", "commit")
OPTIONAL = ("startup", "shutdown", "truncate", "message", "filter_by_origin", "schema_change")
STREAM_REQUIRED = ("stream_start", "stream_stop", "stream_abort", "stream_commit", "stream_change")
STREAM_OPTIONAL = ("stream_message", "stream_truncate")
STREAM_ALL = (*STREAM_REQUIRED, "stream_prepare", *STREAM_OPTIONAL)
TWO_PHASE_REQUIRED = ("begin_prepare", "prepare", "commit_prepared", "rollback_prepared")
TWO_PHASE_ALL = (*TWO_PHASE_REQUIRED, "filter_prepare")
#: Every callback name, in PostgreSQL's OutputPluginCallbacks order (plus schema_change).
CALLBACKS = (
    "startup",
    "begin",
    "change",
    "truncate",
    "commit",
    "message",
    "filter_by_origin",
    "shutdown",
    "filter_prepare",
    "begin_prepare",
    "prepare",
    "commit_prepared",
    "rollback_prepared",
    "stream_start",
    "stream_stop",
    "stream_abort",
    "stream_prepare",
    "stream_commit",
    "stream_change",
    "stream_message",
    "stream_truncate",
    "schema_change",
)


class DecodingContext:
    """What every callback gets as ``ctx`` (PostgreSQL's LogicalDecodingContext).

    ``confirm(lsn)`` reports that everything delivered with an end position up to ``lsn`` is
    durable (for ``auto_confirm = False`` plugins); ``request_stop()`` asks the runner to stop
    after the current callback. ``relations`` is the relation cache, ``registry`` the type
    registry for value conversion; ``proto_version``, ``server_version`` and ``slot_name``
    describe the stream when the source knows them.
    """

    __slots__ = (
        "_on_confirm",
        "confirmed_lsn",
        "proto_version",
        "registry",
        "relations",
        "server_version",
        "slot_name",
        "stop_requested",
    )

    def __init__(
        self,
        *,
        slot_name: str | None = None,
        proto_version: int | None = None,
        server_version: int | None = None,
        registry: TypeRegistry | None = None,
        relations: RelationCache | None = None,
    ) -> None:
        self.slot_name = slot_name
        self.proto_version = proto_version
        self.server_version = server_version
        self.registry = registry
        self.relations = relations if relations is not None else RelationCache(registry)
        self.confirmed_lsn = Lsn(0)
        self.stop_requested = False
        self._on_confirm: Callable[[Lsn], None] | None = None

    def confirm(self, lsn: int) -> None:
        """Everything delivered that ends at or before ``lsn`` is durable."""
        lsn = Lsn(lsn)
        self.confirmed_lsn = max(self.confirmed_lsn, lsn)
        if self._on_confirm is not None:
            self._on_confirm(lsn)

    def request_stop(self) -> None:
        """Ask the runner to stop once the current callback returns."""
        self.stop_requested = True


class OutputPlugin:
    """Base class for output plugins: override the callbacks you need.

    Callbacks not overridden count as not implemented (see ``capabilities``). Finishing
    callbacks may return an LSN, which counts as ``ctx.confirm(lsn)``.
    """

    #: Durable when the finishing callback returns (True), or only once confirmed (False).
    auto_confirm: bool = True

    def startup(self, ctx: DecodingContext) -> None:
        """The stream is about to start (before any other callback)."""

    def shutdown(self, ctx: DecodingContext) -> None:
        """The stream stopped; release resources."""

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        """A committed transaction starts (required)."""
        raise NotImplementedError

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: RelationInfo, change: Change
    ) -> None:
        """One INSERT / UPDATE / DELETE of the transaction (required)."""
        raise NotImplementedError

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: tuple[RelationInfo, ...],
        change: TruncateChange,
    ) -> None:
        """A TRUNCATE in the transaction (optional: ignored without it)."""

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> Lsn | None:
        """The transaction committed; all its changes were delivered (required)."""
        raise NotImplementedError

    def message(
        self, ctx: DecodingContext, txn: Transaction | None, message: LogicalMessage
    ) -> Lsn | None:
        """A logical message; ``txn`` is None for a non-transactional one (optional)."""
        return None

    def filter_by_origin(self, ctx: DecodingContext, origin: str) -> bool:
        """True to skip transactions replayed from replication origin ``origin`` (optional)."""
        return False

    def filter_prepare(self, ctx: DecodingContext, xid: int, gid: str) -> bool:
        """True to receive this prepared transaction at COMMIT PREPARED instead (optional).

        Must give the same answer every time for the same (xid, gid).
        """
        return False

    def begin_prepare(self, ctx: DecodingContext, txn: Transaction) -> None:
        """A prepared transaction starts (two-phase)."""

    def prepare(self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn) -> Lsn | None:
        """PREPARE TRANSACTION: all the prepared transaction's changes were delivered."""
        return None

    def commit_prepared(
        self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn
    ) -> Lsn | None:
        """COMMIT PREPARED of a transaction delivered at its PREPARE."""
        return None

    def rollback_prepared(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        prepare_end_lsn: Lsn,
        prepare_time: datetime,
    ) -> Lsn | None:
        """ROLLBACK PREPARED; ``prepare_end_lsn`` and ``prepare_time`` identify the PREPARE."""
        return None

    def stream_start(self, ctx: DecodingContext, txn: Transaction) -> None:
        """A block of an in-progress transaction's changes follows."""

    def stream_stop(self, ctx: DecodingContext, txn: Transaction) -> None:
        """The block ended."""

    def stream_abort(self, ctx: DecodingContext, txn: Transaction, abort: StreamAbortInfo) -> None:
        """Discard streamed changes of the transaction (see ``StreamAbortInfo``)."""

    def stream_prepare(
        self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn
    ) -> Lsn | None:
        """A streamed transaction was prepared (streaming and two-phase)."""
        return None

    def stream_commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> Lsn | None:
        """A streamed transaction committed: apply what was streamed."""
        return None

    def stream_change(
        self, ctx: DecodingContext, txn: Transaction, relation: RelationInfo, change: Change
    ) -> None:
        """One change inside a streamed block."""

    def stream_message(
        self, ctx: DecodingContext, txn: Transaction, message: LogicalMessage
    ) -> None:
        """A transactional logical message inside a streamed block (optional)."""

    def stream_truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: tuple[RelationInfo, ...],
        change: TruncateChange,
    ) -> None:
        """A TRUNCATE inside a streamed block (optional)."""

    def schema_change(self, ctx: DecodingContext, txn: Transaction, change: SchemaChange) -> None:
        """A relation's definition changed; called before the first change that uses it."""


_BASE_METHODS: dict[str, Any] = {name: getattr(OutputPlugin, name) for name in CALLBACKS}


def _implemented(plugin: object, name: str) -> bool:
    function = getattr(plugin, name, None)
    if function is None or not callable(function):
        return False
    if isinstance(plugin, OutputPlugin):
        own = vars(plugin) if hasattr(plugin, "__dict__") else {}
        return name in own or getattr(type(plugin), name, None) is not _BASE_METHODS[name]
    return True


@dataclass(frozen=True, slots=True)
class Capabilities:
    """A validated plugin: which callbacks it implements and how it wants transactions."""

    name: str
    implemented: frozenset[str]
    streaming: bool
    two_phase: bool
    auto_confirm: bool

    def has(self, callback: str) -> bool:
        return callback in self.implemented


def capabilities(plugin: object) -> Capabilities:
    """Validate ``plugin``; raises PluginError listing every missing required callback."""
    name = type(plugin).__name__
    implemented = frozenset(c for c in CALLBACKS if _implemented(plugin, c))
    problems: list[str] = []
    missing = [c for c in REQUIRED if c not in implemented]
    if missing:
        problems.append(f"{', '.join(missing)} (required of every output plugin)")
    streaming_given = sorted(implemented & set(STREAM_ALL))
    two_phase_given = sorted(implemented & {*TWO_PHASE_ALL, "stream_prepare"})
    streaming = bool(streaming_given)
    two_phase = bool(two_phase_given)
    if streaming:
        missing = [c for c in STREAM_REQUIRED if c not in implemented]
        if missing:
            problems.append(
                f"{', '.join(missing)} (required because it implements streaming callbacks: "
                f"{', '.join(streaming_given)})"
            )
    if two_phase:
        missing = [c for c in TWO_PHASE_REQUIRED if c not in implemented]
        if missing:
            problems.append(
                f"{', '.join(missing)} (required because it implements two-phase callbacks: "
                f"{', '.join(two_phase_given)})"
            )
    if streaming and two_phase and "stream_prepare" not in implemented:
        problems.append("stream_prepare (required of a plugin that streams and is two-phase)")
    if problems:
        raise PluginError(
            f"output plugin {name} is missing callbacks: "
            + "; ".join(problems)
            + ". Implement them, or remove the optional family's callbacks to do without it."
        )
    auto = getattr(plugin, "auto_confirm", True)
    if not isinstance(auto, bool):
        raise PluginError(f"output plugin {name}: auto_confirm must be True or False, not {auto!r}")
    return Capabilities(
        name=name,
        implemented=implemented,
        streaming=streaming,
        two_phase=two_phase,
        auto_confirm=auto,
    )
