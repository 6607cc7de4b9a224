"""A stranger in a shared database (issue 38, item 1): slots a role with no grants on the
ledger costs each coordination mode by holding every advisory key it can see or compute.

    CRONLOCK_TEST_DSN=postgresql://postgres@... python benchmarks/squatter.py [--seconds 20]

For each mode: a role that may connect and nothing more is made (and dropped); it takes
every job's key as the ledger computes it, then every advisory key it sees granted in
``pg_locks``, polling as fast as the server answers. Two replicas (schedulers in this
process, each its own locker and connections) run three jobs every second for
``--seconds``. Counted from the ledger: the slots due while the stranger held keys, and how
many ran. Prints JSON, one object per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from datetime import UTC, datetime

import asyncpg

from cronlock import Scheduler, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._sql.tables import DEFAULT_TABLE, LedgerTable

STRANGER = r"""
import asyncio, sys
import asyncpg

SEEN = '''SELECT DISTINCT (l.classid::int8 << 32) | l.objid::int8 AS key FROM pg_locks l
          WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
            AND l.pid <> pg_backend_pid()'''

async def main() -> None:
    dsn, role, *given = sys.argv[1:]
    conn = await asyncpg.connect(dsn, user=role)
    held = set()
    for key in map(int, given):
        if await conn.fetchval("SELECT pg_try_advisory_lock($1::int8)", key):
            held.add(key)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.ensure_future(loop.run_in_executor(None, sys.stdin.readline))
    while not stop.done():
        for row in await conn.fetch(SEEN):
            if row["key"] not in held and await conn.fetchval(
                "SELECT pg_try_advisory_lock($1::int8)", row["key"]
            ):
                held.add(row["key"])
    print(len(held), flush=True)

asyncio.run(main())
"""


async def measure(dsn: str, mode: str, seconds: float) -> dict[str, object]:
    admin = await asyncpg.connect(dsn)
    tag = uuid.uuid4().hex[:8]
    role, schema = f"cronlock_bench_stranger_{tag}", f"cronlock_bench_squat_{tag}"
    await admin.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    table = LedgerTable(DEFAULT_TABLE, schema)
    jobs = [f"job-{i}" for i in range(3)]
    stranger = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STRANGER,
        dsn,
        role,
        *(str(table.lock_key(job)) for job in jobs),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert stranger.stdout is not None and stranger.stdin is not None
        await stranger.stdout.readline()

        def replica() -> Scheduler:
            scheduler = Scheduler(
                locker=PostgresLocker(dsn, mode=mode, schema=schema)  # type: ignore[arg-type]
            )
            for job in jobs:

                async def work() -> None:
                    pass

                scheduler.add_job(work, every(1), name=job)
            return scheduler

        began = datetime.now(UTC)
        async with replica(), replica():
            await asyncio.sleep(seconds)
        ended = datetime.now(UTC)
        stranger.stdin.write(b"\n")
        await stranger.stdin.drain()
        held = int((await stranger.stdout.read()).split()[-1])
        ran = await admin.fetchval(
            f"SELECT count(*) FROM {table.runs} WHERE slot > $1 AND slot <= $2 "
            "AND outcome = 'succeeded'",
            began,
            ended,
        )
        due = len(jobs) * int((ended - began).total_seconds())
        return {"mode": mode, "slots_due": due, "ran": ran, "keys_held_by_stranger": held}
    finally:
        if stranger.returncode is None:
            stranger.kill()
            await stranger.wait()
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
        )
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    dsn = os.environ["CRONLOCK_TEST_DSN"]
    for mode in ("session", "lease"):
        print(json.dumps(await measure(dsn, mode, args.seconds)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
