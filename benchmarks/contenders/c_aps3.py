"""APScheduler 3.11: ``AsyncIOScheduler`` with interval triggers aligned by start_date."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.executors.asyncio import (  # type: ignore[import-not-found,unused-ignore]
    AsyncIOExecutor,
)
from apscheduler.schedulers.asyncio import (  # type: ignore[import-not-found,unused-ignore]
    AsyncIOScheduler,
)
from apscheduler.triggers.interval import (  # type: ignore[import-not-found,unused-ignore]
    IntervalTrigger,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RUN_TIME: ContextVar[float] = ContextVar("run_time")


class _SlotExecutor(AsyncIOExecutor):  # type: ignore[misc,unused-ignore]
    """Tells the job its scheduled run time (the latest one, when runs were coalesced)."""

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        _RUN_TIME.set(run_times[-1].timestamp())  # copied into the task created next
        super()._do_submit_job(job, run_times)


class Adapter:
    def __init__(self, record: Callable[[int, float | None], None]) -> None:
        self._scheduler: Any = AsyncIOScheduler(
            timezone=UTC, executors={"default": _SlotExecutor()}
        )

        async def job(i: int) -> None:
            record(i, _RUN_TIME.get())

        self._job = job

    def first_slot(self, i: int) -> float | None:
        return None

    async def add(self, i: int, interval: int, offset: int, first: float) -> None:
        # start_date anchors the phase (slots at start_date + k * interval), like cronlock.
        trigger = IntervalTrigger(
            seconds=interval, start_date=_EPOCH + timedelta(seconds=offset), timezone=UTC
        )
        # Same misfire rule as cronlock's default: coalesce, run if at most 60 s late.
        self._scheduler.add_job(
            self._job, trigger, args=(i,), id=f"j{i}", misfire_grace_time=60, coalesce=True
        )

    async def start(self) -> None:
        self._scheduler.start()

    async def stop(self) -> None:
        self._scheduler.shutdown(wait=False)
