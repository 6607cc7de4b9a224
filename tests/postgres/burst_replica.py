"""A replica process for the burst test: N jobs all due at one instant, one slot measured.

Run as ``python burst_replica.py DSN --jobs N --at EPOCH``. Every job is
``every(3600, anchor=EPOCH)``; the replica starts before the instant, waits until its
locker has answered an acquire for every job and released every lease, then prints one
JSON object: the (job, slot) pairs it ran and its locker's statements over the burst.
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
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--at", type=int, required=True)
    parser.add_argument("--tag", required=True)
    args = parser.parse_args()
    ran: list[tuple[str, float]] = []

    async def task(name: str, ctx: RunContext) -> None:
        ran.append((name, ctx.slot.timestamp()))

    locker = PostgresLocker(args.dsn, heartbeat=None)
    scheduler = Scheduler(locker=locker)
    schedule = every(3600, anchor=datetime.fromtimestamp(args.at, UTC))
    for i in range(args.jobs):
        name = f"{args.tag}-{i}"
        scheduler.add_job(task, schedule, name=name, args=(name,))
    async with locker:
        await scheduler.start()
        before = locker.statistics()
        while time.time() < args.at + 60:
            await asyncio.sleep(0.05)
            stats = locker.statistics()
            answered = stats.granted + stats.contended + stats.already_ran + stats.busy_here
            if time.time() > args.at and answered >= args.jobs and not stats.held:
                break
        statements = locker.statistics().statements - before.statements
        await scheduler.shutdown()
    print(json.dumps({"ran": ran, "statements": statements}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
