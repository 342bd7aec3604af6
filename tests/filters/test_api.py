"""The public API's contracts that need no server: parsing, printing, binding options,
evaluation of pgoutput tuples, collations, errors at evaluation, the stream's UPDATE rules."""

from __future__ import annotations

import pickle

import pytest

from pgcdc.filters import (
    CollationError,
    FilterEvaluationError,
    FilterSet,
    FilterSyntaxError,
    ReplicaIdentityError,
    RowFilter,
    StreamFilter,
    UnsupportedFilterError,
)
from pgcdc.protocol.messages import UNCHANGED_TOAST, Column, Delete, Insert, Relation, Update

REL = Relation(
    None,
    7,
    "public",
    "t",
    "d",
    (
        Column(1, "k", 23, -1),
        Column(0, "t", 25, -1),
        Column(0, "n", 1700, -1),
        Column(0, "Mixed Case", 23, -1),
    ),
)


def _bind(text: str, **kwargs: object) -> object:
    return RowFilter.parse(text).bind(REL, publishes_update_or_delete=False, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "sql"),
    [
        ("k > 5 AND t = 'NSW'", '(("k" > 5) AND ("t" = \'NSW\'))'),
        ("K>-5", '("k" > (-5))'),
        ('"Mixed Case" <-1', '("Mixed Case" < (-1))'),
        ("k != 1", '("k" <> 1)'),
        ("t LIKE 'a\\%' ESCAPE '#'", "(\"t\" LIKE E'a\\\\%' ESCAPE '#')"),
        ("n::numeric(5,2) > 1", '(CAST("n" AS numeric(5, 2)) > 1)'),
        ("lower(t) = 'x'", '(pg_catalog."lower"("t") = \'x\')'),
        (
            "extract(year from date '2024-01-01') = 2024",
            "(EXTRACT('year' FROM CAST('2024-01-01' AS \"date\")) = 2024)",
        ),
        ("k between 1 and 2", '("k" BETWEEN 1 AND 2)'),
        ("k = -(2147483648)", '("k" = (-2147483648))'),
        ("t = E'it''s \\n'", "(\"t\" = 'it''s \n')"),
        ("-- comment\nk /* nested /* c */ */ > 1", '("k" > 1)'),
        ("t = $$a'b$$", "(\"t\" = 'a''b')"),
        ("t = 'a'\n  'b'", "(\"t\" = 'ab')"),
    ],
)
def test_parse_and_print(text: str, sql: str) -> None:
    flt = RowFilter.parse(text)
    assert flt.to_sql() == sql
    assert RowFilter.parse(flt.to_sql()).to_sql() == sql  # printing is a fixed point


def test_literal_types_follow_the_server() -> None:
    from pgcdc.filters.bound import Call, Const

    def const_type(text: str) -> int:
        bound = RowFilter.parse(f"{text} IS NOT NULL").bind(REL).prepared
        arg = bound.arg  # type: ignore[union-attr]
        assert isinstance(arg, Const | Call)
        return arg.type

    assert const_type("2147483647") == 23
    assert const_type("2147483648") == 20
    assert const_type("-2147483648") == 23
    assert const_type("-(2147483648)") == 23
    assert const_type("9223372036854775808") == 1700
    assert const_type("1.5") == 1700
    assert const_type("'x'") == 705


@pytest.mark.parametrize(
    ("text", "position"),
    [("k > ", 5), ("k > 1 1", 7), ("k <> <> 1", 6), ("(k > 1", 7), ("k > 1)", 6), ("'abc", 1)],
)
def test_syntax_errors_point_at_the_token(text: str, position: int) -> None:
    with pytest.raises(FilterSyntaxError) as caught:
        RowFilter.parse(text)
    assert caught.value.position == position
    assert caught.value.sqlstate == "42601"


def test_evaluation_of_text_and_binary_tuples() -> None:
    bound = _bind("k % 3 = 0 AND n > 1.5 AND t LIKE 'N%'")
    assert bound.matches(("3", "NSW", "1.6", None))  # type: ignore[attr-defined]
    assert not bound.matches(("3", "NSW", "1.5", None))  # type: ignore[attr-defined]
    assert bound.evaluate(("3", None, "2", None)) is None  # type: ignore[attr-defined]
    binary = (
        (3).to_bytes(4, "big", signed=True),
        b"NSW",
        bytes.fromhex("0001 0000 0000 0001 0002"),  # numeric 2 (ndigits, weight, sign, dscale)
        None,
    )
    assert bound.matches(binary)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="4 columns"):
        bound.matches(("3",))  # type: ignore[attr-defined]


def test_unchanged_toast_in_a_filtered_column_cannot_be_evaluated() -> None:
    bound = _bind("t = 'x'")
    assert bound.matches(("1", "x", UNCHANGED_TOAST, None))  # type: ignore[attr-defined]
    with pytest.raises(FilterEvaluationError, match="unchanged TOAST"):
        bound.matches(("1", UNCHANGED_TOAST, None, None))  # type: ignore[attr-defined]


def test_errors_at_evaluation_are_raised_like_the_server() -> None:
    bound = _bind("k / (k - 1) > 0")
    assert bound.matches(("2", None, None, None))  # type: ignore[attr-defined]
    with pytest.raises(FilterEvaluationError) as caught:
        bound.matches(("1", None, None, None))  # type: ignore[attr-defined]
    assert (caught.value.sqlstate, caught.value.message) == ("22012", "division by zero")
    # a constant part that fails fails every row, as the server's planner fails
    always = _bind("k > 0 OR 1 / 0 = 1")
    for _ in range(2):
        with pytest.raises(FilterEvaluationError):
            always.matches(("5", None, None, None))  # type: ignore[attr-defined]
    # ... unless folding never reaches it
    assert _bind("k > 0 OR CASE WHEN true THEN true ELSE 1 / 0 = 1 END").matches(  # type: ignore[attr-defined]
        ("-1", None, None, None)
    )


def test_collation_decides_text_ordering() -> None:
    _bind("t < 'x'", collation="C")
    _bind("t < 'x'", collation="POSIX")
    _bind("t = 'x' AND t LIKE 'a%'", collation="en_US.UTF-8")  # equality: any collation
    _bind("(t COLLATE \"C\") < 'x'", collation="en_US.UTF-8")
    for text in ("t < 'x'", "lower(t) = 'x'", "t ILIKE 'x'", "GREATEST(t, 'a') = 'a'"):
        with pytest.raises(CollationError):
            _bind(text, collation="en_US.UTF-8")
    # C.UTF-8, glibc's and the builtin provider's: code point order, simple case mapping
    for name in ("C.UTF-8", "C.utf8", "pg_c_utf8"):
        _bind("t > 'a' AND upper(t) = 'X' AND lower(t) LIKE 'a%' AND t ILIKE 'x'", collation=name)
    with pytest.raises(CollationError):
        _bind("t < 'x'", collation="C.ISO-8859-1")


def test_literals_whose_meaning_depends_on_the_session_are_refused() -> None:
    rel = Relation(None, 1, "public", "x", "f", (Column(1, "tz", 1184, -1),))
    for text in ("tz > '2024-01-01'", "tz > 'now'", "tz::date > 'today'"):
        with pytest.raises(UnsupportedFilterError):
            RowFilter.parse(text).bind(rel)
    RowFilter.parse("tz > '2024-01-01 00:00+02'").bind(rel)


def test_errors_pickle_and_copy() -> None:
    with pytest.raises(ReplicaIdentityError) as caught:
        RowFilter.parse("t = 'x'").bind(REL)
    error = caught.value
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is ReplicaIdentityError
    assert (clone.detail, clone.position, str(clone)) == (error.detail, error.position, str(error))
    assert error.copy().position == 1


def test_stream_update_rules() -> None:
    """Table 31.1 and the TOAST copy, on hand-made messages."""
    rel = Relation(None, 9, "public", "u", "f", (Column(1, "k", 23, -1), Column(1, "b", 25, -1)))
    stream = StreamFilter(FilterSet.from_config({"public.u": "k > 10 AND b IS NOT NULL"}))
    assert stream.apply(rel) is rel

    def update(old: tuple[object, ...] | None, new: tuple[object, ...]) -> Update:
        return Update(None, 9, None if old is None else "O", old, new)  # type: ignore[arg-type]

    assert stream.apply(update(("1", "x"), ("2", "x"))) is None
    assert stream.apply(update(("1", "x"), ("20", UNCHANGED_TOAST))) == Insert(None, 9, ("20", "x"))
    assert stream.apply(update(("20", "x"), ("2", "x"))) == Delete(None, 9, "O", ("20", "x"))
    both = update(("20", "x"), ("30", UNCHANGED_TOAST))
    assert stream.apply(both) is both
    assert stream.apply(update(None, ("30", "y"))) is not None
    assert stream.apply(update(None, ("3", "y"))) is None
    assert stream.apply(Delete(None, 9, "O", ("3", "y"))) is None
    assert stream.apply(Insert(None, 9, ("30", None))) is None


def test_replica_identity_is_enforced_for_updates_only() -> None:
    rel = Relation(None, 3, "public", "r", "d", (Column(1, "k", 23, -1), Column(0, "x", 23, -1)))
    stream = StreamFilter(FilterSet.from_config({"public.r": "x = 1"}))
    stream.apply(rel)
    assert stream.apply(Insert(None, 3, ("1", "1"))) is not None
    with pytest.raises(ReplicaIdentityError):
        stream.apply(Update(None, 3, None, None, ("1", "2")))


def test_actions_not_published_are_dropped() -> None:
    rel = Relation(None, 4, "public", "a", "f", (Column(1, "k", 23, -1),))
    stream = StreamFilter(FilterSet.from_config({"public.a": "k > 0"}, actions=["insert"]))
    stream.apply(rel)
    assert stream.apply(Insert(None, 4, ("1",))) is not None
    assert stream.apply(Delete(None, 4, "O", ("1",))) is None
