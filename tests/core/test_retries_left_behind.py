"""A retry left by a replica gone, on the fake clock: the scheduler's rule for making it
(issue 37, item 8).

A ledger locker reports a pending retry whose replica is gone with the failed attempt's
record (``_locker/crashes.CrashWatch``); the scheduler makes the next attempt if its own
job would have retried (``_core/retries.refused``: an attempt left, not paused, before the
next slot and within ``misfire_grace``). Finding such retries is the PostgreSQL locker's
job (tests/postgres/test_durable_retries.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from cronlock import InMemoryLocker, JobCrashed, RunContext, RunRecord, Scheduler, every
from cronlock._locking.protocols import CrashCallback, Hold, Refusal
from cronlock.testing import FakeClock

from .conftest import T0, Recorder

SLOT = T0 + timedelta(minutes=30)  # a slot whose attempt failed on another replica


class _Watching:
    """An in-memory locker that reports the retries left behind a test makes up."""

    def __init__(self) -> None:
        self._inner = InMemoryLocker()
        self.callbacks: list[CrashCallback] = []

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        return await self._inner.acquire(job, slot)

    def on_crashed(self, callback: CrashCallback) -> None:
        self.callbacks.append(callback)

    def left(self, job: str, attempt: int, outcome: str = "failed") -> list[bool]:
        end = SLOT + timedelta(seconds=1)
        record = RunRecord(SLOT, SLOT, end, outcome, "E: down", "gone:4242", attempt)  # type: ignore[arg-type]
        return [callback(job, record) for callback in self.callbacks]


def _scheduler(
    clock: FakeClock, locker: _Watching, runs: list[tuple[datetime, int]], **options: object
) -> Scheduler:
    scheduler = Scheduler(clock=clock, locker=locker)

    async def work(ctx: RunContext) -> None:
        runs.append((ctx.slot, ctx.attempt))

    scheduler.add_job(work, every(hours=1), name="job", **options)  # type: ignore[arg-type]
    return scheduler


@pytest.mark.parametrize("outcome", ["failed", "timed_out"])
async def test_a_retry_left_behind_is_made_here_as_the_next_attempt(
    clock: FakeClock, outcome: str
) -> None:
    locker = _Watching()
    runs: list[tuple[datetime, int]] = []
    scheduler = _scheduler(clock, locker, runs, retries=2, misfire_grace=300)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    async with scheduler:
        await clock.advance_to(SLOT + timedelta(seconds=300))  # exactly the grace: still in
        assert locker.left("job", 1, outcome) == [True]
        await clock.advance(1)
    assert runs == [(SLOT, 2)]
    assert recorder.of(JobCrashed) == []  # a retry, not a crash


@pytest.mark.parametrize(
    ("options", "late", "attempt", "pause"),
    [
        pytest.param({"retries": 2}, 5, 3, False, id="no-attempt-left"),
        pytest.param({"retries": 0}, 5, 1, False, id="no-retries-here"),
        pytest.param({"retries": 2, "misfire_grace": 60}, 60.001, 1, False, id="past-grace"),
        pytest.param({"retries": 2, "misfire_grace": None}, 3600, 1, False, id="next-slot-due"),
        pytest.param({"retries": 2}, 5, 1, True, id="paused"),
    ],
)
async def test_a_retry_left_behind_is_not_made_when_this_job_would_not(
    clock: FakeClock, options: dict[str, object], late: float, attempt: int, pause: bool
) -> None:
    locker = _Watching()
    runs: list[tuple[datetime, int]] = []
    scheduler = _scheduler(clock, locker, runs, **options)
    async with scheduler:
        if pause:
            scheduler.get_job("job").pause()
        await clock.advance_to(SLOT + timedelta(seconds=late))
        assert locker.left("job", attempt) == [False]
        await clock.advance(1)
    assert (SLOT, attempt + 1) not in runs


async def test_retries_left_behind_of_other_jobs_or_while_stopped_are_not_made(
    clock: FakeClock,
) -> None:
    locker = _Watching()
    runs: list[tuple[datetime, int]] = []
    scheduler = _scheduler(clock, locker, runs, retries=2)
    assert locker.left("job", 1) == [False]  # not started
    async with scheduler:
        await clock.advance_to(SLOT + timedelta(seconds=5))
        assert locker.left("another-job", 1) == [False]
    assert locker.left("job", 1) == [False]  # stopped
    assert runs == []
