"""Unchanged TOAST values no change of the batch carried: take them from the lake.

The MERGE sources of the mirror and the history carry, per row, ``__pgcdc_keep_<i>`` (column
``i``'s value is unknown in the batch) and ``__pgcdc_root_<j>`` (the key of the row, as stored
before the batch, that has it: the row's own key, or for a row whose key changed in the batch
the key it had before). ``fill_from_stored`` reads those stored rows with pyarrow and fills the
values in; the mirror leaves rows whose root is their own key to its MERGE (``CASE WHEN keep
THEN target``), which reads the stored row anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from pgcdc.lake.tables import IS_CURRENT, LakeTable
from pgcdc.lake.writer import DeltaTarget

__all__ = ["KEEP_PREFIX", "ROOT_PREFIX", "fill_from_stored", "keep_flag", "root_column"]

log = logging.getLogger("pgcdc.lake")

KEEP_PREFIX = "__pgcdc_keep_"
ROOT_PREFIX = "__pgcdc_root_"


def keep_flag(index: int) -> str:
    return f"{KEEP_PREFIX}{index}"


def root_column(index: int) -> str:
    return f"{ROOT_PREFIX}{index}"


def _any(columns: list[pa.ChunkedArray]) -> pa.ChunkedArray:
    result = pc.fill_null(columns[0], False)
    for column in columns[1:]:
        result = pc.or_(result, pc.fill_null(column, False))
    return result


def fill_from_stored(
    target: DeltaTarget,
    source: pa.Table,
    table: LakeTable,
    columns: Sequence[str],
    *,
    current_only: bool,
    foreign_only: bool,
) -> pa.Table:
    """``source`` with unknown values filled from the stored rows of their root keys.

    ``current_only``: the target is a history (read only current versions). ``foreign_only``:
    fill only rows whose root key differs from their own key (the mirror's MERGE does the
    rest). Filled flags are cleared; the flag and root columns stay.
    """
    flags = [(i, n) for i, n in enumerate(columns) if keep_flag(i) in source.column_names]
    roots = [root_column(j) for j in range(len(table.keys))]
    if not flags or any(r not in source.column_names for r in roots):
        return source
    wanted = _any([source.column(keep_flag(i)) for i, _ in flags])
    if foreign_only:
        differs = _any(
            [
                pc.invert(pc.fill_null(pc.equal(source.column(r), source.column(k)), False))
                for r, k in zip(roots, table.keys, strict=True)
            ]
        )
        wanted = pc.and_(wanted, differs)
    if not pc.any(wanted).as_py():
        return source
    stored: dict[tuple[Any, ...], dict[str, Any]] = {}
    if target.exists():
        need = source.filter(wanted)
        names = set((target.arrow_schema() or pa.schema([])).names)
        condition = pads.field(table.keys[0]).isin(need.column(roots[0]).unique())
        if current_only:
            condition = condition & (pads.field(IS_CURRENT) == True)  # noqa: E712
        read_columns = [*table.keys, *[n for _, n in flags if n in names]]
        for row in target.read(columns=read_columns, filter=condition).to_pylist():
            stored[tuple(row[k] for k in table.keys)] = row
    data = {name: source.column(name).to_pylist() for name in source.column_names}
    mask = wanted.to_pylist()
    unknown = 0
    for row, needed in enumerate(mask):
        if not needed:
            continue
        found = stored.get(tuple(data[r][row] for r in roots))
        for i, name in flags:
            if not data[keep_flag(i)][row]:
                continue
            if found is None or name not in found:
                unknown += 1
                continue
            data[name][row] = found[name]
            data[keep_flag(i)][row] = False
    if unknown:
        log.warning(
            "%s: %s unchanged TOAST value(s) have no stored row to take them from (left NULL)",
            table.table_id,
            unknown,
        )
    return pa.Table.from_arrays(
        [pa.array(data[n], type=source.schema.field(n).type) for n in source.column_names],
        schema=source.schema,
    )
