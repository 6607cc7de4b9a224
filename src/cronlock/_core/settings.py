"""The options a job is registered with (:class:`JobOptions`), and what they and its
schedule are checked into, once for jobs registered alike.

A service registers the same function, schedule and options many times over. Each is
checked for the first job given it; jobs given the very same objects then share what the
check made: one :class:`JobSettings` holding every option as checked (the durations as
floats), and the schedule's text. One entry is kept of each kind (the schedule texts: a
bounded few), so nothing piles up. What the task is, and its arguments checked against
it, is :mod:`cronlock._core.tasks`'s.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, TypedDict

from .._durations import Seconds, optional_seconds, positive_int, to_seconds
from .._errors import ScheduleError
from .._locking.protocols import Locker
from .._records import DEFAULT_MISFIRE_GRACE, OVERLAPS, CatchUpPolicy, Overlap
from .._schedules.interval import IntervalSchedule
from .._schedules.schedule import (
    MIN_INTERVAL,
    Schedule,
    bind_zone,
    check_interval,
    check_jitter,
)
from .._schedules.tz import resolve_tz, to_utc

__all__ = (
    "DEFAULT_DELAY",
    "NO_KWARGS",
    "NO_TAGS",
    "OPTION_NAMES",
    "GivenOptions",
    "GivenTask",
    "JobOptions",
    "JobSettings",
    "Recall",
    "check_option_names",
    "check_options",
    "grace",
    "normalise_tags",
    "schedule_text",
    "settle",
    "slot_after",
    "with_catch_up",
    "with_retries",
)

# Shared by every job registered without kwargs (read-only, so one serves them all).
NO_KWARGS: MappingProxyType[str, Any] = MappingProxyType({})
# One empty tag set for every job without tags (an empty frozenset is not shared: 216 B).
NO_TAGS: frozenset[str] = frozenset()
_UNSET = object()  # nothing checked yet
_UTC = resolve_tz("UTC")  # what Scheduler() defaults to
_ONE_MICROSECOND = timedelta(microseconds=1)
DEFAULT_DELAY = 1.0
"""``retry_delay``'s default: seconds before the first retry (before jitter)."""

# Recent schedules' texts, bounded: by id (holding the schedule, so the id stays its own)
# and by value (equal schedules share one string).
_texts: dict[int, tuple[Any, str]] = {}
_texts_by_value: dict[Any, str] = {}


class JobOptions(TypedDict, total=False):
    """Options accepted by :meth:`Scheduler.add_job` and every decorator."""

    name: str | None
    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None
    tags: str | Iterable[str] | None
    timeout: Seconds | None
    overlap: Overlap
    jitter: Seconds | None
    max_runs: int | None
    start_at: datetime | None
    stop_at: datetime | None
    misfire_grace: Seconds | None
    distributed: bool
    locker: Locker | None
    recover: bool
    alert_after: Seconds | None
    retries: int
    retry_delay: Seconds
    catch_up: CatchUpPolicy


OPTION_NAMES = frozenset(JobOptions.__annotations__)


def check_option_names(job: str, options: Iterable[str]) -> None:
    """Raise :class:`~cronlock.ScheduleError` naming *job* and any unknown option given."""
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise ScheduleError(
            f"job {job!r}: unknown option(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(OPTION_NAMES))}"
        )


# Not frozen=True, though never changed once made (Recall replaces it whole): a frozen
# dataclass's __init__ goes through object.__setattr__ per field, and a registration with
# options of its own makes one (benchmarks/counts.py). JobSettings is kept alike.
@dataclass(slots=True)
class GivenOptions:
    """The 12 options a registration was given, the very objects (tags as normalised), and
    the :class:`JobSettings` they were checked into (``None``: nothing checked yet).
    Never changed once made."""

    tags: Any = _UNSET
    timeout: Any = _UNSET
    overlap: Any = _UNSET
    jitter: Any = _UNSET
    max_runs: Any = _UNSET
    start_at: Any = _UNSET
    stop_at: Any = _UNSET
    misfire_grace: Any = _UNSET
    distributed: Any = _UNSET
    locker: Any = _UNSET
    recover: Any = _UNSET
    alert_after: Any = _UNSET
    settings: JobSettings | None = None


@dataclass(slots=True)
class GivenTask:
    """The task a registration was given, how many args, the names of its kwargs (``()``
    for none), the call shape they were checked into and what the task is
    (:func:`cronlock._core.tasks.task_shape`; typed ``Any`` here: tasks imports this
    module). Never changed once made, as :class:`GivenOptions`."""

    func: Any = None
    arg_count: int = -1
    kwarg_names: tuple[str, ...] = ()
    shape: Any = None
    info: Any = None


class Recall:
    """What a scheduler's last registration was given and what it was checked into, so
    that the next job given the very same objects shares it without a check (a service
    registering 100,000 jobs with one set of options checks them once).

    One per scheduler, never shared: two schedulers registering in two threads cannot
    pair a job with the other's settings. Each field is one record, replaced whole (never
    changed) and read once per registration, so a registration in another thread is never
    half seen.
    """

    __slots__ = ("settings", "task")

    def __init__(self) -> None:
        self.settings = GivenOptions()
        self.task = GivenTask()


def normalise_tags(tags: str | Iterable[str] | None) -> frozenset[str]:
    """Accept one tag or an iterable of them."""
    if tags is None:
        return NO_TAGS
    if isinstance(tags, str):
        return frozenset((tags,))
    return frozenset(tags)


class JobSettings:
    """A job's options, checked; jobs given the same options share one.

    Immutable by convention (nothing writes a field after ``__init__``): sharing it is
    what makes a job of 100,000 alike cost twelve fields less (Job reads them through
    properties). The durations are float seconds.
    """

    __slots__ = (
        "alert_after",
        "catch_up",
        "distributed",
        "jitter",
        "locker",
        "max_runs",
        "misfire_grace",
        "overlap",
        "recover",
        "retries",
        "retry_delay",
        "start_at",
        "stop_at",
        "tags",
        "timeout",
        "unbounded",
    )

    def __init__(
        self,
        tags: frozenset[str],
        timeout: float | None,
        overlap: Overlap,
        jitter: float | None,
        max_runs: int | None,
        start_at: datetime | None,
        stop_at: datetime | None,
        misfire_grace: float | None,
        distributed: bool,
        locker: Locker | None,
        recover: bool,
        alert_after: float | None,
    ) -> None:
        self.tags = tags
        self.timeout = timeout
        self.overlap = overlap
        self.jitter = jitter
        self.max_runs = max_runs
        self.start_at = start_at
        self.stop_at = stop_at
        self.misfire_grace = misfire_grace
        self.distributed = distributed
        self.locker = locker
        self.recover = recover
        self.alert_after = alert_after
        self.unbounded = start_at is None and stop_at is None  # no bound to honour
        # Set on a copy when a job has retries (with_retries): most have none.
        self.retries = 0
        self.retry_delay = 1.0
        # Set on a copy when a job asks for every owed slot (with_catch_up).
        self.catch_up: CatchUpPolicy = "latest"

    def _key(self) -> tuple[Any, ...]:
        # By value (the durations are floats by now), distributed with its type (True == 1,
        # but distributed=1 stays 1), the locker by identity.
        return (
            self.tags,
            self.timeout,
            self.overlap,
            self.jitter,
            self.max_runs,
            self.start_at,
            self.stop_at,
            self.misfire_grace,
            type(self.distributed),
            self.distributed,
            id(self.locker),
            self.recover,
            self.alert_after,
            self.retries,
            self.retry_delay,
            self.catch_up,
        )


def settle(
    name: str,
    tags: frozenset[str],
    timeout: Seconds | None,
    overlap: Overlap,
    jitter: Seconds | None,
    max_runs: int | None,
    start_at: datetime | None,
    stop_at: datetime | None,
    misfire_grace: Seconds | None,
    distributed: bool,
    locker: Locker | None,
    recover: bool,
    alert_after: Seconds | None,
    recall: Recall,
) -> JobSettings:
    """Check job *name*'s options into a JobSettings (*recall*'s last one, when it holds
    the same values) and remember them in *recall* for the next job.

    Raises :class:`~cronlock.ScheduleError` naming the job, the option and the value.
    """
    if overlap not in OVERLAPS:
        raise ScheduleError(
            f"job {name!r}: overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}"
        )
    checked_timeout = optional_seconds(timeout, field="timeout", job=name)
    checked_jitter = optional_seconds(jitter, field="jitter", job=name, allow_zero=True)
    grace = optional_seconds(misfire_grace, field="misfire_grace", job=name, allow_zero=True)
    alert = optional_seconds(alert_after, field="alert_after", job=name)
    if recover is not False and recover is not True:
        raise ScheduleError(f"job {name!r}: recover must be True or False, got {recover!r}")
    if max_runs is not None:
        positive_int(max_runs, field="max_runs", owner=f"job {name!r}", error=ScheduleError)
    start = stop = None
    if start_at is not None:
        start = to_utc(start_at, field=f"job {name!r}: start_at")
    if stop_at is not None:
        stop = to_utc(stop_at, field=f"job {name!r}: stop_at")
        if start is not None and stop < start:
            raise ScheduleError(
                f"job {name!r}: stop_at {stop.isoformat()} is before start_at {start.isoformat()}"
            )
    made = JobSettings(
        tags,
        checked_timeout,
        overlap,
        checked_jitter,
        max_runs,
        start,
        stop,
        grace,
        distributed,
        locker,
        recover,
        alert,
    )
    last = recall.settings.settings
    if last is not None and last._key() == made._key():
        made = last
    # What was given (the very objects, start_at and stop_at as given), for the next job.
    recall.settings = GivenOptions(
        tags,
        timeout,
        overlap,
        jitter,
        max_runs,
        start_at,
        stop_at,
        misfire_grace,
        distributed,
        locker,
        recover,
        alert_after,
        made,
    )
    return made


def with_retries(
    settings: JobSettings, name: str, retries: object, retry_delay: Seconds
) -> JobSettings:
    """A copy of *settings* with ``retries`` and ``retry_delay`` checked (raises
    :class:`~cronlock.ScheduleError` naming the job, the option and the value)."""
    if type(retries) is not int or retries < 0:
        raise ScheduleError(f"job {name!r}: retries must be a whole number >= 0, got {retries!r}")
    delay = to_seconds(retry_delay, field="retry_delay", job=name)
    made = copy.copy(settings)
    made.retries = retries
    made.retry_delay = delay
    return made


def with_catch_up(settings: JobSettings, name: str, catch_up: object) -> JobSettings:
    """*settings*, or a copy with ``catch_up`` checked (raises :class:`~cronlock.ScheduleError`
    naming the job, the option and the value): ``"latest"`` (the default: owed slots
    coalesce into the latest) or ``"all"`` (each owed slot within its grace runs, in
    order), which ``overlap="replace"`` cannot keep (each run would cancel the one before)."""
    if catch_up == "latest":
        return settings
    if catch_up != "all" or not isinstance(catch_up, str):
        raise ScheduleError(f"job {name!r}: catch_up must be 'latest' or 'all', got {catch_up!r}")
    if settings.overlap == "replace":
        raise ScheduleError(
            f"job {name!r}: catch_up='all' cannot hold with overlap='replace' (each owed "
            "slot's run would cancel the one before it); use overlap='skip', 'queue' or "
            "'allow'"
        )
    made = copy.copy(settings)
    made.catch_up = "all"
    return made


def check_options(
    name: str, schedule: Schedule, options: Mapping[str, Any]
) -> tuple[Schedule, JobSettings]:
    """Job *name*'s *options* on *schedule*, checked as ``Scheduler.add_job`` checks them in
    a scheduler of default settings (zone UTC, no locker), without registering a job: the
    same helpers, so the same errors (:class:`~cronlock.ScheduleError` naming the job, the
    option and the value). Returns the schedule as the job would have it (its zone bound)
    and the settings its options make.

    What a stored schedule is checked with before it is stored (a replica's ``add_job``
    then makes the same of it). The name itself is the caller's to check.
    """
    check_option_names(name, options)
    if type(schedule) is not IntervalSchedule:
        schedule = bind_zone(schedule, _UTC)
    elif schedule.interval < MIN_INTERVAL:
        check_interval(name, schedule)  # raises
    get = options.get
    tags = get("tags")
    settings = settle(
        name,
        NO_TAGS if tags is None else normalise_tags(tags),
        get("timeout"),
        get("overlap", "skip"),
        get("jitter"),
        get("max_runs"),
        get("start_at"),
        get("stop_at"),
        get("misfire_grace", DEFAULT_MISFIRE_GRACE),
        get("distributed", True),
        get("locker"),
        get("recover", False),
        get("alert_after"),
        Recall(),
    )
    retries, retry_delay = get("retries", 0), get("retry_delay", DEFAULT_DELAY)
    if retries or retry_delay is not DEFAULT_DELAY:
        settings = with_retries(settings, name, retries, retry_delay)
    catch_up = get("catch_up", "latest")
    if catch_up != "latest":
        settings = with_catch_up(settings, name, catch_up)
    if settings.jitter:
        check_jitter(name, schedule, settings.jitter)
    return schedule, settings


def slot_after(schedule: Schedule, settings: JobSettings, after: datetime) -> datetime | None:
    """The first slot of *schedule* strictly after *after* within *settings*' ``start_at``
    and ``stop_at`` (``Job.slot_after``'s rule)."""
    if settings.start_at is not None and after < settings.start_at:
        after = settings.start_at - _ONE_MICROSECOND
    slot: datetime | None = schedule.next_after(after)
    if slot is None or (settings.stop_at is not None and slot > settings.stop_at):
        return None
    return slot


def schedule_text(schedule: Schedule) -> str:
    """``str(schedule)``, made once for a schedule that many jobs share (lockers that keep
    a job's schedule are told it at every plan)."""
    seen = _texts.get(id(schedule))  # by identity: no __hash__ call for a shared schedule
    if seen is not None and seen[0] is schedule:
        return seen[1]
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
    if len(_texts) >= 256:
        _texts.clear()
    _texts[id(schedule)] = (schedule, text)
    return text


def grace(settings: JobSettings, default_timeout: float | None = None) -> float:
    """Seconds after a slot fell due before a job with *settings* counts as overdue:
    ``alert_after``, or its ``misfire_grace`` (the default when unlimited) plus its timeout."""
    if settings.alert_after is not None:
        return settings.alert_after
    misfire = settings.misfire_grace
    timeout = settings.timeout if settings.timeout is not None else default_timeout
    return (DEFAULT_MISFIRE_GRACE if misfire is None else misfire) + (timeout or 0.0)
