"""Event loops on virtual time, one per simulated process, stepped by one world.

Each replica runs on a loop of its own, as a process would: freezing a replica is not
stepping its loop; killing it is dropping its loop with whatever it was doing. Every loop
reads the world's one virtual clock (:attr:`VirtualTime.now`), so ``asyncio.sleep``,
``asyncio.timeout`` and every timer of the library fire at exact virtual instants, and a
run never waits on real time.

Why a loop of our own rather than ``looptime`` or ``async-solipsism``: both fast-forward
one loop, and the simulation needs several loops that share one clock and are stepped in
the world's order (a frozen process keeps its timers while the others go on). What is
needed of asyncio is its base loop's turn (the timers due join the ready callbacks, then
those run), which :meth:`SimLoop.step` repeats without a selector: nothing here does real
I/O.
"""

from __future__ import annotations

import asyncio
import heapq
import threading
from asyncio import events
from collections.abc import Callable
from typing import Any

__all__ = ("SimLoop", "VirtualTime")


class VirtualTime:
    """The world's clock: seconds since the simulation began, moved only by the world."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0


class _NoSelector:
    """A selector with nothing to select: virtual time is moved by the world, not here."""

    def select(self, timeout: float | None = None) -> list[Any]:
        return []

    def register(self, *args: Any) -> None:
        pass

    def unregister(self, *args: Any) -> None:
        pass

    def get_map(self) -> dict[Any, Any]:
        return {}

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    """An asyncio loop whose :meth:`time` is the world's virtual time, run a step at a time."""

    def __init__(self, clock: VirtualTime, name: str, on_error: Callable[[str], None]) -> None:
        super().__init__()
        self._selector = _NoSelector()  # read by BaseEventLoop._run_once
        self._virtual = clock
        self.name = name
        self._on_error = on_error
        self.set_exception_handler(self._exception)

    def time(self) -> float:
        """The world's virtual time."""
        return self._virtual.now

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def _exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # asyncio's own report of an exception nobody retrieved: a task that failed
        # unawaited is a bug of the library (nothing a job does may escape its run).
        message = context.get("message", "")
        exc = context.get("exception")
        future = context.get("future")
        where = ""
        if isinstance(future, asyncio.Task):
            coro = future.get_coro()
            where = f" in task {future.get_name()!r} ({getattr(coro, '__qualname__', coro)})"
        self._on_error(f"{self.name}: {message}{where} {exc!r}")

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """Run *func* here and now (``asyncio.to_thread`` included): a worker thread would
        finish in real time, outside the world's order."""
        future = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:  # delivered to the awaiting task, as a thread's would be
            future.set_exception(exc)
        return future

    # BaseEventLoop's private state, which typeshed does not declare.

    @property
    def _base(self) -> Any:
        return self

    def due(self, now: float) -> bool:
        """Whether a callback is ready, or a timer due at *now* (one turn has work)."""
        base: Any = self
        if base._ready:
            return True
        scheduled = base._scheduled
        return bool(scheduled) and scheduled[0]._when <= now

    def ready(self) -> bool:
        """Whether a callback is ready to run now."""
        return bool(self._base._ready)

    def next_timer(self) -> float | None:
        """When the earliest live timer of this loop is due (``None``: no timer)."""
        base = self._base
        scheduled = base._scheduled
        while scheduled and scheduled[0]._cancelled:
            heapq.heappop(scheduled)
            base._timer_cancelled_count = max(0, base._timer_cancelled_count - 1)
        when: float | None = scheduled[0]._when if scheduled else None
        return when

    def step(self, limit: int, interrupted: Callable[[], bool]) -> int:
        """Run this loop at the current instant until nothing is ready and no timer is due:
        asyncio's own turn (``BaseEventLoop._run_once``: the timers due join the ready
        callbacks, then those run), repeated, without the selector; or until
        *interrupted()* says the world has something to deliver at this instant first (a
        task may be polling for it). Returns the turns taken, at most *limit* (a loop still
        busy then is left for its caller to judge)."""
        base = self._base
        ready = base._ready
        scheduled = base._scheduled
        # Due: at or before now, as :meth:`due` says (not asyncio's "within the clock's
        # resolution": a timer a hair ahead is the world's to reach, by moving its clock;
        # run now, a task that sleeps until an instant would wake before it, again and again).
        now = self._virtual.now
        base._thread_id = threading.get_ident()  # is_running() while stepping
        outer = events._get_running_loop()  # a test's own loop, driving the world
        events._set_running_loop(self)
        turns = 0
        heappop, popleft = heapq.heappop, ready.popleft  # (this loop is the hottest there is)
        try:
            while turns < limit:
                if len(scheduled) > 100 and base._timer_cancelled_count * 2 > len(scheduled):
                    live = [handle for handle in scheduled if not handle._cancelled]
                    for handle in scheduled:
                        if handle._cancelled:
                            handle._scheduled = False
                    heapq.heapify(live)
                    scheduled[:] = live
                    base._timer_cancelled_count = 0
                while scheduled and scheduled[0]._when <= now:
                    handle = heappop(scheduled)
                    handle._scheduled = False
                    if handle._cancelled:
                        base._timer_cancelled_count -= 1
                    else:
                        ready.append(handle)
                if not ready:
                    break
                turns += 1
                for _ in range(len(ready)):
                    handle = popleft()
                    if not handle._cancelled:
                        handle._run()
                if interrupted():
                    break
        finally:
            events._set_running_loop(outer)
            base._thread_id = None
        return turns

    def abandon(self) -> None:
        """Forget everything this loop was to do: no callback of it runs again."""
        self._base._ready.clear()
        self._base._scheduled.clear()
