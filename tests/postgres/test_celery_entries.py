"""A Celery app's beat_schedule as cronlock jobs: what is converted, how, and what is refused.

Also the task id (the same for the same ledger, entry and slot; another for any other),
the settings read from the app's configuration, and what one send passes to Celery.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar

import cronlock
from cronlock import ConfigError, RunContext
from cronlock.celery import (
    ATTEMPT_HEADER,
    SEND_HEADER,
    SLOT_HEADER,
    BeatEntry,
    BeatSettings,
    EntryOptions,
    beat_entries,
    beat_scheduler,
    convert_entry,
    task_id,
)
from cronlock.celery._runner import sender

pytestmark = pytest.mark.postgres  # the Celery extra's tests run where its servers are

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday


def app_with(**conf: Any) -> Celery:
    app = Celery("entries-test", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    return app


def slots(entry: BeatEntry, n: int = 4, after: datetime = T0) -> list[datetime]:
    found: list[datetime] = []
    for _ in range(n):
        nxt = entry.schedule.next_after(after)
        assert nxt is not None
        found.append(nxt)
        after = nxt
    return found


def one(schedule: object, zone: str = "UTC", **extra: Any) -> BeatEntry:
    return convert_entry("nightly", {"task": "proj.t", "schedule": schedule, **extra}, zone)


# -- crontab ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expression"),
    [
        (crontab(), "* * * * *"),
        (crontab(minute="*/15"), "*/15 * * * *"),
        (crontab(minute=0, hour=3), "0 3 * * *"),
        (crontab(minute=0, hour="*/2"), "0 */2 * * *"),
        (crontab(minute=30, hour=7, day_of_week="mon-fri"), "30 7 * * 1,2,3,4,5"),
        (crontab(minute=0, hour=0, day_of_week="sunday"), "0 0 * * 0"),
        (crontab(minute=0, hour=0, day_of_month="1,15"), "0 0 1,15 * *"),
        (crontab(minute=0, hour=0, day_of_month=1, month_of_year="*/3"), "0 0 1 */3 *"),
        (crontab(minute="5,10", hour="9-11"), "5,10 9,10,11 * * *"),
    ],
)
def test_a_crontab_becomes_the_cron_expression_of_its_expanded_fields(
    given: crontab, expression: str
) -> None:
    converted = one(given)
    assert str(converted.schedule) == f"cron {expression!r} in UTC"


def test_a_crontab_fires_on_the_instants_celery_computes() -> None:
    # Weekdays at 07:30 and 17:30 in Berlin: Monday 2 March 2026 is the first.
    entry = one(crontab(minute=30, hour="7,17", day_of_week="mon-fri"), "Europe/Berlin")
    berlin = ZoneInfo("Europe/Berlin")
    assert [s.astimezone(berlin).strftime("%a %H:%M") for s in slots(entry, 5)] == [
        "Mon 17:30", "Tue 07:30", "Tue 17:30", "Wed 07:30", "Wed 17:30",
    ]  # fmt: skip
    friday = datetime(2026, 3, 6, 17, 0, tzinfo=berlin)
    assert [s.astimezone(berlin).strftime("%a %d %H:%M") for s in slots(entry, 2, friday)] == [
        "Fri 06 17:30",
        "Mon 09 07:30",
    ]


def test_crontabs_are_read_in_the_apps_zone() -> None:
    app = app_with(
        timezone="America/New_York",
        beat_schedule={"n": {"task": "t", "schedule": crontab(minute=0, hour=9)}},
    )
    (entry,) = beat_entries(app)
    first = entry.schedule.next_after(T0)
    assert first is not None
    assert first.astimezone(ZoneInfo("America/New_York")).hour == 9
    assert first == datetime(2026, 3, 2, 14, 0, tzinfo=UTC)  # EST, UTC-5


def test_utc_when_the_app_names_no_zone_and_enable_utc_is_on() -> None:
    app = app_with(beat_schedule={"n": {"task": "t", "schedule": crontab(minute=0, hour=9)}})
    (entry,) = beat_entries(app)
    assert entry.schedule.next_after(T0) == datetime(2026, 3, 3, 9, 0, tzinfo=UTC)


def test_the_hosts_zone_is_refused() -> None:
    app = app_with(enable_utc=False, beat_schedule={"n": {"task": "t", "schedule": 60}})
    with pytest.raises(ConfigError, match="no timezone and enable_utc is off"):
        beat_entries(app)


def test_both_day_fields_restricted_is_refused_naming_the_entry() -> None:
    with pytest.raises(ConfigError) as caught:
        one(crontab(minute=0, hour=0, day_of_month=13, day_of_week="fri"))
    message = str(caught.value)
    assert "'nightly'" in message
    assert "day_of_month and day_of_week" in message


# -- intervals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        30,
        30.0,
        timedelta(seconds=30),
        schedule(timedelta(seconds=30)),
        schedule(30),
    ],
)
def test_an_interval_becomes_every_with_slots_aligned_to_the_epoch(given: object) -> None:
    entry = one(given)
    assert slots(entry, 3, datetime(2026, 3, 2, 12, 0, 10, tzinfo=UTC)) == [
        datetime(2026, 3, 2, 12, 0, 30, tzinfo=UTC),
        datetime(2026, 3, 2, 12, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 2, 12, 1, 30, tzinfo=UTC),
    ]


def test_relative_is_accepted_and_changes_nothing() -> None:
    assert slots(one(60, relative=True)) == slots(one(60))


# -- refused ------------------------------------------------------------------------------


def _solar() -> solar:
    # solar() needs the ephem package at construction; the refusal does not, so build one
    # without it (as a pickled beat_schedule would arrive).
    value = solar.__new__(solar)
    value.event, value.lat, value.lon = "sunrise", 52.5, 13.4
    return value


class OwnCrontab(crontab):  # type: ignore[misc]  # celery is untyped
    """A subclass may compute its own instants: cronlock cannot know them."""


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (_solar(), "is a solar schedule"),
        (OwnCrontab(minute=0), "OwnCrontab, which cronlock does not know"),
        ("*/5 * * * *", "builtins.str, which cronlock does not know"),
        (-5, "is not a positive number of seconds"),
        (0, "is not a positive number of seconds"),
        (float("nan"), "is not a positive number of seconds"),
        (timedelta(0), "is not a positive interval"),
        (True, "is not a schedule"),
    ],
)
def test_a_schedule_cronlock_cannot_honour_is_refused_naming_entry_field_and_value(
    given: object, says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        one(given)
    message = str(caught.value)
    assert message.startswith("beat_schedule entry 'nightly': schedule ")
    assert repr(given) in message or isinstance(given, float)
    assert says in message


def test_solar_is_refused_when_the_app_is_read() -> None:
    app = app_with(
        beat_schedule={
            "fine": {"task": "t", "schedule": 60},
            "dawn": {"task": "t", "schedule": _solar()},
        }
    )
    with pytest.raises(ConfigError, match="entry 'dawn': schedule <solar: sunrise"):
        beat_entries(app)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"schedule": 60}, "task None is not a task name"),
        ({"task": "", "schedule": 60}, "task '' is not a task name"),
        ({"task": "t"}, "has no schedule"),
        ({"task": "t", "schedule": 60, "shedule": 5}, "key 'shedule' is not a beat entry key"),
        ({"task": "t", "schedule": 60, "args": "abc"}, "args 'abc' is not a list or tuple"),
        ({"task": "t", "schedule": 60, "args": {"a": 1}}, "is not a list or tuple"),
        ({"task": "t", "schedule": 60, "kwargs": [1]}, "kwargs [1] is not a mapping"),
        ({"task": "t", "schedule": 60, "options": "q"}, "options 'q' is not a mapping"),
        (
            {"task": "t", "schedule": 60, "options": {"task_id": "x"}},
            "options key 'task_id' cannot be set",
        ),
        (
            {"task": "t", "schedule": 60, "options": {"headers": "h"}},
            "options.headers 'h' is not a mapping",
        ),
        ({"task": "t", "schedule": 60, "relative": "yes"}, "relative 'yes' is not True or False"),
        ({"task": "t", "schedule": 60, "cronlock": {"retry": 2}}, "cronlock key 'retry'"),
        (
            {"task": "t", "schedule": 60, "cronlock": {"retries": -1}},
            "cronlock.retries -1 is not a whole number",
        ),
        (
            {"task": "t", "schedule": 60, "cronlock": {"misfire_grace": "1m"}},
            "cronlock.misfire_grace '1m' is not seconds",
        ),
        (
            {"task": "t", "schedule": 60, "cronlock": {"recover": 1}},
            "cronlock.recover 1 is not True or False",
        ),
        ({"task": "t", "schedule": 60, "cronlock": 3}, "cronlock 3 is not a mapping"),
    ],
)
def test_a_malformed_entry_is_refused_naming_the_field(entry: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        convert_entry("nightly", entry)
    assert "'nightly'" in str(caught.value)
    assert says in str(caught.value)


def test_what_an_entry_gives_is_kept() -> None:
    entry = one(
        60,
        args=[1, 2],
        kwargs={"a": 3},
        options={"queue": "q", "priority": 5, "expires": 30, "headers": {"h": "v"}},
        cronlock={"retries": 1, "retry_delay": timedelta(seconds=2), "recover": False},
    )
    assert entry.task == "proj.t"
    assert entry.args == (1, 2)
    assert entry.kwargs == {"a": 3}
    assert entry.options == {"queue": "q", "priority": 5, "expires": 30, "headers": {"h": "v"}}
    assert entry.cronlock == EntryOptions(retries=1, retry_delay=2.0, recover=False)


# -- the task id --------------------------------------------------------------------------


def test_the_task_id_is_the_same_for_the_same_ledger_entry_and_slot() -> None:
    first = task_id("cronlock_runs", "nightly", T0)
    assert first == task_id("cronlock_runs", "nightly", T0)
    # The same instant in another zone is the same slot.
    assert first == task_id("cronlock_runs", "nightly", T0.astimezone(ZoneInfo("Asia/Tokyo")))
    assert uuid.UUID(first).version == 5
    # Fixed for good: a worker's stored ids stay valid across releases.
    assert first == "116b111d-9871-5cf0-b0c8-5c93a6b5bc69"


def test_the_task_id_differs_per_slot_entry_and_ledger() -> None:
    ids = {
        task_id("cronlock_runs", "nightly", T0),
        task_id("cronlock_runs", "nightly", T0 + timedelta(seconds=1)),
        task_id("cronlock_runs", "nightly", T0 + timedelta(microseconds=1)),
        task_id("cronlock_runs", "hourly", T0),
        task_id("other.cronlock_runs", "nightly", T0),
        task_id("cronlock_run", "snightly", T0),  # no ambiguity where the parts meet
    }
    assert len(ids) == 6


def test_a_naive_slot_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        task_id("cronlock_runs", "nightly", datetime(2026, 3, 2, 12))


# -- settings -----------------------------------------------------------------------------


def test_settings_come_from_the_apps_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRONLOCK_DSN", raising=False)
    app = app_with(
        cronlock_dsn="postgresql://db/app",
        cronlock_mode="lease",
        cronlock_ledger="beat_runs",
        cronlock_schema="ops",
        cronlock_misfire_grace=timedelta(minutes=5),
        cronlock_retries=0,
    )
    settings = BeatSettings.from_app(app)
    assert settings.dsn == "postgresql://db/app"
    assert settings.mode == "lease"
    assert settings.ledger_name == "ops.beat_runs"
    assert settings.misfire_grace == 300.0
    assert settings.retries == 0
    assert BeatSettings.from_app(app, mode="session").mode == "session"


def test_the_dsn_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONLOCK_DSN", "postgresql://env/db")
    settings = BeatSettings.from_app(app_with())
    assert settings.dsn == "postgresql://env/db"
    defaults = (settings.mode, settings.ledger_name, settings.retries)
    assert defaults == ("session", "cronlock_runs", 3)
    monkeypatch.delenv("CRONLOCK_DSN")
    with pytest.raises(ConfigError, match="set cronlock_dsn"):
        BeatSettings.from_app(app_with())


@pytest.mark.parametrize(
    ("conf", "says"),
    [
        ({"cronlock_mdoe": "lease"}, "'cronlock_mdoe' is not a cronlock setting"),
        ({"cronlock_mode": "advisory"}, "cronlock_mode: .*mode must be 'session' or 'lease'"),
        ({"cronlock_retries": 1.5}, "cronlock_retries must be a whole number"),
        ({"cronlock_timeout": 0}, "cronlock_timeout must be seconds"),
        ({"cronlock_recover": "no"}, "cronlock_recover must be True or False"),
        ({"cronlock_locker_options": ["lease"]}, "cronlock_locker_options must be a mapping"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(conf: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        BeatSettings.from_app(app_with(cronlock_dsn="postgresql://db/app", **conf))


# -- the jobs, and one send ------------------------------------------------------------------


def test_each_entry_is_a_job_with_the_settings_and_its_own_overrides() -> None:
    app = app_with(
        cronlock_dsn="postgresql://nobody@127.0.0.1:1/none",
        cronlock_retries=2,
        cronlock_misfire_grace=90,
        beat_schedule={
            "plain": {"task": "t", "schedule": 10},
            "own": {
                "task": "t",
                "schedule": crontab(minute=0),
                "cronlock": {"retries": 0, "misfire_grace": 5, "recover": False, "timeout": 3},
            },
        },
    )
    scheduler = beat_scheduler(app)
    plain, own = scheduler.jobs
    assert (plain.name, plain.retries, plain.misfire_grace, plain.recover) == (
        "plain",
        2,
        90.0,
        True,
    )
    assert plain.timeout == 30.0
    assert (own.name, own.retries, own.misfire_grace, own.recover, own.timeout) == (
        "own",
        0,
        5.0,
        False,
        3.0,
    )


class Recorder:
    """Stands in for a Celery app's send: what it was asked."""

    def __init__(self) -> None:
        self.tasks: dict[str, Any] = {}
        self.sent: list[tuple[Any, ...]] = []

    def send_task(self, name: str, args: Any, kwargs: Any, **options: Any) -> None:
        self.sent.append((name, args, kwargs, options))


def test_a_send_carries_the_slots_id_the_entrys_options_and_the_headers() -> None:
    app = Recorder()
    entry = one(
        60,
        args=(1,),
        kwargs={"k": "v"},
        options={"queue": "reports", "routing_key": "r", "expires": 30, "headers": {"h": 1}},
    )
    send = sender(app, entry, "cronlock_runs")
    send(RunContext("nightly", T0, T0, 1, attempt=2))
    send(RunContext("nightly", T0, T0, 1, attempt=2))
    (name, args, kwargs, options), again = app.sent
    assert (name, args, kwargs) == ("proj.t", [1], {"k": "v"})
    assert options["task_id"] == task_id("cronlock_runs", "nightly", T0)
    assert (options["queue"], options["routing_key"], options["expires"]) == ("reports", "r", 30)
    headers = options["headers"]
    assert headers["h"] == 1
    assert headers[SLOT_HEADER] == T0.isoformat()
    assert headers[ATTEMPT_HEADER] == 2
    # Two sends of one slot: one task id, two send ids (a worker tells them apart).
    assert again[3]["task_id"] == options["task_id"]
    assert again[3]["headers"][SEND_HEADER] != headers[SEND_HEADER]


def test_a_registered_task_is_sent_through_its_apply_async() -> None:
    app = app_with()
    calls: list[tuple[Any, ...]] = []

    @app.task(name="proj.t")  # type: ignore[untyped-decorator]
    def t(x: int) -> None: ...

    def apply_async(args: Any, kwargs: Any, **options: Any) -> None:
        calls.append((args, kwargs, options))

    t.apply_async = apply_async
    sender(app, one(60, args=(5,)), "cronlock_runs")(RunContext("nightly", T0, T0, 1))
    ((args, kwargs, options),) = calls
    assert (args, kwargs) == ([5], {})
    assert options["task_id"] == task_id("cronlock_runs", "nightly", T0)


# -- refused at start, by both ways of running it -----------------------------------------

BAD_APP = """
from celery import Celery
from celery.schedules import crontab

app = Celery("badapp", broker="memory://")
app.conf.cronlock_dsn = "postgresql://nobody@127.0.0.1:1/none"
app.conf.beat_schedule = {
    "fine": {"task": "t", "schedule": 60},
    "payday": {"task": "t", "schedule": crontab(minute=0, day_of_month=1, day_of_week=5)},
}
"""


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "cronlock", "celery-beat", "-A", "badapp"],
        ["-m", "celery", "-A", "badapp", "beat", "-S", "cronlock.celery.BeatScheduler"],
    ],
    ids=["cronlock-celery-beat", "celery-beat"],
)
def test_an_entry_that_cannot_be_honoured_stops_the_beat_at_start(
    command: list[str], tmp_path: Path
) -> None:
    (tmp_path / "badapp.py").write_text(BAD_APP)
    src = Path(cronlock.__file__).parents[1]
    done = subprocess.run(
        [sys.executable, *command],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(tmp_path)])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "beat_schedule entry 'payday': schedule <crontab: 0 * 1 * 5" in said
    assert "restricts both day_of_month and day_of_week" in said


def test_the_command_line_names_an_app_it_cannot_load(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cronlock", "celery-beat", "-A", "no_such_app_here"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(cronlock.__file__).parents[1])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "cronlock: error: -A no_such_app_here: cannot load the Celery app" in done.stderr
