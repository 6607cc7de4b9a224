"""Run guards on the real clock: the shared deadline timer behaves like asyncio.timeout."""

from __future__ import annotations

import asyncio

import pytest

from cronlock import JobSucceeded, JobTimedOut, RunContext, Scheduler, SystemClock
from cronlock._guard import Deadlines, RunGuard

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
    assert len(deadlines._heap) < 200  # compacted: the ended ones are gone


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
