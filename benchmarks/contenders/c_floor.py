"""The floor: the thinnest dispatcher possible, a heap of due times popped into create_task.

No timeout, no exception guard, no events, no overlap rule: the physical limit of one
asyncio process running no-op coroutines on a schedule.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable


class Adapter:
    def __init__(self, record: Callable[[int, float | None], None]) -> None:
        self._heap: list[tuple[float, int, int]] = []
        self._first: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

        async def job(i: int) -> None:
            record(i, None)  # runs are never skipped: the k-th is for first slot + k

        self._fn = job

    async def add(self, i: int, interval: int, offset: int, first: float) -> None:
        self._heap.append((first, i, interval))
        self._first[i] = first

    def first_slot(self, i: int) -> float | None:
        return self._first[i]

    async def start(self) -> None:
        heapq.heapify(self._heap)
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        heap, fn = self._heap, self._fn
        create_task = asyncio.get_running_loop().create_task
        while True:
            now = time.time()
            while heap[0][0] <= now:
                due, i, interval = heap[0]
                heapq.heapreplace(heap, (due + interval, i, interval))
                create_task(fn(i))
            await asyncio.sleep(heap[0][0] - time.time())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
