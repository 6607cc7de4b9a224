"""A run claimed ahead whose lock session dies before its slot must not start its body.

Found by the soak (benchmarks/soak, session mode, seed 2026): a replica whose claim was
granted early lost its session to a server crash-restart while the run waited for its slot;
the run then started its body anyway, at the slot, while another replica legitimately held
the job's lock. The body must never begin without its lock: the run ends ``LockLost``.
"""

from __future__ import annotations

import asyncio
import math
import time

import asyncpg
import pytest

from cronlock import LockLost, Scheduler, every
from cronlock.postgres import PostgresLocker

from .cluster import Cluster
from .events import Events

pytestmark = pytest.mark.postgres

PERIOD = 8.0
AHEAD = 2.0  # claims go out 2 s before the slot (at most a quarter of the period)


async def _claimed(conn: asyncpg.Connection, slot: float) -> None:
    while not await conn.fetchval(
        "SELECT count(*) FROM cronlock_runs WHERE job = 'j' AND slot = to_timestamp($1)", slot
    ):
        await asyncio.sleep(0.01)


async def test_a_lock_lost_while_the_run_waits_for_its_slot_never_starts_it(
    restartable_pg: Cluster, app_name: str
) -> None:
    locker = PostgresLocker(restartable_pg.dsn, claim_ahead=AHEAD, application_name=app_name)
    scheduler = Scheduler(locker=locker)
    started: list[float] = []

    async def body() -> None:
        started.append(time.time())
        await asyncio.sleep(0.05)

    scheduler.add_job(body, every(PERIOD), name="j", misfire_grace=30)
    seen = Events()
    scheduler.subscribe(seen, LockLost)
    other = await asyncpg.connect(restartable_pg.dsn)  # "another replica"
    try:
        async with scheduler:
            slot = math.ceil(time.time() / PERIOD) * PERIOD
            if slot - time.time() < AHEAD + 0.5:
                slot += PERIOD
            await asyncio.sleep(max(0.0, slot - AHEAD - 0.3 - time.time()))
            started.clear()
            # The claim of `slot` goes out AHEAD s early; once it is in the ledger the run
            # waits for its slot. Its session dies now, and another replica takes the lock.
            async with asyncio.timeout(AHEAD):  # a liveness guard
                await _claimed(other, slot)
            assert await other.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = $1 AND pid IN"
                " (SELECT pid FROM pg_locks WHERE locktype = 'advisory')",
                app_name,
            )
            async with asyncio.timeout(10):  # the server releases it as the backend exits
                while not await other.fetchval(
                    "SELECT pg_try_advisory_lock($1)", locker.lock_key("j")
                ):
                    await asyncio.sleep(0.01)
            assert time.time() < slot, "the machine was too slow to cut the session in time"
            await asyncio.sleep(slot + 0.5 - time.time())
            assert started == [], "the body ran while another session held its lock"
            assert [event.slot.timestamp() for event in seen.of(LockLost)] == [slot]
    finally:
        await other.close()
