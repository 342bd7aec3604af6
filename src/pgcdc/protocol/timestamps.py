"""PostgreSQL timestamps in messages: microseconds since 2000-01-01 00:00 UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = ["PG_EPOCH", "from_pg_micros", "to_pg_micros"]

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_UNIX_TO_PG_MICROS = 946_684_800_000_000
_ONE_MICRO = timedelta(microseconds=1)


def from_pg_micros(micros: int) -> datetime:
    """The UTC datetime ``micros`` microseconds after the PostgreSQL epoch.

    Raises OverflowError when outside Python's datetime range (years 1 to 9999).
    """
    return PG_EPOCH + timedelta(microseconds=micros)


def to_pg_micros(value: datetime) -> int:
    """Microseconds since the PostgreSQL epoch of an aware datetime."""
    if value.tzinfo is None:
        raise ValueError("message timestamps must be timezone-aware")
    return (value - PG_EPOCH) // _ONE_MICRO
