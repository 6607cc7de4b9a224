"""Overdue jobs on the fake clock, at exact instants: ``Scheduler.overdue()``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronlock import ScheduleError, Scheduler, cron, every
from cronlock.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_a_job_that_stops_succeeding_becomes_overdue_after_its_grace() -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    broken = False

    @scheduler.every(60, name="export", misfire_grace=10, timeout=5)
    async def export() -> None:
        if broken:
            raise RuntimeError("disk full")

    @scheduler.every(60, name="healthy", misfire_grace=10)
    async def healthy() -> None:
        pass

    async with scheduler:
        await clock.advance(60)  # both succeed at T0+60
        assert scheduler.overdue() == ()
        broken = True
        await clock.advance(60)  # export fails at T0+120
        # T0+120 fell due, nothing succeeded since: overdue once 10 + 5 s have passed.
        await clock.advance(15)
        assert scheduler.overdue() == ()
        await clock.advance(1)
        assert [job.name for job in scheduler.overdue()] == ["export"]
        broken = False
        await clock.advance(60 - 16)  # export succeeds at T0+180
        assert scheduler.overdue() == ()


async def test_a_job_that_never_succeeded_is_judged_from_the_start() -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)

    @scheduler.cron("0 * * * *", name="hourly", alert_after=300)
    async def hourly() -> None:
        raise RuntimeError("never works")

    @scheduler.cron("0 * * * *", name="paused", alert_after=300)
    async def paused() -> None:
        raise RuntimeError("never works")

    async with scheduler:
        scheduler.get_job("paused").pause()
        await clock.advance(timedelta(hours=1, minutes=5))
        assert scheduler.overdue() == ()  # exactly alert_after past the first slot
        await clock.advance(1)
        assert [job.name for job in scheduler.overdue()] == ["hourly"]
        scheduler.get_job("hourly").pause()
        assert scheduler.overdue() == ()


async def test_a_job_added_while_running_is_due_from_its_creation() -> None:
    """A job added at 01:30 to a scheduler started at 00:00 is not due by 01:00 (a slot
    before it existed), but by 02:00: not overdue at once, overdue once that slot missed."""
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)

    async def report() -> None:
        raise RuntimeError("never works")

    async with scheduler:
        await clock.advance(timedelta(hours=1, minutes=30))
        scheduler.add_job(report, cron("0 * * * *"), name="report", alert_after=60)
        await clock.advance(60)
        assert scheduler.overdue() == ()
        await clock.advance(timedelta(minutes=29))  # 02:00: it runs, fails
        await clock.advance(60)
        assert scheduler.overdue() == ()  # exactly alert_after past its first slot
        await clock.advance(1)
        assert [job.name for job in scheduler.overdue()] == ["report"]
        # Removed and added again later: due from then, not from its first life.
        scheduler.remove("report")
        await clock.advance(timedelta(hours=1, minutes=30))
        scheduler.add_job(report, cron("0 * * * *"), name="report", alert_after=60)
        await clock.advance(120)
        assert scheduler.overdue() == ()


def test_alert_after_is_validated() -> None:
    scheduler = Scheduler()
    with pytest.raises(ScheduleError, match=r"job 'j'.*alert_after.*-1"):
        scheduler.add_job(lambda: None, every(60), name="j", alert_after=-1)
