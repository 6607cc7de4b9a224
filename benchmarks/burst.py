"""A burst of stored schedules (issue 37, item 5): 10,000 tenants' schedules due at one
instant, run by 4 replica processes, in session mode and then in lease mode.

    CRONLOCK_TEST_DSN=postgresql://... python benchmarks/burst.py [--schedules 10000]
        [--replicas 4] [--modes session,lease] [--lead 15] [--window 30]

Per mode, in a schema of its own (dropped at the end) and a ledger of its own:

1. ``FleetControl.put_schedules`` stores N schedules, tenant *i*'s daily report: task
   ``tenant-report``, ``kwargs={"tenant": i}``, ``cron("S M H * * *", seconds=True)`` in
   UTC, the same second of the day for all, *lead* seconds ahead. A daily cron at the hour
   the tenant picked is what "a report per tenant" is stored as; every tenant picking the
   same one makes the burst. (``once(instant)`` would be due at one instant too, but a
   schedule with no next slot is not claimed ahead, and a tenant's always has one.)
2. *R* replica processes (``burst_replica.py``) start, each a ``Scheduler`` with a
   ``PostgresLocker`` in the mode, every other setting the default (4 lock sessions, 3
   racers, claims 0.1 s ahead), loading the N schedules at start.
3. The slot passes; the driver waits until the ledger holds N finished runs of it (or
   *window* s after it), then closes the replicas' stdin: each prints its runs (the task's
   ``time.time()`` at its first line, true time) and its locker's counters.

A replica races for every slot in its first 45 s (three members heartbeats), whatever
the fleet's size: with ``--lead 15`` every replica of the 4 claims (a fleet just
deployed: the hardest case); with ``--lead 60`` 3 claim and one stands by, as in a fleet
that has run for a minute (``racers=3``, the default; the crowd's claims start up to 5 s
before the slot, so the replicas must be 45 s old by then).

Measured per mode: slot runs due, ran, duplicates (a tenant run more than once) and misses
(never run), start lateness (start - slot) p50 / p99 / first / last, runs per replica,
every statement per replica, the batchers' statements and the requests they carried,
refusals per replica, each replica's CPU seconds from 6 s before the slot to its stop and
before that, and its garbage collections (count, wall seconds) per generation over the
same span. The target (issue 37): every slot once, the last start within 1 s of the slot,
in both modes. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from cronlock import StoredSchedule, cron
from cronlock.postgres import FleetControl
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

HERE = Path(__file__).resolve().parent


def tenants(count: int, at: datetime, prefix: str) -> list[StoredSchedule]:
    """*count* tenants' daily reports, all due at *at* (a whole second, UTC)."""
    when = cron(f"{at.second} {at.minute} {at.hour} * * *", seconds=True, tz="UTC")
    return [
        StoredSchedule(f"{prefix}{i}", "tenant-report", when, kwargs={"tenant": i})
        for i in range(count)
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def finished(dsn: str, table: LedgerTable, slot: datetime) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        count: int = await conn.fetchval(
            f"SELECT count(*) FROM {table.runs} WHERE slot = $1 AND finished_at IS NOT NULL",
            slot,
        )
        return count
    finally:
        await conn.close()


async def one_mode(args: argparse.Namespace, dsn: str, schema: str, mode: str) -> dict[str, Any]:
    name = f"burst_{mode}_{uuid.uuid4().hex[:6]}"
    table = LedgerTable(name, schema)
    # Names of this run alone: advisory locks are per database, whatever the schema.
    prefix = f"b{uuid.uuid4().hex[:6]}:tenant:"
    slot = datetime.fromtimestamp(int(time.time() + args.lead), UTC)
    async with FleetControl(dsn, table=name, schema=schema) as control:
        began = time.perf_counter()
        await control.put_schedules(tenants(args.schedules, slot, prefix))
        put_s = time.perf_counter() - began
    cmd = [sys.executable, str(HERE / "burst_replica.py"), f"--dsn={dsn}", f"--schema={schema}"]
    cmd += [f"--table={name}", f"--mode={mode}", f"--slot={slot.timestamp()}"]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        errs = [Path(tmp, f"r{r}.err") for r in range(args.replicas)]
        procs = []
        for r in range(args.replicas):
            with errs[r].open("w") as stderr:
                procs.append(
                    subprocess.Popen(
                        [*cmd, f"--id={r}"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        text=True,
                        env=env,
                    )
                )
        try:
            ready_before = []
            for proc in procs:
                assert proc.stdout is not None
                line = proc.stdout.readline().strip()
                if line != "ready":
                    raise RuntimeError(f"a replica did not start: {line!r}")
                ready_before.append(slot.timestamp() - time.time())
            if min(ready_before) < 7:  # the crowd opens up to 5 s early
                raise RuntimeError(f"replicas ready too late (s before the slot: {ready_before})")
            deadline = slot.timestamp() + args.window
            while time.time() < deadline:
                await asyncio.sleep(0.5)
                if time.time() > slot.timestamp() and (
                    await finished(dsn, table, slot) >= args.schedules
                ):
                    break
            results = []
            for proc in procs:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.close()
            for proc in procs:
                assert proc.stdout is not None
                out = proc.stdout.read().strip().splitlines()
                proc.wait(timeout=30)
                results.append(json.loads(out[-1]))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            problems = [e.read_text().strip() for e in errs if e.read_text().strip()]
    at = slot.timestamp()
    runs = [(tenant, start) for r in results for tenant, s, start in r["runs"] if s == at]
    times = Counter(tenant for tenant, _ in runs)
    late = [start - at for _, start in runs]
    return {
        "slot runs due": args.schedules,
        "ran": len(times),
        "duplicates": sum(n - 1 for n in times.values()),
        "misses": args.schedules - len(times),
        "start late p50 ms": round(percentile(late, 50) * 1000, 1) if late else None,
        "p99 ms": round(percentile(late, 99) * 1000, 1) if late else None,
        "last start s": round(max(late), 3) if late else None,
        "first start s": round(min(late), 3) if late else None,
        "runs per replica": [sum(1 for _, s, _ in r["runs"] if s == at) for r in results],
        "statements per replica": [r["statements"] for r in results],
        "batch statements / requests per replica": [
            [sum(r["batches"][0::2]), sum(r["batches"][1::2])] for r in results
        ],
        "already_ran / contended / standby per replica": [
            [r["already_ran"], r["contended"], r["standby"]] for r in results
        ],
        "replica CPU s from slot - 6 s": [round(r["cpu_s"], 2) for r in results],
        "replica CPU s before": [round(r["cpu_before_s"], 2) for r in results],
        "collections per replica (count, s) per generation": [r["gc"] for r in results],
        "ready before slot s": [round(x, 1) for x in ready_before],
        "put s": round(put_s, 2),
        "stderr": [p[:1500] for p in problems],
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--modes", default="session,lease")
    parser.add_argument("--lead", type=float, default=15.0, help="s from the put to the slot")
    parser.add_argument("--window", type=float, default=30.0, help="s after the slot at most")
    args = parser.parse_args()
    dsn = os.environ.get("CRONLOCK_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"cronlock_bench_burst_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    report: dict[str, Any] = {"schedules": args.schedules, "replicas": args.replicas}
    try:
        await admin.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        for mode in args.modes.split(","):
            report[mode] = await one_mode(args, dsn, schema, mode)
            print(f"{mode}: {json.dumps(report[mode])}", file=sys.stderr, flush=True)
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        await admin.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
