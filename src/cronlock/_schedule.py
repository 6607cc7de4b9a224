"""The Schedule protocol and the helpers every schedule kind shares."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Protocol, runtime_checkable
from zoneinfo import ZoneInfo

from ._interval import IntervalSchedule

__all__ = ("Schedule", "bind_zone", "upcoming")


@runtime_checkable
class Schedule(Protocol):
    """A pure function from an instant to the next slot.

    ``next_after(t)`` returns the first slot strictly after *t* as an aware UTC datetime,
    or ``None`` when the schedule is exhausted. It depends on nothing but its arguments and
    the schedule's own fields, so every replica computes the same slots.
    """

    def next_after(self, after: datetime) -> datetime | None:
        """Return the first slot strictly after the aware datetime *after*, or ``None``."""
        ...


def bind_zone(schedule: Schedule, tz: ZoneInfo) -> Schedule:
    """Give a wall-clock schedule created without ``tz=`` the scheduler's zone."""
    if type(schedule) is IntervalSchedule:  # the common case needs neither import below
        return schedule
    from ._calendar import CalendarSchedule
    from ._cron import CronSchedule

    if isinstance(schedule, CronSchedule | CalendarSchedule) and schedule.tz is None:
        return dataclasses.replace(schedule, tz=tz)
    return schedule


def upcoming(schedule: Schedule, after: datetime, n: int) -> list[datetime]:
    """The next *n* slots after *after* (fewer if the schedule runs out)."""
    out: list[datetime] = []
    current = after
    while len(out) < n:
        slot = schedule.next_after(current)
        if slot is None:
            break
        out.append(slot)
        current = slot
    return out
