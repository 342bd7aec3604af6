"""Date and time values: date, time, timetz, timestamp, timestamptz and interval.

Python values: ``datetime.date``, ``datetime.time`` (timetz with a fixed-offset tzinfo),
``datetime.datetime`` (timestamptz aware, in UTC) and ``Interval(months, days, microseconds)``,
PostgreSQL's own lossless interval representation. Values Python's types cannot hold are never
clamped and never raise; they load as markers carrying the exact PostgreSQL value:

- ``INFINITY`` / ``NEG_INFINITY`` for the infinite dates and timestamps;
- ``PgDate(days)`` for dates before year 1 (BC) or after 9999, days since 2000-01-01;
- ``PgTimestamp(microseconds, utc)`` likewise for timestamps, microseconds since 2000-01-01;
- ``PgTime(microseconds, utc_offset)`` for the time 24:00:00.

Infinite intervals (PostgreSQL 17+) are ``Interval`` values holding PostgreSQL's representation
(all fields at their maximum, or minimum), ``Interval.is_infinite`` says so.

Arrow: date -> date32, time -> time64('us'), timestamp -> timestamp('us'), timestamptz ->
timestamp('us', tz='UTC'), interval -> month_day_nano_interval, timetz -> string. BC dates and
timestamps are exact (Arrow's proleptic Gregorian calendar, astronomical year numbering is the
same as PostgreSQL's). ±infinity is stored as the minimum/maximum of the storage type: int32 for
date32, int64 for timestamps, (int32, int32, int64) for intervals. Timestamps after year 294246
do not fit Arrow's int64 microseconds since 1970, the time 24:00:00 does not fit time64, and
intervals beyond about 292 years of hours do not fit int64 nanoseconds: these raise
ConversionError (map such a column to string instead).

Binary forms: date int32 days since 2000-01-01; time int64 microseconds since midnight; timetz
that plus an int32 zone in seconds west of UTC; timestamp/timestamptz int64 microseconds since
2000-01-01 00:00 (UTC); interval int64 microseconds, int32 days, int32 months. Text forms are
DateStyle ISO and IntervalStyle postgres (the server defaults, which the replication connection
must keep).
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from functools import lru_cache
from typing import Any, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, fixed_width_numpy, text_converter
from pgcdc.protocol.values.errors import ConversionError

__all__ = [
    "CONVERTERS",
    "INFINITY",
    "NEG_INFINITY",
    "DateValue",
    "Infinity",
    "Interval",
    "PgDate",
    "PgTime",
    "PgTimestamp",
    "TimeValue",
    "TimestampValue",
    "date_text",
    "days_to_ymd",
    "interval_text",
    "parse_date_days",
    "parse_interval",
    "parse_timestamp_micros",
    "time_text",
    "timestamp_text",
    "ymd_to_days",
]

USECS_PER_SEC = 1_000_000
USECS_PER_MINUTE = 60 * USECS_PER_SEC
USECS_PER_HOUR = 60 * USECS_PER_MINUTE
USECS_PER_DAY = 24 * USECS_PER_HOUR

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DATEVAL_NOBEGIN, DATEVAL_NOEND = INT32_MIN, INT32_MAX
DT_NOBEGIN, DT_NOEND = INT64_MIN, INT64_MAX

#: Days and microseconds from the Unix epoch (Arrow's) to the PostgreSQL epoch, 2000-01-01.
UNIX_TO_PG_DAYS = 10_957
UNIX_TO_PG_MICROS = UNIX_TO_PG_DAYS * USECS_PER_DAY

_EPOCH_ORDINAL = date(2000, 1, 1).toordinal()
_MAX_ORDINAL = date.max.toordinal()
_CYCLE_DAYS = 146_097  # days in 400 Gregorian years: the calendar repeats, weekdays included
_MIN_PY_DAYS = 1 - _EPOCH_ORDINAL
_MAX_PY_DAYS = _MAX_ORDINAL - _EPOCH_ORDINAL
_MIN_PY_MICROS = _MIN_PY_DAYS * USECS_PER_DAY
_MAX_PY_MICROS = (_MAX_PY_DAYS + 1) * USECS_PER_DAY - 1
_EPOCH_NAIVE = datetime(2000, 1, 1)
_EPOCH_UTC = datetime(2000, 1, 1, tzinfo=UTC)

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_TIMETZ = struct.Struct(">qi")
_INTERVAL = struct.Struct(">qii")


class Infinity(enum.Enum):
    """The infinite dates and timestamps: ``INFINITY`` and ``NEG_INFINITY``."""

    INFINITY = "infinity"
    NEG_INFINITY = "-infinity"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return self.name


#: PostgreSQL's 'infinity' date or timestamp.
INFINITY = Infinity.INFINITY
#: PostgreSQL's '-infinity' date or timestamp.
NEG_INFINITY = Infinity.NEG_INFINITY


@dataclass(frozen=True, slots=True)
class PgDate:
    """A date outside ``datetime.date``'s years 1-9999: ``days`` since 2000-01-01."""

    days: int

    def ymd(self) -> tuple[int, int, int]:
        """(year, month, day), the year astronomical: 1 BC is 0, 2 BC is -1."""
        return days_to_ymd(self.days)

    def __str__(self) -> str:
        return date_text(self.days)


@dataclass(frozen=True, slots=True)
class PgTimestamp:
    """A timestamp outside ``datetime``'s years 1-9999: ``microseconds`` since 2000-01-01 00:00
    (in UTC when ``utc``, the timestamptz case)."""

    microseconds: int
    utc: bool = False

    def __str__(self) -> str:
        return timestamp_text(self.microseconds, 0 if self.utc else None)


@dataclass(frozen=True, slots=True)
class PgTime:
    """The time of day 24:00:00, which ``datetime.time`` cannot hold.

    ``utc_offset`` is the timetz zone in seconds east of UTC (None for time).
    """

    microseconds: int
    utc_offset: int | None = None

    def __str__(self) -> str:
        text = time_text(self.microseconds)
        return text if self.utc_offset is None else text + _zone_text(self.utc_offset)


@dataclass(frozen=True, slots=True)
class Interval:
    """An interval as PostgreSQL stores it: months, days and microseconds, each signed and
    independent (1 month is not 30 days, 1 day is not 24 hours across DST changes)."""

    months: int = 0
    days: int = 0
    microseconds: int = 0

    @property
    def is_infinite(self) -> bool:
        """True for PostgreSQL 17's 'infinity' and '-infinity' intervals."""
        return (self.months, self.days, self.microseconds) in (
            (INT32_MAX, INT32_MAX, INT64_MAX),
            (INT32_MIN, INT32_MIN, INT64_MIN),
        )

    def __str__(self) -> str:
        return interval_text(self.months, self.days, self.microseconds)


DateValue: TypeAlias = date | PgDate | Infinity
TimestampValue: TypeAlias = datetime | PgTimestamp | Infinity
TimeValue: TypeAlias = time | PgTime

_INTERVAL_INFINITY = Interval(INT32_MAX, INT32_MAX, INT64_MAX)
_INTERVAL_NEG_INFINITY = Interval(INT32_MIN, INT32_MIN, INT64_MIN)


# -- calendar -------------------------------------------------------------------------------


def days_to_ymd(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` since 2000-01-01; astronomical years, any range."""
    ordinal = days + _EPOCH_ORDINAL
    shift = 0
    if not 1 <= ordinal <= _MAX_ORDINAL:
        cycles = (ordinal - 1) // _CYCLE_DAYS
        ordinal -= cycles * _CYCLE_DAYS
        shift = 400 * cycles
    d = date.fromordinal(ordinal)
    return d.year + shift, d.month, d.day


def ymd_to_days(year: int, month: int, day: int) -> int:
    """Days since 2000-01-01 of a proleptic Gregorian date (astronomical year, any range)."""
    cycles = (year - 1) // 400
    try:
        ordinal = date(year - 400 * cycles, month, day).toordinal()
    except ValueError:
        raise ConversionError("date/time value has an invalid month or day") from None
    return ordinal + cycles * _CYCLE_DAYS - _EPOCH_ORDINAL


def _tdiv(a: int, b: int) -> int:
    """C integer division: truncates toward zero."""
    q = abs(a) // b
    return q if a >= 0 else -q


# -- text output ----------------------------------------------------------------------------


def _seconds_text(seconds: int, micros: int) -> str:
    """AppendSeconds: two-digit seconds, then the fraction without trailing zeros."""
    if micros:
        return f"{seconds:02d}.{micros:06d}".rstrip("0")
    return f"{seconds:02d}"


def _zone_text(offset: int) -> str:
    """EncodeTimezone (ISO): ``+HH``, ``+HH:MM`` or ``+HH:MM:SS``; offset in seconds east."""
    sign = "+" if offset >= 0 else "-"
    minutes, seconds = divmod(abs(offset), 60)
    hours, minutes = divmod(minutes, 60)
    if seconds:
        return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
    if minutes:
        return f"{sign}{hours:02d}:{minutes:02d}"
    return f"{sign}{hours:02d}"


def _ymd_text(year: int, month: int, day: int) -> tuple[str, bool]:
    if year > 0:
        return f"{year:04d}-{month:02d}-{day:02d}", False
    return f"{1 - year:04d}-{month:02d}-{day:02d}", True


def date_text(days: int) -> str:
    """date_out (DateStyle ISO) of days since 2000-01-01: ``2024-01-02``, ``0044-03-15 BC``."""
    if days == DATEVAL_NOBEGIN:
        return "-infinity"
    if days == DATEVAL_NOEND:
        return "infinity"
    text, bc = _ymd_text(*days_to_ymd(days))
    return text + " BC" if bc else text


def time_text(micros: int) -> str:
    """time_out of microseconds since midnight: ``03:04:05.123``."""
    hours, rest = divmod(micros, USECS_PER_HOUR)
    minutes, rest = divmod(rest, USECS_PER_MINUTE)
    seconds, fraction = divmod(rest, USECS_PER_SEC)
    return f"{hours:02d}:{minutes:02d}:{_seconds_text(seconds, fraction)}"


def timestamp_text(micros: int, utc_offset: int | None) -> str:
    """timestamp_out / timestamptz_out (DateStyle ISO) of microseconds since 2000-01-01.

    ``utc_offset`` is None for timestamp; for timestamptz the offset (seconds east of UTC) of
    the session time zone at that instant, which is printed after the time.
    """
    if micros == DT_NOBEGIN:
        return "-infinity"
    if micros == DT_NOEND:
        return "infinity"
    local = micros + (utc_offset or 0) * USECS_PER_SEC
    days, rest = divmod(local, USECS_PER_DAY)
    text, bc = _ymd_text(*days_to_ymd(days))
    text = f"{text} {time_text(rest)}"
    if utc_offset is not None:
        text += _zone_text(utc_offset)
    return text + " BC" if bc else text


def interval_text(months: int, days: int, micros: int) -> str:
    """interval_out with IntervalStyle postgres: ``1 year 2 mons -3 days +04:05:06.7``."""
    if (months, days, micros) == (INT32_MAX, INT32_MAX, INT64_MAX):
        return "infinity"
    if (months, days, micros) == (INT32_MIN, INT32_MIN, INT64_MIN):
        return "-infinity"
    year = _tdiv(months, 12)
    mon = months - year * 12
    hour = _tdiv(micros, USECS_PER_HOUR)
    rest = micros - hour * USECS_PER_HOUR
    minute = _tdiv(rest, USECS_PER_MINUTE)
    rest -= minute * USECS_PER_MINUTE
    sec = _tdiv(rest, USECS_PER_SEC)
    usec = rest - sec * USECS_PER_SEC
    parts: list[str] = []
    is_before = False
    for value, unit in ((year, "year"), (mon, "mon"), (days, "day")):
        if value == 0:
            continue
        plus = "+" if is_before and value > 0 else ""
        parts.append(f"{plus}{value} {unit}{'' if value == 1 else 's'}")
        is_before = value < 0
    if not parts or hour or minute or sec or usec:
        minus = hour < 0 or minute < 0 or sec < 0 or usec < 0
        sign = "-" if minus else "+" if is_before else ""
        parts.append(
            f"{sign}{abs(hour):02d}:{abs(minute):02d}:{_seconds_text(abs(sec), abs(usec))}"
        )
    return " ".join(parts)


@lru_cache(maxsize=64)
def _zone(name: str) -> tzinfo | None:
    """The IANA zone for a TimeZone setting; None for UTC itself."""
    if name.upper() in ("UTC", "ETC/UTC", "Z", "ZULU", "UCT", "GMT", "ETC/GMT", "UNIVERSAL"):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConversionError(
            f"unknown time zone {name!r}: pass an IANA zone name such as 'UTC' or "
            "'America/New_York' (the session TimeZone whose output should be reproduced)"
        ) from None


_SAFE_LOW_DAYS = ymd_to_days(2, 1, 1)
_SAFE_HIGH_DAYS = ymd_to_days(9998, 12, 31)


def _utc_offset(micros: int, zone: tzinfo) -> int:
    """Seconds east of UTC of ``zone`` at an instant, for any PostgreSQL timestamp.

    Instants outside Python's years 1-9999 are moved by whole 400-year Gregorian cycles into
    years 2-401 (before any zone's first transition: local mean time, as PostgreSQL uses) or
    9599-9998 (after the last transition: the zone's recurring rule, which repeats with the
    calendar).
    """
    seconds = micros // USECS_PER_SEC
    days = seconds // 86_400
    if days < _SAFE_LOW_DAYS:
        seconds += -((days - _SAFE_LOW_DAYS) // _CYCLE_DAYS) * _CYCLE_DAYS * 86_400
    elif days > _SAFE_HIGH_DAYS:
        seconds -= ((days - _SAFE_HIGH_DAYS - 1) // _CYCLE_DAYS + 1) * _CYCLE_DAYS * 86_400
    instant = _EPOCH_UTC + timedelta(seconds=seconds)
    offset = instant.astimezone(zone).utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0


def timestamptz_text(micros: int, timezone_name: str) -> str:
    """timestamptz_out in session time zone ``timezone_name``."""
    if micros in (DT_NOBEGIN, DT_NOEND):
        return timestamp_text(micros, 0)
    zone = _zone(timezone_name)
    return timestamp_text(micros, 0 if zone is None else _utc_offset(micros, zone))


# -- text input -----------------------------------------------------------------------------

_DATE_RE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?")
_TIME_PART = r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
_ZONE_PART = r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)"
_TIMESTAMP_RE = re.compile(r"(\d{4,})-(\d\d)-(\d\d) " + _TIME_PART + _ZONE_PART + r"?( BC)?")
_TIME_RE = re.compile(_TIME_PART + _ZONE_PART + "?")


def _fraction(digits: str | None) -> int:
    return int(digits.ljust(6, "0")) if digits else 0


def _zone_seconds(sign: str | None, hh: str | None, mm: str | None, ss: str | None) -> int:
    if sign is None or hh is None:
        return 0
    seconds = int(hh) * 3600 + int(mm or 0) * 60 + int(ss or 0)
    return seconds if sign == "+" else -seconds


def _bad_text(type_name: str) -> ConversionError:
    return ConversionError(
        f"text {type_name} value is not in PostgreSQL's ISO output format: keep DateStyle ISO "
        "(and IntervalStyle postgres) on the replication connection"
    )


def parse_date_days(text: str) -> int:
    """date_in of date_out's ISO output: days since 2000-01-01 (±infinity as int32 min/max)."""
    if text == "infinity":
        return DATEVAL_NOEND
    if text == "-infinity":
        return DATEVAL_NOBEGIN
    m = _DATE_RE.fullmatch(text)
    if m is None:
        raise _bad_text("date")
    year = int(m[1])
    return ymd_to_days(1 - year if m[4] else year, int(m[2]), int(m[3]))


def parse_timestamp_micros(text: str, type_name: str = "timestamp") -> int:
    """Microseconds since 2000-01-01 (UTC if the text has a zone) of ISO timestamp output.

    ±infinity become int64 min/max, PostgreSQL's own representation.
    """
    if text == "infinity":
        return DT_NOEND
    if text == "-infinity":
        return DT_NOBEGIN
    m = _TIMESTAMP_RE.fullmatch(text)
    if m is None:
        raise _bad_text(type_name)
    year = int(m[1])
    days = ymd_to_days(1 - year if m[12] else year, int(m[2]), int(m[3]))
    seconds = int(m[4]) * 3600 + int(m[5]) * 60 + int(m[6])
    seconds -= _zone_seconds(m[8], m[9], m[10], m[11])
    return days * USECS_PER_DAY + seconds * USECS_PER_SEC + _fraction(m[7])


def _parse_time(text: str, type_name: str) -> tuple[int, int | None]:
    m = _TIME_RE.fullmatch(text)
    if m is None:
        raise _bad_text(type_name)
    micros = (int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])) * USECS_PER_SEC + _fraction(m[4])
    offset = None if m[5] is None else _zone_seconds(m[5], m[6], m[7], m[8])
    return micros, offset


_INTERVAL_UNITS = {"year": 12, "years": 12, "mon": 1, "mons": 1}
_INTERVAL_TIME_RE = re.compile(r"([+-]?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


def parse_interval(text: str) -> Interval:
    """interval_in of interval_out's postgres-style output (IntervalStyle postgres)."""
    if text == "infinity":
        return _INTERVAL_INFINITY
    if text == "-infinity":
        return _INTERVAL_NEG_INFINITY
    months = days = micros = 0
    tokens = text.split(" ")
    i = 0
    try:
        while i < len(tokens):
            token = tokens[i]
            if ":" in token:
                m = _INTERVAL_TIME_RE.fullmatch(token)
                if m is None or i != len(tokens) - 1:
                    raise ValueError
                seconds = int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4])
                micros = seconds * USECS_PER_SEC + _fraction(m[5])
                if m[1] == "-":
                    micros = -micros
                i += 1
                continue
            value, unit = int(token), tokens[i + 1]
            if unit in ("day", "days"):
                days += value
            else:
                months += value * _INTERVAL_UNITS[unit]
            i += 2
    except (ValueError, IndexError, KeyError):
        raise _bad_text("interval") from None
    return Interval(months, days, micros)


# -- Python values --------------------------------------------------------------------------


def date_value(days: int) -> DateValue:
    """The Python value of days since 2000-01-01."""
    if _MIN_PY_DAYS <= days <= _MAX_PY_DAYS:
        return date.fromordinal(days + _EPOCH_ORDINAL)
    if days == DATEVAL_NOEND:
        return INFINITY
    if days == DATEVAL_NOBEGIN:
        return NEG_INFINITY
    return PgDate(days)


def timestamp_value(micros: int, utc: bool) -> TimestampValue:
    """The Python value of microseconds since 2000-01-01 (aware UTC when ``utc``)."""
    if _MIN_PY_MICROS <= micros <= _MAX_PY_MICROS:
        return (_EPOCH_UTC if utc else _EPOCH_NAIVE) + timedelta(microseconds=micros)
    if micros == DT_NOEND:
        return INFINITY
    if micros == DT_NOBEGIN:
        return NEG_INFINITY
    return PgTimestamp(micros, utc)


def time_value(micros: int, utc_offset: int | None) -> TimeValue:
    """The Python value of microseconds since midnight (with a timetz zone, seconds east)."""
    if not 0 <= micros < USECS_PER_DAY:
        return PgTime(micros, utc_offset)
    hours, rest = divmod(micros, USECS_PER_HOUR)
    minutes, rest = divmod(rest, USECS_PER_MINUTE)
    seconds, fraction = divmod(rest, USECS_PER_SEC)
    zone = None if utc_offset is None else _fixed_zone(utc_offset)
    return time(hours, minutes, seconds, fraction, tzinfo=zone)


@lru_cache(maxsize=256)
def _fixed_zone(offset: int) -> timezone:
    return UTC if offset == 0 else timezone(timedelta(seconds=offset))


def _unpack(st: struct.Struct, data: bytes, type_name: str) -> tuple[Any, ...]:
    try:
        return st.unpack(data)
    except struct.error:
        raise ConversionError(
            f"binary {type_name} value must be {st.size} bytes, got {len(data)}"
        ) from None


def _date_from_text(text: str) -> DateValue:
    if len(text) == 10:
        try:
            return date.fromisoformat(text)
        except ValueError:
            pass
    return date_value(parse_date_days(text))


def _date_from_binary(data: bytes) -> DateValue:
    return date_value(_unpack(_INT32, data, "date")[0])


def _timestamp_from_text(text: str) -> TimestampValue:
    if text[4:5] == "-" and text[-1:] != "C":
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass
    return timestamp_value(parse_timestamp_micros(text), False)


def _timestamp_from_binary(data: bytes) -> TimestampValue:
    return timestamp_value(_unpack(_INT64, data, "timestamp")[0], False)


def _timestamptz_from_text(text: str) -> TimestampValue:
    if text[4:5] == "-" and text[-1:] != "C":
        try:
            value = datetime.fromisoformat(text)
            if value.tzinfo is not None:
                return value.astimezone(UTC)
        except (ValueError, OverflowError):
            pass
    return timestamp_value(parse_timestamp_micros(text, "timestamptz"), True)


def _timestamptz_from_binary(data: bytes) -> TimestampValue:
    return timestamp_value(_unpack(_INT64, data, "timestamptz")[0], True)


def _time_from_text(text: str) -> TimeValue:
    micros, _ = _parse_time(text, "time")
    return time_value(micros, None)


def _time_from_binary(data: bytes) -> TimeValue:
    return time_value(_unpack(_INT64, data, "time")[0], None)


def _timetz_from_text(text: str) -> TimeValue:
    micros, offset = _parse_time(text, "timetz")
    if offset is None:
        raise _bad_text("timetz")
    return time_value(micros, offset)


def _timetz_parts(data: bytes) -> tuple[int, int]:
    micros, zone_west = _unpack(_TIMETZ, data, "timetz")
    return micros, -zone_west


def _timetz_from_binary(data: bytes) -> TimeValue:
    return time_value(*_timetz_parts(data))


def _timetz_text(data: bytes) -> str:
    micros, offset = _timetz_parts(data)
    return time_text(micros) + _zone_text(offset)


def _interval_from_binary(data: bytes) -> Interval:
    micros, days, months = _unpack(_INTERVAL, data, "interval")
    return Interval(months, days, micros)


# -- Arrow ----------------------------------------------------------------------------------


def _python_fallback(
    values: list[str | None], parse: Any, arrow_type: Any, storage: Any
) -> pa.Array:
    ints = [None if v is None else parse(v) for v in values]
    return pa.array(ints, storage).view(arrow_type)


def _date_storage(days: int) -> int:
    if days in (DATEVAL_NOBEGIN, DATEVAL_NOEND):
        return days
    return days + UNIX_TO_PG_DAYS


def _timestamp_storage(micros: int, type_name: str = "timestamp") -> int:
    if micros in (DT_NOBEGIN, DT_NOEND):
        return micros
    if micros > INT64_MAX - UNIX_TO_PG_MICROS:
        raise _too_late(type_name)
    return micros + UNIX_TO_PG_MICROS


def _too_late(type_name: str) -> ConversionError:
    return ConversionError(
        f"{type_name} value after year 294246 does not fit Arrow's timestamp('us') (int64 "
        "microseconds since 1970); map the column to string to keep it"
    )


def _date_arrow_text(values: list[str | None], arrow_type: Any) -> pa.Array:
    try:
        return pc.cast(pa.array(values, pa.string()), arrow_type)
    except pa.ArrowInvalid:
        pass
    return _python_fallback(
        values, lambda v: _date_storage(parse_date_days(v)), arrow_type, pa.int32()
    )


def _date_arrow_binary(values: list[bytes | None], arrow_type: Any) -> pa.Array:
    days, mask = fixed_width_numpy(values, 4, ">i4", "date")
    wide = days.astype(np.int64)
    finite = (wide != DATEVAL_NOBEGIN) & (wide != DATEVAL_NOEND)
    wide[finite] += UNIX_TO_PG_DAYS
    return pa.array(wide.astype(np.int32), pa.int32(), mask=mask).view(arrow_type)


def _timestamp_arrow_text(type_name: str) -> Any:
    def convert(values: list[str | None], arrow_type: Any) -> pa.Array:
        try:
            return pc.cast(pa.array(values, pa.string()), arrow_type)
        except pa.ArrowInvalid:
            pass
        return _python_fallback(
            values,
            lambda v: _timestamp_storage(parse_timestamp_micros(v, type_name), type_name),
            arrow_type,
            pa.int64(),
        )

    return convert


def _timestamp_arrow_binary(type_name: str) -> Any:
    def convert(values: list[bytes | None], arrow_type: Any) -> pa.Array:
        micros, mask = fixed_width_numpy(values, 8, ">i8", type_name)
        finite = (micros != DT_NOBEGIN) & (micros != DT_NOEND)
        if mask is not None:
            finite &= ~mask
        if np.any(micros[finite] > INT64_MAX - UNIX_TO_PG_MICROS):
            raise _too_late(type_name)
        micros[finite] += UNIX_TO_PG_MICROS
        return pa.array(micros, pa.int64(), mask=mask).view(arrow_type)

    return convert


def _time_arrow_text(values: list[str | None], arrow_type: Any) -> pa.Array:
    strings = pa.array(values, pa.string())
    try:
        stamped = pc.binary_join_element_wise("1970-01-01 ", strings, "")
        micros = pc.cast(pc.cast(stamped, pa.timestamp("us")), pa.int64())
    except pa.ArrowInvalid:
        micros = pa.array([None if v is None else _parse_time(v, "time")[0] for v in values])
    return _checked_time(micros.to_numpy(zero_copy_only=False), micros, arrow_type)


def _time_arrow_binary(values: list[bytes | None], arrow_type: Any) -> pa.Array:
    micros, mask = fixed_width_numpy(values, 8, ">i8", "time")
    array = pa.array(micros, pa.int64(), mask=mask)
    return _checked_time(micros, array, arrow_type)


def _checked_time(raw: np.ndarray[Any, Any], micros: pa.Array, arrow_type: Any) -> pa.Array:
    if micros.null_count:
        raw = micros.fill_null(0).to_numpy()
    if raw.size and (raw.max() >= USECS_PER_DAY or raw.min() < 0):
        raise ConversionError(
            "time value 24:00:00 does not fit Arrow's time64 (times of day below 24:00); map "
            "the column to string to keep it"
        )
    return micros.cast(pa.int64()).view(arrow_type)


_MDN_DTYPE = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanos", "<i8")])
_PG_INTERVAL_DTYPE = np.dtype([("micros", ">i8"), ("days", ">i4"), ("months", ">i4")])
_MAX_NANO_MICROS = INT64_MAX // 1000


def _interval_array(
    months: np.ndarray[Any, Any],
    days: np.ndarray[Any, Any],
    micros: np.ndarray[Any, Any],
    mask: np.ndarray[Any, Any] | None,
    arrow_type: Any,
) -> pa.Array:
    n = len(micros)
    inf = (months == INT32_MAX) & (days == INT32_MAX) & (micros == INT64_MAX)
    ninf = (months == INT32_MIN) & (days == INT32_MIN) & (micros == INT64_MIN)
    finite = ~(inf | ninf)
    if mask is not None:
        finite &= ~mask
    if np.any(np.abs(micros[finite]) > _MAX_NANO_MICROS):
        raise ConversionError(
            "interval value with more than about 292 years of hours does not fit Arrow's "
            "month_day_nano_interval (int64 nanoseconds); map the column to string to keep it"
        )
    out = np.zeros(n, dtype=_MDN_DTYPE)
    out["months"] = months
    out["days"] = days
    nanos = micros.astype(np.int64)
    nanos[finite] *= 1000
    out["nanos"] = nanos
    validity = None
    nulls = 0
    if mask is not None:
        nulls = int(mask.sum())
        validity = pa.py_buffer(np.packbits(~mask, bitorder="little").tobytes())
    return pa.Array.from_buffers(
        arrow_type, n, [validity, pa.py_buffer(out.tobytes())], null_count=nulls
    )


def _interval_arrow_text(values: list[str | None], arrow_type: Any) -> pa.Array:
    n = len(values)
    months = np.zeros(n, np.int64)
    days = np.zeros(n, np.int64)
    micros = np.zeros(n, np.int64)
    mask = np.zeros(n, np.bool_)
    for i, v in enumerate(values):
        if v is None:
            mask[i] = True
        else:
            iv = parse_interval(v)
            months[i], days[i], micros[i] = iv.months, iv.days, iv.microseconds
    return _interval_array(
        months.astype(np.int32),
        days.astype(np.int32),
        micros,
        mask if mask.any() else None,
        arrow_type,
    )


def _interval_arrow_binary(values: list[bytes | None], arrow_type: Any) -> pa.Array:
    n = len(values)
    mask = None
    filled: list[bytes | None] = values
    if None in values:
        filled = [bytes(16) if v is None else v for v in values]
        mask = np.fromiter((v is None for v in values), dtype=np.bool_, count=n)
    if n and set(map(len, filled)) != {16}:  # type: ignore[arg-type]
        raise ConversionError("binary interval values must be 16 bytes long")
    raw = np.frombuffer(b"".join(filled), dtype=_PG_INTERVAL_DTYPE)  # type: ignore[arg-type]
    return _interval_array(
        raw["months"].astype(np.int32),
        raw["days"].astype(np.int32),
        raw["micros"].astype(np.int64),
        mask,
        arrow_type,
    )


def _fixed_type(arrow: Any) -> Any:
    def arrow_type(typmod: int) -> Any:
        return arrow

    return arrow_type


def _render_with(fn: Any) -> Any:
    def render(data: bytes, timezone: str) -> str:
        result: str = fn(data)
        return result

    return render


def _timestamptz_render(data: bytes, timezone: str) -> str:
    return timestamptz_text(_unpack(_INT64, data, "timestamptz")[0], timezone)


CONVERTERS: dict[int, Converter] = {
    oids.DATE_OID: Converter(
        "date",
        _date_from_text,
        _date_from_binary,
        _render_with(lambda d: date_text(_unpack(_INT32, d, "date")[0])),
        _fixed_type(pa.date32()),
        _date_arrow_text,
        _date_arrow_binary,
    ),
    oids.TIME_OID: Converter(
        "time",
        _time_from_text,
        _time_from_binary,
        _render_with(lambda d: time_text(_unpack(_INT64, d, "time")[0])),
        _fixed_type(pa.time64("us")),
        _time_arrow_text,
        _time_arrow_binary,
    ),
    oids.TIMETZ_OID: text_converter("timetz", _timetz_text, _timetz_from_text, _timetz_from_binary),
    oids.TIMESTAMP_OID: Converter(
        "timestamp",
        _timestamp_from_text,
        _timestamp_from_binary,
        _render_with(lambda d: timestamp_text(_unpack(_INT64, d, "timestamp")[0], None)),
        _fixed_type(pa.timestamp("us")),
        _timestamp_arrow_text("timestamp"),
        _timestamp_arrow_binary("timestamp"),
    ),
    oids.TIMESTAMPTZ_OID: Converter(
        "timestamptz",
        _timestamptz_from_text,
        _timestamptz_from_binary,
        _timestamptz_render,
        _fixed_type(pa.timestamp("us", tz="UTC")),
        _timestamp_arrow_text("timestamptz"),
        _timestamp_arrow_binary("timestamptz"),
    ),
    oids.INTERVAL_OID: Converter(
        "interval",
        parse_interval,
        _interval_from_binary,
        _render_with(lambda d: str(_interval_from_binary(d))),
        _fixed_type(pa.month_day_nano_interval()),
        _interval_arrow_text,
        _interval_arrow_binary,
    ),
}
