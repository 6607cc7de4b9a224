"""A replica process for the fleet-control tests: one scheduler, one job, JSON lines out.

Run as ``python fleet_replica.py --dsn DSN --table T --id N``. It runs the job ``pulse``
every ``--interval`` seconds and prints ``{"event": "start", "replica": N, "slot": ...}``
for each run it starts, ``{"event": "skipped", ..., "reason": ...}`` for each slot it
skips, and ``{"event": "ready"}`` once started. It runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from cronlock import Event, JobSkipped, JobStarted, Scheduler, every
from cronlock.postgres import PostgresLocker


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--alert-after", type=float, default=3.0)
    parser.add_argument("--mode", choices=("session", "lease"), default="session")
    parser.add_argument("--lease", type=float, default=20.0)
    parser.add_argument("--schema")
    args = parser.parse_args()
    locker = PostgresLocker(
        args.dsn,
        table=args.table,
        schema=args.schema,
        mode=args.mode,
        lease=args.lease,
        application_name=f"cronlock-fleet-replica-{args.id}",
    )
    scheduler = Scheduler(locker=locker, stop_timeout=0)

    async def pulse() -> None:
        await asyncio.sleep(0.05)

    scheduler.add_job(pulse, every(args.interval), name="pulse", alert_after=args.alert_after)

    def report(event: Event) -> None:
        if isinstance(event, JobStarted):
            emit(event="start", replica=args.id, slot=event.slot.timestamp())
        elif isinstance(event, JobSkipped):
            emit(event="skipped", replica=args.id, slot=event.slot.timestamp(), reason=event.reason)

    scheduler.subscribe(report, JobStarted, JobSkipped)
    async with scheduler:
        emit(event="ready", replica=args.id)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
