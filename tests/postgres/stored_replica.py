"""A replica process for the stored-schedule tests: tasks, no job in code, JSON lines out.

Run as ``python stored_replica.py --dsn DSN --table T --id N [--without report]``. It
registers the tasks ``report(ctx, tenant)`` and ``flaky(ctx)`` (which fails), syncs the
stored schedules every ``--sync`` seconds, and prints ``{"event": "start", "job", "slot",
"tenant", "t"}`` per run it starts (``t``: its true start time), ``{"event": "jobs",
"names", "at"}`` whenever its stored jobs or their schedules change (``names``: name to
schedule; ``at``: its clock), ``{"event": "rejected", ...}`` per ``ScheduleRejected``,
and ``{"event": "ready"}`` once started. It runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from cronlock import Event, RunContext, Scheduler, ScheduleRejected
from cronlock.postgres import PostgresLocker


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--sync", type=float, default=0.5)
    parser.add_argument("--without", action="append", default=[])
    parser.add_argument("--mode", choices=("session", "lease"), default="session")
    parser.add_argument("--lease", type=float, default=20.0)
    parser.add_argument("--schema")
    args = parser.parse_args()
    locker = PostgresLocker(
        args.dsn, table=args.table, schema=args.schema, mode=args.mode, lease=args.lease
    )
    scheduler = Scheduler(locker=locker, stop_timeout=0, sync_every=args.sync)

    async def report(ctx: RunContext, tenant: int) -> None:
        emit(
            event="start", replica=args.id, job=ctx.job, slot=ctx.slot.timestamp(),
            tenant=tenant, t=time.time(),
        )  # fmt: skip
        await asyncio.sleep(0.05)

    async def flaky(ctx: RunContext) -> None:
        emit(event="start", replica=args.id, job=ctx.job, slot=ctx.slot.timestamp(), tenant=None)
        raise RuntimeError("flaky fails")

    for name, task in (("report", report), ("flaky", flaky)):
        if name not in args.without:
            scheduler.task(name)(task)

    def rejected(event: Event) -> None:
        assert isinstance(event, ScheduleRejected)
        emit(event="rejected", replica=args.id, schedule=event.schedule, reason=event.reason)

    scheduler.subscribe(rejected, ScheduleRejected)
    async with scheduler:
        emit(event="ready", replica=args.id)
        seen: dict[str, str] | None = None
        while True:
            names = {name: str(scheduler.get_job(name).schedule) for name in scheduler.stored_jobs}
            if names != seen:
                seen = names
                emit(event="jobs", replica=args.id, names=names, at=time.time())
            await asyncio.sleep(0.01)


if __name__ == "__main__":
    asyncio.run(main())
