"""Every slot that did not simply run is told once, with its fate, by one account
(DESIGN.md §3a): the :class:`SlotsDecided` event and the locker's record say the same. On
the fake clock at exact instants."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from cronlock import (
    InMemoryLocker,
    JobSkipped,
    LockUnavailable,
    RunContext,
    ScheduleError,
    Scheduler,
    SlotsDecided,
    cron,
    every,
)
from cronlock._core.outage import RETRY_EVERY
from cronlock._locking.protocols import Hold, Refusal, SlotRecordingLocker
from cronlock.testing import FakeClock

from .conftest import T0, Recorder

MICRO = timedelta(microseconds=1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class _Recording(InMemoryLocker):
    """A ledger locker that records fates (as PostgresLocker does), and whose server can be
    made unreachable."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, datetime, datetime, str, str, datetime | None]] = []
        self.specs: dict[str, str | None] = {}
        self.down = False

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        if self.down:
            raise LockUnavailable("the server is down")
        return await super().acquire(job, slot)

    def describe_slots(self, job: str, spec: str | None) -> None:
        self.specs[job] = spec

    def record_slots(
        self,
        job: str,
        first: datetime,
        last: datetime,
        fate: str,
        reason: str,
        into: datetime | None,
    ) -> None:
        self.records.append((job, first, last, fate, reason, into))


def _told(rec: Recorder) -> list[tuple[datetime, datetime, int, str, datetime | None]]:
    events: list[Any] = rec.of(SlotsDecided)
    return [(e.slot, e.last, e.count, e.fate, e.into) for e in events]


def _same(locker: _Recording, rec: Recorder) -> None:
    """The records are the events: one account."""
    events: list[Any] = rec.of(SlotsDecided)
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in locker.records] == [
        (e.slot, e.last, e.fate, e.reason, e.into) for e in events
    ]


def _scheduler(clock: FakeClock, locker: _Recording, **options: Any) -> tuple[
    Scheduler, list[datetime], Recorder
]:  # fmt: skip
    scheduler = Scheduler(clock=clock, locker=locker)
    runs: list[datetime] = []
    rec = Recorder()
    scheduler.subscribe(rec)

    async def work(ctx: RunContext) -> None:
        runs.append(ctx.slot)

    scheduler.add_job(work, every(10), name="report", **options)
    return scheduler, runs, rec


def test_a_ledger_locker_that_records_fates_is_wired_to_the_account() -> None:
    assert isinstance(_Recording(), SlotRecordingLocker)
    assert not isinstance(InMemoryLocker(), SlotRecordingLocker)


async def test_slots_passed_unseen_within_their_grace_coalesce_into_the_latest(
    clock: FakeClock,
) -> None:
    locker = _Recording()
    scheduler, runs, rec = _scheduler(clock, locker, misfire_grace=30)
    async with scheduler:
        await clock.advance(10)
        await clock.jump(25)  # slots 20 and 30 pass while the loop is held; 30 is 5 s late
        await clock.advance(1)
    assert runs == [at(10), at(30)]
    assert _told(rec) == [(at(20), at(30) - MICRO, 1, "coalesced", at(30))]
    _same(locker, rec)


async def test_slots_passed_unseen_past_their_grace_are_missed_in_one_account(
    clock: FakeClock,
) -> None:
    locker = _Recording()
    scheduler, runs, rec = _scheduler(clock, locker, misfire_grace=5)
    async with scheduler:
        await clock.advance(10)
        await clock.jump(37)  # slots 20, 30 and 40 pass unseen; 40 is 7 s late
        await clock.advance(1)
    assert runs == [at(10)]
    assert _told(rec) == [(at(20), at(40), 3, "missed", None)]
    assert locker.records[0][4] == "fired 7.0s late here, past misfire_grace (5.0s)"
    _same(locker, rec)


async def test_a_slot_skipped_while_the_job_runs_is_told_skipped(clock: FakeClock) -> None:
    locker = _Recording()
    scheduler = Scheduler(clock=clock, locker=locker)
    rec = Recorder()
    scheduler.subscribe(rec)

    async def slow() -> None:
        await clock.sleep(25)

    scheduler.add_job(slow, every(10), name="slow", overlap="skip")

    async with scheduler:
        await clock.advance(45)
        await asyncio.sleep(0)
    assert _told(rec) == [
        (at(20), at(20), 1, "skipped", None),
        (at(30), at(30), 1, "skipped", None),
    ]
    assert {r[4] for r in locker.records} == {"overlap='skip': the job was still running"}
    _same(locker, rec)


async def test_slots_owed_across_an_outage_coalesce_into_the_latest(
    clock: FakeClock,
) -> None:
    locker = _Recording()
    scheduler, runs, rec = _scheduler(clock, locker, misfire_grace=15)
    async with scheduler:
        await clock.advance(10)
        locker.down = True
        await clock.advance(12)  # slot 20 is owed
        await clock.advance(10)  # slot 30 too: 20 coalesces into it
        locker.down = False
        await clock.advance(RETRY_EVERY)
        assert runs == [at(10), at(30)]
    assert _told(rec) == [(at(20), at(20), 1, "coalesced", at(30))]
    assert locker.records[0][4] == "owed: the locker's server could not be reached"
    _same(locker, rec)


async def test_a_slot_owed_past_its_grace_is_missed(clock: FakeClock) -> None:
    locker = _Recording()
    scheduler, runs, rec = _scheduler(clock, locker, misfire_grace=5)
    async with scheduler:
        await clock.advance(10)
        locker.down = True
        await clock.advance(16)  # slot 20 is owed, and missed once 5 s late
        locker.down = False
        await clock.advance(10)
    assert runs == [at(10), at(30)]
    assert _told(rec) == [(at(20), at(20), 1, "missed", None)]
    reason = "owed: the locker's server could not be reached until past misfire_grace (5.0s)"
    assert locker.records[0][4] == reason
    _same(locker, rec)


async def test_slots_no_replica_ran_are_coalesced_or_missed_by_catch_up(
    clock: FakeClock,
) -> None:
    locker = _Recording()

    def replica() -> tuple[Scheduler, Recorder]:
        s = Scheduler(clock=clock, locker=locker)
        s.add_job(print, every(hours=1), name="hourly", misfire_grace=timedelta(hours=1))
        rec = Recorder()
        s.subscribe(rec)
        return s, rec

    a, _ = replica()
    async with a:
        await clock.advance(timedelta(hours=1, seconds=1))  # runs 01:00
    await clock.advance(timedelta(hours=2, minutes=30))  # the fleet is down over 02:00, 03:00
    b, rec = replica()
    async with b:  # back at 03:30: 03:00 runs, 02:00 is coalesced into it
        await clock.advance(1)
    hour = timedelta(hours=1)
    assert _told(rec) == [(T0 + 2 * hour, T0 + 3 * hour - MICRO, 1, "coalesced", T0 + 3 * hour)]
    assert locker.records[0][4] == "no replica ran them; caught up by one run of the latest"


async def test_the_locker_is_told_how_to_rebuild_the_slots(clock: FakeClock) -> None:
    locker = _Recording()
    scheduler = Scheduler(clock=clock, locker=locker, tz="Europe/Berlin")
    scheduler.add_job(print, cron("0 3 * * *"), name="nightly", jitter=30, misfire_grace=600)
    scheduler.add_job(print, every(5), name="often")
    async with scheduler:
        await clock.advance(1)
    nightly = json.loads(locker.specs["nightly"] or "null")
    assert nightly == {
        "schedule": {"kind": "cron", "expr": "0 3 * * *", "seconds": False,
                     "tz": "Europe/Berlin"},
        "jitter": 30.0,
        "misfire_grace": 600.0,
        "start_at": None,
        "stop_at": None,
    }  # fmt: skip
    often = json.loads(locker.specs["often"] or "null")
    assert often["schedule"] == {
        "kind": "every",
        "micros": 5_000_000,
        "anchor": "1970-01-01T00:00:00+00:00",
    }


# -- catch_up="all" ----------------------------------------------------------------------------


def _each(clock: FakeClock, locker: _Recording, **options: Any) -> tuple[
    Scheduler, list[tuple[datetime, datetime]], Recorder
]:  # fmt: skip
    """A job of every 10 s asking for every owed slot; each run takes 2 s and says (its slot,
    when it began)."""
    scheduler = Scheduler(clock=clock, locker=locker)
    runs: list[tuple[datetime, datetime]] = []
    rec = Recorder()
    scheduler.subscribe(rec)

    async def rollup(ctx: RunContext) -> None:
        runs.append((ctx.slot, clock.now()))
        await clock.sleep(2)

    scheduler.add_job(rollup, every(10), name="rollup", catch_up="all", **options)
    return scheduler, runs, rec


async def test_catch_up_all_runs_each_slot_passed_unseen_in_order(clock: FakeClock) -> None:
    locker = _Recording()
    scheduler, runs, rec = _each(clock, locker, misfire_grace=30)
    async with scheduler:
        await clock.advance(10)
        await clock.jump(45)  # slots 20 .. 50 pass while the loop is held; 20 is 35 s late
        await clock.advance(20)
    assert runs == [
        (at(10), at(10)),
        (at(30), at(55)),  # one after another, oldest first, each within its grace
        (at(40), at(57)),
        (at(50), at(59)),
        (at(60), at(61)),  # the slot due meanwhile waits its turn
        (at(70), at(70)),
    ]
    assert _told(rec) == [(at(20), at(30) - MICRO, 1, "missed", None)]  # past its grace
    _same(locker, rec)


async def test_catch_up_all_runs_each_slot_owed_across_an_outage(clock: FakeClock) -> None:
    locker = _Recording()
    scheduler, runs, rec = _each(clock, locker, misfire_grace=60)
    async with scheduler:
        await clock.advance(10)
        locker.down = True
        await clock.advance(25)  # 20 and 30 are owed
        locker.down = False
        await clock.advance(10)
    assert [slot for slot, _ in runs] == [at(10), at(20), at(30), at(40)]
    assert [began for _, began in runs][1:3] == [at(35.5), at(37.5)]  # the retry's beat
    assert _told(rec) == []  # nothing coalesced, nothing missed


async def test_catch_up_all_runs_each_slot_no_replica_ran(clock: FakeClock) -> None:
    locker = _Recording()
    first, runs, _ = _each(clock, locker, misfire_grace=3600)
    async with first:
        await clock.advance(11)  # runs 10
    await clock.advance(30)  # the fleet is down over 20, 30 and 40
    again, runs_again, rec = _each(clock, locker, misfire_grace=3600)
    async with again:
        await clock.advance(10)
    assert [slot for slot, _ in runs] == [at(10)]
    assert [slot for slot, _ in runs_again] == [at(20), at(30), at(40), at(50)]
    assert _told(rec) == []


def test_catch_up_is_checked_where_the_job_is_defined() -> None:
    scheduler = Scheduler()
    with pytest.raises(ScheduleError) as info:
        scheduler.add_job(print, every(10), name="rollup", catch_up="every")  # type: ignore[arg-type]
    assert str(info.value) == "job 'rollup': catch_up must be 'latest' or 'all', got 'every'"
    with pytest.raises(ScheduleError) as info:
        scheduler.add_job(print, every(10), name="rollup", catch_up="all", overlap="replace")
    assert "job 'rollup': catch_up='all' cannot hold with overlap='replace'" in str(info.value)
    job = scheduler.add_job(print, every(10), name="rollup", catch_up="all")
    assert job.catch_up == "all"
    assert scheduler.add_job(print, every(10), name="other").catch_up == "latest"


async def test_a_slot_falling_due_between_planning_and_catch_up_leaves_the_older_one_caught_up(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first slots are planned an instant before catch-up reads the time: a slot that
    falls due in between is the run loop's, and the slots before it are caught up by its
    run (they were reported missed, as a gap past misfire_grace, and nothing ran them)."""
    from cronlock._core.runloop import RunLoop

    locker = _Recording()
    first, _, _ = _each(clock, locker, misfire_grace=3600)
    async with first:
        await clock.advance(11)  # runs 10
    await clock.advance_to(at(39.9))  # the fleet is down over 20 and 30
    start = RunLoop.start

    def planned_then_late(self: RunLoop, catch_up: Any = ()) -> None:
        clock._now += timedelta(seconds=0.2)  # slot 40 falls due after it was planned
        start(self, catch_up)

    monkeypatch.setattr(RunLoop, "start", planned_then_late)
    again = Scheduler(clock=clock, locker=locker)
    latest: list[datetime] = []

    async def rollup(ctx: RunContext) -> None:
        latest.append(ctx.slot)

    again.add_job(rollup, every(10), name="rollup", misfire_grace=3600)
    rec = Recorder()
    again.subscribe(rec)
    async with again:
        await clock.advance(1)
    assert latest == [at(40)]  # on time, and catching up on 20 and 30
    assert _told(rec) == [(at(20), at(40) - MICRO, 2, "coalesced", at(40))]
    assert not [e for e in rec.events if isinstance(e, JobSkipped)]
