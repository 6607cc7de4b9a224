"""Calendar schedules: daily, weekly and monthly at wall-clock times in a zone."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from .._errors import ScheduleError
from .cron_days import month_length
from .tz import TimeZone, first_instant_after, resolve_tz

__all__ = ("CalendarSchedule", "daily", "monthly", "weekly")

Kind = Literal["daily", "weekly", "monthly"]
TimeOfDay = str | time
_TIME_RE = re.compile(r"^([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?$")
# Spelled out: calendar.day_name follows the process locale; these names must not.
_DAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAYS = {name: i for i, name in enumerate(_DAY_NAMES)} | {
    name[:3]: i for i, name in enumerate(_DAY_NAMES)
}
_EPOCH_DAY = date(1970, 1, 1)
_EPOCH_MONDAY = date(1970, 1, 5)  # the first Monday of 1970: week 0 of weekly(every=N)
_UNITS = {"daily": "days", "weekly": "weeks", "monthly": "months"}


@dataclass(frozen=True, slots=True)
class CalendarSchedule:
    """Wall-clock slots on chosen days, every *every* days, weeks or months.

    Build it with :func:`daily`, :func:`weekly` or :func:`monthly`. These are fixed-time
    schedules under Debian's DST rules: a time skipped by spring-forward fires once at
    the end of the gap; a time repeated on fall-back day fires once, on the first pass.
    """

    kind: Kind
    """``"daily"``, ``"weekly"`` or ``"monthly"``."""
    at: tuple[time, ...]
    """Naive times of day, sorted."""
    on: tuple[int, ...] = ()
    """Weekdays (0=Monday..6=Sunday) or month days (1..31, -1=last); empty for daily."""
    every: int = 1
    """Fire in every N-th day/week/month, counted from 1970 (see the factories)."""
    tz: ZoneInfo | None = None
    """The zone of the wall-clock times; ``None`` until bound to a scheduler (then UTC)."""

    def __post_init__(self) -> None:
        if self.tz is not None and not isinstance(self.tz, ZoneInfo):
            object.__setattr__(self, "tz", resolve_tz(self.tz, field=f"{self.kind}: tz"))

    def next_after(self, after: datetime) -> datetime | None:
        """The first slot strictly after the aware datetime *after*, as aware UTC."""
        if after.tzinfo is None or after.utcoffset() is None:
            raise ScheduleError(f"{self}: next_after({after!r}) needs an aware datetime")
        zone = self.tz if self.tz is not None else resolve_tz(None)
        return first_instant_after(after, zone, self._walls_from, fixed=True)

    def _walls_from(self, start: datetime) -> Iterator[datetime]:
        """Naive wall times strictly after *start*, in order (ends near year 9999)."""
        try:
            for day in self._days_from(start.date()):
                for t in self.at:
                    wall = datetime.combine(day, t)
                    if wall > start:
                        yield wall
        except OverflowError:
            return

    def _days_from(self, first: date) -> Iterator[date]:
        n = self.every
        if self.kind == "daily":
            # Skip straight to the first day whose index since 1970-01-01 is 0 mod N.
            day = first + timedelta(days=-(first - _EPOCH_DAY).days % n)
            while True:
                yield day
                day += timedelta(days=n)
        elif self.kind == "weekly":
            monday = first - timedelta(days=first.weekday())
            monday += timedelta(weeks=-((monday - _EPOCH_MONDAY).days // 7) % n)
            while True:
                for weekday in self.on:
                    day = monday + timedelta(days=weekday)
                    if day >= first:
                        yield day
                monday += timedelta(weeks=n)
        else:
            index = (first.year - 1970) * 12 + first.month - 1
            index += -index % n
            while True:
                year, month = 1970 + index // 12, index % 12 + 1
                if year > 9999:
                    return
                last = month_length(year, month)
                # A day the month lacks (31 in April, -30 in February) is skipped, as cron.
                days = {d if d > 0 else last + 1 + d for d in self.on}
                for d in sorted(days):
                    if 1 <= d <= last and date(year, month, d) >= first:
                        yield date(year, month, d)
                index += n

    def __str__(self) -> str:
        times = ",".join(t.isoformat("seconds" if t.second else "minutes") for t in self.at)
        if self.kind == "weekly":
            days = " on " + ",".join(_DAY_NAMES[d][:3] for d in self.on)
        elif self.kind == "monthly":
            days = " on day " + ",".join(map(str, self.on))
        else:
            days = ""
        step = f" every {self.every} {_UNITS[self.kind]}" if self.every != 1 else ""
        zone = f" in {self.tz.key}" if self.tz is not None else ""
        return f"{self.kind}{days} at {times}{step}{zone}"


def _listed(value: object) -> list[object]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        return [value]
    return list(value)


def _times(kind: str, at: TimeOfDay | Sequence[TimeOfDay]) -> tuple[time, ...]:
    values = _listed(at)
    if not values:
        raise ScheduleError(f"{kind}: at is empty; give at least one time of day")
    out: set[time] = set()
    for value in values:
        if isinstance(value, time):
            if value.tzinfo is not None:
                raise ScheduleError(
                    f"{kind}: at {value.isoformat()!r} has a tzinfo; pass a naive time and tz="
                )
            out.add(value.replace(fold=0))
            continue
        m = _TIME_RE.match(value) if isinstance(value, str) else None
        h, mi, s = (int(m[1]), int(m[2]), int(m[3] or 0)) if m else (99, 0, 0)
        if h > 23 or mi > 59 or s > 59:
            raise ScheduleError(f"{kind}: at {value!r} is not a time of day (HH:MM or HH:MM:SS)")
        out.add(time(h, mi, s))
    return tuple(sorted(out))


def _every(kind: str, every: int) -> int:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ScheduleError(f"{kind}: every must be a positive integer, got {every!r}")
    return every


def _zone(kind: str, tz: TimeZone | None) -> ZoneInfo | None:
    return None if tz is None else resolve_tz(tz, field=f"{kind}: tz")


def daily(
    at: TimeOfDay | Sequence[TimeOfDay] = "03:00",
    *,
    every: int = 1,
    tz: TimeZone | None = None,
) -> CalendarSchedule:
    """Fire every day (or every *every*-th day) at the wall-clock time(s) *at*.

    *at* is ``"HH:MM"``, ``"HH:MM:SS"``, a naive :class:`datetime.time`, or a list of them.
    ``every=N`` fires on the local dates whose day count since 1970-01-01 is a multiple of
    N, so every replica picks the same days. ``tz=None`` takes the scheduler's zone.
    """
    return CalendarSchedule(
        "daily", _times("daily", at), (), _every("daily", every), _zone("daily", tz)
    )


def weekly(
    on: str | int | Sequence[str | int] = "mon",
    at: TimeOfDay | Sequence[TimeOfDay] = "03:00",
    *,
    every: int = 1,
    tz: TimeZone | None = None,
) -> CalendarSchedule:
    """Fire on the weekday(s) *on* at the time(s) *at*, every week or every *every*-th.

    *on* takes names (``"mon"``, ``"Monday"``; case-insensitive) or integers with
    **0 = Monday .. 6 = Sunday** (Python's :meth:`date.weekday`, *not* cron's 0 = Sunday),
    one or a list. ``every=N`` fires in the ISO weeks whose count from the week of Monday
    1970-01-05 is a multiple of N. *at* and *tz* are as in :func:`daily`.
    """
    days: set[int] = set()
    values = _listed(on)
    if not values:
        raise ScheduleError("weekly: on is empty; give at least one weekday")
    for value in values:
        if isinstance(value, str) and value.strip().lower() in _WEEKDAYS:
            days.add(_WEEKDAYS[value.strip().lower()])
        elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 6:
            days.add(value)
        else:
            raise ScheduleError(
                f"weekly: on {value!r} is not a weekday (mon..sun, or 0=Monday..6=Sunday)"
            )
    return CalendarSchedule(
        "weekly",
        _times("weekly", at),
        tuple(sorted(days)),
        _every("weekly", every),
        _zone("weekly", tz),
    )


def monthly(
    on: int | Sequence[int] = 1,
    at: TimeOfDay | Sequence[TimeOfDay] = "03:00",
    *,
    every: int = 1,
    tz: TimeZone | None = None,
) -> CalendarSchedule:
    """Fire on day(s) *on* of the month at the time(s) *at*, every month or every N-th.

    *on* is 1..31, or negative to count from the end (-1 = last day, -2 = the day before).
    A day a month lacks is skipped in that month, as cron does: ``monthly(31)`` does not
    fire in April, and ``monthly(30)`` never in February; use -1 for "the last day".
    ``every=N`` fires in the months whose count since January 1970 is a multiple of N
    (``every=3``: January, April, July, October). *at* and *tz* are as in :func:`daily`.
    """
    days: set[int] = set()
    values = _listed(on)
    if not values:
        raise ScheduleError("monthly: on is empty; give at least one day of the month")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= abs(value) <= 31:
            raise ScheduleError(
                f"monthly: on {value!r} is not a day of the month "
                "(1..31, or -1 for the last day, -2 for the one before)"
            )
        days.add(value)
    return CalendarSchedule(
        "monthly",
        _times("monthly", at),
        tuple(sorted(days)),
        _every("monthly", every),
        _zone("monthly", tz),
    )
