"""APScheduler 4.0.0a6: ``AsyncScheduler`` with ``IntervalTrigger``, memory data store."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

from apscheduler import (  # type: ignore[import-not-found,unused-ignore]
    AsyncScheduler,
    CoalescePolicy,
    current_job,
)
from apscheduler.triggers.interval import (  # type: ignore[import-not-found,unused-ignore]
    IntervalTrigger,
)

_recorders: list[Callable[[int, float | None], None]] = []


async def job(i: int) -> None:
    # Module level: APScheduler 4 stores a reference to the task function, not the object.
    _recorders[0](i, current_job.get().scheduled_fire_time.timestamp())


class Adapter:
    def __init__(self, record: Callable[[int, float | None], None]) -> None:
        # No cap below the job count: the other contenders have none either.
        self._scheduler: Any = AsyncScheduler(max_concurrent_jobs=1_000_000)
        self._stack = AsyncExitStack()
        self._entered = False
        _recorders.append(record)
        self._job = job

    def first_slot(self, i: int) -> float | None:
        return None

    async def add(self, i: int, interval: int, offset: int, first: float) -> None:
        if not self._entered:
            await self._stack.enter_async_context(self._scheduler)
            self._entered = True
        # IntervalTrigger walks from start_time one interval at a time, so it starts at the
        # first slot (aligned to the same phase as the others), not at the epoch.
        trigger = IntervalTrigger(seconds=interval, start_time=datetime.fromtimestamp(first, UTC))
        await self._scheduler.add_schedule(
            self._job,
            trigger,
            id=f"j{i}",
            args=(i,),
            misfire_grace_time=60,
            coalesce=CoalescePolicy.latest,
        )

    async def start(self) -> None:
        await self._scheduler.start_in_background()

    async def stop(self) -> None:
        await self._scheduler.stop()
        await self._stack.aclose()
