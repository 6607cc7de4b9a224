"""cron(): parsing, Debian field semantics, and exact slots (hand-written, in UTC)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import croniter as croniter_package
import pytest

from cronlock._errors import CronlockError, ScheduleError
from cronlock._schedules.cron import CronSchedule, cron
from cronlock._schedules.schedule import Schedule, bind_zone, upcoming


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


# (expression, after, the next slots) -- 2024-01-01 is a Monday, 2024 a leap year.
TABLE: list[tuple[str, datetime, list[datetime]]] = [
    ("0 3 * * *", utc(2024, 1, 1), [utc(2024, 1, 1, 3), utc(2024, 1, 2, 3)]),
    ("*/15 * * * *", utc(2024, 1, 1, 10, 7), [utc(2024, 1, 1, 10, 15), utc(2024, 1, 1, 10, 30)]),
    ("59 23 31 12 *", utc(2024, 6, 1), [utc(2024, 12, 31, 23, 59), utc(2025, 12, 31, 23, 59)]),
    # Debian: a day field starting with '*' ANDs the day fields -> Mondays on odd days.
    (
        "0 0 */2 * 1",
        utc(2024, 1, 1),
        [utc(2024, 1, 15), utc(2024, 1, 29), utc(2024, 2, 5), utc(2024, 2, 19), utc(2024, 3, 11)],
    ),
    # Neither starts with '*': OR -> every Monday and every 1st.
    ("0 0 1 * 1", utc(2024, 1, 22), [utc(2024, 1, 29), utc(2024, 2, 1), utc(2024, 2, 5)]),
    (
        "0 0 1-10/3 * *",
        utc(2024, 1, 1),
        [utc(2024, 1, 4), utc(2024, 1, 7), utc(2024, 1, 10), utc(2024, 2, 1)],
    ),
    ("0 0 * * 7", utc(2024, 1, 1), [utc(2024, 1, 7), utc(2024, 1, 14)]),  # 7 = Sunday
    (
        "0 0 * * 5-7",
        utc(2024, 1, 1),
        [utc(2024, 1, 5), utc(2024, 1, 6), utc(2024, 1, 7), utc(2024, 1, 12)],
    ),
    # 1-7/3 = 1,4,7 = Mon, Thu, Sun
    ("0 0 * * 1-7/3", utc(2024, 1, 1), [utc(2024, 1, 4), utc(2024, 1, 7), utc(2024, 1, 8)]),
    ("0 0 * * */3", utc(2024, 1, 1), [utc(2024, 1, 3), utc(2024, 1, 6), utc(2024, 1, 7)]),
    ("0 0 * * mon-FRI", utc(2024, 1, 5), [utc(2024, 1, 8), utc(2024, 1, 9)]),
    ("0 9 * jun,DEC sun", utc(2024, 1, 1), [utc(2024, 6, 2, 9), utc(2024, 6, 9, 9)]),
    # Equal ranges mean the one value (croniter reads them as the whole field).
    ("5-5 * * * *", utc(2024, 1, 1, 10, 7), [utc(2024, 1, 1, 11, 5), utc(2024, 1, 1, 12, 5)]),
    ("0 0 * * 7-7", utc(2024, 1, 1), [utc(2024, 1, 7), utc(2024, 1, 14)]),
    ("0 12 1 JAN-JAN *", utc(2024, 1, 1, 13), [utc(2025, 1, 1, 12), utc(2026, 1, 1, 12)]),
    ("0 0 29 2 *", utc(2024, 3, 1), [utc(2028, 2, 29), utc(2032, 2, 29)]),
    ("0 0 ? * 1", utc(2024, 1, 1), [utc(2024, 1, 8), utc(2024, 1, 15)]),
    ("@hourly", utc(2024, 1, 1, 10, 30), [utc(2024, 1, 1, 11), utc(2024, 1, 1, 12)]),
    ("@daily", utc(2024, 1, 1, 10), [utc(2024, 1, 2), utc(2024, 1, 3)]),
    ("@midnight", utc(2024, 1, 1, 10), [utc(2024, 1, 2)]),
    ("@weekly", utc(2024, 1, 1), [utc(2024, 1, 7), utc(2024, 1, 14)]),
    ("@monthly", utc(2024, 1, 1), [utc(2024, 2, 1), utc(2024, 3, 1)]),
    ("@yearly", utc(2024, 1, 1), [utc(2025, 1, 1)]),
    ("@ANNUALLY", utc(2024, 1, 1), [utc(2025, 1, 1)]),
    # croniter extensions
    ("0 0 L * *", utc(2024, 1, 31), [utc(2024, 2, 29), utc(2024, 3, 31), utc(2024, 4, 30)]),
    ("0 0 * * 5L", utc(2024, 1, 1), [utc(2024, 1, 26), utc(2024, 2, 23), utc(2024, 3, 29)]),
    ("0 0 * * 5#2", utc(2024, 1, 1), [utc(2024, 1, 12), utc(2024, 2, 9)]),
    ("0 0 15W * *", utc(2024, 6, 1), [utc(2024, 6, 14), utc(2024, 7, 15)]),  # 15 Jun: Sat
    (
        "* * * * *",
        utc(2024, 1, 1, 10, 0, 59) + timedelta(microseconds=999_999),
        [utc(2024, 1, 1, 10, 1), utc(2024, 1, 1, 10, 2)],
    ),
]


@pytest.mark.parametrize(("expr", "after", "expected"), TABLE)
def test_slots(expr: str, after: datetime, expected: list[datetime]) -> None:
    assert upcoming(cron(expr), after, len(expected)) == expected


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        (
            "30 */5 * * * *",
            utc(2024, 1, 1, 10),
            [utc(2024, 1, 1, 10, 0, 30), utc(2024, 1, 1, 10, 5, 30)],
        ),
        (
            "*/20 * * * * *",
            utc(2024, 1, 1, 10) + timedelta(milliseconds=500),
            [utc(2024, 1, 1, 10, 0, 20), utc(2024, 1, 1, 10, 0, 40), utc(2024, 1, 1, 10, 1)],
        ),
        ("15 0 3 * * *", utc(2024, 1, 1), [utc(2024, 1, 1, 3, 0, 15), utc(2024, 1, 2, 3, 0, 15)]),
        ("@daily", utc(2024, 1, 1, 10), [utc(2024, 1, 2)]),
    ],
)
def test_seconds_field_comes_first(expr: str, after: datetime, expected: list[datetime]) -> None:
    assert upcoming(cron(expr, seconds=True), after, len(expected)) == expected


def test_zone_and_result_type() -> None:
    berlin = cron("0 3 * * *", tz="Europe/Berlin")
    assert berlin.next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 2)  # CET = UTC+1
    assert berlin.next_after(utc(2024, 7, 1)) == utc(2024, 7, 1, 1)  # CEST = UTC+2
    # An aware input in another zone is fine; the answer is always UTC.
    ny_noon = datetime(2024, 7, 1, 12, tzinfo=ZoneInfo("America/New_York"))
    slot = berlin.next_after(ny_noon)
    assert slot == utc(2024, 7, 2, 1)
    assert slot is not None and slot.tzinfo is UTC


def test_strictly_after_a_slot() -> None:
    job = cron("0 3 * * *")
    assert job.next_after(utc(2024, 1, 1, 3)) == utc(2024, 1, 2, 3)
    assert job.next_after(utc(2024, 1, 1, 2, 59, 59, 999_999)) == utc(2024, 1, 1, 3)


def test_naive_after_is_rejected() -> None:
    with pytest.raises(ScheduleError, match="aware"):
        cron("0 3 * * *").next_after(datetime(2024, 1, 1))


def test_attributes_and_text() -> None:
    job = cron("0 3 * * *", tz="Europe/Berlin")
    assert job.expr == "0 3 * * *"
    assert job.seconds is False
    assert job.tz == ZoneInfo("Europe/Berlin")
    assert job.fixed_time is True
    assert repr(job) == "CronSchedule(expr='0 3 * * *', seconds=False, tz='Europe/Berlin')"
    assert str(job) == "cron '0 3 * * *' in Europe/Berlin"
    assert str(cron("0 0 3 * * *", seconds=True)) == "6-field cron '0 0 3 * * *'"
    assert isinstance(job, Schedule)
    assert job == cron("0 3 * * *", tz=ZoneInfo("Europe/Berlin"))
    assert hash(job) == hash(cron("0 3 * * *", tz="Europe/Berlin"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.expr = "* * * * *"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("expr", "fixed"),
    [
        ("0 3 * * *", True),
        ("0-59 3 * * *", True),  # Debian looks at the first character only
        ("30 2 */2 * *", True),
        ("0 * * * *", False),
        ("* 3 * * *", False),
        ("*/5 3 * * *", False),
        ("0 */2 * * *", False),
        ("@hourly", False),
        ("@daily", True),
        ("@weekly", True),
    ],
)
def test_fixed_time_follows_debian(expr: str, fixed: bool) -> None:
    assert cron(expr).fixed_time is fixed


def test_bind_zone_fills_in_the_scheduler_zone() -> None:
    job = cron("0 3 * * *")
    assert job.tz is None
    assert job.next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 3)  # unbound: UTC
    bound = bind_zone(job, ZoneInfo("Asia/Tokyo"))
    assert isinstance(bound, CronSchedule)
    assert bound.tz == ZoneInfo("Asia/Tokyo")
    assert bound.next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 18)  # 03:00 JST
    explicit = cron("0 3 * * *", tz="Europe/Berlin")
    assert bind_zone(explicit, ZoneInfo("Asia/Tokyo")) is explicit


def test_next_after_does_not_reparse(monkeypatch: pytest.MonkeyPatch) -> None:
    job = cron("7 4 * * *", tz="Europe/Berlin")

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("croniter constructed on the hot path")

    # _cron imports croniter when it parses (lazily): patch it where that import finds it.
    monkeypatch.setattr(croniter_package, "croniter", fail)
    assert job.next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 3, 7)
    # The same expression again comes from the parse cache.
    assert cron("7 4 * * *").next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 4, 7)


@pytest.mark.parametrize(
    ("expr", "seconds", "fragments"),
    [
        ("0 0 31 2 *", False, ["'0 0 31 2 *'", "never fires", "day 31 of February"]),
        ("0 0 30 2 *", False, ["never fires", "day 30 of February"]),
        ("0 0 30,31 2 */2", False, ["never fires", "days 30, 31 of February"]),
        ("0 0 31 4,6 *", False, ["never fires", "day 31 of April, June"]),
        ("* * * *", False, ["expected 5 fields", "got 4"]),
        ("0 0 * * * *", False, ["expected 5 fields", "seconds=True"]),
        ("0 0 * * *", True, ["expected 6 fields", "got 5"]),
        ("", False, ["expected 5 fields", "got 0"]),
        ("@reboot", False, ["@reboot", "once()"]),
        ("@fortnightly", False, ["unknown alias"]),
        ("0 24 * * *", False, ["hour field '24'", "out of range 0-23"]),
        ("60 * * * *", False, ["minute field '60'"]),
        ("0 0 0 * *", False, ["day-of-month field '0'"]),
        ("0 0 * 13 *", False, ["month field '13'"]),
        ("0 0 * * 8", False, ["day-of-week field '8'", "0-7"]),
        ("0 0 * * funday", False, ["day-of-week field 'funday'"]),
        ("5/15 * * * *", False, ["minute field '5/15'", "step needs a range"]),
        ("0 22-2 * * *", False, ["hour field '22-2'", "backwards"]),
        ("0 0 * * FRI-MON", False, ["day-of-week field 'FRI-MON'", "backwards"]),
        ("*/0 * * * *", False, ["step 0"]),
        ("1,,2 * * * *", False, ["empty list element"]),
        ("1,x * * * *", False, ["minute field '1,x'", "'x'"]),
        ("R * * * *", False, ["minute field 'R'", "random"]),
        ("H * * * *", False, ["minute field 'H'", "hashed"]),
        ("0 0 1 ? *", False, ["month field '?'"]),
        ("0 0 * * 1#6", False, ["'1#6'", "1-5"]),
        ("garbage", False, ["'garbage'", "expected 5 fields"]),
        ("0 0 * * * 2030", True, ["day-of-week field '2030'"]),
    ],
)
def test_errors_name_the_bad_part(expr: str, seconds: bool, fragments: list[str]) -> None:
    with pytest.raises(ScheduleError) as info:
        cron(expr, seconds=seconds)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, CronlockError)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_bad_argument_types() -> None:
    with pytest.raises(ScheduleError, match="string"):
        cron(5)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="seconds"):
        cron("* * * * *", seconds="yes")  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="unknown time zone"):
        cron("* * * * *", tz="Mars/Olympus")


def test_leap_day_is_valid_and_rare() -> None:
    job = cron("0 0 29 2 *")
    assert upcoming(job, utc(2096, 3, 1), 2) == [utc(2104, 2, 29), utc(2108, 2, 29)]  # 2100
