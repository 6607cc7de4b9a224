"""A plain function's run that times out stays in flight until its thread returns (issue 36,
finding 7): a thread cannot be stopped, so the next slot must not start a second copy, and
the run's claim must not be released while the work goes on.

The job's thread blocks on a ``threading.Event`` the test sets. ``FakeClock.settle()`` waits
for worker threads in flight (a plain function's run takes no virtual time), so these tests
use a clock that settles without waiting for them: the only thread here is the blocked one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime, timedelta

import pytest

from cronlock import (
    InMemoryLocker,
    JobSkipped,
    JobStarted,
    JobSucceeded,
    JobTimedOut,
    RunContext,
    RunOverran,
    Scheduler,
    SystemClock,
)
from cronlock.testing import FakeClock

from ..eventually import eventually
from .conftest import T0, Recorder


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class ThreadBlindClock(FakeClock):
    """Settles when the event loop has nothing ready, whatever worker threads do."""

    async def settle(self) -> None:
        ready = asyncio.get_running_loop()._ready  # type: ignore[attr-defined]
        quiet = 0
        while quiet < 3:
            await asyncio.sleep(0)
            quiet = 0 if ready else quiet + 1


async def _until_overran(rec: Recorder, clock: FakeClock) -> None:
    await eventually(lambda: rec.of(RunOverran), limit=30, every=0.005)
    await clock.settle()  # the run's release, after its event


@pytest.mark.parametrize("locked", [False, True], ids=["no-locker", "in-memory-locker"])
async def test_a_timed_out_thread_keeps_its_run_in_flight_and_its_claim(locked: bool) -> None:
    clock = ThreadBlindClock(T0)
    locker = InMemoryLocker() if locked else None
    scheduler = Scheduler(clock=clock, locker=locker)
    rec = Recorder()
    scheduler.subscribe(rec)
    release = threading.Event()
    copies: list[datetime] = []

    @scheduler.every(10, name="stuck", timeout=5, overlap="skip")
    def stuck(ctx: RunContext) -> None:
        copies.append(ctx.slot)
        release.wait(60)

    job = scheduler.get_job("stuck")
    try:
        async with scheduler:
            await clock.advance(10)
            await eventually(lambda: copies, limit=30, every=0.005)  # slot 10's thread began
            await clock.advance(15)  # it times out at 15; slot 20 falls due
            [timed_out] = rec.of(JobTimedOut)
            assert (timed_out.slot, timed_out.finished_at) == (at(10), at(15))  # type: ignore[attr-defined]
            assert job.last_run is not None and job.last_run.outcome == "timed_out"
            # The thread still runs: the run is in flight, slot 20 skipped as an overlap.
            assert copies == [at(10)]
            assert job.running
            assert [(e.slot, e.reason) for e in rec.of(JobSkipped)] == [(at(20), "overlap")]  # type: ignore[attr-defined]
            if locker is not None:  # its claim is held: no other scheduler may run the job
                assert await locker.acquire("stuck", at(25)) == "locked"
            assert not rec.of(RunOverran)

            release.set()
            await _until_overran(rec, clock)
            assert not job.running
            if locker is not None:  # released once the thread returned
                hold = await locker.acquire("stuck", at(25))
                assert hold is not None and not isinstance(hold, str)
                await hold.release()
            await clock.advance(5)  # slot 30 runs: one copy at a time
            await eventually(lambda: rec.of(JobSucceeded), limit=30, every=0.005)
            assert copies == [at(10), at(30)]
    finally:
        release.set()
    [overran] = rec.of(RunOverran)
    assert isinstance(overran, RunOverran)
    assert (overran.slot, overran.started_at, overran.timeout) == (at(10), at(10), 5)
    assert overran.returned_at == at(25)
    assert overran.overran == 10  # returned at 25, its deadline was 15
    assert [e.slot for e in rec.of(JobSucceeded)] == [at(30)]


async def test_queue_runs_the_pending_slot_once_the_thread_returns() -> None:
    clock = ThreadBlindClock(T0)
    scheduler = Scheduler(clock=clock)
    rec = Recorder()
    scheduler.subscribe(rec)
    release = threading.Event()
    copies: list[datetime] = []

    @scheduler.every(10, name="queued", timeout=5, overlap="queue")
    def queued(ctx: RunContext) -> None:
        copies.append(ctx.slot)
        if ctx.run_number == 1:
            release.wait(60)

    try:
        async with scheduler:
            await clock.advance(10)
            await eventually(lambda: copies, limit=30, every=0.005)
            await clock.advance(15)
            assert copies == [at(10)]  # slot 20 waits in the queue
            release.set()
            await _until_overran(rec, clock)
            await eventually(lambda: rec.of(JobSucceeded), limit=30, every=0.005)
            assert copies == [at(10), at(20)]
    finally:
        release.set()
    assert [e.slot for e in rec.of(JobStarted)] == [at(10), at(20)]  # type: ignore[attr-defined]


async def test_run_now_returns_the_timeout_while_the_thread_goes_on() -> None:
    clock = ThreadBlindClock(T0)
    scheduler = Scheduler(clock=clock)
    rec = Recorder()
    scheduler.subscribe(rec)
    release = threading.Event()

    began = threading.Event()

    @scheduler.every(3600, name="manual", timeout=5)
    def manual() -> None:
        began.set()
        release.wait(60)

    job = scheduler.get_job("manual")
    try:
        async with scheduler:
            asked = asyncio.create_task(job.run_now())
            await eventually(began.is_set, limit=30, every=0.005)
            await clock.advance(5)
            event = await asked
            assert isinstance(event, JobTimedOut)
            assert job.running  # its thread goes on, and so does the run
            release.set()
            await _until_overran(rec, clock)
            assert not job.running
    finally:
        release.set()


async def test_shutdown_does_not_wait_for_a_stuck_thread_past_stop_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ThreadBlindClock(T0)
    locker = InMemoryLocker()
    scheduler = Scheduler(clock=clock, locker=locker, stop_timeout=30)
    rec = Recorder()
    scheduler.subscribe(rec)
    release = threading.Event()

    began = threading.Event()

    @scheduler.every(10, name="stuck", timeout=5)
    def stuck() -> None:
        began.set()
        release.wait(60)

    try:
        with caplog.at_level(logging.WARNING, logger="cronlock"):
            async with scheduler:
                await clock.advance(10)
                await eventually(began.is_set, limit=30, every=0.005)
                await clock.advance(6)
                assert await locker.acquire("stuck", at(100)) == "locked"
            # Shut down: stop_timeout passed (virtual), the wait for the thread is given up
            # and the claim released; the thread goes on in the background.
            assert clock.now() == at(46)
            hold = await locker.acquire("stuck", at(100))
            assert hold is not None and not isinstance(hold, str)
            await hold.release()
    finally:
        release.set()
    assert not rec.of(RunOverran)
    assert "its claim is released, the thread goes on" in caplog.text


async def test_the_direct_path_keeps_a_timed_out_thread_in_flight() -> None:
    # On the real clock with no locker, runs take the executor's direct path.
    scheduler = Scheduler(clock=SystemClock())
    rec = Recorder()
    scheduler.subscribe(rec)
    release = threading.Event()
    copies: list[datetime] = []

    @scheduler.every(0.05, name="stuck", timeout=0.05, overlap="skip")
    def stuck(ctx: RunContext) -> None:
        copies.append(ctx.slot)
        release.wait(60)

    job = scheduler.get_job("stuck")
    try:
        async with scheduler, asyncio.timeout(60):  # a liveness guard, not a timing
            while len(rec.of(JobSkipped)) < 2 or not rec.of(JobTimedOut):
                await asyncio.sleep(0.01)
            assert len(copies) == 1
            assert job.running
            job.pause()
            release.set()
            while not rec.of(RunOverran):
                await asyncio.sleep(0.01)
            assert not job.running
    finally:
        release.set()
    assert {e.reason for e in rec.of(JobSkipped)} == {"overlap"}
    assert len(rec.of(RunOverran)) == 1
