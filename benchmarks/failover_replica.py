"""One replica of the failover benchmark (benchmarks/failover.py): ten jobs every second.

    python benchmarks/failover_replica.py --dsn DSN --mode lease --id 1 --effects FILE

A service as users write it: a ``Scheduler`` with a ``PostgresLocker`` on *DSN* (cronlock's
defaults: lease 20 s in lease mode, heartbeat 5 s, statement timeout 5 s, connect timeout
10 s), and :data:`JOBS`, each ``every(1)`` with ``misfire_grace=30``, whose body sleeps a
short while. The duration differs per job (0.05 to 0.5 s), so that a fault always meets
some runs in flight.

*FILE* is append-only, one JSON line per ``write(2)``, so what a run did outlives the
process: ``start`` as a run's first act, ``end`` as its last (``cancel`` if cancelled),
each with the job, the slot (epoch seconds), the replica, its pid and the true wall time
``t``; and the events that tell why a slot did not run here (``skip`` with its reason:
``locked`` and ``already_ran`` are the server's answers, ``misfire`` a slot given up),
``lost`` (``LockLost``), ``failed`` (``LockFailed``, with the exception's type) and
``crashed`` (``JobCrashed``).

Logging goes to stderr at INFO, one record per line as ``<epoch> r<id> <LEVEL> <logger>:
<message>``, followed by the full traceback when the record has one, so the driver can
count the records at WARNING and above and the tracebacks. ``ready`` is printed on stdout
once the scheduler runs. SIGTERM, SIGINT or the end of stdin (the driver went away) stops
it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from cronlock import (
    Event,
    JobCrashed,
    JobSkipped,
    LockFailed,
    LockLost,
    RunContext,
    Scheduler,
    every,
)
from cronlock.postgres import PostgresLocker

sys.path.insert(0, str(Path(__file__).resolve().parent / "soak"))
from replica import Effects

JOBS = tuple((f"job-{i}", 0.05 * (i + 1)) for i in range(10))
"""(name, body duration in seconds) of each job; every job is ``every(1)``."""
INTERVAL = 1.0
MISFIRE_GRACE = 30.0
"""Longer than any outage the benchmark makes: every slot due in one is owed a run."""


def body(effects: Effects, name: str, duration: float) -> Callable[[RunContext], Awaitable[None]]:
    """The task of job *name*: record the start, sleep *duration*, record the end."""

    async def run(context: RunContext) -> None:
        slot = context.slot.timestamp()
        effects.write("start", name, slot)
        try:
            await asyncio.sleep(duration)
        except asyncio.CancelledError:
            effects.write("cancel", name, slot)
            raise
        effects.write("end", name, slot)

    return run


class _EndOfStdin(asyncio.Protocol):
    """Sets *stop* when stdin reaches its end."""

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop.set()


async def stop_at_end_of_stdin(stop: asyncio.Event) -> None:
    """Set *stop* once stdin reaches its end: the driver closed it or went away, SIGKILL
    included, and a replica left behind would claim slots on a cluster nobody watches."""
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: _EndOfStdin(stop), sys.stdin)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--mode", choices=("session", "lease"), required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--effects", required=True)
    args = parser.parse_args()
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(created).3f r{args.id} %(levelname)s %(name)s: %(message)s",
    )
    effects = Effects(args.effects, args.id)
    locker = PostgresLocker(
        args.dsn, mode=args.mode, application_name=f"cronlock-failover-{args.id}"
    )
    scheduler = Scheduler(locker=locker, stop_timeout=3)
    for name, duration in JOBS:
        scheduler.add_job(
            body(effects, name, duration),
            every(INTERVAL),
            name=name,
            misfire_grace=MISFIRE_GRACE,
        )

    def report(event: Event) -> None:
        if isinstance(event, JobSkipped):
            effects.write("skip", event.job, event.slot.timestamp(), reason=event.reason)
        elif isinstance(event, LockLost):
            effects.write("lost", event.job, event.slot.timestamp())
        elif isinstance(event, LockFailed):
            why = type(event.exception).__name__
            effects.write("failed", event.job, event.slot.timestamp(), why=why)
        elif isinstance(event, JobCrashed):
            effects.write("crashed", event.job, event.slot.timestamp())

    scheduler.subscribe(report, JobSkipped, LockLost, LockFailed, JobCrashed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop_at_end_of_stdin(stop)
    async with scheduler:
        print("ready", flush=True)
        await stop.wait()
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
