"""Long work on the event loop, done in slices: :class:`Pacer`.

A replica with 100,000 stored schedules decodes, registers and plans each of them, and a
sync that changes them all does that again. Done in one go, that holds the event loop for
seconds: no job fires, no lease is renewed, no lock session answers its heartbeat. Such
work asks a pacer between two items; once it has held the loop for a slice (about 4 ms)
the pacer lets every other ready task run before it goes on. The slice is short because
every other task's step waits a whole turn of the loop: a claim's answer takes several
steps (the answer read, the batch's task, the run's task), so with slices of 10 ms a
lease-mode claim answered in 3 ms on the server reached its run 50-60 ms later, and a job
every second started up to 0.1-0.3 s late while 100,000 stored schedules loaded; with
4 ms, at p99 12-40 ms, the load itself no slower. The slice is shared: all the
paced work of one turn of the event loop holds it for about one slice together (several
pieces of long work at once, each with a slice of its own, added up to 40-100 ms a turn):
each piece goes on for an equal share of it, and for one step at least.

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

SLICE = 0.004
"""Seconds the long work of one turn holds the event loop before it lets others run."""
FREEZE_FROM: int | None = 5000
"""Items from which a piece of work is bulk work, which freezes the objects of the process
at each pause and at its end (:func:`gc.freeze`); ``None``: no work does."""


class _Turn:
    """The paced work of one turn of an event loop: each piece that goes on in a turn
    gets an equal share of the slice, by how many pieces went on in the turn before. A
    turn opens with the first piece that goes on in it and closes with a callback that
    runs at the start of the next (one scheduled with ``call_soon`` runs after what is
    ready now)."""

    __slots__ = ("_close", "before", "loop", "open", "pieces")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.open = False
        self.pieces = 0  # pieces of work that went on in this turn so far
        self.before = 1  # ... in the turn before

        def close() -> None:
            self.open, self.before = False, max(1, self.pieces)

        self._close = close

    def until(self, loop: asyncio.AbstractEventLoop, now: float, slice: float) -> float:
        """Until when the piece of work going on now may hold the loop in this turn."""
        if not self.open or self.loop is not loop:
            if self.loop is not loop:
                self.loop, self.before = loop, 1
            self.open, self.pieces = True, 0
            loop.call_soon(self._close)
        self.pieces += 1
        return now + slice / self.before


_turn = _Turn()


class Pacer:
    """Lets other tasks run once this work has held the event loop for its share of
    *slice* seconds (default :data:`SLICE`, on the loop's monotonic clock) in this turn of
    the loop: the slice divided by the pieces of paced work that went on in the turn
    before (:class:`_Turn`); after each pause it makes one step at least. One per piece of
    work, made in its task. Work of *items* (:data:`FREEZE_FROM` or more) is bulk work,
    which freezes the process's objects at each pause and at :meth:`done`."""

    __slots__ = ("_freeze", "_fresh", "_loop", "_now", "_slice", "_until", "yields")

    def __init__(self, slice: float | None = None, *, items: int = 0) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._now = loop.time
        self._slice = SLICE if slice is None else slice
        self._until = _turn.until(loop, self._now(), self._slice)
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
        """Let the other ready tasks run if the work held the loop for its share of the
        slice (never before the first step after the last pause)."""
        if self._fresh:
            self._fresh = False
        elif self._now() >= self._until:
            await self.yield_now()
            self._fresh = False

    async def yield_now(self) -> None:
        """Let the other ready tasks run now; the work goes on in the next turn, for its
        share of the slice then."""
        if self._freeze:
            gc.freeze()
        await asyncio.sleep(0)
        self.yields += 1
        self._until = _turn.until(self._loop, self._now(), self._slice)
        self._fresh = True
