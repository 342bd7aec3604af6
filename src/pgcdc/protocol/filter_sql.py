"""``RowFilterSQL``: a row filter as SQL that pgcdc printed itself from its own parse tree.

The layers that put a row filter into SQL (``CREATE PUBLICATION ... WHERE (...)`` in
``pgcdc.replication``, the initial copy's ``COPY (SELECT ... WHERE ...)`` in ``pgcdc.spark``, the
lake's verification query) take this type, never a ``str``: text from a user, a configuration
file or the server's catalog becomes a ``RowFilterSQL`` only through ``pgcdc.filters`` (parse,
then print the tree back: exactly one expression, every identifier double-quoted, every constant
a literal). It lives in the lowest layer so that every layer can name it; only
``pgcdc.filters.sql`` builds one from text, which ``tests/filters/test_injection.py`` checks over
the whole source tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RowFilterSQL"]


@dataclass(frozen=True, slots=True)
class RowFilterSQL:
    """One SQL boolean expression printed by ``pgcdc.filters`` (``RowFilter.sql()``).

    ``text`` is self-delimited (a parenthesized compound, or one atom such as a quoted column),
    so it can stand as an operand anywhere an expression can.
    """

    text: str

    @classmethod
    def any_of(cls, parts: Sequence[RowFilterSQL]) -> RowFilterSQL:
        """The OR of ``parts`` (one part: itself), as PostgreSQL combines several publications'
        filters; safe because each part already is exactly one expression."""
        if not parts:
            raise ValueError("any_of needs at least one filter")
        for part in parts:
            if not isinstance(part, RowFilterSQL):
                raise TypeError(f"any_of combines RowFilterSQL values, not {type(part).__name__}")
        distinct = list(dict.fromkeys(parts))
        if len(distinct) == 1:
            return distinct[0]
        return cls("(" + " OR ".join(f"({p.text})" for p in distinct) + ")")

    def __str__(self) -> str:
        return self.text
