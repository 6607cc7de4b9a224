"""Two definitions under one job name in one ledger (issue 36, finding 5): two services on
the default ledger, each with a job ``cleanup``, split its slots and both said ``ok``.

Two in-process replicas (a Scheduler and a PostgresLocker each), in both coordination
modes, share a ledger: when they define ``cleanup`` otherwise (another schedule, or another
function) each warns once naming both replicas, ``python -m cronlock status`` says
``conflict`` and the ``cronlock_job_conflict`` gauge is 1; alike, nothing of the sort; once
one stops, its definition counts no more.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cronlock import Scheduler, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._locker import fleetwatch, members, upkeep
from cronlock.postgres._locker.fleetwatch import FleetWatch
from cronlock.postgres._ops.fleet import server_now
from cronlock.postgres._ops.roster import read_roster
from cronlock.postgres._sql.tables import LedgerTable
from cronlock.prometheus import instrument

from ..eventually import eventually
from .conftest import Coordination
from .test_cli_pg import cli_here

pytestmark = pytest.mark.postgres

JOB = "cleanup"


def cleanup_a() -> None:
    """Service A's cleanup."""


def cleanup_b() -> None:
    """Service B's cleanup (another function under the same job name)."""


@dataclass
class Replica:
    scheduler: Scheduler
    locker: PostgresLocker

    @property
    def holder(self) -> str:
        return self.locker._holder

    @property
    def watch(self) -> FleetWatch:
        watch = self.locker._fleet
        assert isinstance(watch, FleetWatch)
        return watch


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet's reads and heartbeats every fraction of a second (15 s in production):
    the test waits for what they find, not for their period."""
    monkeypatch.setattr(fleetwatch, "RUNS_EVERY", 0.2)
    monkeypatch.setattr(fleetwatch, "POLL_EVERY", 0.2)  # the turn the reads above ride on
    monkeypatch.setattr(members, "MEMBERS_EVERY", 0.3)
    # The upkeep task, which writes the definitions, turns every CHECK_EVERY at most.
    monkeypatch.setattr(upkeep, "CHECK_EVERY", 0.3)


@pytest.fixture
def table() -> str:
    return f"conflicts_{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def replicas(
    coordination: Coordination, table: str, admin: Any
) -> AsyncIterator[Callable[[str, Callable[[], None], float], Replica]]:
    made: list[Replica] = []

    def replica(name: str, fn: Callable[[], None], seconds: float) -> Replica:
        locker = PostgresLocker(
            coordination.dsn,
            table=table,
            schema=coordination.schema,
            mode=coordination.mode,
            application_name=name,
        )
        scheduler = Scheduler(locker=locker)
        scheduler.add_job(fn, every(seconds=seconds), name=JOB)
        made.append(Replica(scheduler, locker))
        return made[-1]

    try:
        yield replica
    finally:
        for r in made:
            if r.scheduler.running:
                await r.scheduler.shutdown()
        ledger = coordination.table(table)
        await admin.execute(
            f"DROP TABLE IF EXISTS {ledger.runs}, {ledger.jobs}, {ledger.control},"
            f" {ledger.leases}, {ledger.members}, {ledger.secrets}, {ledger.schedules},"
            f" {ledger.definitions}"
        )


async def reads(*replicas: Replica, more: int = 3) -> None:
    """Wait until each replica read its conflicts *more* times again."""
    targets = [(r, r.watch.conflicts.reads + more) for r in replicas]
    await eventually(
        lambda: all(r.watch.conflicts.reads >= n for r, n in targets), f"{more} more reads"
    )


async def status(coordination: Coordination, table: str) -> str:
    """The STATE column of ``cleanup`` in ``python -m cronlock status --check`` (its main()
    here), which
    passes: a conflict alone does not fail the check (a rolling deploy shows one)."""
    done = await cli_here(
        "status", "--check", "--dsn", coordination.dsn, "--table", table, *coordination.schema_args
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    states = [row[1] for row in rows if row and row[0] == JOB]
    assert len(states) == 1, done.stdout
    return states[0]


async def roster(conn: Any, ledger: LedgerTable) -> str:
    """``cleanup``'s status on the dashboard (its roster)."""
    now = await server_now(conn)
    return (await read_roster(conn, ledger, frozenset(), now)).statuses[JOB]


def gauge(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("cronlock_job_conflict", {"cronlock_job": JOB})


def warnings_about(caplog: pytest.LogCaptureFixture, holder: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and "two definitions" in r.getMessage()
        and holder in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("fn_b", "seconds_b"),
    [(cleanup_a, 3.0), (cleanup_b, 2.0)],
    ids=["another-schedule", "another-function"],
)
async def test_two_definitions_of_one_job_are_a_conflict(
    coordination: Coordination,
    table: str,
    replicas: Callable[[str, Callable[[], None], float], Replica],
    caplog: pytest.LogCaptureFixture,
    admin: Any,
    fn_b: Callable[[], None],
    seconds_b: float,
) -> None:
    caplog.set_level(logging.INFO, logger="cronlock")
    a = replicas("svcA", cleanup_a, 2.0)
    b = replicas("svcB", fn_b, seconds_b)
    registry = CollectorRegistry()
    metrics = instrument(a.scheduler, registry)
    try:
        async with a.scheduler, b.scheduler:
            await eventually(
                lambda: a.scheduler.in_conflict(JOB) and b.scheduler.in_conflict(JOB),
                "both replicas see the conflict",
            )
            assert gauge(registry) == 1.0
            assert await status(coordination, table) == "conflict"
            assert await roster(admin, coordination.table(table)) == "conflict"
            await reads(a, b)  # told once per other replica, not on every read
            told = [m for m in warnings_about(caplog, a.holder) if b.holder in m]
            assert len(told) == 2, told  # one from each replica, naming both
            theirs = "cleanup_a on every 3s" if seconds_b == 3.0 else "cleanup_b on every 2s"
            assert all("cleanup_a on every 2s" in m and theirs in m for m in told), told
            # B stops: its definition counts no more.
            await b.scheduler.shutdown()
            await eventually(lambda: not a.scheduler.in_conflict(JOB), "the conflict ends")
            assert gauge(registry) == 0.0
            assert await status(coordination, table) != "conflict"
            assert await roster(admin, coordination.table(table)) != "conflict"
    finally:
        metrics.close()


async def test_one_definition_on_two_replicas_is_no_conflict(
    coordination: Coordination,
    table: str,
    replicas: Callable[[str, Callable[[], None], float], Replica],
    caplog: pytest.LogCaptureFixture,
    admin: Any,
) -> None:
    caplog.set_level(logging.INFO, logger="cronlock")
    a = replicas("svcA", cleanup_a, 2.0)
    b = replicas("svcB", cleanup_a, 2.0)
    registry = CollectorRegistry()
    metrics = instrument(a.scheduler, registry)
    try:
        async with a.scheduler, b.scheduler:
            # Both are members, and each read the other's definition.
            await eventually(
                lambda: all(r.locker._members.size == 2 for r in (a, b)), "two members"
            )
            ledger = coordination.table(table)

            async def defined() -> bool:
                found: int = await admin.fetchval(f"SELECT count(*) FROM {ledger.definitions}")
                return found >= 2

            await eventually(defined, "both definitions in the ledger")
            await reads(a, b)
            assert not a.scheduler.in_conflict(JOB)
            assert not b.scheduler.in_conflict(JOB)
            assert gauge(registry) == 0.0
            assert await status(coordination, table) != "conflict"
            assert await roster(admin, ledger) != "conflict"
            assert warnings_about(caplog, a.holder) == []
    finally:
        metrics.close()


async def test_prune_deletes_the_definitions_of_replicas_gone_an_hour(
    coordination: Coordination,
    table: str,
    replicas: Callable[[str, Callable[[], None], float], Replica],
    admin: Any,
) -> None:
    """A killed replica's definitions stay an hour, then the next prune deletes them; a
    live replica's rows, and a gone replica's rows written within the hour, stay. (The
    cleanup ran in every definitions statement, and read the whole table each time.)"""
    a = replicas("svcA", cleanup_a, 2.0)
    ledger = coordination.table(table)
    async with a.scheduler:
        await eventually(lambda: a.locker._members.size == 1, "A is a member")

        async def defined() -> bool:
            return bool(
                await admin.fetchval(
                    f"SELECT count(*) FROM {ledger.definitions} WHERE holder = $1", a.holder
                )
            )

        await eventually(defined, "A's definition in the ledger")
        # Replicas gone: one an hour and more ago (its members row expired then), one a
        # minute ago, one whose members row was deleted (rows written two hours ago).
        await admin.execute(
            f"INSERT INTO {ledger.members} (holder, fleet, expires_at, since) VALUES"
            " ('gone-long', 'f', now() - interval '2 hours', now() - interval '3 hours'),"
            " ('gone-now', 'f', now() - interval '1 minute', now() - interval '3 hours')"
        )
        await admin.execute(
            f"INSERT INTO {ledger.definitions} (job, holder, definition, noted_at)"
            " SELECT 'job' || i, h, 'x', now() - interval '2 hours'"
            " FROM generate_series(1, 3) i,"
            " unnest(ARRAY['gone-long', 'gone-now', 'no-member']) h"
        )
        # A row of 'no-member' written just now (it has not beaten yet, say): kept.
        await admin.execute(
            f"INSERT INTO {ledger.definitions} (job, holder, definition)"
            " VALUES ('fresh', 'no-member', 'x')"
        )
        await a.locker.prune()
        left = await admin.fetch(
            f"SELECT holder, count(*) AS n FROM {ledger.definitions} GROUP BY holder"
        )
        assert {row["holder"]: row["n"] for row in left} == {
            a.holder: 1,
            "gone-now": 3,
            "no-member": 1,
        }
