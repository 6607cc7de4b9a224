"""A stranger in a shared database: a role with no grants on the ledger that takes every
advisory key it can see or compute.

Advisory locks are database-wide and ``pg_locks`` shows every held key to every role, so a
session of any role that may connect can take a job's key. In lease mode nothing such a
stranger can take decides who runs: each claim's advisory key is its own (job, slot,
attempt) and held only for its statement, and exclusion is the ledger's leases rows, which
only roles with the ledger's grants can write. In session mode the advisory lock is the
exclusion (Go-compatible), so a stranger holding a job's key holds the job off; it is then
reported by what the server knows of the holder (backend pid and role), not by the
``application_name`` it chose.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
import pytest

from cronlock import LockHeldElsewhere, RunContext, Scheduler, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._sql.tables import DEFAULT_TABLE, LedgerTable

from .events import Events

pytestmark = pytest.mark.postgres

# The stranger: takes the keys it is given (the jobs' keys, computed as the seed's recipe
# and the ledger's namespace do), then every advisory key it sees held in pg_locks, polling
# as fast as the server answers; prints how many keys it holds when told to stop (stdin).
SQUATTER = r"""
import asyncio, sys
import asyncpg

SEEN = '''
    SELECT DISTINCT (l.classid::int8 << 32) | l.objid::int8 AS key
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.pid <> pg_backend_pid()
'''

async def main() -> None:
    dsn, role, *given = sys.argv[1:]
    conn = await asyncpg.connect(dsn, user=role)
    held: set[int] = set()
    for key in map(int, given):
        if await conn.fetchval("SELECT pg_try_advisory_lock($1::int8)", key):
            held.add(key)
    print("ready", len(held), flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.ensure_future(loop.run_in_executor(None, sys.stdin.readline))
    while not stop.done():
        for row in await conn.fetch(SEEN):
            key = row["key"]
            if key in held:
                continue
            if await conn.fetchval("SELECT pg_try_advisory_lock($1::int8)", key):
                held.add(key)
    print("held", len(held), flush=True)
    await conn.close()

asyncio.run(main())
"""


@pytest.fixture
async def stranger(pg_server: str) -> AsyncIterator[str]:
    """A role that may connect and nothing more (no superuser, no grants on any ledger),
    dropped afterwards."""
    role = f"cronlock_stranger_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_server)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
        yield role
    finally:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
        )
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


class Squatter:
    """The stranger's process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, dsn: str, role: str, keys: list[int]) -> Squatter:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SQUATTER,
            dsn,
            role,
            *map(str, keys),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("ready"), line
        return cls(process)

    async def stop(self) -> int:
        """Stop it; how many keys it held."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"\n")
        await self.process.stdin.drain()
        out = (await asyncio.wait_for(self.process.stdout.read(), 30)).decode()
        await self.process.wait()
        return int(out.split()[-1])

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


async def ran_slots(dsn: str, table: LedgerTable, jobs: list[str]) -> dict[str, list[datetime]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            f"SELECT job, slot FROM {table.runs} WHERE job = ANY($1::text[]) AND "
            "outcome = 'succeeded' ORDER BY job, slot",
            jobs,
        )
    finally:
        await conn.close()
    found: dict[str, list[datetime]] = {job: [] for job in jobs}
    for row in rows:
        found[row["job"]].append(row["slot"])
    return found


async def test_a_stranger_holding_every_key_it_sees_costs_lease_mode_no_slot(
    pg_server: str, server_schema: str, stranger: str
) -> None:
    """Two lease-mode replicas, three jobs every second, and a stranger that took every job
    key it can compute before they started and every key it sees in pg_locks while they run:
    every slot from the first to the last runs, once, and the stranger holds nothing that
    stops a claim."""
    table = LedgerTable(DEFAULT_TABLE, server_schema)
    jobs = [f"squat-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    ran: list[tuple[str, datetime]] = []

    def replica() -> Scheduler:
        locker = PostgresLocker(pg_server, mode="lease", schema=server_schema, lease=3)
        scheduler = Scheduler(locker=locker)
        for job in jobs:

            async def work(ctx: RunContext) -> None:
                ran.append((ctx.job, ctx.slot))

            scheduler.add_job(work, every(1), name=job)
        return scheduler

    # The jobs' keys as the session mode and the recipe compute them: what a lease-mode
    # claim locked before claims had keys of their own.
    squatter = await Squatter.start(pg_server, stranger, [table.lock_key(job) for job in jobs])
    try:
        async with replica(), replica():
            await asyncio.sleep(7.5)
        held = await squatter.stop()
    finally:
        squatter.kill()
    assert held >= len(jobs)  # it holds what it could take: the jobs' keys, and claims' keys
    slots = await ran_slots(pg_server, table, jobs)
    for job, found in slots.items():
        assert len(found) >= 5, (job, found)
        # every slot from the first to the last ran: none was held off
        assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(found)), found
    assert len(ran) == len(set(ran))  # and none twice


async def test_a_stranger_holding_a_session_mode_key_is_named_by_role_and_pid(
    pg_server: str, server_schema: str, stranger: str
) -> None:
    """Session mode's exclusion is the advisory lock itself (Go-compatible), so a stranger
    holding a job's key holds its slots off: the report names the holder as the server
    knows it (its role and backend pid), and says that a key read from pg_locks is not
    stopped by keyed keys."""
    table = LedgerTable(DEFAULT_TABLE, server_schema)
    job = f"squat-{uuid.uuid4().hex[:6]}"
    squatter = await Squatter.start(pg_server, stranger, [table.lock_key(job)])
    try:
        locker = PostgresLocker(pg_server, schema=server_schema)
        scheduler = Scheduler(locker=locker)
        events = Events()
        scheduler.subscribe(events)

        async def work() -> None:
            pass

        scheduler.add_job(work, every(0.25), name=job)
        async with scheduler:
            found = await events.until(LockHeldElsewhere)
        await squatter.stop()
    finally:
        squatter.kill()
    assert f"role {stranger}" in found.holder and "backend pid" in found.holder
