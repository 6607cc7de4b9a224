"""Retries on the fake clock: a failed or timed-out slot is tried ``1 + retries`` times at
exact instants (the backoff), never past the next slot or ``misfire_grace``, never after a
cancellation, and once per slot in the fleet when replicas share a locker."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest

from cronlock import (
    InMemoryLocker,
    JobCancelled,
    JobFailed,
    JobRetrying,
    JobStarted,
    JobSucceeded,
    JobTimedOut,
    RunContext,
    ScheduleError,
    Scheduler,
    every,
)
from cronlock._core.retries import MAX_DELAY, backoff
from cronlock.testing import FakeClock

from .conftest import T0, Recorder


def _seconds(delta: timedelta) -> float:
    return delta.total_seconds()


def _starts(events: Recorder) -> list[datetime]:
    return [e.started_at for e in events.events if isinstance(e, JobStarted)]


def _retrying(events: Recorder) -> list[JobRetrying]:
    return [e for e in events.events if isinstance(e, JobRetrying)]


async def test_a_failing_slot_is_tried_one_plus_retries_times_at_the_backoff(
    clock: FakeClock, scheduler: Scheduler, recorder: Recorder
) -> None:
    async def boom() -> None:
        raise RuntimeError("no database")

    scheduler.add_job(boom, every(3600), name="sync", retries=3, retry_delay=2)
    async with scheduler:
        await clock.advance(3600 + 60)
    slot = T0 + timedelta(hours=1)
    d1, d2, d3 = (backoff("sync", slot, k, 2.0) for k in (1, 2, 3))
    assert 1 <= d1 <= 2 and 2 <= d2 <= 4 and 4 <= d3 <= 8  # doubling, equal jitter
    assert _starts(recorder) == [
        slot,
        slot + timedelta(seconds=d1),
        slot + timedelta(seconds=d1 + d2),
        slot + timedelta(seconds=d1 + d2 + d3),
    ]
    assert [(e.attempt, e.delay, e.error) for e in _retrying(recorder)] == [
        (2, d1, "RuntimeError: no database"),
        (3, d2, "RuntimeError: no database"),
        (4, d3, "RuntimeError: no database"),
    ]
    assert len([e for e in recorder.events if isinstance(e, JobFailed)]) == 4


async def test_a_retry_that_succeeds_ends_the_retries(
    clock: FakeClock, scheduler: Scheduler, recorder: Recorder
) -> None:
    calls: list[datetime] = []

    async def flaky(ctx: RunContext) -> None:
        calls.append(ctx.slot)
        if len(calls) == 1:
            raise RuntimeError("once")

    scheduler.add_job(flaky, every(3600), name="flaky", retries=5)
    async with scheduler:
        await clock.advance(3600 + 600)
    slot = T0 + timedelta(hours=1)
    assert calls == [slot, slot]  # the retry runs the same slot
    assert len(_retrying(recorder)) == 1
    assert [e.slot for e in recorder.events if isinstance(e, JobSucceeded)] == [slot]


async def test_a_timed_out_run_is_retried_a_cancelled_one_is_not(
    clock: FakeClock, scheduler: Scheduler, recorder: Recorder
) -> None:
    async def slow() -> None:
        await clock.sleep(10)

    scheduler.add_job(slow, every(3600), name="slow", timeout=1, retries=1, retry_delay=1)
    scheduler.add_job(slow, every(3600), name="stopped", retries=3)
    async with scheduler:
        await clock.advance(3600 + 5)
        await scheduler.shutdown(timeout=0)  # "stopped" is cut off: cancelled, not retried
    timed_out = [e for e in recorder.events if isinstance(e, JobTimedOut)]
    assert [e.job for e in timed_out] == ["slow", "slow"]
    assert [e.job for e in _retrying(recorder)] == ["slow"]
    assert [e.job for e in recorder.events if isinstance(e, JobCancelled)] == ["stopped"]


async def test_retries_stop_when_the_next_slot_falls_due(
    clock: FakeClock, scheduler: Scheduler, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom() -> None:
        raise RuntimeError("down")

    scheduler.add_job(boom, every(10), name="tight", retries=10, retry_delay=2)
    with caplog.at_level(logging.INFO, logger="cronlock"):
        async with scheduler:
            await clock.advance(10 + 9.999)
    slot = T0 + timedelta(seconds=10)
    at, expected = 0.0, [slot]
    for attempt in range(1, 11):
        at += backoff("tight", slot, attempt, 2.0)
        if at >= 10:
            break
        expected.append(slot + timedelta(seconds=at))
    assert _starts(recorder) == expected
    assert 2 <= len(expected) < 11
    assert any("falls due first" in r.getMessage() for r in caplog.records)


async def test_retries_stop_when_misfire_grace_runs_out(
    clock: FakeClock, scheduler: Scheduler, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom() -> None:
        raise RuntimeError("down")

    scheduler.add_job(boom, every(3600), name="graced", retries=10, misfire_grace=5)
    with caplog.at_level(logging.INFO, logger="cronlock"):
        async with scheduler:
            await clock.advance(3600 + 60)
    slot = T0 + timedelta(hours=1)
    starts = _starts(recorder)
    assert all(_seconds(start - slot) <= 5 for start in starts)
    assert 2 <= len(starts) < 11
    assert any("misfire_grace (5.0s) runs out first" in r.getMessage() for r in caplog.records)


async def test_replicas_sharing_a_locker_try_each_slot_one_plus_retries_times(
    clock: FakeClock,
) -> None:
    locker = InMemoryLocker()
    replicas = [Scheduler(clock=clock, locker=locker) for _ in range(3)]
    events = [Recorder() for _ in replicas]
    attempts: list[tuple[datetime, int]] = []
    for replica, seen in zip(replicas, events, strict=True):
        replica.subscribe(seen)

        async def boom(ctx: RunContext) -> None:
            attempts.append((ctx.slot, ctx.run_number))
            raise RuntimeError("down")

        replica.add_job(boom, every(60), name="shared", retries=2, retry_delay=1)
    for replica in replicas:
        await replica.start()
    await clock.advance(60 * 3 + 30)
    for replica in replicas:
        await replica.shutdown()
    slots = [T0 + timedelta(minutes=m) for m in (1, 2, 3)]
    assert sorted(slot for slot, _ in attempts) == sorted(slots * 3)  # 1 + 2 per slot
    [last] = await locker.history("shared", 1)
    assert last.slot == slots[-1] and last.attempt == 3 and last.outcome == "failed"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"retries": -1}, "retries must be a whole number >= 0, got -1"),
        ({"retries": "2"}, "retries must be a whole number >= 0, got '2'"),
        ({"retries": 2.0}, "retries must be a whole number >= 0, got 2.0"),
        ({"retries": 1, "retry_delay": -1}, "retry_delay"),
        ({"retry_delay": float("nan")}, "retry_delay"),
    ],
)
def test_bad_retry_options_are_refused_naming_the_job(
    scheduler: Scheduler, options: dict[str, object], words: str
) -> None:
    with pytest.raises(ScheduleError, match="'nightly'") as caught:
        scheduler.add_job(lambda: None, every(60), name="nightly", **options)  # type: ignore[arg-type]
    assert words in str(caught.value)


def test_the_backoff_doubles_and_is_capped() -> None:
    slot = T0
    for attempt in range(1, 30):
        ceiling = min(MAX_DELAY, 1.5 * 2 ** (attempt - 1))
        assert ceiling / 2 <= backoff("j", slot, attempt, 1.5) <= ceiling
    assert backoff("j", slot, 1, 1.0) == backoff("j", slot, 1, 1.0)  # the same everywhere
    assert backoff("j", slot, 1, 1.0) != backoff("k", slot, 1, 1.0)  # spread across jobs


def test_a_job_shows_its_retries(scheduler: Scheduler) -> None:
    job = scheduler.add_job(lambda: None, every(60), name="j", retries=2, retry_delay=0.5)
    assert (job.retries, job.retry_delay) == (2, 0.5)
    plain = scheduler.add_job(lambda: None, every(60), name="p")
    assert (plain.retries, plain.retry_delay) == (0, 1.0)


async def test_the_task_is_told_its_attempt_and_the_ledger_keeps_every_attempt(
    clock: FakeClock,
) -> None:
    # Issue 36, finding 8: a retry took the failed attempt's place in the ledger, and the
    # task could not tell a retry from a first run.
    locker = InMemoryLocker()
    scheduler = Scheduler(clock=clock, locker=locker)
    told: list[int] = []

    async def flaky(ctx: RunContext) -> None:
        told.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError(f"down {ctx.attempt}")

    scheduler.add_job(flaky, every(3600), name="flaky", retries=2, retry_delay=1)
    async with scheduler:
        await clock.advance(3600 + 60)
    assert told == [1, 2, 3]
    [run] = await locker.history("flaky", 5)
    tries = [*run.attempts, run]
    assert [(r.attempt, r.outcome, r.error) for r in tries] == [
        (1, "failed", "RuntimeError: down 1"),
        (2, "failed", "RuntimeError: down 2"),
        (3, "succeeded", None),
    ]
    assert all(r.slot == T0 + timedelta(hours=1) and not r.attempts for r in tries[:2])
    assert tries[0].finished_at is not None and tries[0].finished_at <= tries[1].started_at


async def test_a_job_without_a_locker_tells_its_retries_their_attempt(
    clock: FakeClock, scheduler: Scheduler
) -> None:
    told: list[tuple[datetime, int]] = []

    def flaky(ctx: RunContext) -> None:  # a plain function (a worker thread) is told too
        told.append((ctx.slot, ctx.attempt))
        if ctx.attempt == 1:
            raise RuntimeError("once")

    scheduler.add_job(flaky, every(3600), name="flaky", retries=3)
    async with scheduler:
        await clock.advance(2 * 3600 + 60)
    first, second = T0 + timedelta(hours=1), T0 + timedelta(hours=2)
    assert told == [(first, 1), (first, 2), (second, 1), (second, 2)]
