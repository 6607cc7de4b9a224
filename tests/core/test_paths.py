"""The three ways a run starts agree: the run loop's fast path, the executor's direct path
and the general path give the same events, the same records and the same outcomes.

Which path a run takes (``docs/internals.md``, "The path of one run"):

- **fast**: a plain ``every()`` job's second run (its first fire looks the job up; from then
  on its entries carry what the fast path needs);
- **direct**: the same, with a run cap (``max_runs``), which the fast path leaves to the
  general rules of ``_fire``; the run still starts on the executor's direct path;
- **general**: the same, with a timeout on a virtual clock (no shared deadline timer there)
  or asked for with ``run_now()``: ``Executor.run`` under a ``RunGuard``.

On the FakeClock every instant is exact; a timeout on the fast and direct paths needs the
real clock (their deadlines are event-loop timers), so those cases run there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

import pytest

from cronlock import (
    Event,
    JobCancelled,
    JobEvent,
    JobFailed,
    JobStarted,
    JobSucceeded,
    JobTimedOut,
    RunContext,
    RunRecord,
    Scheduler,
    SystemClock,
    every,
)
from cronlock.testing import FakeClock

from .conftest import T0, Recorder

PATHS = ("fast", "direct", "general")
BOOM = ValueError("boom")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _options(path: str) -> tuple[int | None, float | None]:
    """(max_runs, timeout) that send a plain every(10) job's runs down *path* on the
    FakeClock: a run cap leaves the fast path, a virtual clock's timeout the direct one."""
    return {"fast": (None, None), "direct": (10, None), "general": (None, 1000)}[path]


Body = Callable[[FakeClock], Awaitable[object]]


async def _succeeds(clock: FakeClock) -> object:
    await clock.sleep(3)
    return "ok"


async def _fails(clock: FakeClock) -> object:
    await clock.sleep(3)
    raise BOOM


async def _hangs(clock: FakeClock) -> object:
    await clock.sleep(100)
    return "never"


async def _second_run(path: str, body: Body) -> tuple[list[Event], Scheduler]:
    """Run 1 at t=10 returns at once; run 2 (slot t=20) does *body*; at t=25 the scheduler
    shuts down with no stop timeout (cancelling a run still going)."""
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    rec = Recorder()

    async def task(ctx: RunContext) -> object:
        if ctx.run_number == 1:
            return None
        return await body(clock)

    max_runs, timeout = _options(path)
    schedule = every(10, anchor=T0)
    scheduler.add_job(task, schedule, name="job", max_runs=max_runs, timeout=timeout)
    await scheduler.start()
    await clock.advance(15)
    scheduler.subscribe(rec)  # from run 2 on
    await clock.advance(10)
    await scheduler.shutdown(timeout=0)
    return [e for e in rec.events if isinstance(e, JobEvent)], scheduler


@pytest.mark.parametrize("path", PATHS)
async def test_a_success_is_the_same_on_every_path(path: str) -> None:
    events, scheduler = await _second_run(path, _succeeds)
    assert events == [
        JobStarted("job", at(20), at(20), 2),
        JobSucceeded("job", at(20), at(20), at(23), "ok"),
    ]
    job = scheduler.get_job("job")
    record = RunRecord(at(20), at(20), at(23), "succeeded", None)
    assert job.last_run == record
    assert job.last_success == record
    assert job.run_count == 2


@pytest.mark.parametrize("path", PATHS)
async def test_a_failure_is_the_same_on_every_path(path: str) -> None:
    events, scheduler = await _second_run(path, _fails)
    assert events == [
        JobStarted("job", at(20), at(20), 2),
        JobFailed("job", at(20), at(20), at(23), BOOM),
    ]
    job = scheduler.get_job("job")
    assert job.last_run == RunRecord(at(20), at(20), at(23), "failed", "ValueError: boom")
    assert job.last_success is not None and job.last_success.slot == at(10)


@pytest.mark.parametrize("path", PATHS)
async def test_a_cancellation_is_the_same_on_every_path(path: str) -> None:
    events, scheduler = await _second_run(path, _hangs)
    assert events == [
        JobStarted("job", at(20), at(20), 2),
        JobCancelled("job", at(20), at(20), at(25)),
    ]
    job = scheduler.get_job("job")
    assert job.last_run == RunRecord(at(20), at(20), at(25), "cancelled", None)
    assert job.last_success is not None and job.last_success.slot == at(10)


async def test_the_general_path_asked_for_agrees_too(clock: FakeClock) -> None:
    # run_now() always goes the general way (somebody waits for its event).
    scheduler = Scheduler(clock=clock)
    rec = Recorder()
    scheduler.subscribe(rec)

    async def task(ctx: RunContext) -> object:
        await clock.sleep(3)
        if ctx.run_number == 2:
            raise BOOM
        return "ok"

    scheduler.add_job(task, every(3600, anchor=T0), name="job")
    async with scheduler:
        await clock.advance(20)
        succeeded = asyncio.ensure_future(scheduler.run_job_now("job"))
        await clock.advance(3)
        failed = asyncio.ensure_future(scheduler.run_job_now("job"))
        await clock.advance(3)
    assert succeeded.result() == JobSucceeded("job", at(20), at(20), at(23), "ok")
    assert failed.result() == JobFailed("job", at(23), at(23), at(26), BOOM)
    assert [e for e in rec.events if isinstance(e, JobEvent)] == [
        JobStarted("job", at(20), at(20), 1),
        succeeded.result(),
        JobStarted("job", at(23), at(23), 2),
        failed.result(),
    ]
    job = scheduler.get_job("job")
    assert job.last_run == RunRecord(at(23), at(23), at(26), "failed", "ValueError: boom")
    assert job.last_success == RunRecord(at(20), at(20), at(23), "succeeded", None)


# -- timeouts, and what is and is not ours to call a timeout: on the real clock -------------

REAL_PATHS = PATHS


async def _swallows() -> object:
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        return "kept going"
    return "slept"


async def _own_timeout() -> object:
    raise TimeoutError("its own, not ours")


async def _sleeps() -> object:
    await asyncio.sleep(30)
    return "slept"


def _outcome(events: list[Event]) -> tuple[Any, ...]:
    """What a run's events say, without its instants (real time): kinds, run numbers,
    values, errors, and whether the run lasted at least its timeout."""
    said: list[Any] = []
    for event in events:
        if isinstance(event, JobStarted):
            said.append(("started", event.run_number))
        elif isinstance(event, JobSucceeded):
            said.append(("succeeded", event.return_value))
        elif isinstance(event, JobFailed):
            said.append(("failed", repr(event.exception)))
        elif isinstance(event, JobTimedOut):
            lasted = event.finished_at - event.started_at >= timedelta(seconds=event.timeout)
            said.append(("timed_out", event.timeout, lasted))
        elif isinstance(event, JobCancelled):
            said.append(("cancelled",))
    return tuple(said)


async def _real_second_run(
    path: str, body: Callable[[], Awaitable[object]], *, stop: bool = False
) -> tuple[tuple[Any, ...], RunRecord | None]:
    """Run 2 of a job with a 0.05 s timeout on the real clock does *body*: the second
    scheduled run (fast: every(0.05); direct: the same with a run cap), or the second
    run_now() (general). With *stop*, the scheduler shuts down while run 2 goes on."""
    scheduler = Scheduler(clock=SystemClock())
    rec = Recorder()
    scheduler.subscribe(rec)
    second = asyncio.Event()

    async def task(ctx: RunContext) -> object:
        if ctx.run_number == 1:
            return None
        second.set()
        return await body()

    # Stopped: the run must be cut by the shutdown, not by its timeout, however slow the
    # machine is between the run's start and the shutdown (a deadline is still armed).
    timeout = 30.0 if stop else 0.05
    if path == "general":
        scheduler.add_job(task, every(3600), name="job", timeout=timeout)
    else:
        cap = 2 if path == "direct" else None
        scheduler.add_job(task, every(0.05), name="job", timeout=timeout, max_runs=cap)
    job = scheduler.get_job("job")
    async with asyncio.timeout(60):  # a liveness guard, not a timing
        await scheduler.start()
        if path == "general":
            await scheduler.run_job_now("job")
            running = asyncio.ensure_future(scheduler.run_job_now("job"))
        await second.wait()
        if stop:
            await asyncio.sleep(0)
            await scheduler.shutdown(timeout=0)
        else:
            while not (job.last_run is not None and job.run_count == 2 and not job.running):
                await asyncio.sleep(0.01)
            await scheduler.shutdown(timeout=0)
        if path == "general":
            with pytest.raises(asyncio.CancelledError) if stop else nullcontext():
                await running
    started = [i for i, e in enumerate(rec.events) if isinstance(e, JobStarted)]
    return _outcome(rec.events[started[1] :]), job.last_run


@pytest.mark.parametrize("path", REAL_PATHS)
async def test_a_timeout_is_the_same_on_every_path(path: str) -> None:
    said, last = await _real_second_run(path, _sleeps)
    assert said == (("started", 2), ("timed_out", 0.05, True))
    assert last is not None and last.outcome == "timed_out"
    assert last.error == "timed out after 0.05 s"


@pytest.mark.parametrize("path", REAL_PATHS)
async def test_a_run_that_swallows_our_cancel_succeeds_on_every_path(path: str) -> None:
    said, last = await _real_second_run(path, _swallows)
    assert said == (("started", 2), ("succeeded", "kept going"))
    assert last is not None and last.outcome == "succeeded"


@pytest.mark.parametrize("path", REAL_PATHS)
async def test_a_jobs_own_timeout_error_is_a_failure_on_every_path(path: str) -> None:
    said, last = await _real_second_run(path, _own_timeout)
    assert said == (("started", 2), ("failed", repr(TimeoutError("its own, not ours"))))
    assert last is not None and last.outcome == "failed"


@pytest.mark.parametrize("path", REAL_PATHS)
async def test_a_cancellation_from_outside_is_not_a_timeout_on_any_path(path: str) -> None:
    said, last = await _real_second_run(path, _sleeps, stop=True)
    assert said == (("started", 2), ("cancelled",))
    assert last is not None and last.outcome == "cancelled"
