"""cronlock: ``Scheduler.add_job(fn, every(interval, anchor=...), name=...)``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from cronlock import RunContext, Scheduler, every

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Adapter:
    def __init__(self, record: Callable[[int, float | None], None]) -> None:
        self._scheduler = Scheduler()

        async def job(i: int, ctx: RunContext) -> None:
            record(i, ctx.slot.timestamp())

        self._job = job

    def first_slot(self, i: int) -> float | None:
        return None

    async def add(self, i: int, interval: int, offset: int, first: float) -> None:
        # A timeout on every job, so its cost is in the figures (the target includes it).
        schedule = every(interval, anchor=_EPOCH + timedelta(seconds=offset))
        self._scheduler.add_job(self._job, schedule, name=f"j{i}", args=(i,), timeout=60)

    async def start(self) -> None:
        await self._scheduler.start()

    async def stop(self) -> None:
        await self._scheduler.shutdown(timeout=5)
