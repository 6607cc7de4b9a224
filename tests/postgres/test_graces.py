"""The grace replicas publish for ``status --check`` when they give one job different
``alert_after`` values, against a real server: the largest stands, whichever replica wrote
last, until no replica stands by it any more."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from cronlock import Scheduler, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._locker import upkeep as _upkeep
from cronlock.postgres._ops.fleet import read_jobs
from cronlock.postgres._sql.schema import ledger_state
from cronlock.postgres._sql.tables import LedgerTable

pytestmark = pytest.mark.postgres


async def publish(dsn: str, table: str, job: str, alert_after: float, interval: float) -> None:
    """One replica's life: a scheduler with *job* every *interval* s, started and stopped;
    it notes the job's schedule, grace and due slot (written at the latest at its close)."""
    locker = PostgresLocker(dsn, table=table, application_name=f"grace-{alert_after}")
    scheduler = Scheduler(locker=locker)

    async def nothing() -> None:
        pass

    scheduler.add_job(nothing, every(interval), name=job, alert_after=alert_after)
    async with scheduler:
        await locker.last_claimed(job)  # a session is open: the upkeep writes at close
    assert locker.closed


async def published(admin: Any, table: str, job: str) -> float | None:
    """The grace ``status --check`` reads for *job*."""
    schema = await admin.fetchval("SELECT current_schema()")
    [found] = await read_jobs(admin, LedgerTable(table, schema), [job])
    return found.grace


@pytest.fixture
def table() -> str:
    return f"graces_{uuid.uuid4().hex[:10]}"


async def test_the_largest_grace_stands_whichever_replica_wrote_last(
    pg_dsn: str, admin: Any, table: str
) -> None:
    # Replica A says alert_after=60, replica B 10, in either order.
    await publish(pg_dsn, table, "a-then-b", 60, 3600)
    assert await published(admin, table, "a-then-b") == 60
    await publish(pg_dsn, table, "a-then-b", 10, 3600)
    assert await published(admin, table, "a-then-b") == 60  # last-writer-wins said 10
    await publish(pg_dsn, table, "b-then-a", 10, 3600)
    assert await published(admin, table, "b-then-a") == 10
    await publish(pg_dsn, table, "b-then-a", 60, 3600)
    assert await published(admin, table, "b-then-a") == 60  # a larger one at once
    await publish(pg_dsn, table, "b-then-a", 10, 3600)
    assert await published(admin, table, "b-then-a") == 60


async def test_a_lowered_grace_takes_effect_once_no_replica_stands_by_the_larger(
    pg_dsn: str, admin: Any, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling deploy lowers alert_after from 2 s to 0.5 s on a job every second: the old
    replica's grace stands until its next slot + 2 s + its margin (here 0.3 s), then the
    new replicas' lower one is published."""
    monkeypatch.setattr(_upkeep, "NOTE_EVERY", 0.05)
    monkeypatch.setattr(_upkeep, "NOTE_LATEST", 0.1)
    await publish(pg_dsn, table, "lowered", 2.0, 1.0)  # the last replica of the old version
    await publish(pg_dsn, table, "lowered", 0.5, 1.0)  # a new one, right after
    assert await published(admin, table, "lowered") == 2.0
    stands: Any = await admin.fetchval(
        f"SELECT grace_until FROM {table}_jobs WHERE job = $1", "lowered"
    )
    while await admin.fetchval("SELECT clock_timestamp() <= $1", stands):
        await asyncio.sleep(0.1)
    await publish(pg_dsn, table, "lowered", 0.5, 1.0)
    assert await published(admin, table, "lowered") == 0.5


async def test_a_ledger_noted_by_an_older_cronlock_gets_the_new_column(
    pg_dsn: str, admin: Any, table: str
) -> None:
    await publish(pg_dsn, table, "older", 60, 3600)
    schema = await admin.fetchval("SELECT current_schema()")
    ledger = LedgerTable(table, schema)
    await admin.execute(f"ALTER TABLE {ledger.jobs} DROP COLUMN grace_until")
    assert await ledger_state(admin, ledger) == "old"
    await publish(pg_dsn, table, "older", 10, 3600)  # its first session upgrades the ledger
    assert await ledger_state(admin, ledger) == "current"
    await publish(pg_dsn, table, "older", 60, 3600)
    await publish(pg_dsn, table, "older", 10, 3600)
    assert await published(admin, table, "older") == 60
