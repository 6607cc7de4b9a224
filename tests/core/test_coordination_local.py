"""Lockers and electors as the scheduler uses them, within one process."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

import pytest

from cronlock import (
    Hold,
    InMemoryLocker,
    JobSkipped,
    JobStarted,
    LockError,
    LockFailed,
    RunContext,
    Scheduler,
    every,
)
from cronlock._cancel import finish_uncancellably
from cronlock.testing import FakeClock

from .conftest import T0, Recorder


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def test_replicas_sharing_a_locker_run_each_slot_once(clock: FakeClock) -> None:
    locker = InMemoryLocker()
    runs: list[tuple[str, datetime]] = []
    recorders = []
    replicas = []
    for name in ("r1", "r2", "r3"):
        s = Scheduler(clock=clock, locker=locker)
        rec = Recorder()
        s.subscribe(rec)
        recorders.append(rec)

        async def work(ctx: RunContext, name: str = name) -> None:
            runs.append((name, ctx.slot))
            await clock.sleep(1)

        s.add_job(work, every(10), name="shared")
        replicas.append(s)
    for s in replicas:
        await s.start()
    await clock.advance(60)
    for s in replicas:
        await s.shutdown()
    slots = [slot for _, slot in runs]
    assert sorted(slots) == [at(s) for s in range(10, 61, 10)]
    reasons = {e.reason for r in recorders for e in r.of(JobSkipped)}  # type: ignore[attr-defined]
    assert reasons <= {"locked", "already_ran"}
    assert len([e for r in recorders for e in r.of(JobSkipped)]) == 12


async def test_distributed_false_bypasses_the_locker(clock: FakeClock) -> None:
    locker = InMemoryLocker()
    runs = 0
    schedulers = [Scheduler(clock=clock, locker=locker) for _ in range(2)]
    for s in schedulers:

        async def work() -> None:
            nonlocal runs
            runs += 1

        s.add_job(work, every(10), name="local", distributed=False)
        await s.start()
    await clock.advance(10)
    for s in schedulers:
        await s.shutdown()
    assert runs == 2


async def test_per_job_locker_overrides_the_scheduler_one(clock: FakeClock) -> None:
    class Refuser:
        async def acquire(self, job: str, slot: datetime) -> Hold | None:
            return None

    s = Scheduler(clock=clock, locker=InMemoryLocker())
    rec = Recorder()
    s.subscribe(rec, JobSkipped)

    async def work() -> None:
        pass

    s.add_job(work, every(10), name="refused", locker=Refuser())
    async with s:
        await clock.advance(10)
    assert [(e.slot, e.reason) for e in rec.events] == [(at(10), "locked")]  # type: ignore[attr-defined]


class _FlakyLocker:
    def __init__(self) -> None:
        self.fail = True
        self.inner = InMemoryLocker()

    async def acquire(self, job: str, slot: datetime) -> object:
        if self.fail:
            raise LockError("database is down")
        return await self.inner.acquire(job, slot)


async def test_lock_failure_is_reported_and_the_scheduler_recovers(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    locker = _FlakyLocker()
    s = Scheduler(clock=clock, locker=locker)  # type: ignore[arg-type]
    rec = Recorder()
    s.subscribe(rec)

    async def work() -> None:
        pass

    s.add_job(work, every(10), name="j")
    with caplog.at_level(logging.ERROR, logger="cronlock"):
        async with s:
            await clock.advance(10)
            locker.fail = False
            await clock.advance(10)
    [failed] = rec.of(LockFailed)
    assert failed.slot == at(10)  # type: ignore[attr-defined]
    assert [e.slot for e in rec.of(JobStarted)] == [at(20)]  # type: ignore[attr-defined]
    assert any(r.levelno == logging.ERROR and "'j'" in r.getMessage() for r in caplog.records)


async def test_locked_skip_is_logged_at_debug_not_warning(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    locker = InMemoryLocker()
    a, b = Scheduler(clock=clock, locker=locker), Scheduler(clock=clock, locker=locker)

    async def work() -> None:
        await clock.sleep(1)

    for s in (a, b):
        s.add_job(work, every(10), name="j")
    with caplog.at_level(logging.DEBUG, logger="cronlock"):
        async with a, b:
            await clock.advance(10)
    lock_lines = [r for r in caplog.records if "lock" in r.getMessage() or "ran" in r.getMessage()]
    assert lock_lines
    assert all(r.levelno == logging.DEBUG for r in lock_lines)


async def test_elector_gates_coordinated_jobs_only(clock: FakeClock) -> None:
    class Follower:
        async def is_leader(self) -> bool:
            return False

    s = Scheduler(clock=clock, elector=Follower())
    rec = Recorder()
    s.subscribe(rec)
    ran: list[str] = []

    async def coordinated() -> None:
        ran.append("coordinated")

    async def local() -> None:
        ran.append("local")

    s.add_job(coordinated, every(10), name="c")
    s.add_job(local, every(10), name="l", distributed=False)
    async with s:
        await clock.advance(10)
    assert ran == ["local"]
    assert [(e.job, e.reason) for e in rec.of(JobSkipped)] == [("c", "not_leader")]  # type: ignore[attr-defined]


async def test_elector_failure_is_a_lock_failure(clock: FakeClock) -> None:
    class Broken:
        async def is_leader(self) -> bool:
            raise ConnectionError("gone")

    s = Scheduler(clock=clock, elector=Broken())
    rec = Recorder()
    s.subscribe(rec, LockFailed)

    async def work() -> None:
        pass

    s.add_job(work, every(10), name="c")
    async with s:
        await clock.advance(10)
    assert len(rec.events) == 1


class _CountingLocker:
    """Grants every lease and records releases, with a slow release."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.held = 0
        self.acquired = 0
        self.released = 0

    async def acquire(self, job: str, slot: datetime) -> Hold:
        self.held += 1
        self.acquired += 1
        locker = self

        class _Lease:
            async def release(self) -> None:
                for _ in range(3):  # await points where a cancel could land
                    await asyncio.sleep(0)
                locker.held -= 1
                locker.released += 1

        return _Lease()


async def test_lease_is_released_when_runs_are_cancelled(clock: FakeClock) -> None:
    locker = _CountingLocker(clock)
    s = Scheduler(clock=clock, locker=locker, stop_timeout=0)

    async def forever() -> None:
        await clock.sleep(10_000)

    s.add_job(forever, every(10), name="replace", overlap="replace")
    s.add_job(forever, every(10), name="stuck", timeout=3)
    async with s:
        await clock.advance(25)
    # replace@10 (replaced at 20), stuck@10 (timed out at 13), then replace@20 and
    # stuck@20 cancelled by the shutdown: four leases, all given back.
    assert locker.acquired == 4
    assert locker.released == 4
    assert locker.held == 0


async def test_finish_uncancellably_survives_repeated_cancels() -> None:
    finished = asyncio.Event()

    async def cleanup() -> None:
        await asyncio.sleep(0.05)
        finished.set()

    async def owner() -> None:
        await finish_uncancellably(cleanup())

    task = asyncio.create_task(owner())
    await asyncio.sleep(0)
    for _ in range(5):
        task.cancel()
        await asyncio.sleep(0.001)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()


async def test_finish_uncancellably_inside_a_timeout_reports_timeout() -> None:
    done: list[bool] = []

    async def cleanup() -> None:
        await asyncio.sleep(0.05)
        done.append(True)

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await finish_uncancellably(cleanup())
    assert done == [True]


async def test_in_memory_locker_refusals() -> None:
    locker = InMemoryLocker()
    lease = await locker.acquire("j", T0)
    assert lease is not None
    assert not isinstance(lease, str)
    assert await locker.acquire("j", at(1)) == "locked"
    await lease.release()
    assert await locker.acquire("j", T0) == "already_ran"
    second = await locker.acquire("j", at(1))
    assert second is not None
    assert not isinstance(second, str)
