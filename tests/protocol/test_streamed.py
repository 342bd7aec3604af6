"""Subtransactions of a streamed transaction, as PostgreSQL's apply worker keeps them: a list
standing in for its changes file, truncated where an aborted subtransaction began."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pgcdc.protocol.streamed import Subtransactions

TOP = 100


def test_first_message_marks_and_abort_drops_it_and_later_ones() -> None:
    changes: list[int] = []
    subs: Subtransactions[int] = Subtransactions(TOP)
    for xid in (TOP, 101, 101, 102, 101, 103):
        subs.note(xid, lambda: len(changes))
        changes.append(xid)
    assert len(subs) == 3  # 101, 102, 103: the top transaction is not a subtransaction
    mark = subs.abort(102)
    assert mark == 3
    del changes[mark:]
    assert changes == [TOP, 101, 101]
    assert len(subs) == 1 and subs.last is None
    assert subs.abort(103) is None  # gone with 102, which began before it
    assert subs.abort(999) is None  # never streamed: nothing to drop


def test_a_subtransaction_seen_again_after_another_keeps_its_first_mark() -> None:
    subs: Subtransactions[str] = Subtransactions(TOP)
    subs.note(101, lambda: "first of 101")
    subs.note(102, lambda: "first of 102")
    subs.note(101, lambda: "later message of 101")
    assert subs.abort(101) == "first of 101"


@given(st.lists(st.tuples(st.booleans(), st.integers(TOP, TOP + 4)), max_size=60))
def test_like_a_changes_file(events: list[tuple[bool, int]]) -> None:
    """Against the model: the survivors are the messages before the aborted subtransaction's
    first one (worker.c truncates its changes file there)."""
    changes: list[int] = []
    subs: Subtransactions[int] = Subtransactions(TOP)
    for is_abort, xid in events:
        if is_abort and xid != TOP:
            firsts = [i for i, x in enumerate(changes) if x == xid]
            expected = changes[: firsts[0]] if firsts else changes
            mark = subs.abort(xid)
            if mark is not None:
                del changes[mark:]
            assert changes == expected
        elif not is_abort:
            subs.note(xid, lambda: len(changes))
            changes.append(xid)
