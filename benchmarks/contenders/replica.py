"""Scenario 5, one replica: a Scheduler with a PostgresLocker and N locked ``every(1)`` jobs.

    python replica.py DSN --replica 0 --jobs 1000 --first 1700000000 --slots 5 [--hold 0]

Starts just before slot *first*, stops after slot ``first + slots - 1`` has settled, and
prints one JSON object: the runs of the measured slots as ``[job, slot, end]`` triples
(``end``: when the task returned, ``time.time()``) plus the locker's counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime

from cronlock import RunContext, Scheduler, every
from cronlock.postgres import PostgresLocker


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--replica", type=int, required=True)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--slots", type=int, default=5)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--schema", default=None, help="the run ledger's schema; none: no ledger")
    args = parser.parse_args()
    runs: list[tuple[int, int, float]] = []
    first, last = args.first, args.first + args.slots - 1

    async def task(i: int, ctx: RunContext) -> None:
        if args.hold:
            await asyncio.sleep(args.hold)
        slot = int(ctx.slot.timestamp())
        if first <= slot <= last:
            runs.append((i, slot, time.time()))

    if args.schema:
        locker = PostgresLocker(args.dsn, schema=args.schema)
    else:
        locker = PostgresLocker(args.dsn, ledger=False)
    scheduler = Scheduler(locker=locker)
    for i in range(args.jobs):
        scheduler.add_job(task, every(1), name=f"replica-job-{i}", args=(i,))
    while (wait := first - 1.5 - time.time()) > 0:
        await asyncio.sleep(wait)
    async with locker:
        await scheduler.start()
        while (wait := last + 2.5 + args.hold - time.time()) > 0:
            await asyncio.sleep(wait)
        await scheduler.shutdown(timeout=5)
        stats = locker.statistics()
    print(
        json.dumps(
            {
                "replica": args.replica,
                "runs": runs,
                "granted": stats.granted,
                "contended": stats.contended,
                "started": datetime.now(UTC).isoformat(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
