"""Long work on the event loop, done in slices: :class:`Pacer`.

A replica with 100,000 stored schedules decodes, registers and plans each of them, and a
sync that changes them all does that again. Done in one go, that holds the event loop for
seconds: no job fires, no lease is renewed, no lock session answers its heartbeat. Such
work asks a pacer between two items; once it has held the loop for a slice (about 10 ms)
the pacer lets every other ready task run before it goes on.
"""

from __future__ import annotations

import asyncio

__all__ = ("SLICE", "Pacer")

SLICE = 0.01
"""Seconds a piece of long work holds the event loop before it lets others run."""


class Pacer:
    """Lets other tasks run whenever the work asking it has held the loop for *slice*
    seconds (default :data:`SLICE`, on the loop's monotonic clock). One per piece of work,
    made in its task."""

    __slots__ = ("_now", "_slice", "_until", "yields")

    def __init__(self, slice: float | None = None) -> None:
        self._now = asyncio.get_running_loop().time
        self._slice = SLICE if slice is None else slice
        self._until = self._now() + self._slice
        self.yields = 0
        """How many times the work let others run."""

    def due(self) -> bool:
        """Whether the work has held the loop for its slice."""
        return self._now() >= self._until

    async def pause(self) -> None:
        """Let the other ready tasks run if the work has held the loop for its slice."""
        if self._now() >= self._until:
            await self.yield_now()

    async def yield_now(self) -> None:
        """Let the other ready tasks run now; the next slice starts after them."""
        await asyncio.sleep(0)
        self.yields += 1
        self._until = self._now() + self._slice
