"""Ending a run early: at its timeout, or when its lock or leadership is lost."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import datetime, timedelta
from types import TracebackType
from typing import Literal

from ._cancel import cancel_and_wait, task_name
from ._clock import Clock

__all__ = ("Deadlines", "RunGuard", "TaskDeadline")

Reason = Literal["timeout", "lock_lost"]


class Deadlines:
    """One event-loop timer for every run deadline of a scheduler (real clock only).

    ``asyncio.timeout()`` arms a timer handle per run in the loop's heap and cancels it when
    the run ends; at thousands of runs a second that was about a third of the cost of a
    fire. Guards register here instead, and one handle is armed for the earliest deadline.
    Guards that ended are dropped lazily, and the heap is compacted once they are the
    majority, so a long timeout on a frequent job does not pile entries up.
    """

    __slots__ = ("_armed", "_dead", "_handle", "_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, RunGuard | TaskDeadline]] = []
        self._seq = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._armed: float | None = None
        self._dead = 0

    def add(self, when: float, guard: RunGuard | TaskDeadline) -> None:
        """Expire *guard* at loop time *when* unless it has ended by then."""
        heapq.heappush(self._heap, (when, next(self._seq), guard))
        if self._armed is None or when < self._armed:
            self._arm(when)

    def ended(self) -> None:
        """A registered guard ended before its deadline."""
        self._dead += 1
        if self._dead > 64 and self._dead * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].exited]
            heapq.heapify(self._heap)
            self._dead = 0

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = asyncio.get_running_loop().call_at(when, self._fire)
        self._armed = when

    def _fire(self) -> None:
        self._handle = self._armed = None
        now = asyncio.get_running_loop().time()
        heap = self._heap
        while heap and heap[0][0] <= now:
            guard = heapq.heappop(heap)[2]
            if guard.exited:
                self._dead -= 1
            else:
                guard.expire("timeout")
        if heap:
            self._arm(heap[0][0])


class TaskDeadline:
    """The deadline of a run on the executor's direct path: :class:`RunGuard` without the
    context manager, the watchdog or lock loss (the executor does the way out itself).
    """

    __slots__ = ("exited", "reason", "task")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task
        self.exited = False
        self.reason: Reason | None = None

    def expire(self, reason: Reason) -> None:
        """End the run now (no-op once it has ended)."""
        if self.reason is None and not self.exited:
            self.reason = reason
            self.task.cancel()


class RunGuard:
    """Ends the run it wraps early, as ``asyncio.timeout`` would, for two reasons.

    At the deadline, or when ``lose()`` is called (the run's lock or leadership was lost),
    the run's task is cancelled; on the way out that cancellation becomes ``TimeoutError``
    and the task's pending-cancel count is put back, while a cancellation from outside still
    propagates as ``CancelledError``. ``reason`` tells which one ended the run. On the real
    clock deadlines go through the scheduler's shared :class:`Deadlines`; a virtual clock's
    time is not the loop's, so there a watchdog task sleeps on the clock instead.
    """

    __slots__ = (
        "_cancelling",
        "_clock",
        "_deadlines",
        "_dog",
        "_seconds",
        "_task",
        "exited",
        "lost_because",
        "reason",
    )

    def __init__(self, clock: Clock, seconds: float | None, deadlines: Deadlines | None) -> None:
        self._clock = clock
        self._seconds = seconds
        self._deadlines = deadlines
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._dog: asyncio.Task[None] | None = None
        self.exited = False
        self.reason: Reason | None = None
        self.lost_because: BaseException | None = None

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        if self._seconds is None:
            return
        if self._deadlines is not None:
            loop = asyncio.get_running_loop()
            self._deadlines.add(loop.time() + self._seconds, self)
        else:
            deadline = self._clock.now() + timedelta(seconds=self._seconds)
            self._dog = asyncio.create_task(self._watch(deadline), name=task_name("timeout"))

    async def _watch(self, deadline: datetime) -> None:
        await self._clock.sleep_until(deadline)
        self.expire("timeout")

    def expire(self, reason: Reason) -> None:
        """End the run now (no-op once it has ended or was already ended)."""
        if self.reason is None and not self.exited and self._task is not None:
            self.reason = reason
            self._task.cancel()

    def lose(self, exc: BaseException | None) -> None:
        """The run's lock or leadership was lost: end the run now."""
        if self.reason is None:
            self.lost_because = exc
        self.expire("lock_lost")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.exited = True  # from here on, expire() and lose() do nothing
        if self._deadlines is not None and self._seconds is not None:
            self._deadlines.ended()
        if self._dog is not None:
            # Wait for the watchdog without letting its cancellation count as ours.
            await cancel_and_wait(self._dog)
        if self.reason is not None:
            assert self._task is not None
            # Take back our cancel; if it was the only one pending, the run ended because
            # of us: report it as a timeout, not as the task being cancelled.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
