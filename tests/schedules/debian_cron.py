"""An independent reference implementation of Debian/Vixie cron, for tests only.

It shares no code with cronlock or croniter. The parser follows Vixie cron's entry.c:
fields ``minute hour day-of-month month day-of-week``, each a comma list of ``*``,
``N``, ``N-M``, optionally ``/step``; month and weekday names; weekday 0 and 7 both
Sunday; a day field starting with ``*`` makes the two day fields AND, otherwise OR; a job
is *wildcard* when its minute or hour field starts with ``*``.

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

    def matches(self, wall: datetime) -> bool:
        """Whether the job runs in this local wall minute (cron's find_jobs test)."""
        cron_dow = (wall.weekday() + 1) % 7
        dom_ok = wall.day in self.dom
        dow_ok = cron_dow in self.dow
        days_ok = (dom_ok and dow_ok) if (self.dom_star or self.dow_star) else (dom_ok or dow_ok)
        return (
            wall.minute in self.minute
            and wall.hour in self.hour
            and wall.month in self.month
            and days_ok
        )


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


def parse(expr: str) -> Entry:
    """Parse a 5-field expression (or an @alias) the way Vixie cron's entry.c does."""
    expr = _ALIASES.get(expr.strip().lower(), expr)
    minute, hour, dom, month, dow = expr.split()
    return Entry(
        minute=_field(minute, "minute"),
        hour=_field(hour, "hour"),
        dom=_field(dom, "dom"),
        month=_field(month, "month"),
        dow=_field(dow, "dow"),
        dom_star=dom.startswith("*"),
        dow_star=dow.startswith("*"),
        wildcard=minute.startswith("*") or hour.startswith("*"),
    )


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
