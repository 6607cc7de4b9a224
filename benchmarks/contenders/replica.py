"""Scenarios 5, 6 and 6b, one replica: a Scheduler with a PostgresLocker and N locked jobs.

    python replica.py DSN --replica 0 --jobs 1000 --first 1700000000 --slots 5 [--hold 0]
    python replica.py DSN --replica 0 --jobs 10000 --first 1700000000 --slots 1 --interval 60
    python replica.py DSN --replica 2 --jobs 50 --first 1700000000 --slots 20 --offset 0.3

Every job is ``every(interval, anchor=first)``, so all N jobs are due at the same instants
*first*, *first + interval*, ... Starts just before slot *first*. With ``--interval 1``
(scenario 5) it stops a fixed 2.5 s after slot ``first + slots - 1``; with a longer
interval (scenario 6, the burst) it stops as soon as this replica's locker has decided
every (job, slot) of the measured slots and released every lease, or after *--window*
seconds past the last slot, whichever comes first. ``--offset S`` (scenario 6b, skew) runs
the scheduler on ``OffsetClock(S)``, a host clock S seconds ahead; ``--host-clock`` turns
fleet time off (``fleet_clock=False``); ``--spread`` is the PostgresLocker's fair race.
``--prefix`` names the jobs (``PREFIX-0``, ...): advisory locks are per database, whatever
the ledger's schema, so runs that may overlap another one on the same database (another
benchmark, a test suite) need names of their own, or each takes the other's locks.
Prints one JSON object: the runs of the measured slots as ``[job, slot, start, end]``
(``time.time()`` when the task began and returned: true time, whatever this replica's
clock says), the statements (round trips) the locker sent from just before the first slot
to the end, this process's CPU seconds over the same span, and the locker's counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime

from cronlock import Event, JobSkipped, LockFailed, RunContext, Scheduler, every
from cronlock.postgres import PostgresLocker, PostgresLockerStatistics
from cronlock.testing import OffsetClock


def decided(stats: PostgresLockerStatistics) -> int:
    """Acquires this locker has answered (granted or refused, for whatever reason)."""
    return stats.granted + stats.contended + stats.busy_here + stats.already_ran


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--replica", type=int, required=True)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--slots", type=int, default=5)
    parser.add_argument("--interval", type=int, default=1, help="seconds between slots")
    parser.add_argument("--window", type=float, default=50.0, help="burst: longest wait")
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--schema", default=None, help="the run ledger's schema; none: no ledger")
    parser.add_argument("--offset", type=float, default=0.0, help="host clock skew, seconds")
    parser.add_argument("--host-clock", action="store_true", help="fleet_clock=False")
    parser.add_argument("--spread", type=float, default=None, help="PostgresLocker(spread=)")
    parser.add_argument("--prefix", default="replica-job", help="job names: PREFIX-<i>")
    args = parser.parse_args()
    runs: list[tuple[int, int, float, float]] = []
    skips: dict[str, int] = {}  # JobSkipped reasons and LockFailed, over every slot
    first = args.first
    last = first + (args.slots - 1) * args.interval

    async def task(i: int, ctx: RunContext) -> None:
        start = time.time()
        if args.hold:
            await asyncio.sleep(args.hold)
        slot = int(ctx.slot.timestamp())
        if first <= slot <= last:
            runs.append((i, slot, start, time.time()))

    extra = {} if args.spread is None else {"spread": args.spread}
    if args.schema:
        locker = PostgresLocker(args.dsn, schema=args.schema, **extra)
    else:
        locker = PostgresLocker(args.dsn, ledger=False, **extra)
    clock = OffsetClock(args.offset) if args.offset else None
    scheduler = Scheduler(
        locker=locker, clock=clock, fleet_clock=False if args.host_clock else None
    )

    def skipped(event: Event) -> None:
        reason = event.reason if isinstance(event, JobSkipped) else type(event).__name__
        skips[reason] = skips.get(reason, 0) + 1

    scheduler.subscribe(skipped, JobSkipped, LockFailed)
    schedule = every(args.interval, anchor=datetime.fromtimestamp(first, UTC))
    for i in range(args.jobs):
        scheduler.add_job(task, schedule, name=f"{args.prefix}-{i}", args=(i,))
    registered = time.time()
    while (wait := first - 1.5 - time.time()) > 0:
        await asyncio.sleep(wait)
    async with locker:
        await scheduler.start()
        ready = time.time()
        before = locker.statistics()
        cpu = time.process_time()
        if args.interval == 1:
            while (wait := last + 2.5 + args.hold - time.time()) > 0:
                await asyncio.sleep(wait)
        else:
            due = args.jobs * args.slots
            while time.time() < last + args.window:
                await asyncio.sleep(0.1)
                stats = locker.statistics()
                done = decided(stats) - decided(before) >= due and stats.held == 0
                if done and time.time() > last:
                    break
        stats = locker.statistics()
        cpu = time.process_time() - cpu
        await scheduler.shutdown(timeout=5)
    print(
        json.dumps(
            {
                "replica": args.replica,
                "runs": runs,
                "skips": skips,
                "statements": stats.statements - before.statements,
                "cpu_s": cpu,
                "ready_before_first_s": first - ready,
                "registered_before_first_s": first - registered,
                "granted": stats.granted,
                "contended": stats.contended,
                "already_ran": stats.already_ran,
                "busy_here": stats.busy_here,
                "started": datetime.now(UTC).isoformat(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
