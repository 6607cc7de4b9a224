"""The scheduler's answer to a crashed run, on the fake clock: ``JobCrashed`` and the one
rule of a rerun (``recover=True``, not paused, a first attempt, within ``misfire_grace``).

The locker here reports crashes when told to; finding them is the PostgreSQL locker's job
(tests/postgres/test_crashed.py).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest

from cronlock import (
    CrashWatchingLocker,
    FailoverWatchingLocker,
    InMemoryLocker,
    JobCrashed,
    JobStarted,
    RunContext,
    RunRecord,
    RunRestored,
    ScheduleError,
    Scheduler,
    SlotRanTwice,
    every,
)
from cronlock._locking.protocols import CrashCallback, FailoverCallback, Hold, Refusal
from cronlock.testing import FakeClock

from .conftest import T0, Recorder

SLOT = T0 + timedelta(minutes=30)  # a crashed run of another replica


class _Watching:
    """An in-memory locker that reports the crashes a test makes up."""

    def __init__(self) -> None:
        self._inner = InMemoryLocker()
        self.callbacks: list[CrashCallback] = []
        self.acquired: list[tuple[str, datetime]] = []

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        self.acquired.append((job, slot))
        return await self._inner.acquire(job, slot)

    def on_crashed(self, callback: CrashCallback) -> None:
        self.callbacks.append(callback)

    def crash(self, job: str, slot: datetime = SLOT, attempt: int = 1) -> list[bool]:
        record = RunRecord(slot, slot, slot, "crashed", None, "other-host:4242", attempt)
        return [callback(job, record) for callback in self.callbacks]


def _scheduler(
    clock: FakeClock, locker: _Watching, runs: list[datetime], **options: object
) -> Scheduler:
    scheduler = Scheduler(clock=clock, locker=locker)

    async def work(ctx: RunContext) -> None:
        runs.append(ctx.slot)

    scheduler.add_job(work, every(hours=1), name="job", **options)  # type: ignore[arg-type]
    return scheduler


def test_the_recover_option_is_a_bool(scheduler: Scheduler) -> None:
    assert scheduler.add_job(lambda: None, every(10), name="default").recover is False
    with pytest.raises(ScheduleError, match="recover"):
        scheduler.add_job(lambda: None, every(10), name="bad", recover="yes")  # type: ignore[arg-type]


async def test_a_crash_within_the_grace_is_rerun_at_its_slot(clock: FakeClock) -> None:
    locker = _Watching()
    assert isinstance(locker, CrashWatchingLocker)
    runs: list[datetime] = []
    scheduler = _scheduler(clock, locker, runs, recover=True, misfire_grace=60)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    async with scheduler:
        await clock.advance_to(SLOT + timedelta(seconds=60))  # exactly the grace: still in
        assert locker.crash("job") == [True]
        await clock.advance(1)
    assert runs == [SLOT]
    assert ("job", SLOT) in locker.acquired
    [crashed] = recorder.of(JobCrashed)
    assert crashed == JobCrashed("job", SLOT, "other-host:4242", SLOT, recovered=True)
    [started] = recorder.of(JobStarted)
    assert started.slot == SLOT  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "late", "attempt", "pause"),
    [
        pytest.param({"recover": False}, 5, 1, False, id="recover-off"),
        pytest.param({"recover": True, "misfire_grace": 60}, 60.001, 1, False, id="past-grace"),
        pytest.param({"recover": True}, 5, 2, False, id="already-a-rerun"),
        pytest.param({"recover": True}, 5, 1, True, id="paused"),
    ],
)
async def test_a_crash_is_reported_and_not_rerun(
    clock: FakeClock, options: dict[str, object], late: float, attempt: int, pause: bool
) -> None:
    locker = _Watching()
    runs: list[datetime] = []
    scheduler = _scheduler(clock, locker, runs, **options)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    async with scheduler:
        if pause:
            scheduler.get_job("job").pause()
        await clock.advance_to(SLOT + timedelta(seconds=late))
        assert locker.crash("job", attempt=attempt) == [False]
        await clock.advance(1)
    assert runs == []
    [crashed] = recorder.of(JobCrashed)
    assert crashed.recovered is False  # type: ignore[attr-defined]


async def test_crashes_of_other_jobs_or_while_stopped_are_not_reported(
    clock: FakeClock,
) -> None:
    locker = _Watching()
    runs: list[datetime] = []
    scheduler = _scheduler(clock, locker, runs, recover=True)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    assert locker.crash("job") == [False]  # not started
    async with scheduler:
        assert locker.crash("another-job") == [False]
    assert locker.crash("job") == [False]  # stopped
    assert recorder.of(JobCrashed) == []
    assert runs == []


def test_a_scheduler_registers_once_per_locker(clock: FakeClock) -> None:
    locker = _Watching()
    scheduler = _scheduler(clock, locker, [])
    for name in ("b", "c"):
        scheduler.add_job(lambda: None, every(10), name=name)
    scheduler.add_job(lambda: None, every(10), name="local", distributed=False)
    assert len(locker.callbacks) == 1
    other = Scheduler(clock=clock, locker=locker)
    other.add_job(lambda: None, every(10), name="x")
    assert len(locker.callbacks) == 2


class _FailingOver(_Watching):
    """It also reports, when told, what a failover lost and it wrote back."""

    def __init__(self) -> None:
        super().__init__()
        self.failover: list[FailoverCallback] = []

    def on_failover(self, callback: FailoverCallback) -> None:
        self.failover.append(callback)


async def test_runs_written_back_and_slots_run_twice_are_events_and_metrics(
    clock: FakeClock,
) -> None:
    from prometheus_client import CollectorRegistry

    from cronlock.prometheus import instrument

    locker = _FailingOver()
    assert isinstance(locker, FailoverWatchingLocker)
    scheduler = _scheduler(clock, locker, [])
    recorder = Recorder()
    scheduler.subscribe(recorder)
    registry = CollectorRegistry()
    instrument(scheduler, registry)
    async with scheduler:
        assert len(locker.failover) == 1  # registered once, at start
        for callback in locker.failover:
            callback("job", SLOT, None)
            callback("job", SLOT, "cronlock:other:42:beef")
            callback("gone", SLOT, None)  # not this scheduler's job: no event
        await clock.advance(1)
    assert [e for e in recorder.events if isinstance(e, RunRestored | SlotRanTwice)] == [
        RunRestored("job", SLOT),
        SlotRanTwice("job", SLOT, "cronlock:other:42:beef"),
    ]
    assert registry.get_sample_value("cronlock_runs_restored_total", {"cronlock_job": "job"}) == 1
    assert registry.get_sample_value("cronlock_slots_ran_twice_total", {"cronlock_job": "job"}) == 1


async def test_a_run_whose_lock_was_lost_before_it_began_runs_again_without_recover(
    clock: FakeClock,
) -> None:
    """Claimed ahead, its lock lost while it waited for its slot: nothing ran, so the slot
    is claimed again (the takeover) though the job did not opt in to recovery; a run that
    had begun is not."""
    from cronlock._records import NEVER_BEGAN

    locker = _Watching()
    runs: list[datetime] = []
    scheduler = _scheduler(clock, locker, runs, misfire_grace=60)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    async with scheduler:
        await clock.advance_to(SLOT + timedelta(seconds=10))
        never = RunRecord(SLOT, SLOT, SLOT, "lock_lost", NEVER_BEGAN, "me:1", 1)
        began = RunRecord(SLOT, SLOT, SLOT, "lock_lost", None, "me:1", 1)
        assert [cb("job", began) for cb in locker.callbacks] == [False]
        assert [cb("job", never) for cb in locker.callbacks] == [True]
        await clock.advance(1)
    assert runs == [SLOT]
    # The run that began is reported as any run cut off is; the one that never began not.
    assert [e.recovered for e in recorder.of(JobCrashed)] == [False]  # type: ignore[attr-defined]


async def test_a_run_lost_before_it_began_coalesces_into_a_later_slot_fired_since(
    clock: FakeClock,
) -> None:
    """Its loss is written (and told) once the server answers again, after an outage: the
    job fired later slots meanwhile, so the lost slot coalesces into them, as a slot owed
    across an outage does; it is not run after them, nor skipped "while running"."""
    from cronlock import JobSkipped
    from cronlock._records import NEVER_BEGAN

    locker = _Watching()
    runs: list[datetime] = []
    scheduler = Scheduler(clock=clock, locker=locker)

    async def work(ctx: RunContext) -> None:
        runs.append(ctx.slot)

    scheduler.add_job(work, every(10), name="job", misfire_grace=60)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    lost = T0 + timedelta(seconds=10)
    async with scheduler:
        await clock.advance_to(T0 + timedelta(seconds=35))
        assert runs == [lost, lost + timedelta(seconds=10), lost + timedelta(seconds=20)]
        told = len(recorder.events)
        never = RunRecord(lost, lost, lost, "lock_lost", NEVER_BEGAN, "me:1", 1)
        assert [cb("job", never) for cb in locker.callbacks] == [False]
        await clock.advance(1)
    assert runs == [lost, lost + timedelta(seconds=10), lost + timedelta(seconds=20)]
    assert [e for e in recorder.events[told:] if getattr(e, "slot", None) == lost] == []
    assert recorder.of(JobSkipped) == []


class _SlowThenLocked(_Watching):
    """Claims of *slow* hang *hang* seconds; the first *refusals* claims of *locked* are
    refused ``"locked"`` (another replica runs the job at that moment)."""

    def __init__(
        self, clock: FakeClock, *, slow: datetime, hang: float, locked: datetime, refusals: int
    ) -> None:
        super().__init__()
        self.clock, self.slow, self.hang = clock, slow, hang
        self.locked, self.refusals = locked, refusals

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        if slot == self.slow:
            await self.clock.sleep(self.hang)
        if slot == self.locked and self.refusals > 0:
            self.refusals -= 1
            self.acquired.append((job, slot))
            return "locked"
        return await super().acquire(job, slot)


async def test_a_rerun_waits_for_a_claim_in_flight_and_is_claimed_again_when_locked(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The crash is found while the job's own claim of its next slot hangs on a slow
    server: the rerun waits for it (handed over at once it was owed, then coalesced into
    that slot, and never ran), then its first two claims are refused "locked" (another
    replica runs the job just then): it is claimed again, within its grace, and runs."""
    crashed, due = T0 + timedelta(seconds=60), T0 + timedelta(seconds=120)
    locker = _SlowThenLocked(clock, slow=due, hang=20, locked=crashed, refusals=2)
    runs: list[datetime] = []
    scheduler = Scheduler(clock=clock, locker=locker)

    async def work(ctx: RunContext) -> None:
        runs.append(ctx.slot)

    scheduler.add_job(work, every(60), name="job", recover=True, misfire_grace=300)
    with caplog.at_level(logging.WARNING, logger="cronlock"):
        async with scheduler:
            await clock.advance_to(due + timedelta(seconds=1))  # due's claim hangs
            assert locker.crash("job", crashed) == [True]
            await clock.advance(60)
    assert crashed in runs and due in runs, runs
    assert locker.acquired.count(("job", crashed)) == 3  # refused twice, then granted
    assert not [r for r in caplog.records if "not run again" in r.getMessage()]


class _AlreadyRan(_Watching):
    """Every claim of *slot* is refused ``"already_ran"`` (its row was finished since, or
    taken over by another replica)."""

    def __init__(self, slot: datetime) -> None:
        super().__init__()
        self.slot = slot

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        if slot == self.slot:
            self.acquired.append((job, slot))
            return "already_ran"
        return await super().acquire(job, slot)


async def test_a_rerun_refused_already_ran_says_it_is_not_made(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The crashed run's owner, alive, wrote its outcome late (or another replica reran the
    slot) after this replica said it reruns it: its claim is refused "already_ran", and it
    says at WARNING that the rerun is not made after all, never leaving its announcement
    standing in silence."""
    locker = _AlreadyRan(SLOT)
    runs: list[datetime] = []
    scheduler = _scheduler(clock, locker, runs, recover=True, misfire_grace=60)
    with caplog.at_level(logging.WARNING, logger="cronlock"):
        async with scheduler:
            await clock.advance_to(SLOT + timedelta(seconds=5))
            assert locker.crash("job") == [True]
            await clock.advance(1)
    assert runs == []
    assert locker.acquired.count(("job", SLOT)) == 1  # not claimed again
    said = [r.getMessage() for r in caplog.records if "not run again after all" in r.getMessage()]
    assert len(said) == 1 and "finished meanwhile" in said[0], said
