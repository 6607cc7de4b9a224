"""An independent reference implementation of Debian/Vixie cron, for tests only.

It shares no code with cronlock or croniter. The parser follows Vixie cron's entry.c:
fields ``minute hour day-of-month month day-of-week``, each a comma list of ``*``,
``N``, ``N-M``, optionally ``/step``; month and weekday names; weekday 0 and 7 both
Sunday; a day field starting with ``*`` makes the two day fields AND, otherwise OR; a job
is *wildcard* when its minute or hour field starts with ``*``.

Debian has no ``L``, ``W``, ``#`` or ``?``; cronlock accepts them, and this parser gives
them the meaning Debian's rules give any value, computed its own way (by scanning the
month's dates, where cronlock uses arithmetic): each is one more member of its field's
union, and the star rule looks at the field's first character as always (``?`` counts as
``*``). ``L`` is the last day of the month, ``LW`` its last weekday (Mon-Fri), ``15W`` the
weekday of the month closest to the 15th (none if the month has no 15th), ``5#2`` the
second Friday, ``5L`` the last Friday.

The simulator follows Vixie cron's cron.c main loop: it wakes once per real (UTC) minute,
reads the local wall minute, and compares it with the wall minute it expected
("virtual time"):

* one minute later: run every job matching the wall minute;
* 2..5 minutes later (woke up late): run every job for each minute missed;
* 6 minutes .. 3 hours later (clock jumped forward, e.g. spring-forward): run wildcard
  jobs matching the current minute, and fixed-time jobs matching any skipped minute or
  the current one;
* up to 3 hours earlier (clock jumped back, fall-back): run wildcard jobs matching the
  current minute; fixed-time jobs wait until the wall clock passes the latest wall
  minute already seen;
* anything else: reset and run every job for the current minute.

A job that matches several minutes of one catch-up runs at that one real minute; cron
deduplicates queued jobs per wake-up and a slot is one instant, so it counts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DOW_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_BOUNDS = {"minute": (0, 59), "hour": (0, 23), "dom": (1, 31), "month": (1, 12), "dow": (0, 7)}
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True)
class Entry:
    """One parsed crontab line (the time part)."""

    minute: frozenset[int]
    hour: frozenset[int]
    dom: frozenset[int]
    month: frozenset[int]
    dow: frozenset[int]  # 0..6, Sunday = 0
    dom_star: bool
    dow_star: bool
    wildcard: bool  # MIN_STAR or HR_STAR
    dom_extras: frozenset[str] = frozenset()  # "l", "lw", "15w"
    dow_extras: frozenset[tuple[int, str]] = frozenset()  # (5, "#2"), (5, "l")

    def matches(self, wall: datetime) -> bool:
        """Whether the job runs in this local wall minute (cron's find_jobs test)."""
        return (
            wall.minute in self.minute
            and wall.hour in self.hour
            and wall.month in self.month
            and self.matches_day(wall.date())
        )

    def matches_day(self, day: date) -> bool:
        """The day part of find_jobs: the two day fields, ANDed or ORed."""
        cron_dow = (day.weekday() + 1) % 7
        dom_ok = day.day in self.dom or any(_dom_extra(x, day) for x in self.dom_extras)
        dow_ok = cron_dow in self.dow or any(
            weekday == cron_dow and _dow_extra(x, day) for weekday, x in self.dow_extras
        )
        return (dom_ok and dow_ok) if (self.dom_star or self.dow_star) else (dom_ok or dow_ok)


def _month_dates(day: date) -> tuple[date, ...]:
    return _dates_of(day.year, day.month)


@cache
def _dates_of(year: int, month: int) -> tuple[date, ...]:
    dates = [date(year, month, 1)]
    while (following := dates[-1] + timedelta(days=1)).month == month:
        dates.append(following)
    return tuple(dates)


def _dom_extra(extra: str, day: date) -> bool:
    dates = _month_dates(day)
    weekdays = [d for d in dates if d.weekday() < 5]
    if extra == "l":
        return day == dates[-1]
    if extra == "lw":
        return day == weekdays[-1]
    target = int(extra[:-1])  # "15w"
    if target > len(dates):
        return False
    return day == min(weekdays, key=lambda d: abs(d.day - target))


def _dow_extra(extra: str, day: date) -> bool:
    """*day* already has the element's weekday; is it the right occurrence in its month?"""
    same = [d for d in _month_dates(day) if d.weekday() == day.weekday()]
    if extra == "l":
        return day == same[-1]
    nth = int(extra[1:])  # "#2"
    return len(same) >= nth and day == same[nth - 1]


def _value(text: str, field: str) -> int:
    names = {"month": _MONTH_NAMES, "dow": _DOW_NAMES}.get(field)
    if names is not None and text.lower() in names:
        return names.index(text.lower()) + (1 if field == "month" else 0)
    if not text.isdigit():
        raise ValueError(f"bad {field} value {text!r}")
    low, high = _BOUNDS[field]
    number = int(text)
    if not low <= number <= high:
        raise ValueError(f"{field} value {number} out of range")
    return number


def _field(text: str, field: str) -> frozenset[int]:
    low, high = _BOUNDS[field]
    values: set[int] = set()
    for item in text.split(","):
        if _extra(item, field) is not None:
            continue
        rng, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError("bad step")
        if rng == "*":
            first, last = low, high
        elif "-" in rng:
            a, b = rng.split("-")
            first, last = _value(a, field), _value(b, field)
            if first > last:
                raise ValueError("backwards range")
        else:
            if step_text:
                raise ValueError("a step needs a range")
            first = last = _value(rng, field)
        values.update(range(first, last + 1, step))
    if field == "dow" and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


def _extra(item: str, field: str) -> str | tuple[int, str] | None:
    """An L/W/# list element, spelled for Entry; None for an ordinary one."""
    item = item.lower()
    if field == "dom":
        if item in ("l", "lw"):
            return item
        if item.endswith("w"):
            return f"{_value(item[:-1], 'dom')}w"
    if field == "dow":
        if "#" in item:
            weekday, nth = item.split("#")
            if not 1 <= int(nth) <= 5:
                raise ValueError("bad week number")
            return _value(weekday, "dow") % 7, f"#{nth}"
        if item.endswith("l") and len(item) > 1:
            return _value(item[:-1], "dow") % 7, "l"
    return None


def parse(expr: str) -> Entry:
    """Parse a 5-field expression (or an @alias) the way Vixie cron's entry.c does."""
    expr = _ALIASES.get(expr.strip().lower(), expr)
    minute, hour, dom, month, dow = expr.replace("?", "*").split()
    dom_extras = [_extra(item, "dom") for item in dom.split(",")]
    dow_extras = [_extra(item, "dow") for item in dow.split(",")]
    return Entry(
        minute=_field(minute, "minute"),
        hour=_field(hour, "hour"),
        dom=_field(dom, "dom"),
        month=_field(month, "month"),
        dow=_field(dow, "dow"),
        dom_star=dom.startswith("*"),
        dow_star=dow.startswith("*"),
        wildcard=minute.startswith("*") or hour.startswith("*"),
        dom_extras=frozenset(x for x in dom_extras if isinstance(x, str)),
        dow_extras=frozenset(x for x in dow_extras if isinstance(x, tuple)),
    )


def fire_days(expr: str, start: date, end: date) -> list[date]:
    """The dates in [start, end) on which the job runs at least once."""
    entry = parse(expr)
    days = (start + timedelta(days=i) for i in range((end - start).days))
    return [d for d in days if d.month in entry.month and entry.matches_day(d)]


def _wall_minute(instant: datetime, tz: ZoneInfo) -> int:
    """cron's timeRunning: (time + gmtoff) / 60, local minutes since the epoch."""
    offset = instant.astimezone(tz).utcoffset()
    assert offset is not None
    return int((instant + offset).timestamp()) // 60


def _wall(minute_index: int) -> datetime:
    return datetime(1970, 1, 1) + timedelta(minutes=minute_index)


def simulate(expr: str, tz: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """The UTC minutes in [start, end) at which Debian's cron daemon runs the job.

    *start* and *end* are aware and on whole minutes; the daemon is taken to have been
    running (in step with the wall clock) for a while before *start*.
    """
    entry = parse(expr)
    fires: list[datetime] = []
    now = start.astimezone(UTC)
    virtual = _wall_minute(now - timedelta(minutes=1), tz)
    while now < end:
        running = _wall_minute(now, tz)
        diff = running - virtual
        runs = False

        def due(minute_index: int, *, wild: bool, fixed: bool) -> bool:
            if not entry.matches(_wall(minute_index)):
                return False
            return wild if entry.wildcard else fixed

        if diff == 1:
            virtual = running
            runs = due(running, wild=True, fixed=True)
        elif 1 < diff <= 5:
            missed = range(virtual + 1, running + 1)
            runs = any(due(m, wild=True, fixed=True) for m in missed)
            virtual = running
        elif 5 < diff <= 180:
            runs = due(running, wild=True, fixed=False) or any(
                due(m, wild=False, fixed=True) for m in range(virtual + 1, running + 1)
            )
            virtual = running
        elif -180 <= diff <= 0:
            # virtual time stays ahead: fixed-time jobs wait until the wall clock passes it
            runs = due(running, wild=True, fixed=False)
        else:
            virtual = running
            runs = due(running, wild=True, fixed=True)
        if runs:
            fires.append(now)
        now += timedelta(minutes=1)
    return fires


def transitions(tz: ZoneInfo, year: int) -> list[datetime]:
    """The UTC instants (on whole minutes) at which *tz* changes its offset in *year*."""
    out: list[datetime] = []
    day = datetime(year, 1, 1, tzinfo=UTC)
    previous = day.astimezone(tz).utcoffset()
    while day.year == year:
        nxt = day + timedelta(hours=1)
        if nxt.astimezone(tz).utcoffset() != previous:
            lo, hi = day, nxt  # bisect to the minute
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                mid = mid.replace(second=0, microsecond=0)
                if mid.astimezone(tz).utcoffset() == previous:
                    lo = mid
                else:
                    hi = mid
            out.append(hi)
            previous = nxt.astimezone(tz).utcoffset()
        day = nxt
    return out


def local_date(instant: datetime, tz: ZoneInfo) -> date:
    """The local calendar date of an instant."""
    return instant.astimezone(tz).date()
