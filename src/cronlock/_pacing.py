"""Long work on the event loop, done in slices: :class:`Pacer`.

A replica with 100,000 stored schedules decodes, registers and plans each of them, and a
sync that changes them all does that again. Done in one go, that holds the event loop for
seconds: no job fires, no lease is renewed, no lock session answers its heartbeat. Such
work asks a pacer between two items; once it has held the loop for a slice (about 10 ms)
the pacer lets every other ready task run before it goes on. The slice is shared: all the
paced work of one turn of the event loop holds it for about one slice together (several
pieces of long work at once, each with a slice of its own, added up to 40-100 ms a turn),
and each piece makes one step at least every turn, so none is starved.

Bulk work (:data:`FREEZE_FROM` items or more) also keeps the garbage collector's full
passes short. Each full pass walks every object the process holds: over 100,000 jobs and
the rows they were read from, 65 to 300 ms, several times during a load (a full pass comes
each time the objects surviving grew by a quarter), each one a stall no slicing avoids. So
at each pause and at its end such work freezes what the process holds (:func:`gc.freeze`:
moved out of the collector's sight, in constant time): the full passes then walk only what
was made since. The trade-off: a frozen object is still freed when its last reference
goes, as every object is, but one that becomes part of an unreachable cycle is never
collected (kept until the process ends or something calls :func:`gc.unfreeze`). Jobs,
their schedules and the rows they come from form no such cycles when they go; what else
the process drops in cycles during a bulk load or sync stays. Steady-state syncs (fewer
changes) never freeze.
"""

from __future__ import annotations

import asyncio
import gc

__all__ = ("FREEZE_FROM", "SLICE", "Pacer")

SLICE = 0.01
"""Seconds a piece of long work holds the event loop before it lets others run."""
FREEZE_FROM: int | None = 5000
"""Items from which a piece of work is bulk work, which freezes the objects of the process
at each pause and at its end (:func:`gc.freeze`); ``None``: no work does."""


class _Turn:
    """The slice of paced work the current turn of an event loop still has: opened by the
    first piece of work that goes on in a turn, closed by a callback that runs at the start
    of the next turn (one scheduled with ``call_soon`` runs after what is ready now)."""

    __slots__ = ("loop", "open", "until")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.open = False
        self.until = 0.0

    def deadline(self, loop: asyncio.AbstractEventLoop, now: float, slice: float) -> float:
        """When the paced work of this turn must let others run."""
        if not self.open or self.loop is not loop:
            self.loop, self.open, self.until = loop, True, now + slice
            loop.call_soon(self._close)
        return self.until

    def _close(self) -> None:
        self.open = False


_turn = _Turn()


class Pacer:
    """Lets other tasks run whenever the paced work of this turn of the event loop (this
    one's and any other's) has held it for *slice* seconds (default :data:`SLICE`, on the
    loop's monotonic clock); after each pause it makes one step at least. One per piece of
    work, made in its task. Work of *items* (:data:`FREEZE_FROM` or more) is bulk work,
    which freezes the process's objects at each pause and at :meth:`done`."""

    __slots__ = ("_freeze", "_fresh", "_loop", "_now", "_slice", "_until", "yields")

    def __init__(self, slice: float | None = None, *, items: int = 0) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._now = loop.time
        self._slice = SLICE if slice is None else slice
        self._until = _turn.deadline(loop, self._now(), self._slice)
        self._fresh = True
        self._freeze = FREEZE_FROM is not None and items >= FREEZE_FROM
        self.yields = 0
        """How many times the work let others run."""

    def done(self) -> None:
        """The work is over: bulk work freezes what it leaves (the jobs it registered)."""
        if self._freeze:
            gc.freeze()

    def due(self) -> bool:
        """Whether the work has held the loop for its slice (its first step after a pause
        is never due)."""
        return not self._fresh and self._now() >= self._until

    async def pause(self) -> None:
        """Let the other ready tasks run if this turn's paced work held the loop for its
        slice (never before the first step after the last pause)."""
        if self._fresh:
            self._fresh = False
        elif self._now() >= self._until:
            await self.yield_now()
            self._fresh = False

    async def yield_now(self) -> None:
        """Let the other ready tasks run now; the next step goes on in this turn's slice."""
        if self._freeze:
            gc.freeze()
        await asyncio.sleep(0)
        self.yields += 1
        self._until = _turn.deadline(self._loop, self._now(), self._slice)
        self._fresh = True
