"""Test helpers for users of cronlock: a virtual clock that fires slots at exact instants.

.. code-block:: python

    clock = FakeClock(datetime(2026, 3, 1, tzinfo=UTC))
    scheduler = Scheduler(tz="Europe/Berlin", clock=clock)
    ...
    async with scheduler:
        await clock.advance(timedelta(days=30))   # 30 virtual days, in milliseconds
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta

from ._clock import Clock, SystemClock, follows_real_time, wait_tasks
from ._durations import Seconds, to_seconds
from ._schedules.tz import to_utc
from ._threads import threads_in_flight

__all__ = ("FakeClock", "OffsetClock")


class FakeClock:
    """A :class:`cronlock.Clock` whose time moves only when the test says so.

    :meth:`advance` and :meth:`advance_to` move virtual time forward, stopping at every
    deadline someone sleeps until — the scheduler's next slot, a run's timeout, a task's
    :meth:`sleep` — so each slot fires at its exact instant, in order; each returns once
    the runs it started have settled (finished, or blocked on this clock). :meth:`jump`
    moves time at once, as a stalled process or a sleeping laptop would see it.

    "Settled" means the event loop has nothing ready to run and no worker thread of a
    cronlock run is busy; a task waiting on real I/O or a real timer is not waited for.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = (
            to_utc(start, field="FakeClock start") if start else datetime(2026, 1, 1, tzinfo=UTC)
        )
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        """The virtual instant (aware UTC)."""
        return self._now

    async def sleep_until(self, deadline: datetime) -> None:
        """Block until virtual time reaches *deadline*."""
        deadline = to_utc(deadline, field="deadline")
        if deadline <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._seq), future))
        await future

    async def sleep(self, seconds: Seconds) -> None:
        """Block for *seconds* of virtual time (use it in jobs under test that take time)."""
        delta = timedelta(seconds=to_seconds(seconds, field="seconds", allow_zero=True))
        await self.sleep_until(self._now + delta)

    async def advance(self, delta: Seconds) -> None:
        """Move virtual time forward by *delta*, firing everything due on the way."""
        seconds = to_seconds(delta, field="delta", allow_zero=True)
        await self.advance_to(self._now + timedelta(seconds=seconds))

    async def advance_to(self, target: datetime) -> None:
        """Move virtual time to *target*, waking each sleeper at its exact deadline."""
        target = to_utc(target, field="target")
        await self.settle()
        while True:
            self._prune()
            if not self._sleepers or self._sleepers[0][0] > target:
                break
            self._now = max(self._now, self._sleepers[0][0])
            self._wake_due()
            await self.settle()
        self._now = max(self._now, target)
        await self.settle()

    async def jump(self, delta: Seconds) -> None:
        """Move time forward by *delta* at once; sleepers wake late, as after a stall."""
        seconds = to_seconds(delta, field="delta", allow_zero=True)
        self._now += timedelta(seconds=seconds)
        self._wake_due()
        await self.settle()

    async def wait_tasks(
        self, tasks: set[asyncio.Task[None]], timeout: float
    ) -> set[asyncio.Task[None]]:
        """Used by ``Scheduler.shutdown``: wait up to *timeout* of virtual time for *tasks*.

        Virtual time moves on from deadline to deadline (as in :meth:`advance`) while any
        task is unfinished, so a run sleeping on this clock within the stop timeout ends
        normally and one sleeping past it is cancelled, without real waiting.
        """
        deadline = self._now + timedelta(seconds=timeout)
        await self.settle()
        while True:
            pending = {task for task in tasks if not task.done()}
            self._prune()
            if not pending:
                return pending
            if not self._sleepers or self._sleepers[0][0] > deadline:
                self._now = max(self._now, deadline)  # the whole stop timeout passed
                return pending
            self._now = max(self._now, self._sleepers[0][0])
            self._wake_due()
            await self.settle()

    def _prune(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)

    def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    async def settle(self) -> None:
        """Let the event loop run until everything it can run without time passing has run."""
        loop = asyncio.get_running_loop()
        ready = getattr(loop, "_ready", None)  # CPython's run queue; absent on uvloop
        quiet = 0
        while quiet < 3:
            await asyncio.sleep(0)
            if threads_in_flight():
                quiet = 0
                await asyncio.sleep(0.001)  # a worker thread's result arrives via the loop
            elif ready is not None and len(ready) > 0:
                quiet = 0
            else:
                quiet += 1


class OffsetClock:
    """A clock that runs *offset* ahead of (or, negative, behind) another clock.

    Use it to reproduce replicas whose clocks disagree, the case where a lock alone lets
    a slot run twice: ``Scheduler(clock=OffsetClock(-0.3))`` is a replica 300 ms behind.
    With a PostgreSQL locker the scheduler measures this clock against the server's and
    corrects the offset (fleet time), as it would a skewed host's clock; pass
    ``fleet_clock=False`` to the Scheduler to see the skew itself.
    """

    def __init__(self, offset: Seconds, base: Clock | None = None) -> None:
        seconds = offset.total_seconds() if isinstance(offset, timedelta) else float(offset)
        self.offset = timedelta(seconds=seconds)
        self.base: Clock = base if base is not None else SystemClock()

    @property
    def real_time(self) -> bool:
        """True when the base clock follows real time (then fleet time applies to it)."""
        return follows_real_time(self.base)

    def now(self) -> datetime:
        """The base clock's time plus the offset."""
        return self.base.now() + self.offset

    async def sleep_until(self, deadline: datetime) -> None:
        """Sleep until this clock reads *deadline*."""
        await self.base.sleep_until(deadline - self.offset)

    async def wait_tasks(
        self, tasks: set[asyncio.Task[None]], timeout: float
    ) -> set[asyncio.Task[None]]:
        """Wait for *tasks* up to *timeout* of the base clock's time (see FakeClock)."""
        return await wait_tasks(self.base, tasks, timeout)
