"""A job's schedule note in words, its zone, and its next few slots.

Replicas note each job's schedule as ``str(schedule)`` (``cron '0 3 * * *' in
Europe/Berlin``, ``every 5m``, ``daily at 03:00 in UTC``). The dashboard reads that text
back: a cron expression is said in words and its next slots are computed with cronlock's
own cron maths (the same slots the replicas compute); an interval's next slots follow from
the noted next slot. Text it does not recognise is shown as it is.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from .._errors import CronlockError
from .._schedules.cron import cron

__all__ = ("Described", "describe")

_CRON = re.compile(r"^(?P<six>6-field )?cron (?P<expr>'.*'|\".*\")(?: in (?P<zone>\S+))?$")
_EVERY = re.compile(r"^every (?P<span>(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:[\d.]+s)?)(?: from .*)?$")
_ZONE = re.compile(r" in (?P<zone>[A-Za-z_]+(?:/[A-Za-z0-9_+-]+)*)$")
_SPAN = re.compile(r"(?P<n>[\d.]+)(?P<unit>[dhms])")
_UNIT_SECONDS = {"d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0}
_DOW = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_NAMED_DOW = {name[:3].lower(): str(i) for i, name in enumerate(_DOW[:7])}
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True, slots=True)
class Described:
    """A schedule note read back: words for people, its zone, its next slots."""

    words: str
    zone: str
    """The IANA zone its wall-clock times are in (``UTC`` when the note names none)."""
    upcoming: tuple[datetime, ...]
    """The next slots from the noted one on (at most the number asked; may be empty)."""


def describe(
    note: str | None, next_run: datetime | None, count: int = 3, now: datetime | None = None
) -> Described:
    """Read a schedule note (``None``: no replica noted one) and the noted next slot.

    With *now*, the upcoming slots are those after it (a noted slot already past, because
    the replicas stopped or note only every few seconds, is stepped over).

    Never raises: a note it cannot follow (``every 1.2.3s``), or next slots past what a
    datetime holds (``every 1000000d``), leave the note as it is and no upcoming slots
    beyond the noted one.
    """
    try:
        return _describe(note, next_run, count, now)
    except (ValueError, ArithmeticError, CronlockError):  # OverflowError among them
        words = note or "unknown (no replica noted a schedule)"
        zone_match = _ZONE.search(words)
        return Described(words, zone_match["zone"] if zone_match else "UTC", _first(next_run))


def _describe(
    note: str | None, next_run: datetime | None, count: int, now: datetime | None
) -> Described:
    if not note:
        return Described("unknown (no replica noted a schedule)", "-", _first(next_run))
    found = _CRON.match(note)
    if found:
        return _cron(found, next_run, count, now)
    zone_match = _ZONE.search(note)
    zone = zone_match["zone"] if zone_match else "UTC"
    every = _EVERY.match(note)
    if every and next_run is not None:
        step = sum(float(m["n"]) * _UNIT_SECONDS[m["unit"]] for m in _SPAN.finditer(every["span"]))
        if step > 0:
            first = next_run
            if now is not None and first <= now:
                first += timedelta(seconds=step * ((now - first).total_seconds() // step + 1))
            upcoming = tuple(first + timedelta(seconds=step * k) for k in range(count))
            return Described(note, zone, upcoming)
    return Described(note, zone, _first(next_run))


def _first(next_run: datetime | None) -> tuple[datetime, ...]:
    return () if next_run is None else (next_run,)


def _cron(
    found: re.Match[str], next_run: datetime | None, count: int, now: datetime | None
) -> Described:
    try:
        expr = ast.literal_eval(found["expr"])
    except (ValueError, SyntaxError):
        return Described(found.string, found["zone"] or "UTC", _first(next_run))
    zone = found["zone"] or "UTC"
    six = bool(found["six"])
    words = _cron_words(str(expr), six)
    if next_run is None:
        return Described(words, zone, ())
    try:
        schedule = cron(str(expr), seconds=six, tz=zone)
    except CronlockError:
        return Described(words, zone, _first(next_run))
    first = next_run
    if now is not None and first <= now:
        first = schedule.next_after(now) or next_run
    slots = [first]
    while len(slots) < count:
        following = schedule.next_after(slots[-1])
        if following is None:
            break
        slots.append(following)
    return Described(words, zone, tuple(slots))


def _cron_words(expr: str, six: bool) -> str:
    """The common shapes of cron expressions in words; ``cron <expr>`` for the rest."""
    fields = _MACROS.get(expr.strip().lower(), expr).split()
    if six or len(fields) != 5:
        return f"cron {expr}"
    minute, hour, dom, month, dow = fields
    dow = ",".join(_NAMED_DOW.get(d.lower(), d) for d in dow.split(","))
    if (dom, month) != ("*", "*") and dow != "*":
        return f"cron {expr}"
    if minute == "*" and hour == "*":
        when = "every minute"
    elif (step := _step(minute)) and hour == "*":
        when = f"every {step} minutes"
    elif minute.isdigit() and hour == "*":
        when = f"every hour at minute {int(minute)}"
    elif minute.isdigit() and (step := _step(hour)):
        when = f"every {step} hours at minute {int(minute)}"
    elif minute.isdigit() and all(h.isdigit() for h in hour.split(",")):
        when = "at " + ", ".join(f"{int(h):02d}:{int(minute):02d}" for h in hour.split(","))
    else:
        return f"cron {expr}"
    days = _days(dom, month, dow)
    if days is None:
        return f"cron {expr}"
    if not days and when.startswith("at "):
        days = " every day"
    return f"{when}{days}"


def _step(field: str) -> int | None:
    if field.startswith("*/") and field[2:].isdigit() and int(field[2:]) > 0:
        return int(field[2:])
    return None


def _days(dom: str, month: str, dow: str) -> str | None:
    if (dom, month, dow) == ("*", "*", "*"):
        return ""
    if (dom, month) == ("*", "*"):
        if dow == "1-5":
            return " on weekdays"
        if all(d.isdigit() and int(d) <= 7 for d in dow.split(",")):
            return " on " + ", ".join(_DOW[int(d)] for d in dow.split(","))
        return None
    if dom.isdigit() and month == "*":
        return f" on day {int(dom)} of each month"
    if dom.isdigit() and month.isdigit() and 1 <= int(month) <= 12:
        return f" on {_MONTHS[int(month) - 1]} {int(dom)}"
    return None
