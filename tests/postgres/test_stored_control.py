"""FleetControl's stored-schedule verbs against the real server: what they refuse at the
call, how an update merges, what a removal leaves; and 10,000 stored schedules loading at
a replica's start in one read."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock import (
    JobConflictError,
    JobLookupError,
    JobSucceeded,
    RunContext,
    ScheduleError,
    Scheduler,
    cron,
    every,
    once,
)
from cronlock.postgres import FleetControl, PostgresLocker

from .events import Events
from .test_cli_pg import cli

pytestmark = pytest.mark.postgres


@pytest.fixture
def table() -> str:
    return f"stored_{uuid.uuid4().hex[:10]}"


PAST = datetime(2020, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("args", "options", "words"),
    [
        ((once(),), {}, "once at start cannot be stored"),
        ((once(PAST),), {}, "never fires after"),
        ((every(60),), {"stop_at": PAST}, "never fires after"),
        ((every(60),), {"kwargs": {"when": PAST}}, "kwargs are not JSON"),
        ((every(60),), {"retires": 3}, "retires cannot be stored"),
        ((every(60),), {"max_runs": 3}, "max_runs cannot be stored"),
        ((every(60),), {"overlap": "sometimes"}, "overlap"),
        ((every(60),), {"jitter": 90}, "jitter"),
        ((every(0.01),), {}, "below the floor of 0.05s"),
    ],
)
async def test_add_refuses_what_no_replica_could_run(
    pg_dsn: str, table: str, args: tuple[Any, ...], options: dict[str, Any], words: str
) -> None:
    async with FleetControl(pg_dsn, table=table) as control:
        with pytest.raises(ScheduleError, match="'report:1'") as caught:
            await control.add_schedule("report:1", "send-report", *args, **options)
        assert words in str(caught.value)
        assert await control.schedules() == []


async def test_add_update_remove_and_what_each_refuses(pg_dsn: str, table: str) -> None:
    async with FleetControl(pg_dsn, table=table) as control:
        first = await control.add_schedule(
            "report:42",
            "send-report",
            cron("0 8 * * *", tz="America/New_York"),
            kwargs={"tenant": 42},
            timeout=600,
            tags=["reports"],
        )
        assert first.revision == 1
        with pytest.raises(JobConflictError, match="stored already"):
            await control.add_schedule("report:42", "send-report", every(60))
        with pytest.raises(JobLookupError, match=r"unknown schedule: report:24 \(did you mean"):
            await control.update_schedule("report:24", schedule=every(60))
        changed = await control.update_schedule(
            "report:42", schedule=cron("30 7 * * *", tz="America/New_York"), jitter=5
        )
        assert changed.revision == 2
        assert changed.options == {"timeout": 600.0, "tags": ["reports"], "jitter": 5.0}
        assert changed.kwargs == {"tenant": 42}
        cleared = await control.update_schedule("report:42", timeout=None)
        assert cleared.options["timeout"] is None
        await control.pause("report:42")  # a stored schedule's job is a job: pause works
        [listed] = await control.schedules()
        assert (
            listed.paused
            and listed.revision == 3
            and str(listed.schedule) == ("cron '30 7 * * *' in America/New_York")
        )
        assert await control.remove_schedule("report:42")
        assert not await control.remove_schedule("report:42")
        assert await control.schedules() == []
        again = await control.add_schedule("report:42", "send-report", every(60))
        assert again.revision == 5  # a name removed may be stored again


async def test_a_name_a_code_defined_job_has_is_refused(pg_dsn: str, table: str) -> None:
    scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table))
    events = Events()
    scheduler.subscribe(events)
    scheduler.add_job(lambda: None, every(0.2), name="nightly")
    async with scheduler:
        await events.until(JobSucceeded)
    async with FleetControl(pg_dsn, table=table) as control:
        with pytest.raises(JobConflictError, match="a job defined in code has this name"):
            await control.add_schedule("nightly", "send-report", every(60))


async def test_ten_thousand_stored_schedules_load_in_one_read(
    pg_dsn: str, table: str, admin: Any
) -> None:
    async with FleetControl(pg_dsn, table=table) as control:
        await control.add_schedule("seed", "send-report", every(3600), kwargs={"tenant": 0})
        schedules = control.ledger.schedules
    # The other 9,999 as copies of the first, in one statement (adding them one call at a
    # time is what an application does, but takes a minute here).
    await admin.execute(
        f"""INSERT INTO {schedules} (name, revision, task, schedule, kwargs, options)
            SELECT 'tenant:' || i, 1 + i, task, schedule, jsonb_build_object('tenant', i),
                   options
            FROM {schedules}, generate_series(1, 9999) AS i WHERE name = 'seed'"""
    )

    class Counting(PostgresLocker):
        reads = 0

        async def stored_changes(self, since: int) -> tuple[int, list[Any]]:
            Counting.reads += 1
            return await super().stored_changes(since)

    scheduler = Scheduler(locker=Counting(pg_dsn, table=table), sync_every=3600)
    got: list[int] = []

    @scheduler.task("send-report")
    async def send_report(ctx: RunContext, tenant: int) -> None:
        got.append(tenant)

    began = time.perf_counter()
    async with scheduler:
        took = time.perf_counter() - began
        assert len(scheduler.stored_jobs) == 10_000
        assert Counting.reads == 1
        job = scheduler.get_job("tenant:9999")
        assert job.next_run is not None and job.next_run - datetime.now(UTC) < timedelta(hours=1)
    print(f"10,000 stored schedules: start took {took:.2f} s, {Counting.reads} read")


async def test_the_command_line_adds_lists_and_refuses_with_the_verbs_message(
    pg_dsn: str, table: str
) -> None:
    where = ("--dsn", pg_dsn, "--table", table)
    added = await cli(
        "schedules", "add", "report:7", "send-report", "--cron", "0 8 * * *",
        "--tz", "America/New_York", "--kwargs", '{"tenant": 7}',
        "--option", "timeout=600", "--option", "overlap=queue", "--option", 'tags=["a"]', *where,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "report:7: stored as revision 1 (cron '0 8 * * *' in America/New_York)" in added.stdout
    async with FleetControl(pg_dsn, table=table) as control:
        [stored] = await control.schedules()
    assert stored.kwargs == {"tenant": 7}
    assert stored.options == {"timeout": 600.0, "overlap": "queue", "tags": ["a"]}
    for args, words in [
        (("add", "report:7", "send-report", "--every", "60"), "stored already"),
        (("add", "x", "t", "--every", "60", "--option", "retires=2"), "retires cannot be stored"),
        (("add", "x", "t", "--every", "60", "--option", "timeout"), "expected NAME=VALUE"),
        (("add", "x", "t", "--at", "2020-01-01T00:00:00+00:00"), "never fires after"),
        (("add", "x", "t", "--at", "2030-01-01T00:00:00"), "names no zone"),
        (("add", "x", "t", "--every", "60", "--kwargs", "[1]"), "expected a JSON object"),
        (("update", "report:8", "--every", "60"), "unknown schedule: report:8"),
        (("remove", "report:8"), "unknown schedule: report:8"),
    ]:
        refused = await cli("schedules", *args, *where)
        assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
        assert words in refused.stderr, (args, refused.stderr)
    listed = await cli("schedules", "list", *where)
    assert listed.returncode == 0
    assert "1 stored schedule(s)" in listed.stdout and "report:7" in listed.stdout
    moved = await cli("schedules", "update", "report:7", "--every", "90", *where)
    assert moved.returncode == 0 and "revision 2 (every 1m30s)" in moved.stdout, moved.stdout
    removed = await cli("schedules", "remove", "report:7", *where)
    assert removed.returncode == 0 and "removed" in removed.stdout


async def test_an_update_that_names_no_zone_keeps_the_stored_one(pg_dsn: str, table: str) -> None:
    """Issue 36, item 6: a tenant's 08:00 in New York must not move to 08:00 UTC because
    an edit changed the cron expression and left the zone out (API and command line)."""
    where = ("--dsn", pg_dsn, "--table", table)
    async with FleetControl(pg_dsn, table=table) as control:
        await control.add_schedule(
            "report:9", "send-report", cron("0 8 * * *", tz="America/New_York")
        )
        changed = await control.update_schedule("report:9", schedule=cron("30 8 * * *"))
        assert str(changed.schedule) == "cron '30 8 * * *' in America/New_York"
        moved = await cli("schedules", "update", "report:9", "--cron", "0 9 * * *", *where)
        assert moved.returncode == 0, moved.stderr
        assert "cron '0 9 * * *' in America/New_York" in moved.stdout, moved.stdout
        [stored] = await control.schedules()
        assert str(stored.schedule) == "cron '0 9 * * *' in America/New_York"
        # Naming a zone moves it, UTC included.
        utc = await cli(
            "schedules", "update", "report:9", "--cron", "0 9 * * *", "--tz", "UTC", *where
        )
        assert utc.returncode == 0 and "cron '0 9 * * *' in UTC" in utc.stdout, utc.stdout
        # A new schedule without a zone is stored in UTC, as before.
        await control.add_schedule("report:10", "send-report", cron("0 8 * * *"))
        new = {s.name: str(s.schedule) for s in await control.schedules()}
        assert new["report:10"] == "cron '0 8 * * *' in UTC"
