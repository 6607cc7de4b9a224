"""Load-independent instruction counts (valgrind's callgrind) of the hot path and registration.

    python benchmarks/counts.py fire|floor|register    # prints instructions per fire / per job

Each figure is the difference of two runs that differ only in how much work they do (rounds
of fires, or jobs registered), divided by that difference, so the interpreter's start-up,
the imports and the set-up cancel out. PYTHONHASHSEED is fixed: dict and set layouts, and
so the counts, repeat to within a few hundred instructions. Needs ``valgrind`` on PATH.

- ``fire``: 1,000 ``every(1)`` jobs with ``timeout=60`` and a ``RunContext`` parameter,
  nobody subscribed; the run loop's task is cancelled and each round is one pass of it
  (``RunLoop.fire_due``) at the instant every job is due, then the run tasks finish.
- ``floor``: the same rounds through the floor contender's heap + ``create_task``.
- ``register``: ``every()`` + ``add_job`` (name, args, timeout) per job, then ``start`` and
  ``shutdown``.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# (smaller, larger) work sizes per mode: (jobs, rounds)
_SIZES = {
    "fire": ((1000, 2), (1000, 6)),
    "floor": ((1000, 2), (1000, 6)),
    "guarded": ((1000, 2), (1000, 6)),
    "register": ((2000, 1), (12000, 1)),
}


async def _fire(jobs: int, rounds: int) -> None:
    from cronlock import RunContext, Scheduler, every

    scheduler = Scheduler()
    sink: list[Any] = []

    async def job(i: int, ctx: RunContext) -> None:
        sink.append(ctx.slot)
        sink.clear()

    for i in range(jobs):
        scheduler.add_job(job, every(1, anchor=_EPOCH), name=f"j{i}", args=(i,), timeout=60)
    await scheduler.start()
    loop: Any = scheduler._loop  # driving the run loop by hand
    loop._main.cancel()
    await asyncio.sleep(0)
    heap = loop._heap
    for _ in range(rounds):
        loop.fire_due(heap[0][0])  # one pass of the run loop, at the instant all are due
        for _ in range(3):
            await asyncio.sleep(0)
        assert not loop._tasks
    await scheduler.shutdown(timeout=5)


async def _floor(jobs: int, rounds: int) -> None:
    heap = [(1.0, i, 1) for i in range(jobs)]
    heapq.heapify(heap)
    sink: list[int] = []

    async def job(i: int) -> None:
        sink.append(i)
        sink.clear()

    create_task = asyncio.get_running_loop().create_task
    for _ in range(rounds):
        for _ in range(jobs):
            due, i, interval = heap[0]
            heapq.heapreplace(heap, (due + interval, i, interval))
            create_task(job(i))
        for _ in range(3):
            await asyncio.sleep(0)


async def _guarded(jobs: int, rounds: int) -> None:
    """The least a run with cronlock's promises can cost, written as thin as possible: the
    floor plus an aware-UTC slot and the next slot by datetime maths, a wrapper coroutine
    whose ``try`` is the exception guard, a timeout registered and dropped in one shared
    dict (no timer per run), start and finish times read as aware UTC datetimes, the
    ``RunContext`` the task is given, the run's record kept, and the events check."""
    from cronlock import RunContext
    from cronlock._records import run_context  # RunContext(...) at half the cost

    one = timedelta(seconds=1)
    names = [f"j{i}" for i in range(jobs)]
    heap = [(_EPOCH, i) for i in range(jobs)]
    heapq.heapify(heap)
    sink: list[Any] = []
    deadlines: dict[Any, float] = {}
    last: dict[int, tuple[Any, ...]] = {}
    listeners: list[Any] = []
    loop = asyncio.get_running_loop()
    now, current_task, monotonic = datetime.fromtimestamp, asyncio.current_task, time.monotonic

    async def job(i: int, ctx: RunContext) -> None:
        sink.append(ctx.slot)
        sink.clear()

    async def run(i: int, slot: datetime, timeout: float) -> None:
        task = current_task(loop)
        started = now(time.time(), UTC)
        if listeners:
            pass
        deadlines[task] = monotonic() + timeout
        try:
            await job(i, ctx=run_context(names[i], slot, started, 1))
        except Exception:
            pass
        finally:
            del deadlines[task]
        last[i] = (slot, started, now(time.time(), UTC), "succeeded")

    create_task = loop.create_task
    for _ in range(rounds):
        for _ in range(jobs):
            slot, i = heap[0]
            heapq.heapreplace(heap, (slot + one, i))
            create_task(run(i, slot, 60.0))
        for _ in range(3):
            await asyncio.sleep(0)


async def _register(jobs: int, rounds: int) -> None:
    from cronlock import Scheduler, every

    scheduler = Scheduler()

    async def job(i: int) -> None:
        pass

    for i in range(jobs):
        schedule = every(60, anchor=_EPOCH + timedelta(seconds=i % 30))
        scheduler.add_job(job, schedule, name=f"j{i}", args=(i,), timeout=60)
    await scheduler.start()
    await scheduler.shutdown(timeout=5)


def _instructions(mode: str, jobs: int, rounds: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--drive",
                mode,
                str(jobs),
                str(rounds),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            timeout=3600,
        )
        with open(out, encoding="utf-8") as f:
            found = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.MULTILINE)
        assert found is not None, "no totals in callgrind's output"
        return int(found.group(1))


def main() -> None:
    if sys.argv[1] == "--drive":
        mode, jobs, rounds = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        drive = {"fire": _fire, "floor": _floor, "guarded": _guarded, "register": _register}[mode]
        asyncio.run(drive(jobs, rounds))
        return
    mode = sys.argv[1]
    (jobs_a, rounds_a), (jobs_b, rounds_b) = _SIZES[mode]
    a = _instructions(mode, jobs_a, rounds_a)
    b = _instructions(mode, jobs_b, rounds_b)
    units = jobs_b - jobs_a if mode == "register" else jobs_a * (rounds_b - rounds_a)
    print(
        f"{mode}: {(b - a) / units:,.0f} instructions per {'job' if mode == 'register' else 'fire'}"
    )


if __name__ == "__main__":
    main()
