"""Floor + promises: the floor (``c_floor.py``) plus what cronlock promises of every run,
each written as thinly as CPython allows, so that the distance from the floor to this row is
what the promises cost by themselves, and the distance from this row to cronlock is what
cronlock adds on top of them.

Per run, beyond the floor's heap + ``create_task``:

- slots are aware UTC datetimes and the next slot is found by datetime arithmetic (the
  floor adds floats);
- a wrapper coroutine, whose ``try`` is the exception guard, awaits the task;
- a timeout is registered before the task and dropped after it, in one shared dict: a lower
  bound, since no timer is ever armed to enforce it;
- start and finish are read as aware UTC datetimes (``RunContext.started_at`` and the run's
  record need them);
- the task is given a ``RunContext`` (built through its slots, cronlock's own fast way);
- the run's record is kept, and whether anyone listens for events is checked.

Registration (the scale scenario) keeps what cronlock promises at definition time: the
schedule is built and checked (a positive step, an aware anchor), the job's name must be a
new non-empty string, its task callable and its timeout a positive number, each job is kept
in a slotted record, and start finds every job's first slot after now by datetime maths.

Not modelled, though cronlock does them: overlap and misfire rules, run counts, the tasks
in flight that shutdown waits for, and enforcing the timeout.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from cronlock import RunContext
from cronlock._records import run_context

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _every(step: timedelta, anchor: datetime) -> tuple[datetime, timedelta]:
    if step <= timedelta(0):
        raise ValueError(f"every: interval must be positive, got {step!r}")
    if anchor.tzinfo is None:
        raise ValueError(f"every: anchor must be aware, got {anchor!r}")
    return anchor, step


class _Job:
    __slots__ = ("args", "func", "name", "schedule", "timeout")

    def __init__(
        self,
        name: str,
        func: Callable[..., Any],
        schedule: tuple[datetime, timedelta],
        args: tuple[Any, ...],
        timeout: float,
    ) -> None:
        self.name = name
        self.func = func
        self.schedule = schedule
        self.args = args
        self.timeout = timeout


class Adapter:
    def __init__(self, record: Callable[[int, float | None], None]) -> None:
        self._heap: list[tuple[datetime, int, timedelta]] = []
        self._names: dict[int, str] = {}
        self._jobs: dict[str, _Job] = {}
        self._deadlines: dict[Any, float] = {}
        self._last: dict[int, tuple[Any, ...]] = {}
        self._listeners: list[Any] = []
        self._task: asyncio.Task[None] | None = None

        async def job(i: int, ctx: RunContext) -> None:
            record(i, ctx.slot.timestamp())

        self._fn = job

    async def add(self, i: int, interval: int, offset: int, first: float) -> None:
        schedule = _every(timedelta(seconds=interval), _EPOCH + timedelta(seconds=offset))
        name = f"j{i}"
        if not isinstance(name, str) or not name or name in self._jobs:
            raise ValueError(f"job name must be a new non-empty string, got {name!r}")
        if not callable(self._fn):
            raise ValueError(f"job {name!r}: task {self._fn!r} is not callable")
        timeout = 60.0
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"job {name!r}: timeout must be positive, got {timeout!r}")
        self._jobs[name] = _Job(name, self._fn, schedule, (i,), timeout)
        self._names[i] = name

    def first_slot(self, i: int) -> float | None:
        return None  # the slot comes with each run, as cronlock's does

    async def start(self) -> None:
        now = datetime.fromtimestamp(time.time(), UTC)
        heap = self._heap
        for job in self._jobs.values():
            anchor, step = job.schedule
            slot = anchor + step * ((now - anchor) // step + 1)  # the first slot after now
            heap.append((slot, job.args[0], step))
        heapq.heapify(heap)
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        heap, run = self._heap, self._run
        create_task = asyncio.get_running_loop().create_task
        now = datetime.fromtimestamp
        while True:
            instant = now(time.time(), UTC)
            while heap[0][0] <= instant:
                slot, i, step = heap[0]
                heapq.heapreplace(heap, (slot + step, i, step))
                create_task(run(i, slot, 60.0))
            await asyncio.sleep((heap[0][0] - now(time.time(), UTC)).total_seconds())

    async def _run(self, i: int, slot: datetime, timeout: float) -> None:
        task = asyncio.current_task()
        now = datetime.fromtimestamp
        started = now(time.time(), UTC)
        if self._listeners:
            pass
        deadlines = self._deadlines
        deadlines[task] = time.monotonic() + timeout
        try:
            await self._fn(i, ctx=run_context(self._names[i], slot, started, 1))
        except Exception:  # the guard: a failing task never reaches the loop
            pass
        finally:
            del deadlines[task]
        self._last[i] = (slot, started, now(time.time(), UTC), "succeeded")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
