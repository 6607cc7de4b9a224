"""Every scheduler verb on one job takes the Job or its name, and refuses an unknown name
the same way (issue 23, item 6)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cronlock import JobLookupError, JobSucceeded, Scheduler, every
from cronlock.testing import FakeClock

from .conftest import T0


async def test_every_verb_takes_a_name(scheduler: Scheduler, clock: FakeClock) -> None:
    ran: list[object] = []
    job = scheduler.add_job(lambda: ran.append(clock.now()), every(60), name="report")
    async with scheduler:
        scheduler.pause_job("report")
        assert job.paused
        assert not scheduler.paused_fleet_wide("report")  # no fleet: never paused there
        await clock.advance(timedelta(minutes=3))
        assert ran == []
        scheduler.resume_job("report")
        assert not job.paused
        await clock.advance(timedelta(seconds=1))
        event = await scheduler.run_job_now("report")
        assert isinstance(event, JobSucceeded)
        assert ran == [T0 + timedelta(minutes=3, seconds=1)]
        assert scheduler.update("report", every(120)) is job
        assert scheduler.get_job(job) is job
        scheduler.remove("report")
        assert scheduler.jobs == ()


@pytest.mark.parametrize(
    "verb",
    ["get_job", "pause_job", "resume_job", "paused_fleet_wide", "remove", "update", "run_job_now"],
)
async def test_an_unknown_name_is_refused_with_a_hint(scheduler: Scheduler, verb: str) -> None:
    scheduler.add_job(lambda: None, every(60), name="nightly-report")
    method = getattr(scheduler, verb)

    async def call() -> object:
        if verb == "update":
            return method("nightly-reprot", every(60))
        result = method("nightly-reprot")
        return await result if verb == "run_job_now" else result

    async with scheduler:
        with pytest.raises(JobLookupError) as caught:
            await call()
    assert str(caught.value) == "unknown job: nightly-reprot (did you mean nightly-report?)"


async def test_a_job_of_another_scheduler_is_refused(scheduler: Scheduler) -> None:
    other = Scheduler()
    stranger = other.add_job(lambda: None, every(60), name="report")
    scheduler.add_job(lambda: None, every(60), name="report")
    with pytest.raises(JobLookupError, match="'report' is not registered with this scheduler"):
        scheduler.pause_job(stranger)
    assert not stranger.paused


def test_a_name_of_the_wrong_type_is_a_type_error(scheduler: Scheduler) -> None:
    with pytest.raises(TypeError, match="job must be a Job or a job's name, got 3"):
        scheduler.pause_job(3)  # type: ignore[arg-type]
