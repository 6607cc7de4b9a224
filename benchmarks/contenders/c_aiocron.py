"""aiocron 2: ``crontab('S * * * * *')`` with the seconds field (cronsim puts it first)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC
from typing import Any

import aiocron  # type: ignore[import-untyped,unused-ignore]


class Adapter:
    def __init__(self, record: Callable[[int, float | None], None]) -> None:
        self._crons: list[Any] = []
        self._first: list[float] = []

        async def job(i: int) -> None:
            record(i, None)  # runs are never skipped: the k-th is for first slot + k

        self._job = job

    def first_slot(self, i: int) -> float | None:
        return self._first[i]

    async def add(self, i: int, interval: int, offset: int, first: float) -> None:
        if interval == 1:
            spec = "* * * * * *"
        elif 60 % interval == 0:
            spec = f"{offset % interval}/{interval} * * * * *"
        else:
            raise ValueError(f"aiocron cannot express every {interval}s")
        self._crons.append(aiocron.crontab(spec, self._job, args=(i,), start=False, tz=UTC))

    async def start(self) -> None:
        for cron in self._crons:
            cron.start()
            # start() computed the first fire time; cronsim holds it.
            self._first.append(cron.cronsim.dt.timestamp())

    async def stop(self) -> None:
        for cron in self._crons:
            cron.stop()
