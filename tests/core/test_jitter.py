"""A jitter is shorter than the gap between two slots of its job, or the job is refused."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest

from cronlock import JobStarted, ScheduleError, Scheduler, cron, daily, every, once, weekly
from cronlock._schedules.schedule import Schedule
from cronlock.testing import FakeClock

from .conftest import T0, Recorder


def _noop() -> None:
    pass


class EveryOtherMinute:
    """A schedule of the user's own class: its gaps are not sampled."""

    def next_after(self, after: datetime) -> datetime | None:
        return after.replace(second=0, microsecond=0) + timedelta(minutes=2)


def test_a_jitter_as_long_as_the_interval_is_refused_naming_job_field_value_and_interval(
    scheduler: Scheduler,
) -> None:
    with pytest.raises(ScheduleError) as info:
        scheduler.add_job(_noop, every(minutes=5), name="poll", jitter=timedelta(minutes=5))
    assert str(info.value) == (
        "job 'poll': jitter=300s must be shorter than the interval of its schedule, 300s "
        "(every 5m), or a slot can start after the next one and the two are coalesced into "
        "one run; use a smaller jitter"
    )
    assert scheduler.jobs == ()  # not registered: the name is free
    scheduler.add_job(_noop, every(minutes=5), name="poll", jitter=299.999)


@pytest.mark.parametrize(
    ("schedule", "refused", "accepted", "gap"),
    [
        (every(10), 10, 9.5, "10s"),
        (every(10), 3600, 0, "10s"),
        (cron("*/5 * * * *"), 300, 299, "300s"),
        (cron("0 9,17 * * MON-FRI", tz="Europe/Berlin"), 8 * 3600, 8 * 3600 - 1, "28800s"),
        (daily(["03:00", "03:30"]), 1800, 1799, "1800s"),
        (weekly(["mon", "tue"], "03:00"), 86400, 86399, "86400s"),
        (once([T0, T0 + timedelta(minutes=1)]), 60, 59, "60s"),
    ],
    ids=["every", "every-zero-jitter", "cron", "cron-weekdays", "daily", "weekly", "once"],
)
def test_refused_from_the_shortest_gap_of_each_schedule_kind(
    scheduler: Scheduler, schedule: Schedule, refused: float, accepted: float, gap: str
) -> None:
    with pytest.raises(ScheduleError, match=rf"job 'j': jitter={refused:g}s .*, {gap}\b"):
        scheduler.add_job(_noop, schedule, name="j", jitter=refused)
    scheduler.add_job(_noop, schedule, name="j", jitter=accepted)


@pytest.mark.parametrize(
    "schedule", [once(T0), EveryOtherMinute()], ids=["one-instant", "users-own-class"]
)
def test_schedules_with_no_known_gap_take_any_jitter(
    scheduler: Scheduler, schedule: Schedule
) -> None:
    scheduler.add_job(_noop, schedule, name="j", jitter=timedelta(days=1))


def test_the_decorators_refuse_it_too(scheduler: Scheduler) -> None:
    with pytest.raises(ScheduleError, match=re.escape("job 'tick': jitter=10s")):
        scheduler.every(10, jitter=10, name="tick")(_noop)
    with pytest.raises(ScheduleError, match=re.escape("job 'nightly': jitter=86400s")):
        scheduler.daily("03:00", jitter=timedelta(days=1), name="nightly")(_noop)


def test_a_new_schedule_shorter_than_the_jitter_is_refused_and_the_old_one_kept(
    scheduler: Scheduler,
) -> None:
    job = scheduler.add_job(_noop, every(60), name="report", jitter=30)
    with pytest.raises(ScheduleError, match=r"job 'report': jitter=30s .* 20s \(every 20s\)"):
        scheduler.update("report", every(20))
    assert job.schedule == every(60)
    scheduler.update("report", every(31))
    assert job.schedule == every(31)


async def test_a_jitter_just_under_the_interval_runs_every_slot_once(clock: FakeClock) -> None:
    """What the bound keeps: with jitter=15 on every(10), 6 of 99 slots were coalesced."""
    scheduler = Scheduler(clock=clock)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    scheduler.add_job(_noop, every(10), name="poll", jitter=9.99)
    async with scheduler:
        await clock.advance(1000)
    slots = [e.slot for e in recorder.of(JobStarted)]  # type: ignore[attr-defined]
    assert slots == [T0 + timedelta(seconds=s) for s in range(10, 1000, 10)]
