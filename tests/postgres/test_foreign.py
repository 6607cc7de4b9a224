"""A job's lock held by a session outside the fleet is reported, not lost in silence.

With ``bare_keys=True`` a locker contends with the seed's recipe on ``job_lock_key(name)``
(a Go service, ``locked_run``). When such a session holds the key, every slot of the job is
refused "locked"; the locker finds the holder has no run in its ledger and says so, once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from cronlock import LockHeldElsewhere, RunContext, Scheduler, every
from cronlock.postgres import PostgresHold, PostgresLocker, locked_run

from .events import Events

pytestmark = pytest.mark.postgres


async def test_a_key_held_outside_the_fleet_is_reported_once(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    job = f"foreign-{uuid.uuid4().hex[:8]}"
    locker = PostgresLocker(pg_dsn, bare_keys=True)
    scheduler = Scheduler(locker=locker)
    events = Events()
    scheduler.subscribe(events)
    ran: list[datetime] = []

    async def work(ctx: RunContext) -> None:
        ran.append(ctx.slot)

    scheduler.add_job(work, every(0.25), name=job)
    with caplog.at_level(logging.WARNING, logger="cronlock"):
        async with locked_run(f"{pg_dsn}&application_name=go-service", job) as held:
            assert held
            async with scheduler:
                found = await events.until(LockHeldElsewhere)
                await asyncio.sleep(1.0)  # more refusals: still one report
    assert ran == []
    assert found.job == job and "go-service" in found.holder
    assert events.count(LockHeldElsewhere) == 1
    assert locker.statistics().foreign_holders == 1
    warnings = [r for r in caplog.records if "outside this fleet" in r.getMessage()]
    assert len(warnings) == 1 and "go-service" in warnings[0].getMessage()


async def test_a_replica_of_the_fleet_holding_the_job_is_not_reported(pg_dsn: str) -> None:
    """Contention inside the fleet is the normal case: the holder has a run in the ledger."""
    job = f"ours-{uuid.uuid4().hex[:8]}"
    slot = datetime(2030, 1, 1, tzinfo=UTC)
    async with PostgresLocker(pg_dsn) as a, PostgresLocker(pg_dsn) as b:
        lease = await a.acquire(job, slot)
        assert isinstance(lease, PostgresHold)
        assert await b.acquire(job, slot + timedelta(minutes=1)) == "locked"
        await asyncio.sleep(2.0)  # the look and its confirmation are over
        await lease.release()
        assert b.statistics().foreign_holders == 0
