"""What a stored schedule may be: the limits every writer (``FleetControl``, so the command
line and the dashboard too) holds a schedule to before storing it, and every replica holds
a row to again when it reads it (a row written by hand into the table gets no other check).

A stored schedule is data a tenant, an operator or anyone with write access to the table
may shape; each limit bounds what one row can cost every replica (memory, the time its
decode and its slots take on the event loop, ledger rows a day), so that one row harms
nothing but itself. A breach is a :class:`~cronlock.ScheduleError` naming the schedule,
the field and the value (shortened). The limits (documented in the stored-schedules guide):

- :data:`MAX_NAME`: characters of a schedule's name and of its task's name;
- :data:`MAX_JSON_BYTES`, :data:`MAX_JSON_DEPTH`: each JSON column (schedule, kwargs,
  options) as text, and how deep its arrays and objects nest;
- :data:`MAX_SLOTS_PER_DAY`: slots a schedule may produce in a day;
- :data:`MAX_OPTION_SECONDS`: a duration option (``timeout``, ``misfire_grace`` ...);
- :data:`MAX_RETRIES`: the ``retries`` option; :data:`MAX_EVERY`: a calendar
  schedule's ``every`` (days, weeks or months);
- :data:`FIRST_YEAR`, :data:`LAST_YEAR`: the years an instant of a schedule may name;
- :data:`DEFAULT_MIN_INTERVAL`: the shortest gap between two slots (configurable:
  ``FleetControl(min_interval=)``, ``Scheduler(stored_min_interval=)``);
- :data:`DEFAULT_MAX_SCHEDULES`: schedules a ledger holds (configurable:
  ``FleetControl(max_schedules=)``, checked when one is added).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from .._errors import ScheduleError
from .._names import MAX_NAME
from .._schedules.interval import IntervalSchedule
from .._schedules.once import OnceSchedule
from .._schedules.schedule import Schedule, shortest_gap

__all__ = (
    "DEFAULT_MAX_SCHEDULES",
    "DEFAULT_MIN_INTERVAL",
    "FIRST_YEAR",
    "LAST_YEAR",
    "MAX_EVERY",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NAME",
    "MAX_OPTION_SECONDS",
    "MAX_RETRIES",
    "MAX_SLOTS_PER_DAY",
    "check_count",
    "check_json_text",
    "check_json_value",
    "check_options",
    "check_rate",
    "check_task",
    "shortened",
    "shown",
    "slots_per_day",
)

MAX_JSON_BYTES = 64 * 1024
"""Bytes (UTF-8) of each JSON column of a stored schedule: its schedule, its kwargs and
its options. Each replica keeps them, and reads them again at every change."""
MAX_JSON_DEPTH = 32
"""How deep arrays and objects may nest in each JSON column (``{"a": [1]}`` is 2): deeper
data is no argument a task needs, and a thousand levels exhaust a decoder's recursion."""
MAX_SLOTS_PER_DAY = 86_400
"""Slots a stored schedule may produce in a day: one a second (a cron with seconds,
``* * * * * *``, is the most a cron can). Each is a claim, a start and a ledger row."""
MAX_OPTION_SECONDS = 10 * 366 * 86_400.0
"""The longest duration option (``timeout``, ``jitter``, ``misfire_grace``,
``alert_after``, ``retry_delay``) of a stored schedule, in seconds: about ten years. A
longer one overflows the date arithmetic of catch-up and the overdue verdict."""
MAX_RETRIES = 100
"""The most ``retries`` a stored schedule's slot may have."""
MAX_EVERY = 1_000
"""The largest ``every`` of a stored daily, weekly or monthly schedule (a thousand days,
weeks or months: one that fires less often is a mistake, or never fires)."""
FIRST_YEAR = 1970
"""The first year an instant of a stored schedule (an anchor, ``once``, ``start_at``,
``stop_at``) may name."""
LAST_YEAR = 9000
"""The last year an instant of a stored schedule may name: far from year 9999, past
which every slot and grace computation overflows."""
DEFAULT_MIN_INTERVAL = 1.0
"""The shortest gap in seconds between two slots of a stored schedule, by default."""
DEFAULT_MAX_SCHEDULES = 100_000
"""How many stored schedules a ledger holds at most, by default."""

_DAY = timedelta(days=1)
_MIDNIGHT = datetime(2000, 1, 1, tzinfo=UTC)
_DURATIONS = ("timeout", "jitter", "misfire_grace", "alert_after", "retry_delay")
_SHOWN = 60  # characters of a value a message repeats


def shown(value: object) -> str:
    """``repr(value)``, shortened to about 60 characters for a message."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def shortened(text: str) -> str:
    """*text* cut to :data:`MAX_NAME` characters (a task of an unreadable row, as shown)."""
    return text if len(text) <= MAX_NAME else text[: MAX_NAME - 3] + "..."


def check_task(name: str, task: object) -> str:
    """*task* if it can name a task of schedule *name*; else :class:`~cronlock.ScheduleError`."""
    if not isinstance(task, str) or not task:
        raise ScheduleError(
            f"schedule {name!r}: task must be a non-empty string, got {shown(task)}"
        )
    if len(task) > MAX_NAME:
        raise ScheduleError(
            f"schedule {name!r}: task is longer than {MAX_NAME} characters ({len(task)}): "
            f"{shown(task)}"
        )
    return task


def check_json_text(name: str, field: str, text: str) -> None:
    """Refuse JSON *text* of *field* of schedule *name* longer than :data:`MAX_JSON_BYTES`
    (checked before it is parsed: a replica never decodes a huge text)."""
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > MAX_JSON_BYTES else 0
    if size > MAX_JSON_BYTES:
        raise ScheduleError(
            f"schedule {name!r}: {field} is {size} bytes of JSON, more than the "
            f"{MAX_JSON_BYTES} a stored schedule may hold: {shown(text)}"
        )


_PLAIN = frozenset((str, int, float, bool, type(None)))


def check_json_value(name: str, field: str, value: object) -> None:
    """Refuse *field* of schedule *name* whose arrays and objects nest deeper than
    :data:`MAX_JSON_DEPTH`. Walked without recursion, so any depth is measured safely."""
    if type(value) is dict:  # the common case: an object of plain values, one level
        for child in value.values():
            if type(child) not in _PLAIN:
                break
        else:
            return
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > MAX_JSON_DEPTH:
            raise ScheduleError(
                f"schedule {name!r}: {field} nests deeper than {MAX_JSON_DEPTH} levels: "
                f"{shown(value)}"
            )
        stack.extend((child, depth + 1) for child in children)


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse a duration option of schedule *name* longer than :data:`MAX_OPTION_SECONDS`
    and an instant outside :data:`FIRST_YEAR`..:data:`LAST_YEAR` (the options as
    ``add_job`` takes them); and more than :data:`MAX_RETRIES` retries."""
    retries = options.get("retries")
    if type(retries) is int and retries > MAX_RETRIES:
        raise ScheduleError(
            f"schedule {name!r}: retries is more than the {MAX_RETRIES} a stored schedule may "
            f"have, got {shown(retries)}"
        )
    for field, value in options.items():
        if isinstance(value, datetime):
            _check_instant(name, field, value)
        elif isinstance(value, timedelta):
            _check_seconds(name, field, value.total_seconds(), value)
        elif field in _DURATIONS and isinstance(value, int | float) and type(value) is not bool:
            _check_seconds(name, field, float(value), value)


def _check_seconds(name: str, field: str, seconds: float, value: object) -> None:
    if math.isfinite(seconds) and seconds > MAX_OPTION_SECONDS:
        raise ScheduleError(
            f"schedule {name!r}: {field} is longer than {MAX_OPTION_SECONDS:.0f}s (about ten "
            f"years), got {shown(value)}"
        )


def _check_instant(name: str, field: str, value: datetime) -> None:
    if not FIRST_YEAR <= value.year <= LAST_YEAR:
        raise ScheduleError(
            f"schedule {name!r}: {field} {value.isoformat()} is outside the years "
            f"{FIRST_YEAR} to {LAST_YEAR} a stored schedule may name"
        )


def slots_per_day(schedule: Schedule) -> int:
    """The most slots *schedule* produces in a day (a cron: at most one a second)."""
    from .._schedules.calendar import CalendarSchedule

    if type(schedule) is IntervalSchedule:
        return math.ceil(_DAY / schedule.interval)
    if type(schedule) is OnceSchedule:
        instants, most, first = schedule.instants, 0, 0
        for last, instant in enumerate(instants):  # the most in any 24 hours
            while instant - instants[first] >= _DAY:
                first += 1
            most = max(most, last - first + 1)
        return most
    if type(schedule) is CalendarSchedule:
        return len(schedule.at)
    return MAX_SLOTS_PER_DAY  # a cron: a slot a second at most


def _shortest(schedule: Schedule) -> timedelta | None:
    """The shortest gap between two slots of *schedule*: exact for every, once and the
    calendar kinds (from their times of day), sampled for a cron."""
    from .._schedules.calendar import CalendarSchedule

    if type(schedule) is CalendarSchedule:
        day = [datetime.combine(_MIDNIGHT, t, tzinfo=UTC) for t in schedule.at]
        gaps = [b - a for a, b in itertools.pairwise(day)]
        if schedule.kind == "daily" and schedule.every == 1 and day:
            gaps.append(day[0] + _DAY - day[-1])  # the last of a day to the next day's first
        return min(gaps, default=None)
    return shortest_gap(schedule)


def check_rate(name: str, schedule: Schedule, min_interval: float) -> None:
    """Refuse schedule *name*'s *schedule* when two of its slots can be less than
    *min_interval* seconds apart, or it produces more than :data:`MAX_SLOTS_PER_DAY` slots a
    day; also when an instant it names is outside :data:`FIRST_YEAR`..:data:`LAST_YEAR`."""
    from .._schedules.calendar import CalendarSchedule

    if type(schedule) is IntervalSchedule:
        _check_instant(name, "anchor", schedule.anchor)
    elif type(schedule) is OnceSchedule:
        for instant in (schedule.instants[0], schedule.instants[-1]) if schedule.instants else ():
            _check_instant(name, "once", instant)
    elif type(schedule) is CalendarSchedule:
        if not schedule.at:
            raise ScheduleError(f"schedule {name!r}: {schedule.kind} names no time of day (at)")
        if schedule.every > MAX_EVERY:
            raise ScheduleError(
                f"schedule {name!r}: every is more than the {MAX_EVERY} a stored "
                f"{schedule.kind} schedule may have, got {shown(schedule.every)}"
            )
    gap = _shortest(schedule) if min_interval > 0 else None
    if gap is not None and gap.total_seconds() < min_interval:
        raise ScheduleError(
            f"schedule {name!r}: interval {gap.total_seconds():g}s ({schedule}) is shorter "
            f"than the {min_interval:g}s a stored schedule's slots must be apart (min_interval)"
        )
    per_day = slots_per_day(schedule)
    if per_day > MAX_SLOTS_PER_DAY:
        raise ScheduleError(
            f"schedule {name!r}: slots per day {per_day} ({schedule}) is more than the "
            f"{MAX_SLOTS_PER_DAY} a stored schedule may produce"
        )


def check_count(name: str, stored: int, max_schedules: int) -> None:
    """Refuse adding schedule *name* to a ledger that holds *stored* schedules already,
    *max_schedules* at most."""
    if stored >= max_schedules:
        raise ScheduleError(
            f"schedule {name!r}: the ledger holds {stored} stored schedules, the most it may "
            f"(max_schedules={max_schedules}); remove some, or raise max_schedules"
        )
