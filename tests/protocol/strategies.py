"""Hypothesis strategies for pgoutput messages (shared by the codec's property tests)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import strategies as st

from pgcdc.lsn import Lsn
from pgcdc.protocol import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
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
    StreamStop,
    Truncate,
    TupleValue,
    Type,
    Update,
)

lsns = st.integers(0, (1 << 64) - 1).map(Lsn)
xids = st.integers(0, (1 << 32) - 1)
oids = st.integers(0, (1 << 32) - 1)
times = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
)
names = st.text(st.characters(blacklist_characters="\0", codec="utf-8"), max_size=20)
values: st.SearchStrategy[TupleValue] = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.text(st.characters(codec="utf-8"), max_size=30),
    st.binary(max_size=30),
)
tuples = st.lists(values, max_size=8).map(tuple)
flags0 = st.just(0)


def data_messages(xid: st.SearchStrategy[int | None]) -> st.SearchStrategy[ReplicationMessage]:
    """Messages that carry an Xid inside a streamed block (``xid``) and none outside."""
    columns = st.builds(
        Column, st.sampled_from([0, 1]), names, oids, st.integers(-(1 << 31), (1 << 31) - 1)
    )
    return st.one_of(
        st.builds(
            Relation,
            xid,
            oids,
            names,
            names,
            st.sampled_from("dnfi"),
            st.lists(columns, max_size=6).map(tuple),
        ),
        st.builds(Type, xid, oids, names, names),
        st.builds(Insert, xid, oids, tuples),
        st.one_of(
            st.builds(Update, xid, oids, st.none(), st.none(), tuples),
            st.builds(Update, xid, oids, st.sampled_from(["K", "O"]), tuples, tuples),
        ),
        st.builds(Delete, xid, oids, st.sampled_from(["K", "O"]), tuples),
        st.builds(Truncate, xid, st.integers(0, 3), st.lists(oids, max_size=5).map(tuple)),
        st.builds(Message, xid, st.booleans(), lsns, names, st.binary(max_size=40)),
    )


def control_messages(proto: int) -> st.SearchStrategy[ReplicationMessage]:
    """Messages outside streamed blocks, of protocol version ``proto``."""
    options: list[st.SearchStrategy[ReplicationMessage]] = [
        st.builds(Begin, lsns, times, xids),
        st.builds(Commit, flags0, lsns, lsns, times),
        st.builds(Origin, lsns, names),
    ]
    if proto >= 2:
        abort_info = (
            st.one_of(st.tuples(st.none(), st.none()), st.tuples(lsns, times))
            if proto >= 4
            else st.tuples(st.none(), st.none())
        )
        options += [
            st.builds(StreamCommit, xids, flags0, lsns, lsns, times),
            st.builds(
                lambda x, s, info: StreamAbort(x, s, info[0], info[1]), xids, xids, abort_info
            ),
        ]
    if proto >= 3:
        options += [
            st.builds(BeginPrepare, lsns, lsns, times, xids, names),
            st.builds(Prepare, flags0, lsns, lsns, times, xids, names),
            st.builds(CommitPrepared, flags0, lsns, lsns, times, xids, names),
            st.builds(RollbackPrepared, flags0, lsns, lsns, times, times, xids, names),
            st.builds(StreamPrepare, flags0, lsns, lsns, times, xids, names),
        ]
    return st.one_of(*options)


@st.composite
def streams(draw: st.DrawFn, proto: int) -> list[ReplicationMessage]:
    """A well-formed sequence of messages: control messages, data, and streamed blocks."""
    out: list[ReplicationMessage] = []
    for _ in range(draw(st.integers(0, 12))):
        if proto >= 2 and draw(st.booleans()):
            xid = draw(xids)
            out.append(StreamStart(xid, draw(st.booleans())))
            subxid = st.one_of(st.just(xid), xids)
            out += draw(st.lists(data_messages(subxid), max_size=5))
            out.append(StreamStop())
        else:
            out += draw(
                st.lists(st.one_of(control_messages(proto), data_messages(st.none())), max_size=5)
            )
    return out
