"""A slot due while the server cannot be reached runs late, once, when it is back within
the slot's grace (issue 35, item 1): a real server behind a proxy that cuts every
connection and refuses new ones for a few seconds, in both modes."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

import asyncpg
import pytest

from cronlock import JobSkipped, RunContext, Scheduler, SystemClock, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._sql.tables import LedgerTable

from .proxy import TcpProxy, via

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

EVERY = 3  # seconds between slots
OUTAGE = 3.0  # seconds the server cannot be reached, from just after a slot: across the next


async def _slot_rows(dsn: str, table: LedgerTable, job: str) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(
            await conn.fetch(
                f"SELECT slot, started_at, outcome FROM {table.runs} WHERE job = $1 ORDER BY slot",
                job,
            )
        )
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_slot_due_during_an_outage_runs_once_late(
    pg_dsn: str, mode: Literal["session", "lease"]
) -> None:
    target = urlsplit(pg_dsn)
    if target.hostname is None or target.hostname.startswith("/"):
        pytest.skip("the DSN names no TCP host to relay to")
    proxy = TcpProxy(target.hostname, target.port or 5432)
    port = await proxy.start()
    table = LedgerTable(f"outage_{uuid.uuid4().hex[:8]}")
    job = f"outage-{uuid.uuid4().hex[:8]}"
    locker = PostgresLocker(via(pg_dsn, port), mode=mode, table=table.table, sessions=1)
    scheduler = Scheduler(clock=SystemClock(), locker=locker)
    runs: list[datetime] = []
    missed: list[datetime] = []

    async def work(ctx: RunContext) -> None:
        runs.append(ctx.slot)

    scheduler.add_job(work, every(EVERY), name=job)
    scheduler.subscribe(
        lambda e: (
            missed.append(e.slot) if isinstance(e, JobSkipped) and e.reason == "misfire" else None
        )
    )
    try:
        async with scheduler, asyncio.timeout(60):
            while len(runs) < 2:  # running, the ledger made
                await asyncio.sleep(0.05)
            # The outage starts just after a slot and lasts across the next one.
            before = len(runs)
            while len(runs) == before:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            owed = runs[-1].timestamp() + EVERY  # due while the server cannot be reached
            proxy.set_mode("refuse")
            proxy.cut()
            await asyncio.sleep(OUTAGE)
            proxy.set_mode("pass")
            back = datetime.now(UTC)
            while not runs or runs[-1].timestamp() < owed + EVERY:
                await asyncio.sleep(0.05)
    finally:
        await proxy.close()
    rows = await _slot_rows(pg_dsn, table, job)
    slots = [row["slot"] for row in rows]
    # Every slot from the first to the last ran, each once, none missed.
    first, last = slots[0].timestamp(), slots[-1].timestamp()
    assert [s.timestamp() for s in slots] == [
        first + EVERY * i for i in range(int((last - first) / EVERY) + 1)
    ]
    assert sorted(runs) == sorted(set(runs))
    assert all(row["outcome"] == "succeeded" for row in rows)
    assert missed == []
    # The slot due during the outage ran after the server was back (one host, one clock).
    late = next(row for row in rows if row["slot"].timestamp() == owed)
    assert late["started_at"] >= back - timedelta(seconds=0.05)
