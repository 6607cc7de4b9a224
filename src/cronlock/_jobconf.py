"""What a job's options, task and schedule are checked into, once for jobs registered alike.

A service registers the same function, schedule and options many times over. Each is
checked for the first job given it; jobs given the very same objects then share what the
check made: the durations as floats, what the task is (async or not, its ``RunContext``
parameter), the schedule's text, and one :class:`JobSettings` holding the options the run
loop never reads on a run's path. One entry is kept of each kind (the schedule texts: a
bounded few), so nothing piles up.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import typing
from collections.abc import Callable, Iterable
from datetime import datetime
from types import MappingProxyType
from typing import Any

from ._durations import Seconds, optional_seconds, positive_int
from ._errors import ScheduleError
from ._interval import IntervalSchedule
from ._locking import Locker
from ._records import RunContext
from ._schedule import Schedule
from ._tz import to_utc

__all__ = (
    "NO_KWARGS",
    "NO_TAGS",
    "JobSettings",
    "ScheduleRecord",
    "check_durations",
    "describe_task",
    "last_durations",
    "last_settings",
    "last_task",
    "normalise_tags",
    "schedule_record",
    "settle",
    "texts",
)

# Shared by every job registered without kwargs (read-only, so one serves them all).
NO_KWARGS: MappingProxyType[str, Any] = MappingProxyType({})
# One empty tag set for every job without tags (an empty frozenset is not shared: 216 B).
NO_TAGS: frozenset[str] = frozenset()
_UNSET = object()  # nothing checked yet

# The task last seen, then what it is: (is async, its RunContext parameter), one tuple that
# the jobs given it share.
last_task: list[Any] = [None, (True, None)]
# A schedule as jobs hold it: (the schedule, its text, its grid step: the interval of an
# anchor + k*interval schedule, else None); one tuple for the jobs given one schedule.
ScheduleRecord = tuple[Any, str, Any]
# Recent schedules' records, bounded: by id (holding the schedule, so the id stays its
# own); their texts by value too (equal schedules share one string).
texts: dict[int, ScheduleRecord] = {}
_texts_by_value: dict[Any, str] = {}
# The four durations last given (the objects), their types and values, then their values
# as checked.
last_durations: list[Any] = [_UNSET, _UNSET, _UNSET, _UNSET, None, None, None, None, None]
# The rarely read options last given (tags as normalised, alert_after as checked, the
# others as given), then the JobSettings they were checked into.
last_settings: list[Any] = [_UNSET] * 7 + [None]


def normalise_tags(tags: str | Iterable[str] | None) -> frozenset[str]:
    """Accept one tag or an iterable of them."""
    if tags is None:
        return NO_TAGS
    if isinstance(tags, str):
        return frozenset((tags,))
    return frozenset(tags)


def check_durations(
    name: str,
    timeout: Seconds | None,
    jitter: Seconds | None,
    grace: Seconds | None,
    alert: Seconds | None,
) -> None:
    """Check a job's four durations into ``last_durations`` (or raise, naming the job)."""
    given = (
        type(timeout),
        timeout,
        type(jitter),
        jitter,
        type(grace),
        grace,
        type(alert),
        alert,
    )
    if given == last_durations[4]:  # equal to the last job's (new objects): checked then
        last_durations[:4] = (timeout, jitter, grace, alert)
        return
    last_durations[:] = (
        timeout,
        jitter,
        grace,
        alert,
        given,
        optional_seconds(timeout, field="timeout", job=name),
        optional_seconds(jitter, field="jitter", job=name, allow_zero=True),
        optional_seconds(grace, field="misfire_grace", job=name, allow_zero=True),
        optional_seconds(alert, field="alert_after", job=name),
    )


class JobSettings:
    """A job's options that no run reads on its way, checked; jobs given the same share one.

    Immutable by convention (nothing writes a field after ``__init__``): sharing it is
    what makes a job of 100,000 alike cost six fields less (Job reads them through
    properties).
    """

    __slots__ = (
        "alert_after",
        "distributed",
        "locker",
        "recover",
        "start_at",
        "stop_at",
        "tags",
        "unbounded",
    )

    def __init__(
        self,
        tags: frozenset[str],
        start_at: datetime | None,
        stop_at: datetime | None,
        distributed: bool,
        locker: Locker | None,
        recover: bool,
        alert_after: float | None,
    ) -> None:
        self.tags = tags
        self.start_at = start_at
        self.stop_at = stop_at
        self.distributed = distributed
        self.locker = locker
        self.recover = recover
        self.alert_after = alert_after
        self.unbounded = start_at is None and stop_at is None  # no bound to honour

    def _key(self) -> tuple[Any, ...]:
        # By value, with types (True == 1, but distributed=1 stays 1), the locker by identity.
        return (
            self.tags,
            self.start_at,
            self.stop_at,
            type(self.distributed),
            self.distributed,
            id(self.locker),
            self.recover,
            type(self.alert_after),
            self.alert_after,
        )


def settle(
    name: str,
    tags: frozenset[str],
    start_at: datetime | None,
    stop_at: datetime | None,
    distributed: bool,
    locker: Locker | None,
    recover: bool,
    alert_after: float | None,
    max_runs: int | None,
) -> JobSettings:
    """Check job *name*'s rarely read options (and *max_runs*, in the order Job always
    checked them) into a JobSettings: the last one made, when it holds the same values.

    Raises :class:`~cronlock.ScheduleError` naming the job, the option and the value.
    """
    if recover is not False and recover is not True:
        raise ScheduleError(f"job {name!r}: recover must be True or False, got {recover!r}")
    if max_runs is not None:
        positive_int(max_runs, field="max_runs", owner=f"job {name!r}", error=ScheduleError)
    given = (start_at, stop_at)
    if start_at is not None:
        start_at = to_utc(start_at, field=f"job {name!r}: start_at")
    if stop_at is not None:
        stop_at = to_utc(stop_at, field=f"job {name!r}: stop_at")
        if start_at is not None and stop_at < start_at:
            raise ScheduleError(
                f"job {name!r}: stop_at {stop_at.isoformat()} is before "
                f"start_at {start_at.isoformat()}"
            )
    made = JobSettings(tags, start_at, stop_at, distributed, locker, recover, alert_after)
    last = last_settings[7]
    if last is not None and last._key() == made._key():
        made = last
    last_settings[:] = (tags, *given, distributed, locker, recover, alert_after, made)
    return made


def describe_task(func: Callable[..., object]) -> None:
    """Put what *func* is (async or not, its ``RunContext`` parameter) in ``last_task``."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - async callable objects
    )
    last_task[:] = (func, (is_async, _context_parameter(func)))


def schedule_record(schedule: Schedule) -> ScheduleRecord:
    """*schedule*'s record (itself, its ``str()``, its grid step), remembered for the next
    job given it."""
    seen = texts.get(id(schedule))  # by identity: no __hash__ call for a shared schedule
    if seen is not None and seen[0] is schedule:
        return seen
    try:
        text = _texts_by_value.get(schedule)
    except TypeError:  # an unhashable schedule of the user's
        text = None
    if text is None:
        text = str(schedule)
        if len(_texts_by_value) >= 256:
            _texts_by_value.clear()
        with contextlib.suppress(TypeError):
            _texts_by_value[schedule] = text
    if len(texts) >= 256:
        texts.clear()
    step = schedule.interval if type(schedule) is IntervalSchedule else None
    record = texts[id(schedule)] = (schedule, text, step)
    return record


def _context_parameter(func: Callable[..., object]) -> str | None:
    """The name of the parameter annotated ``RunContext``, if any."""
    annotations = getattr(func, "__annotations__", None)
    if isinstance(annotations, dict) and not any(
        a is RunContext or (isinstance(a, str) and "RunContext" in a) for a in annotations.values()
    ):
        # Resolving string annotations (get_type_hints) costs ~100 us a call: skip it
        # when no annotation could be RunContext, which is nearly every job.
        return None
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        hints = {}
        for name, param in inspect.signature(func).parameters.items():
            hints[name] = param.annotation
    for name, hint in hints.items():
        if name != "return" and (hint is RunContext or hint == "RunContext"):
            return name
    return None
