"""Sizes as users write them, in ``pipeline.toml`` and in the Spark source's options: one rule.

A size is a number of bytes (``1073741824``) or a number and a unit: ``512MB``, ``5GB``,
``1.5GiB``, ``64m``; the units are B, k/kB/KiB, m/MB/MiB, g/GB/GiB, t/TB/TiB in any case, all
1024-based, as PostgreSQL reads sizes.
"""

from __future__ import annotations

import re

__all__ = ["parse_size"]

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")
_UNITS = {
    **dict.fromkeys(("", "b"), 1),
    **dict.fromkeys(("k", "kb", "kib"), 1 << 10),
    **dict.fromkeys(("m", "mb", "mib"), 1 << 20),
    **dict.fromkeys(("g", "gb", "gib"), 1 << 30),
    **dict.fromkeys(("t", "tb", "tib"), 1 << 40),
}


def parse_size(text: str) -> int:
    """``"5GB"`` -> bytes; ValueError naming the forms a size takes."""
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: write bytes (1073741824) or a number and a unit, such as "
            "'512MB', '5GB' or '64m' (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB; 1024-based)"
        )
    return int(float(match.group(1)) * _UNITS[unit])
