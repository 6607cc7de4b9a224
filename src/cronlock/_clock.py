"""Clocks. This is the only module of the library that reads the system time."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = ("Clock", "SystemClock", "monotonic")


def monotonic() -> float:
    """Seconds on the monotonic clock: for leases and durations, never for slots."""
    return time.monotonic()


@runtime_checkable
class Clock(Protocol):
    """What the scheduler asks for the time; swap it for :class:`cronlock.testing.FakeClock`."""

    def now(self) -> datetime:
        """Return the current instant as an aware UTC datetime."""
        ...

    async def sleep_until(self, deadline: datetime) -> None:
        """Return once :meth:`now` is at or past *deadline* (an aware datetime)."""
        ...


class SystemClock:
    """The real clock: wall time from :func:`time.time`, waits on the event loop's timer.

    The event loop sleeps on its monotonic clock, so a wall-clock step (NTP, manual change,
    laptop sleep) could wake us early or late; :meth:`sleep_until` re-checks the wall clock
    after each wake-up and sleeps again when it woke early.
    """

    __slots__ = ()

    def now(self) -> datetime:
        """Return the current wall-clock instant in UTC."""
        return datetime.fromtimestamp(time.time(), UTC)

    async def sleep_until(self, deadline: datetime) -> None:
        """Sleep until the wall clock reaches *deadline*."""
        target = deadline.timestamp()
        while True:
            remaining = target - time.time()
            if remaining <= 0:
                return
            # Cap each nap so a wall-clock jump is noticed within a minute.
            await asyncio.sleep(min(remaining, 60.0))
