"""History tells the truth: a run's ledger row says when its body began (not when its
slot was claimed, often a moment ahead of the slot), and a run cut off by its timeout
says so in its error. Against the real server, in both coordination modes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest

from cronlock import JobStarted, JobSucceeded, JobTimedOut, Scheduler, SystemClock, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

from .events import Events

pytestmark = pytest.mark.postgres

Mode = Literal["session", "lease"]


@pytest.fixture
async def table(admin: Any) -> AsyncIterator[LedgerTable]:
    """A ledger in a schema of this test's own, dropped afterwards."""
    table = LedgerTable("runs", schema=f"run_start_{uuid.uuid4().hex[:10]}")
    try:
        yield table
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(table.schema or '')} CASCADE")


def watched(pg_dsn: str, app_name: str, table: LedgerTable, mode: Mode) -> tuple[Scheduler, Events]:
    """A scheduler on *table* in *mode*, and the events it emits."""
    locker = PostgresLocker(
        pg_dsn, application_name=app_name, table=table.table, schema=table.schema, mode=mode
    )
    scheduler = Scheduler(clock=SystemClock(), locker=locker, stop_timeout=5)
    events = Events()
    scheduler.subscribe(events)
    return scheduler, events


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_the_ledger_records_when_the_run_began_not_when_it_was_claimed(
    pg_dsn: str, app_name: str, admin: Any, table: LedgerTable, mode: Mode
) -> None:
    scheduler, events = watched(pg_dsn, app_name, table, mode)

    async def tick() -> None:
        await asyncio.sleep(0.05)

    scheduler.add_job(tick, every(0.5), name="tick")
    async with scheduler:
        await events.until(JobSucceeded, 4)
    started = {e.slot: e.started_at for e in events.of(JobStarted)}
    rows = await admin.fetch(
        f"SELECT slot, started_at, finished_at FROM {table.runs} WHERE outcome = 'succeeded'"
    )
    assert len(rows) >= 4
    for row in rows:
        # The row's start is the instant the body began, as the run's own events say, and
        # so never before the slot: not the claim's time, made ahead of the slot.
        assert row["started_at"] == started[row["slot"]]
        assert row["slot"] <= row["started_at"] <= row["finished_at"]


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_timed_out_run_says_so_in_its_error(
    pg_dsn: str, app_name: str, admin: Any, table: LedgerTable, mode: Mode
) -> None:
    scheduler, events = watched(pg_dsn, app_name, table, mode)

    async def stuck() -> None:
        await asyncio.sleep(3600)

    job = scheduler.add_job(stuck, every(1), name="stuck", timeout=0.25)
    async with scheduler:
        timed_out = await events.until(JobTimedOut)
    assert job.last_run is not None
    assert (job.last_run.slot, job.last_run.error) == (timed_out.slot, "timed out after 0.25 s")
    row = await admin.fetchrow(
        f"SELECT outcome, error FROM {table.runs} WHERE slot = $1", timed_out.slot
    )
    assert tuple(row) == ("timed_out", "timed out after 0.25 s")
