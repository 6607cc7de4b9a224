"""One-shot schedules: fixed instants, or "once when the scheduler starts"."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from .._errors import ScheduleError
from .tz import to_utc

__all__ = ("OnceSchedule", "once")


@dataclass(frozen=True, slots=True)
class OnceSchedule:
    """Slots at the given instants only; exhausted (``None``) after the last one.

    ``at_start=True`` (with no instants) means "run once as soon as the scheduler
    starts": it has no slot of its own, so :meth:`next_after` returns ``None`` and the
    scheduler special-cases it.
    """

    instants: tuple[datetime, ...] = ()
    """The slots, aware UTC, sorted, without duplicates."""
    at_start: bool = False
    """Whether this is the "once at scheduler start" schedule."""

    def __post_init__(self) -> None:
        if self.at_start and self.instants:
            raise ScheduleError("once: at_start=True takes no instants")
        if not self.at_start and not self.instants:
            raise ScheduleError("once: at least one instant is required")
        for value in self.instants:
            if not isinstance(value, datetime):
                raise ScheduleError(f"once: {value!r} is not a datetime")
        normalised = tuple(sorted({to_utc(v, field="once") for v in self.instants}))
        object.__setattr__(self, "instants", normalised)

    def next_after(self, after: datetime) -> datetime | None:
        """The first given instant strictly after *after*, or ``None`` when none is left."""
        index = bisect.bisect_right(self.instants, to_utc(after, field="next_after"))
        return self.instants[index] if index < len(self.instants) else None

    def __str__(self) -> str:
        if self.at_start:
            return "once at start"
        return "once at " + ", ".join(i.isoformat() for i in self.instants)


def once(at: datetime | Sequence[datetime] | None = None) -> OnceSchedule:
    """A schedule that fires at the given aware instant(s), or once at scheduler start.

    ``once()`` runs the job once when the scheduler starts. ``once(dt)`` and
    ``once([dt1, dt2])`` fire at those instants (duplicates collapse); naive datetimes are
    rejected with :class:`~cronlock.ScheduleError`, as they name no instant.
    """
    if at is None:
        return OnceSchedule(at_start=True)
    if isinstance(at, datetime):
        return OnceSchedule((at,))
    if isinstance(at, str | bytes) or not isinstance(at, Sequence):
        raise ScheduleError(f"once: at must be a datetime or a sequence of them, got {at!r}")
    if not at:
        raise ScheduleError("once: at is an empty sequence; pass at least one datetime")
    return OnceSchedule(tuple(at))
