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


class Adapter:
    def __init__(self, record: Callable[[int, float | None], None]) -> None:
        self._heap: list[tuple[datetime, int, timedelta]] = []
        self._names: dict[int, str] = {}
        self._deadlines: dict[Any, float] = {}
        self._last: dict[int, tuple[Any, ...]] = {}
        self._listeners: list[Any] = []
        self._task: asyncio.Task[None] | None = None

        async def job(i: int, ctx: RunContext) -> None:
            record(i, ctx.slot.timestamp())

        self._fn = job

    async def add(self, i: int, interval: int, offset: int, first: float) -> None:
        slot = datetime.fromtimestamp(first, UTC)
        self._heap.append((slot, i, timedelta(seconds=interval)))
        self._names[i] = f"j{i}"

    def first_slot(self, i: int) -> float | None:
        return None  # the slot comes with each run, as cronlock's does

    async def start(self) -> None:
        heapq.heapify(self._heap)
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
