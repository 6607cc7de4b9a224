"""Run guards on the real clock: the shared deadline timer behaves like asyncio.timeout."""

from __future__ import annotations

import asyncio

import pytest

from cronlock import (
    JobCancelled,
    JobFailed,
    JobSucceeded,
    JobTimedOut,
    RunContext,
    Scheduler,
    SystemClock,
)
from cronlock._core.guard import Deadlines, RunGuard

from ..eventually import eventually
from .conftest import Recorder


async def test_deadline_turns_into_timeout_error() -> None:
    guard = RunGuard(SystemClock(), 0.01, Deadlines())
    with pytest.raises(TimeoutError):
        async with guard:
            await asyncio.sleep(10)
    assert guard.reason == "timeout"
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0  # our cancel was taken back


async def test_cancel_from_outside_stays_a_cancellation() -> None:
    deadlines = Deadlines()
    entered = asyncio.Event()

    async def run() -> None:
        async with RunGuard(SystemClock(), 60, deadlines):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(run())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_losing_the_lock_ends_the_run_with_a_reason() -> None:
    guard = RunGuard(SystemClock(), None, None)
    error = ConnectionResetError("gone")

    async def run() -> None:
        async with guard:
            await asyncio.sleep(10)

    task = asyncio.create_task(run())
    await asyncio.sleep(0)
    guard.lose(error)
    with pytest.raises(TimeoutError):
        await task
    assert guard.reason == "lock_lost"
    assert guard.lost_because is error
    guard.lose(None)  # after the end: nothing happens


async def test_ended_guards_do_not_pile_up() -> None:
    deadlines = Deadlines()
    for _ in range(1000):
        async with RunGuard(SystemClock(), 3600, deadlines):
            pass
    assert not deadlines.lane(3600).entries  # each ended run dropped its own entry


async def test_scheduler_timeouts_on_the_real_clock() -> None:
    scheduler = Scheduler(clock=SystemClock())
    rec = Recorder()
    scheduler.subscribe(rec)

    @scheduler.every(0.05, name="stuck", timeout=0.05)
    async def stuck(ctx: RunContext) -> None:
        if ctx.run_number == 1:
            await asyncio.sleep(30)

    async with scheduler, asyncio.timeout(60):  # a liveness guard, not a timing
        while not (rec.of(JobTimedOut) and rec.of(JobSucceeded)):
            await asyncio.sleep(0.02)
    [timed_out] = rec.of(JobTimedOut)[:1]
    assert timed_out.timeout == 0.05  # type: ignore[attr-defined]


async def test_direct_runs_end_as_guarded_runs_do() -> None:
    # Runs with no locker take the executor's direct path (one coroutine, the deadline
    # on the shared timer): each way out must give the same record and event as before.
    scheduler = Scheduler(clock=SystemClock())
    rec = Recorder()
    scheduler.subscribe(rec)
    boom = ValueError("boom")

    @scheduler.every(0.05, name="fails", max_runs=1)
    async def fails() -> None:
        raise boom

    @scheduler.every(0.05, name="swallows", timeout=0.05, max_runs=1)
    async def swallows() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "kept going"
        return "slept"

    @scheduler.every(0.05, name="raises-timeout", timeout=30, max_runs=1)
    async def raises_timeout() -> None:
        raise TimeoutError("its own, not ours")

    @scheduler.every(0.05, name="long", timeout=30, max_runs=1)
    async def long() -> None:
        await asyncio.sleep(30)

    await scheduler.start()
    await eventually(lambda: len(rec.of(JobSucceeded)) + len(rec.of(JobFailed)) >= 3, every=0.02)
    assert scheduler.get_job("long").running
    await scheduler.shutdown(timeout=0.01)  # cancels the long run
    failures = [e for e in rec.events if isinstance(e, JobFailed)]
    [failed, own_timeout] = sorted(failures, key=lambda e: e.job)
    assert failed.exception is boom
    assert isinstance(own_timeout.exception, TimeoutError)
    [kept] = [e for e in rec.events if isinstance(e, JobSucceeded)]
    assert kept.job == "swallows" and kept.return_value == "kept going"
    assert scheduler.get_job("swallows").last_success is not None
    assert not rec.of(JobTimedOut)
    [cancelled] = [e for e in rec.events if isinstance(e, JobCancelled)]
    assert cancelled.job == "long"
    last = scheduler.get_job("long").last_run
    assert last is not None and last.outcome == "cancelled"
    failed_run = scheduler.get_job("fails").last_run
    assert failed_run is not None and failed_run.outcome == "failed"


async def test_each_timeout_has_its_own_lane() -> None:
    # A long deadline started first must not hold back a shorter one started after it.
    deadlines = Deadlines()
    long_guard = RunGuard(SystemClock(), 3600, deadlines)
    short_guard = RunGuard(SystemClock(), 0.01, deadlines)
    entered = asyncio.Event()

    async def long_run() -> None:
        async with long_guard:
            entered.set()
            await asyncio.sleep(3600)

    holder = asyncio.create_task(long_run())
    await entered.wait()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(60), short_guard:  # the outer one: a liveness guard
            await asyncio.sleep(3600)
    assert short_guard.reason == "timeout"
    assert long_guard.reason is None
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder


async def test_a_lane_expires_a_later_run_after_the_first_ended() -> None:
    # The lane's timer was armed for the first run, which ended in time; the second run's
    # deadline must still fire.
    deadlines = Deadlines()
    async with RunGuard(SystemClock(), 0.02, deadlines):
        pass
    guard = RunGuard(SystemClock(), 0.02, deadlines)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(60), guard:  # the outer one: a liveness guard
            await asyncio.sleep(3600)
    assert guard.reason == "timeout"
    assert not deadlines.lane(0.02).entries
