"""An event collector the PostgreSQL tests share: subscribe it, then wait for events."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from cronlock import Event, RunContext


class Events:
    """Collects a scheduler's events; ``await until(kind, n)`` waits for the n-th of a kind."""

    def __init__(self) -> None:
        self.items: list[Event] = []
        self.changed = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.items.append(event)
        self.changed.set()

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.items if isinstance(e, kind)]

    def count(self, kind: type[Event]) -> int:
        return len(self.of(kind))

    async def until(self, kind: type[Event], n: int = 1, timeout: float = 60) -> Any:
        """Wait for the *n*-th event of *kind* and return it."""
        async with asyncio.timeout(timeout):  # a liveness guard, not a timing
            while True:
                found = self.of(kind)
                if len(found) >= n:
                    return found[n - 1]
                self.changed.clear()
                await self.changed.wait()


class CutOffFirstRun:
    """A task whose first run hangs until it is cut off (cancelled: its lock was lost),
    and whose later runs return at once; :attr:`slots` lists the slot of every run."""

    def __init__(self) -> None:
        self.slots: list[datetime] = []
        self.running = asyncio.Event()
        """Set once the first run is in progress."""

    async def task(self, ctx: RunContext) -> None:
        """The job's task (register ``CutOffFirstRun().task``)."""
        self.slots.append(ctx.slot)
        if len(self.slots) == 1:
            self.running.set()
            await asyncio.sleep(60)

    def reruns(self) -> int:
        """How many more runs the first run's slot had."""
        return self.slots.count(self.slots[0]) - 1 if self.slots else 0
