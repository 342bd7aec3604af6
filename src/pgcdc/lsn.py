"""The ``Lsn`` value type: a WAL position (XLogRecPtr) that prints the way PostgreSQL does.

An ``Lsn`` is an ``int`` (so arithmetic, comparison, hashing and JSON work unchanged) whose ``str``
is PostgreSQL's ``X/XXXXXXXX`` text form, and which parses that form back.
"""

from __future__ import annotations

from typing import Any

__all__ = ["INVALID_LSN", "Lsn"]

_MAX = (1 << 64) - 1


class Lsn(int):
    """A 64-bit WAL position. ``Lsn("16/B374D848") == 0x16B374D848``."""

    __slots__ = ()

    def __new__(cls, value: int | str | Lsn = 0) -> Lsn:
        if isinstance(value, str):
            return cls.parse(value)
        if not 0 <= value <= _MAX:
            raise ValueError(f"LSN out of range: {value} (must fit in 64 unsigned bits)")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse PostgreSQL's ``pg_lsn`` text form (``hi/lo``, both hexadecimal)."""
        hi, sep, lo = text.strip().partition("/")
        if not sep or not hi or not lo or len(hi) > 8 or len(lo) > 8:
            raise ValueError(f"invalid LSN {text!r}: expected the form 'X/XXXXXXXX' (hexadecimal)")
        try:
            return super().__new__(cls, (int(hi, 16) << 32) | int(lo, 16))
        except ValueError:
            raise ValueError(
                f"invalid LSN {text!r}: expected the form 'X/XXXXXXXX' (hexadecimal)"
            ) from None

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else int.__format__(int(self), spec)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Lsn, (int(self),))


INVALID_LSN = Lsn(0)
