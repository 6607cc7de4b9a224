"""Run-loop behaviour on the fake clock, asserted at exact virtual instants."""

from __future__ import annotations

import asyncio
import inspect
import logging
from datetime import UTC, datetime, timedelta

import pytest

from cronlock import (
    Job,
    JobCancelled,
    JobFailed,
    JobOptions,
    JobSkipped,
    JobStarted,
    JobSucceeded,
    JobTimedOut,
    RunContext,
    ScheduleError,
    Scheduler,
    cron,
    every,
)
from cronlock.testing import FakeClock

from .conftest import T0, Recorder


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def started_slots(rec: Recorder) -> list[datetime]:
    return [e.slot for e in rec.of(JobStarted)]  # type: ignore[attr-defined]


async def test_interval_fires_at_exact_instants(scheduler: Scheduler, clock: FakeClock) -> None:
    seen: list[tuple[datetime, datetime, int]] = []

    @scheduler.every(10)
    async def tick(ctx: RunContext) -> None:
        seen.append((ctx.slot, clock.now(), ctx.run_number))

    async with scheduler:
        await clock.advance(60)
    assert seen == [(at(s), at(s), n) for n, s in enumerate(range(10, 61, 10), start=1)]
    [job] = scheduler.jobs
    assert job.name == f"{__name__}.test_interval_fires_at_exact_instants.<locals>.tick"
    assert job.run_count == 6
    assert job.last_success is not None
    assert job.last_success.slot == at(60)


async def test_nightly_job_over_thirty_days_in_berlin(clock: FakeClock) -> None:
    scheduler = Scheduler(tz="Europe/Berlin", clock=clock)
    slots: list[datetime] = []

    @scheduler.cron("0 3 * * *", name="nightly")
    async def nightly(ctx: RunContext) -> None:
        slots.append(ctx.slot)

    async with scheduler:
        await clock.advance(timedelta(days=30))
    # 03:00 in Berlin is 02:00 UTC in winter (CET, +01:00).
    assert slots == [datetime(2026, 1, d, 2, 0, tzinfo=UTC) for d in range(1, 31)]


async def test_overlap_skip_skips_slots_while_running(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    @scheduler.every(10, name="slow")
    async def slow() -> None:
        await clock.sleep(25)

    async with scheduler:
        await clock.advance(60)
    assert started_slots(recorder) == [at(10), at(40)]
    skipped = [(e.slot, e.reason) for e in recorder.of(JobSkipped)]  # type: ignore[attr-defined]
    assert skipped == [
        (at(20), "overlap"),
        (at(30), "overlap"),
        (at(50), "overlap"),
        (at(60), "overlap"),
    ]


async def test_overlap_queue_keeps_one_pending_run(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    starts: list[tuple[datetime, datetime]] = []

    @scheduler.every(10, name="slow", overlap="queue")
    async def slow(ctx: RunContext) -> None:
        starts.append((ctx.slot, clock.now()))
        await clock.sleep(25)

    async with scheduler:
        await clock.advance(40)
    # 10 runs 10..35; 20 waits and starts at 35; 30 finds the queue full and is skipped.
    assert starts == [(at(10), at(10)), (at(20), at(35))]
    assert [(e.slot, e.reason) for e in recorder.of(JobSkipped)] == [  # type: ignore[attr-defined]
        (at(30), "overlap")
    ]


async def test_overlap_allow_runs_concurrently(scheduler: Scheduler, clock: FakeClock) -> None:
    running: list[int] = []
    peak = 0

    @scheduler.every(10, name="slow", overlap="allow")
    async def slow() -> None:
        nonlocal peak
        running.append(1)
        peak = max(peak, len(running))
        await clock.sleep(25)
        running.pop()

    async with scheduler:
        await clock.advance(60)
        assert scheduler.get_job("slow").running
    assert peak == 3


async def test_overlap_replace_cancels_the_running_one(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    @scheduler.every(10, name="slow", overlap="replace")
    async def slow() -> None:
        await clock.sleep(25)

    async with scheduler:
        await clock.advance(35)
    cancelled = [(e.slot, e.finished_at) for e in recorder.of(JobCancelled)]  # type: ignore[attr-defined]
    # 10 and 20 were replaced by their successors; 30 ran to its end during shutdown.
    assert cancelled == [(at(10), at(20)), (at(20), at(30))]
    assert [e.slot for e in recorder.of(JobSucceeded)] == [at(30)]  # type: ignore[attr-defined]
    assert started_slots(recorder)[:3] == [at(10), at(20), at(30)]


async def test_timeout_cancels_the_run_at_the_exact_instant(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    @scheduler.every(60, name="stuck", timeout=5)
    async def stuck() -> None:
        await clock.sleep(1000)

    async with scheduler:
        await clock.advance(70)
    [timed_out] = recorder.of(JobTimedOut)
    assert timed_out.slot == at(60)  # type: ignore[attr-defined]
    assert timed_out.finished_at == at(65)  # type: ignore[attr-defined]
    assert scheduler.get_job("stuck").last_run.outcome == "timed_out"  # type: ignore[union-attr]


async def test_default_timeout_applies_when_job_has_none(clock: FakeClock) -> None:
    scheduler = Scheduler(clock=clock, default_timeout=2)
    rec = Recorder()
    scheduler.subscribe(rec, JobTimedOut)

    @scheduler.every(10, name="stuck")
    async def stuck() -> None:
        await clock.sleep(1000)

    async with scheduler:
        await clock.advance(15)
    assert [e.finished_at for e in rec.events] == [at(12)]  # type: ignore[attr-defined]


async def test_own_timeout_error_is_a_failure_not_a_timeout(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    @scheduler.every(10, name="raises-timeout", timeout=5)
    async def raises() -> None:
        raise TimeoutError("upstream timed out")

    async with scheduler:
        await clock.advance(10)
    assert len(recorder.of(JobFailed)) == 1
    assert recorder.of(JobTimedOut) == []


async def test_exception_is_logged_and_does_not_stop_other_jobs(
    scheduler: Scheduler,
    clock: FakeClock,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ok: list[datetime] = []

    @scheduler.every(10, name="broken")
    async def broken() -> None:
        raise RuntimeError("boom")

    @scheduler.every(10, name="fine")
    async def fine() -> None:
        ok.append(clock.now())

    with caplog.at_level(logging.ERROR, logger="cronlock"):
        async with scheduler:
            await clock.advance(30)
    assert ok == [at(10), at(20), at(30)]
    failures = recorder.of(JobFailed)
    assert [e.slot for e in failures] == [at(10), at(20), at(30)]  # type: ignore[attr-defined]
    assert isinstance(failures[0].exception, RuntimeError)  # type: ignore[attr-defined]
    record = next(r for r in caplog.records if "broken" in r.getMessage())
    assert record.exc_info is not None
    job = scheduler.get_job("broken")
    assert job.last_run is not None
    assert job.last_run.error == "RuntimeError: boom"
    assert job.last_success is None


async def test_concurrency_cap_holds_runs_in_slot_order(clock: FakeClock) -> None:
    scheduler = Scheduler(clock=clock, max_concurrent=2)
    starts: list[tuple[str, datetime]] = []

    def make(name: str, interval: int) -> None:
        async def work() -> None:
            starts.append((name, clock.now()))
            await clock.sleep(10)

        scheduler.add_job(work, every(interval), name=name)

    make("a", 30)
    make("b", 30)
    make("c", 30)
    make("d", 20)  # due at 20, before the others' 30: first in line when a slot frees

    async with scheduler:
        await clock.advance(45)
    # c (slot 30) waited for a free place and goes before d's slot 40, whichever of
    # "a and b finish" and "d's slot fires" the loop handles first at 40.
    assert starts == [("d", at(20)), ("a", at(30)), ("b", at(30)), ("c", at(40)), ("d", at(40))]
    # Never more than two at once.
    assert (
        max(sum(1 for _, t in starts if t <= s < t + timedelta(seconds=10)) for _, s in starts) <= 2
    )


async def test_cap_releases_waiting_runs_in_slot_order(clock: FakeClock) -> None:
    scheduler = Scheduler(clock=clock, max_concurrent=1)
    starts: list[tuple[str, datetime, datetime]] = []

    def make(name: str, anchor_s: int) -> None:
        async def work(ctx: RunContext) -> None:
            starts.append((name, ctx.slot, clock.now()))
            await clock.sleep(15)

        scheduler.add_job(work, every(60, anchor=at(anchor_s)), name=name)

    make("late", 3)
    make("early", 2)
    make("first", 1)
    async with scheduler:
        await clock.advance(50)
    assert starts == [
        ("first", at(1), at(1)),
        ("early", at(2), at(16)),
        ("late", at(3), at(31)),
    ]


async def test_missed_slots_coalesce_into_one_run(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    @scheduler.every(10, name="tick", misfire_grace=60)
    async def tick() -> None:
        pass

    async with scheduler:
        await clock.jump(35)  # the process stalled through slots 10, 20, 30
        await clock.advance(5)
    assert started_slots(recorder) == [at(30), at(40)]
    assert scheduler.get_job("tick").next_run == at(50)


async def test_slot_past_misfire_grace_is_skipped(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    @scheduler.every(10, name="tick", misfire_grace=1)
    async def tick() -> None:
        pass

    async with scheduler:
        await clock.jump(35)
        await clock.advance(5)
    assert [(e.slot, e.reason) for e in recorder.of(JobSkipped)] == [  # type: ignore[attr-defined]
        (at(30), "misfire")
    ]
    assert started_slots(recorder) == [at(40)]


async def test_long_stall_on_a_fine_schedule_coalesces_quickly(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    @scheduler.every(0.05, name="fast", misfire_grace=None)
    async def fast() -> None:
        pass

    async with scheduler:
        await clock.jump(timedelta(days=3))
    assert started_slots(recorder) == [T0 + timedelta(days=3)]


async def test_pause_and_resume(scheduler: Scheduler, clock: FakeClock, recorder: Recorder) -> None:
    job = scheduler.add_job(_noop, every(10), name="tick")
    async with scheduler:
        await clock.advance(15)
        job.pause()
        assert job.paused
        assert job.next_run is None
        await clock.advance(20)  # 20 and 30 pass while paused
        job.resume()
        assert job.next_run == at(40)
        await clock.advance(10)
    assert started_slots(recorder) == [at(10), at(40)]


async def test_run_now_does_not_shift_the_schedule(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    job = scheduler.add_job(_noop, every(10), name="tick")
    async with scheduler:
        await clock.advance(5)
        event = await job.run_now()
        assert isinstance(event, JobSucceeded)
        assert event.slot == at(5)
        assert job.next_run == at(10)
        await clock.advance(5)
    assert started_slots(recorder) == [at(5), at(10)]


async def test_run_now_of_a_busy_job_reports_the_overlap(
    scheduler: Scheduler, clock: FakeClock
) -> None:
    async def slow() -> None:
        await clock.sleep(100)

    job = scheduler.add_job(slow, every(10), name="slow")
    async with scheduler:
        await clock.advance(10)
        event = await job.run_now()
        assert isinstance(event, JobSkipped)
        assert event.reason == "overlap"
        await scheduler.shutdown(timeout=0)


async def test_shutdown_cancels_runs_still_going_after_stop_timeout(
    clock: FakeClock,
) -> None:
    scheduler = Scheduler(clock=clock, stop_timeout=0.01)
    rec = Recorder()
    scheduler.subscribe(rec)
    cleaned: list[str] = []

    @scheduler.every(10, name="forever")
    async def forever() -> None:
        try:
            await clock.sleep(10_000)
        finally:
            cleaned.append("cleaned")

    await scheduler.start()
    await clock.advance(10)
    assert scheduler.get_job("forever").running
    await scheduler.shutdown()
    assert cleaned == ["cleaned"]
    assert [type(e) for e in rec.of(JobCancelled)] == [JobCancelled]
    assert not scheduler.get_job("forever").running
    await scheduler.shutdown()  # twice is harmless


async def test_shutdown_waits_stop_timeout_in_the_clocks_time(clock: FakeClock) -> None:
    scheduler = Scheduler(clock=clock, stop_timeout=5)
    rec = Recorder()
    scheduler.subscribe(rec)

    async def quick() -> None:
        await clock.sleep(3)

    async def slow() -> None:
        await clock.sleep(8)

    scheduler.add_job(quick, every(10), name="quick")
    scheduler.add_job(slow, every(10), name="slow")
    await scheduler.start()
    await clock.advance(10)
    await scheduler.shutdown()
    assert [(e.job, e.finished_at) for e in rec.of(JobSucceeded)] == [("quick", at(13))]  # type: ignore[attr-defined]
    assert [(e.job, e.finished_at) for e in rec.of(JobCancelled)] == [("slow", at(15))]  # type: ignore[attr-defined]


async def test_cancelling_the_owner_is_not_swallowed(clock: FakeClock) -> None:
    scheduler = Scheduler(clock=clock, stop_timeout=0)
    entered = asyncio.Event()

    @scheduler.every(10, name="forever")
    async def forever() -> None:
        await clock.sleep(10_000)

    async def service() -> None:
        async with scheduler:
            await clock.advance(10)
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(service())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not scheduler.running
    assert not scheduler.get_job("forever").running


async def test_plain_function_runs_in_a_worker_thread(
    scheduler: Scheduler, clock: FakeClock
) -> None:
    import threading

    threads: list[int] = []

    @scheduler.every(10, name="sync")
    def sync_job(ctx: RunContext) -> None:
        threads.append(threading.get_ident())
        assert ctx.slot == at(10)

    async with scheduler:
        await clock.advance(10)
    assert len(threads) == 1
    assert threads[0] != threading.get_ident()


async def test_args_and_kwargs_are_passed(scheduler: Scheduler, clock: FakeClock) -> None:
    got: list[tuple[int, str]] = []

    async def job(a: int, *, b: str) -> None:
        got.append((a, b))

    scheduler.add_job(job, every(10), args=(1,), kwargs={"b": "x"}, name="args")
    async with scheduler:
        await clock.advance(10)
    assert got == [(1, "x")]


async def test_jitter_is_deterministic_and_keeps_the_slot(clock: FakeClock) -> None:
    fired: list[list[tuple[datetime, datetime]]] = []
    for _ in range(2):
        c = FakeClock(T0)
        s = Scheduler(clock=c)
        seen: list[tuple[datetime, datetime]] = []
        fired.append(seen)

        async def job(
            ctx: RunContext, seen: list[tuple[datetime, datetime]] = seen, c: FakeClock = c
        ) -> None:
            seen.append((ctx.slot, c.now()))

        s.add_job(job, every(60), name="jittered", jitter=30)
        async with s:
            await c.advance(300)
    assert fired[0] == fired[1]
    assert [slot for slot, _ in fired[0]] == [at(60 * k) for k in range(1, 5)] or [
        slot for slot, _ in fired[0]
    ] == [at(60 * k) for k in range(1, 6)]
    for slot, when in fired[0]:
        assert slot <= when < slot + timedelta(seconds=30)
    assert len({when - slot for slot, when in fired[0]}) > 1


async def test_max_runs_start_at_and_stop_at(scheduler: Scheduler, clock: FakeClock) -> None:
    a = scheduler.add_job(_noop, every(10), name="limited", max_runs=2)
    b = scheduler.add_job(_noop, every(10), name="window", start_at=at(25), stop_at=at(50))
    async with scheduler:
        await clock.advance(100)
    assert a.run_count == 2
    assert a.next_run is None
    assert b.run_count == 3  # 30, 40, 50
    assert b.last_run is not None
    assert b.last_run.slot == at(50)


@pytest.mark.parametrize("timeout", [None, 100.0], ids=["direct-path", "general-path"])
async def test_max_runs_counts_a_run_in_flight_once(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder, timeout: float | None
) -> None:
    """Runs that overlap (each 25 s, one every 10 s) still reach max_runs: a run that has
    begun and is still going counts once, not as begun and as in flight. (On the fake
    clock a timeout sends the runs down the general path.)"""

    @scheduler.every(10, name="slow", overlap="allow", max_runs=3, timeout=timeout)
    async def slow() -> None:
        await clock.sleep(25)

    async with scheduler:
        await clock.advance(100)
    assert started_slots(recorder) == [at(10), at(20), at(30)]
    assert scheduler.get_job("slow").run_count == 3


async def test_once_at_start_and_at_instants(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    scheduler.add_job(_noop, _once(None), name="boot")
    scheduler.add_job(_noop, _once([at(30), at(20)]), name="twice")
    async with scheduler:
        await clock.advance(100)
    by_job = {(e.job, e.slot) for e in recorder.of(JobStarted)}  # type: ignore[attr-defined]
    assert by_job == {("boot", T0), ("twice", at(20)), ("twice", at(30))}


async def test_once_at_start_runs_when_first_planned_after_start(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    # once() without a time runs at the instant it is first planned: at start, when added
    # to a running scheduler, or when resumed after being paused before start.
    paused = scheduler.add_job(_noop, _once(None), name="paused")
    paused.pause()
    async with scheduler:
        await clock.advance(10)
        scheduler.add_job(_noop, _once(None), name="late")
        await clock.advance(10)
        paused.resume()
        await clock.advance(10)
    by_job = {(e.job, e.slot) for e in recorder.of(JobStarted)}  # type: ignore[attr-defined]
    assert by_job == {("late", at(10)), ("paused", at(20))}
    assert paused.schedule == _once([at(20)])  # what it ran at, as once() with a time says


async def test_cron_seconds_field_first(scheduler: Scheduler, clock: FakeClock) -> None:
    slots: list[datetime] = []

    @scheduler.cron("15 * * * * *", seconds=True, name="sec")
    async def job(ctx: RunContext) -> None:
        slots.append(ctx.slot)

    async with scheduler:
        await clock.advance(150)
    assert slots == [at(15), at(75), at(135)]


async def test_update_keeps_history_and_reschedules(scheduler: Scheduler, clock: FakeClock) -> None:
    job = scheduler.add_job(_noop, every(10), name="tick")
    async with scheduler:
        await clock.advance(10)
        scheduler.update("tick", cron("*/1 * * * *"))
        assert job.run_count == 1
        assert job.next_run == at(60)
        await clock.advance(50)
    assert job.run_count == 2


async def test_job_added_while_running_fires(scheduler: Scheduler, clock: FakeClock) -> None:
    async with scheduler:
        await clock.advance(5)
        job = scheduler.add_job(_noop, every(10), name="late")
        await clock.advance(5)
        assert job.run_count == 1


async def test_a_job_registered_under_a_removed_jobs_name_keeps_its_own_slots(
    scheduler: Scheduler, clock: FakeClock
) -> None:
    # The heap names jobs by name: the removed job's entry (due at 10 s) must not fire the
    # new job of that name, whose slots are 7, 14, 21, 28 s.
    slots: list[tuple[str, datetime]] = []

    async def old(ctx: RunContext) -> None:
        slots.append(("old", ctx.slot))

    async def new(ctx: RunContext) -> None:
        slots.append(("new", ctx.slot))

    scheduler.add_job(old, every(10, anchor=T0), name="x")
    async with scheduler:
        await clock.advance(5)
        scheduler.remove("x")
        job = scheduler.add_job(new, every(7, anchor=T0), name="x")
        await clock.advance(25)
    assert slots == [("new", at(s)) for s in (7, 14, 21, 28)]
    assert job.run_count == 4


async def _noop() -> None:
    pass


def _once(at: datetime | list[datetime] | None):  # type: ignore[no-untyped-def]
    from cronlock import once

    return once(at)


async def test_next_runs_lists_upcoming_slots(scheduler: Scheduler, clock: FakeClock) -> None:
    job = scheduler.add_job(_noop, every(10), name="tick")
    assert job.next_runs(3) == [at(10), at(20), at(30)]  # computed even before start
    async with scheduler:
        await clock.advance(10)
        assert job.next_runs(3) == [at(20), at(30), at(40)]


async def test_docs_testing_example_holds(clock: FakeClock) -> None:
    """The example at the top of docs/testing.md, across Berlin's spring-forward."""
    clock = FakeClock(datetime(2026, 3, 1, tzinfo=UTC))
    scheduler = Scheduler(tz="Europe/Berlin", clock=clock)
    slots: list[datetime] = []

    @scheduler.cron("0 3 * * *")
    async def report(ctx: RunContext) -> None:
        slots.append(ctx.slot)

    async with scheduler:
        await clock.advance(timedelta(days=30))
    assert len(slots) == 30
    assert slots[0] == datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    assert slots[27] == datetime(2026, 3, 28, 2, 0, tzinfo=UTC)
    assert slots[28] == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # CEST from that night
    assert slots[-1] == datetime(2026, 3, 30, 1, 0, tzinfo=UTC)


async def test_real_clock_smoke() -> None:
    """The real clock: slots land on the interval grid and the job runs."""
    from cronlock import SystemClock

    scheduler = Scheduler(clock=SystemClock())
    slots: list[datetime] = []

    @scheduler.every(0.05, name="smoke")
    async def smoke(ctx: RunContext) -> None:
        slots.append(ctx.slot)

    async with scheduler, asyncio.timeout(60):  # a liveness guard, not a timing
        while len(slots) < 3:
            await asyncio.sleep(0.05)
    assert all(round(s.timestamp() * 1000) % 50 == 0 for s in slots)
    assert slots == sorted(set(slots))


async def test_unknown_option_is_rejected(scheduler: Scheduler) -> None:
    with pytest.raises(ScheduleError, match=r"job 'j': unknown option\(s\) timout; known: "):
        scheduler.add_job(_noop, every(10), name="j", timout=5)  # type: ignore[arg-type]
    assert not scheduler.jobs


def test_add_job_takes_exactly_the_job_options() -> None:
    # The decorators pass JobOptions through to add_job: one list of options for both.
    parameters = inspect.signature(Scheduler.add_job).parameters
    keywords = {n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(JobOptions.__annotations__)


async def test_a_late_slot_on_the_fast_path_is_still_a_misfire(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    # After its first run a plain job fires on the run loop's fast path; a slot found past
    # its grace there (late, though the next slot is not due yet) must still be skipped.
    @scheduler.every(10, name="tick", misfire_grace=1)
    async def tick() -> None:
        pass

    async with scheduler:
        await clock.advance(10)
        await clock.jump(12)  # now 22: slot 20 is 2 s late, slot 30 not due
        await clock.advance(10)
    assert [(e.slot, e.reason) for e in recorder.of(JobSkipped)] == [  # type: ignore[attr-defined]
        (at(20), "misfire")
    ]
    assert started_slots(recorder) == [at(10), at(30)]


async def test_jobs_sharing_a_schedule_keep_their_own_window(
    scheduler: Scheduler, clock: FakeClock
) -> None:
    # At start, jobs given one schedule object share its first slot; a job whose start_at
    # or stop_at moves that slot must not take the shared one.
    shared = every(10)
    a = scheduler.add_job(_noop, shared, name="a")
    b = scheduler.add_job(_noop, shared, name="b", start_at=at(35))
    c = scheduler.add_job(_noop, shared, name="c", stop_at=at(5))
    d = scheduler.add_job(_noop, shared, name="d")
    async with scheduler:
        assert [j.next_run for j in (a, b, c, d)] == [at(10), at(40), None, at(10)]


class _OrderLocker:
    """A locker that refuses every claim and remembers the order they came in."""

    def __init__(self) -> None:
        self.order: list[str] = []

    async def acquire(self, job: str, slot: datetime) -> None:
        self.order.append(job)


async def test_replicas_go_through_a_burst_of_coordinated_jobs_in_their_own_orders() -> None:
    # Jobs due at one instant are fired one after another. Coordinated ones in one order
    # on every replica would let the replica that woke first win every claim of a burst;
    # each replica draws its own order, while jobs with nobody to ask keep theirs.
    names = [f"burst-{i}" for i in range(50)]
    orders = []
    for _ in range(2):
        clock = FakeClock(T0)
        locker = _OrderLocker()
        replica = Scheduler(clock=clock, locker=locker)
        for name in names:
            replica.add_job(_noop, every(10), name=name)
        async with replica:
            await clock.advance(10)
        assert sorted(locker.order) == sorted(names)
        orders.append(locker.order)
    assert orders[0] != orders[1]
    assert names not in orders
    plain = FakeClock(T0)
    local = Scheduler(clock=plain)
    started: list[str] = []
    for name in names:

        async def run(ctx: RunContext) -> None:
            started.append(ctx.job)

        local.add_job(run, every(10), name=name)
    async with local:
        await plain.advance(10)
    assert started == names


async def test_a_burst_starts_its_first_runs_before_it_is_all_dispatched(
    clock: FakeClock, scheduler: Scheduler
) -> None:
    """The run loop fires a burst in passes of at most 256 runs and lets them start between
    passes: the first of 600 jobs due at one instant does not wait for the other 599."""
    jobs: list[Job] = []
    dispatched: list[int] = []  # jobs with a run in flight when each run began

    async def tick() -> None:
        dispatched.append(sum(job.running for job in jobs))

    jobs.extend(scheduler.add_job(tick, every(1), name=f"burst-{i}") for i in range(600))
    async with scheduler:
        await clock.advance(2)  # two bursts: the first fires by the general rules, then fast
    assert len(dispatched) == 1200
    assert dispatched[0] <= 256
    assert dispatched[600] <= 256
