"""A replica process for the coordination tests: one scheduler, one job, JSON lines out.

Run as ``python replica.py --dsn DSN --job NAME --id N --start EPOCH --slots K``. Each run
prints ``{"event": "start"|"end", "replica": N, "slot": ..., "t": time.time()}``; the
tests read the lines to check mutual exclusion, misses and failover.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime, timedelta

from cronlock import Event, JobSkipped, LockFailed, RunContext, Scheduler, SystemClock, every
from cronlock.postgres import PostgresLocker


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=0.2, help="seconds each run takes")
    args = parser.parse_args()

    start = datetime.fromtimestamp(args.start, UTC)
    stop = start + timedelta(seconds=args.interval * (args.slots - 1))
    locker = PostgresLocker(args.dsn, application_name=f"cronlock-test-replica-{args.id}")
    clock = SystemClock()
    scheduler = Scheduler(clock=clock, locker=locker, stop_timeout=0)

    async def work(ctx: RunContext) -> None:
        emit(event="start", replica=args.id, slot=ctx.slot.timestamp(), t=time.time())
        if args.hold < 0:
            await asyncio.Event().wait()  # hold the lock until killed
        await asyncio.sleep(args.hold)
        emit(event="end", replica=args.id, slot=ctx.slot.timestamp(), t=time.time())

    def report(event: Event) -> None:
        if isinstance(event, JobSkipped):
            emit(event="skipped", replica=args.id, slot=event.slot.timestamp(), reason=event.reason)
        elif isinstance(event, LockFailed):
            emit(
                event="lock_failed",
                replica=args.id,
                slot=event.slot.timestamp(),
                error=repr(event.exception),
            )

    scheduler.subscribe(report)
    scheduler.add_job(
        work,
        every(args.interval, anchor=start),
        name=args.job,
        start_at=start,
        stop_at=stop,
        misfire_grace=args.interval,
    )
    emit(event="ready", replica=args.id, t=time.time())
    async with locker, scheduler:
        await clock.sleep_until(stop + timedelta(seconds=max(args.hold, 0) + 1.0))


if __name__ == "__main__":
    asyncio.run(main())
