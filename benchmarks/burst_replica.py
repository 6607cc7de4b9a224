"""One replica of the burst benchmark (benchmarks/burst.py): a service whose tenants'
schedules are stored, all of them due at one instant.

    python benchmarks/burst_replica.py --dsn DSN --schema S --table T --mode lease --id 1
        --slot EPOCH

A service as users write it: a ``Scheduler`` with a ``PostgresLocker`` on *DSN* (the
ledger *T* in *S*, in *mode*, every other setting cronlock's default), and one task,
``tenant-report``, that the stored schedules name. The task records, as its first act,
the tenant, the slot and the true wall time (``time.time()``); nothing else.

``ready`` is printed on stdout once the scheduler runs (every stored schedule loaded:
``Scheduler.start`` reads them all). The end of stdin (the driver closed it or went away)
stops it; it then prints one JSON line: its runs as ``[tenant, slot, start]``, the
locker's counters (statements, claim batches), its CPU seconds from :data:`WINDOW` s
before the slot to the stop (a crowd of slots claimed ahead opens at most 5 s early) and
before that, and its garbage collections over the same span.

Two experiments, by environment variable: ``BURST_PROFILE=DIR`` writes a cProfile of the
burst's span to *DIR*; ``BURST_GC=off`` (or ``freeze``) turns the collector off (or
freezes what start-up made) for the whole run, to see its share of the burst's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import os
import sys
import time
from pathlib import Path

from cronlock import RunContext, Scheduler
from cronlock.postgres import PostgresLocker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from failover_replica import stop_at_end_of_stdin

WINDOW = 6.0
"""Seconds before the slot from which the burst's CPU and collections are counted."""


class Collections:
    """Garbage collections per generation: how many, and their seconds (wall)."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._began = 0.0
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            generation = info["generation"]
            self.counts[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._began

    def snapshot(self) -> list[tuple[int, float]]:
        return list(zip(self.counts, self.seconds, strict=True))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--mode", choices=("session", "lease"), required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--slot", type=float, required=True, help="the burst's instant (epoch s)")
    args = parser.parse_args()
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format=f"%(created).3f r{args.id} %(levelname)s %(name)s: %(message)s",
    )
    experiment = os.environ.get("BURST_GC")
    if experiment == "off":
        gc.disable()
    collections = Collections()
    runs: list[tuple[int, float, float]] = []
    locker = PostgresLocker(
        args.dsn,
        schema=args.schema,
        table=args.table,
        mode=args.mode,
        application_name=f"cronlock-burst-{args.id}",
    )
    scheduler = Scheduler(locker=locker)

    @scheduler.task("tenant-report")
    async def report(ctx: RunContext, tenant: int) -> None:
        runs.append((tenant, ctx.slot.timestamp(), time.time()))

    stop = asyncio.Event()
    await stop_at_end_of_stdin(stop)
    async with scheduler:
        if experiment == "freeze":
            gc.freeze()
        print("ready", flush=True)
        before = locker.statistics()
        batches = _claim_batches(locker)
        cpu = time.process_time()
        await asyncio.sleep(max(0.0, args.slot - WINDOW - time.time()))
        idle, cpu = time.process_time() - cpu, time.process_time()
        collected = collections.snapshot()
        profile = os.environ.get("BURST_PROFILE")
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        await stop.wait()
        cpu = time.process_time() - cpu
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}/replica-{args.id}-{args.mode}.prof")
        stats = locker.statistics()
        batched = [now - then for now, then in zip(_claim_batches(locker), batches, strict=True)]
        collections_then = collections.snapshot()
    print(
        json.dumps(
            {
                "replica": args.id,
                "runs": runs,
                "statements": stats.statements - before.statements,
                "batches": batched,
                "granted": stats.granted - before.granted,
                "already_ran": stats.already_ran - before.already_ran,
                "contended": stats.contended - before.contended,
                "standby": stats.standby - before.standby,
                "cpu_s": cpu,
                "cpu_before_s": idle,
                "gc": [
                    [n - m, round(s - t, 3)]
                    for (n, s), (m, t) in zip(collections_then, collected, strict=True)
                ],
            }
        ),
        flush=True,
    )


def _claim_batches(locker: PostgresLocker) -> list[int]:
    """Statements and requests each lock session's batcher sent so far (claims and ends
    together), flattened as ``[statements, requests, ...]`` (a private counter: this is a
    benchmark of cronlock itself)."""
    counts: list[int] = []
    for claims in locker._claims:
        batcher = claims.batcher
        counts += [batcher.batches, batcher.batched]
    return counts


if __name__ == "__main__":
    asyncio.run(main())
