"""Stored schedules as JSON lines: what ``python -m cronlock schedules list --json`` prints
and ``schedules put FILE`` and ``schedules sync --prefix P FILE`` read, one schedule a line.

A line is an object: ``name``, ``task``, ``schedule`` (the stored form,
:func:`.json.schedule_to_json`'s: ``{"kind": "cron", "expr": "0 8 * * *", "seconds":
false, "tz": "Europe/Paris"}``, ``{"kind": "every", "micros": 3600000000, "anchor":
"2026-01-01T00:00:00+00:00"}``...), and optionally ``kwargs`` (an object) and ``options``
(an object of job options as stored: seconds as numbers, instants as ISO 8601 text with
an offset, tags as a list). Blank lines are skipped. What list prints, put reads back to
the same schedules.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from .._errors import ScheduleError
from .json import options_from_json, options_to_json, schedule_from_json, schedule_to_json
from .schedule import StoredSchedule

__all__ = ("FIELDS", "read_lines", "schedule_line")

FIELDS = ("name", "task", "schedule", "kwargs", "options")
"""The fields of a line, in the order :func:`schedule_line` writes them."""
_REQUIRED = ("name", "task", "schedule")
# What a hostile line can make the readers raise: bad values, and numbers or nesting past
# what Python holds.
_UNREADABLE = (KeyError, TypeError, ValueError, OverflowError, RecursionError)


def schedule_line(stored: StoredSchedule) -> str:
    """*stored* as one JSON line (no newline), the fields of :data:`FIELDS`."""
    data = {
        "name": stored.name,
        "task": stored.task,
        "schedule": schedule_to_json(stored.schedule, owner=stored.name),
        "kwargs": dict(stored.kwargs),
        "options": options_to_json(stored.options, owner=stored.name),
    }
    return json.dumps(data, ensure_ascii=False, allow_nan=False)


def read_lines(lines: Iterable[str], *, source: str) -> list[StoredSchedule]:
    """The schedules of *lines* (a file's, named *source* in messages), in order. Raises
    :class:`~cronlock.ScheduleError` for the first line that is not one, naming *source*,
    the line's number, the schedule (when its name was read) and the field. The schedules
    themselves are checked by the verb they are given to (``put_schedules``), as
    ``add_schedule`` checks one."""
    found: list[StoredSchedule] = []
    for number, text in enumerate(lines, start=1):
        if text.strip():
            found.append(_read_line(text, f"{source} line {number}"))
    return found


def _read_line(text: str, where: str) -> StoredSchedule:
    try:
        data = json.loads(text)
    except _UNREADABLE as exc:
        raise ScheduleError(f"{where}: not JSON ({_why(exc)})") from None
    if not isinstance(data, dict):
        raise ScheduleError(f"{where}: expected a JSON object, got {type(data).__name__}")
    name = data.get("name")
    if isinstance(name, str):
        where = f"{where}: schedule {name!r}"
    missing = [field for field in _REQUIRED if field not in data]
    unknown = sorted(set(data) - set(FIELDS))
    if missing or unknown:
        wrong = [f"missing {', '.join(missing)}"] if missing else []
        wrong += [f"unknown field(s) {', '.join(unknown)}"] if unknown else []
        raise ScheduleError(f"{where}: {'; '.join(wrong)} (a line has {', '.join(FIELDS)})")
    if not isinstance(name, str) or not isinstance(data["task"], str):
        raise ScheduleError(f"{where}: name and task must be strings")
    kwargs, options = data.get("kwargs", {}), data.get("options", {})
    for field, value in (("schedule", data["schedule"]), ("kwargs", kwargs), ("options", options)):
        if not isinstance(value, dict):
            raise ScheduleError(f"{where}: {field} must be an object, got {value!r:.80}")
    try:
        schedule = schedule_from_json(data["schedule"])
    except _UNREADABLE as exc:
        raise ScheduleError(f"{where}: schedule: {_why(exc)}") from None
    try:
        known = options_from_json(options)
    except _UNREADABLE as exc:
        raise ScheduleError(f"{where}: options: {_why(exc)}") from None
    # An option this cronlock does not store is passed on, for put's message to name.
    given = {key: value for key, value in options.items() if key not in known} | known
    return StoredSchedule(name, data["task"], schedule, kwargs, given)


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}" if exc.args else "a field is missing"
    if isinstance(exc, RecursionError):
        return "nested too deep"
    return str(exc) or type(exc).__name__
