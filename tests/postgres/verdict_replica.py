"""A replica process of the verdict tests (test_fleet_verdict.py): a scheduler on a real
PostgresLocker, running until SIGTERM (then it stops cleanly) or until killed.

``python verdict_replica.py --dsn DSN --table T --mode session|lease --job NAME=SECONDS ...
[--task NAME]``: each job runs every SECONDS and succeeds at once, overdue one second after
a slot without success (``alert_after=1``); ``--task`` registers a task for stored
schedules that fails on every run. Prints ``running`` once started.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from cronlock import Scheduler, every
from cronlock.postgres import PostgresLocker


def _job(text: str) -> tuple[str, float]:
    name, _, seconds = text.rpartition("=")
    return name, float(seconds)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--mode", choices=("session", "lease"), required=True)
    parser.add_argument("--job", type=_job, action="append", default=[])
    parser.add_argument("--task", action="append", default=[])
    args = parser.parse_args()
    locker = PostgresLocker(args.dsn, table=args.table, mode=args.mode, racers=None)
    scheduler = Scheduler(locker=locker, stop_timeout=2, sync_every=0.5)

    async def work() -> None:
        await asyncio.sleep(0.01)

    for name, seconds in args.job:
        scheduler.add_job(work, every(seconds), name=name, alert_after=1)
    for task in args.task:

        async def broken() -> None:
            raise RuntimeError("this task fails on purpose")

        scheduler.task(task)(broken)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with locker, scheduler:
        print("running", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
