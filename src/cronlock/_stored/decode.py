"""The one boundary a stored schedule's row crosses on its way in: :func:`decode_row`.

Every reader of the schedules table (a replica's start and sync, ``FleetControl.
schedules``, ``status``, ``schedules list``, the dashboard) decodes a row through it. A row
anyone may have written by hand: it can hold any text, any JSON, numbers past every range,
nesting a decoder cannot follow. Whatever decoding it raises (a ``ScheduleError``, an
``OverflowError`` for an interval of 1e20 microseconds, a ``RecursionError`` for JSON a
thousand levels deep, a ``ValueError``, a ``KeyError``...) becomes the row's *reason*: the
row is read as :class:`Unreadable`, a schedule that never fires, and no exception leaves
here. The limits (:mod:`.limits`) are checked here too, but for the minimum interval, which
is each replica's to set (``Scheduler(stored_min_interval=)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._errors import CronlockError
from .._names import check_job_name
from .._schedules.schedule import Schedule
from . import limits
from .json import check_stored, options_from_json, schedule_from_json

__all__ = ("MAX_REASON", "Decoded", "Unreadable", "decode_row", "warm_up")

MAX_REASON = 300
"""Characters of a reason kept (a message may quote a value of kilobytes)."""
_KEPT = 4096  # distinct schedule texts remembered (tenants share a few: a report at 3)
# Each schedule text decoded, and its schedule: rows of one text share one (immutable)
# schedule object, parsed once, whose first slot after an instant is found once too.
_schedules: dict[str, Schedule] = {}
# Each (schedule text, options text) that passed every check, and the options it gives:
# tenants share a few (a report at 3 with a timeout of 600), so each pair is decoded and
# checked once. Only the kwargs are the row's own.
_checked: dict[tuple[str, str], tuple[Schedule, dict[str, Any]]] = {}
# The options of each options text, one dict for all its rows: their values are then the
# very objects, which a replica's add_job recognises (the last job's, checked already).
_options: dict[str, dict[str, Any]] = {}


@dataclass(frozen=True, slots=True)
class Unreadable:
    """The schedule of a stored row that cannot be read (or breaks a limit): it never
    fires; *reason* says why."""

    reason: str

    def next_after(self, after: datetime) -> datetime | None:
        """Never: no replica runs a row it cannot read."""
        return None

    def __str__(self) -> str:
        return "unreadable"


@dataclass(frozen=True, slots=True)
class Decoded:
    """A row's schedule, kwargs and options as a replica's ``add_job`` takes them; with
    *unreadable* set (why), the schedule is :class:`Unreadable` and the rest empty."""

    schedule: Schedule
    kwargs: dict[str, Any]
    options: dict[str, Any]
    unreadable: str | None = None


def decode_row(name: str, task: str, schedule: str, kwargs: str, options: str) -> Decoded:
    """Stored schedule *name*'s row (its task, and its JSON columns as text) decoded and
    checked against the limits; never raises (an :class:`Exception`): a row it cannot read,
    out of range or past a limit is :class:`Decoded` with ``unreadable`` (the reason)."""
    try:
        return _decode(name, task, schedule, kwargs, options)
    except Exception as exc:  # anything at all: one row must not stop a reader
        if isinstance(exc, CronlockError):  # its message names the schedule, field, value
            reason = str(exc)
        else:
            reason = f"schedule {name!r}: {type(exc).__name__}: {exc}"
        if len(reason) > MAX_REASON:
            reason = reason[: MAX_REASON - 3] + "..."
        return Decoded(Unreadable(reason), {}, {}, reason)


def _decode(name: str, task: str, schedule: str, kwargs: str, options: str) -> Decoded:
    check_job_name(name, field="schedule name")
    limits.check_task(name, task)
    checked = _checked.get((schedule, options)) if type(options) is str else None
    if checked is not None and type(kwargs) is str:  # only the kwargs are new
        limits.check_json_text(name, "kwargs", kwargs)
        value = json.loads(kwargs)
        limits.check_json_value(name, "kwargs", value)
        if type(value) is dict:
            return Decoded(checked[0], value, dict(checked[1]))
    values: dict[str, Any] = {}
    made = _schedules.get(schedule) if isinstance(schedule, str) else None
    for field, text in (("schedule", schedule), ("kwargs", kwargs), ("options", options)):
        if made is not None and field == "schedule":
            continue  # read (and checked) before
        if not isinstance(text, str):
            raise TypeError(f"schedule {name!r}: {field} is not JSON text: {limits.shown(text)}")
        limits.check_json_text(name, field, text)
        value = json.loads(text)
        limits.check_json_value(name, field, value)
        if not isinstance(value, dict):
            raise TypeError(
                f"schedule {name!r}: {field} must be a JSON object, got {limits.shown(value)}"
            )
        values[field] = value
    if made is None:
        made = schedule_from_json(values["schedule"])
        limits.check_rate(name, made, 0.0)  # the minimum interval is the replica's own
        if len(_schedules) >= _KEPT:
            _schedules.clear()
        _schedules[schedule] = made
    stored_options = options_from_json(values["options"])
    limits.check_options(name, stored_options)
    check_stored(name, made, stored_options)  # as the replica's add_job will
    if type(schedule) is str and type(options) is str:
        if len(_checked) >= _KEPT:
            _checked.clear()
            _options.clear()
        _checked[schedule, options] = (made, _options.setdefault(options, stored_options))
    return Decoded(made, values["kwargs"], stored_options)


def warm_up() -> None:
    """Import what decoding stored rows may need, ahead of the first read: croniter (whose
    import runs ``file`` in a subprocess to learn the word size, 15-30 ms) and the calendar
    schedules. A replica's start calls it in a worker thread, so that no import holds the
    event loop while the jobs in code run (most of it waits on the subprocess and the disk,
    without the GIL); once imported, it costs nothing."""
    import croniter  # noqa: F401

    from .._schedules import calendar  # noqa: F401
