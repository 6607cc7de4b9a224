"""What the account of a slot needs of its job: how many slots a range holds, and how a
reader of the ledger rebuilds the job's slots (the fates and the lateness rule:
:mod:`cronlock._fates`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ..job import Job

__all__ = ("COUNT_AT_MOST", "ONE_MICROSECOND", "count_slots", "job_spec")

COUNT_AT_MOST: Final = 100_000
"""Slots a range is counted up to (a week of a one-second schedule is 604,800)."""


def count_slots(job: Job, first: datetime, last: datetime) -> int:
    """How many slots of *job* lie from *first* to *last*, both included (at most
    :data:`COUNT_AT_MOST`; a schedule that fails counts the ends it was given)."""
    if last < first:
        return 0
    try:
        count, slot = 1, job.following(first)
        while slot is not None and slot <= last and count < COUNT_AT_MOST:
            count += 1
            slot = job.following(slot)
    except Exception:
        return 1 if first == last else 2
    return count


_SPECS: dict[tuple[Any, ...], str | None] = {}


def job_spec(job: Job) -> str | None:
    """*job*'s slots as JSON text a reader of the ledger rebuilds them from (its schedule,
    jitter, ``misfire_grace``, ``start_at``, ``stop_at``); ``None`` for a schedule that
    cannot be written down (a custom class, ``once()`` at start). Made once for jobs alike."""
    settings = job._settings
    schedule = job._schedule
    key = (schedule, settings.jitter, settings.misfire_grace, settings.start_at,
           settings.stop_at)  # fmt: skip
    try:
        return _SPECS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable schedule of the user's
        return None
    from ..._errors import ScheduleError
    from ..._stored.json import schedule_to_json

    try:
        data: Mapping[str, Any] | None = schedule_to_json(schedule, owner=job.name)
    except ScheduleError:
        data = None
    spec = None
    if data is not None:
        spec = json.dumps(
            {
                "schedule": data,
                "jitter": settings.jitter,
                "misfire_grace": settings.misfire_grace,
                "start_at": _iso(settings.start_at),
                "stop_at": _iso(settings.stop_at),
            },
            sort_keys=True,
        )
    if len(_SPECS) >= 256:
        _SPECS.clear()
    _SPECS[key] = spec
    return spec


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


ONE_MICROSECOND: Final = timedelta(microseconds=1)
