"""once(): fixed instants, and the "at scheduler start" marker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cronlock._errors import ScheduleError
from cronlock._schedules.once import OnceSchedule, once
from cronlock._schedules.schedule import Schedule, bind_zone, upcoming


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def test_single_instant() -> None:
    job = once(utc(2024, 5, 1, 12))
    assert job.next_after(utc(2024, 1, 1)) == utc(2024, 5, 1, 12)
    assert job.next_after(utc(2024, 5, 1, 11, 59, 59, 999_999)) == utc(2024, 5, 1, 12)
    assert job.next_after(utc(2024, 5, 1, 12)) is None  # strictly after
    assert job.next_after(utc(2030, 1, 1)) is None
    assert not job.at_start


def test_several_instants_sorted_deduplicated_in_utc() -> None:
    berlin_noon = datetime(2024, 5, 1, 12, tzinfo=ZoneInfo("Europe/Berlin"))  # 10:00Z
    job = once([utc(2024, 6, 1), berlin_noon, utc(2024, 5, 1, 10), utc(2024, 1, 1)])
    assert job.instants == (utc(2024, 1, 1), utc(2024, 5, 1, 10), utc(2024, 6, 1))
    assert all(i.tzinfo is UTC for i in job.instants)
    assert upcoming(job, utc(2023, 1, 1), 10) == list(job.instants)
    assert job.next_after(utc(2024, 3, 1)) == utc(2024, 5, 1, 10)
    assert job.next_after(datetime(2024, 5, 1, 12, tzinfo=ZoneInfo("Europe/Berlin"))) == utc(
        2024, 6, 1
    )


def test_at_start() -> None:
    job = once()
    assert job == OnceSchedule(instants=(), at_start=True)
    assert job.at_start
    assert job.next_after(utc(2024, 1, 1)) is None
    assert str(job) == "once at start"
    assert isinstance(job, Schedule)
    assert bind_zone(job, ZoneInfo("Asia/Tokyo")) is job


def test_text() -> None:
    assert str(once(utc(2024, 5, 1, 12))) == "once at 2024-05-01T12:00:00+00:00"


@pytest.mark.parametrize(
    ("at", "fragment"),
    [
        (datetime(2024, 1, 1), "naive"),
        ([utc(2024, 1, 1), datetime(2024, 1, 2)], "naive"),
        ([], "empty"),
        ("2024-01-01T00:00:00Z", "must be a datetime"),
        (1714560000, "must be a datetime"),
        ([utc(2024, 1, 1), "tomorrow"], "'tomorrow' is not a datetime"),
        ([utc(2024, 1, 1).date()], "is not a datetime"),
    ],
)
def test_errors(at: object, fragment: str) -> None:
    with pytest.raises(ScheduleError) as info:
        once(at)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_contradictory_direct_construction() -> None:
    with pytest.raises(ScheduleError, match="takes no instants"):
        OnceSchedule((utc(2024, 1, 1),), at_start=True)
    with pytest.raises(ScheduleError, match="at least one"):
        OnceSchedule()
    assert OnceSchedule((utc(2024, 1, 1) + timedelta(hours=1),)).instants == (utc(2024, 1, 1, 1),)
