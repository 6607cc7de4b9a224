"""One replica of the burst benchmark (benchmarks/burst.py): a service whose tenants'
schedules are stored, all of them due at one instant.

    python benchmarks/burst_replica.py --dsn DSN --schema S --table T --mode lease --id 1

A service as users write it: a ``Scheduler`` with a ``PostgresLocker`` on *DSN* (the
ledger *T* in *S*, in *mode*, every other setting cronlock's default), and one task,
``tenant-report``, that the stored schedules name. The task records, as its first act,
the tenant, the slot and the true wall time (``time.time()``); nothing else.

``ready`` is printed on stdout once the scheduler runs (every stored schedule loaded:
``Scheduler.start`` reads them all). The end of stdin (the driver closed it or went away)
stops it; it then prints one JSON line: its runs as ``[tenant, slot, start]``, the
locker's counters (statements, claim batches) and its CPU seconds from ready to stop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from cronlock import RunContext, Scheduler
from cronlock.postgres import PostgresLocker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from failover_replica import stop_at_end_of_stdin


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
    runs: list[tuple[int, float, float]] = []
    gc_stats: list[list[Any]] = []
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
    if os.environ.get("BURST_GC"):  # an experiment: the collector's share of the burst
        import gc

        if os.environ["BURST_GC"] == "off":
            gc.disable()
        elif os.environ["BURST_GC"] == "freeze":
            gc.freeze()
        else:  # "count": collections and their time, per generation
            gc_stats[:] = [[0, 0.0, 0] for _ in range(3)]
            began = [0.0]

            def timing(phase: str, info: dict[str, int]) -> None:
                if phase == "start":
                    began[0] = time.perf_counter()
                else:
                    entry = gc_stats[info["generation"]]
                    entry[0] += 1
                    entry[1] += time.perf_counter() - began[0]
                    entry[2] += info["collected"]

            gc.callbacks.append(timing)
    async with scheduler:
        print("ready", flush=True)
        before = locker.statistics()
        batches = _claim_batches(locker)
        cpu = time.process_time()
        # The CPU of the burst alone: from 3 s before the slot (the start's own work,
        # such as catch-up, is done by then when the driver gives it the time).
        await asyncio.sleep(max(0.0, args.slot - 3 - time.time()))
        idle, cpu = time.process_time() - cpu, time.process_time()
        gc_before = [list(x) for x in gc_stats]
        if gc_stats:
            import gc
            from collections import Counter

            objects = gc.get_objects()
            kinds = Counter(type(o).__name__ for o in objects)
            print(len(objects), kinds.most_common(25), file=sys.stderr, flush=True)
            del objects
        profile = os.environ.get("BURST_PROFILE")  # a directory: the burst's cProfile here
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        await stop.wait()
        cpu = time.process_time() - cpu
        if profile:
            profiler.disable()
            profiler.dump_stats(f"{profile}/replica-{args.id}-{args.mode}.prof")
        stats = locker.statistics()
        batched = [now - then for now, then in zip(_claim_batches(locker), batches, strict=True)]
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
                "gc": [[n - m, round(t - u, 3), c - d] for (n, t, c), (m, u, d) in zip(gc_stats, gc_before, strict=True)],
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
