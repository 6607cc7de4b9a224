"""A replica with many stored schedules (issue 37, item 3): how long it takes to hold them
all, and whether the event loop stays free meanwhile.

    CRONLOCK_TEST_DSN=postgresql://... python benchmarks/stored_load.py
        [--size 100000] [--modes session,lease]

For each mode, in a ledger of its own in a schema of its own (dropped at the end):

1. ``FleetControl.put_schedules`` stores *size* tenants' schedules (a report a day at the
   tenant's hour in one of 3 zones, as in ``stored_bulk.py``);
2. a replica process starts (``PostgresLocker`` in that mode, ``sync_every=1``) with one job
   defined in code, every second, and a *stall probe*: a task that sleeps 5 ms over and
   over and records how much later than that it woke (the longest the loop was held);
3. once it holds all of them, the benchmark changes every schedule's kwargs (one
   ``put_schedules``: the replica drops and registers each job again), then every
   schedule's hour (only the schedule changes: the replica updates each job in place).

Measured in the replica: **held** (seconds from the call of ``Scheduler.start()`` until
every stored schedule is a job here), the start lateness (start - slot) of the job every
second, as p50/p99/max, and the longest stall, in each phase: *load* (from the start call
until all are held, plus 2 s), *kwargs* and *hours* (from the benchmark's put call until the
replica applied that revision, plus 2 s), with the garbage collector's full passes
(``full_gc``: how many milliseconds each took); and the replica's peak RSS (``VmHWM``). Slots of
the job every second that did not run at all are counted (``missed``). Prints JSON.

To find what holds the loop: ``--dump /tmp/MODE.jsonl`` keeps the replica's lines;
``STALLSTACK=0.025`` in the environment has a thread sample the replica's stack whenever
the loop has been held that long (printed to stderr, most frequent first);
``SLOWCB=0.04`` turns asyncio's debug mode on with that slow-callback threshold.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

SETTLE = 2.0  # seconds a phase goes on after it is done (the stalls of the aftermath)


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def peak_rss_mb() -> float:
    """The process's peak resident set (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- the replica -----------------------------------------------------------------------------


async def replica(args: argparse.Namespace) -> None:
    from cronlock import RunContext, Scheduler
    from cronlock.postgres import PostgresLocker

    locker = PostgresLocker(args.dsn, table=args.table, schema=args.schema, mode=args.mode)
    scheduler = Scheduler(locker=locker, stop_timeout=0, sync_every=1.0)
    loop = asyncio.get_running_loop()
    beating: list[asyncio.Task[None]] = []
    if os.environ.get("STALLSTACK"):
        import threading
        import traceback
        from collections import Counter as _Counter

        main_id = threading.get_ident()
        beat = [time.monotonic()]
        seen: _Counter[str] = _Counter()

        def watchdog() -> None:
            while True:
                time.sleep(0.005)
                if time.monotonic() - beat[0] > float(os.environ["STALLSTACK"]):
                    frame = sys._current_frames().get(main_id)
                    if frame is not None:
                        stack = traceback.extract_stack(frame)[-8:]
                        key = " | ".join(
                            f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in stack
                        )
                        seen[key] += 1
                        if sum(seen.values()) % 10 == 0:
                            sys.stderr.write("STACKS " + json.dumps(seen.most_common(25)) + "\n")

        threading.Thread(target=watchdog, daemon=True).start()

        async def beater() -> None:
            while True:
                beat[0] = time.monotonic()
                await asyncio.sleep(0.002)

        beating.append(asyncio.create_task(beater()))  # runs until the process ends
    if os.environ.get("SLOWCB"):
        import logging

        logging.basicConfig(level=logging.WARNING)
        loop.set_debug(True)
        loop.slow_callback_duration = float(os.environ["SLOWCB"])

    async def probe() -> None:
        step = 0.005
        while True:
            began = loop.time()
            await asyncio.sleep(step)
            late = loop.time() - began - step
            if late > 0.01:
                emit(event="stall", at=time.time() - late, s=round(late, 4))

    @scheduler.every(1, name="code-every-second")
    async def tick(ctx: RunContext) -> None:
        emit(event="tick", slot=ctx.slot.timestamp(), late=time.time() - ctx.slot.timestamp())

    @scheduler.task("report")
    async def report(tenant: int, report: str) -> None:
        pass

    collected: dict[str, float] = {}

    def collections(phase: str, info: dict[str, int]) -> None:
        # The garbage collector's passes over the oldest generation: how long each took.
        if info["generation"] != 2:
            return
        if phase == "start":
            collected["began"] = time.perf_counter()
        elif "began" in collected:
            took = time.perf_counter() - collected.pop("began")
            emit(event="gc", at=time.time() - took, s=round(took, 4))

    gc.callbacks.append(collections)
    prober = asyncio.create_task(probe())

    def stopped() -> None:
        # Counted once, as the benchmark stops the replica: gc.get_freeze_count() walks
        # every frozen object (600,000 here), a stall of its own.
        emit(event="rss", mb=peak_rss_mb(), frozen=gc.get_freeze_count())
        os._exit(0)

    loop.add_signal_handler(signal.SIGTERM, stopped)
    await asyncio.sleep(0.2)
    stored = None
    began = time.time()
    emit(event="starting", at=began)
    async with scheduler:
        stored = scheduler._stored  # (private: len(stored_jobs) would sort 100,000 names)
        assert stored is not None
        revision, held_said, turns = -1, False, 0
        while True:
            turns += 1
            held = len(stored.applied)
            if held >= args.size and not held_said:
                held_said = True
                emit(event="held", at=time.time(), after=time.time() - began, jobs=held)
            if stored._revision != revision:
                revision = stored._revision
                emit(event="revision", revision=revision, at=time.time(), jobs=held)
            if turns % 10 == 0:
                emit(event="rss", mb=peak_rss_mb())
            await asyncio.sleep(0.1)
    prober.cancel()


# -- the benchmark ---------------------------------------------------------------------------


class Replica:
    """A replica process and the lines it printed."""

    def __init__(self, dsn: str, table: str, schema: str, mode: str, size: int) -> None:
        env = dict(os.environ)
        self.lines: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--replica",
                "--dsn",
                dsn,
                "--table",
                table,
                "--schema",
                schema,
                "--mode",
                mode,
                "--size",
                str(size),
            ],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self._reader = asyncio.get_running_loop().run_in_executor(None, self._read)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def of(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] == event]

    async def wait_for(self, test: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if test(line):
                    return line
            if self.proc.poll() is not None:
                raise RuntimeError(f"the replica ended ({self.proc.returncode})")
            await asyncio.sleep(0.05)
        raise TimeoutError("the replica did not get there in time")

    async def stop(self) -> None:
        self.proc.terminate()
        try:
            await asyncio.to_thread(self.proc.wait, 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
        await self._reader


def phase(replica: Replica, since: float, until: float) -> dict[str, Any]:
    """The job every second's lateness and the longest stall between *since* and *until*."""
    lates = sorted(
        line["late"] * 1000 for line in replica.of("tick") if since <= line["slot"] <= until
    )
    slots = {round(line["slot"]) for line in replica.of("tick")}
    due = range(int(since) + 1, int(until))
    stalls = [line["s"] for line in replica.of("stall") if since <= line["at"] <= until]
    return {
        "seconds": round(until - since, 1),
        "late_ms": {
            "p50": round(statistics.median(lates), 1) if lates else None,
            "p99": round(lates[min(len(lates) - 1, int(len(lates) * 0.99))], 1) if lates else None,
            "max": round(lates[-1], 1) if lates else None,
        },
        "runs": len(lates),
        "missed": sum(1 for second in due if second not in slots),
        "worst_stall_ms": round(max(stalls, default=0.0) * 1000, 1),
        "stalls_over_20ms": sum(1 for s in stalls if s > 0.02),
        "full_gc": [
            round(line["s"] * 1000) for line in replica.of("gc") if since <= line["at"] <= until
        ],
    }


async def one_mode(
    dsn: str, schema: str, mode: str, size: int, dump: str | None = None
) -> dict[str, Any]:
    from stored_bulk import tenants

    from cronlock.postgres import FleetControl

    table = f"load_{uuid.uuid4().hex[:8]}"
    async with FleetControl(dsn, table=table, schema=schema, max_schedules=1_000_000) as control:
        await control.put_schedules(tenants(size))
        replica = Replica(dsn, table, schema, mode, size)
        result: dict[str, Any] = {}
        try:
            starting = await replica.wait_for(lambda line: line["event"] == "starting", 60)
            held = await replica.wait_for(lambda line: line["event"] == "held", 120)
            await asyncio.sleep(SETTLE)
            result["held_s"] = round(held["after"], 2)
            result["load"] = phase(replica, starting["at"], held["at"] + SETTLE)
            for what, kind, hour in (("kwargs", "weekly", 0), ("hours", "weekly", 1)):
                began = time.time()
                done = await control.put_schedules(_shifted(tenants(size, kind=kind), hour))
                applied = await replica.wait_for(
                    lambda line, r=done.revision: (
                        line["event"] == "revision" and line["revision"] >= r
                    ),
                    120,
                )
                await asyncio.sleep(SETTLE)
                result[what] = phase(replica, began, applied["at"] + SETTLE)
                result[what]["applied_s"] = round(applied["at"] - began, 2)
            rss = replica.of("rss")
            result["replica_peak_rss_mb"] = round(rss[-1]["mb"]) if rss else None
        finally:
            await replica.stop()
            frozen = [line["frozen"] for line in replica.of("rss") if "frozen" in line]
            result["frozen_objects_at_end"] = frozen[-1] if frozen else None
            if dump:
                Path(dump).write_text("".join(json.dumps(line) + "\n" for line in replica.lines))
    return result


def _shifted(batch: list[Any], hours: int) -> list[Any]:
    """*batch* with every schedule an *hours* later (0: as it is)."""
    if not hours:
        return batch
    from dataclasses import replace

    from cronlock import cron

    out = []
    for i, stored in enumerate(batch):
        zone = stored.schedule.tz
        out.append(replace(stored, schedule=cron(f"0 {(i + hours) % 24} * * *", tz=zone)))
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replica", action="store_true")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--table")
    parser.add_argument("--schema")
    parser.add_argument("--mode", default="session")
    parser.add_argument("--modes", default="session,lease")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--dump", default=None, help="write the replica's lines here (MODE.jsonl)")
    args = parser.parse_args()
    if args.replica:
        await replica(args)
        return
    from cronlock.postgres._sql.tables import quote_ident

    dsn = args.dsn or os.environ.get(
        "CRONLOCK_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/test"
    )
    schema = f"cronlock_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    report: dict[str, Any] = {"size": args.size}
    try:
        await admin.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        for mode in args.modes.split(","):
            dump = args.dump and args.dump.replace("MODE", mode)
            report[mode] = await one_mode(dsn, schema, mode, args.size, dump)
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        await admin.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    asyncio.run(main())
