"""Ending a run early: at its timeout, or when its lock or leadership is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal

from .._cancel import cancel_and_wait, task_name
from .._clock import Clock, loop_clock

__all__ = ("Deadlines", "Lane", "RunGuard", "take_back")

Reason = Literal["timeout", "lock_lost"]


def take_back(task: asyncio.Task[Any], cancelling: int, exc: BaseException | None) -> bool:
    """We cancelled *task* (its run's deadline, or its lock lost); the run has now ended by
    raising *exc* (None: it returned). Take our cancel back, and say whether it is what
    ended the run: the one rule of whose cancellation it was, for :class:`RunGuard` and the
    executor's direct path alike.

    *cancelling* is ``task.cancelling()`` as the run began. A ``CancelledError`` is ours
    only if no other cancel is pending once ours is taken back: when someone else (a
    shutdown, an "replace" run, the task's owner) cancelled the task too, theirs must go on
    as ``CancelledError``, or the task would swallow a cancellation asked of it. A
    ``TimeoutError`` raised after our cancel is ours whatever else is pending (the run
    turned our cancel into one, as ``asyncio.timeout`` does); anything else (a return, a
    run that swallowed our cancel and failed) is the run's own outcome.
    """
    left = task.uncancel()
    if isinstance(exc, asyncio.CancelledError):
        return left <= cancelling
    return isinstance(exc, TimeoutError)


class Deadlines:
    """The run deadlines of a scheduler on the real clock: one event-loop timer per distinct
    timeout, not one per run.

    ``asyncio.timeout()`` arms a timer handle per run in the loop's heap and cancels it when
    the run ends; at thousands of runs a second that was about a third of the cost of a
    fire. Runs with the same timeout reach their deadlines in the order they started, so
    each distinct timeout has a :class:`Lane`: an insertion-ordered dict of the runs in
    flight and one timer for the earliest of them. A run that ends deletes its own entry.
    """

    __slots__ = ("_lanes", "_loop", "_time")

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._time = loop_clock(loop)
        self._lanes: dict[float, Lane] = {}

    def lane(self, seconds: float) -> Lane:
        """The lane of runs whose timeout is *seconds*."""
        lane = self._lanes.get(seconds)
        if lane is None:
            lane = self._lanes[seconds] = Lane(seconds, self._loop, self._time)
        return lane


class Lane:
    """The runs in flight with one timeout, oldest first, and the timer of the oldest.

    An entry is a run's task (the executor's direct path: at its deadline it is cancelled)
    or its :class:`RunGuard` (expired with reason ``"timeout"``). Whoever removes an entry
    owns the outcome: the run as it ends, or the timer as it expires it; so a run that finds
    its entry gone knows that its deadline cancelled it.
    """

    __slots__ = ("_handle", "_loop", "_time", "entries", "seconds")

    def __init__(
        self, seconds: float, loop: asyncio.AbstractEventLoop, clock: Callable[[], float]
    ) -> None:
        self.seconds = seconds
        self.entries: dict[asyncio.Task[Any] | RunGuard, float] = {}
        self._loop = loop
        self._time = clock
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, entry: asyncio.Task[Any] | RunGuard) -> None:
        """Expire *entry* :attr:`seconds` from now unless it is dropped first."""
        when = self._time() + self.seconds
        self.entries[entry] = when
        if self._handle is None:
            self._handle = self._loop.call_at(when, self._fire)

    def drop(self, entry: asyncio.Task[Any] | RunGuard) -> bool:
        """*entry*'s run ended: forget it; False when its deadline had expired it already."""
        return self.entries.pop(entry, None) is not None

    def _fire(self) -> None:
        self._handle = None
        entries = self.entries
        now = self._time()
        while entries:
            entry, when = next(iter(entries.items()))
            if when > now:
                self._handle = self._loop.call_at(when, self._fire)
                return
            del entries[entry]
            if isinstance(entry, RunGuard):
                entry.expire("timeout")
            else:
                entry.cancel()


class RunGuard:
    """Ends the run it wraps early, as ``asyncio.timeout`` would, for two reasons.

    At the deadline, or when ``lose()`` is called (the run's lock or leadership was lost),
    the run's task is cancelled; on the way out that cancellation becomes ``TimeoutError``
    and the task's pending-cancel count is put back, while a cancellation from outside still
    propagates as ``CancelledError`` (:func:`take_back`). ``reason`` tells which of the two
    it was, ``ended_run`` whether it is what ended the run. On the real
    clock deadlines go through the scheduler's shared :class:`Deadlines`; a virtual clock's
    time is not the loop's, so there a watchdog task sleeps on the clock instead.
    """

    __slots__ = (
        "_cancelling",
        "_clock",
        "_deadlines",
        "_dog",
        "_lane",
        "_seconds",
        "_task",
        "ended_run",
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
        self._lane: Lane | None = None
        self.exited = False
        self.ended_run = False  # our cancel (for reason) is what ended the run
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
            self._lane = self._deadlines.lane(self._seconds)
            self._lane.watch(self)
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
        if self._lane is not None:
            self._lane.drop(self)
        if self._dog is not None:
            # Wait for the watchdog without letting its cancellation count as ours.
            await cancel_and_wait(self._dog)
        if self.reason is not None:
            assert self._task is not None
            self.ended_run = take_back(self._task, self._cancelling, exc)
            if self.ended_run and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc  # as asyncio.timeout() does
