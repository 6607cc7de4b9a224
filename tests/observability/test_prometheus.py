"""cronlock.prometheus on the fake clock: names, labels and values at exact instants."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest

from cronlock import JobTimedOut, Scheduler, SystemClock
from cronlock.prometheus import instrument
from cronlock.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_runs_skips_durations_and_state_gauges() -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    registry = CollectorRegistry()
    fail = False

    @scheduler.every(60, name="export", misfire_grace=10, timeout=20)
    async def export() -> None:
        await clock.sleep(2)
        if fail:
            raise RuntimeError("disk full")

    @scheduler.every(10, name="slow", overlap="skip")
    async def slow() -> None:
        await clock.sleep(15)

    handle = instrument(scheduler, registry)
    async with scheduler:
        await clock.advance(62)
        assert (
            value(registry, "cronlock_runs_total", cronlock_job="export", outcome="succeeded") == 1
        )
        assert value(registry, "cronlock_run_duration_seconds_count", cronlock_job="export") == 1
        assert value(registry, "cronlock_run_duration_seconds_sum", cronlock_job="export") == 2
        assert value(registry, "cronlock_start_lateness_seconds_count", cronlock_job="export") == 1
        assert value(registry, "cronlock_start_lateness_seconds_sum", cronlock_job="export") == 0
        assert value(registry, "cronlock_skips_total", cronlock_job="slow", reason="overlap") == 3
        ended = (T0 + timedelta(seconds=62)).timestamp()
        assert (
            value(registry, "cronlock_job_last_success_timestamp_seconds", cronlock_job="export")
            == ended
        )
        assert (
            value(registry, "cronlock_job_last_run_timestamp_seconds", cronlock_job="export")
            == ended
        )
        nxt = (T0 + timedelta(seconds=120)).timestamp()
        assert (
            value(registry, "cronlock_job_next_run_timestamp_seconds", cronlock_job="export") == nxt
        )
        assert value(registry, "cronlock_job_overdue", cronlock_job="export") == 0
        assert value(registry, "cronlock_job_paused", cronlock_job="export") == 0

        fail = True
        await clock.advance(60)  # fails at T0+122; overdue after T0+120+10+20
        assert value(registry, "cronlock_runs_total", cronlock_job="export", outcome="failed") == 1
        await clock.advance(28)
        assert value(registry, "cronlock_job_overdue", cronlock_job="export") == 0
        await clock.advance(1)
        assert value(registry, "cronlock_job_overdue", cronlock_job="export") == 1
        last_ok = value(
            registry, "cronlock_job_last_success_timestamp_seconds", cronlock_job="export"
        )
        assert last_ok == ended  # the failure did not move it

        scheduler.get_job("export").pause()
        assert value(registry, "cronlock_job_paused", cronlock_job="export") == 1
        assert value(registry, "cronlock_job_overdue", cronlock_job="export") == 0
    text = generate_latest(registry).decode()
    assert "# TYPE cronlock_runs_total counter" in text
    assert "cronlock_leader" not in text  # no elector
    handle.close()
    handle.close()
    assert (
        value(registry, "cronlock_runs_total", cronlock_job="export", outcome="succeeded") is None
    )


async def test_timeouts_count_as_timed_out() -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    registry = CollectorRegistry()

    @scheduler.every(60, name="hang", timeout=1)
    async def hang() -> None:
        await asyncio.Event().wait()

    instrument(scheduler, registry)
    async with scheduler:
        await clock.advance(61)
    assert value(registry, "cronlock_runs_total", cronlock_job="hang", outcome="timed_out") == 1


async def test_retries_are_counted_and_a_retry_is_no_late_start() -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    registry = CollectorRegistry()

    @scheduler.every(3600, name="flaky", retries=2, retry_delay=5)
    async def flaky() -> None:
        raise RuntimeError("down")

    handle = instrument(scheduler, registry)
    async with scheduler:
        await clock.advance(3600 + 60)
        assert value(registry, "cronlock_runs_total", cronlock_job="flaky", outcome="failed") == 3
        assert value(registry, "cronlock_retries_total", cronlock_job="flaky") == 2
        # Only the slot's first attempt counts as a start, on time.
        assert value(registry, "cronlock_start_lateness_seconds_count", cronlock_job="flaky") == 1
        assert value(registry, "cronlock_start_lateness_seconds_sum", cronlock_job="flaky") == 0
    handle.close()


async def test_a_timed_out_thread_that_returns_counts_as_overran() -> None:
    scheduler = Scheduler(clock=SystemClock())
    registry = CollectorRegistry()
    release = threading.Event()

    @scheduler.every(3600, name="blocking", timeout=0.05)
    def blocking() -> None:
        release.wait(60)

    instrument(scheduler, registry)
    try:
        async with scheduler, asyncio.timeout(60):  # a liveness guard, not a timing
            event = await scheduler.get_job("blocking").run_now()
            assert isinstance(event, JobTimedOut)
            assert value(registry, "cronlock_runs_overran_total", cronlock_job="blocking") is None
            release.set()
            while not value(registry, "cronlock_runs_overran_total", cronlock_job="blocking"):
                await asyncio.sleep(0.01)
    finally:
        release.set()
    assert value(registry, "cronlock_runs_overran_total", cronlock_job="blocking") == 1
    assert value(registry, "cronlock_runs_total", cronlock_job="blocking", outcome="timed_out") == 1
