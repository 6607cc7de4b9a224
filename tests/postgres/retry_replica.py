"""A replica process of the durable retries tests (test_durable_retries.py): a scheduler
on a real PostgresLocker with one job, ``flaky``, that has ``retries=2``, running until
SIGTERM (then it stops cleanly) or until killed.

``python retry_replica.py --dsn DSN --schema S --mode session|lease --id NAME --at EPOCH
--fail-until K``: ``flaky`` fires every hour from the instant EPOCH, waits a moment and
fails on attempts 1 to K (``RunContext.attempt``), succeeding after. ``--at -``: it boots,
prints ``{"event": "booted"}`` and reads EPOCH from a line of stdin, so that a test picks
the slot once its replicas have booted, however slowly a busy machine starts Python.
Prints JSON lines: ``{"event": "running"}`` once started, ``{"event": "attempt",
"replica": NAME, "attempt": n}`` as each attempt begins. The members heartbeat runs every
half second here (15 s by default), and the crash check every second (3 s), so a replica
gone is known as such, and its pending retry taken over, within seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from datetime import UTC, datetime

from cronlock import RunContext, Scheduler, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._locker import crashes, members
from cronlock.postgres._locker import upkeep as locker_upkeep
from cronlock.postgres._sql import upkeep

EVERY = 0.5
CHECK_EVERY = 1.0  # seconds between crash checks here (3 s by default)


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--mode", choices=("session", "lease"), required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--at", required=True, help="epoch, or '-': read it from stdin")
    parser.add_argument("--fail-until", type=int, required=True)
    args = parser.parse_args()
    for module in (members, upkeep):
        vars(module).update(MEMBERS_EVERY=EVERY, MEMBER_TTL=3 * EVERY)
    for module in (crashes, locker_upkeep):
        vars(module).update(CHECK_EVERY=CHECK_EVERY)
    locker = PostgresLocker(args.dsn, schema=args.schema, mode=args.mode, racers=None)
    scheduler = Scheduler(locker=locker, stop_timeout=2)

    async def flaky(ctx: RunContext) -> None:
        emit(event="attempt", replica=args.id, attempt=ctx.attempt)
        await asyncio.sleep(0.2)
        if ctx.attempt <= args.fail_until:
            raise RuntimeError(f"down on attempt {ctx.attempt}")

    if args.at == "-":
        emit(event="booted", replica=args.id)
        given = sys.stdin.readline()  # nothing else runs yet: blocking the loop is harmless
        if not given.strip():
            return  # the test went away before giving the slot
        args.at = given
    anchor = datetime.fromtimestamp(float(args.at), UTC)
    scheduler.add_job(
        flaky,
        every(3600, anchor=anchor),
        name="flaky",
        retries=2,
        retry_delay=6,
        misfire_grace=600,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with locker, scheduler:
        emit(event="running")
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
