"""Run an output plugin on a replication source: session + decoder + assembler + plugin.

``run(plugin, source)`` reads events from a ``pgcdc.replication.ReplicationSession`` or
``SqlSlotReader`` (anything with ``events()`` and ``confirm(lsn)``: this module needs nothing
else from them, and imports nothing from ``pgcdc.replication``), feeds them to an ``Assembler``
driving ``plugin``, and confirms progress back to the source:

* ``startup(ctx)`` is called before the first event, ``shutdown(ctx)`` when the run ends, also
  when it ends with an exception (but not if ``startup`` itself failed).
* After every event the runner confirms ``assembler.safe_confirm_lsn(assembler.durable_lsn)``
  when it advanced: transactions are durable when the plugin's finishing callback returned
  (``auto_confirm = True``) or once the plugin confirmed them with ``ctx.confirm(lsn)`` (or
  returned an LSN from the finishing callback); prepared transactions the assembler holds are
  never confirmed past. The source sends that position as flush/apply position.
* ``until_lsn``: stop once everything committed before that LSN was delivered: no transaction
  or streamed block is open and the source has reached the LSN (the last data received, or the
  walsender's position from a keepalive, is at or beyond it). When the source reports idle
  before that, the runner asks it for an immediate keepalive (``request_status()``) to learn
  the server's position quickly.
* ``stop``: a ``threading.Event`` or a callable returning True to stop; the plugin can also call
  ``ctx.request_stop()``. Checked after every event (sources report idle every poll interval).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pgcdc.decoding.assembler import Assembler, AssemblerStats
from pgcdc.decoding.plugin import DecodingContext
from pgcdc.decoding.relations import RelationCache, TypeLookup
from pgcdc.decoding.spill import DEFAULT_MEMORY_LIMIT
from pgcdc.lsn import Lsn

if TYPE_CHECKING:
    from pgcdc.protocol.values.registry import TypeRegistry

__all__ = ["EventSource", "RunResult", "run"]

log = logging.getLogger(__name__)


class EventSource(Protocol):
    """What ``run`` needs of a source (ReplicationSession and SqlSlotReader have it)."""

    def events(self) -> Iterable[object]: ...

    def confirm(self, lsn: Lsn) -> None: ...


class _Stoppable(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a run ended: ``reason`` is 'until' (reached ``until_lsn``), 'stop' (the ``stop``
    signal), 'plugin' (``ctx.request_stop()``) or 'end' (the source had no more events);
    ``confirmed_lsn`` the last position confirmed to the source."""

    reason: Literal["until", "stop", "plugin", "end"]
    confirmed_lsn: Lsn
    durable_lsn: Lsn
    stats: AssemblerStats


def _stop_check(stop: _Stoppable | Callable[[], bool] | None) -> Callable[[], bool] | None:
    if stop is None:
        return None
    is_set = getattr(stop, "is_set", None)
    if callable(is_set):
        return is_set  # type: ignore[no-any-return]
    if callable(stop):
        return stop
    raise TypeError(f"stop must be a threading.Event or a callable, not {type(stop).__name__}")


def _known(source: object, name: str) -> int | None:
    """A source's positive integer attribute (0 or missing: not known yet)."""
    value = getattr(source, name, None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _is_idle(event: object) -> bool:
    return hasattr(event, "server_wal_end") and not hasattr(event, "payload")


def run(
    plugin: object,
    source: EventSource,
    *,
    until_lsn: int | None = None,
    stop: _Stoppable | Callable[[], bool] | None = None,
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
    spill_dir: str | None = None,
    registry: TypeRegistry | None = None,
    type_lookup: TypeLookup | None = None,
    encoding: str = "utf-8",
) -> RunResult:
    """Deliver ``source``'s transactions to ``plugin`` until one of the stop conditions."""
    should_stop = _stop_check(stop)
    until = None if until_lsn is None else Lsn(until_lsn)
    ctx = DecodingContext(
        slot_name=getattr(source, "slot", None) or getattr(source, "slot_name", None),
        proto_version=_known(source, "proto_version"),
        server_version=_known(source, "server_version"),
        registry=registry,
        relations=RelationCache(registry, type_lookup),
    )
    assembler = Assembler(
        plugin,
        ctx=ctx,
        proto_version=ctx.proto_version,
        encoding=encoding,
        memory_limit=memory_limit,
        spill_dir=spill_dir,
    )
    proto_known = ctx.proto_version is not None
    confirmed = Lsn(0)
    reason: Literal["until", "stop", "plugin", "end"] = "end"
    started = False
    events: Iterable[object] | None = None

    def confirm() -> None:
        nonlocal confirmed
        safe = assembler.safe_confirm_lsn(assembler.durable_lsn)
        # sources accept positions up to what they sent (a non-transactional message ends
        # one byte past its dataStart: confirmed once anything later arrives)
        limit = max(
            assembler.received_lsn,
            assembler.server_wal_end,
            Lsn(getattr(source, "server_wal_end", 0) or 0),
        )
        safe = min(safe, limit)
        if safe > confirmed:
            source.confirm(safe)
            assembler.note_confirmed(safe)
            confirmed = safe

    try:
        if assembler.caps.has("startup"):
            plugin.startup(ctx)  # type: ignore[attr-defined]
        started = True
        events = source.events()
        log.info(
            "running plugin %s (%s%s)%s",
            assembler.caps.name,
            "streaming" if assembler.caps.streaming else "whole transactions",
            ", two-phase" if assembler.caps.two_phase else "",
            f" until {until}" if until is not None else "",
        )
        for event in events:
            if not proto_known:
                # a session resolves the protocol version when it connects (in events())
                proto = _known(source, "proto_version")
                if proto is not None:
                    assembler.set_proto_version(proto)
                    ctx.server_version = _known(source, "server_version")
                    proto_known = True
            assembler.feed(event)
            confirm()
            if ctx.stop_requested:
                reason = "plugin"
                break
            if should_stop is not None and should_stop():
                reason = "stop"
                break
            if until is not None:
                position = max(
                    assembler.last_data_lsn,
                    assembler.server_wal_end,
                    Lsn(getattr(source, "server_wal_end", 0) or 0),
                )
                if position >= until and not assembler.in_progress:
                    reason = "until"
                    break
                if _is_idle(event):
                    request_status: Any = getattr(source, "request_status", None)
                    if callable(request_status):
                        request_status()
        confirm()
    finally:
        close = getattr(events, "close", None)
        if callable(close):
            close()
        try:
            if started and assembler.caps.has("shutdown"):
                plugin.shutdown(ctx)  # type: ignore[attr-defined]
        finally:
            assembler.close()
    log.info(
        "run ended (%s): %d transactions, %d changes delivered; confirmed %s",
        reason,
        assembler.stats.transactions,
        assembler.stats.changes,
        confirmed,
    )
    return RunResult(
        reason=reason,
        confirmed_lsn=confirmed,
        durable_lsn=assembler.durable_lsn,
        stats=assembler.stats,
    )
