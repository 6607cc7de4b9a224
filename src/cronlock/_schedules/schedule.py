"""The Schedule protocol and the helpers every schedule kind shares."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable
from zoneinfo import ZoneInfo

from .._errors import ScheduleError
from .interval import IntervalSchedule
from .once import OnceSchedule

__all__ = (
    "MIN_INTERVAL",
    "SAMPLED_SLOTS",
    "Schedule",
    "bind_zone",
    "check_interval",
    "check_jitter",
    "shortest_gap",
    "upcoming",
)


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


_walls: tuple[type, ...] = ()  # the wall-clock kinds, imported at the first need


def bind_zone(schedule: Schedule, tz: ZoneInfo) -> Schedule:
    """Give a wall-clock schedule created without ``tz=`` the scheduler's zone."""
    if type(schedule) is IntervalSchedule:  # the common case needs no import
        return schedule
    walls = _walls or _wall_kinds()  # (an import per call cost 100,000 stored jobs 1 s)
    if isinstance(schedule, walls) and schedule.tz is None:  # type: ignore[attr-defined]
        return dataclasses.replace(schedule, tz=tz)  # type: ignore[type-var]
    return schedule


def _wall_kinds() -> tuple[type, ...]:
    global _walls
    from .calendar import CalendarSchedule
    from .cron import CronSchedule

    _walls = (CronSchedule, CalendarSchedule)
    return _walls


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


MIN_INTERVAL = timedelta(milliseconds=50)
"""The shortest interval of a job's ``every()`` schedule: 20 slots a second.

Each slot costs the run loop a plan, a start, events and log records, and a coordinated
job a claim and a row in the ledger: with ``every(seconds=1e-6)`` one job kept a core busy
and wrote thousands of warnings and a hundred ledger rows a second. ``every()`` itself
takes any positive interval (its slots are pure arithmetic); a job is refused one below
this floor when it is registered or given a new schedule."""


def check_interval(job: str, schedule: Schedule) -> None:
    """Refuse job *job*'s ``every()`` schedule if its interval is below :data:`MIN_INTERVAL`.

    Raises :class:`~cronlock.ScheduleError` naming the job, ``interval``, its value and
    the floor. Only interval schedules can be this fine: the finest cron schedule fires
    every second, and a ``once()`` schedule's instants are finite.
    """
    if type(schedule) is IntervalSchedule and schedule.interval < MIN_INTERVAL:
        raise ScheduleError(
            f"job {job!r}: interval={_seconds(schedule.interval)} ({schedule}) is below the "
            f"floor of {_seconds(MIN_INTERVAL)} a job's interval may have (20 runs a second): "
            "each slot costs a plan, a start, events and logs, and a coordinated job a claim "
            f"and a ledger row; use every({MIN_INTERVAL.total_seconds():g}) or longer"
        )


SAMPLED_SLOTS = 16
"""How many slots of a cron or calendar schedule the shortest gap is measured over."""

# The slots are sampled from one fixed instant, not from now: every replica, whenever it
# starts, accepts or refuses the same job. Cron and calendar schedules repeat within days,
# weeks or months, so 16 consecutive slots hold their shortest gap; what a sample can miss
# is a night when DST shortens a gap by an hour.
_SAMPLE_FROM = datetime(2024, 1, 1, tzinfo=UTC)
_gaps: dict[Schedule, timedelta | None] = {}  # jobs alike share a schedule: sampled once


def check_jitter(job: str, schedule: Schedule, jitter: float | None) -> Schedule:
    """Return *schedule* if job *job*'s checked *jitter* (seconds) is shorter than its gaps.

    Raises :class:`~cronlock.ScheduleError` naming the job, ``jitter``, its value and the
    interval (or the shortest gap of the slots sampled). A schedule of the user's own
    class is not sampled: its ``next_after`` may be costly, or have effects.

    Why: a slot fires at ``slot + offset``, the offset in ``[0, jitter)``. While the jitter
    is shorter than the gap to the next slot, each slot starts before the next one is due,
    so the starts keep the slots' order. With a longer jitter a slot can start after the
    next slot's start: the run loop, finding that one due before this one has run,
    coalesces the two, and a run is lost.
    """
    if not jitter:
        return schedule
    gap = shortest_gap(schedule)
    if gap is None or jitter < gap.total_seconds():
        return schedule
    if type(schedule) is IntervalSchedule:
        what = f"the interval of its schedule, {_seconds(gap)} ({schedule})"
    elif type(schedule) is OnceSchedule:
        what = f"the shortest gap between two instants of its schedule, {_seconds(gap)}"
    else:
        what = (
            f"the shortest gap between two of the first {SAMPLED_SLOTS} slots of its "
            f"schedule, {_seconds(gap)} ({schedule})"
        )
    raise ScheduleError(
        f"job {job!r}: jitter={jitter:g}s must be shorter than {what}, or a slot can start "
        "after the next one and the two are coalesced into one run; use a smaller jitter"
    )


def shortest_gap(schedule: Schedule) -> timedelta | None:
    """The shortest gap between two consecutive slots of *schedule*, if cheap to know.

    Exact for ``every()`` and ``once()``; for ``cron()`` and the calendar schedules, over
    :data:`SAMPLED_SLOTS` slots from a fixed instant. ``None`` for a schedule with fewer
    than two slots, or of a class of the user's.
    """
    if type(schedule) is IntervalSchedule:
        return schedule.interval
    if type(schedule) is OnceSchedule:
        instants = schedule.instants
        return min((b - a for a, b in itertools.pairwise(instants)), default=None)
    # Imported here, as bind_zone() does: registering only every() jobs loads no croniter.
    from .calendar import CalendarSchedule
    from .cron import CronSchedule

    if type(schedule) is not CronSchedule and type(schedule) is not CalendarSchedule:
        return None
    if schedule in _gaps:  # frozen dataclasses of hashable fields
        return _gaps[schedule]
    slots: list[datetime] = []
    current: datetime | None = _SAMPLE_FROM
    while len(slots) < SAMPLED_SLOTS and current is not None:
        current = schedule.next_after(current)
        if current is not None:
            slots.append(current)
    gap = min((b - a for a, b in itertools.pairwise(slots)), default=None)
    if len(_gaps) >= 256:
        _gaps.clear()
    _gaps[schedule] = gap
    return gap


def _seconds(gap: timedelta) -> str:
    return f"{gap.total_seconds():g}s"
