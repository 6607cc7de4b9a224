"""Exactly once per slot with a ledger, on the fake clock: lagging replicas, catch-up after
downtime, fleet-wide history, and what happens when a run's lock is lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from cronlock import (
    InMemoryLocker,
    JobCancelled,
    JobSkipped,
    JobStarted,
    JobSucceeded,
    LockLost,
    RunContext,
    Scheduler,
    every,
)
from cronlock.testing import FakeClock, OffsetClock

from .conftest import T0, Recorder


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class _LockOnly:
    """A lock with no memory of slots: the gap a ledger closes."""

    def __init__(self) -> None:
        self.held: set[str] = set()

    async def acquire(self, job: str, slot: datetime) -> object:
        if job in self.held:
            return "locked"
        self.held.add(job)
        held = self.held

        class _Lease:
            async def release(self) -> None:
                held.discard(job)

        return _Lease()


async def _replicas(
    locker: object, clock: FakeClock, offsets: list[float], runs: list[datetime]
) -> list[Scheduler]:
    replicas = []
    for offset in offsets:
        s = Scheduler(clock=OffsetClock(offset, clock), locker=locker)  # type: ignore[arg-type]

        async def work(ctx: RunContext) -> None:
            runs.append(ctx.slot)
            await clock.sleep(0.001)

        s.add_job(work, every(1), name="tick")
        replicas.append(s)
    return replicas


@pytest.mark.parametrize(
    ("locker_factory", "duplicates"),
    [
        (_LockOnly, True),
        (InMemoryLocker, False),
    ],
)
async def test_lagging_replicas_duplicate_slots_without_a_ledger(
    clock: FakeClock, locker_factory: Callable[[], object], duplicates: bool
) -> None:
    runs: list[datetime] = []
    replicas = await _replicas(locker_factory(), clock, [0.0, -0.15, -0.3], runs)
    for s in replicas:
        await s.start()
    await clock.advance(20)
    for s in replicas:
        await s.shutdown()
    slots = set(runs)
    assert slots >= {at(k) for k in range(1, 20)}
    if duplicates:
        # The replica 150 ms behind finds the lock free again and runs the slot again.
        assert len(runs) >= 2 * len(slots) - 2
    else:
        assert sorted(runs) == sorted(slots)


async def test_first_replica_up_catches_up_a_slot_missed_by_all(clock: FakeClock) -> None:
    locker = InMemoryLocker()
    runs: list[tuple[str, datetime]] = []

    def replica(name: str) -> Scheduler:
        s = Scheduler(clock=clock, locker=locker)

        async def nightly(ctx: RunContext) -> None:
            runs.append((name, ctx.slot))

        s.add_job(nightly, every(hours=1), name="hourly", misfire_grace=timedelta(hours=1))
        return s

    a = replica("a")
    async with a:
        await clock.advance(timedelta(hours=2))  # runs 01:00 and 02:00
    # Every replica is down over 03:00 and 04:00 (a long deploy) ...
    await clock.advance(timedelta(hours=2, minutes=30))
    b, c = replica("b"), replica("c")
    rec = Recorder()
    c.subscribe(rec, JobSkipped)
    async with b, c:  # ... both come back at 04:30: 04:00 runs once, 03:00 coalesced
        await clock.advance(timedelta(minutes=40))
    assert runs == [
        ("a", T0 + timedelta(hours=1)),
        ("a", T0 + timedelta(hours=2)),
        ("b", T0 + timedelta(hours=4)),
        ("b", T0 + timedelta(hours=5)),
    ]
    # c lost both slots to b: to b's lock while b ran them, or to the ledger after.
    assert [e.slot for e in rec.events] == [  # type: ignore[attr-defined]
        T0 + timedelta(hours=4),
        T0 + timedelta(hours=5),
    ]
    assert {e.reason for e in rec.events} <= {"locked", "already_ran"}  # type: ignore[attr-defined]


async def test_a_slot_missed_beyond_grace_is_reported(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    locker = InMemoryLocker()
    first = Scheduler(clock=clock, locker=locker)
    first.add_job(_noop, every(hours=1), name="hourly", misfire_grace=60)
    async with first:
        await clock.advance(timedelta(hours=1))
    await clock.advance(timedelta(minutes=90))
    second = Scheduler(clock=clock, locker=locker)
    rec = Recorder()
    second.subscribe(rec)
    second.add_job(_noop, every(hours=1), name="hourly", misfire_grace=60)
    with caplog.at_level(logging.WARNING, logger="cronlock"):
        async with second:
            await clock.settle()
    assert [(e.slot, e.reason) for e in rec.of(JobSkipped)] == [  # type: ignore[attr-defined]
        (T0 + timedelta(hours=2), "misfire")
    ]
    assert rec.of(JobStarted) == []
    assert any("missed" in r.getMessage() for r in caplog.records)


async def test_a_job_the_ledger_never_saw_is_not_caught_up(clock: FakeClock) -> None:
    locker = InMemoryLocker()
    await clock.advance(timedelta(minutes=90))
    s = Scheduler(clock=clock, locker=locker)
    job = s.add_job(_noop, every(hours=1), name="new")
    async with s:
        await clock.settle()
    assert job.run_count == 0


async def test_last_success_is_fleet_wide(clock: FakeClock) -> None:
    locker = InMemoryLocker()
    a, b = Scheduler(clock=clock, locker=locker), Scheduler(clock=clock, locker=locker)
    a.add_job(_noop, every(10), name="j")
    job_b = b.add_job(_noop, every(10), name="j")
    await a.start()
    await clock.advance(30)  # a alone runs slots 10, 20, 30
    await b.start()
    await clock.settle()
    assert job_b.run_count == 0
    assert job_b.last_success is not None  # read from the ledger at start
    assert job_b.last_success.slot == at(30)
    await clock.advance(30)
    await a.shutdown()
    await b.shutdown()
    # Whichever replica ran 40..60, b learns of it when it loses a slot (one slot behind
    # at most: it reads the ledger as it loses, while the winner may still be running).
    assert job_b.last_success.slot >= at(50)


class _LosableLocker:
    """Grants leases that a test can break, as a killed database session would."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[BaseException | None], None]] = []
        self.released = 0

    async def acquire(self, job: str, slot: datetime) -> object:
        locker = self

        class _Lease:
            def on_lost(self, callback: Callable[[BaseException | None], None]) -> None:
                locker.callbacks.append(callback)

            async def release(self) -> None:
                locker.released += 1

        return _Lease()

    def break_all(self) -> None:
        for callback in self.callbacks:
            callback(ConnectionResetError("session terminated"))
        self.callbacks.clear()


async def test_lost_lock_cancels_the_run_by_default(clock: FakeClock) -> None:
    locker = _LosableLocker()
    s = Scheduler(clock=clock, locker=locker)  # type: ignore[arg-type]
    rec = Recorder()
    s.subscribe(rec)
    cleaned: list[bool] = []

    async def long_run() -> None:
        try:
            await clock.sleep(100)
        finally:
            cleaned.append(True)

    job = s.add_job(long_run, every(60), name="long")
    async with s:
        await clock.advance(70)
        locker.break_all()
        await clock.settle()
        assert not job.running
        [lost] = rec.of(LockLost)
        assert lost.slot == at(60)  # type: ignore[attr-defined]
        assert lost.finished_at == at(70)  # type: ignore[attr-defined]
        assert isinstance(lost.exception, ConnectionResetError)  # type: ignore[attr-defined]
        assert cleaned == [True]
        assert locker.released == 1
        assert job.last_run is not None
        assert job.last_run.outcome == "lock_lost"
        assert rec.of(JobCancelled) == []
        await clock.advance(50)  # the scheduler goes on: slot 120 runs
        assert job.run_count == 2


async def test_lost_lock_can_be_let_run_on(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    locker = _LosableLocker()
    s = Scheduler(clock=clock, locker=locker, on_lock_lost="continue")  # type: ignore[arg-type]
    rec = Recorder()
    s.subscribe(rec)

    async def long_run() -> None:
        await clock.sleep(30)

    s.add_job(long_run, every(60), name="long")
    with caplog.at_level(logging.ERROR, logger="cronlock"):
        async with s:
            await clock.advance(70)
            locker.break_all()
            await clock.advance(30)
    assert rec.of(LockLost) == []
    assert [e.finished_at for e in rec.of(JobSucceeded)] == [at(90)]  # type: ignore[attr-defined]
    assert any("lock was lost" in r.getMessage() for r in caplog.records)


async def _noop() -> None:
    await asyncio.sleep(0)


class _SwitchableElector:
    def __init__(self) -> None:
        self.leader = True
        self.callbacks: list[Callable[[BaseException | None], None]] = []

    async def is_leader(self) -> bool:
        return self.leader

    def on_demoted(self, callback: Callable[[BaseException | None], None]) -> None:
        self.callbacks.append(callback)

    def demote(self) -> None:
        self.leader = False
        for callback in self.callbacks:
            callback(None)


async def test_demotion_ends_coordinated_runs_only(clock: FakeClock) -> None:
    elector = _SwitchableElector()
    s = Scheduler(clock=clock, elector=elector)
    rec = Recorder()
    s.subscribe(rec)

    async def long_run() -> None:
        await clock.sleep(100)

    coordinated = s.add_job(long_run, every(60), name="coordinated")
    local = s.add_job(long_run, every(60), name="local", distributed=False)
    async with s:
        await clock.advance(70)
        elector.demote()
        await clock.settle()
        assert not coordinated.running
        assert local.running
        assert [(e.job, e.finished_at) for e in rec.of(LockLost)] == [  # type: ignore[attr-defined]
            ("coordinated", at(70))
        ]
        await clock.advance(60)  # slot 120: the follower skips the coordinated job
        skipped = {(e.job, e.reason) for e in rec.of(JobSkipped)}  # type: ignore[attr-defined]
        assert skipped == {("coordinated", "not_leader"), ("local", "overlap")}
        await s.shutdown(timeout=0)


class _LostAlready:
    """Grants holds already lost when the run starts (a claim made ahead of its slot whose
    session died while the run waited for it): ``on_lost`` says so, and calls back soon."""

    async def acquire(self, job: str, slot: datetime) -> object:
        class _Hold:
            def on_lost(self, callback: Callable[[BaseException | None], None]) -> bool:
                asyncio.get_running_loop().call_soon(callback, ConnectionResetError("gone"))
                return True

            async def release(self) -> None:
                pass

        return _Hold()


async def test_a_run_lost_before_its_body_began_says_so_without_an_error(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """No body ran, so nothing was "cancelled": a WARNING says the slot is owed, and no
    ERROR is logged (an on-call engineer's pager would ring for nothing)."""
    s = Scheduler(clock=clock, locker=_LostAlready())  # type: ignore[arg-type]
    rec = Recorder()
    s.subscribe(rec)
    bodies: list[datetime] = []

    async def job(ctx: RunContext) -> None:
        bodies.append(ctx.slot)

    s.add_job(job, every(60), name="never")
    with caplog.at_level(logging.INFO, logger="cronlock"):
        async with s:
            await clock.advance(61)
    assert bodies == []
    assert [e.slot for e in rec.of(LockLost)] == [at(60)]  # type: ignore[attr-defined]
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert not [m for level, m in said if level >= logging.ERROR], said
    assert any(
        level == logging.WARNING and "not begun" in m and "owed" in m for level, m in said
    ), said
