"""Runs one contender in this process for one scenario and prints one JSON result.

    python harness.py CONTENDER precision --jobs 10000 --seconds 5
    python harness.py CONTENDER scale --jobs 100000 --interval 60 --spread 30 --idle 10

Every contender runs the same no-op coroutine job, which calls ``record(i, slot)``: the
instant it starts (``time.time()``) and the slot it runs for, as the scheduler itself says
(cronlock's ``RunContext.slot``, APScheduler 4's ``current_job``, APScheduler 3's
``run_times`` through a two-line executor subclass). aiocron and the floor never skip nor
coalesce, so there the k-th run of a job is for its first slot + k intervals. Lateness is
computed after the run. Slots whose runs were coalesced away or skipped count as not fired.
Only the standard library and psutil are needed here: this file runs in the APScheduler
virtualenvs too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import math
import os
import sys
import time
from typing import Any, Protocol

import psutil  # type: ignore[import-untyped,unused-ignore]

_starts: list[tuple[int, float, float | None]] = []


def record(i: int, slot: float | None) -> None:
    """Called first thing by every job: job *i* started now, for *slot* (None: count)."""
    _starts.append((i, time.time(), slot))


class Adapter(Protocol):
    async def add(self, i: int, interval: int, offset: int, first: float) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def first_slot(self, i: int) -> float | None: ...


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of *values* (q in 0..100); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


async def sleep_until(instant: float) -> None:
    while (remaining := instant - time.time()) > 0:
        await asyncio.sleep(remaining)


async def idle_cpu_rate(seconds: float) -> float:
    """CPU seconds per second this process burns with the event loop idle."""
    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    return (time.process_time() - c0) / (time.perf_counter() - t0)


def runs(adapter: Adapter, interval: int) -> list[tuple[float, float]]:
    """(slot, start) of every run; slots counted from the first for contenders without."""
    seen: dict[int, int] = {}
    out = []
    for i, t, slot in _starts:
        if slot is None:
            k = seen[i] = seen.get(i, -1) + 1
            first = adapter.first_slot(i)
            assert first is not None
            slot = first + k * interval
        out.append((slot, t))
    return out


def lateness(done: list[tuple[float, float]], lo: float, hi: float) -> list[float]:
    """Lateness of each run whose slot lies in [lo, hi)."""
    return [t - slot for slot, t in done if lo <= slot < hi]


def summary(late: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(late, 50) * 1e3,
        "p99_ms": percentile(late, 99) * 1e3,
        "max_ms": max(late) * 1e3 if late else math.nan,
    }


async def stop(adapter: Adapter, timeout: float) -> None:
    # In this task (anyio cancel scopes must be exited where they were entered), bounded.
    async with asyncio.timeout(timeout):
        await adapter.stop()


async def register(
    adapter: Adapter, n: int, interval: int, offsets: list[int], base: float
) -> float:
    """Register n jobs and start; return seconds taken. Slot k of job i: base+offset+k*iv."""
    t0 = time.perf_counter()
    for i in range(n):
        offset = offsets[i] if offsets else 0
        first = base + (offset - base) % interval  # first slot at or after base
        await adapter.add(i, interval, offset, first)
    await adapter.start()
    return time.perf_counter() - t0


async def precision(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """N jobs every second: lateness, CPU per fire, burst throughput."""
    n, seconds = args.jobs, args.seconds
    idle = await idle_cpu_rate(args.baseline)
    base = math.ceil(time.time()) + 1
    reg = await register(adapter, n, 1, [], base)
    first = math.ceil(time.time()) + 1  # one whole slot of warm-up
    await sleep_until(first - 0.05)
    mark = len(_starts)
    c0, w0 = time.process_time(), time.time()
    await sleep_until(first + seconds - 0.05)
    cpu, wall = time.process_time() - c0, time.time() - w0
    fires = sum(1 for _, t, _ in _starts[mark:] if t < w0 + wall)
    await asyncio.sleep(0.9)
    await stop(adapter, 10)
    done = runs(adapter, 1)
    late = lateness(done, first, first + seconds)
    # Burst throughput: runs of one slot divided by the time from its first to last start.
    bursts: dict[float, list[float]] = {}
    for slot, t in done:
        if first <= slot < first + seconds:
            bursts.setdefault(slot, []).append(t)
    rates = [len(v) / (max(v) - min(v)) for v in bursts.values() if len(v) > 1 and max(v) > min(v)]
    return {
        **summary(late),
        "fires": len(late),
        "expected": n * seconds,
        "cpu_us_per_fire": (cpu - idle * wall) / fires * 1e6 if fires else math.nan,
        "burst_fires_per_s": percentile(rates, 50),
        "register_s": reg,
    }


async def scale(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """N jobs every *interval* s, spread over *spread* s of it: registration, RSS, idle CPU."""
    n, interval, spread = args.jobs, args.interval, args.spread
    proc = psutil.Process()
    gc.collect()
    rss0 = proc.memory_info().rss
    t0 = math.floor(time.time())
    phase = (t0 + args.lead) % interval
    offsets = [(phase + i % spread) % interval for i in range(n)]
    reg = await register(adapter, n, interval, offsets, t0 + args.lead)
    gc.collect()
    rss1 = proc.memory_info().rss
    # The busy window: the first cycle whose first slot is at least 1 s after registration.
    busy = t0 + args.lead
    while busy < time.time() + 1:
        busy += interval
    # Nothing is due before the busy window, nor between its end and the next cycle:
    # measure the CPU the idle scheduler burns in the first such gap that is long enough.
    window = min(args.idle, interval - spread - 3)
    idle = math.nan
    if busy - time.time() >= window + 1.5:
        await asyncio.sleep(0.5)
        idle = await idle_cpu_rate(window)
    await sleep_until(busy + spread + 1.5)  # let the window's last burst finish
    late = lateness(runs(adapter, interval), busy, busy + spread)
    if math.isnan(idle):
        idle = await idle_cpu_rate(window)
    await stop(adapter, 30)
    return {
        **summary(late),
        "fires": len(late),
        "expected": n,
        "register_s": reg,
        "rss_bytes_per_job": (rss1 - rss0) / n,
        "idle_cpu_pct": idle * 100,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    contenders = ["cronlock", "aps3", "aps4", "aiocron", "floor", "model"]
    parser.add_argument("contender", choices=contenders)
    parser.add_argument("scenario", choices=["precision", "scale"])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--baseline", type=float, default=1.0)
    parser.add_argument("--interval", type=int, default=60)
    parser.add_argument("--spread", type=int, default=30)
    parser.add_argument("--lead", type=int, default=5)
    parser.add_argument("--idle", type=float, default=10.0)
    args = parser.parse_args()
    module = importlib.import_module(f"c_{args.contender}")
    scenario = precision if args.scenario == "precision" else scale

    async def run() -> dict[str, Any]:
        adapter: Adapter = module.Adapter(record)
        return await scenario(adapter, args)

    profile = os.environ.get("BENCH_PROFILE")  # a path: write cProfile stats there
    if profile:
        import cProfile

        with cProfile.Profile() as prof:
            result = asyncio.run(run())
        prof.dump_stats(profile)
    else:
        result = asyncio.run(run())
    result["python"] = sys.version.split()[0]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
