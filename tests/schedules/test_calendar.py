"""daily / weekly / monthly: exact slots, every-N anchoring, month ends, DST, errors."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from cronlock._errors import ScheduleError
from cronlock._schedules.calendar import CalendarSchedule, daily, monthly, weekly
from cronlock._schedules.schedule import Schedule, bind_zone, upcoming

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


# 2024-01-01 is a Monday and 19723 days after 1970-01-01; its week is week 2817 counted
# from Monday 1970-01-05; January 2024 is month 648 counted from January 1970.
TABLE: list[tuple[CalendarSchedule, datetime, list[datetime]]] = [
    (daily(), utc(2024, 1, 1), [utc(2024, 1, 1, 3), utc(2024, 1, 2, 3)]),
    (daily("03:00", tz=BERLIN), utc(2024, 1, 1), [utc(2024, 1, 1, 2), utc(2024, 1, 2, 2)]),
    (
        daily(["17:30:15", "09:00"]),
        utc(2024, 1, 1, 12),
        [utc(2024, 1, 1, 17, 30, 15), utc(2024, 1, 2, 9), utc(2024, 1, 2, 17, 30, 15)],
    ),
    (daily(time(6, 5)), utc(2024, 1, 1, 6, 5), [utc(2024, 1, 2, 6, 5)]),
    # 19723 % 3 == 1, so the first day with index % 3 == 0 is 2024-01-03.
    (daily(every=3), utc(2024, 1, 1), [utc(2024, 1, 3, 3), utc(2024, 1, 6, 3), utc(2024, 1, 9, 3)]),
    (weekly("fri", "18:00"), utc(2024, 1, 1), [utc(2024, 1, 5, 18), utc(2024, 1, 12, 18)]),
    (
        weekly(["Monday", "wed"]),
        utc(2024, 1, 1, 12),
        [utc(2024, 1, 3, 3), utc(2024, 1, 8, 3), utc(2024, 1, 10, 3)],
    ),
    (weekly([0, 6]), utc(2024, 1, 1, 12), [utc(2024, 1, 7, 3), utc(2024, 1, 8, 3)]),  # 6 = Sun
    # Week 2817 is odd: every=2 fires in the week of 8 January.
    (weekly("mon", every=2), utc(2023, 12, 31), [utc(2024, 1, 8, 3), utc(2024, 1, 22, 3)]),
    # Sunday 2023-12-31 closes the (even) week 2816 that began on Monday 25 December.
    (weekly("sun", every=2), utc(2023, 12, 31), [utc(2023, 12, 31, 3), utc(2024, 1, 14, 3)]),
    (monthly(), utc(2024, 1, 1, 12), [utc(2024, 2, 1, 3), utc(2024, 3, 1, 3)]),
    (
        monthly(-1),
        utc(2024, 1, 1),
        [utc(2024, 1, 31, 3), utc(2024, 2, 29, 3), utc(2024, 3, 31, 3), utc(2024, 4, 30, 3)],
    ),
    (monthly(-1), utc(2023, 2, 1), [utc(2023, 2, 28, 3)]),
    (monthly(-2), utc(2024, 1, 1), [utc(2024, 1, 30, 3), utc(2024, 2, 28, 3)]),
    (
        monthly(31),
        utc(2024, 1, 1),  # skipped in February and April, like cron
        [utc(2024, 1, 31, 3), utc(2024, 3, 31, 3), utc(2024, 5, 31, 3)],
    ),
    (monthly(30), utc(2024, 1, 1), [utc(2024, 1, 30, 3), utc(2024, 3, 30, 3)]),
    (monthly(29), utc(2023, 1, 30), [utc(2023, 3, 29, 3)]),  # 2023 is not a leap year
    (monthly([28, -1]), utc(2023, 2, 1), [utc(2023, 2, 28, 3), utc(2023, 3, 28, 3)]),  # once
    (
        monthly([15, 1], "12:00"),
        utc(2024, 1, 1),
        [utc(2024, 1, 1, 12), utc(2024, 1, 15, 12), utc(2024, 2, 1, 12)],
    ),
    (monthly(every=3), utc(2024, 1, 1, 12), [utc(2024, 4, 1, 3), utc(2024, 7, 1, 3)]),
    # 648 % 5 == 3: March 2024 (650), August 2024 (655), January 2025 (660).
    (
        monthly(every=5),
        utc(2024, 1, 1),
        [utc(2024, 3, 1, 3), utc(2024, 8, 1, 3), utc(2025, 1, 1, 3)],
    ),
]


@pytest.mark.parametrize(("schedule", "after", "expected"), TABLE, ids=str)
def test_slots(schedule: CalendarSchedule, after: datetime, expected: list[datetime]) -> None:
    assert upcoming(schedule, after, len(expected)) == expected


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        # Spring forward: 02:30 does not exist -> once, at the end of the gap.
        (
            daily("02:30", tz=NY),
            utc(2024, 3, 9, 12),
            [utc(2024, 3, 10, 7), utc(2024, 3, 11, 6, 30)],
        ),
        # Fall back: 01:30 happens twice -> once, on the first pass (EDT).
        (
            daily("01:30", tz=NY),
            utc(2024, 11, 2, 12),
            [utc(2024, 11, 3, 5, 30), utc(2024, 11, 4, 6, 30)],
        ),
        (
            weekly("sun", "02:30", tz=BERLIN),
            utc(2024, 10, 26),
            [utc(2024, 10, 27, 0, 30), utc(2024, 11, 3, 1, 30)],
        ),
        (weekly("sun", "02:30", tz=BERLIN), utc(2024, 3, 30), [utc(2024, 3, 31, 1)]),
        (monthly(-1, "02:15", tz=BERLIN), utc(2024, 3, 1), [utc(2024, 3, 31, 1)]),
        (
            daily(["01:00", "01:59"], tz=NY),
            utc(2024, 11, 3, 5, 30),
            [utc(2024, 11, 3, 5, 59), utc(2024, 11, 4, 6)],
        ),
    ],
    ids=str,
)
def test_dst(schedule: CalendarSchedule, after: datetime, expected: list[datetime]) -> None:
    assert upcoming(schedule, after, len(expected)) == expected


def test_every_n_uses_the_local_date() -> None:
    # From local midnight on 1 January (index 19723, odd) the next even local date is
    # 2 January; its 23:30 EST is 04:30Z on 3 January, whose UTC date (19725) is odd.
    job = daily("23:30", every=2, tz=NY)
    assert job.next_after(utc(2024, 1, 1, 5)) == utc(2024, 1, 3, 4, 30)


def test_attributes_text_and_binding() -> None:
    job = weekly(["fri", "mon"], ["18:00", "07:30:05"], every=2, tz="Europe/Berlin")
    assert job.kind == "weekly"
    assert job.on == (0, 4)
    assert job.at == (time(7, 30, 5), time(18, 0))
    assert job.every == 2
    assert job.tz == BERLIN
    assert str(job) == "weekly on mon,fri at 07:30:05,18:00 every 2 weeks in Europe/Berlin"
    assert str(monthly(-1)) == "monthly on day -1 at 03:00"
    assert str(daily()) == "daily at 03:00"
    assert isinstance(job, Schedule)
    bound = bind_zone(daily(), NY)
    assert isinstance(bound, CalendarSchedule)
    assert bound.tz == NY
    assert bound.next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 8)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: daily("25:00"), "daily: at '25:00' is not a time of day (HH:MM or HH:MM:SS)"),
        (lambda: daily("3pm"), "daily: at '3pm' is not a time of day"),
        (lambda: daily("03:60"), "daily: at '03:60'"),
        (lambda: daily(3), "daily: at 3 is not a time of day"),  # type: ignore[arg-type]
        (lambda: daily([]), "daily: at is empty"),
        (lambda: daily(time(3, tzinfo=UTC)), "has a tzinfo"),
        (lambda: daily(every=0), "daily: every must be a positive integer, got 0"),
        (lambda: daily(every=True), "daily: every must be a positive integer, got True"),
        (lambda: daily(tz="Mars/Base"), "daily: tz: unknown time zone 'Mars/Base'"),
        (lambda: daily(tz=timezone(timedelta(hours=2))), "fixed offsets"),  # type: ignore[arg-type]
        (lambda: weekly("funday"), "weekly: on 'funday' is not a weekday"),
        (lambda: weekly(7), "weekly: on 7 is not a weekday (mon..sun, or 0=Monday..6=Sunday)"),
        (lambda: weekly([]), "weekly: on is empty"),
        (lambda: weekly("mon", "24:00"), "weekly: at '24:00'"),
        (lambda: monthly(0), "monthly: on 0 is not a day of the month"),
        (lambda: monthly(32), "monthly: on 32"),
        (lambda: monthly(-32), "monthly: on -32"),
        (lambda: monthly("1"), "monthly: on '1'"),  # type: ignore[arg-type]
        (lambda: monthly(every=-1), "monthly: every must be a positive integer, got -1"),
    ],
)
def test_errors_name_field_and_value(make: object, message: str) -> None:
    assert callable(make)
    with pytest.raises(ScheduleError) as info:
        make()
    assert message in str(info.value)
