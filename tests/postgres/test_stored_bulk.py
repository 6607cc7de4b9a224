"""Stored schedules in bulk (issue 37, item 4): ``FleetControl.put_schedules`` and
``sync_schedules``, and ``schedules put|sync`` with JSON lines, against the real server.

A batch is one revision: replicas (a Scheduler and a PostgresLocker each, in this process,
in both coordination modes) pick up every schedule of it and run each slot once. A set
sync under a prefix adds, updates and removes there and nowhere else, and a second
identical one changes nothing and takes no revision. A batch is checked whole before
anything is written, and a refusal names the schedule.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cronlock import (
    ConfigError,
    JobConflictError,
    JobSucceeded,
    RunContext,
    ScheduleError,
    Scheduler,
    StoredSchedule,
    cron,
    every,
    once,
)
from cronlock.postgres import FleetControl, PostgresLocker, ScheduleChanges
from cronlock.postgres._ops.bulk import OFF_LOOP_FROM

from ..eventually import eventually
from .conftest import Coordination
from .events import Events
from .test_cli_pg import cli

pytestmark = pytest.mark.postgres

PAST = datetime(2020, 1, 1, tzinfo=UTC)


@pytest.fixture
def table() -> str:
    return f"bulk_{uuid.uuid4().hex[:10]}"


def tenants(names: range, *, prefix: str = "t:", plus: int = 0) -> list[StoredSchedule]:
    """A report every second for each tenant of *names*, its kwargs the tenant (+ *plus*)."""
    return [
        StoredSchedule(f"{prefix}{i}", "report", every(1), kwargs={"tenant": i + plus})
        for i in names
    ]


class Fleet:
    """Replicas of one ledger in this process; every run they start, as (job, slot, tenant)."""

    def __init__(self, coordination: Coordination, table: str) -> None:
        self.coordination, self.table = coordination, table
        self.runs: list[tuple[str, datetime, int]] = []

    def control(self) -> FleetControl:
        c = self.coordination
        return FleetControl(c.dsn, table=self.table, schema=c.schema)

    @asynccontextmanager
    async def replica(self) -> AsyncIterator[Scheduler]:
        c = self.coordination
        locker = PostgresLocker(c.dsn, table=self.table, schema=c.schema, mode=c.mode, lease=3.0)
        scheduler = Scheduler(locker=locker, sync_every=0.2, stop_timeout=0)

        @scheduler.task("report")
        async def report(ctx: RunContext, tenant: int) -> None:
            self.runs.append((ctx.job, ctx.slot, tenant))

        async with scheduler:
            yield scheduler

    def ran_with(self, expected: dict[str, int], since: int) -> bool:
        """Whether every job of *expected* ran with its tenant in the runs after *since*."""
        seen = {(job, tenant) for job, _, tenant in self.runs[since:]}
        return all((job, tenant) in seen for job, tenant in expected.items())


@pytest.mark.slow
async def test_a_batch_is_one_revision_that_replicas_pick_up_whole(
    coordination: Coordination,
) -> None:
    fleet = Fleet(coordination, f"bulk_{uuid.uuid4().hex[:10]}")
    async with fleet.control() as control, AsyncExitStack() as stack:
        replicas = [await stack.enter_async_context(fleet.replica()) for _ in range(2)]
        first = await control.put_schedules(tenants(range(60)))
        assert first == ScheduleChanges(added=60, revision=1)
        await eventually(
            lambda: fleet.ran_with({f"t:{i}": i for i in range(60)}, 0),
            "every schedule of the first batch ran",
            every=0.1,
        )
        # Every one changed and 20 more, in one batch: one revision for all 80 rows.
        since = len(fleet.runs)
        batch = tenants(range(80), plus=1000)
        second = await control.put_schedules(batch)
        assert second == ScheduleChanges(added=20, updated=60, revision=2)
        stored = await control.schedules()
        assert {s.revision for s in stored} == {2} and len(stored) == 80
        await eventually(
            lambda: fleet.ran_with({f"t:{i}": i + 1000 for i in range(80)}, since),
            "every schedule of the second batch ran with its new kwargs",
            every=0.1,
        )
        # The fleet ran them all; a replica that ran none may read the revision a poll later,
        # but never half of it.
        seen: set[int] = set()

        def whole() -> bool:
            counts = {len(replica.stored_jobs) for replica in replicas}
            seen.update(counts)
            return counts == {80}

        await eventually(whole, "both replicas to hold the second batch", every=0.05)
        assert seen <= {60, 80}
        # The same batch again: nothing to change, no revision.
        assert await control.put_schedules(batch) == ScheduleChanges(unchanged=80)
        assert {s.revision for s in await control.schedules()} == {2}
    twice = [key for key, n in Counter((job, slot) for job, slot, _ in fleet.runs).items() if n > 1]
    assert twice == []  # each slot once in the fleet


async def test_a_set_sync_changes_its_prefix_only_and_again_nothing(
    pg_dsn: str, table: str, admin: Any
) -> None:
    async with FleetControl(pg_dsn, table=table) as control:
        await control.put_schedules([*tenants(range(5)), *tenants(range(3), prefix="other:")])
        desired = [
            *tenants(range(2)),  # t:0 and t:1 as they are
            *tenants(range(2, 4), plus=100),  # t:2 and t:3 changed
            StoredSchedule("t:9", "report", cron("0 8 * * *", tz="Europe/Paris")),  # new
        ]  # t:4 goes
        done = await control.sync_schedules("t:", desired)
        assert done == ScheduleChanges(added=1, updated=2, removed=1, unchanged=2, revision=2)
        stored = {s.name: s for s in await control.schedules()}
        assert sorted(stored) == [
            "other:0",
            "other:1",
            "other:2",
            "t:0",
            "t:1",
            "t:2",
            "t:3",
            "t:9",
        ]
        assert stored["t:2"].kwargs == {"tenant": 102} and stored["t:2"].revision == 2
        assert stored["t:0"].revision == 1 and stored["other:0"].revision == 1
        assert str(stored["t:9"].schedule) == "cron '0 8 * * *' in Europe/Paris"
        # The removed schedule's job note went with it; the new one's was written.
        notes = {r["job"] for r in await admin.fetch(f"SELECT job FROM {control.ledger.jobs}")}
        assert "t:4" not in notes and {"t:9", "t:0", "other:0"} <= notes
        top = f"SELECT max(revision) FROM {control.ledger.schedules}"
        assert await admin.fetchval(top) == 2
        # Idempotent: the same sync again changes nothing and takes no revision.
        again = await control.sync_schedules("t:", desired)
        assert again == ScheduleChanges(unchanged=5)
        assert await admin.fetchval(top) == 2
        # An empty set removes every schedule under the prefix, and only there.
        emptied = await control.sync_schedules("t:", [])
        assert emptied == ScheduleChanges(removed=5, revision=3)
        assert sorted(s.name for s in await control.schedules()) == [
            "other:0",
            "other:1",
            "other:2",
        ]
        # A removed name may come back: it counts as added.
        back = await control.sync_schedules("t:", tenants(range(1)))
        assert back == ScheduleChanges(added=1, revision=4)


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (StoredSchedule("t:bad", "report", once(PAST)), "never fires after"),
        (StoredSchedule("t:bad", "report", once()), "cannot be stored"),
        (StoredSchedule("t:bad", "report", every(60), kwargs={"when": PAST}), "not JSON"),
        (StoredSchedule("t:bad", "report", every(60), options={"retires": 3}), "retires"),
        (StoredSchedule("t:bad", "report", every(60), options={"jitter": 90}), "jitter"),
        (StoredSchedule("t:bad", "", every(60)), "task must be a non-empty string"),
        (StoredSchedule("t:1", "report", every(60)), "given twice"),
        (StoredSchedule("u:bad", "report", every(60)), "does not start with the prefix 't:'"),
    ],
)
async def test_a_batch_is_refused_whole_naming_the_schedule(
    pg_dsn: str, table: str, bad: StoredSchedule, words: str
) -> None:
    async with FleetControl(pg_dsn, table=table) as control:
        Verb = Callable[[list[StoredSchedule]], Awaitable[ScheduleChanges]]
        verbs: list[Verb] = [lambda b: control.sync_schedules("t:", b)]
        if "prefix" not in words:  # (a put has no prefix)
            verbs.append(control.put_schedules)
        for verb in verbs:
            with pytest.raises(ConfigError, match=repr(bad.name)) as caught:
                await verb([*tenants(range(3)), bad])
            assert words in str(caught.value)
        assert await control.schedules() == []


async def test_a_large_batch_is_checked_the_same_and_written_whole(pg_dsn: str, table: str) -> None:
    """A batch large enough to be checked in a worker thread (OFF_LOOP_FROM): the same
    refusals, the same writes."""
    size = OFF_LOOP_FROM + 500
    async with FleetControl(pg_dsn, table=table) as control:
        bad = StoredSchedule("t:last", "report", every(60), options={"jitter": 90})
        with pytest.raises(ScheduleError, match="'t:last'"):
            await control.put_schedules([*tenants(range(size)), bad])
        never = StoredSchedule("t:last", "report", once(PAST))
        with pytest.raises(ScheduleError, match=r"'t:last'.*never fires after"):
            await control.sync_schedules("t:", [*tenants(range(size)), never])
        assert await control.schedules() == []
        done = await control.put_schedules(tenants(range(size)))
        assert done == ScheduleChanges(added=size, revision=1)
        assert len(await control.schedules()) == size


async def test_a_batch_is_held_to_the_ledgers_limits(pg_dsn: str, table: str) -> None:
    """max_schedules counts the batch with what is stored; min_interval checks each one."""
    async with FleetControl(pg_dsn, table=table, max_schedules=5, min_interval=0.5) as control:
        await control.put_schedules(tenants(range(3)))
        with pytest.raises(ScheduleError, match=r"max_schedules=5"):
            await control.put_schedules(tenants(range(3, 6)))
        assert len(await control.schedules()) == 3  # refused whole
        await control.sync_schedules("t:", tenants(range(2, 7)))  # 5 after the removals
        assert len(await control.schedules()) == 5
    async with FleetControl(pg_dsn, table=table, min_interval=10) as control:
        with pytest.raises(ScheduleError, match=r"'t:7'.*min_interval"):
            await control.put_schedules(tenants(range(7, 8)))  # every second


async def test_a_batch_naming_a_code_defined_job_is_refused_whole(pg_dsn: str, table: str) -> None:
    scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table))
    events = Events()
    scheduler.subscribe(events)
    scheduler.add_job(lambda: None, every(0.2), name="t:nightly")
    async with scheduler:
        await events.until(JobSucceeded)
    async with FleetControl(pg_dsn, table=table) as control:
        batch = [*tenants(range(3)), StoredSchedule("t:nightly", "report", every(60))]
        with pytest.raises(JobConflictError, match="'t:nightly': a job defined in code"):
            await control.put_schedules(batch)
        assert await control.schedules() == []


async def test_the_command_line_puts_and_syncs_json_lines(
    pg_dsn: str, table: str, tmp_path: Path
) -> None:
    where = ("--dsn", pg_dsn, "--table", table)
    async with FleetControl(pg_dsn, table=table) as control:
        await control.add_schedule(
            "t:0",
            "report",
            cron("0 8 * * *", tz="America/New_York"),
            kwargs={"tenant": 0},
            timeout=600,
            tags=["reports"],
            stop_at=datetime(2031, 1, 1, tzinfo=UTC),
        )
        await control.add_schedule("keep:0", "report", every(60))
    listed = await cli("schedules", "list", "--json", *where)
    assert listed.returncode == 0, listed.stderr
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [line["name"] for line in lines] == ["keep:0", "t:0"]
    assert lines[1]["options"]["stop_at"] == "2031-01-01T00:00:00+00:00"
    # Put back what list printed: nothing changes.
    exported = tmp_path / "exported.jsonl"
    exported.write_text(listed.stdout)
    same = await cli("schedules", "put", str(exported), *where)
    assert same.returncode == 0, same.stderr
    assert "2 unchanged: nothing to change" in same.stdout
    # A tenants file: t:0 changed, t:1 and t:2 new; synced under t: (keep:0 stays).
    rows = [
        {**lines[1], "kwargs": {"tenant": 100}},
        *(
            {
                "name": f"t:{i}",
                "task": "report",
                "schedule": {"kind": "every", "micros": 60_000_000, "anchor": PAST.isoformat()},
                "kwargs": {"tenant": i},
            }
            for i in (1, 2)
        ),
    ]
    wanted = tmp_path / "tenants.jsonl"
    wanted.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    synced = await cli("schedules", "sync", "--prefix", "t:", str(wanted), *where)
    assert synced.returncode == 0, synced.stderr
    assert "3 schedule(s): 2 added, 1 updated, 0 unchanged: stored as revision 3" in synced.stdout
    again = await cli("schedules", "sync", "--prefix", "t:", str(wanted), *where)
    assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout
    wanted.write_text(json.dumps(rows[1]) + "\n")
    fewer = await cli("schedules", "sync", "--prefix", "t:", str(wanted), *where)
    assert "2 removed" in fewer.stdout, fewer.stdout
    async with FleetControl(pg_dsn, table=table) as control:
        assert sorted(s.name for s in await control.schedules()) == ["keep:0", "t:1"]
    # A bad line refuses the whole file, naming the line, the schedule and the field.
    for line, words in [
        ("not json", "line 2: not JSON"),
        ('{"name": "t:5", "task": "report"}', "line 2: schedule 't:5': missing schedule"),
        (
            '{"name": "t:5", "task": "report", "schedule": {"kind": "every", "micros": 1e20}}',
            "line 2: schedule 't:5': schedule: ",
        ),
        (
            json.dumps({**rows[1], "name": "t:5", "options": {"retires": 1}}),
            "schedule 't:5': option(s) retires cannot be stored",
        ),
        (json.dumps({**rows[1], "name": "x:5"}), "'x:5': its name does not start with"),
    ]:
        wanted.write_text(json.dumps(rows[1]) + "\n" + line + "\n")
        refused = await cli("schedules", "sync", "--prefix", "t:", str(wanted), *where)
        assert refused.returncode == 1, (line, refused.stdout)
        assert words in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    async with FleetControl(pg_dsn, table=table) as control:
        assert sorted(s.name for s in await control.schedules()) == ["keep:0", "t:1"]
