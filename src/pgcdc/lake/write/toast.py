"""Unchanged TOAST values no change of the batch carried: take them from the lake, in Spark.

The MERGE sources of the mirror and the history carry, per row, ``__pgcdc_keep_<i>`` (column
``i``'s value is unknown in the batch) and ``__pgcdc_root_<j>`` (the key of the row, as stored
before the batch, that has it: the row's own key, or for a row whose key changed in the batch
the key it had before). ``fill_from_stored`` joins those rows with the mirror as it was before
the batch (reading only the stored rows of the roots the batch needs, and their kept columns)
and fills the values in. The mirror's own MERGE keeps a stored value where the root is the
row's own key (``CASE WHEN keep THEN target``), so it asks only for the other rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgcdc.lake.write.changes import quote_column

__all__ = ["KEEP_PREFIX", "ROOT_PREFIX", "fill_from_stored", "keep_flag", "root_column"]

KEEP_PREFIX = "__pgcdc_keep_"
ROOT_PREFIX = "__pgcdc_root_"


def keep_flag(index: int) -> str:
    return f"{KEEP_PREFIX}{index}"


def root_column(index: int) -> str:
    return f"{ROOT_PREFIX}{index}"


def fill_from_stored(
    rows: Any,
    stored: Any | None,
    keys: Sequence[str],
    columns: Sequence[str],
    *,
    foreign_only: bool,
) -> Any:
    """``rows`` (a Spark DataFrame) with unknown values filled from ``stored`` (the mirror as
    stored before the batch; None: no table yet) at their root keys, and their flags cleared.

    ``foreign_only``: fill only the rows whose root differs from their own key."""
    from pyspark.sql import functions as F

    flags = [(i, n) for i, n in enumerate(columns) if keep_flag(i) in rows.columns]
    roots = [root_column(j) for j in range(len(keys))]
    if not flags or stored is None or any(r not in rows.columns for r in roots):
        return rows
    available = set(stored.columns)
    flags = [(i, n) for i, n in flags if n in available]
    if not flags:
        return rows
    wanted: Any = None
    for i, _ in flags:
        flag = F.coalesce(F.col(keep_flag(i)), F.lit(False))
        wanted = flag if wanted is None else wanted | flag
    if foreign_only:
        differs: Any = None
        for r, k in zip(roots, keys, strict=True):
            d = ~F.col(r).eqNullSafe(F.col(quote_column(k)))
            differs = d if differs is None else differs | d
        wanted = wanted & differs
    needed = rows.where(wanted).select(
        *[F.col(r).alias(f"__pgcdc_need{j}") for j, r in enumerate(roots)]
    )
    # the stored rows of the roots the batch needs: the batch's roots are few, so they are
    # broadcast and the stored table is read once, only its keys and the kept columns
    found = stored.select(
        *[F.col(quote_column(k)).alias(f"__pgcdc_skey{j}") for j, k in enumerate(keys)],
        *[F.col(quote_column(n)).alias(f"__pgcdc_sval{i}") for i, n in flags],
        F.lit(True).alias("__pgcdc_found"),
    )
    match: Any = None
    for j in range(len(keys)):
        cond = F.col(f"__pgcdc_skey{j}") == F.col(f"__pgcdc_need{j}")
        match = cond if match is None else match & cond
    found = found.join(F.broadcast(needed.distinct()), match, "left_semi")
    on: Any = None
    for j, r in enumerate(roots):
        cond = F.col(r) == F.col(f"__pgcdc_skey{j}")
        on = cond if on is None else on & cond
    joined = rows.join(found, on & wanted, "left")
    take = F.col("__pgcdc_found").isNotNull()
    out = []
    filled = {i for i, _ in flags}
    names = {n: i for i, n in flags}
    for c in rows.columns:
        if c in names:
            i = names[c]
            flag = F.coalesce(F.col(keep_flag(i)), F.lit(False))
            out.append(
                F.when(take & flag, F.col(f"__pgcdc_sval{i}"))
                .otherwise(F.col(quote_column(c)))
                .alias(c)
            )
        elif c.startswith(KEEP_PREFIX) and int(c[len(KEEP_PREFIX) :]) in filled:
            out.append((F.col(c) & ~take).alias(c))
        else:
            out.append(F.col(quote_column(c)))
    return joined.select(*out)
