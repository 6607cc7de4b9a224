"""A job's every() interval is at least 50 ms (MIN_INTERVAL), or the job is refused.

every(seconds=1e-6) was accepted: one job kept a core busy, with thousands of warnings
and, coordinated, a hundred ledger rows a second.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from cronlock import JobStarted, ScheduleError, Scheduler, every
from cronlock._schedules.schedule import MIN_INTERVAL
from cronlock.testing import FakeClock

from .conftest import T0, Recorder


def _noop() -> None:
    pass


def test_a_microsecond_interval_is_refused_naming_job_field_value_and_floor(
    scheduler: Scheduler,
) -> None:
    with pytest.raises(ScheduleError) as info:
        scheduler.add_job(_noop, every(seconds=1e-6), name="tick")
    assert str(info.value) == (
        "job 'tick': interval=1e-06s (every 1e-06s) is below the floor of 0.05s a job's "
        "interval may have (20 runs a second): each slot costs a plan, a start, events and "
        "logs, and a coordinated job a claim and a ledger row; use every(0.05) or longer"
    )
    assert isinstance(info.value, ValueError)
    assert scheduler.jobs == ()  # not registered: the name is free


@pytest.mark.parametrize(
    "interval",
    [timedelta(microseconds=1), 0.001, 0.01, timedelta(microseconds=49_999)],
    ids=["1us", "1ms", "10ms", "just-below"],
)
def test_every_interval_below_the_floor_is_refused(
    scheduler: Scheduler, interval: float | timedelta
) -> None:
    with pytest.raises(ScheduleError, match=r"^job 'j': interval=.* below the floor of 0\.05s"):
        scheduler.add_job(_noop, every(interval), name="j")


def test_the_decorator_and_a_new_schedule_are_refused_too(scheduler: Scheduler) -> None:
    with pytest.raises(ScheduleError, match=re.escape("job 'fast': interval=0.001s")):
        scheduler.every(0.001, name="fast")(_noop)
    job = scheduler.add_job(_noop, every(1), name="tick")
    with pytest.raises(ScheduleError, match=re.escape("job 'tick': interval=0.01s")):
        scheduler.update("tick", every(0.01))
    assert job.schedule == every(1)  # the old schedule is kept


def test_the_schedule_itself_is_pure_arithmetic_and_takes_any_positive_interval() -> None:
    # Only a job is refused: next_after() on a microsecond grid is exact and harmless.
    assert every(timedelta(microseconds=1)).next_after(T0) == T0 + timedelta(microseconds=1)


async def test_at_the_floor_a_job_runs_twenty_times_a_second(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    scheduler.add_job(_noop, every(MIN_INTERVAL), name="j")
    async with scheduler:
        await clock.advance(1)
    starts = [e.slot for e in recorder.of(JobStarted)]  # type: ignore[attr-defined]
    assert starts == [T0 + timedelta(milliseconds=50) * k for k in range(1, 21)]
