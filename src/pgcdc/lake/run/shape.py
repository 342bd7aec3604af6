"""What the lake follows a source table by, beyond its name, and the changes it cannot follow.

The lake's rows of a table are only right while the table is the one they were copied from,
keyed as they were keyed, and each column holds what it held: ``pgcdc run`` records each
table's shape (OID, key, multiset mode, columns by attnum with their types) when a query
starts, and compares it with the source's before every query start, restarts for schema
changes included. What it cannot follow stops the run with the fix (copy the table again)
before any batch is written:

* a table dropped and created again under its name (another OID): the lake keeps the old
  table's rows; renamed away or dropped: its changes would arrive under another name;
* another key or mode (a new primary key, the replica identity moved to another index, the
  key dropped so rows are mirrored copy by copy): the lake's rows and the stream's old keys
  no longer match, so deletes and updates would miss them;
* a key column renamed (its attnum under another name); another column renamed is followed
  in place (``renamed_columns``): Delta's column mapping renames the lake's column without
  rewriting a file, and the stream fills it from changes that still name it as before;
* a column put in or taken out of ``[[tables]] text_columns``: the lake holds its values as
  text or typed, and cannot switch;
* a column's type changed other than by widening its values unchanged (int2 -> int4 -> int8,
  float4 -> float8, varchar(n) -> varchar(m >= n) or text and back, numeric(p, s) ->
  numeric(q >= p, s), a timestamp's or time's precision raised): PostgreSQL rewrote every
  value by its own cast (rounding, padding, a ``USING`` expression), which the stream does not
  carry. A ``USING`` expression that keeps the type (``TYPE int USING c * 2``) leaves no trace
  in the catalog, and is not caught.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgcdc.lake.store.tables import LakeTable
from pgcdc.replication.source_catalog import TableShape

__all__ = ["recorded_shape", "renamed_columns", "shape_problem"]

_INT2, _INT4, _INT8, _FLOAT4, _FLOAT8 = 21, 23, 20, 700, 701
_TEXT, _VARCHAR, _NUMERIC = 25, 1043, 1700
#: types whose typmod is a precision that only limits (raising it leaves values as they are)
_PRECISION = frozenset({1114, 1184, 1083})  # timestamp, timestamptz, time
#: (text to varchar keeps every value too: a value too long for it fails the ALTER TABLE)
_WIDER = {
    _INT2: {_INT4, _INT8},
    _INT4: {_INT8},
    _FLOAT4: {_FLOAT8},
    _VARCHAR: {_TEXT},
    _TEXT: {_VARCHAR},
}


def recorded_shape(
    table: LakeTable, shape: TableShape, *, renamed: Sequence[Sequence[str]] = ()
) -> dict[str, Any]:
    """The JSON the state keeps for ``table`` (see ``PipelineState.shapes``). ``renamed``:
    the (former name, name) pairs of the columns renamed so far, oldest first (the stream's
    option ``renamedColumns``)."""
    return {
        "oid": shape.oid,
        "keys": list(table.keys),
        "multiset": table.multiset,
        "columns": {name: list(facts) for name, facts in shape.columns.items()},
        "text": sorted(table.text_columns),
        # the tables written while the query runs: a history or changelog turned off and on
        # again missed the changes in between (``bootstrap._late_kinds``)
        "kinds": list(table.kinds()),
        **({"renamed": [list(pair) for pair in renamed]} if renamed else {}),
    }


def _widened(old: tuple[int, int], new: tuple[int, int]) -> bool:
    (old_type, old_mod), (new_type, new_mod) = old, new
    if new_type in _WIDER.get(old_type, ()):
        return True
    if old_type != new_type:
        return False
    if new_mod == -1:  # the limit lifted
        return old_type in (_VARCHAR, _NUMERIC, *_PRECISION)
    if old_mod == -1:
        return False
    if old_type == _VARCHAR:
        return new_mod >= old_mod
    if old_type == _NUMERIC:  # ((precision << 16) | scale) + 4
        old_p, old_s = (old_mod - 4) >> 16, (old_mod - 4) & 0xFFFF
        new_p, new_s = (new_mod - 4) >> 16, (new_mod - 4) & 0xFFFF
        return new_s == old_s and new_p >= old_p
    if old_type in _PRECISION:
        return new_mod >= old_mod
    return False


def renamed_columns(
    table: LakeTable, before: dict[str, Any], now: TableShape | None
) -> dict[str, str]:
    """The columns of ``table`` renamed from its recorded shape to the source's now, as
    {former name: name}, that the lake follows in place: not key columns (the key index and
    the stream's old keys name them), nor in or out of ``text_columns``."""
    if now is None:
        return {}
    columns: dict[str, list[int]] = before.get("columns", {})
    by_number = {facts[0]: column for column, facts in now.columns.items()}
    was_text = set(before.get("text", ()))
    renamed = {}
    for column, facts in columns.items():
        name = by_number.get(facts[0])
        if (
            column not in now.columns
            and name is not None
            and name not in columns
            and column not in before.get("keys", ())
            and name not in table.keys
            and (column in was_text) == (name in table.text_columns)
        ):
            renamed[column] = name
    return renamed


def shape_problem(table: LakeTable, before: dict[str, Any], now: TableShape | None) -> str | None:
    """Why the lake cannot follow ``table`` from its recorded shape to the source's now; None
    when it can (columns added or dropped, types widened)."""
    name = table.table_id
    if now is None:
        return f"{name} was renamed or dropped in the source"
    # a baseline from an earlier state may hold column numbers only
    if before.get("oid", now.oid) != now.oid:
        return f"{name} was dropped and created again in the source (another table now)"
    if before.get("multiset", table.multiset) != table.multiset:
        return (
            f"{name} lost its key (it is now mirrored copy by copy)"
            if table.multiset
            else f"{name} gained a key ({', '.join(table.keys)})"
        )
    keys = before.get("keys")
    if not table.multiset and keys is not None and sorted(keys) != sorted(table.keys):
        return (
            f"the key of {name} changed from ({', '.join(keys)}) to "
            f"({', '.join(table.keys)}) (a new primary key, or the replica identity moved)"
        )
    columns: dict[str, list[int]] = before.get("columns", {})
    # the lake's column holds the typed values, or the text: it cannot switch (a column added
    # since, or one without a recorded type, is not judged)
    was_text = set(before.get("text", ()))
    for column, facts in columns.items():
        judged = len(facts) >= 3 and column in now.columns
        if judged and (column in was_text) != (column in table.text_columns):
            how = "as text now" if column in table.text_columns else "typed now, not as text"
            entry = table.config_key or "[[tables]]"
            return (
                f"column {column!r} of {name} is mirrored {how} ({entry}.text_columns "
                "changed), but the lake's rows hold it as before (restore text_columns to go on)"
            )
    by_number = {facts[0]: column for column, facts in now.columns.items()}
    followed = renamed_columns(table, before, now)
    for column, facts in columns.items():
        attnum = facts[0]
        current = now.columns.get(column)
        if column in followed:
            current = now.columns[followed[column]]
        elif current is None:
            renamed = by_number.get(attnum)
            if renamed is not None:
                return f"column {column!r} of {name} was renamed to {renamed!r}"
            continue  # dropped
        if current[0] != attnum:
            return f"column {column!r} of {name} was dropped and added again"
        if len(facts) < 3:
            continue
        type_oid, typmod = facts[1], facts[2]
        if (current[1], current[2]) != (type_oid, typmod) and not _widened(
            (type_oid, typmod), (current[1], current[2])
        ):
            return (
                f"column {column!r} of {name} changed type: PostgreSQL rewrote its values by "
                "its own cast, which the stream does not carry"
            )
    return None
