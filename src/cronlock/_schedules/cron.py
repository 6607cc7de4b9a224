"""Cron-expression schedules with Debian/Vixie cron semantics.

croniter generates naive wall-clock candidates; :mod:`cronlock._schedules.tz` maps them to UTC
under Debian's DST rules. croniter 7 reads some fields differently from Debian cron, so
every expression is parsed and validated here first and handed to croniter in a
canonical form (explicit value lists) whose meaning the two agree on:

* ``5-5`` / ``7-7`` / ``JAN-JAN``: croniter expands an equal range to the *whole* field;
  Debian means the one value. We pass the value.
* ``22-2`` / ``FRI-MON``: croniter wraps reversed ranges; Debian does not. Rejected.
* ``5/15``: croniter reads ``5-59/15``; Debian reads ``5`` and silently drops ``/15``.
  Rejected as ambiguous.
* ``*/2`` in day-of-month with a weekday: croniter ORs the two day fields unless they are
  exactly ``*``; Debian ANDs them when either *starts* with ``*``.
* ``R`` (random) and ``H`` (hashed) values: every replica must compute the same slots,
  and Debian has neither. Rejected.
* ``L``, ``W`` and ``#``: Debian's rule makes each field a union and ORs two restricted
  day fields, but croniter fires ``0 0 1,15 * 1#1`` on first Mondays only, finds no date
  for ``0 0 15 * fri#2``, keeps only the third Saturdays of ``*,sat#3`` and refuses
  ``5,6#3``.

So the day fields never reach croniter: :mod:`cronlock._schedules.cron_days` picks the dates, and
croniter only walks the time of day inside them (its template is ``* * *`` from the day
of month on).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from .._errors import ScheduleError
from .cron_days import DayFields, DayMatcher
from .cron_days import FieldError as _FieldError
from .tz import TimeZone, first_instant_after, resolve_tz

if TYPE_CHECKING:
    from croniter import croniter

__all__ = ("CronSchedule", "cron")

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Spelled out: calendar.month_abbr follows the process locale, cron names do not.
_MONTH_NAMES = (
    "", "January", "February", "March", "April", "May", "June", "July", "August",
    "September", "October", "November", "December",
)  # fmt: skip
_MONTHS = {name[:3].lower(): i for i, name in enumerate(_MONTH_NAMES) if name}
_WEEKDAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February: leap years
_SECOND_DELTA = timedelta(seconds=1)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int]


_SECOND = _Field("second", 0, 59, {})
_MINUTE = _Field("minute", 0, 59, {})
_HOUR = _Field("hour", 0, 23, {})
_DOM = _Field("day-of-month", 1, 31, {})
_MONTH = _Field("month", 1, 12, _MONTHS)
_DOW = _Field("day-of-week", 0, 7, _WEEKDAYS)  # Debian: 0 and 7 are both Sunday

_VALUE = r"[0-9]+|[a-z]{3}"
_RANGE_RE = re.compile(rf"^(?P<a>{_VALUE})(?:-(?P<b>{_VALUE}))?(?:/(?P<step>[0-9]+))?$")
_STAR_RE = re.compile(r"^\*(?:/(?P<step>[0-9]+))?$")


@dataclass(frozen=True)
class _Compiled:
    """What parsing one expression yields; cached per (expr, seconds)."""

    template: croniter[datetime]
    """Walks the time of day only: ``* * *`` from the day-of-month field on."""
    days: DayMatcher
    last_time: time
    """The day's last wall time: no call to croniter looks past it into the next day."""
    fixed_time: bool


def _number(token: str, spec: _Field) -> int:
    value = int(token) if token.isdigit() else spec.names.get(token)
    if value is None:
        raise _FieldError(f"{token!r} is not a number or a {spec.name} name")
    if not spec.low <= value <= spec.high:
        raise _FieldError(f"{value} is out of range {spec.low}-{spec.high}")
    return value


def _element(element: str, spec: _Field, days: DayFields) -> set[int]:
    """The values of one comma-separated element (an L/W/# one is recorded in *days*)."""
    if star := _STAR_RE.match(element):
        a, b, step = spec.low, spec.high, star["step"]
        if spec is _DOW:
            b = 6  # '*' covers each day once; 7 would only alias Sunday again
    elif m := _RANGE_RE.match(element):
        a = _number(m["a"], spec)
        b = _number(m["b"], spec) if m["b"] else a
        step = m["step"]
        if step is not None and m["b"] is None:
            raise _FieldError(
                f"a step needs a range or '*' (write '{m['a']}-{spec.high}/{step}'); "
                f"Debian cron reads it as {m['a']!r}, croniter as a range"
            )
        if a > b:
            raise _FieldError(
                "the range runs backwards; Debian cron does not wrap ranges, split it into a list"
            )
    else:
        _special(element, spec, days)
        return set()
    if step is not None and int(step) == 0:
        raise _FieldError("step 0 is not allowed")
    return set(range(a, b + 1, int(step or 1)))


def _special(element: str, spec: _Field, days: DayFields) -> None:
    """croniter's extensions that Debian lacks: L, W (day of month), # and L (weekday)."""

    def number(token: str) -> int:
        return _number(token, spec)

    if spec is _DOM and days.add_dom_extension(element, number):
        return
    if spec is _DOW and days.add_dow_extension(element, number):
        return
    if element[:1] in ("h", "r") and spec.names.get(element) is None:
        raise _FieldError(
            "hashed (H) and random (R) values are not supported; "
            "every replica must compute the same slots"
        )
    raise _FieldError(f"not a valid {spec.name} value")


def _values(text: str, spec: _Field, days: DayFields) -> set[int]:
    """The plain values of one field: the union of its elements (L/W/# go to *days*)."""
    if text == "?" and spec in (_DOM, _DOW):
        text = "*"  # Quartz's '?' ("no specific value") is '*' for cron's purposes.
    if "?" in text:
        raise _FieldError("'?' must stand alone, and only in the day fields")
    values: set[int] = set()
    elements = text.split(",")
    for element in elements:
        if not element:
            raise _FieldError("empty list element")
        try:
            values |= _element(element, spec, days)
        except _FieldError as exc:
            if len(elements) == 1:
                raise
            raise _FieldError(f"{element!r}: {exc}") from None
    return {v % 7 for v in values} if spec is _DOW else values


def _never_fires(days: set[int], months: set[int]) -> str | None:
    """Why a day-of-month x month combination can never occur, or None if it can."""
    if any(d <= _MAX_DAYS[m] for d in days for m in months):
        return None
    plural = len(days) > 1
    day_text = ("days " if plural else "day ") + ", ".join(map(str, sorted(days)))
    month_text = ", ".join(_MONTH_NAMES[m] for m in sorted(months))
    return f"{day_text} of {month_text} {'do' if plural else 'does'} not exist"


@lru_cache(maxsize=512)
def _compile(expr: str, seconds: bool) -> _Compiled:
    """Parse and validate once; the croniter template is copied, never re-parsed."""
    text = expr.strip().lower()
    if text.startswith("@"):
        if text == "@reboot":
            raise ScheduleError(
                f"cron {expr!r}: @reboot is not supported; use once() to run when the "
                "scheduler starts"
            )
        if text not in _ALIASES:
            raise ScheduleError(f"cron {expr!r}: unknown alias; use one of {', '.join(_ALIASES)}")
        text = ("0 " if seconds else "") + _ALIASES[text]
    parts = re.split(r"[ \t]+", text) if text else []
    # The original spelling, for error messages (parsing is case-insensitive).
    shown = parts if expr.lstrip().startswith("@") else re.split(r"[ \t]+", expr.strip())
    specs = [_MINUTE, _HOUR, _DOM, _MONTH, _DOW]
    if seconds:
        specs.insert(0, _SECOND)
    if len(parts) != len(specs):
        layout = " ".join(s.name for s in specs)
        hint = "" if seconds else "; pass seconds=True for a leading seconds field"
        raise ScheduleError(
            f"cron {expr!r}: expected {len(specs)} fields ({layout}), got {len(parts)}{hint}"
        )
    values: dict[str, set[int]] = {}
    days = DayFields()
    for part, spec, original in zip(parts, specs, shown, strict=True):
        try:
            values[spec.name] = _values(part, spec, days)
        except _FieldError as exc:
            raise ScheduleError(f"cron {expr!r}: {spec.name} field {original!r}: {exc}") from None
    fields = dict(zip((s.name for s in specs), parts, strict=True))
    originals = dict(zip((s.name for s in specs), shown, strict=True))
    days.dom, days.dow, months = values["day-of-month"], values["day-of-week"], values["month"]
    if missing := days.missing_nearest(months):
        day, lacking = missing
        dom = originals["day-of-month"]
        where = f"{dom!r}" if dom.lower() in (f"{day}w", f"w{day}") else f"{dom!r}: {day}W"
        names = ", ".join(_MONTH_NAMES[m] for m in lacking)
        if day == 29:
            names += " in common years"
        raise ScheduleError(
            f"cron {expr!r}: day-of-month field {where}: {names} "
            f"{'has' if len(lacking) == 1 else 'have'} no day {day}, so no weekday nearest "
            "to it, and crons disagree on what to do then (croniter takes the month's last "
            "weekday); restrict the month field, or use LW"
        )
    # Debian's rule: a day field that starts with '*' (or Quartz's '?') makes the two day
    # fields AND; otherwise a day matches if either field matches.
    dom_star = fields["day-of-month"][0] in "*?"
    dow_star = fields["day-of-week"][0] in "*?"
    matcher = DayMatcher(days, months, both=dom_star or dow_star)
    if matcher.never_fires():
        reason = None if days.dom_extended or not dow_star else _never_fires(days.dom, months)
        if reason is None:
            dom, dow = originals["day-of-month"], originals["day-of-week"]
            month_text = ", ".join(_MONTH_NAMES[m] for m in sorted(months))
            in_months = "" if len(months) == 12 else f" in {month_text}"
            reason = (
                f"no day{in_months} matches both day-of-month {dom!r} and day-of-week "
                f"{dow!r}, which must both match as one of them starts with '*'"
                if dom_star or dow_star
                else f"no day{in_months} matches day-of-month {dom!r} or day-of-week {dow!r}"
            )
        raise ScheduleError(f"cron {expr!r}: never fires ({reason})")
    time_fields = [
        ",".join(map(str, sorted(values[s.name]))) for s in specs if s in (_SECOND, _MINUTE, _HOUR)
    ]
    # Imported here: croniter (and dateutil under it) costs ~20 ms, paid only by cron users.
    from croniter import CroniterError, croniter

    try:
        template: croniter[datetime] = croniter(
            " ".join([*time_fields, "*", "*", "*"]),
            datetime(2000, 1, 1),  # noqa: DTZ001 - wall time; explicit, or croniter reads the clock
            ret_type=datetime,
            second_at_beginning=seconds,
        )
    except (CroniterError, ValueError, KeyError) as exc:  # pragma: no cover - validated above
        raise ScheduleError(f"cron {expr!r}: {exc}") from None
    last = time(max(values["hour"]), max(values["minute"]), max(values.get("second", {0})))
    fixed = fields["minute"][0] != "*" and fields["hour"][0] != "*"
    return _Compiled(template, matcher, last, fixed)


@dataclass(frozen=True, slots=True, repr=False)
class CronSchedule:
    """Slots of a cron expression in a time zone, with Debian/Vixie cron semantics.

    Build it with :func:`cron`. ``tz=None`` means "the scheduler's zone" (UTC when the
    schedule is used on its own).
    """

    expr: str
    """The expression as given, e.g. ``"0 3 * * *"`` or ``"@daily"``."""
    seconds: bool = False
    """Whether the expression has a leading seconds field (6 fields)."""
    tz: ZoneInfo | None = None
    """The zone wall-clock fields are read in; ``None`` until bound to a scheduler."""
    _compiled: _Compiled = field(init=False, compare=False, hash=False)
    # The last two answers of next_after, each (after, slot): every *after* from one until
    # its slot has the same answer, found without a walk. Thousands of stored schedules
    # share a few schedule objects (decoded once each), so most of their first slots (and
    # the ones after those: two answers) are found here.
    _last: tuple[tuple[datetime, datetime | None], ...] = field(
        init=False, compare=False, hash=False, default=()
    )

    def __post_init__(self) -> None:
        if not isinstance(self.expr, str):
            raise ScheduleError(f"cron: expression must be a string, got {self.expr!r}")
        if not isinstance(self.seconds, bool):
            raise ScheduleError(f"cron {self.expr!r}: seconds must be a bool, got {self.seconds!r}")
        if self.tz is not None:  # a ZoneInfo too: ZoneInfo("EST") is a fixed offset
            object.__setattr__(self, "tz", resolve_tz(self.tz))
        object.__setattr__(self, "_compiled", _compile(self.expr, self.seconds))

    @property
    def fixed_time(self) -> bool:
        """True when neither the minute nor the hour field starts with ``*``.

        Debian's DST rule depends on it: a fixed-time job runs once when its wall time is
        skipped or repeated; a wildcard job keeps its real-time cadence.
        """
        return self._compiled.fixed_time

    def next_after(self, after: datetime) -> datetime | None:
        """The first slot strictly after the aware datetime *after*, as aware UTC."""
        if after.tzinfo is None or after.utcoffset() is None:
            raise ScheduleError(f"{self}: next_after({after!r}) needs an aware datetime")
        known = self._last
        for since, slot in known:
            if since <= after and (slot is None or after < slot):
                return slot  # no slot between that call's *after* and its answer
        zone = self.tz if self.tz is not None else resolve_tz(None)
        found = _first_after(self, after, zone)
        # One tuple, replaced whole: threads read either the old or the new.
        object.__setattr__(self, "_last", ((after, found), *known[:1]))
        return found

    def _walls_from(self, start: datetime) -> Iterator[datetime]:
        # A shallow copy shares the parsed expansion and costs ~1 µs; building a croniter
        # re-parses the expression. The copy keeps concurrent callers from sharing `cur`.
        it = copy.copy(self._compiled.template)
        # Walls are whole seconds, so "after start" equals "after start truncated";
        # dropping microseconds keeps croniter's float timestamps exact.
        start = start.replace(microsecond=0)
        last = self._compiled.last_time
        for day in self._compiled.days.dates_from(start.date()):
            if day == start.date():
                if start.time() >= last:
                    continue  # no wall left today
                it.set_current(start, force=True)
            else:
                it.set_current(datetime.combine(day, time()) - _SECOND_DELTA, force=True)
            # croniter walks the times of this one day; each call finds a wall on it.
            while True:
                wall = it.get_next(datetime)
                yield wall
                if wall.time() >= last:
                    break

    def __str__(self) -> str:
        zone = f" in {self.tz.key}" if self.tz is not None else ""
        kind = "6-field cron" if self.seconds else "cron"
        return f"{kind} {self.expr!r}{zone}"

    def __repr__(self) -> str:
        zone = repr(self.tz.key) if self.tz is not None else "None"
        return f"CronSchedule(expr={self.expr!r}, seconds={self.seconds}, tz={zone})"


_SPANS: dict[tuple[str, bool, ZoneInfo], list[tuple[datetime, datetime]]] = {}
"""Answers of :func:`_first_after` as spans, per expression and zone: ``(low, slot)`` says
that the first slot after any instant from *low* up to *slot* is *slot*."""
_SPANS_KEPT = 4  # spans per expression and zone (the latest found)
_SPANS_MAX = 4096  # expressions and zones at most (then forgotten, all at once)


def _first_after(schedule: CronSchedule, after: datetime, zone: ZoneInfo) -> datetime | None:
    """``schedule.next_after(after)`` in *zone*, remembered as spans (:data:`_SPANS`).

    Thousands of tenants' schedules are often one expression (a report at 08:00): a burst
    of them asks each for its next slot after the same instant, and each one's overdue
    verdict for the first slot after an instant of its own (when it was first seen, its
    last success), most often in the same span. The first slot after *after* is the
    smallest slot greater than it, so when ``(low, slot)`` is known, every instant in
    ``[low, slot)`` has it as answer too; equal schedules share spans, and threads may
    share them (each span is right on its own, whichever one a reader sees)."""
    key = (schedule.expr, schedule.seconds, zone)  # (what equal schedules share, hashed fast)
    spans = _SPANS.get(key)
    if spans is not None:
        for low, slot in spans:
            if low <= after < slot:
                return slot
    found = first_instant_after(after, zone, schedule._walls_from, fixed=schedule.fixed_time)
    if found is None:
        return None
    if spans is None:
        if len(_SPANS) >= _SPANS_MAX:
            _SPANS.clear()
        spans = _SPANS.setdefault(key, [])
    for i, (low, slot) in enumerate(spans):
        if slot == found:
            if after < low:
                spans[i] = (after, found)
            break
    else:
        spans.insert(0, (after, found))
        del spans[_SPANS_KEPT:]
    return found


def cron(expr: str, *, seconds: bool = False, tz: TimeZone | None = None) -> CronSchedule:
    """A schedule from a cron expression, read the way Debian's cron daemon reads it.

    Five fields ``minute hour day-of-month month day-of-week``; with ``seconds=True`` six,
    seconds first (as gocron and Quartz). Lists, ranges, steps (``1-10/3``, ``*/15``),
    month and weekday names (``JAN``, ``MON-FRI``, case-insensitive), weekday 0 or 7 for
    Sunday, and the aliases ``@yearly @annually @monthly @weekly @daily @midnight @hourly``.
    croniter's extensions are accepted too: ``L`` (last day of month), ``LW`` (its last
    weekday), ``15W`` (the weekday nearest the 15th, within the month), ``5#2`` (second
    Friday), ``5L`` (last Friday), and ``?`` for ``*`` in a day field.

    Day fields follow Debian: a field is the union of its list, extensions included, and if
    either day field starts with ``*`` (or is ``?``) a day must match both, otherwise
    either: ``0 0 1,15 * 1#1`` fires on the 1st, the 15th and the first Monday.

    DST follows Debian: a *fixed-time* job (minute and hour not starting with ``*``) runs
    once when its wall time is skipped (at the end of the gap) or repeated (first pass); a
    *wildcard* job skips nonexistent times and runs in both passes of a repeated hour.

    Raises :class:`~cronlock.ScheduleError` naming the expression and the bad part for a
    wrong field count, an invalid value, ``@reboot``, ``31W`` when a selected month has no
    31st (crons disagree there), or an expression that never fires (``0 0 31 2 *``).
    ``tz=None`` takes the scheduler's zone.
    """
    return CronSchedule(expr, seconds, None if tz is None else resolve_tz(tz))
