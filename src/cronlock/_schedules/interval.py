"""Fixed-interval schedules whose slots are anchored, not relative to process start."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .._errors import ScheduleError
from .tz import to_utc

__all__ = ("IntervalSchedule", "every")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX = datetime.max.replace(tzinfo=UTC)


def _micros(delta: timedelta) -> int:
    # timedelta holds integers; going through total_seconds() (a float) would drift.
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _format(delta: timedelta) -> str:
    """``1h30m``, ``15s``, ``250ms``-style text for repr-free messages."""
    us = _micros(delta)
    out = []
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000)):
        if us >= size:
            out.append(f"{us // size}{unit}")
            us %= size
    if us:
        out.append(f"{us // 1_000_000}s" if us % 1_000_000 == 0 else f"{us / 1_000_000:g}s")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class IntervalSchedule:
    """Slots at ``anchor + k * interval`` for every integer *k*, in real (UTC) time.

    Every replica computes the same slots whenever it started, because the phase comes
    from the anchor, not from the moment the process began. There is no ``tz`` field:
    an interval is a span of real time, so DST never shifts it.
    """

    interval: timedelta
    """The positive spacing between slots, a whole number of microseconds."""
    anchor: datetime = _EPOCH
    """One slot (aware, normalised to UTC); the Unix epoch by default."""

    def __post_init__(self) -> None:
        if not isinstance(self.interval, timedelta) or self.interval <= timedelta(0):
            raise ScheduleError(
                f"every: interval must be a positive timedelta, got {self.interval!r}"
            )
        if not isinstance(self.anchor, datetime):
            raise ScheduleError(f"every: anchor must be an aware datetime, got {self.anchor!r}")
        object.__setattr__(self, "anchor", to_utc(self.anchor, field="every: anchor"))

    def next_after(self, after: datetime) -> datetime | None:
        """The first ``anchor + k * interval`` strictly after *after*; None past year 9999."""
        if after.tzinfo is not UTC:  # the scheduler passes UTC already: skip the conversion
            after = to_utc(after, field="next_after")
        # timedelta // timedelta and timedelta * int are exact integer maths on microseconds
        # (start plans every job through here: no int <-> timedelta round trips). Floor
        # division rounds toward -inf, so this is right for anchors in the future too.
        interval = self.interval
        try:
            return self.anchor + interval * ((after - self.anchor) // interval + 1)
        except OverflowError:
            return None

    def __str__(self) -> str:
        anchor = "" if self.anchor == _EPOCH else f" from {self.anchor.isoformat()}"
        return f"every {_format(self.interval)}{anchor}"


def _part(name: str, value: float | timedelta | None) -> timedelta:
    if value is None:
        return timedelta(0)
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ScheduleError(f"every: {name} must not be negative, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScheduleError(f"every: {name} must be a number or timedelta, got {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise ScheduleError(f"every: {name} must be a finite number, got {value!r}")
    if value < 0:
        raise ScheduleError(f"every: {name} must not be negative, got {value!r}")
    unit = {"days": 86_400, "hours": 3_600, "minutes": 60}.get(name, 1)
    try:
        return timedelta(seconds=value * unit)
    except OverflowError:
        raise ScheduleError(f"every: {name}={value!r} is too large") from None


def every(
    interval: float | timedelta | None = None,
    *,
    seconds: float = 0,
    minutes: float = 0,
    hours: float = 0,
    days: float = 0,
    anchor: datetime | None = None,
) -> IntervalSchedule:
    """A schedule firing every *interval*, at ``anchor + k * interval`` for integer *k*.

    The interval is the sum of *interval* (seconds or a timedelta) and the keyword parts:
    ``every(90)``, ``every(minutes=1, seconds=30)`` and ``every(timedelta(seconds=90))``
    are the same schedule. It is rounded to whole microseconds and must be positive.
    *anchor* (aware; default the Unix epoch) fixes the phase: ``every(hours=1)`` fires on
    the hour, ``every(hours=1, anchor=...:15 UTC)`` at quarter past. The anchor may lie in
    the future; slots before it exist too.

    Raises :class:`~cronlock.ScheduleError` naming the bad value for a zero, negative, NaN
    or infinite part or total, and for a naive anchor.
    A job's interval is at least 50 ms: ``add_job`` refuses a finer one (the schedule
    itself, pure arithmetic, takes any whole number of microseconds).
    """
    key: tuple[Any, ...]
    if type(anchor) is datetime and anchor.tzinfo is UTC:
        # Hashing an aware datetime costs ~3k instructions (it converts itself to UTC
        # first); its distance from the epoch (the same tzinfo: plain field maths) hashes
        # for a tenth of that, and names the same instant. The usual call, a number of
        # seconds and such an anchor, has a short key of its own.
        if not (seconds or minutes or hours or days):
            key = (type(interval), interval, anchor - _EPOCH)
        else:
            key = (type(interval), interval, seconds, minutes, hours, days, _UTC, anchor - _EPOCH)
    else:
        key = (type(interval), interval, seconds, minutes, hours, days, anchor)
    try:
        schedule = _recent.get(key)  # the same arguments again (a service's many alike jobs)
    except TypeError:  # an unhashable argument: the checks below name it
        return _every(interval, seconds, minutes, hours, days, anchor)
    if schedule is not None:
        return schedule
    step = timedelta(0)
    if (
        type(interval) in (int, float)
        and 0 < interval < 86_400_000_000  # type: ignore[operator]
        and not (seconds or minutes or hours or days)
        and (anchor is None or (type(anchor) is datetime and anchor.tzinfo is UTC))
    ):
        step = timedelta(seconds=interval)  # type: ignore[arg-type]
    if step > timedelta(0):  # a plain number of seconds: nothing else to check
        schedule = IntervalSchedule(step, _EPOCH if anchor is None else anchor)
    else:
        schedule = _every(interval, seconds, minutes, hours, days, anchor)
    if len(_recent) >= 256:
        _recent.clear()
    _recent[key] = schedule
    return schedule


_UTC = object()  # in a key of _recent: a UTC anchor given as its distance from the epoch
# Recent every() arguments and their schedule (schedules are immutable: shared), bounded.
_recent: dict[tuple[Any, ...], IntervalSchedule] = {}


def _every(
    interval: float | timedelta | None,
    seconds: float,
    minutes: float,
    hours: float,
    days: float,
    anchor: datetime | None,
) -> IntervalSchedule:
    total = timedelta(0)
    for name, value in (
        ("interval", interval),
        ("seconds", seconds),
        ("minutes", minutes),
        ("hours", hours),
        ("days", days),
    ):
        total += _part(name, value)
    if total <= timedelta(0):
        given = interval if interval is not None else f"{seconds=}, {minutes=}, {hours=}, {days=}"
        raise ScheduleError(
            f"every: the interval must be positive (at least 1 microsecond), got {given}"
        )
    if anchor is None:
        return IntervalSchedule(total)
    if not isinstance(anchor, datetime):
        raise ScheduleError(f"every: anchor must be an aware datetime, got {anchor!r}")
    return IntervalSchedule(total, to_utc(anchor, field="every: anchor"))
