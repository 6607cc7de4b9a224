"""'No success in N days' without a ledger, on the fake clock at exact instants:
``Scheduler.without_success_since`` and its gauge."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from cronlock import JobLookupError, Scheduler, once
from cronlock.prometheus import instrument
from cronlock.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GAUGE = "cronlock_job_without_success_since_timestamp_seconds"


async def test_a_job_goes_without_success_since_the_start_then_since_its_last_success() -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    registry = CollectorRegistry()
    instrument(scheduler, registry)
    broken = True

    @scheduler.every(60, name="export")
    async def export() -> None:
        if broken:
            raise RuntimeError("disk full")

    assert scheduler.without_success_since("export") is None  # not started
    async with scheduler:
        await clock.advance(60)  # fails at T0+60: it never succeeded, judged from the start
        assert scheduler.without_success_since("export") == T0
        assert registry.get_sample_value(GAUGE, {"cronlock_job": "export"}) == T0.timestamp()
        broken = False
        await clock.advance(60)  # succeeds at T0+120
        since = T0 + timedelta(seconds=120)
        assert scheduler.without_success_since(scheduler.get_job("export")) == since
        broken = True
        await clock.advance(600)  # ten more failures change nothing
        assert scheduler.without_success_since("export") == since
        assert registry.get_sample_value(GAUGE, {"cronlock_job": "export"}) == since.timestamp()
    with pytest.raises(JobLookupError, match="unknown job: exprt"):
        scheduler.without_success_since("exprt")


async def test_the_gauge_leaves_out_paused_and_finished_jobs() -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    registry = CollectorRegistry()
    instrument(scheduler, registry)
    scheduler.add_job(lambda: None, once(T0 + timedelta(seconds=30)), name="warm")
    scheduler.add_job(lambda: None, once(T0 + timedelta(days=1)), name="later")
    paused = scheduler.add_job(lambda: None, once(T0 + timedelta(days=1)), name="paused")
    async with scheduler:
        paused.pause()
        await clock.advance(60)
        # Facts for every job; nothing expected of the paused one or the finished one.
        assert scheduler.without_success_since("warm") == T0 + timedelta(seconds=30)
        assert scheduler.without_success_since("paused") == T0
        assert registry.get_sample_value(GAUGE, {"cronlock_job": "later"}) == T0.timestamp()
        assert registry.get_sample_value(GAUGE, {"cronlock_job": "warm"}) is None
        assert registry.get_sample_value(GAUGE, {"cronlock_job": "paused"}) is None
