"""The public surface: validation at definition time, lifecycle, events, exports."""

from __future__ import annotations

import logging
import typing
from datetime import UTC, datetime, timedelta, timezone

import pytest

import cronlock
from cronlock import (
    ConfigError,
    Event,
    InMemoryLocker,
    JobConflictError,
    JobLookupError,
    JobStarted,
    JobSucceeded,
    ScheduleError,
    Scheduler,
    SchedulerStarted,
    SchedulerStateError,
    SchedulerStopped,
    every,
)
from cronlock.testing import FakeClock

from .conftest import T0, Recorder


async def _noop() -> None:
    pass


def test_all_matches_the_public_names() -> None:
    public = {name for name in dir(cronlock) if not name.startswith("_")}
    # The submodules, once imported:
    modules = {"testing", "postgres", "prometheus", "otel", "queues", "celery", "web"}
    assert set(cronlock.__all__) == public - modules
    for name in cronlock.__all__:
        obj = getattr(cronlock, name)
        if typing.get_origin(obj) is typing.Literal:
            continue  # an alias has no __doc__; the docs build checks its docstring in the source
        assert obj.__doc__, f"{name} has no docstring"


def test_decorator_returns_the_function_unchanged(scheduler: Scheduler) -> None:
    decorated = scheduler.every(10, name="x")(_noop)
    assert decorated is _noop
    assert scheduler.get_job("x").func is _noop


def test_bad_cron_fails_at_decoration(scheduler: Scheduler) -> None:
    with pytest.raises(ScheduleError, match="61"):
        scheduler.cron("61 * * * *")(_noop)
    assert scheduler.jobs == ()


def test_duplicate_name_is_rejected(scheduler: Scheduler) -> None:
    scheduler.add_job(_noop, every(10), name="dup")
    with pytest.raises(JobConflictError, match="dup"):
        scheduler.add_job(_noop, every(10), name="dup")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"timeout": -1}, ["job 'j'", "timeout", "-1"]),
        ({"timeout": 0}, ["job 'j'", "timeout", "0"]),
        ({"overlap": "sometimes"}, ["job 'j'", "overlap", "'sometimes'"]),
        ({"jitter": float("nan")}, ["job 'j'", "jitter", "nan"]),
        ({"misfire_grace": "soon"}, ["job 'j'", "misfire_grace", "'soon'"]),
        ({"max_runs": 0}, ["job 'j'", "max_runs", "0"]),
        ({"start_at": datetime(2026, 1, 1)}, ["job 'j'", "start_at", "naive"]),
        ({"start_at": T0 + timedelta(days=1), "stop_at": T0}, ["job 'j'", "stop_at"]),
    ],
)
def test_bad_options_name_job_field_and_value(
    scheduler: Scheduler, options: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(ScheduleError) as info:
        scheduler.add_job(_noop, every(10), name="j", **options)  # type: ignore[arg-type]
    for word in words:
        assert word in str(info.value)


def test_timedelta_and_float_durations_are_equivalent(scheduler: Scheduler) -> None:
    a = scheduler.add_job(_noop, every(10), name="a", timeout=timedelta(minutes=1))
    b = scheduler.add_job(_noop, every(10), name="b", timeout=60.0)
    assert a.timeout == b.timeout == 60.0


def test_not_a_schedule_is_rejected(scheduler: Scheduler) -> None:
    with pytest.raises(ScheduleError, match="next_after"):
        scheduler.add_job(_noop, "0 3 * * *", name="j")  # type: ignore[arg-type]


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", timezone(timedelta(hours=2))])
def test_bad_scheduler_zone_is_rejected(tz: object) -> None:
    with pytest.raises(ScheduleError, match=r"zone|IANA"):
        Scheduler(tz=tz)  # type: ignore[arg-type]


def test_bad_max_concurrent_is_rejected() -> None:
    with pytest.raises(ConfigError, match="max_concurrent"):
        Scheduler(max_concurrent=0)


def test_default_zone_is_utc() -> None:
    assert str(Scheduler().tz) == "UTC"


def test_get_job_remove_and_tags(scheduler: Scheduler) -> None:
    scheduler.add_job(_noop, every(10), name="a", tags="reports")
    scheduler.add_job(_noop, every(10), name="b", tags=["reports", "nightly"])
    scheduler.add_job(_noop, every(10), name="c")
    assert scheduler.get_job("b").tags == frozenset({"reports", "nightly"})
    removed = scheduler.remove_by_tags("nightly")
    assert [j.name for j in removed] == ["b"]
    scheduler.remove("a")
    assert [j.name for j in scheduler.jobs] == ["c"]
    with pytest.raises(JobLookupError, match="unknown job: a"):
        scheduler.get_job("a")
    # The name is free again.
    scheduler.add_job(_noop, every(10), name="a")


def test_jobs_given_the_same_options_share_their_checked_settings(scheduler: Scheduler) -> None:
    berlin = timezone(timedelta(hours=2))
    start = datetime(2030, 1, 1, 2, tzinfo=berlin)
    options: dict[str, typing.Any] = {"tags": ["a"], "start_at": start, "alert_after": 90}
    a = scheduler.add_job(_noop, every(10), name="a", **options)
    b = scheduler.add_job(_noop, every(10), name="b", **options)
    # One record of the rarely read options for both (what makes a job of many alike small),
    # and each reads the checked values through it.
    assert a._settings is b._settings
    assert (b.tags, b.start_at, b.alert_after) == (frozenset({"a"}), start, 90.0)
    assert b.start_at is not None and b.start_at.tzinfo is not None
    assert b.start_at.utcoffset() == timedelta(0)
    assert (b.distributed, b.locker, b.recover, b.coordinated) == (True, None, False, True)
    # A list given again after a change is read again, not taken for the last job's.
    options["tags"].append("b")
    c = scheduler.add_job(_noop, every(10), name="c", **options)
    assert c.tags == frozenset({"a", "b"}) and b.tags == frozenset({"a"})
    assert c._settings is not b._settings
    assert "tags=frozenset({" in repr(c) and repr(c).startswith("Job(name='c', func=")
    with pytest.raises(ScheduleError, match="job 'd': recover must be True or False, got 1"):
        scheduler.add_job(_noop, every(10), name="d", **options, recover=1)  # type: ignore[arg-type]


def test_each_option_reaches_its_own_field(scheduler: Scheduler) -> None:
    # add_job hands the options on by position (bound once, not twice): given a distinct
    # value each, every one must come out where it was put, durations as float seconds.
    locker = InMemoryLocker()
    start, stop = T0 + timedelta(hours=1), T0 + timedelta(hours=2)

    async def task(a: int, *, k: int) -> None:  # the args are checked against it
        pass

    job = scheduler.add_job(
        task,
        every(10),
        name="all",
        args=(1,),
        kwargs={"k": 2},
        tags="t",
        timeout=3,
        overlap="queue",
        jitter=4,
        max_runs=5,
        start_at=start,
        stop_at=stop,
        misfire_grace=6,
        distributed=False,
        locker=locker,
        recover=True,
        alert_after=7,
    )
    assert (job.name, job.args, dict(job.kwargs), job.tags) == (
        "all",
        (1,),
        {"k": 2},
        frozenset({"t"}),
    )
    assert (job.timeout, job.overlap, job.jitter, job.max_runs) == (3.0, "queue", 4.0, 5)
    assert (job.start_at, job.stop_at, job.misfire_grace) == (start, stop, 6.0)
    assert (job.distributed, job.locker, job.recover, job.alert_after) == (
        False,
        locker,
        True,
        7.0,
    )
    assert job.schedule == every(10)


def test_every_keeps_one_schedule_for_the_same_anchor_given_anew() -> None:
    first = every(60, anchor=datetime(2030, 1, 1, 0, 0, 5, tzinfo=UTC))
    again = every(60, anchor=datetime(2030, 1, 1, 0, 0, 5, tzinfo=UTC))
    other = every(60, anchor=datetime(2030, 1, 1, 0, 0, 6, tzinfo=UTC))
    assert again is first and other != first
    assert every(60.0, anchor=first.anchor) is not first  # the type of the interval counts
    with pytest.raises(ScheduleError, match="anchor"):
        every(60, anchor=datetime(2030, 1, 1, 0, 0, 5))  # naive: refused, never taken from memo


async def test_second_start_raises(scheduler: Scheduler) -> None:
    await scheduler.start()
    try:
        with pytest.raises(SchedulerStateError):
            await scheduler.start()
    finally:
        await scheduler.shutdown()
    await scheduler.shutdown()


async def test_run_now_needs_a_running_scheduler(scheduler: Scheduler) -> None:
    job = scheduler.add_job(_noop, every(10), name="j")
    with pytest.raises(SchedulerStateError):
        await job.run_now()


async def test_lifecycle_events_and_async_listeners(scheduler: Scheduler, clock: FakeClock) -> None:
    sync_seen = Recorder()
    async_seen: list[Event] = []

    async def listener(event: Event) -> None:
        async_seen.append(event)

    scheduler.subscribe(sync_seen)
    scheduler.subscribe(listener, JobSucceeded)
    scheduler.add_job(_noop, every(10), name="j")
    async with scheduler:
        await clock.advance(10)
    kinds = [type(e) for e in sync_seen.events]
    assert kinds == [SchedulerStarted, JobStarted, JobSucceeded, SchedulerStopped]
    assert [type(e) for e in async_seen] == [JobSucceeded]


async def test_failing_listener_is_logged_and_harmless(
    scheduler: Scheduler, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    def bad(event: Event) -> None:
        raise ValueError("listener bug")

    async def bad_async(event: Event) -> None:
        raise ValueError("async listener bug")

    scheduler.subscribe(bad)
    scheduler.subscribe(bad_async)
    job = scheduler.add_job(_noop, every(10), name="j")
    with caplog.at_level(logging.ERROR):
        async with scheduler:
            await clock.advance(10)
    assert job.last_success is not None
    assert any("listener" in r.getMessage() for r in caplog.records)


async def test_unsubscribe_stops_delivery(scheduler: Scheduler, clock: FakeClock) -> None:
    rec = Recorder()
    sub = scheduler.subscribe(rec, JobStarted)
    scheduler.add_job(_noop, every(10), name="j")
    async with scheduler:
        await clock.advance(10)
        sub.unsubscribe()
        sub.unsubscribe()
        await clock.advance(10)
    assert len(rec.events) == 1


def test_events_are_frozen() -> None:
    event = JobStarted("j", T0, T0, 1)
    with pytest.raises(AttributeError):
        event.job = "other"  # type: ignore[misc]


def test_colliding_lock_keys_are_rejected(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FNV-1a 64 collisions between sensible names are too rare to find by hand, so make
    # every name hash alike: the check itself is what is under test.
    monkeypatch.setattr("cronlock._scheduler.job_lock_key", lambda name: 42)  # add and remove
    scheduler = Scheduler(clock=clock, locker=InMemoryLocker())
    scheduler.add_job(_noop, every(10), name="first")
    with pytest.raises(JobConflictError, match=r"'first' and 'second'.*lock key 42"):
        scheduler.add_job(_noop, every(10), name="second")
    # A job's own locker takes a lock too; a job that takes none has no key to collide.
    own = Scheduler(clock=clock)
    own.add_job(_noop, every(10), name="first", locker=InMemoryLocker())
    own.add_job(_noop, every(10), name="plain")
    with pytest.raises(JobConflictError, match=r"'first' and 'second'.*lock key 42"):
        own.add_job(_noop, every(10), name="second", locker=InMemoryLocker())
    scheduler.add_job(_noop, every(10), name="local", distributed=False)
    # Removing a job frees its key (and its name) for another.
    scheduler.remove("first")
    scheduler.add_job(_noop, every(10), name="second")
    assert [job.name for job in scheduler.jobs] == ["local", "second"]


def test_the_names_of_a_hold_before_its_rename_still_import_with_a_warning() -> None:
    import cronlock
    import cronlock.postgres

    renamed = {
        (cronlock, "Lease"): cronlock.Hold,
        (cronlock, "RecordingLease"): cronlock.RecordingHold,
        (cronlock, "LosableLease"): cronlock.LosableHold,
        (cronlock.postgres, "PostgresLease"): cronlock.postgres.PostgresHold,
    }
    for (module, old), new in renamed.items():
        with pytest.warns(DeprecationWarning, match=rf"{old} is now {new.__name__}"):
            assert getattr(module, old) is new
    assert "Lease" not in cronlock.__all__
