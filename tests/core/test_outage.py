"""Slots due while the locker's server cannot be reached run late, once, within their grace
(issue 35, item 1), on the fake clock at exact instants."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

import pytest

from cronlock import (
    InMemoryLocker,
    JobSkipped,
    JobStarted,
    LockError,
    LockUnavailable,
    RunContext,
    Scheduler,
    ServerError,
    SlotsDecided,
    every,
)
from cronlock._core.outage import RETRY_EVERY
from cronlock._locking.protocols import Hold, Refusal
from cronlock.testing import FakeClock

from .conftest import T0, Recorder


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class _Outage(InMemoryLocker):
    """A ledger locker whose server is unreachable while *down* (or fails with *error*)."""

    def __init__(self) -> None:
        super().__init__()
        self.error: LockError | None = None

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        if self.error is not None:
            raise self.error
        return await super().acquire(job, slot)


def _scheduler(clock: FakeClock, locker: InMemoryLocker, **options: object) -> tuple[
    Scheduler, list[datetime], Recorder
]:  # fmt: skip
    scheduler = Scheduler(clock=clock, locker=locker)
    runs: list[datetime] = []
    rec = Recorder()
    scheduler.subscribe(rec)

    async def work(ctx: RunContext) -> None:
        runs.append(ctx.slot)

    scheduler.add_job(work, every(10), name="report", **options)  # type: ignore[arg-type]
    return scheduler, runs, rec


async def test_a_slot_due_during_an_outage_runs_late_once_when_the_server_is_back(
    clock: FakeClock,
) -> None:
    locker = _Outage()
    scheduler, runs, rec = _scheduler(clock, locker)
    started: list[datetime] = []
    scheduler.subscribe(
        lambda e: started.append(clock.now()) if isinstance(e, JobStarted) else None
    )
    async with scheduler:
        await clock.advance(10)
        assert runs == [at(10)]
        locker.error = LockUnavailable("the server is down")
        await clock.advance(13)  # slot 20 fails at 20; the retries at 20.5 .. 23 fail too
        assert runs == [at(10)]
        locker.error = None
        await clock.advance(RETRY_EVERY)
        assert runs == [at(10), at(20)]  # late, once
        assert started[-1] == at(23 + RETRY_EVERY)
        await clock.advance(30)
    assert runs == [at(10), at(20), at(30), at(40), at(50)]
    assert not [e for e in rec.of(JobSkipped) if e.reason == "misfire"]  # type: ignore[attr-defined]


async def test_slots_owed_across_one_outage_coalesce_into_the_latest(clock: FakeClock) -> None:
    locker = _Outage()
    scheduler, runs, _ = _scheduler(clock, locker, overlap="allow")
    async with scheduler:
        locker.error = LockUnavailable("the server is down")
        await clock.advance(35)  # slots 10, 20 and 30 due while it is down
        locker.error = None
        await clock.advance(RETRY_EVERY)
        assert runs == [at(30)]
        await clock.advance(10)
    assert runs == [at(30), at(40)]


async def test_the_owed_slot_others_coalesced_into_is_claimed_again_when_refused_locked(
    clock: FakeClock,
) -> None:
    """Slots 10 and 20 are owed across an outage; 10 is told coalesced into 20. Once the
    server answers, 20's claim is refused "locked" (the job held for another slot: a claim
    stuck in the outage, answered late). It is owed again and claimed until it runs, so
    that slot 10 was not coalesced into nothing."""
    refused: list[datetime] = []

    class Busy(_Outage):
        async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
            if self.error is None and slot == at(20) and not refused:
                refused.append(slot)
                return "locked"
            return await super().acquire(job, slot)

    locker = Busy()
    scheduler, runs, rec = _scheduler(clock, locker, overlap="allow")
    async with scheduler:
        locker.error = LockUnavailable("the server is down")
        await clock.advance(25)  # slots 10 and 20 due while it is down
        locker.error = None
        await clock.advance(3 * RETRY_EVERY)
    assert refused == [at(20)]
    assert runs == [at(20)]
    told = [e for e in rec.of(SlotsDecided) if isinstance(e, SlotsDecided)]
    assert [(e.slot, e.fate, e.into) for e in told] == [(at(10), "coalesced", at(20))]


async def test_an_owed_slot_past_its_grace_is_reported_missed(clock: FakeClock) -> None:
    locker = _Outage()
    scheduler, runs, rec = _scheduler(clock, locker, misfire_grace=5)
    async with scheduler:
        locker.error = LockUnavailable("the server is down")
        await clock.advance(17)  # slot 10 is owed; its grace ends at 15
        locker.error = None
        await clock.advance(3)
    missed = [e for e in rec.of(JobSkipped) if e.reason == "misfire"]  # type: ignore[attr-defined]
    assert [e.slot for e in missed] == [at(10)]  # type: ignore[attr-defined]
    assert runs == [at(20)]


async def test_a_slot_another_replica_ran_meanwhile_is_not_run_again(clock: FakeClock) -> None:
    locker = _Outage()
    scheduler, runs, _ = _scheduler(clock, locker)
    async with scheduler:
        locker.error = LockUnavailable("this replica cannot reach the server")
        await clock.advance(10)
        # Another replica, which could reach it, claimed and ran the slot meanwhile.
        hold = await InMemoryLocker.acquire(locker, "report", at(10))
        assert isinstance(hold, Hold)
        await hold.release()
        locker.error = None
        await clock.advance(RETRY_EVERY)
    assert runs == []


async def test_a_refusal_of_the_server_is_not_owed(clock: FakeClock) -> None:
    """An error answer repeats (a schema problem, a read-only server): it is not retried
    as if the server were away."""
    locker = _Outage()
    scheduler, runs, _ = _scheduler(clock, locker)
    async with scheduler:
        locker.error = ServerError("permission denied")
        await clock.advance(10)
        locker.error = None
        await clock.advance(5)
    assert runs == []


async def test_the_end_of_an_outage_is_one_info_line_with_what_became_of_the_slots(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    locker = _Outage()
    scheduler, runs, _ = _scheduler(clock, locker, misfire_grace=15)
    scheduler.add_job(lambda: None, every(25), name="rare", misfire_grace=1)
    with caplog.at_level(logging.DEBUG, logger="cronlock"):
        async with scheduler:
            locker.error = LockUnavailable("the server is down")
            # report: slots 10 and 20 due (10 coalesces into 20); rare: slot 25 (grace 1 s)
            await clock.advance(27)
            locker.error = None
            await clock.advance(10)
    summaries = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert len(summaries) == 1, summaries
    assert "of 3 slot(s)" in summaries[0]
    assert "1 claimed late, 1 missed" in summaries[0]
    assert "1 coalesced" in summaries[0]
    assert at(20) in runs
    # Nothing above INFO but the missed slot's WARNING.
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1 and "missed" in loud[0], loud


class _Silent(_Outage):
    """While *silent*, a claim waits *hang* seconds for an answer, then fails."""

    def __init__(self, clock: FakeClock, hang: float) -> None:
        super().__init__()
        self.clock, self.hang, self.silent = clock, hang, False

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        if self.silent:
            await self.clock.sleep(self.hang)
            raise LockUnavailable("the statement timed out")
        return await super().acquire(job, slot)


async def test_slots_due_while_a_claim_hangs_are_owed_not_skipped_as_overlaps(
    clock: FakeClock,
) -> None:
    """A primary gone silent: slot 10's claim hangs 25 s. Slots 20 and 30 fall due while
    the run has not begun: they are owed (coalesced into the latest), not skipped as if the
    job ran; once the server answers, the latest runs, late, once."""
    locker = _Silent(clock, hang=25)
    scheduler, runs, rec = _scheduler(clock, locker)
    async with scheduler:
        await clock.advance(9)
        locker.silent = True
        await clock.advance(25)  # slots 20 and 30 owed while slot 10's claim hangs
        locker.silent = False  # the claim in flight still fails, at 35
        await clock.advance(2)
        assert runs == [at(30)]
        await clock.advance(10)
    assert runs == [at(30), at(40)]
    assert not [e for e in rec.of(JobSkipped) if e.reason == "overlap"]  # type: ignore[attr-defined]


class _SlowRelease:
    """A hold whose release waits on a silent server for *hang* seconds."""

    def __init__(self, inner: Hold, clock: FakeClock, hang: float) -> None:
        self.inner, self.clock, self.hang = inner, clock, hang

    async def release(self) -> None:
        await self.clock.sleep(self.hang)
        await self.inner.release()


async def test_slots_due_while_a_release_hangs_are_owed_not_skipped_as_overlaps(
    clock: FakeClock,
) -> None:
    """The run of slot 10 is done, but its release waits 25 s on a silent server: slots
    20 and 30 are not skipped as if the job ran; the latest runs once the release is
    answered."""
    locker = _Outage()
    hang = {"s": 0.0}

    class Slow(_Outage):
        async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
            got = await locker.acquire(job, slot)
            if isinstance(got, Hold) and hang["s"]:
                return _SlowRelease(got, clock, hang["s"])
            return got

    scheduler, runs, rec = _scheduler(clock, Slow())
    async with scheduler:
        hang["s"] = 25
        await clock.advance(11)  # slot 10 ran; its release hangs until 35
        hang["s"] = 0
        await clock.advance(26)
        assert runs == [at(10), at(30)]
        await clock.advance(10)
    assert runs == [at(10), at(30), at(40)]
    assert not [e for e in rec.of(JobSkipped) if e.reason == "overlap"]  # type: ignore[attr-defined]


async def test_missed_slots_are_said_coalesced_only_when_the_run_is_tried(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36, item 8: "coalesced into one run" was logged, then the run skipped as past
    its grace. A clock jump past the grace says the slots were skipped, once."""
    locker = _Outage()
    scheduler, runs, _ = _scheduler(clock, locker, misfire_grace=5)
    with caplog.at_level(logging.WARNING, logger="cronlock"):
        async with scheduler:
            await clock.advance(10)
            await clock.jump(37)  # slots 20, 30 and 40 pass unseen; 40 is 7 s late
            await clock.advance(1)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in said if "coalesced into one run" in m], said
    assert [m for m in said if "skipped" in m and "missed slots from" in m], said
    assert runs == [at(10)]


async def test_the_slot_missed_slots_coalesced_into_waits_for_the_run_here(
    clock: FakeClock,
) -> None:
    """The loop was held while a run of the job went on here (slot 10's, claimed before):
    slots 20 and 30 are due at once, 20 told coalesced into 30. Slot 30 waits for that run
    and runs after it, within its grace, rather than being skipped as an overlap (the
    slots told coalesced into it would have run nowhere)."""
    scheduler = Scheduler(clock=clock, locker=_Outage())
    runs: list[datetime] = []
    rec = Recorder()
    scheduler.subscribe(rec)
    release = asyncio.Event()

    async def work(ctx: RunContext) -> None:
        runs.append(ctx.slot)
        if ctx.slot == at(10):
            await release.wait()

    scheduler.add_job(work, every(10), name="report", misfire_grace=60)
    async with scheduler:
        await clock.advance(11)  # slot 10 runs, and goes on
        await clock.jump(25)  # the loop held: slots 20 and 30 due at once, at 36
        await clock.advance(1)
        assert runs == [at(10)]
        release.set()
        await clock.advance(1)
        assert runs == [at(10), at(30)]
    told = [e for e in rec.of(SlotsDecided) if isinstance(e, SlotsDecided)]
    assert [(e.slot, e.fate, e.into) for e in told] == [(at(20), "coalesced", at(30))]
    assert not [e for e in rec.of(JobSkipped) if e.slot == at(30)]  # type: ignore[attr-defined]
