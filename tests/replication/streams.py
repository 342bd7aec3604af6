"""Test helpers: set up a table, publication and slot, and read a session until a condition."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    Message,
    Prepare,
    Relation,
    ReplicationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
)
from pgcdc.replication import (
    Idle,
    Reconnected,
    ReplicationSession,
    SqlSlotReader,
    WalData,
)
from tests.fix_pg import PgDatabase

FAST = {"status_interval": 0.1, "poll_interval": 0.1}


def setup_table(pg: PgDatabase, table: str = "t", pub: str = "pub", slot: str | None = "s") -> None:
    """``table(id int primary key, v text)``, a publication of it and (optionally) a slot."""
    pg.execute(f'CREATE TABLE "{table}" (id int PRIMARY KEY, v text)')
    pg.execute(f'CREATE PUBLICATION "{pub}" FOR TABLE "{table}"')
    if slot is not None:
        pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def slot_row(pg: PgDatabase, slot: str = "s") -> dict[str, Any]:
    rows = pg.execute(
        "SELECT active, active_pid, confirmed_flush_lsn::text, restart_lsn::text, wal_status "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    assert rows, f"no slot {slot}"
    active, pid, confirmed, restart, wal_status = rows[0]
    return {
        "active": active,
        "active_pid": pid,
        "confirmed_flush_lsn": Lsn.parse(str(confirmed)),
        "restart_lsn": None if restart is None else Lsn.parse(str(restart)),
        "wal_status": wal_status,
    }


def current_lsn(pg: PgDatabase) -> Lsn:
    return Lsn.parse(str(pg.execute("SELECT pg_current_wal_lsn()::text")[0][0]))


@dataclass
class Reading:
    """Everything a session yielded, decoded."""

    events: list[WalData | Reconnected | Idle] = field(default_factory=list)
    messages: list[ReplicationMessage] = field(default_factory=list)
    data: list[WalData] = field(default_factory=list)
    decoder: Decoder | None = None  # kept across read() calls: it tracks streamed blocks

    def of(self, kind: type[Any]) -> list[Any]:
        return [m for m in self.messages if isinstance(m, kind)]

    @property
    def commits(self) -> list[Commit]:
        return self.of(Commit)

    @property
    def reconnects(self) -> list[Reconnected]:
        return [e for e in self.events if isinstance(e, Reconnected)]

    def inserted_ids(self) -> list[int]:
        return [int(str(m.new[0])) for m in self.of(Insert)]


def read(
    source: ReplicationSession | SqlSlotReader,
    until: Callable[[Reading], bool],
    *,
    timeout: float = 15.0,
    reading: Reading | None = None,
    on_event: Callable[[WalData | Reconnected | Idle, ReplicationMessage | None], None]
    | None = None,
) -> Reading:
    """Iterate ``source.events()``, decoding, until ``until(reading)`` or ``timeout``."""
    reading = reading or Reading()
    deadline = time.monotonic() + timeout
    for event in source.events():
        decoder = reading.decoder
        if decoder is None or decoder.proto_version != source.proto_version:
            decoder = reading.decoder = Decoder(source.proto_version)
        reading.events.append(event)
        msg = None
        if isinstance(event, WalData):
            msg = decoder.decode(event.payload)
            reading.messages.append(msg)
            reading.data.append(event)
        elif isinstance(event, Reconnected):
            decoder.reset()
        if on_event is not None:
            on_event(event, msg)
        if until(reading):
            return reading
        if time.monotonic() > deadline:
            kinds = [type(m).__name__ for m in reading.messages[-20:]]
            raise AssertionError(f"timed out after {timeout}s; last messages {kinds}")
    raise AssertionError("events() ended")


def commits_at_least(n: int) -> Callable[[Reading], bool]:
    return lambda r: len(r.commits) >= n


def idle_after(pred: Callable[[Reading], bool]) -> Callable[[Reading], bool]:
    """``pred`` holds and the last event is an Idle tick (the stream went quiet)."""
    return lambda r: pred(r) and bool(r.events) and isinstance(r.events[-1], Idle)


def wait_for(check: Callable[[], bool], timeout: float = 10.0, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(step)


@dataclass
class Txn:
    """A transaction rebuilt from the stream (plain or streamed), for comparing two readers."""

    xid: int
    commit_lsn: Lsn
    end_lsn: Lsn
    changes: list[tuple[Any, ...]]


def _change(msg: ReplicationMessage, relations: dict[int, str]) -> tuple[Any, ...]:
    if isinstance(msg, Insert):
        return ("I", relations[msg.relation_id], msg.new)
    if isinstance(msg, Update):
        return ("U", relations[msg.relation_id], msg.old, msg.new)
    if isinstance(msg, Delete):
        return ("D", relations[msg.relation_id], msg.old)
    if isinstance(msg, Truncate):
        return ("T", tuple(relations[r] for r in msg.relation_ids))
    if isinstance(msg, Message):
        return ("M", msg.prefix, msg.content, msg.transactional)
    raise AssertionError(f"not a change: {msg!r}")


def assemble(messages: Iterable[ReplicationMessage]) -> tuple[list[Txn], list[tuple[Any, ...]]]:
    """Committed transactions in commit order, and non-transactional messages, from a stream.

    Streamed transactions are collected by xid (dropping aborted subtransactions is not needed
    by these tests: they abort only whole transactions). Checks the stream's structure as it
    goes: no change outside a transaction, no Begin inside one.
    """
    relations: dict[int, str] = {}
    txns: list[Txn] = []
    loose: list[tuple[Any, ...]] = []
    current: tuple[int, list[tuple[Any, ...]]] | None = None
    streamed: dict[int, list[tuple[Any, ...]]] = {}
    stream_xid: int | None = None
    for msg in messages:
        if isinstance(msg, Relation):
            relations[msg.relation_id] = f"{msg.namespace}.{msg.name}"
        elif isinstance(msg, Begin):
            assert current is None and stream_xid is None, "Begin inside a transaction"
            current = (msg.xid, [])
        elif isinstance(msg, BeginPrepare):
            assert current is None
            current = (msg.xid, [])
        elif isinstance(msg, Commit):
            assert current is not None, "Commit outside a transaction"
            txns.append(Txn(current[0], msg.commit_lsn, msg.end_lsn, current[1]))
            current = None
        elif isinstance(msg, Prepare):
            assert current is not None
            txns.append(Txn(current[0], msg.prepare_lsn, msg.end_lsn, [("PREPARE", msg.gid)]))
            txns[-1].changes[:0] = current[1]
            current = None
        elif isinstance(msg, CommitPrepared):
            txns.append(Txn(msg.xid, msg.commit_lsn, msg.end_lsn, [("COMMIT PREPARED", msg.gid)]))
        elif isinstance(msg, RollbackPrepared):
            txns.append(
                Txn(msg.xid, msg.rollback_end_lsn, msg.rollback_end_lsn, [("ROLLBACK", msg.gid)])
            )
        elif isinstance(msg, StreamStart):
            assert stream_xid is None and current is None
            stream_xid = msg.xid
            if msg.first_segment:
                assert msg.xid not in streamed, f"first segment of {msg.xid} twice"
                streamed[msg.xid] = []
            else:
                assert msg.xid in streamed, f"continuation of unknown stream {msg.xid}"
        elif isinstance(msg, StreamStop):
            assert stream_xid is not None
            stream_xid = None
        elif isinstance(msg, StreamCommit):
            txns.append(Txn(msg.xid, msg.commit_lsn, msg.end_lsn, streamed.pop(msg.xid)))
        elif isinstance(msg, StreamPrepare):
            txns.append(Txn(msg.xid, msg.prepare_lsn, msg.end_lsn, streamed.pop(msg.xid)))
        elif isinstance(msg, StreamAbort):
            if msg.subxid == msg.xid:
                streamed.pop(msg.xid, None)
        elif stream_xid is not None:
            streamed[stream_xid].append(_change(msg, relations))
        elif current is not None:
            current[1].append(_change(msg, relations))
        elif isinstance(msg, Message) and not msg.transactional:
            loose.append(_change(msg, relations))
        else:
            raise AssertionError(f"{msg!r} outside any transaction")
    return txns, loose
