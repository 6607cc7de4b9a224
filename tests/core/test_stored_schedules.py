"""Stored schedules on the fake clock: each kind reads back to the same slots, and a
scheduler registers, changes and drops their jobs at its syncs, at exact instants."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock import (
    InMemoryLocker,
    JobSucceeded,
    RunContext,
    Schedule,
    ScheduleError,
    Scheduler,
    ScheduleRejected,
    ScheduleStore,
    StoredSchedule,
    cron,
    daily,
    every,
    monthly,
    once,
    weekly,
)
from cronlock._schedules.schedule import upcoming
from cronlock._stored.json import (
    check_stored,
    kwargs_to_json,
    options_from_json,
    options_to_json,
    schedule_from_json,
    schedule_from_text,
    schedule_to_json,
)
from cronlock.testing import FakeClock

from .conftest import T0, Recorder

NY = "America/New_York"
KINDS = [
    cron("*/7 * * * *"),
    cron("30 2 * * *", tz=NY),  # a skipped and a repeated wall time in the window
    cron("*/15 * * * * *", seconds=True, tz="Europe/Berlin"),
    every(minutes=90, anchor=datetime(2026, 3, 1, 0, 17, 3, 250, tzinfo=UTC)),
    daily(["01:30", "02:30:15"], every=2, tz=NY),
    weekly(["sun", "wed"], "02:30", tz=NY),
    monthly([1, -1], "23:59", every=3, tz="Asia/Kolkata"),
    once([datetime(2026, 3, 8, 7, 0, tzinfo=UTC), datetime(2026, 11, 1, 6, 30, tzinfo=UTC)]),
]


@pytest.mark.parametrize("schedule", KINDS, ids=str)
def test_every_kind_reads_back_to_the_sameupcoming(schedule: Schedule) -> None:
    data = json.loads(json.dumps(schedule_to_json(schedule, owner="s")))  # through text
    back = schedule_from_json(data)
    # Around both DST changes in New York and Berlin of 2026.
    for start in (datetime(2026, 3, 7, tzinfo=UTC), datetime(2026, 10, 24, tzinfo=UTC)):
        assert upcoming(back, start, 60) == upcoming(schedule, start, 60)
        assert upcoming(back, start, 1)


def test_a_schedule_without_a_zone_is_stored_in_utc() -> None:
    data = schedule_to_json(cron("0 3 * * *"), owner="s")
    assert data["tz"] == "UTC"
    back = schedule_from_json(data)
    assert back.next_after(T0) == datetime(2026, 1, 1, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: schedule_to_json(once(), owner="r:1"), "'r:1': once at start cannot be stored"),
        (lambda: kwargs_to_json({"at": datetime.now(UTC)}, owner="r:1"), "'r:1': kwargs are not"),
        (lambda: kwargs_to_json({"ids": (1, 2)}, owner="r:1"), "would not read back the same"),
        (lambda: kwargs_to_json({"x": float("nan")}, owner="r:1"), "kwargs are not JSON"),
        (lambda: kwargs_to_json([1], owner="r:1"), "kwargs must be a mapping"),  # type: ignore[arg-type]
        (lambda: options_to_json({"max_runs": 3}, owner="r:1"), "max_runs cannot be stored"),
        (lambda: options_to_json({"locker": None}, owner="r:1"), "locker cannot be stored"),
        (lambda: options_to_json({"timeout": -1}, owner="r:1"), "timeout"),
        (lambda: options_to_json({"stop_at": datetime(2027, 1, 1)}, owner="r:1"), "stop_at"),
    ],
)
def test_what_cannot_be_stored_is_refused_naming_the_schedule(call: Any, words: str) -> None:
    with pytest.raises(ScheduleError, match="r:1") as caught:
        call()
    assert words.split("'r:1'")[-1].strip(": ") in str(caught.value)


def test_options_read_back_as_given() -> None:
    given = {
        "timeout": timedelta(minutes=10),
        "overlap": "queue",
        "jitter": 2,
        "misfire_grace": None,
        "start_at": datetime(2026, 5, 1, 12, tzinfo=UTC),
        "stop_at": datetime(2027, 5, 1, 8, tzinfo=UTC),
        "tags": ["reports", "tenant"],
        "recover": True,
        "alert_after": 30.5,
    }
    back = options_from_json(json.loads(json.dumps(options_to_json(given, owner="s"))))
    assert back == {**given, "timeout": 600.0, "jitter": 2.0, "tags": ["reports", "tenant"]}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"cron": "0 3 * * *"}, cron("0 3 * * *", tz="UTC")),
        ({"cron": "*/5 0 3 * * *", "seconds": True, "tz": "Europe/Berlin"},
         cron("*/5 0 3 * * *", seconds=True, tz="Europe/Berlin")),
        ({"every": "90"}, every(90)),
        ({"every": 1.5, "anchor": "2026-05-01T00:00:00Z"},
         every(1.5, anchor=datetime(2026, 5, 1, tzinfo=UTC))),
        ({"at": ["2030-01-01T00:00:00+02:00"]},
         once([datetime(2029, 12, 31, 22, tzinfo=UTC)])),
        ({}, None),
    ],
)  # fmt: skip
def test_schedule_text_is_read_as_each_caller_gives_it(
    given: dict[str, Any], expected: Schedule | None
) -> None:
    made = schedule_from_text(**given)
    if expected is None:
        assert made is None
    else:
        assert made is not None
        assert upcoming(made, T0, 3) == upcoming(expected, T0, 3)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"cron": "0 3 * * *", "every": "60"}, "give a cron expression or an interval, not both"),
        ({"every": "soon"}, "--every: not a number of seconds: 'soon'"),
        ({"every": 60, "anchor": "noon"}, "--anchor: not an ISO 8601 instant: 'noon'"),
        ({"at": ["2030-01-01T00:00:00"]}, "--at: '2030-01-01T00:00:00' names no zone"),
        ({"cron": "0 3 * *"}, "expected 5 fields"),
    ],
)
def test_schedule_text_errors_name_the_field_as_the_caller_does(
    given: dict[str, Any], message: str
) -> None:
    flags = {"every": "--every", "anchor": "--anchor", "at": "--at"}
    with pytest.raises(ScheduleError, match=re.escape(message)):
        schedule_from_text(**given, labels=flags)


@pytest.mark.parametrize(
    "options",
    [
        {"overlap": "sometimes"},
        {"timeout": -1},
        {"retries": -1},
        {"retries": 2, "retry_delay": "soon"},
        {"jitter": 120},
        {"recover": None},
        {"start_at": datetime(2027, 1, 1, tzinfo=UTC), "stop_at": datetime(2026, 1, 1, tzinfo=UTC)},
        {"misfire_grace": 3600, "alert_after": 0},
    ],
)
def test_stored_options_are_refused_as_add_job_refuses_them(options: dict[str, Any]) -> None:
    schedule = every(60)
    with pytest.raises(ScheduleError) as stored:
        check_stored("r:1", schedule, options)

    async def task() -> None:
        pass

    with pytest.raises(ScheduleError) as added:
        Scheduler().add_job(task, schedule, name="r:1", **options)
    assert str(stored.value) == str(added.value)


def test_stored_options_are_checked_into_the_settings_add_job_makes() -> None:
    options: dict[str, Any] = {
        "timeout": 30,
        "tags": ["a"],
        "retries": 2,
        "start_at": T0,
        "jitter": 1,
    }

    async def task() -> None:
        pass

    job = Scheduler().add_job(task, daily("03:00"), name="r:1", **options)
    schedule, settings = check_stored("r:1", daily("03:00"), options)
    assert settings._key() == job._settings._key()
    assert upcoming(schedule, T0, 3) == upcoming(job._schedule, T0, 3)


class MemoryStore(InMemoryLocker):
    """An in-process locker that keeps stored schedules, as PostgresLocker does."""

    def __init__(self) -> None:
        super().__init__()
        self.revision = 0
        self.rows: dict[str, tuple[int, StoredSchedule | None]] = {}
        self.reads = 0
        self.problems: list[tuple[str, int, str]] = []

    def put(self, name: str, task: str, schedule: Schedule, **fields: Any) -> None:
        self.revision += 1
        stored = StoredSchedule(name, task, schedule, revision=self.revision, **fields)
        self.rows[name] = (self.revision, stored)

    def drop(self, name: str) -> None:
        self.revision += 1
        self.rows[name] = (self.revision, None)

    async def stored_changes(self, since: int) -> tuple[int, list[Any]]:
        self.reads += 1
        changes = [(n, r, s) for n, (r, s) in self.rows.items() if r > since]
        return self.revision, sorted(changes, key=lambda change: change[1])

    async def report_problem(self, name: str, revision: int, problem: str) -> None:
        self.problems.append((name, revision, problem))


def _started(events: Recorder, name: str) -> list[tuple[datetime, Any]]:
    return [(e.slot, e.return_value) for e in events.of(JobSucceeded) if e.job == name]  # type: ignore[attr-defined]


def _names(scheduler: Scheduler) -> list[str]:
    return list(scheduler.stored_jobs)


def _rejections(events: Recorder) -> list[ScheduleRejected]:
    return [e for e in events.events if isinstance(e, ScheduleRejected)]


async def _scheduler(clock: FakeClock, store: MemoryStore) -> tuple[Scheduler, Recorder]:
    scheduler = Scheduler(clock=clock, locker=store, sync_every=2)
    events = Recorder()
    scheduler.subscribe(events)

    @scheduler.task("report")
    async def report(ctx: RunContext, tenant: int) -> tuple[str, int]:
        return ctx.job, tenant

    return scheduler, events


def test_the_memory_store_is_a_schedule_store() -> None:
    assert isinstance(MemoryStore(), ScheduleStore)
    assert not isinstance(InMemoryLocker(), ScheduleStore)


async def test_stored_schedules_are_loaded_at_start_and_run_with_their_kwargs(
    clock: FakeClock,
) -> None:
    store = MemoryStore()
    for tenant in (1, 2):
        store.put(f"report:{tenant}", "report", every(60), kwargs={"tenant": tenant})
    scheduler, events = await _scheduler(clock, store)
    async with scheduler:
        assert _names(scheduler) == ["report:1", "report:2"]
        assert store.reads == 1  # one read for all of them
        await clock.advance(120)
    minute = timedelta(minutes=1)
    assert _started(events, "report:1") == [
        (T0 + minute, ("report:1", 1)),
        (T0 + 2 * minute, ("report:1", 1)),
    ]
    assert _started(events, "report:2")[0] == (T0 + minute, ("report:2", 2))


async def test_changes_apply_at_the_sync_after_them(clock: FakeClock) -> None:
    store = MemoryStore()
    scheduler, events = await _scheduler(clock, store)
    async with scheduler:
        store.put("r", "report", every(10), kwargs={"tenant": 7})  # after the load at T0
        await clock.advance(1.999)
        assert _names(scheduler) == []
        await clock.advance(0.001)  # the sync at T0+2 registers it
        assert _names(scheduler) == ["r"]
        job = scheduler.get_job("r")
        await clock.advance(28)  # slots T0+10, 20, 30
        assert [slot for slot, _ in _started(events, "r")] == [
            T0 + timedelta(seconds=s) for s in (10, 20, 30)
        ]
        store.put("r", "report", every(7), kwargs={"tenant": 7})  # schedule only, at T0+30
        await clock.advance(2)  # synced at T0+32: the next slot is T0+35
        assert scheduler.get_job("r") is job  # the same job: history and run count kept
        assert job.run_count == 3
        await clock.advance(10)  # T0+42
        store.put("r", "report", every(7), kwargs={"tenant": 8})  # kwargs: a new job
        await clock.advance(2)  # synced at T0+44
        assert scheduler.get_job("r") is not job
        await clock.advance(6)  # T0+49
        store.drop("r")
        await clock.advance(2)  # synced at T0+50: removed before T0+56
        assert _names(scheduler) == []
        await clock.advance(60)
    ran = _started(events, "r")
    assert ran == [
        (T0 + timedelta(seconds=10), ("r", 7)),
        (T0 + timedelta(seconds=20), ("r", 7)),
        (T0 + timedelta(seconds=30), ("r", 7)),
        (T0 + timedelta(seconds=35), ("r", 7)),
        (T0 + timedelta(seconds=42), ("r", 7)),
        (T0 + timedelta(seconds=49), ("r", 8)),
    ]


async def test_a_missing_task_is_reported_once_and_the_others_run(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    store.put("good", "report", every(10), kwargs={"tenant": 1})
    store.put("orphan", "reprot", every(10), kwargs={"tenant": 2})
    store.put("bad-kwargs", "report", every(10), kwargs={"tenant": 3, "extra": True})
    scheduler, events = await _scheduler(clock, store)
    scheduler.add_job(lambda: None, every(3600), name="clash")
    store.put("clash", "report", every(10), kwargs={"tenant": 4})
    with caplog.at_level(logging.WARNING, logger="cronlock"):
        async with scheduler:
            await clock.advance(30)  # fifteen syncs
            assert _names(scheduler) == ["good"]
            rejected = {e.schedule: e for e in _rejections(events)}
            assert sorted(rejected) == ["bad-kwargs", "clash", "orphan"]
            assert len(events.of(ScheduleRejected)) == 3  # once each, not once per sync
            assert "no task 'reprot' on this replica (did you mean 'report'?)" in (
                rejected["orphan"].reason
            )
            assert "extra" in rejected["bad-kwargs"].reason
            assert "defined in code" in rejected["clash"].reason
            assert sorted(name for name, _, _ in store.problems) == [
                "bad-kwargs",
                "clash",
                "orphan",
            ]
            warned = [r for r in caplog.records if "is not run here" in r.getMessage()]
            assert len(warned) == 3

            @scheduler.task("reprot")  # the task shows up (a late import, say)
            async def reprot(tenant: int) -> int:
                return tenant

            await clock.advance(2)
            assert _names(scheduler) == ["good", "orphan"]
            await clock.advance(8)
    assert [slot for slot, _ in _started(events, "good")] == [
        T0 + timedelta(seconds=s) for s in (10, 20, 30, 40)
    ]
    assert _started(events, "orphan") == [(T0 + timedelta(seconds=40), 2)]


async def test_a_changed_revision_is_reported_again(clock: FakeClock) -> None:
    store = MemoryStore()
    store.put("orphan", "nope", every(10))
    scheduler, events = await _scheduler(clock, store)
    async with scheduler:
        await clock.advance(4)
        store.put("orphan", "nope", every(20))
        await clock.advance(4)
    assert [e.revision for e in _rejections(events)] == [1, 2]


def test_tasks_are_named_and_a_second_function_under_one_name_is_refused() -> None:
    scheduler = Scheduler()

    @scheduler.task
    def plain() -> None: ...

    @scheduler.task("named")
    def other() -> None: ...

    assert scheduler.tasks == {f"{__name__}.{plain.__qualname__}": plain, "named": other}
    scheduler.task("named")(other)  # the same function again: harmless
    with pytest.raises(Exception, match="a task named 'named' is already registered"):
        scheduler.task("named")(plain)
    with pytest.raises(Exception, match="task: name must be a non-empty string"):
        scheduler.task("")(plain)


async def test_no_store_no_sync(clock: FakeClock) -> None:
    scheduler = Scheduler(clock=clock, locker=InMemoryLocker())
    scheduler.task("t")(lambda: None)
    async with scheduler:
        await clock.advance(10)
        assert _names(scheduler) == []


async def test_a_stored_job_the_application_removed_does_not_stop_the_sync(
    clock: FakeClock,
) -> None:
    store = MemoryStore()
    store.put("a", "report", every(10), kwargs={"tenant": 1})
    scheduler, events = await _scheduler(clock, store)
    async with scheduler:
        scheduler.remove("a")  # by hand, behind the store's back
        store.drop("a")
        store.put("b", "report", every(10), kwargs={"tenant": 2})
        await clock.advance(2)
        assert _names(scheduler) == ["b"]  # the sync went on past the removal
        await clock.advance(10)
    assert [slot for slot, _ in _started(events, "b")] == [T0 + timedelta(seconds=10)]
