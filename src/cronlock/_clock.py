"""Clocks. This is the only module of the library that reads the system time."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = (
    "Clock",
    "RealTimeClock",
    "SystemClock",
    "VirtualClock",
    "follows_real_time",
    "monotonic",
    "wait_tasks",
)


_monotonic: Callable[[], float] = time.monotonic
"""What :func:`monotonic` reads; the fleet simulation (``cronlock._sim``) sets its virtual
time here, so that leases, fences and back-offs follow the simulated processes' time."""


def monotonic() -> float:
    """Seconds on the monotonic clock: for leases and durations, never for slots."""
    return _monotonic()


def loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The clock of *loop*'s timers (``loop.time``); for asyncio's own loops, which read
    :func:`time.monotonic`, that function itself (one Python call less per read)."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


@runtime_checkable
class Clock(Protocol):
    """What the scheduler asks for the time; swap it for :class:`cronlock.testing.FakeClock`."""

    def now(self) -> datetime:
        """Return the current instant as an aware UTC datetime."""
        ...

    async def sleep_until(self, deadline: datetime) -> None:
        """Return once :meth:`now` is at or past *deadline* (an aware datetime)."""
        ...


@runtime_checkable
class VirtualClock(Clock, Protocol):
    """A clock whose time is not the event loop's (:class:`cronlock.testing.FakeClock`).

    The scheduler's stop timeout is then measured in the clock's own time: it asks the
    clock to wait for the runs in flight instead of waiting on the event loop's timer.
    """

    async def wait_tasks(
        self, tasks: set[asyncio.Task[None]], timeout: float
    ) -> set[asyncio.Task[None]]:
        """Wait up to *timeout* seconds of this clock's time; return the tasks still pending."""
        ...


@runtime_checkable
class RealTimeClock(Clock, Protocol):
    """A clock that can say whether its time moves with real time (``SystemClock`` does).

    Only such a clock is compared with a database server's clock for fleet time
    (``Scheduler(fleet_clock=...)``): a virtual clock's time cannot be.
    """

    @property
    def real_time(self) -> bool:
        """True when this clock's time moves with real time (at most a fixed offset off)."""
        ...


def follows_real_time(clock: Clock) -> bool:
    """Whether *clock* says its time moves with real time (see :class:`RealTimeClock`)."""
    return isinstance(clock, RealTimeClock) and clock.real_time


async def wait_tasks(
    clock: Clock, tasks: set[asyncio.Task[None]], timeout: float
) -> set[asyncio.Task[None]]:
    """Wait up to *timeout* seconds of *clock*'s time for *tasks*; return those still pending."""
    if isinstance(clock, VirtualClock):
        return await clock.wait_tasks(tasks, timeout)
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    return pending


class SystemClock:
    """The real clock: wall time from :func:`time.time`, waits on the event loop's timer.

    The event loop sleeps on its monotonic clock, so a wall-clock step (NTP, manual change,
    laptop sleep) could wake us early or late; :meth:`sleep_until` re-checks the wall clock
    after each wake-up and sleeps again when it woke early.
    """

    __slots__ = ()

    @property
    def real_time(self) -> bool:
        """Always True: this is real time."""
        return True

    now: Callable[[], datetime] = staticmethod(functools.partial(datetime.now, UTC))
    """Return the current wall-clock instant in UTC. Read twice per run, so it is a C
    call through and through: a partial, ``self`` not passed (a staticmethod, which Python
    3.13 asks for, hands the partial itself back on lookup: no frame is added)."""

    async def sleep_until(self, deadline: datetime) -> None:
        """Sleep until the wall clock reaches *deadline*."""
        target = deadline.timestamp()
        while True:
            remaining = target - time.time()
            if remaining <= 0:
                return
            # Cap each nap so a wall-clock jump is noticed within a minute.
            await asyncio.sleep(min(remaining, 60.0))
