"""Values of the types row filters evaluate, in the representation the evaluator computes with.

- bool: ``bool``; smallint, integer, bigint: ``int``; real, double precision: ``float``
  (real values are exact float32 values); numeric: ``Decimal`` (see ``pgcdc.filters.numeric``);
- text, character varying, character, name: ``str`` (character values keep their padding);
- date: ``int`` days since 2000-01-01, timestamp and timestamptz: ``int`` microseconds since
  2000-01-01 00:00 (UTC for timestamptz): PostgreSQL's own representation, so the infinities
  are the same sentinels (INT32/INT64 minimum and maximum) and comparisons are integer ones.

Two directions in: ``input_value`` parses a literal the way the type's input function does
(``'2024-01-01'::date``), refusing forms whose meaning depends on the server's settings or the
current time; ``from_tuple_value`` takes a pgoutput column value (text or binary) through
``pgcdc.protocol.values.python_value`` and converts it.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal

from pgcdc.filters import numeric, pg_builtins
from pgcdc.filters.errors import FilterEvaluationError, UnsupportedFilterError
from pgcdc.protocol.values import (
    INFINITY,
    NEG_INFINITY,
    PgDate,
    PgTimestamp,
    TypeRegistry,
    python_value,
)

__all__ = [
    "DATEVAL_NOBEGIN",
    "DATEVAL_NOEND",
    "DT_NOBEGIN",
    "DT_NOEND",
    "SUPPORTED_TYPES",
    "date2j",
    "days_to_ymd",
    "from_tuple_value",
    "input_value",
    "to_float4",
]

DATEVAL_NOBEGIN = -(2**31)
DATEVAL_NOEND = 2**31 - 1
DT_NOBEGIN = -(2**63)
DT_NOEND = 2**63 - 1
POSTGRES_EPOCH_JDATE = 2451545
USECS_PER_DAY = 86_400_000_000
DATE_END_JULIAN = 2147483494  # 5874898-01-01
MIN_TIMESTAMP = -211813488000000000  # 4714-11-24 BC 00:00
END_TIMESTAMP = 9223371331200000000  # 294277-01-01 00:00

#: The types whose values the evaluator handles (columns and constants).
SUPPORTED_TYPES = frozenset(
    {
        pg_builtins.BOOL,
        pg_builtins.INT2,
        pg_builtins.INT4,
        pg_builtins.INT8,
        pg_builtins.NUMERIC,
        pg_builtins.FLOAT4,
        pg_builtins.FLOAT8,
        pg_builtins.TEXT,
        pg_builtins.VARCHAR,
        pg_builtins.BPCHAR,
        pg_builtins.NAME,
        pg_builtins.DATE,
        pg_builtins.TIMESTAMP,
        pg_builtins.TIMESTAMPTZ,
    }
)

INT_BITS = {pg_builtins.INT2: 16, pg_builtins.INT4: 32, pg_builtins.INT8: 64}
INT_NAMES = {pg_builtins.INT2: "smallint", pg_builtins.INT4: "integer", pg_builtins.INT8: "bigint"}

_FLOAT32 = struct.Struct("<f")


def _error(message: str, sqlstate: str = "22P02") -> FilterEvaluationError:
    return FilterEvaluationError(message, sqlstate=sqlstate)


def to_float4(value: float) -> float:
    """The nearest float32 value (overflow to infinity is the caller's check)."""
    if math.isnan(value) or math.isinf(value):
        return value
    try:
        return float(_FLOAT32.unpack(_FLOAT32.pack(value))[0])
    except OverflowError:
        return math.inf if value > 0 else -math.inf


# -- calendar --------------------------------------------------------------------------------


def date2j(year: int, month: int, day: int) -> int:
    """The Julian day number of an (astronomical) year, month, day: datetime.c's date2j."""
    if month > 2:
        month += 1
        year += 4800
    else:
        month += 13
        year += 4799
    century = year // 100
    julian = year * 365 - 32167
    julian += year // 4 - century + century // 4
    julian += 7834 * month // 256 + day
    return julian


def j2date(jd: int) -> tuple[int, int, int]:
    """datetime.c's j2date: (astronomical year, month, day) of a Julian day number."""
    julian = jd + 32044
    quad = julian // 146097
    extra = (julian - quad * 146097) * 4 + 3
    julian += 60 + quad * 3 + extra // 146097
    quad = julian // 1461
    julian -= quad * 1461
    y = julian * 4 // 1461
    julian = ((julian + 305) % 365 if y != 0 else (julian + 306) % 366) + 123
    y += quad * 4
    year = y - 4800
    quad = julian * 2141 // 65536
    day = julian - 7834 * quad // 256
    month = (quad + 10) % 12 + 1
    return year, month, day


def days_to_ymd(days: int) -> tuple[int, int, int]:
    return j2date(days + POSTGRES_EPOCH_JDATE)


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    return 30 if month in (4, 6, 9, 11) else 31


# -- literal input -----------------------------------------------------------------------------

_BOOL_WORDS = {"true": True, "false": False, "yes": True, "no": False}


def _bool_in(text: str) -> bool:
    s = text.strip(" \t\n\r\f\v").lower()
    if s in ("t", "y", "1"):
        return s != "0"
    if s in ("f", "n", "0"):
        return False
    if s.startswith("o") and len(s) >= 2:
        if "on".startswith(s):
            return True
        if "off".startswith(s):
            return False
    for word, value in _BOOL_WORDS.items():
        if s and word.startswith(s):
            return value
    raise _error(f'invalid input syntax for type boolean: "{text}"')


_INT_RE = re.compile(r"[ \t\n\r\f\v]*([+-]?)([0-9]+)[ \t\n\r\f\v]*\Z")


def _int_in(text: str, oid: int) -> int:
    name = INT_NAMES[oid]
    m = _INT_RE.match(text)
    if not m:
        if re.match(r"\s*[+-]?0[xXoObB]|.*\d_\d", text):
            raise UnsupportedFilterError(
                f'integer literal "{text}" uses a PostgreSQL 16+ form (non-decimal or '
                "underscores); write it in decimal",
                sqlstate="0A000",
            )
        raise _error(f'invalid input syntax for type {name}: "{text}"')
    value = int(m.group(1) + m.group(2))
    bits = INT_BITS[oid]
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise _error(f'value "{text}" is out of range for type {name}', "22003")
    return value


_FLOAT_RE = re.compile(
    r"[ \t\n\r\f\v]*([+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|inf|infinity|nan))[ \t\n\r\f\v]*\Z",
    re.IGNORECASE,
)


def _float_in(text: str, oid: int) -> float:
    name = "real" if oid == pg_builtins.FLOAT4 else "double precision"
    m = _FLOAT_RE.match(text)
    if not m:
        if re.match(r"\s*[+-]?0[xX]", text):
            raise UnsupportedFilterError(
                f'hexadecimal float input "{text}" is not supported in row filters',
                sqlstate="0A000",
            )
        raise _error(f'invalid input syntax for type {name}: "{text}"')
    body = m.group(1)
    value = float(body)
    lowered = body.lower().lstrip("+-")
    finite_text = lowered not in ("inf", "infinity", "nan")
    if finite_text:
        mantissa_nonzero = any(c in "123456789" for c in lowered.split("e")[0])
        if oid == pg_builtins.FLOAT4:
            value32 = to_float4(value)
            if math.isinf(value32) or (value32 == 0.0 and mantissa_nonzero):
                raise _error(f'"{text}" is out of range for type real', "22003")
            return value32
        if math.isinf(value) or (value == 0.0 and mantissa_nonzero):
            raise _error(f'"{text}" is out of range for type double precision', "22003")
    return to_float4(value) if oid == pg_builtins.FLOAT4 else value


_DATE_RE = re.compile(r"(\d{1,8})-(\d{1,2})-(\d{1,2})")
_TIME_RE = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?")
_ZONE_RE = re.compile(r"(?:([+-])(\d{1,2})(?::?(\d{2}))?(?::(\d{2}))?|Z|z|UTC|utc|GMT|gmt)")
_TIMESTAMP_RE = re.compile(
    r"(?P<date>\d{1,8}-\d{1,2}-\d{1,2})"
    r"(?:[ T](?P<time>\d{1,2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)"
    r"\s*(?P<zone>[+-]\d{1,2}(?::?\d{2})?(?::\d{2})?|Z|z|UTC|utc|GMT|gmt)?)?"
    r"(?P<bc>\s+BC|\s+bc)?"
)
_TIME_DEPENDENT = ("now", "today", "tomorrow", "yesterday", "allballs")


def _check_special(text: str, type_name: str) -> str | None:
    s = text.strip(" \t\n\r\f\v").lower()
    if s in ("infinity", "+infinity", "-infinity", "epoch"):
        return s.lstrip("+")
    if s in _TIME_DEPENDENT:
        raise UnsupportedFilterError(
            f"'{s}' in a {type_name} literal is resolved once, when the server parses the "
            "publication; write the value explicitly",
            sqlstate="0A000",
        )
    return None


def _ymd_days(text: str, year: int, month: int, day: int, *, bc: bool, type_name: str) -> int:
    if bc:
        if year == 0:
            raise _error(f'date/time field value out of range: "{text}"', "22008")
        year = 1 - year
    elif year == 0:
        raise _error(f'date/time field value out of range: "{text}"', "22008")
    if not 1 <= month <= 12 or not 1 <= day <= _days_in_month(year, month):
        raise _error(f'date/time field value out of range: "{text}"', "22008")
    julian = date2j(year, month, day)
    if not 0 <= julian < DATE_END_JULIAN:
        raise _error(f'{type_name} out of range: "{text}"', "22008")
    return julian - POSTGRES_EPOCH_JDATE


def _unsupported_format(text: str, type_name: str) -> UnsupportedFilterError:
    return UnsupportedFilterError(
        f'{type_name} literal "{text}" is not in a format client-side row filters read '
        "(YYYY-MM-DD[ HH:MM[:SS[.ffffff]]][+HH[:MM]], 'infinity', '-infinity', 'epoch')",
        sqlstate="0A000",
    )


def _date_in(text: str) -> int:
    special = _check_special(text, "date")
    if special == "infinity":
        return DATEVAL_NOEND
    if special == "-infinity":
        return DATEVAL_NOBEGIN
    if special == "epoch":
        return date2j(1970, 1, 1) - POSTGRES_EPOCH_JDATE
    s = text.strip(" \t\n\r\f\v")
    m = _TIMESTAMP_RE.fullmatch(s)
    if not m:
        raise _unsupported_format(text, "date")
    if m.group("time"):
        _time_micros(text, m.group("time"))
    dm = _DATE_RE.fullmatch(m.group("date"))
    assert dm is not None
    year, month, day = (int(g) for g in dm.groups())
    return _ymd_days(text, year, month, day, bc=bool(m.group("bc")), type_name="date")


def _time_micros(text: str, time_text: str) -> int:
    tm = _TIME_RE.fullmatch(time_text)
    assert tm is not None
    hour, minute = int(tm.group(1)), int(tm.group(2))
    second = int(tm.group(3) or 0)
    fraction = int((tm.group(4) or "").ljust(6, "0") or 0)
    if (
        hour > 24
        or minute > 59
        or second > 60
        or (hour == 24 and (minute or second or fraction))
        or (second == 60 and fraction)
    ):
        raise _error(f'date/time field value out of range: "{text}"', "22008")
    return ((hour * 60 + minute) * 60 + second) * 1_000_000 + fraction


def _timestamp_in(text: str, with_zone: bool) -> int:
    type_name = "timestamp with time zone" if with_zone else "timestamp"
    special = _check_special(text, type_name)
    if special == "infinity":
        return DT_NOEND
    if special == "-infinity":
        return DT_NOBEGIN
    if special == "epoch":
        return (date2j(1970, 1, 1) - POSTGRES_EPOCH_JDATE) * USECS_PER_DAY
    s = text.strip(" \t\n\r\f\v")
    m = _TIMESTAMP_RE.fullmatch(s)
    if not m:
        raise _unsupported_format(text, type_name)
    dm = _DATE_RE.fullmatch(m.group("date"))
    assert dm is not None
    year, month, day = (int(g) for g in dm.groups())
    days = _ymd_days(text, year, month, day, bc=bool(m.group("bc")), type_name="timestamp")
    micros = _time_micros(text, m.group("time")) if m.group("time") else 0
    result = days * USECS_PER_DAY + micros
    zone = m.group("zone")
    if zone and with_zone:
        zm = _ZONE_RE.fullmatch(zone)
        assert zm is not None
        if zm.group(1):
            offset = int(zm.group(2)) * 3600 + int(zm.group(3) or 0) * 60 + int(zm.group(4) or 0)
            if int(zm.group(2)) > 15:
                raise _error(f'time zone displacement out of range: "{text}"', "22009")
            result -= (offset if zm.group(1) == "+" else -offset) * 1_000_000
    if not MIN_TIMESTAMP <= result < END_TIMESTAMP:
        raise _error(f'timestamp out of range: "{text}"', "22008")
    return result


def input_value(oid: int, text: str) -> object:
    """The value of ``text`` read by type ``oid``'s input function (typmod applied later)."""
    if oid == pg_builtins.BOOL:
        return _bool_in(text)
    if oid in INT_BITS:
        return _int_in(text, oid)
    if oid == pg_builtins.NUMERIC:
        if re.match(r"\s*[+-]?0[xXoObB]|.*\d_\d", text):
            raise UnsupportedFilterError(
                f'numeric literal "{text}" uses a PostgreSQL 16+ form; write it in decimal',
                sqlstate="0A000",
            )
        return numeric.parse(text)
    if oid in (pg_builtins.FLOAT4, pg_builtins.FLOAT8):
        return _float_in(text, oid)
    if oid in (pg_builtins.TEXT, pg_builtins.VARCHAR, pg_builtins.BPCHAR):
        return text
    if oid == pg_builtins.NAME:
        raw = text.encode()
        return raw[:63].decode(errors="ignore") if len(raw) > 63 else text
    if oid == pg_builtins.DATE:
        return _date_in(text)
    if oid == pg_builtins.TIMESTAMP:
        return _timestamp_in(text, with_zone=False)
    if oid == pg_builtins.TIMESTAMPTZ:
        m = _TIMESTAMP_RE.fullmatch(text.strip(" \t\n\r\f\v"))
        if (m is None or not m.group("zone")) and _check_special(
            text, "timestamp with time zone"
        ) is None:
            raise UnsupportedFilterError(
                f'timestamp with time zone literal "{text}" has no UTC offset, so its '
                "value depends on the server's TimeZone setting; write the offset "
                "(+00, -05:30, ...)",
                sqlstate="0A000",
            )
        return _timestamp_in(text, with_zone=True)
    raise UnsupportedFilterError(
        f"constants of type {pg_builtins.format_type(oid)} are not supported in client-side row "
        "filters",
        sqlstate="0A000",
    )


# -- pgoutput values ---------------------------------------------------------------------------

_EPOCH_DATE = date(2000, 1, 1)
_EPOCH_NAIVE = datetime(2000, 1, 1)


def _date_value(value: object) -> int:
    if value is INFINITY:
        return DATEVAL_NOEND
    if value is NEG_INFINITY:
        return DATEVAL_NOBEGIN
    if isinstance(value, PgDate):
        return value.days
    assert isinstance(value, date)
    return (value - _EPOCH_DATE).days


def _timestamp_value(value: object) -> int:
    if value is INFINITY:
        return DT_NOEND
    if value is NEG_INFINITY:
        return DT_NOBEGIN
    if isinstance(value, PgTimestamp):
        return value.microseconds
    assert isinstance(value, datetime)
    naive = value.replace(tzinfo=None) if value.tzinfo is not None else value
    if value.tzinfo is not None:
        offset = value.utcoffset()
        if offset:
            naive -= offset
    delta = naive - _EPOCH_NAIVE
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _identity(value: object) -> object:
    return value


def _numeric_value(value: object) -> object:
    assert isinstance(value, Decimal)
    if value.is_nan() or value.is_infinite():
        return value
    return numeric.make(*numeric._parts(value))


_ADAPT: dict[int, Callable[[object], object]] = {
    pg_builtins.DATE: _date_value,
    pg_builtins.TIMESTAMP: _timestamp_value,
    pg_builtins.TIMESTAMPTZ: _timestamp_value,
    pg_builtins.NUMERIC: _numeric_value,
}


def from_tuple_value(value: str | bytes, oid: int, registry: TypeRegistry | None) -> object:
    """A pgoutput column value (text str or binary bytes) in the evaluator's representation."""
    converted = python_value(value, oid, registry)
    return _ADAPT.get(oid, _identity)(converted)
