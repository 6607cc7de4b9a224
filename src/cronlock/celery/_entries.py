"""A Celery app's ``beat_schedule`` read as cronlock schedules, or refused at start.

Each entry becomes a :class:`BeatEntry`: the task's name, its args, kwargs and send
options as given, and a cronlock :class:`~cronlock.Schedule` whose slots are the instants
Celery's own beat would send at:

- ``crontab(...)`` -> a cron expression built from the crontab's *expanded* sets (so
  ``'*/15'``, ``'1-5'`` and ``'mon-fri'`` all arrive as the numbers Celery computed), in
  the app's zone (``timezone``; UTC when it is unset and ``enable_utc`` is on). A field
  that is every value of its range is written ``*``, one that is every k-th value from the
  start of its range ``*/k``: both keep the wildcard rules of cron through DST changes.
- a number, a ``timedelta`` or ``schedule(run_every=...)`` -> ``every(interval)``: slots at
  multiples of the interval since the Unix epoch, the same on every replica (Celery's beat
  counts from each beat's own last send, which no two replicas share). ``relative`` is
  accepted and changes nothing: the slots are already aligned.
- anything else (``solar``, a subclass of ``crontab`` or ``schedule`` that may compute its
  own instants, an object of another type) is refused with :class:`cronlock.ConfigError`
  naming the entry, the field and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast
from zoneinfo import ZoneInfo

from .. import ConfigError, Schedule, cron, every

__all__ = ("BeatEntry", "EntryOptions", "beat_entries", "convert_entry")

_ENTRY_KEYS = frozenset({"task", "schedule", "args", "kwargs", "options", "relative", "cronlock"})

_PER_ENTRY = ("retries", "retry_delay", "misfire_grace", "timeout", "recover")

# crontab field -> (cron position, lowest, highest)
_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day_of_month", 1, 31),
    ("month_of_year", 1, 12),
    ("day_of_week", 0, 6),
)


@dataclass(frozen=True, slots=True)
class EntryOptions:
    """The per-entry cronlock settings (the entry's ``cronlock`` key), each ``None`` where
    the entry leaves it to the scheduler-wide setting."""

    retries: int | None = None
    retry_delay: float | None = None
    misfire_grace: float | None = None
    timeout: float | None = None
    recover: bool | None = None


@dataclass(frozen=True, slots=True)
class BeatEntry:
    """One ``beat_schedule`` entry, converted: what is sent, and on which slots."""

    name: str
    """The entry's key in ``beat_schedule``: the cronlock job's name."""
    task: str
    """The Celery task's name."""
    schedule: Schedule
    """The slots, as cronlock computes them."""
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    """What ``apply_async`` is given besides args and kwargs: queue, exchange,
    routing_key, priority, expires, headers, ..."""
    cronlock: EntryOptions = EntryOptions()
    """The entry's own ``retries``, ``retry_delay``, ``misfire_grace``, ``timeout`` and
    ``recover``, where given."""


def _refuse(name: str, what: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"beat_schedule entry {name!r}: {what} {value!r} {why}")


def app_zone(app: Any) -> str:
    """The IANA name of the zone the app's crontabs are read in."""
    conf = app.conf
    zone = conf.timezone
    if not zone:
        if conf.enable_utc:
            return "UTC"
        raise ConfigError(
            "the Celery app has no timezone and enable_utc is off, so its crontabs are read "
            "in the host's local zone, which replicas need not share; set "
            "app.conf.timezone to an IANA name (e.g. 'Europe/Berlin') or enable_utc=True"
        )
    key = zone.key if isinstance(zone, ZoneInfo) else zone  # a ZoneInfo instead of its name
    if not isinstance(key, str):
        raise ConfigError(f"app.conf.timezone must be an IANA zone name, got {zone!r}")
    return key


def _cron_field(values: Any, low: int, high: int) -> str:
    numbers = sorted(int(v) for v in values)
    if len(numbers) > 1:
        step = numbers[1] - numbers[0]
        if numbers[0] == low and numbers == list(range(low, high + 1, step)):
            return "*" if step == 1 else f"*/{step}"
    return ",".join(map(str, numbers))


def crontab_expression(name: str, schedule: Any) -> str:
    """The 5-field cron expression of Celery *schedule* (a ``crontab``) of entry *name*."""
    fields = {attr: _cron_field(getattr(schedule, attr), lo, hi) for attr, lo, hi in _FIELDS}
    if fields["day_of_month"] != "*" and fields["day_of_week"] != "*":
        # Celery fires when both match; cron (and cronlock) when either does.
        raise _refuse(
            name,
            "schedule",
            schedule,
            "restricts both day_of_month and day_of_week: Celery sends on the days that "
            "match both, cron on the days that match either; split it into two entries or "
            "restrict one of the two",
        )
    return " ".join(fields[attr] for attr, _, _ in _FIELDS)


def _interval(name: str, value: timedelta) -> Schedule:
    seconds = value.total_seconds()
    if not math.isfinite(seconds) or seconds <= 0:
        raise _refuse(name, "schedule", value, "is not a positive interval")
    try:
        return every(value)
    except ValueError as exc:  # cronlock's own refusals (ScheduleError) name the value
        raise ConfigError(f"beat_schedule entry {name!r}: schedule {value!r}: {exc}") from None


def convert_schedule(name: str, value: object, zone: str) -> Schedule:
    """The cronlock schedule of entry *name*'s ``schedule`` *value* (crontabs in *zone*)."""
    from celery.schedules import crontab, schedule, solar

    if isinstance(value, bool):
        raise _refuse(name, "schedule", value, "is not a schedule")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            raise _refuse(name, "schedule", value, "is not a positive number of seconds")
        return _interval(name, timedelta(seconds=value))
    if isinstance(value, timedelta):
        return _interval(name, value)
    if isinstance(value, solar):
        raise _refuse(
            name,
            "schedule",
            value,
            "is a solar schedule, which cronlock cannot compute (its instants depend on "
            "the sun at a place); use a crontab near the event instead",
        )
    if type(value) is crontab:
        expression = crontab_expression(name, value)
        try:
            return cron(expression, tz=zone)
        except ValueError as exc:
            raise ConfigError(
                f"beat_schedule entry {name!r}: schedule {value!r} (as {expression!r}): {exc}"
            ) from None
    if type(value) is schedule:
        return _interval(name, cast(Any, value).run_every)
    raise _refuse(
        name,
        "schedule",
        value,
        f"is of type {type(value).__module__}.{type(value).__qualname__}, which cronlock "
        "does not know how to compute slots for (it takes crontab, schedule, a timedelta or "
        "a number of seconds)",
    )


def _entry_options(name: str, value: object) -> EntryOptions:
    if value is None:
        return EntryOptions()
    if not isinstance(value, Mapping):
        raise _refuse(name, "cronlock", value, "is not a mapping")
    unknown = sorted(map(str, set(value) - set(_PER_ENTRY)))
    if unknown:
        raise _refuse(
            name,
            "cronlock key",
            unknown[0],
            f"is not a setting (it takes {', '.join(_PER_ENTRY)})",
        )
    checked: dict[str, Any] = {}
    for key, given in value.items():
        if key == "recover":
            if not isinstance(given, bool):
                raise _refuse(name, "cronlock.recover", given, "is not True or False")
        elif key == "retries":
            if isinstance(given, bool) or not isinstance(given, int) or given < 0:
                raise _refuse(name, "cronlock.retries", given, "is not a whole number >= 0")
        else:
            if isinstance(given, timedelta):
                given = given.total_seconds()
            if isinstance(given, bool) or not isinstance(given, int | float) or given < 0:
                raise _refuse(name, f"cronlock.{key}", given, "is not seconds >= 0")
            given = float(given)
        checked[key] = given
    return EntryOptions(**checked)


def convert_entry(name: object, entry: object, zone: str = "UTC") -> BeatEntry:
    """One ``beat_schedule`` entry as a :class:`BeatEntry`, its crontabs read in *zone*;
    :class:`cronlock.ConfigError` naming the entry, the field and the value if it cannot be
    honoured."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"beat_schedule: an entry's name must be a non-empty string: {name!r}")
    if not isinstance(entry, Mapping):
        raise ConfigError(f"beat_schedule entry {name!r} is not a mapping: {entry!r}")
    unknown = sorted(map(str, set(entry) - _ENTRY_KEYS))
    if unknown:
        raise _refuse(
            name, "key", unknown[0], f"is not a beat entry key ({', '.join(sorted(_ENTRY_KEYS))})"
        )
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        raise _refuse(name, "task", task, "is not a task name")
    if "schedule" not in entry:
        raise ConfigError(f"beat_schedule entry {name!r} has no schedule")
    relative = entry.get("relative", False)
    if not isinstance(relative, bool):
        raise _refuse(name, "relative", relative, "is not True or False")
    args = entry.get("args") or ()
    if isinstance(args, str | bytes | Mapping) or not isinstance(args, Sequence):
        raise _refuse(name, "args", args, "is not a list or tuple")
    kwargs = entry.get("kwargs") or {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise _refuse(name, "kwargs", kwargs, "is not a mapping of names to values")
    options = entry.get("options") or {}
    if not isinstance(options, Mapping):
        raise _refuse(name, "options", options, "is not a mapping")
    if "task_id" in options:
        raise _refuse(
            name,
            "options key",
            "task_id",
            "cannot be set: each slot's task is sent with its own id (cronlock.celery.task_id)",
        )
    headers = options.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        raise _refuse(name, "options.headers", headers, "is not a mapping")
    return BeatEntry(
        name=name,
        task=task,
        schedule=convert_schedule(name, entry["schedule"], zone),
        args=tuple(args),
        kwargs=dict(kwargs),
        options=dict(options),
        cronlock=_entry_options(name, entry.get("cronlock")),
    )


def beat_entries(app: Any) -> tuple[BeatEntry, ...]:
    """Every entry of *app*'s ``beat_schedule``, converted (:func:`convert_entry`), in the
    order given; the first entry that cannot be honoured raises
    :class:`cronlock.ConfigError`."""
    schedule = app.conf.beat_schedule or {}
    if not isinstance(schedule, Mapping):
        raise ConfigError(f"app.conf.beat_schedule is not a mapping: {schedule!r}")
    zone = app_zone(app)
    return tuple(convert_entry(name, entry, zone) for name, entry in schedule.items())
