"""A replica process of the dashboard's browser tests: a scheduler with a few jobs on a
real PostgresLocker, running until SIGTERM (then it stops cleanly, writing its notes).

Run as ``python fleet_replica.py --dsn DSN --table T --job NAME=SECONDS ...``; a job whose
name starts with ``fail`` raises on every run, one starting with ``slow`` takes 1.5 s;
one starting with ``doomed`` is overdue 3 s after a slot without success (``alert_after``),
the others after an hour.
Prints ``running`` once started.
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
    parser.add_argument("--id", required=True)
    parser.add_argument("--job", type=_job, action="append", default=[])
    args = parser.parse_args()
    locker = PostgresLocker(
        args.dsn, table=args.table, application_name=f"cronlock-web-replica-{args.id}"
    )
    scheduler = Scheduler(locker=locker, stop_timeout=1)
    for name, seconds in args.job:

        async def work(name: str = name) -> None:
            await asyncio.sleep(1.5 if name.startswith("slow") else 0.05)
            if name.startswith("fail"):
                raise RuntimeError(f"{name} failed on purpose")

        scheduler.add_job(
            work,
            every(seconds),
            name=name,
            misfire_grace=seconds,
            alert_after=3 if name.startswith("doomed") else 3600,
        )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with locker, scheduler:
        print("running", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
