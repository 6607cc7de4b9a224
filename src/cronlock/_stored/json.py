"""A stored schedule's JSON form: every schedule kind code can use, read back to the
same slots, and the job options stored with it; and a schedule as an operator types it
(:func:`schedule_from_text`: the command line's and the dashboard's one parser).

A schedule without a zone is stored in UTC: replicas may run with different default
zones, and a stored schedule must name the same slots on each. ``once()`` with no instant
("at scheduler start") is no stored schedule: it would run once per replica start.
The cron and calendar modules are imported only when such a schedule is converted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, time, timedelta
from typing import Any

from .._core.settings import OPTION_NAMES, JobSettings, check_options, grace, slot_after
from .._durations import to_seconds
from .._errors import ScheduleError
from .._schedules.interval import IntervalSchedule
from .._schedules.once import OnceSchedule
from .._schedules.schedule import Schedule
from .._schedules.tz import TimeZone

__all__ = (
    "STORED_OPTIONS",
    "check_stored",
    "first_slot",
    "kwargs_read_back",
    "kwargs_to_json",
    "options_from_json",
    "options_to_json",
    "overdue_grace",
    "schedule_from_json",
    "schedule_from_text",
    "schedule_to_json",
)

STORED_OPTIONS = OPTION_NAMES - {"name", "args", "kwargs", "locker", "distributed", "max_runs"}
"""The job options a stored schedule may carry. Left out: what names the job or its
arguments (the schedule's own fields), a locker (an object, not data), ``distributed``
(a stored schedule exists to run once in the fleet) and ``max_runs`` (counted per replica)."""
_SECONDS = ("timeout", "jitter", "misfire_grace", "alert_after", "retry_delay")
_INSTANTS = ("start_at", "stop_at")


def _zone(tz: Any) -> str:
    return "UTC" if tz is None else str(tz.key)


def schedule_to_json(schedule: Schedule, *, owner: str) -> dict[str, Any]:
    """*schedule* as plain data; raises :class:`~cronlock.ScheduleError` naming *owner* for a
    kind that cannot be stored."""
    from .._schedules.calendar import CalendarSchedule
    from .._schedules.cron import CronSchedule

    if isinstance(schedule, CronSchedule):
        return {
            "kind": "cron",
            "expr": schedule.expr,
            "seconds": schedule.seconds,
            "tz": _zone(schedule.tz),
        }
    if isinstance(schedule, IntervalSchedule):
        micros = schedule.interval // timedelta(microseconds=1)
        return {"kind": "every", "micros": micros, "anchor": schedule.anchor.isoformat()}
    if isinstance(schedule, CalendarSchedule):
        return {
            "kind": schedule.kind,
            "at": [t.isoformat() for t in schedule.at],
            "on": list(schedule.on),
            "every": schedule.every,
            "tz": _zone(schedule.tz),
        }
    if isinstance(schedule, OnceSchedule) and not schedule.at_start:
        return {"kind": "once", "at": [i.isoformat() for i in schedule.instants]}
    raise ScheduleError(
        f"schedule {owner!r}: {schedule} cannot be stored (cron, every, daily, weekly, "
        "monthly and once at given instants can)"
    )


def schedule_from_json(data: Mapping[str, Any]) -> Schedule:
    """The schedule *data* describes (:func:`schedule_to_json`'s output); raises
    :class:`~cronlock.ScheduleError` (or ``KeyError``, ``TypeError``, ``ValueError``) for
    data it never wrote."""
    kind = data["kind"]
    if kind == "cron":
        from .._schedules.cron import cron

        return cron(data["expr"], seconds=bool(data["seconds"]), tz=data["tz"])
    if kind == "every":
        micros = data["micros"]
        if type(micros) is not int:
            raise ScheduleError(f"stored every: micros must be an integer, got {micros!r}")
        anchor = datetime.fromisoformat(data["anchor"])
        return IntervalSchedule(timedelta(microseconds=micros), anchor)
    if kind in ("daily", "weekly", "monthly"):
        from .._schedules.calendar import CalendarSchedule

        at = tuple(time.fromisoformat(t) for t in data["at"])
        on = tuple(int(day) for day in data["on"])
        every = data["every"]
        if type(every) is not int or every < 1:
            raise ScheduleError(f"stored {kind}: every must be a positive integer, got {every!r}")
        return CalendarSchedule(kind, at, on, every, data["tz"])
    if kind == "once":
        return OnceSchedule(tuple(datetime.fromisoformat(i) for i in data["at"]))
    raise ScheduleError(f"stored schedule: unknown kind {kind!r}")


def schedule_from_text(
    *,
    cron: str | None = None,
    seconds: bool = False,
    tz: TimeZone | None = None,
    every: str | float | None = None,
    anchor: str | None = None,
    at: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Schedule | None:
    """The schedule an operator typed; ``None`` when none is given.

    One of: a *cron* expression (*seconds*: with a leading seconds field) in zone *tz*
    (not given: none, which an update of a stored schedule reads as "keep its zone" and a
    new one as UTC); an interval of *every* seconds, *anchor*
    one of its slots (an ISO 8601 instant); or once at each of the ISO 8601 instants *at*.
    An instant must carry its offset: a wall time would name a different instant on each
    replica's zone. Raises :class:`~cronlock.ScheduleError` for two kinds given at once or
    text that is no such schedule; its message names the field as *labels* names it for
    the caller's user (the command line's ``--anchor``; by default the parameter's name).
    """
    label = (labels or {}).get
    kinds = [
        kind
        for kind, value in (("a cron expression", cron), ("an interval", every), ("instants", at))
        if value is not None
    ]
    if len(kinds) > 1:
        raise ScheduleError(
            f"give {' or '.join(kinds)}, not {'both' if len(kinds) == 2 else 'all'}"
        )
    if cron is not None:
        from .._schedules.cron import cron as cron_schedule

        # No zone given: left open (None), so an update keeps the stored one; a new stored
        # schedule without one is stored in UTC (:func:`schedule_to_json`).
        return cron_schedule(cron, seconds=seconds, tz=tz)
    if every is not None:
        from .._schedules.interval import every as every_schedule

        if isinstance(every, str):
            try:
                every = float(every)
            except ValueError:
                name = label("every", "every")
                raise ScheduleError(f"{name}: not a number of seconds: {every!r}") from None
        start = None if anchor is None else _instant(anchor, label("anchor", "anchor"))
        return every_schedule(every, anchor=start)
    if at is not None:
        from .._schedules.once import once

        return once([_instant(text, label("at", "at")) for text in at])
    return None


def _instant(text: str, name: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ScheduleError(f"{name}: not an ISO 8601 instant: {text!r}") from None
    if value.utcoffset() is None:
        raise ScheduleError(f"{name}: {text!r} names no zone (add +00:00 or Z)")
    return value


def kwargs_to_json(kwargs: Mapping[str, Any] | None, *, owner: str) -> str:
    """*kwargs* as JSON text; raises :class:`~cronlock.ScheduleError` naming *owner* and the
    value when it is not a mapping of names to JSON data that reads back equal."""
    return kwargs_read_back(kwargs, owner=owner)[0]


def kwargs_read_back(kwargs: Mapping[str, Any] | None, *, owner: str) -> tuple[str, dict[str, Any]]:
    """:func:`kwargs_to_json`'s text, and the kwargs as read back from it (what a replica
    will pass the task)."""
    if kwargs is None:
        return "{}", {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ScheduleError(
            f"schedule {owner!r}: kwargs must be a mapping of names to values, got {kwargs!r}"
        )
    try:
        text = json.dumps(dict(kwargs), allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"schedule {owner!r}: kwargs are not JSON ({exc})") from None
    read: dict[str, Any] = json.loads(text)
    if read != kwargs:  # a tuple would come back a list, an int key a string
        raise ScheduleError(
            f"schedule {owner!r}: kwargs {kwargs!r} would not read back the same from JSON "
            "(use lists, dicts, strings, numbers, booleans and None)"
        )
    return text, read


def options_to_json(options: Mapping[str, Any], *, owner: str) -> dict[str, Any]:
    """*options* as plain data (durations as float seconds, instants as ISO text, tags as a
    sorted list); raises :class:`~cronlock.ScheduleError` naming *owner* for an option a
    stored schedule cannot carry."""
    unknown = set(options) - STORED_OPTIONS
    if unknown:
        raise ScheduleError(
            f"schedule {owner!r}: option(s) {', '.join(sorted(unknown))} cannot be stored; "
            f"a stored schedule takes {', '.join(sorted(STORED_OPTIONS))}"
        )
    data: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            data[key] = None
        elif key in _SECONDS:
            data[key] = to_seconds(value, field=key, job=owner, allow_zero=True)
        elif key in _INSTANTS:
            if not isinstance(value, datetime) or value.utcoffset() is None:
                raise ScheduleError(f"schedule {owner!r}: {key} must be aware, got {value!r}")
            data[key] = value.astimezone(UTC).isoformat()
        elif key == "tags":
            data[key] = sorted(_tags(value))
        else:
            data[key] = value
    return data


def _tags(value: str | Iterable[str]) -> set[str]:
    return {value} if isinstance(value, str) else set(value)


def options_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """The job options *data* stores (:func:`options_to_json`'s output), for ``add_job``;
    an option this cronlock does not know is left out (a newer one stored it)."""
    options: dict[str, Any] = {}
    for key, value in data.items():
        if key not in STORED_OPTIONS:
            continue
        if value is not None and key in _INSTANTS:
            value = datetime.fromisoformat(value)
        elif key in _SECONDS and isinstance(value, float) and not math.isfinite(value):
            raise ScheduleError(f"stored option {key}: {value!r} is not a duration")
        options[key] = value
    return options


def check_stored(
    name: str, schedule: Schedule, options: Mapping[str, Any]
) -> tuple[Schedule, JobSettings]:
    """Stored schedule *name*'s *options* (:func:`options_from_json`'s) on *schedule*,
    checked as a replica's ``add_job`` will check them (:func:`cronlock._core.settings.
    check_options`): the schedule as its job will have it, and its settings. Raises
    :class:`~cronlock.ScheduleError` naming the schedule, the option and the value."""
    return check_options(name, schedule, options)


def first_slot(schedule: Schedule, settings: JobSettings, after: datetime) -> datetime | None:
    """The first slot a stored schedule checked by :func:`check_stored` has after *after*
    (the rule of ``Job.slot_after``: within ``start_at`` and ``stop_at``)."""
    return slot_after(schedule, settings, after)


def overdue_grace(settings: JobSettings) -> float:
    """Seconds after a slot a stored schedule's job counts as overdue (``Job``'s rule)."""
    return grace(settings)
