"""The checks every type's sample table goes through, against the live server's own output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pyarrow as pa

from pgcdc.protocol.values import TypeRegistry, arrow_type, pg_text, python_value, to_arrow
from tests.protocol.values.sampling import Sampled, assert_same, sample


def check_samples(
    conn: psycopg.Connection[Any],
    type_sql: str,
    cases: Sequence[tuple[str | None, object]],
    *,
    expected_arrow: pa.DataType | None = None,
    arrow_values: Sequence[object] | None = None,
    timezone: str = "UTC",
    registry: TypeRegistry | None = None,
    type_oid: int | None = None,
    ndims: int = 1,
) -> Sampled:
    """Store ``cases`` (input literal, expected Python value) in a column of ``type_sql``, then:

    - python_value of the text and of the binary form both equal the expected value;
    - pg_text of the binary form equals the server's text output (in ``timezone``);
    - to_arrow of the text and of the binary column are equal and of type arrow_type(...),
      which is ``expected_arrow`` when given, with values ``arrow_values`` when given.
    """
    got = sample(conn, type_sql, [literal for literal, _ in cases], timezone=timezone)
    oid = got.oid if type_oid is None else type_oid
    for i, ((literal, expected), text, binary) in enumerate(
        zip(cases, got.text, got.binary, strict=True)
    ):
        where = f"{type_sql} {literal!r}"
        assert_same(python_value(text, oid, registry), expected, where + " (text)")
        assert_same(python_value(binary, oid, registry), expected, where + " (binary)")
        if binary is not None:
            rendered = pg_text(binary, oid, got.typmod, registry, timezone=timezone)
            assert rendered == text, f"{where}: pg_text {rendered!r} != server {text!r} (#{i})"
    mapped = arrow_type(oid, got.typmod, registry, ndims)
    if expected_arrow is not None:
        assert mapped == expected_arrow, f"{type_sql}: mapped to {mapped}"
    from_text = to_arrow(got.text, oid, got.typmod, registry, ndims)
    from_binary = to_arrow(got.binary, oid, got.typmod, registry, ndims)
    assert from_text.type == mapped, f"{type_sql}: text column is {from_text.type}"
    assert from_binary.type == mapped, f"{type_sql}: binary column is {from_binary.type}"
    assert same_arrow(from_text, from_binary), (
        f"{type_sql}: text and binary Arrow columns differ:\n{from_text}\n{from_binary}"
    )
    from_text.validate(full=True)
    if arrow_values is not None:
        assert from_text.to_pylist() == list(arrow_values), f"{type_sql}: {from_text}"
    return got


def same_arrow(a: pa.Array, b: pa.Array) -> bool:
    """Equal Arrow arrays, NaN equal to NaN (``Array.equals`` says NaN != NaN)."""
    if a.equals(b):
        return True
    return bool(
        a.type == b.type
        and a.null_count == b.null_count
        and a.to_string(window=1_000_000, container_window=1_000_000)
        == b.to_string(window=1_000_000, container_window=1_000_000)
    )
