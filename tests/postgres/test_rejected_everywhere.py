"""Stored schedules that every live replica rejects, and the blame of replicas that exited
(issue 36, findings 3 and 4), with real replicas (a Scheduler and a PostgresLocker each, in
this process) on the real server, in both coordination modes.

A schedule whose task no replica has is ``rejected`` in ``status`` (whose ``--check``
fails on it), in ``FleetControl.schedules()`` and in ``cronlock_schedule_rejected`` on a
replica's scrape, and ``trigger`` refuses it; one whose task a live replica has is not,
whatever the others say. A short-lived process without the task blames every schedule,
exits, and its blame goes with it while a replica that has the task runs them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cronlock import RunContext, Scheduler, ScheduleRejectedError, every
from cronlock.postgres import FleetControl, PostgresLocker
from cronlock.postgres._locker import fleetwatch, members
from cronlock.postgres._sql import upkeep
from cronlock.prometheus import instrument

from ..eventually import eventually
from .conftest import Coordination
from .test_cli_pg import cli_here

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(autouse=True)
def quick_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats every second and the fleet's runs and rejected schedules read every half
    second, in this process's replicas: what takes 15 s in a deployment takes about one here.
    A member's row still lives 60 s: no test here relies on a row expiring (a replica that
    leaves deletes its own), and on a busy machine a replica whose heartbeat ran late would
    stop counting as live and leave a schedule only it can run rejected by the one left."""
    for module in (members, upkeep):
        monkeypatch.setattr(module, "MEMBERS_EVERY", 1.0)
        monkeypatch.setattr(module, "MEMBER_TTL", 60.0)
    monkeypatch.setattr(fleetwatch, "RUNS_EVERY", 0.5)


class Fleet:
    """The replicas of one ledger, each a Scheduler with a PostgresLocker in this process."""

    def __init__(self, coordination: Coordination, table: str) -> None:
        self.coordination, self.table = coordination, table
        self.runs: list[str] = []
        self.where = ("--dsn", coordination.dsn, "--table", table, *coordination.schema_args)

    def control(self) -> FleetControl:
        c = self.coordination
        return FleetControl(c.dsn, table=self.table, schema=c.schema)

    @asynccontextmanager
    async def replica(self, *tasks: str) -> AsyncIterator[Scheduler]:
        """A replica that has *tasks* (each records its runs), running for the block."""
        c = self.coordination
        locker = PostgresLocker(c.dsn, table=self.table, schema=c.schema, mode=c.mode, lease=3.0)
        scheduler = Scheduler(locker=locker, sync_every=0.2, stop_timeout=0)
        for task in tasks:

            async def run(ctx: RunContext) -> None:
                self.runs.append(ctx.job)

            scheduler.task(task)(run)
        async with scheduler:
            yield scheduler

    async def members(self) -> int:
        """How many live rows the members table has."""
        ledger = self.coordination.table(self.table)
        conn = await asyncpg.connect(self.coordination.dsn, statement_cache_size=0)
        try:
            found: int = await conn.fetchval(
                f"SELECT count(*) FROM {ledger.members} WHERE expires_at > clock_timestamp()"
            )
        finally:
            await conn.close()
        return found

    async def triggered(self, job: str) -> bool:
        """Whether a trigger of *job* is pending in the control table."""
        ledger = self.coordination.table(self.table)
        conn = await asyncpg.connect(self.coordination.dsn, statement_cache_size=0)
        try:
            found = await conn.fetchval(
                f"SELECT trigger_slot IS NOT NULL FROM {ledger.control} WHERE job = $1", job
            )
        finally:
            await conn.close()
        return bool(found)


async def _equal(count: Any, expected: int) -> bool:
    return bool(await count == expected)


def scraped(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


async def test_a_schedule_whose_task_no_replica_has_is_rejected_everywhere(
    coordination: Coordination,
) -> None:
    fleet = Fleet(coordination, f"rejected_{uuid.uuid4().hex[:10]}")
    async with fleet.control() as control:
        await control.add_schedule("orphan", "missing", every(1), alert_after=600)
        await control.add_schedule("half", "report", every(1))  # one replica has the task
        registry = CollectorRegistry()
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(fleet.replica("report"))
            lacking = await stack.enter_async_context(fleet.replica("other"))
            instrument(lacking, registry)

            async def rejected() -> bool:
                found = {s.name: s.rejected for s in await control.schedules()}
                return found == {"orphan": True, "half": False}

            await eventually(rejected, "orphan rejected by both live replicas, half not", every=0.1)
            await eventually(
                lambda: 'cronlock_schedule_rejected{schedule="orphan"} 1.0' in scraped(registry),
                "the gauge on the scrape of a replica",
                every=0.1,
            )
            # The replica's own view follows the fleet's at its next sync (every 0.2 s).
            await eventually(
                lambda: lacking.rejected_schedules() == frozenset({"orphan"}),
                "the replica lacking the task to see half accepted elsewhere",
                every=0.1,
            )
            assert (
                'schedule="half"' not in scraped(registry).split("cronlock_schedule_rejected")[-1]
            )
            assert "# HELP cronlock_schedule_rejected " in scraped(registry)
            await eventually(
                lambda: "half" in fleet.runs, "half runs on the replica with its task", every=0.1
            )

            status = await cli_here("status", "--check", *fleet.where)
            states = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()[2:]}
            asked = await cli_here("status", "orphan", "--check", *fleet.where)
            refused = await cli_here("trigger", "orphan", *fleet.where)
            pending_after_refusal = await fleet.triggered("orphan")
            with pytest.raises(ScheduleRejectedError, match="orphan") as caught:
                await control.trigger("orphan")
            forced = await cli_here("trigger", "orphan", "--force", *fleet.where)
            pending_after_force = await fleet.triggered("orphan")
            await control.trigger("orphan", force=True)  # forced: no error
            await control.trigger("half")  # a replica runs it: not refused
    assert status.returncode == 1, status.stdout
    assert states["orphan"] == "rejected" and states["half"] != "rejected", status.stdout
    assert "rejected: orphan" in status.stdout.splitlines()
    assert asked.returncode == 1 and "rejected: orphan" in asked.stdout, asked.stderr
    assert "unknown job" not in asked.stderr
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout
    said = refused.stderr
    assert "stored schedule orphan (revision 1) is rejected by every live replica" in said, said
    assert "no task 'missing'" in said and "nothing done" in said and "--force" in said
    assert not pending_after_refusal  # nothing done
    assert "revision 1" in str(caught.value) and "no task 'missing'" in str(caught.value)
    assert forced.returncode == 0 and pending_after_force, forced.stderr


async def test_a_gone_process_no_longer_blames_the_schedules(coordination: Coordination) -> None:
    fleet = Fleet(coordination, f"blame_{uuid.uuid4().hex[:10]}")
    names = [f"report:{n}" for n in range(3)]
    async with fleet.control() as control:
        for name in names:
            await control.add_schedule(name, "report", every(1))
        async with fleet.replica("report"):
            async with fleet.replica("other"):  # a short-lived process without the task

                async def blamed() -> bool:
                    found = await control.schedules()
                    return all("no task 'report'" in (s.problem or "") for s in found)

                await eventually(blamed, "the short-lived process blames every schedule", every=0.1)
                # A replica counts once its first heartbeat is in: then it runs them, so
                # they are not rejected everywhere.
                await eventually(
                    lambda: _equal(fleet.members(), 2), "both replicas are live members", every=0.1
                )
                assert not any(s.rejected for s in await control.schedules())
            # Closed gracefully: its members row is gone, and its blame with it.
            await eventually(lambda: fleet.members(), "the live replica is a member", every=0.1)
            assert await fleet.members() == 1
            listed = await control.schedules()
            shown = await cli_here("schedules", "list", *fleet.where)
            status = await cli_here("status", *fleet.where)
            await eventually(
                lambda: set(names) <= set(fleet.runs),
                "the live replica runs every schedule",
                every=0.1,
            )
    assert [(s.name, s.problems, s.rejected) for s in listed] == [(n, {}, False) for n in names]
    assert shown.returncode == 0 and "no task" not in shown.stdout, shown.stdout
    assert status.returncode == 0 and "no task" not in status.stdout, status.stdout
    assert "rejected" not in status.stdout, status.stdout
