"""every(): anchored slots, exact integer arithmetic, validation."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cronlock._errors import ScheduleError
from cronlock._schedules.interval import IntervalSchedule, every
from cronlock._schedules.schedule import Schedule, bind_zone, upcoming

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        (every(60), utc(2024, 1, 1, 10, 0, 30), [utc(2024, 1, 1, 10, 1), utc(2024, 1, 1, 10, 2)]),
        (
            every(minutes=15),
            utc(2024, 1, 1, 10, 7),
            [utc(2024, 1, 1, 10, 15), utc(2024, 1, 1, 10, 30)],
        ),
        (
            every(hours=1, anchor=utc(2020, 5, 5, 0, 15)),
            utc(2024, 1, 1, 10, 20),
            [utc(2024, 1, 1, 11, 15), utc(2024, 1, 1, 12, 15)],
        ),
        # An anchor in the future: slots before it exist too.
        (
            every(hours=1, anchor=utc(2030, 1, 1, 0, 20)),
            utc(2024, 1, 1),
            [utc(2024, 1, 1, 0, 20), utc(2024, 1, 1, 1, 20)],
        ),
        (
            every(days=1, anchor=datetime(2024, 1, 1, 3, tzinfo=ZoneInfo("Europe/Berlin"))),
            utc(2024, 7, 1),
            [utc(2024, 7, 1, 2), utc(2024, 7, 2, 2)],
        ),  # real time: no DST shift
        (
            every(timedelta(minutes=1), seconds=30),
            utc(2024, 1, 1),
            [utc(2024, 1, 1, 0, 1, 30), utc(2024, 1, 1, 0, 3)],
        ),
        (
            every(0.25),
            EPOCH + timedelta(milliseconds=100),
            [EPOCH + timedelta(milliseconds=250), EPOCH + timedelta(milliseconds=500)],
        ),
    ],
    ids=str,
)
def test_slots(schedule: IntervalSchedule, after: datetime, expected: list[datetime]) -> None:
    assert upcoming(schedule, after, len(expected)) == expected


def test_a_slot_is_strictly_after() -> None:
    job = every(minutes=5)
    assert job.next_after(utc(2024, 1, 1, 10, 5)) == utc(2024, 1, 1, 10, 10)
    assert job.next_after(utc(2024, 1, 1, 10, 4, 59, 999_999)) == utc(2024, 1, 1, 10, 5)


def test_spellings_are_one_schedule() -> None:
    assert every(90) == every(timedelta(seconds=90)) == every(minutes=1, seconds=30)
    assert every(90).interval == timedelta(seconds=90)
    assert every(days=1, hours=1).interval == timedelta(hours=25)


def test_no_float_drift_far_from_the_anchor() -> None:
    tenth = every(0.1)
    k = 10**9
    slot = EPOCH + timedelta(seconds=10**8)  # k * 0.1 s, exactly
    assert tenth.next_after(slot - timedelta(microseconds=1)) == slot
    third = every(seconds=1 / 3)  # rounds to 333333 us
    assert third.interval == timedelta(microseconds=333_333)
    exact = EPOCH + timedelta(microseconds=333_333 * k)
    assert third.next_after(exact - timedelta(microseconds=1)) == exact
    assert third.next_after(exact) == exact + timedelta(microseconds=333_333)


def test_result_is_utc_and_end_of_time_is_none() -> None:
    slot = every(60).next_after(datetime(2024, 1, 1, 12, tzinfo=ZoneInfo("Asia/Tokyo")))
    assert slot == utc(2024, 1, 1, 3, 1)
    assert slot is not None and slot.tzinfo is UTC
    assert every(days=365).next_after(datetime(9999, 6, 1, tzinfo=UTC)) == utc(9999, 9, 1)
    assert every(days=365).next_after(datetime(9999, 9, 1, tzinfo=UTC)) is None  # year 10000


def test_attributes_text_and_binding() -> None:
    job = every(
        hours=1, minutes=30, anchor=datetime(2024, 1, 1, 1, tzinfo=ZoneInfo("Europe/Berlin"))
    )
    assert job.anchor == utc(2024, 1, 1)
    assert job.anchor.tzinfo is UTC
    assert str(job) == "every 1h30m from 2024-01-01T00:00:00+00:00"
    assert str(every(0.25)) == "every 0.25s"
    assert str(every(days=2, seconds=5)) == "every 2d5s"
    assert isinstance(job, Schedule)
    assert not hasattr(job, "tz")
    assert bind_zone(job, ZoneInfo("Asia/Tokyo")) is job


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: every(0), "must be positive"),
        (lambda: every(), "must be positive"),
        (lambda: every(-5), "interval must not be negative, got -5"),
        (lambda: every(minutes=-1), "minutes must not be negative, got -1"),
        (lambda: every(timedelta(seconds=-1)), "interval must not be negative"),
        (lambda: every(math.nan), "interval must be a finite number, got nan"),
        (lambda: every(hours=math.inf), "hours must be a finite number, got inf"),
        (lambda: every(1e-7), "at least 1 microsecond"),
        (lambda: every("5"), "interval must be a number or timedelta, got '5'"),  # type: ignore[arg-type]
        (lambda: every(True), "got True"),
        (lambda: every(60, anchor=datetime(2024, 1, 1)), "naive"),
        (lambda: every(60, anchor="2024-01-01"), "anchor must be an aware datetime"),  # type: ignore[arg-type]
        (lambda: every(days=1e12), "too large"),
        (lambda: IntervalSchedule(timedelta(0)), "positive"),
    ],
)
def test_errors_name_the_value(make: object, fragment: str) -> None:
    assert callable(make)
    with pytest.raises(ScheduleError) as info:
        make()
    assert fragment in str(info.value)


@pytest.mark.parametrize("bad", [[1], {1: 2}])
def test_unhashable_interval_is_a_schedule_error(bad: object) -> None:
    # every() remembers recent arguments; an unhashable one must still get the clear error.
    with pytest.raises(ScheduleError, match="interval must be a number or timedelta"):
        every(bad)  # type: ignore[arg-type]


def test_repeated_arguments_share_one_schedule() -> None:
    anchor = datetime(2026, 1, 1, 0, 0, 15, tzinfo=UTC)
    assert every(30, anchor=anchor) is every(30, anchor=anchor)
    assert every(30, anchor=anchor) == every(timedelta(seconds=30), anchor=anchor)
    assert every(1) is not every(1.5)
