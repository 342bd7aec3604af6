"""The exception raised when a column value cannot be converted as asked."""

from __future__ import annotations

from pgcdc.errors import PgcdcError

__all__ = ["ConversionError"]


class ConversionError(PgcdcError, ValueError):
    """A column value that cannot be converted to the requested Python or Arrow form.

    The message names the PostgreSQL type, the kind of value that failed (never the value itself:
    messages end up in logs, which carry no row data) and how to fix it.
    """
