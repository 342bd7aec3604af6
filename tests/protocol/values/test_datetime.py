"""Dates, times, timestamps and intervals against the server, in UTC and other time zones."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta, timezone

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from pgcdc.protocol.values import (
    INFINITY,
    NEG_INFINITY,
    ConversionError,
    Interval,
    PgDate,
    PgTime,
    PgTimestamp,
    oids,
    pg_text,
    python_value,
    to_arrow,
)
from pgcdc.protocol.values.datetime import (
    days_to_ymd,
    interval_text,
    timestamp_text,
    ymd_to_days,
)
from tests.fix_pg import PgDatabase
from tests.protocol.values.checks import check_samples
from tests.protocol.values.sampling import raw_column, sample, set_timezone

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
PG_MIN_MICROS = -2451545 * 86_400_000_000  # 4714-11-24 00:00 BC
PG_MAX_MICROS = 106751982 * 86_400_000_000 + 86_399_999_999  # 294276-12-31 23:59:59.999999
ZONES = ["UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]


def micros(  # noqa: PLR0917 - reads like a date literal
    year: int, month: int, day: int, h: int = 0, m: int = 0, s: int = 0, us: int = 0
) -> int:
    seconds = ymd_to_days(year, month, day) * 86400 + h * 3600 + m * 60 + s
    return seconds * 1_000_000 + us


DATE_CASES = [
    ("2024-01-02", date(2024, 1, 2)),
    ("2000-02-29", date(2000, 2, 29)),
    ("1999-12-31", date(1999, 12, 31)),
    ("0001-01-01", date(1, 1, 1)),
    ("9999-12-31", date(9999, 12, 31)),
    ("0001-12-31 BC", PgDate(ymd_to_days(0, 12, 31))),
    ("0044-03-15 BC", PgDate(ymd_to_days(-43, 3, 15))),
    ("4714-11-24 BC", PgDate(-2451545)),
    ("10000-01-01", PgDate(ymd_to_days(10000, 1, 1))),
    ("5874897-12-31", PgDate(ymd_to_days(5874897, 12, 31))),
    ("infinity", INFINITY),
    ("-infinity", NEG_INFINITY),
    (None, None),
]


def test_date(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        got = check_samples(conn, "date", DATE_CASES, expected_arrow=pa.date32())
    days = to_arrow(got.binary, got.oid).cast(pa.int32()).to_pylist()
    unix = date(1970, 1, 1)
    assert days[0] == (date(2024, 1, 2) - unix).days
    assert days[6] == ymd_to_days(-43, 3, 15) + 10957  # BC dates are exact in Arrow too
    assert days[-3:] == [INT32_MAX, INT32_MIN, None]  # ±infinity: the int32 extremes


def test_calendar_round_trip() -> None:
    for days in (-2451545, -746117, -1, 0, 1, 2_932_896, 2145031948, 10**7):
        assert ymd_to_days(*days_to_ymd(days)) == days
    assert days_to_ymd(0) == (2000, 1, 1)
    assert days_to_ymd(-2451545) == (-4713, 11, 24)  # 4714 BC in astronomical years


TIMESTAMP_CASES = [
    ("2024-01-02 03:04:05.123456", datetime(2024, 1, 2, 3, 4, 5, 123456)),
    ("2024-01-02 03:04:05", datetime(2024, 1, 2, 3, 4, 5)),
    ("2000-01-01 00:00:00.5", datetime(2000, 1, 1, 0, 0, 0, 500000)),
    ("0001-01-01 00:00:00", datetime(1, 1, 1)),
    ("9999-12-31 23:59:59.999999", datetime(9999, 12, 31, 23, 59, 59, 999999)),
    ("0044-03-15 12:00:00.25 BC", PgTimestamp(micros(-43, 3, 15, 12, 0, 0, 250000))),
    ("4714-11-24 00:00:00 BC", PgTimestamp(PG_MIN_MICROS)),
    ("10000-01-01 00:00:00", PgTimestamp(micros(10000, 1, 1))),
    ("294246-12-31 23:59:59.999999", PgTimestamp(micros(294246, 12, 31, 23, 59, 59, 999999))),
    ("infinity", INFINITY),
    ("-infinity", NEG_INFINITY),
    (None, None),
]


def test_timestamp(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        got = check_samples(conn, "timestamp", TIMESTAMP_CASES, expected_arrow=pa.timestamp("us"))
    stored = to_arrow(got.text, got.oid).cast(pa.int64()).to_pylist()
    assert stored[0] == (datetime(2024, 1, 2, 3, 4, 5, 123456) - datetime(1970, 1, 1)) // timedelta(
        microseconds=1
    )
    assert stored[-3:] == [INT64_MAX, INT64_MIN, None]


def test_timestamp_after_year_294246_does_not_fit_arrow(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        got = sample(conn, "timestamptz", ["294276-12-31 23:59:59.999999+00", None])
    assert python_value(got.binary[0], got.oid) == PgTimestamp(PG_MAX_MICROS, utc=True)
    assert python_value(got.text[0], got.oid) == PgTimestamp(PG_MAX_MICROS, utc=True)
    for values in (got.text, got.binary):
        with pytest.raises(ConversionError, match=r"after year 294246.*timestamp\('us'\)"):
            to_arrow(values, got.oid)


TIMESTAMPTZ_INPUTS = [
    ("2024-01-02 03:04:05.123456+00", datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
    ("2024-03-10 06:59:59+00", datetime(2024, 3, 10, 6, 59, 59, tzinfo=UTC)),
    ("2024-03-10 07:00:00+00", datetime(2024, 3, 10, 7, 0, 0, tzinfo=UTC)),
    ("2024-11-03 05:30:00.000001+00", datetime(2024, 11, 3, 5, 30, 0, 1, tzinfo=UTC)),
    ("1800-01-01 00:00:00+00", datetime(1800, 1, 1, tzinfo=UTC)),
    ("1883-11-18 17:00:00+00", datetime(1883, 11, 18, 17, 0, tzinfo=UTC)),
    ("0001-01-01 00:00:00+00", datetime(1, 1, 1, tzinfo=UTC)),
    ("0001-01-01 04:00:00+00", datetime(1, 1, 1, 4, tzinfo=UTC)),
    ("9999-12-31 23:59:59.999999+00", datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ("0044-03-15 12:00:00+00 BC", PgTimestamp(micros(-43, 3, 15, 12), utc=True)),
    ("4714-11-24 12:00:00+00 BC", PgTimestamp(PG_MIN_MICROS + 12 * 3600 * 10**6, utc=True)),
    ("20000-07-01 00:00:00+00", PgTimestamp(micros(20000, 7, 1), utc=True)),
    ("20000-01-01 00:00:00+00", PgTimestamp(micros(20000, 1, 1), utc=True)),
    ("infinity", INFINITY),
    ("-infinity", NEG_INFINITY),
    (None, None),
]


@pytest.mark.parametrize("zone", ZONES)
def test_timestamptz(pg: PgDatabase, zone: str) -> None:
    """The server prints in its session TimeZone; pg_text(timezone=...) must print the same."""
    with pg.connect() as conn:
        got = check_samples(
            conn,
            "timestamptz",
            TIMESTAMPTZ_INPUTS,
            expected_arrow=pa.timestamp("us", tz="UTC"),
            timezone=zone,
        )
    if zone == "America/New_York":
        assert got.text[0] == "2024-01-01 22:04:05.123456-05"
        assert got.text[4] == "1799-12-31 19:03:58-04:56:02"  # local mean time
    if zone == "UTC":
        assert got.text[0] == "2024-01-02 03:04:05.123456+00"
    # the same instants, whatever zone printed them
    stored = to_arrow(got.text, got.oid).cast(pa.int64()).to_pylist()
    assert stored[0] == (
        datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    ) // timedelta(microseconds=1)


def test_timestamptz_timezone_parameter_changes_output(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        got = sample(conn, "timestamptz", ["2024-07-01 12:00:00+00"])
    binary = got.binary[0]
    assert binary is not None
    assert pg_text(binary, got.oid) == "2024-07-01 12:00:00+00"
    assert pg_text(binary, got.oid, timezone="America/New_York") == "2024-07-01 08:00:00-04"
    assert pg_text(binary, got.oid, timezone="Asia/Kolkata") == "2024-07-01 17:30:00+05:30"
    with pytest.raises(ConversionError, match="unknown time zone 'Mars/Olympus'"):
        pg_text(binary, got.oid, timezone="Mars/Olympus")


TIME_CASES = [
    ("00:00:00", time(0, 0)),
    ("12:34:56.789", time(12, 34, 56, 789000)),
    ("23:59:59.999999", time(23, 59, 59, 999999)),
    (None, None),
]


def test_time(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        got = check_samples(conn, "time", TIME_CASES, expected_arrow=pa.time64("us"))
    assert to_arrow(got.binary, got.oid).cast(pa.int64()).to_pylist() == [
        0,
        45_296_789_000,
        86_399_999_999,
        None,
    ]


def test_time_2400(pg: PgDatabase) -> None:
    """24:00:00 is a PostgreSQL time but not a Python or Arrow one."""
    with pg.connect() as conn:
        got = sample(conn, "time", ["24:00:00", None])
    assert python_value(got.text[0], got.oid) == PgTime(86_400_000_000)
    assert python_value(got.binary[0], got.oid) == PgTime(86_400_000_000)
    assert pg_text(got.binary[0], got.oid) == "24:00:00"  # type: ignore[arg-type]
    for values in (got.text, got.binary):
        with pytest.raises(ConversionError, match="24:00:00 does not fit Arrow's time64"):
            to_arrow(values, got.oid)


def tz(seconds: int) -> timezone:
    return UTC if seconds == 0 else timezone(timedelta(seconds=seconds))


TIMETZ_CASES = [
    ("00:00:00+00", time(0, 0, tzinfo=UTC)),
    ("12:34:56.789-05", time(12, 34, 56, 789000, tzinfo=tz(-5 * 3600))),
    ("23:59:59.999999+15:59", time(23, 59, 59, 999999, tzinfo=tz(15 * 3600 + 59 * 60))),
    ("01:02:03+05:30:15", time(1, 2, 3, tzinfo=tz(5 * 3600 + 30 * 60 + 15))),
    ("24:00:00-15:59", PgTime(86_400_000_000, -(15 * 3600 + 59 * 60))),
    (None, None),
]


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_timetz(pg: PgDatabase, zone: str) -> None:
    """timetz keeps its own offset: the session time zone does not change its output."""
    with pg.connect() as conn:
        got = check_samples(conn, "timetz", TIMETZ_CASES, expected_arrow=pa.string(), timezone=zone)
    assert got.text[1] == "12:34:56.789-05"
    assert to_arrow(got.binary, got.oid).to_pylist() == got.text


def interval_cases(major: int) -> list[tuple[str | None, object]]:
    cases: list[tuple[str | None, object]] = [
        ("0", Interval(0, 0, 0)),
        ("1 year 2 mons 3 days 04:05:06.7", Interval(14, 3, 14_706_700_000)),
        ("-1 days -00:00:01", Interval(0, -1, -1_000_000)),
        ("1 day -1 hours", Interval(0, 1, -3_600_000_000)),
        ("-1 year +2 mons", Interval(-10, 0, 0)),
        ("1 mon -30 days", Interval(1, -30, 0)),
        ("-1 mons 1 day", Interval(-1, 1, 0)),
        ("00:00:00.000001", Interval(0, 0, 1)),
        ("-00:00:00.000001", Interval(0, 0, -1)),
        ("100 years", Interval(1200, 0, 0)),
        ("178956970 years 7 mons", Interval(INT32_MAX, 0, 0)),
        ("-178956970 years -8 mons", Interval(INT32_MIN, 0, 0)),
        ("2562047 hours 47 minutes 16.854775 seconds", Interval(0, 0, 9_223_372_036_854_775)),
        ("-2147483648 days", Interval(0, INT32_MIN, 0)),
        (None, None),
    ]
    if major >= 17:
        cases += [
            ("infinity", Interval(INT32_MAX, INT32_MAX, INT64_MAX)),
            ("-infinity", Interval(INT32_MIN, INT32_MIN, INT64_MIN)),
        ]
    return cases


def test_interval(pg: PgDatabase) -> None:
    cases = interval_cases(pg.major)
    with pg.connect() as conn:
        got = check_samples(conn, "interval", cases, expected_arrow=pa.month_day_nano_interval())
    values = to_arrow(got.binary, got.oid).to_pylist()
    assert values[1] == pa.MonthDayNano([14, 3, 14_706_700_000_000])
    assert values[14] is None
    if pg.major >= 17:
        assert values[15] == pa.MonthDayNano([INT32_MAX, INT32_MAX, INT64_MAX])
        assert Interval(INT32_MAX, INT32_MAX, INT64_MAX).is_infinite
        assert str(Interval(INT32_MIN, INT32_MIN, INT64_MIN)) == "-infinity"


def test_interval_beyond_arrow_nanoseconds(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        got = sample(conn, "interval", ["2562047788:00:54.775807", "-2562047788:00:54.775807"])
    assert [python_value(v, got.oid) for v in got.binary] == [
        Interval(0, 0, INT64_MAX),
        Interval(0, 0, INT64_MIN + 1),
    ]
    assert [pg_text(v, got.oid) for v in got.binary if v is not None] == got.text
    for values in (got.text, got.binary):
        with pytest.raises(ConversionError, match="month_day_nano_interval"):
            to_arrow(values, got.oid)


def test_markers_print_like_postgres() -> None:
    assert str(PgDate(ymd_to_days(-43, 3, 15))) == "0044-03-15 BC"
    assert str(PgTimestamp(micros(10000, 1, 1, 1, 2, 3, 40))) == "10000-01-01 01:02:03.00004"
    assert str(PgTimestamp(micros(-43, 3, 15), utc=True)) == "0044-03-15 00:00:00+00 BC"
    assert str(PgTime(86_400_000_000, 3600)) == "24:00:00+01"
    assert str(INFINITY) == "infinity" and repr(NEG_INFINITY) == "NEG_INFINITY"
    assert str(Interval(14, -3, -1)) == "1 year 2 mons -3 days -00:00:00.000001"


def test_bad_text_names_the_setting() -> None:
    with pytest.raises(ConversionError, match="DateStyle ISO"):
        python_value("01/02/2024", oids.DATE_OID)
    with pytest.raises(ConversionError, match="IntervalStyle postgres"):
        python_value("P1Y2M", oids.INTERVAL_OID)
    with pytest.raises(ConversionError, match="timestamp value must be 8 bytes"):
        python_value(b"\x00" * 4, oids.TIMESTAMP_OID)


HYPOTHESIS = settings(
    max_examples=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@HYPOTHESIS
@given(
    st.lists(st.integers(PG_MIN_MICROS, PG_MAX_MICROS), min_size=1, max_size=40),
    st.sampled_from(ZONES),
)
def test_random_timestamptz(pg: PgDatabase, instants: list[int], zone: str) -> None:
    """Our rendering of random instants, read by the server, comes back as the same instant,
    and the server prints them in ``zone`` exactly as pg_text does."""
    texts = [timestamp_text(m, 0) for m in instants]
    with pg.connect() as conn:
        set_timezone(conn, zone)
        oid, typmod, text, binary = raw_column(
            conn, sql.SQL("SELECT x::timestamptz FROM unnest(%s::text[]) AS x"), [texts]
        )
    for instant, t, b in zip(instants, text, binary, strict=True):
        assert t is not None and b is not None
        loaded = python_value(b, oid)
        expected = (
            datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=instant)
            if isinstance(loaded, datetime)
            else PgTimestamp(instant, utc=True)
        )
        assert loaded == expected
        assert pg_text(b, oid, typmod, timezone=zone) == t.decode()
        assert python_value(t.decode(), oid) == loaded


@HYPOTHESIS
@given(
    st.lists(
        st.tuples(
            st.integers(INT32_MIN, INT32_MAX),
            st.integers(INT32_MIN, INT32_MAX),
            st.integers(-(2**62), 2**62),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_random_intervals(pg: PgDatabase, parts: list[tuple[int, int, int]]) -> None:
    texts = [interval_text(*p) for p in parts]
    with pg.connect() as conn:
        oid, typmod, text, binary = raw_column(
            conn, sql.SQL("SELECT x::interval FROM unnest(%s::text[]) AS x"), [texts]
        )
    for p, ours, t, b in zip(parts, texts, text, binary, strict=True):
        assert t is not None and b is not None
        assert python_value(b, oid) == Interval(*p)
        assert t.decode() == ours
        assert pg_text(b, oid, typmod) == ours
        assert python_value(ours, oid) == Interval(*p)
