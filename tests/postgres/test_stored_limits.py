"""The stored schedules' limits (issue 37) at each entry point: ``FleetControl``, the
command line's ``schedules add``, the dashboard's edit form, and a replica reading a row
written by hand. Each refusal names the schedule, the field and the value."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from starlette.requests import Request

import cronlock.web
from cronlock import (
    Event,
    RunContext,
    ScheduleError,
    Scheduler,
    ScheduleRejected,
    cron,
    every,
    once,
)
from cronlock.postgres import FleetControl, PostgresLocker
from cronlock.postgres._sql.tables import LedgerTable

from ..web.test_app import _csrf, client
from .test_cli_pg import cli
from .test_stored_hostile import _every, hand_write

pytestmark = pytest.mark.postgres

LONG = "n" * 201
DEEP: dict[str, Any] = {"a": []}
_inner = DEEP["a"]
for _ in range(32):  # {"a": [[[...]]]}: 33 levels
    _inner.append([])
    _inner = _inner[0]


@pytest.fixture
def table() -> str:
    return f"limits_{uuid.uuid4().hex[:10]}"


# (FleetControl's options, add_schedule's arguments, what the message says)
REFUSED = [
    ({}, (LONG, "report", every(60)), ["'nnnnnnnn", "schedule name", "201"]),
    ({}, ("r:1", "t" * 201, every(60)), ["'r:1'", "task", "201", "'ttt"]),
    ({}, ("r:1", "report", every(60), {"kwargs": {"blob": "x" * 70_000}}), ["'r:1'", "kwargs"]),
    ({}, ("r:1", "report", every(60), {"kwargs": DEEP}), ["'r:1'", "kwargs", "32", "[[[["]),
    ({}, ("r:1", "report", every(0.5)), ["'r:1'", "0.5s", "min_interval", "1s"]),
    (
        {"min_interval": 60},
        ("r:1", "report", cron("*/30 * * * * *", seconds=True)),
        ["'r:1'", "30s", "min_interval", "60s"],
    ),
    ({"min_interval": 0.1}, ("r:1", "report", every(0.5)), ["'r:1'", "slots per day", "172800"]),
    (
        {},
        ("r:1", "report", every(60), {"misfire_grace": 1e9}),
        [
            "'r:1'",
            "misfire_grace",
            "1000000000",
        ],
    ),
    ({}, ("r:1", "report", every(60), {"retries": 1000}), ["'r:1'", "retries", "1000"]),
    (
        {},
        ("r:1", "report", once(datetime(9500, 1, 1, tzinfo=UTC))),
        ["'r:1'", "once", "9500-01-01"],
    ),
]


@pytest.mark.parametrize(("control", "args", "words"), REFUSED)
async def test_fleet_control_refuses_a_schedule_past_a_limit(
    pg_dsn: str, table: str, control: dict[str, Any], args: tuple[Any, ...], words: list[str]
) -> None:
    *positional, options = args if isinstance(args[-1], dict) else (*args, {})
    async with FleetControl(pg_dsn, table=table, **control) as fc:
        with pytest.raises(ScheduleError) as caught:
            await fc.add_schedule(*positional, **options)
        assert await fc.schedules() == []
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


async def test_fleet_control_refuses_an_update_past_a_limit(pg_dsn: str, table: str) -> None:
    async with FleetControl(pg_dsn, table=table) as fc:
        await fc.add_schedule("r:1", "report", every(60))
        with pytest.raises(ScheduleError, match=r"'r:1'.*0\.2s.*min_interval"):
            await fc.update_schedule("r:1", schedule=every(0.2))
        with pytest.raises(ScheduleError, match=r"'r:1'.*kwargs nests deeper than 32"):
            await fc.update_schedule("r:1", kwargs=DEEP)
        assert [str(s.schedule) for s in await fc.schedules()] == ["every 1m"]


async def test_fleet_control_holds_a_ledger_to_max_schedules(pg_dsn: str, table: str) -> None:
    async with FleetControl(pg_dsn, table=table, max_schedules=2) as fc:
        await fc.add_schedule("r:1", "report", every(60))
        await fc.add_schedule("r:2", "report", every(60))
        with pytest.raises(ScheduleError, match=r"'r:3'.*holds 2 .*max_schedules=2"):
            await fc.add_schedule("r:3", "report", every(60))
        await fc.remove_schedule("r:1")  # a tombstone does not count
        await fc.add_schedule("r:3", "report", every(60))
        assert [s.name for s in await fc.schedules()] == ["r:2", "r:3"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((LONG, "report", "--every", "60"), ["nnnnnnnn", "schedule name", "201"]),
        (("r:1", "t" * 201, "--every", "60"), ["'r:1'", "task", "201"]),
        (("r:1", "report", "--every", "0.5"), ["'r:1'", "0.5s", "min_interval"]),
        (
            ("r:1", "report", "--every", "60", "--kwargs", json.dumps(DEEP)),
            ["'r:1'", "kwargs nests deeper than 32"],
        ),
        (
            ("r:1", "report", "--every", "60", "--kwargs", json.dumps({"x": "y" * 70_000})),
            ["'r:1'", "kwargs is 70009 bytes"],
        ),
    ],
)
async def test_the_command_line_refuses_a_schedule_past_a_limit(
    pg_dsn: str, table: str, args: tuple[str, ...], words: list[str]
) -> None:
    done = await cli("schedules", "add", *args, "--dsn", pg_dsn, "--table", table)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)
    async with FleetControl(pg_dsn, table=table) as fc:
        assert await fc.schedules() == []


def _operator(request: Request) -> str:
    return "ops"


async def test_the_dashboard_refuses_an_edit_past_a_limit(pg_dsn: str, table: str) -> None:
    async with FleetControl(pg_dsn, table=table) as fc:
        await fc.add_schedule("r:1", "report", every(60))
    app = cronlock.web.app(pg_dsn, table=table, authorize=_operator)
    async with client(app) as c:
        form = {"csrf": _csrf((await c.get("/schedules")).text), "schedule": "r:1"}
        fine = await c.post("/actions/update-schedule", data={**form, "every": "0.5"})
        deep = await c.post("/actions/update-schedule", data={**form, "kwargs": json.dumps(DEEP)})
    assert fine.status_code == 400 and "min_interval" in fine.text and "0.5s" in fine.text
    assert deep.status_code == 400 and "nests deeper than 32" in deep.text
    async with FleetControl(pg_dsn, table=table) as fc:
        assert [str(s.schedule) for s in await fc.schedules()] == ["every 1m"]


# Rows written by hand past each limit, and what the replica's reason says of each.
BY_HAND: dict[str, tuple[tuple[str, str, str, str], list[str]]] = {
    "h:name-" + "n" * 200: (("report", _every(10**6), "{}", "{}"), ["schedule name", "207"]),
    "h:task": (("t" * 201, _every(10**6), "{}", "{}"), ["'h:task'", "task", "201"]),
    "h:kwargs-size": (
        ("report", _every(10**6), json.dumps({"x": "y" * 70_000}), "{}"),
        ["'h:kwargs-size'", "kwargs is 70009 bytes", '\'{"x": "yyy'],
    ),
    "h:kwargs-depth": (
        ("report", _every(10**6), json.dumps(DEEP), "{}"),
        ["'h:kwargs-depth'", "kwargs nests deeper than 32", "[[["],
    ),
    "h:interval": (("report", _every(2_000_000), "{}", "{}"), ["'h:interval'", "2s", "5s"]),
    "h:per-day": (("report", _every(500_000), "{}", "{}"), ["'h:per-day'", "172800"]),
    "h:grace": (
        ("report", _every(10**6), "{}", '{"misfire_grace": 1e9}'),
        ["'h:grace'", "misfire_grace", "1000000000"],
    ),
    "h:retries": (
        ("report", _every(10**6), "{}", '{"retries": 101}'),
        ["'h:retries'", "retries", "101"],
    ),
}


@pytest.mark.parametrize("min_interval", [5.0, 0.1])
async def test_a_replica_rejects_a_row_written_by_hand_past_a_limit(
    pg_dsn: str, table: str, min_interval: float
) -> None:
    async with FleetControl(pg_dsn, table=table) as fc:
        await fc.add_schedule("ok", "report", every(60))
    conn = await asyncpg.connect(pg_dsn)
    try:
        for name, (row, _) in BY_HAND.items():
            await hand_write(conn, LedgerTable(table), name, row)
    finally:
        await conn.close()
    locker = PostgresLocker(pg_dsn, table=table)
    scheduler = Scheduler(locker=locker, stop_timeout=0, stored_min_interval=min_interval)
    said: dict[str, str] = {}

    def rejected(event: Event) -> None:
        assert isinstance(event, ScheduleRejected)
        said[event.schedule] = event.reason

    @scheduler.task("report")
    async def report(ctx: RunContext) -> None:
        pass

    scheduler.subscribe(rejected, ScheduleRejected)
    async with scheduler:
        stored = set(scheduler.stored_jobs)
    expected = dict(BY_HAND)
    if min_interval < 2:  # every 2 s is fine here; every 0.5 s is past slots per day
        del expected["h:interval"]
        assert "h:interval" in stored
    assert set(said) == set(expected) and "ok" in stored
    for name, (_, words) in expected.items():
        for word in words:
            assert word in said[name], (word, said[name])
