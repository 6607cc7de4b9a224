"""An event collector the PostgreSQL tests share: subscribe it, then wait for events."""

from __future__ import annotations

import asyncio
from typing import Any

from cronlock import Event


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
