"""One replica of the fleet benchmark (benchmarks/fleet.py): a Scheduler, a PostgresLocker, K jobs.

    python fleet_replica.py --dsn DSN --id 7 --mode lease --jobs 10 --interval 1 --out F.jsonl

Registers ``fleet-job-0`` ... ``fleet-job-<K-1>``, each ``every(interval)`` (slots anchored at
the epoch, so every replica's slots are the same instants), whose body records its start,
sleeps ``--hold`` seconds (0.05) and records its end. Every record goes to this replica's
own append-only JSONL file *--out*, one line each, flushed as written:

- ``{"e": "start", "r": id, "j": job, "slot": epoch, "t": time.time()}`` and ``"end"``;
- ``"skipped"`` (with the JobSkipped reason; ``locked`` and ``already_ran``, another
  replica's run, are only counted, in ``exit``), ``"lock_failed"`` (the exception's type, the
  types of its cause chain and its text), ``"lock_lost"``;
- ``"fatal"`` if entering or running the locker and scheduler raised (the replica exits 1);
- ``"exit"`` with the locker's counters.

Prints ``ready`` on stdout once ``async with locker, scheduler`` is entered (``failed`` if
that raised). Runs until SIGTERM/SIGINT, until its parent goes away, or for *--max-seconds*.
Warnings and errors the library logs go to stderr (the driver keeps them per replica).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import IO, Any

from lifecycle import stop_when_told

from cronlock import Event, JobSkipped, LockFailed, LockLost, RunContext, Scheduler, every
from cronlock.postgres import PostgresLocker


def chain(exc: BaseException | None) -> list[str]:
    """The qualified type names of *exc* and its causes/contexts, outermost first."""
    names: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(names) < 8:
        seen.add(id(exc))
        names.append(f"{type(exc).__module__}.{type(exc).__qualname__}")
        exc = exc.__cause__ or exc.__context__
    return names


class Log:
    """The replica's JSONL file: one line per record, line-buffered (append-only)."""

    def __init__(self, path: str, replica: int) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as we do)
        self._replica = replica

    def __call__(self, kind: str, **fields: Any) -> None:
        self._file.write(json.dumps({"e": kind, "r": self._replica, **fields}) + "\n")

    def close(self) -> None:
        self._file.close()


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--mode", choices=("session", "lease"), required=True)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=0.05)
    parser.add_argument("--out", required=True, help="this replica's JSONL file")
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(created).3f %(name)s %(message)s"
    )
    log = Log(args.out, args.id)
    locker = PostgresLocker(args.dsn, mode=args.mode, application_name=f"cronlock-fleet-{args.id}")
    scheduler = Scheduler(locker=locker, stop_timeout=5)

    async def work(job: int, ctx: RunContext) -> None:
        slot = ctx.slot.timestamp()
        log("start", j=job, slot=slot, t=time.time())
        await asyncio.sleep(args.hold)
        log("end", j=job, slot=slot, t=time.time())

    skips: dict[str, int] = {}

    def report(event: Event) -> None:
        if isinstance(event, JobSkipped):
            reason = str(event.reason)
            skips[reason] = skips.get(reason, 0) + 1
            if reason not in ("locked", "already_ran"):  # the usual ones: counted only
                log("skipped", slot=event.slot.timestamp(), job=event.job, reason=reason)
        elif isinstance(event, LockFailed):
            log(
                "lock_failed",
                slot=event.slot.timestamp(),
                job=event.job,
                t=time.time(),
                error=chain(event.exception),
                text=str(event.exception)[:600],
            )
        elif isinstance(event, LockLost):
            log("lock_lost", slot=event.slot.timestamp(), job=event.job, t=time.time())

    scheduler.subscribe(report, JobSkipped, LockFailed, LockLost)
    schedule = every(args.interval)
    for i in range(args.jobs):
        scheduler.add_job(work, schedule, name=f"fleet-job-{i}", args=(i,))

    stop, watch = stop_when_told(args.max_seconds, 1.0)
    code = 0
    try:
        async with locker, scheduler:
            log("ready", t=time.time())
            print("ready", flush=True)
            await stop.wait()
    except Exception as exc:
        log("fatal", t=time.time(), error=chain(exc), text=str(exc)[:600])
        print("failed", flush=True)
        code = 1
    watch.cancel()
    stats = locker.statistics()
    log(
        "exit",
        t=time.time(),
        granted=stats.granted,
        contended=stats.contended,
        already_ran=stats.already_ran,
        statements=stats.statements,
        sessions_opened=stats.sessions_opened,
        connect_attempts=stats.connect_attempts,
        connect_failures=stats.connect_failures,
        lost=stats.lost,
        skips=skips,
    )
    log.close()
    return code


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
