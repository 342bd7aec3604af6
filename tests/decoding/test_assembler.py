"""The assembler on exact byte streams (built with the codec's Encoder) as a server sends them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pgcdc.decoding import (
    Assembler,
    DecodingContext,
    DecodingError,
    OutputPlugin,
    Transaction,
)
from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    Prepare,
    ProtocolError,
    StreamCommit,
    StreamStart,
    Truncate,
    Type,
)
from tests.decoding.wire import (
    T0,
    T_ID,
    U_ID,
    FullRecorder,
    Recorder,
    StreamRecorder,
    StreamTwoPhaseRecorder,
    TwoPhaseRecorder,
    Wire,
    dele,
    feed,
    ins,
    msg,
    rel,
    upd,
)

TOP, TOP2, SUB1, SUB2, SUB3 = 700, 701, 710, 711, 712


# -- regular transactions ------------------------------------------------------------------
def test_regular_transaction_whole_with_metadata() -> None:
    w = Wire(proto=1)
    commit, end = w.txn(
        100,
        rel(),
        ins("1", "a"),
        upd("1", UNCHANGED_TOAST),
        upd("2", None, old=("1", None)),
        dele("2", None),
    )
    p = Recorder()
    asm = Assembler(p, proto_version=1)
    feed(asm, w.take())
    assert p.events == [
        ("begin", 100),
        ("change", 100, "INSERT", 0, ("1", "a")),
        ("change", 100, "UPDATE", 1, ("1", UNCHANGED_TOAST)),
        ("change", 100, "UPDATE", 2, ("2", None)),
        ("change", 100, "DELETE", 3, ("2", None)),
        ("commit", 100),
    ]
    (txn,) = p.txns
    assert txn == Transaction(xid=100, commit_lsn=commit, end_lsn=end, commit_time=T0)
    first, toast, keychange, delete = p.changes
    # the metadata is complete from begin on, and positions are ordinal within the transaction
    assert first.relation.qualified_name == "public.t"
    assert [c.name for c in first.relation.key_columns] == ["id"]
    assert [c.type_name for c in first.relation.columns] == ["int4", "text"]
    assert first.lsn is not None and first.lsn < commit
    assert first.xid is None
    # an unchanged TOASTed value stays distinguishable from NULL all the way up
    assert toast.raw("v") is UNCHANGED_TOAST and keychange.raw("v") is None
    assert toast.raw_values() == {"id": "1", "v": UNCHANGED_TOAST}
    assert (keychange.old_kind, keychange.raw("id", old=True)) == ("K", "1")
    assert delete.new is None and delete.raw("id", old=True) == "2"
    with pytest.raises(ValueError, match="has no new row"):
        delete.raw("id")
    with pytest.raises(ValueError, match="REPLICA IDENTITY FULL"):
        toast.raw("id", old=True)
    with pytest.raises(KeyError, match="no column 'nope'; its columns are id, v"):
        first.raw("nope")
    assert asm.durable_lsn == end and not asm.in_progress


def test_transactions_are_delivered_only_at_commit() -> None:
    w = Wire(proto=1)
    w.txn(100, rel(), ins("1", "a"), ins("2", "b"))
    items = w.take()
    p = Recorder()
    asm = Assembler(p, proto_version=1)
    feed(asm, items[:-1])
    assert p.events == [] and asm.in_progress and asm.open_transactions == 1
    feed(asm, items[-1:])
    assert p.order() == [100]


def test_change_outside_transaction_and_unknown_relation_are_errors() -> None:
    w = Wire(proto=1)
    w.put(ins("1", "a"))
    asm = Assembler(Recorder(), proto_version=1)
    with pytest.raises(DecodingError, match=r"Insert message at .* outside any transaction"):
        feed(asm, w.take())
    w.txn(100, ins("1", "a"))
    with pytest.raises(DecodingError, match="relation id 16384, which no Relation message"):
        feed(asm, w.take())


def test_commit_without_begin_is_an_error() -> None:
    w = Wire(proto=1)
    w.txn(100)
    items = w.take()
    asm = Assembler(Recorder(), proto_version=1)
    with pytest.raises(DecodingError, match=r"Commit at .* without a Begin"):
        feed(asm, items[1:])


def test_tuple_width_must_match_relation() -> None:
    w = Wire(proto=1)
    w.txn(100, rel(), ins("1", "a", "extra"))
    asm = Assembler(Recorder(), proto_version=1)
    with pytest.raises(DecodingError, match=r"Insert at .* on public\.t has 3 values, but its"):
        feed(asm, w.take())


def test_truncate_and_messages() -> None:
    w = Wire(proto=1)
    w.txn(
        100,
        rel(),
        rel(relid=U_ID, name="u"),
        ins("1", "a"),
        msg(b"inside"),
        Truncate(None, 1, (T_ID, U_ID)),
        ins("2", "b"),
    )
    plain = w.plain_message(b"outside")
    items = w.take()
    p = FullRecorder()
    asm = Assembler(p, proto_version=1)
    feed(asm, items)
    assert p.events == [
        ("begin", 100),
        ("change", 100, "INSERT", 0, ("1", "a")),
        ("message", 100, 1, b"inside"),
        ("truncate", 100, 2, ("t", "u"), True),
        ("change", 100, "INSERT", 3, ("2", "b")),
        ("commit", 100),
        ("message", None, None, b"outside"),
    ]
    assert asm.durable_lsn == plain + 1
    # the same stream to a plugin without truncate and message callbacks: both are ignored
    p2 = Recorder()
    feed(Assembler(p2, proto_version=1), items)
    assert p2.events == [
        ("begin", 100),
        ("change", 100, "INSERT", 0, ("1", "a")),
        ("change", 100, "INSERT", 1, ("2", "b")),
        ("commit", 100),
    ]


# -- origins -----------------------------------------------------------------------------
def test_origin_recorded_and_filtered() -> None:
    w = Wire(proto=2)
    w.txn(100, rel(), ins("1", "a"), origin="upstream")
    w.txn(101, ins("2", "b"), origin="elsewhere")
    w.block(TOP, rel(TOP), ins("3", "c", xid=TOP), first=True, origin="upstream")
    w.block(TOP2, rel(TOP2), ins("4", "d", xid=TOP2), first=True, origin="elsewhere")
    w.stream_commit(TOP)
    _, end = w.stream_commit(TOP2)
    p = FullRecorder(skip_origins=("upstream",))
    asm = Assembler(p, proto_version=2)
    feed(asm, w.take())
    assert [e for e in p.events if e[0] in ("filter_by_origin", "commit")] == [
        ("filter_by_origin", "upstream"),
        ("filter_by_origin", "elsewhere"),
        ("commit", 101),
        ("filter_by_origin", "upstream"),
        ("filter_by_origin", "elsewhere"),
        ("commit", TOP2),
    ]
    assert p.rows() == [("2", "b"), ("4", "d")]
    regular, streamed = p.txns
    assert (regular.origin, regular.origin_lsn) == ("elsewhere", Lsn(0xABCDEF))
    assert (streamed.origin, streamed.origin_lsn, streamed.streamed) == ("elsewhere", None, True)
    assert asm.stats.filtered == 2
    # filtered transactions still count as processed: the slot can move past them
    assert asm.durable_lsn == end


# -- streamed transactions ---------------------------------------------------------------
def test_interleaved_streams_delivered_whole_in_commit_order() -> None:
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    w.block(TOP2, rel(TOP2), ins("10", "x", xid=TOP2), first=True)
    w.txn(100, rel(), ins("50", "regular"))  # a small transaction commits in between
    w.block(TOP, ins("2", "b", xid=TOP))
    w.block(TOP2, ins("11", "y", xid=TOP2))
    w.stream_commit(TOP2)
    w.block(TOP, ins("3", "c", xid=TOP))
    w.stream_commit(TOP)
    p = Recorder()
    asm = Assembler(p, proto_version=2)
    feed(asm, w.take())
    assert p.order() == [100, TOP2, TOP]
    assert p.rows(TOP2) == [("10", "x"), ("11", "y")]
    assert p.rows(TOP) == [("1", "a"), ("2", "b"), ("3", "c")]
    assert [c.position for c in p.changes if c.relation and c.xid == TOP] == [0, 1, 2]
    assert all(t.streamed for t in p.txns[1:])
    assert asm.open_transactions == 0 and asm.memory_bytes == 0


def _nested_stream(w: Wire) -> None:
    """TOP: 1; SAVEPOINT a (SUB1): 2; SAVEPOINT b (SUB2): 3; ..."""
    w.block(TOP, rel(TOP), ins("1", "top", xid=TOP), ins("2", "a", xid=SUB1), first=True)
    w.block(TOP, ins("3", "b", xid=SUB2), ins("4", "b", xid=SUB2))


def test_subtransaction_abort_drops_it_and_nested_ones() -> None:
    # ROLLBACK TO a: a (SUB1) and the nested b (SUB2) go; top's changes stay
    w = Wire(proto=2)
    _nested_stream(w)
    w.stream_abort(TOP, SUB1)
    w.block(TOP, ins("5", "after", xid=TOP))
    w.stream_commit(TOP)
    p = Recorder()
    feed(Assembler(p, proto_version=2), w.take())
    assert p.rows() == [("1", "top"), ("5", "after")]
    assert [c.position for c in p.changes] == [0, 1]


def test_nested_subtransaction_abort_keeps_parent() -> None:
    # ROLLBACK TO b: only b (SUB2) goes; a's change stays; a later savepoint (SUB3) is kept
    w = Wire(proto=2)
    _nested_stream(w)
    w.stream_abort(TOP, SUB2)
    w.block(TOP, ins("6", "a again", xid=SUB1), ins("7", "c", xid=SUB3))
    w.stream_abort(TOP, 999)  # an empty subtransaction: nothing of it was streamed
    w.stream_commit(TOP)
    p = Recorder()
    asm = Assembler(p, proto_version=2)
    feed(asm, w.take())
    assert p.rows() == [("1", "top"), ("2", "a"), ("6", "a again"), ("7", "c")]
    assert asm.stats.subtransaction_aborts == 2


def test_released_savepoint_then_rollback_of_a_later_one() -> None:
    # SAVEPOINT a; ...; RELEASE a; SAVEPOINT b; ...; ROLLBACK TO b
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), ins("1", "a", xid=SUB1), ins("2", "top", xid=TOP), first=True)
    w.block(TOP, ins("3", "b", xid=SUB2))
    w.stream_abort(TOP, SUB2)
    w.stream_commit(TOP)
    p = Recorder()
    feed(Assembler(p, proto_version=2), w.take())
    assert p.rows() == [("1", "a"), ("2", "top")]


def test_top_level_stream_abort_drops_all() -> None:
    w = Wire(proto=4)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    w.block(TOP2, rel(TOP2), ins("2", "b", xid=TOP2), first=True)
    w.block(TOP, ins("3", "c", xid=SUB1))
    w.stream_abort(TOP, TOP, info=True)
    w.stream_commit(TOP2)
    p = Recorder()
    asm = Assembler(p, proto_version=4)
    feed(asm, w.take())
    assert p.order() == [TOP2] and p.rows() == [("2", "b")]
    assert asm.stats.aborted == 1 and asm.open_transactions == 0


def test_stream_continuation_without_first_block_is_an_error() -> None:
    w = Wire(proto=2)
    w.block(TOP, ins("1", "a", xid=TOP))
    asm = Assembler(Recorder(), proto_version=2)
    with pytest.raises(DecodingError, match="first block was not received"):
        feed(asm, w.take())


def test_relation_in_aborted_subtransaction_is_forgotten() -> None:
    # the Relation message came inside the aborted subtransaction: pgoutput sends it again
    # before the next change, and the truncated definition must not be used
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    wide = (("id", 23), ("v", 25), ("w", 25))
    w.block(TOP, rel(SUB1, columns=wide), ins("2", "b", "c", xid=SUB1))
    w.stream_abort(TOP, SUB1)
    w.block(TOP, rel(TOP), ins("3", "d", xid=TOP))
    w.stream_commit(TOP)
    p = Recorder()
    asm = Assembler(p, proto_version=2)
    feed(asm, w.take())
    assert p.rows() == [("1", "a"), ("3", "d")]
    assert p.schema == []
    info = asm.relations.get(T_ID)
    assert info is not None and info.column_names == ("id", "v")


# -- schema changes ----------------------------------------------------------------------
def test_schema_change_mid_stream() -> None:
    w = Wire(proto=2)
    w.txn(100, rel(), ins("1", "a"))
    wide = (("id", 23), ("v", 1043), ("w", 25))  # v retyped to varchar, w added
    w.block(TOP, rel(TOP, columns=wide), ins("2", "b", "c", xid=TOP), first=True)
    # a transaction committing before the streamed one still uses the old definition,
    # which pgoutput sends again since the relation was invalidated
    w.txn(101, rel(), ins("3", "d"))
    w.stream_commit(TOP)
    w.txn(102, ins("4", "e", "f"))  # no Relation message: the stream's definition is current
    p = Recorder()
    asm = Assembler(p, proto_version=2)
    feed(asm, w.take())
    assert [e for e in p.events if e[0] != "begin"] == [
        ("change", 100, "INSERT", 0, ("1", "a")),
        ("commit", 100),
        ("change", 101, "INSERT", 0, ("3", "d")),
        ("commit", 101),
        ("schema", TOP, "t", ("w",), (), ("v",)),
        ("change", TOP, "INSERT", 0, ("2", "b", "c")),
        ("commit", TOP),
        ("change", 102, "INSERT", 0, ("4", "e", "f")),
        ("commit", 102),
    ]
    (change,) = p.schema
    assert change.relation_id == T_ID and not change.renamed and not change.key_changed
    assert change.retyped[0][1].type_name == "varchar"
    assert change.describe() == "public.t: added w; retyped v text->varchar"


def test_schema_change_reported_once_and_not_for_identical_resend() -> None:
    w = Wire(proto=1)
    w.txn(100, rel(), ins("1", "a"))
    w.txn(101, rel(), ins("2", "b"))  # identical definition sent again: no change
    w.txn(102, rel(key=("id", "v"), ident="f"), ins("3", "c"))
    p = Recorder()
    feed(Assembler(p, proto_version=1), w.take())
    (change,) = p.schema
    assert change.key_changed and change.replica_identity_changed
    assert change.describe() == "public.t: key id,v; replica identity full"


# -- two-phase ---------------------------------------------------------------------------
def test_prepared_held_for_plain_plugin_until_commit_prepared() -> None:
    w = Wire(proto=3)
    prepare, prepare_end = w.prepared(100, "gid-1", rel(), ins("1", "a"))
    _, end101 = w.txn(101, ins("2", "b"))
    commit, commit_end = w.commit_prepared(100, "gid-1")
    items = w.take()
    p = Recorder()
    asm = Assembler(p, proto_version=3)
    feed(asm, items[:-1])
    assert p.order() == [101]
    assert asm.held_prepared == ((100, "gid-1", prepare),)
    # never confirmed past the prepare of what is held
    assert asm.durable_lsn == end101
    assert asm.safe_confirm_lsn(asm.durable_lsn) == prepare
    feed(asm, items[-1:])
    assert p.order() == [101, 100] and p.rows(100) == [("1", "a")]
    txn = p.txns[-1]
    assert (txn.gid, txn.commit_lsn, txn.end_lsn, txn.prepare_lsn, txn.prepare_end_lsn) == (
        "gid-1",
        commit,
        commit_end,
        prepare,
        prepare_end,
    )
    assert asm.held_prepared == () and asm.safe_confirm_lsn(asm.durable_lsn) == commit_end


def test_prepared_discarded_on_rollback_prepared() -> None:
    w = Wire(proto=3)
    _, prepare_end = w.prepared(100, "gid-1", rel(), ins("1", "a"))
    end = w.rollback_prepared(100, "gid-1", prepare_end)
    p = Recorder()
    asm = Assembler(p, proto_version=3)
    feed(asm, w.take())
    assert p.events == [] and asm.held_prepared == ()
    assert asm.safe_confirm_lsn(asm.durable_lsn) == end
    assert asm.stats.rolled_back_prepared == 1


def test_two_phase_plugin_gets_prepare_time_delivery() -> None:
    w = Wire(proto=3)
    w.prepared(100, "gid-1", rel(), ins("1", "a"))
    w.commit_prepared(100, "gid-1")
    _, end2 = w.prepared(101, "gid-2", ins("2", "b"))
    w.rollback_prepared(101, "gid-2", end2)
    p = TwoPhaseRecorder()
    asm = Assembler(p, proto_version=3)
    feed(asm, w.take())
    assert [e for e in p.events if e[0] != "change"] == [
        ("begin_prepare", 100, "gid-1"),
        ("prepare", 100, "gid-1"),
        ("commit_prepared", 100, "gid-1"),
        ("begin_prepare", 101, "gid-2"),
        ("prepare", 101, "gid-2"),
        ("rollback_prepared", 101, "gid-2", end2),
    ]
    assert p.rows() == [("1", "a"), ("2", "b")]
    assert asm.held_prepared == ()


def test_filter_prepare_defers_to_commit_prepared() -> None:
    w = Wire(proto=3)
    w.prepared(100, "late", rel(), ins("1", "a"))
    w.prepared(101, "early", ins("2", "b"))
    w.commit_prepared(101, "early")
    w.commit_prepared(100, "late")
    p = TwoPhaseRecorder(filtered_gids=("late",))
    feed(Assembler(p, proto_version=3), w.take())
    assert [e for e in p.events if e[0] != "change"] == [
        ("begin_prepare", 101, "early"),
        ("prepare", 101, "early"),
        ("commit_prepared", 101, "early"),
        ("begin", 100),
        ("commit", 100),
    ]


def test_stream_prepared_then_commit_or_rollback_prepared() -> None:
    w = Wire(proto=3)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), ins("2", "sub", xid=SUB1), first=True)
    w.stream_abort(TOP, SUB1)
    w.block(TOP, ins("3", "c", xid=TOP))
    prepare, _ = w.stream_prepare(TOP, "big")
    w.block(TOP2, rel(TOP2), ins("9", "z", xid=TOP2), first=True)
    _, end2 = w.stream_prepare(TOP2, "doomed")
    items_prepared = w.take()
    w.commit_prepared(TOP, "big")
    w.rollback_prepared(TOP2, "doomed", end2)
    items_resolved = w.take()

    p = Recorder()
    asm = Assembler(p, proto_version=3)
    feed(asm, items_prepared)
    assert p.events == [] and [h[1] for h in asm.held_prepared] == ["big", "doomed"]
    assert asm.safe_confirm_lsn(asm.durable_lsn) == prepare
    feed(asm, items_resolved)
    assert p.order() == [TOP] and p.rows() == [("1", "a"), ("3", "c")]
    assert p.txns[0].streamed and p.txns[0].gid == "big"

    p2 = StreamTwoPhaseRecorder()
    feed(Assembler(p2, proto_version=3), items_prepared + items_resolved)
    assert [e[0] for e in p2.events if e[1] == TOP and e[0] != "stream_change"] == [
        "stream_start",
        "stream_stop",
        "stream_abort",
        "stream_start",
        "stream_stop",
        "stream_prepare",
        "commit_prepared",
    ]
    assert ("rollback_prepared", TOP2, "doomed", end2) in p2.events


def test_streaming_plugin_without_two_phase_gets_stream_commit_at_commit_prepared() -> None:
    w = Wire(proto=3)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    w.stream_prepare(TOP, "big")
    w.block(TOP2, rel(TOP2), ins("2", "b", xid=TOP2), first=True)
    _, end2 = w.stream_prepare(TOP2, "doomed")
    w.commit_prepared(TOP, "big")
    w.rollback_prepared(TOP2, "doomed", end2)
    p = StreamRecorder()
    feed(Assembler(p, proto_version=3), w.take())
    assert [e for e in p.events if e[0] in ("stream_commit", "stream_abort")] == [
        ("stream_commit", TOP),
        ("stream_abort", TOP2, TOP2, True, 0, "abort"),
    ]
    assert p.applied == {TOP: [("1", "a")]}


def test_commit_prepared_of_unknown_prepare_is_an_error_for_plain_plugins() -> None:
    w = Wire(proto=3)
    w.commit_prepared(100, "gid-1")
    items = w.take()
    with pytest.raises(DecodingError, match="PREPARE was never received"):
        feed(Assembler(Recorder(), proto_version=3), items)
    # a two-phase plugin may have received the PREPARE in an earlier run: it decides
    p = TwoPhaseRecorder()
    feed(Assembler(p, proto_version=3), items)
    assert p.events == [("commit_prepared", 100, "gid-1")]


def test_prepare_replayed_at_commit_prepared_time_is_not_a_duplicate() -> None:
    # a transaction prepared before two-phase decoding was enabled for the slot is sent whole,
    # Begin Prepare .. Prepare, right before its Commit Prepared: its prepare LSN is older than
    # transactions already delivered
    w = Wire(proto=3)
    old_prepare = w.tick()
    w.txn(101, rel(), ins("2", "b"))
    w.put(BeginPrepare(old_prepare, Lsn(old_prepare + 0x30), T0, 100, "old"))
    w.put(ins("1", "a"))
    w.put(Prepare(0, old_prepare, Lsn(old_prepare + 0x30), T0, 100, "old"))
    w.commit_prepared(100, "old")
    p = Recorder()
    feed(Assembler(p, proto_version=3), w.take())
    assert p.order() == [101, 100] and p.rows(100) == [("1", "a")]


# -- streaming plugins (live delivery) ---------------------------------------------------
def test_streaming_plugin_receives_blocks_live() -> None:
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), ins("2", "sub", xid=SUB1), first=True)
    w.txn(100, rel(), ins("50", "regular"))
    w.block(TOP, ins("3", "nested", xid=SUB2), ins("4", "c", xid=TOP))
    w.stream_abort(TOP, SUB1, info=False)
    w.block(TOP, ins("5", "d", xid=TOP))
    w.stream_commit(TOP)
    p = StreamRecorder()
    asm = Assembler(p, proto_version=2)
    items = w.take()
    feed(asm, items[:4])  # the first block, before its Stream Stop
    assert p.events == [
        ("stream_start", TOP),
        ("stream_change", TOP, 0, TOP, ("1", "a")),
        ("stream_change", TOP, 1, SUB1, ("2", "sub")),
    ]
    feed(asm, items[4:])
    assert ("stream_abort", TOP, SUB1, False, 1, "abort") in p.events
    # non-streamed transactions still arrive whole
    assert ("begin", 100) in p.events and ("commit", 100) in p.events
    assert p.applied[TOP] == [("1", "a"), ("5", "d")]
    assert asm.memory_bytes == 0 and asm.peak_memory_bytes < 1000


def test_streaming_plugin_told_to_discard_on_reconnect() -> None:
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    w.put(StreamStart(TOP, False))
    w.put(ins("2", "b", xid=TOP))
    before = w.take()
    # after the reconnect the server streams the transaction again from its first block
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), ins("2", "b", xid=TOP), first=True)
    w.stream_commit(TOP)
    after = w.take()
    p = StreamRecorder()
    asm = Assembler(p, proto_version=2)
    feed(asm, before)
    asm.reconnected(Lsn(0x1000))
    feed(asm, after)
    assert ("stream_stop", TOP) in p.events
    assert ("stream_abort", TOP, TOP, True, 0, "reconnect") in p.events
    assert p.applied == {TOP: [("1", "a"), ("2", "b")]}


# -- reconnects ----------------------------------------------------------------------------
@pytest.mark.parametrize("resent_as", ["stream", "regular"])
def test_reconnect_mid_stream_with_resend_delivers_each_transaction_once(resent_as: str) -> None:
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    _, end100 = w.txn(100, rel(), ins("10", "x"))
    w.block(TOP2, rel(TOP2), ins("20", "y", xid=TOP2), first=True)
    top2_commit, top2_end = w.stream_commit(TOP2)
    w.put(Begin(w.tick(0x1000), T0, 102))  # a transaction cut off by the disconnect
    w.put(rel())
    p = Recorder()
    asm = Assembler(p, proto_version=2)
    feed(asm, w.take())
    assert p.order() == [100, TOP2] and asm.in_progress
    asm.reconnected(end100)
    assert asm.open_transactions == 0 and not asm.in_progress

    # the server resends from the last confirmed position (end of 100): TOP from its first
    # block, TOP2 (streamed again, or this time small enough to come whole), 102 complete
    resend = Wire(proto=2, start=end100)
    resend.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    if resent_as == "stream":
        resend.block(TOP2, rel(TOP2), ins("20", "y", xid=TOP2), first=True)
        resend.put(StreamCommit(TOP2, 0, top2_commit, top2_end, T0), top2_end)
    else:
        resend.put(Begin(top2_commit, T0, TOP2))
        resend.put(rel())
        resend.put(ins("20", "y"))
        resend.put(Commit(0, top2_commit, top2_end, T0), top2_end)
    resend.seek(top2_end + 0x1000)
    resend.txn(102, rel(), ins("30", "z"))
    resend.block(TOP, ins("2", "b", xid=TOP))
    resend.stream_commit(TOP)
    feed(asm, resend.take())
    assert p.order() == [100, TOP2, 102, TOP]
    assert p.rows(TOP) == [("1", "a"), ("2", "b")] and p.rows(TOP2) == [("20", "y")]
    assert asm.stats.duplicates == 1 and asm.stats.reconnects == 1


def test_reconnect_resend_of_regular_transactions_is_skipped() -> None:
    w = Wire(proto=1)
    w.txn(100, rel(), ins("1", "a"))
    w.txn(101, ins("2", "b"))
    first = w.take()
    w.txn(102, ins("3", "c"))
    later = w.take()
    p = Recorder()
    asm = Assembler(p, proto_version=1)
    feed(asm, first)
    asm.reconnected(Lsn(0))  # nothing was confirmed: everything is sent again
    feed(asm, first + later)
    assert p.order() == [100, 101, 102]
    assert asm.stats.duplicates == 2


def test_held_prepared_survives_reconnect_and_resend() -> None:
    w = Wire(proto=3)
    prepare, _ = w.prepared(100, "gid-1", rel(), ins("1", "a"))
    w.txn(101, ins("2", "b"))
    sent = w.take()
    w.commit_prepared(100, "gid-1")
    resolution = w.take()
    p = Recorder()
    asm = Assembler(p, proto_version=3)
    feed(asm, sent)
    confirmed = asm.safe_confirm_lsn(asm.durable_lsn)
    assert confirmed == prepare
    asm.reconnected(confirmed)
    # the server sends again from the prepare: the held transaction is not taken twice
    feed(asm, sent + resolution)
    assert p.order() == [101, 100] and p.rows() == [("2", "b"), ("1", "a")]


def test_commit_prepared_after_reconnect_in_a_new_process() -> None:
    # a new process (new assembler) gets everything after the confirmed prepare LSN again
    w = Wire(proto=3)
    w.prepared(100, "gid-1", rel(), ins("1", "a"))
    w.commit_prepared(100, "gid-1")
    p = Recorder()
    feed(Assembler(p, proto_version=3), w.take())
    assert p.order() == [100]


def test_non_transactional_messages_after_reconnect_are_not_repeated() -> None:
    w = Wire(proto=1)
    w.plain_message(b"one")
    w.plain_message(b"two")
    items = w.take()
    p = FullRecorder()
    asm = Assembler(p, proto_version=1)
    feed(asm, items[:1])
    asm.reconnected(Lsn(0))
    feed(asm, items)
    assert [e[3] for e in p.events] == [b"one", b"two"]


# -- durability --------------------------------------------------------------------------
class Buffering(Recorder):
    auto_confirm = False


def test_manual_confirmation() -> None:
    w = Wire(proto=1)
    _, end1 = w.txn(100, rel(), ins("1", "a"))
    w.txn(101, ins("2", "b"))
    w.txn(102, ins("3", "c"), origin="skipme")
    _, end3 = w.txn(103, ins("4", "d"))
    p = Buffering()
    asm = Assembler(p, proto_version=1)
    feed(asm, w.take())
    assert asm.durable_lsn == Lsn(0) and asm.unconfirmed == 4
    asm.ctx.confirm(end1)
    assert asm.durable_lsn == end1 and asm.unconfirmed == 3
    asm.ctx.confirm(end3)
    assert asm.durable_lsn == end3 and asm.unconfirmed == 0


def test_confirm_by_returning_an_lsn() -> None:
    class Returns(Buffering):
        def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> Lsn | None:
            super().commit(ctx, txn, commit_lsn)
            return txn.end_lsn if txn.xid == 100 else None

    w = Wire(proto=1)
    _, end1 = w.txn(100, rel(), ins("1", "a"))
    w.txn(101, ins("2", "b"))
    asm = Assembler(Returns(), proto_version=1)
    feed(asm, w.take())
    assert asm.durable_lsn == end1 and asm.unconfirmed == 1


# -- feeding events ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WalData:
    data_start: Lsn
    wal_end: Lsn
    payload: bytes


@dataclass(frozen=True, slots=True)
class Reconnected:
    resume_lsn: Lsn


@dataclass(frozen=True, slots=True)
class Idle:
    server_wal_end: Lsn


def test_feed_events() -> None:
    w = Wire(proto=1)
    w.txn(100, rel(), ins("1", "a"))
    items = w.take()
    p = Recorder()
    asm = Assembler(p, proto_version=1)
    asm.feed(WalData(Lsn(items[0][1]), Lsn(items[0][1]), items[0][0]))
    asm.feed(Reconnected(Lsn(0)))
    assert not asm.in_progress
    for payload, lsn in items:
        asm.feed(WalData(Lsn(lsn), Lsn(lsn + 8), payload))
    asm.feed(Idle(Lsn(0x5_0000_0000)))
    asm.feed(b"M\x00" + Lsn(items[-1][1] + 16).to_bytes(8, "big") + b"p\x00" + bytes(4))
    assert asm.durable_lsn == Lsn(items[-1][1] + 17)  # a non-transactional message, passed
    assert p.order() == [100]
    assert asm.server_wal_end == Lsn(0x5_0000_0000)
    assert asm.last_data_lsn == Lsn(items[-1][1] + 8)
    with pytest.raises(TypeError, match="cannot feed a int to the assembler"):
        asm.feed(5)


def test_type_messages_name_columns() -> None:
    w = Wire(proto=1)
    w.txn(
        100,
        Type(None, 90001, "public", "mood"),
        Type(None, 90002, "", "int4"),  # a domain over int4: pg_catalog is sent as ''
        rel(columns=(("id", 90002), ("m", 90001), ("n", 1700))),
        ins("1", "ok", "2.5"),
    )
    p = Recorder()
    feed(Assembler(p, proto_version=1, type_lookup=lambda oid: None), w.take())
    assert [c.type_name for c in p.changes[0].relation.columns] == [
        "int4",
        "public.mood",
        "numeric",
    ]


def test_plain_object_plugin() -> None:
    class Duck:
        def __init__(self) -> None:
            self.seen: list[int] = []

        def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
            pass

        def change(self, ctx: object, txn: Transaction, relation: object, change: object) -> None:
            pass

        def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
            self.seen.append(txn.xid)

    w = Wire(proto=1)
    w.txn(100, rel(), ins("1", "a"))
    d = Duck()
    feed(Assembler(d, proto_version=1), w.take())
    assert d.seen == [100]
    assert isinstance(OutputPlugin(), OutputPlugin)


def test_relation_definition_from_aborted_subtransaction_is_not_kept() -> None:
    # ALTER TABLE u inside a savepoint rolled back: the wider definition must not become current
    w = Wire(proto=2)
    w.txn(100, rel(relid=U_ID, name="u"), ins("0", "u", relid=U_ID))
    wide = (("id", 23), ("v", 25), ("w", 25))
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    w.block(TOP, rel(SUB1, relid=U_ID, name="u", columns=wide), ins("2", "b", "c", xid=SUB1))
    w.stream_abort(TOP, SUB1)
    w.stream_commit(TOP)
    w.txn(101, ins("3", "d", relid=U_ID))
    p = Recorder()
    asm = Assembler(p, proto_version=2)
    feed(asm, w.take())
    info = asm.relations.get(U_ID)
    assert info is not None and info.column_names == ("id", "v")
    assert p.rows() == [("0", "u"), ("1", "a"), ("3", "d")] and p.schema == []


def test_streaming_plugin_not_sent_a_finished_stream_again_after_reconnect() -> None:
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), ins("1", "a", xid=TOP), first=True)
    commit, end = w.stream_commit(TOP)
    sent = w.take()
    p = StreamRecorder()
    asm = Assembler(p, proto_version=2)
    feed(asm, sent)
    asm.reconnected(Lsn(0))
    feed(asm, sent)  # the server sends it again: nothing reaches the plugin
    kinds = [e[0] for e in p.events]
    assert kinds == ["stream_start", "stream_change", "stream_stop", "stream_commit"]
    assert p.applied == {TOP: [("1", "a")]}
    assert asm.durable_lsn == end and commit < end


def test_malformed_messages_raise_protocol_errors() -> None:
    w = Wire(proto=2)
    w.block(TOP, rel(TOP), first=True)
    items = w.take()
    asm = Assembler(Recorder(), proto_version=2)
    feed(asm, items[:2])
    with pytest.raises(ProtocolError, match="Insert message"):
        asm.feed_message(b"I\x00\x00\x02", 1)
    with pytest.raises(ProtocolError, match="empty message"):
        asm.feed_message(b"", 1)
    # a buffered change is decoded in full when delivered
    w.txn(100, rel(), ins("1", "a"))
    broken = w.take()
    payload, lsn = broken[2]
    broken[2] = (payload[:-3], lsn)
    asm = Assembler(Recorder(), proto_version=2)
    with pytest.raises(ProtocolError, match="truncated"):
        feed(asm, broken)
