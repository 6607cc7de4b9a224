"""A plain function's run that timed out keeps its claim on the server until its thread
returns (issue 36, finding 7), in both modes.

A thread cannot be stopped. Before, at the timeout the run's advisory lock (session mode)
or lease (lease mode) was released while the thread went on, so another replica could
claim the job and run a second copy. Here a second locker, as another replica's, tries to
claim the job while the timed-out thread still runs: refused ``"locked"``; in lease mode
after more than a lease length, so the lease must have been renewed. Once the thread
returns, the claim is released and the ledger row says ``timed_out``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from cronlock import Event, JobSkipped, JobTimedOut, RunContext, RunOverran, Scheduler
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._sql.tables import LedgerTable

from ..eventually import eventually

pytestmark = pytest.mark.postgres

LATER = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)  # a slot nobody claimed: only the lock decides
LEASE = 1.0  # the shortest lease: renewals every 0.25 s


@pytest.fixture
async def ledger(admin: Any) -> AsyncIterator[LedgerTable]:
    table = LedgerTable(f"overrun_{uuid.uuid4().hex[:10]}")
    try:
        yield table
    finally:
        await admin.execute(
            f"DROP TABLE IF EXISTS {table.runs}, {table.jobs}, {table.control},"
            f" {table.leases}, {table.members}, {table.secrets}, {table.schedules},"
            f" {table.definitions}"
        )


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_timed_out_threads_claim_is_held_until_the_thread_returns(
    pg_dsn: str,
    app_name: str,
    admin: Any,
    ledger: LedgerTable,
    mode: Literal["session", "lease"],
) -> None:
    def locker() -> PostgresLocker:
        return PostgresLocker(
            pg_dsn, application_name=app_name, table=ledger.table, mode=mode, lease=LEASE
        )

    scheduler = Scheduler(locker=locker())
    events: list[Event] = []
    scheduler.subscribe(events.append)
    release = threading.Event()
    copies: list[datetime] = []
    job = f"overrun-{uuid.uuid4().hex[:8]}"

    @scheduler.every(1, name=job, timeout=0.2, overlap="skip")
    def stuck(ctx: RunContext) -> None:
        copies.append(ctx.slot)
        release.wait(120)

    def of(kind: type[Event]) -> list[Event]:
        return [e for e in events if isinstance(e, kind)]

    try:
        async with locker() as other, scheduler:
            # Until its next slot fell due while its thread still runs: skipped or started.
            await eventually(
                lambda: of(JobTimedOut) and (of(JobSkipped) or len(copies) > 1), every=0.02
            )
            timed_out = of(JobTimedOut)[0]
            assert isinstance(timed_out, JobTimedOut)
            assert copies == [timed_out.slot]  # skipped as an overlap: no second copy here
            assert {e.reason for e in of(JobSkipped) if isinstance(e, JobSkipped)} == {"overlap"}
            if mode == "lease":
                await asyncio.sleep(2 * LEASE)  # unrenewed, the lease would have expired
            # The thread still runs: its claim is held, no other replica may run the job.
            assert await other.acquire(job, LATER) == "locked"
            row = await admin.fetchrow(
                f"SELECT outcome, finished_at FROM {ledger.runs} WHERE job = $1 AND slot = $2",
                job,
                timed_out.slot,
            )
            assert (row["outcome"], row["finished_at"]) == (None, None)  # still in flight
            assert copies == [timed_out.slot]

            scheduler.get_job(job).pause()
            release.set()
            await eventually(lambda: of(RunOverran), every=0.02)
            await eventually(lambda: not scheduler.get_job(job).running, every=0.02)  # released
            hold = await other.acquire(job, LATER)
            assert isinstance(hold, PostgresHold)
            await hold.release()
            outcome = await admin.fetchval(
                f"SELECT outcome FROM {ledger.runs} WHERE job = $1 AND slot = $2",
                job,
                timed_out.slot,
            )
            assert outcome == "timed_out"
    finally:
        release.set()
    assert copies == [timed_out.slot]
    [overran] = of(RunOverran)
    assert isinstance(overran, RunOverran) and overran.slot == timed_out.slot
    assert overran.overran > 0
