"""Claims ahead of the slot (ClaimAheadLocker): the claim goes out early, the run starts on
the slot's instant, and nothing about which slots run changes.

On the fake clock at exact instants; the real server is in tests/postgres/test_fleet_clock.py.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from cronlock import (
    ClaimAheadLocker,
    Hold,
    InMemoryLocker,
    JobCancelled,
    JobSkipped,
    JobStarted,
    Refusal,
    Scheduler,
    every,
)
from cronlock._core.planner import CLAIM_COST, CROWD
from cronlock.testing import FakeClock

from .conftest import T0, Recorder


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class AheadLocker(InMemoryLocker):
    """An in-memory locker that claims *ahead* seconds early and notes when each claim came."""

    def __init__(self, clock: FakeClock, ahead: float = 0.1) -> None:
        super().__init__()
        self.clock, self.ahead = clock, ahead
        self.claims: list[tuple[datetime, datetime]] = []  # (when asked, slot)

    def claims_ahead(self) -> float:
        return self.ahead

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        self.claims.append((self.clock.now(), slot))
        return await super().acquire(job, slot)


def started(recorder: Recorder) -> list[tuple[datetime, datetime]]:
    """(slot, started) of every JobStarted."""
    return [(e.slot, e.started_at) for e in recorder.of(JobStarted)]  # type: ignore[attr-defined]


def ahead_scheduler(clock: FakeClock) -> tuple[AheadLocker, Scheduler, Recorder]:
    """A scheduler on an AheadLocker (0.1 s ahead), with a Recorder subscribed."""
    locker = AheadLocker(clock)
    scheduler = Scheduler(clock=clock, locker=locker)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    return locker, scheduler, recorder


async def test_the_claim_goes_out_ahead_and_the_run_starts_on_the_slot(clock: FakeClock) -> None:
    locker, scheduler, recorder = ahead_scheduler(clock)
    assert isinstance(locker, ClaimAheadLocker)

    async def tick() -> None:
        pass

    scheduler.add_job(tick, every(1), name="tick")
    async with scheduler:
        await clock.advance_to(at(0.95))
        assert locker.claims == [(at(0.9), at(1))]  # the first slot is claimed ahead too
        assert started(recorder) == []  # claimed, not started before its instant
        await clock.advance_to(at(3.5))
    assert locker.claims == [(at(s - 0.1), at(s)) for s in (1, 2, 3)]
    assert started(recorder) == [(at(s), at(s)) for s in (1, 2, 3)]


async def test_a_short_period_is_claimed_at_most_a_quarter_of_it_early(clock: FakeClock) -> None:
    locker = AheadLocker(clock, ahead=0.5)
    scheduler = Scheduler(clock=clock, locker=locker)

    async def tick() -> None:
        pass

    scheduler.add_job(tick, every(0.2), name="fast")
    async with scheduler:
        await clock.advance_to(at(0.65))
    assert locker.claims == [(at(s - 0.05), at(s)) for s in (0.2, 0.4, 0.6)]


async def test_a_job_still_running_here_is_claimed_at_its_slot(clock: FakeClock) -> None:
    locker, scheduler, recorder = ahead_scheduler(clock)

    async def slow() -> None:
        await clock.sleep(0.95)  # the run of slot 1 ends at 1.95, after slot 2's claim time

    scheduler.add_job(slow, every(1), name="slow")
    async with scheduler:
        await clock.advance_to(at(2.5))
    # Claimed at 1.9, slot 2 would have been skipped as an overlap; claimed at its slot it
    # finds the run of slot 1 over, and runs.
    assert locker.claims == [(at(0.9), at(1)), (at(2), at(2))]
    assert started(recorder) == [(at(1), at(1)), (at(2), at(2))]
    assert recorder.of(JobSkipped) == []


async def test_a_run_cancelled_while_it_waits_for_its_slot_is_recorded(clock: FakeClock) -> None:
    locker, scheduler, recorder = ahead_scheduler(clock)

    async def tick() -> None:
        raise AssertionError("a cancelled run must not start")

    job = scheduler.add_job(tick, every(1), name="tick")
    await scheduler.start()
    await clock.advance_to(at(0.95))  # claimed at 0.9, waiting for 1.0
    await scheduler.shutdown(timeout=0)  # no time left to wait: the run is cancelled
    cancelled = recorder.of(JobCancelled)
    assert [(e.job, e.slot) for e in cancelled] == [("tick", at(1))]  # type: ignore[attr-defined]
    assert job.last_run is not None and job.last_run.outcome == "cancelled"
    assert started(recorder) == []
    # The lease was released: another scheduler on this locker can take the job.
    assert await locker.acquire("tick", at(2)) is not None


async def test_run_now_of_a_jittered_job_starts_at_once(clock: FakeClock) -> None:
    _, scheduler, recorder = ahead_scheduler(clock)

    async def tick() -> None:
        pass

    job = scheduler.add_job(tick, every(3600), name="jittered", jitter=60)
    async with scheduler:
        await clock.advance(1)
        async with asyncio.timeout(10):  # (fails, not hangs, if the run waited for a jitter)
            await job.run_now()
    assert started(recorder) == [(at(1), at(1))]  # not at 1 s + its jitter


async def test_a_pause_after_the_claim_went_out_stops_the_slot(clock: FakeClock) -> None:
    locker, scheduler, recorder = ahead_scheduler(clock)

    async def tick() -> None:
        raise AssertionError("a slot paused before its instant must not start")

    job = scheduler.add_job(tick, every(1), name="tick")
    async with scheduler:
        await clock.advance_to(at(0.95))  # claimed at 0.9, waiting for 1.0
        assert locker.claims == [(at(0.9), at(1))]
        job.pause()  # 0.05 s before the slot
        await clock.advance_to(at(3.5))
    assert started(recorder) == []
    skipped = [(e.slot, e.reason) for e in recorder.of(JobSkipped)]  # type: ignore[attr-defined]
    assert skipped == [(at(1), "paused")]
    # The claim is given back as a run that never began: the ledger (here, last_run) says
    # so, and the lock is free for another replica's next slot.
    assert job.last_run is not None and job.last_run.outcome == "cancelled"
    assert job.run_count == 0
    assert locker.claims == [(at(0.9), at(1))]  # nothing claimed while paused
    assert await locker.acquire("tick", at(2)) is not None


async def test_a_resumed_job_runs_its_next_slot(clock: FakeClock) -> None:
    _, scheduler, recorder = ahead_scheduler(clock)

    async def tick() -> None:
        pass

    job = scheduler.add_job(tick, every(1), name="tick")
    async with scheduler:
        await clock.advance_to(at(0.95))
        job.pause()
        job.resume()  # before the slot: the slot claimed ahead runs after all
        await clock.advance_to(at(1.5))
    assert started(recorder) == [(at(1), at(1))]


class SlowLocker(InMemoryLocker):
    """Claims at the slot, and its claim takes 0.1 s (a round trip)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        await self.clock.sleep(0.1)
        return await super().acquire(job, slot)


async def test_a_pause_during_the_claims_round_trip_stops_the_slot(clock: FakeClock) -> None:
    scheduler = Scheduler(clock=clock, locker=SlowLocker(clock))
    recorder = Recorder()
    scheduler.subscribe(recorder)

    async def tick() -> None:
        raise AssertionError("a slot paused before it began must not start")

    job = scheduler.add_job(tick, every(1), name="tick")
    async with scheduler:
        await clock.advance_to(at(1.05))  # the claim of slot 1 is on its way
        job.pause()
        await clock.advance_to(at(2.5))
    assert started(recorder) == []
    skipped = [(e.slot, e.reason) for e in recorder.of(JobSkipped)]  # type: ignore[attr-defined]
    assert skipped == [(at(1), "paused")]


# -- crowds: many slots claimed ahead due at one instant open earlier ---------------------


def crowd_of(scheduler: Scheduler, count: int, interval: float) -> None:
    """*count* jobs ``every(interval)``, all due at the same instants."""

    async def tick() -> None:
        pass

    for i in range(count):
        scheduler.add_job(tick, every(interval), name=f"crowd-{i}")


async def test_a_crowd_is_claimed_earlier_and_each_run_starts_on_its_slot(
    clock: FakeClock,
) -> None:
    locker, scheduler, recorder = ahead_scheduler(clock)
    count = 400  # a crowd (CROWD and more): opened CLAIM_COST per entry earlier
    crowd_of(scheduler, count, 3600)
    lead = 0.1 + count * CLAIM_COST.total_seconds()
    async with scheduler:
        await clock.advance_to(at(3600 - lead - 0.001))
        assert locker.claims == []
        await clock.advance_to(at(3599.99))
        # Every claim went out at the crowd's opening, none ran before the slot.
        assert sorted({asked for asked, _ in locker.claims}) == [at(3600 - lead)]
        assert len(locker.claims) == count
        assert started(recorder) == []
        await clock.advance_to(at(3600.5))
    assert sorted(started(recorder)) == [(at(3600), at(3600))] * count
    assert recorder.of(JobSkipped) == []


async def test_a_few_slots_at_one_instant_are_not_a_crowd(clock: FakeClock) -> None:
    locker, scheduler, _ = ahead_scheduler(clock)
    crowd_of(scheduler, CROWD - 1, 3600)
    async with scheduler:
        await clock.advance_to(at(3600.5))
    assert {asked for asked, _ in locker.claims} == {at(3599.9)}  # claim_ahead alone


async def test_a_crowd_is_never_claimed_more_than_a_quarter_of_its_period_early(
    clock: FakeClock,
) -> None:
    locker, scheduler, recorder = ahead_scheduler(clock)
    # The crowd's lead (0.1 s + 0.16 s) reaches past a quarter of the period (0.125 s): its
    # slots are claimed at their own time, claim_ahead (0.1 s) before each.
    count = 400
    crowd_of(scheduler, count, 0.5)
    async with scheduler:
        await clock.advance_to(at(1.6))
    asked = sorted({(asked, slot) for asked, slot in locker.claims})
    assert asked == [(at(s - 0.1), at(s)) for s in (0.5, 1.0, 1.5)]
    assert len(locker.claims) == 3 * count
    assert sorted(started(recorder)) == sorted([(at(s), at(s)) for s in (0.5, 1.0, 1.5)] * count)


async def test_a_crowds_bookkeeping_is_forgotten_once_past(clock: FakeClock) -> None:
    # The planner counts the slots claimed ahead of each instant; a job with nobody to ask
    # firing at the same instants (the claim times) is the last of each one popped: what
    # was counted of the instant still goes once the run loop is past it (a thousand at a
    # time), else it would grow by one every slot.
    locker, scheduler, recorder = ahead_scheduler(clock)
    crowd_of(scheduler, 1, 0.5)
    local: list[datetime] = []

    async def tick() -> None:
        local.append(clock.now())

    anchor = at(0.4)  # slots at 0.4, 0.9, ...: the claims go out then
    scheduler.add_job(tick, every(0.5, anchor=anchor), name="local", distributed=False)
    async with scheduler:
        await clock.advance_to(at(1500.2))
        assert scheduler._loop is not None
        crowds = scheduler._loop._planner._crowds
        assert len(crowds) <= 1024 + 2, len(crowds)
    assert len(locker.claims) == 3000
    assert len(started(recorder)) == 2 * 3000
    assert local == [at(0.4 + i / 2) for i in range(3000)]  # on time, beside the claims


async def test_a_job_with_nobody_to_ask_does_not_hold_a_crowd_back(clock: FakeClock) -> None:
    locker, scheduler, recorder = ahead_scheduler(clock)
    count = 400
    crowd_of(scheduler, count, 3600)
    local: list[datetime] = []

    async def tick() -> None:
        local.append(clock.now())

    # Due when the crowd's claims would go out without a crowd (0.1 s before the slot).
    scheduler.add_job(tick, every(3600, anchor=at(3599.9)), name="local", distributed=False)
    lead = 0.1 + count * CLAIM_COST.total_seconds()
    async with scheduler:
        await clock.advance_to(at(3600.5))
    assert {asked for asked, _ in locker.claims} == {at(3600 - lead)}
    assert local == [at(3599.9)]
    assert len(started(recorder)) == count + 1
