"""Jobs: a task bound to a schedule and options; its run state is read through properties.

The run state itself lives in :class:`cronlock._state.RunState`, which is the only code
that changes it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Protocol

from ._cancel import task_name
from ._clock import Clock
from ._durations import Seconds, optional_seconds, positive_int
from ._errors import ScheduleError, SchedulerStateError
from ._events import JobEvent
from ._interval import IntervalSchedule
from ._locking import Locker, Wiring
from ._records import (
    DEFAULT_MISFIRE_GRACE,
    OVERLAPS,
    Overlap,
    RunContext,
    RunRecord,
    run_context,
)
from ._schedule import Schedule
from ._state import RunState
from ._threads import in_thread
from ._tz import to_utc


class Controller(Protocol):
    """What a job asks of the scheduler it is registered with (``pause()``, ``run_now()``)."""

    @property
    def clock(self) -> Clock: ...

    def pause_job(self, job: Job) -> None: ...

    def resume_job(self, job: Job) -> None: ...

    async def run_job_now(self, job: Job) -> JobEvent: ...


__all__ = (
    "NO_KWARGS",
    "NO_TAGS",
    "Controller",
    "Job",
    "default_name",
    "jitter_offset",
    "normalise_tags",
)

# Shared by every job registered without kwargs (read-only, so one serves them all).
NO_KWARGS: MappingProxyType[str, Any] = MappingProxyType({})
# One empty tag set for every job without tags (an empty frozenset is not shared: 216 B).
NO_TAGS: frozenset[str] = frozenset()
# Jobs not yet wired share this one (Wiring is frozen); add_job sets the real one.
_UNWIRED = Wiring()
_UNSET = object()  # no job checked yet
# A service registers the same function and schedule many times over: what is derived
# from them is kept for the last one seen (one entry each, so nothing piles up).
_last_func: list[Any] = [None, True, None]  # func, is async, RunContext parameter
# Recent schedules' text, bounded: by id (holding the schedule, so the id stays its own),
# and by value (equal schedules share one string).
_texts: dict[int, tuple[Any, str]] = {}
_texts_by_value: dict[Any, str] = {}
# The four durations last given (the objects), their types and values, then their values
# as checked.
_last_durations: list[Any] = [_UNSET, _UNSET, _UNSET, _UNSET, None, None, None, None, None]


def jitter_offset(name: str, slot: datetime, jitter: float) -> timedelta:
    """A delay in ``[0, jitter)`` that every replica derives the same way from (name, slot)."""
    digest = hashlib.blake2b(f"{name}\x00{slot.isoformat()}".encode(), digest_size=8).digest()
    fraction = int.from_bytes(digest, "big") / 2**64
    return timedelta(microseconds=int(fraction * jitter * 1_000_000))


def _check_durations(
    name: str,
    timeout: Seconds | None,
    jitter: Seconds | None,
    grace: Seconds | None,
    alert: Seconds | None,
) -> None:
    """Check a job's four durations into ``_last_durations`` (or raise, naming the job)."""
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
    if given == _last_durations[4]:  # equal to the last job's (new objects): checked then
        _last_durations[:4] = (timeout, jitter, grace, alert)
        return
    _last_durations[:] = (
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


def _text(schedule: Schedule) -> str:
    """The text of *schedule* (its ``str()``), remembered for the next job given it."""
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


@dataclass(eq=False, slots=True, init=False)
class Job:
    """A task registered with a :class:`~cronlock.Scheduler`.

    Read its state (``next_run``, ``last_run``, ``last_success``, ``running``,
    ``run_count``) and control it (``pause()``, ``resume()``, ``run_now()``). Created by
    ``Scheduler.add_job`` and the decorators, never directly.
    """

    name: str
    func: Callable[..., object]
    schedule: Schedule
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=NO_KWARGS.copy)
    tags: frozenset[str] = NO_TAGS
    timeout: float | None = None
    overlap: Overlap = "skip"
    jitter: float | None = None
    max_runs: int | None = None
    start_at: datetime | None = None
    stop_at: datetime | None = None
    misfire_grace: float | None = DEFAULT_MISFIRE_GRACE
    distributed: bool = True
    locker: Locker | None = None
    recover: bool = False
    alert_after: float | None = None
    """How long after a slot fell due, with no success since, the job is overdue
    (default: ``misfire_grace`` + ``timeout``); see :meth:`Scheduler.overdue`."""

    # Derived once from the configuration (never run state).
    _scheduler: Controller | None = field(default=None, init=False, repr=False)
    _context_param: str | None = field(default=None, init=False, repr=False)
    _is_async: bool = field(default=True, init=False, repr=False)
    # For anchor + k*interval schedules the slot after a slot is one addition away.
    _grid_step: timedelta | None = field(default=None, init=False, repr=False)
    _task_name: str = field(default="", init=False, repr=False)
    _schedule_text: str = field(default="", init=False, repr=False)
    _wiring: Wiring = field(default=_UNWIRED, init=False, repr=False)
    _state: RunState = field(default_factory=RunState, init=False, repr=False)

    def __init__(
        self,
        func: Callable[..., object],
        schedule: Schedule,
        name: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        tags: str | Iterable[str] | None = None,
        *,
        timeout: Seconds | None = None,
        overlap: Overlap = "skip",
        jitter: Seconds | None = None,
        max_runs: int | None = None,
        start_at: datetime | None = None,
        stop_at: datetime | None = None,
        misfire_grace: Seconds | None = DEFAULT_MISFIRE_GRACE,
        distributed: bool = True,
        locker: Locker | None = None,
        recover: bool = False,
        alert_after: Seconds | None = None,
    ) -> None:
        # Written out, not generated: one pass that checks each option and stores each field
        # once (a service registering 100,000 jobs pays for every call and store here).
        if type(args) is not tuple:
            args = tuple(args)
        kwargs = dict(kwargs) if kwargs else NO_KWARGS
        tags = NO_TAGS if tags is None else normalise_tags(tags)
        if not isinstance(name, str) or not name:
            raise ScheduleError(f"job name must be a non-empty string, got {name!r}")
        if not callable(func):
            raise ScheduleError(f"job {name!r}: task {func!r} is not callable")
        # hasattr, not isinstance(Schedule): a runtime Protocol check costs ~20 us a job.
        if type(schedule) is not IntervalSchedule and not callable(
            getattr(schedule, "next_after", None)
        ):
            raise ScheduleError(
                f"job {name!r}: schedule {schedule!r} has no next_after(); build one "
                "with cronlock.cron(), every(), daily(), weekly(), monthly() or once()"
            )
        if overlap not in OVERLAPS:
            raise ScheduleError(
                f"job {name!r}: overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}"
            )
        last = _last_durations
        if not (
            timeout is last[0]
            and jitter is last[1]
            and misfire_grace is last[2]
            and alert_after is last[3]
        ):  # else: the very objects the last job was given, checked then
            _check_durations(name, timeout, jitter, misfire_grace, alert_after)
        self.timeout, self.jitter, self.misfire_grace, self.alert_after = last[5:]
        if recover is not False and recover is not True:
            raise ScheduleError(f"job {name!r}: recover must be True or False, got {recover!r}")
        if max_runs is not None:
            positive_int(max_runs, field="max_runs", owner=f"job {name!r}", error=ScheduleError)
        if start_at is not None:
            start_at = to_utc(start_at, field=f"job {name!r}: start_at")
        if stop_at is not None:
            stop_at = to_utc(stop_at, field=f"job {name!r}: stop_at")
            if start_at is not None and stop_at < start_at:
                raise ScheduleError(
                    f"job {name!r}: stop_at {stop_at.isoformat()} is before "
                    f"start_at {start_at.isoformat()}"
                )
        self.name, self.func, self.args, self.kwargs, self.tags = name, func, args, kwargs, tags
        self.overlap, self.max_runs, self.start_at, self.stop_at = (
            overlap,
            max_runs,
            start_at,
            stop_at,
        )
        self.distributed, self.locker, self.recover = distributed, locker, recover
        if func is not _last_func[0]:
            target = func
            while isinstance(target, functools.partial):
                target = target.func
            _last_func[:] = (
                func,
                inspect.iscoroutinefunction(target)
                or inspect.iscoroutinefunction(
                    getattr(target, "__call__", None)  # noqa: B004 - async callable objects
                ),
                _context_parameter(func),
            )
        self._is_async, self._context_param = _last_func[1], _last_func[2]
        self._scheduler = None
        self._wiring = _UNWIRED
        self._state = RunState()
        self._task_name = task_name("run", name)
        self.set_schedule(schedule)

    # -- run state (read-only; see cronlock._state) --------------------------------

    @property
    def next_run(self) -> datetime | None:
        """The next slot this replica will fire (aware UTC), or None when paused or exhausted."""
        return self._state.next_run

    @property
    def last_run(self) -> RunRecord | None:
        """The most recent finished run (fleet-wide when the locker keeps a ledger)."""
        return self._state.last_run()

    @property
    def last_success(self) -> RunRecord | None:
        """The most recent successful run (fleet-wide when the locker keeps a ledger)."""
        return self._state.last_success()

    @property
    def run_count(self) -> int:
        """How many runs started on this replica."""
        return self._state.run_count

    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._state.paused

    @property
    def running(self) -> bool:
        """True while at least one run of this job is in flight on this replica."""
        return self._state.active > 0

    # -- schedule maths ------------------------------------------------------------

    def set_schedule(self, schedule: Schedule) -> None:
        """Replace the schedule (history stays) and refresh what is derived from it."""
        self.schedule = schedule
        seen = _texts.get(id(schedule))  # by identity: no __hash__ call for a shared schedule
        self._schedule_text = (
            seen[1] if seen is not None and seen[0] is schedule else _text(schedule)
        )
        self._grid_step = schedule.interval if type(schedule) is IntervalSchedule else None

    def following(self, slot: datetime) -> datetime | None:
        """The slot after *slot*, itself a slot of this job (the run loop's hot path)."""
        step = self._grid_step
        if step is None:
            return self.slot_after(slot)
        nxt = slot + step
        if self.stop_at is not None and nxt > self.stop_at:
            return None
        return nxt

    def slot_after(self, after: datetime) -> datetime | None:
        """The job's first slot strictly after *after*, honouring start_at and stop_at."""
        if self.start_at is not None and after < self.start_at:
            after = self.start_at - timedelta(microseconds=1)
        slot = self.schedule.next_after(after)
        if slot is None or (self.stop_at is not None and slot > self.stop_at):
            return None
        return slot

    def fire_time(self, slot: datetime) -> datetime:
        """When *slot* fires: the slot itself, delayed by the deterministic jitter."""
        if self.jitter:
            return slot + jitter_offset(self.name, slot, self.jitter)
        return slot

    def next_runs(self, n: int, *, after: datetime | None = None) -> list[datetime]:
        """The next *n* slots after *after* (default: the next run, inclusive)."""
        out: list[datetime] = []
        if after is None:
            planned = self._state.next_run
            if planned is None:
                if self._scheduler is None or self._state.paused:
                    return out
                after = self._scheduler.clock.now()
            else:
                out.append(planned)
                after = planned
        current: datetime | None = after
        while len(out) < n and current is not None:
            current = self.slot_after(current)
            if current is not None:
                out.append(current)
        return out[:n]

    # -- state and control -----------------------------------------------------------

    @property
    def coordinated(self) -> bool:
        """True when runs go through the elector and locker (if the scheduler has them)."""
        return self.distributed

    def pause(self) -> None:
        """Stop firing this job until :meth:`resume`; a run in flight goes on."""
        self._require_scheduler().pause_job(self)

    def resume(self) -> None:
        """Fire again from the next slot after now; slots missed while paused are not run."""
        self._require_scheduler().resume_job(self)

    async def run_now(self) -> JobEvent:
        """Run the job once now, without shifting its schedule; return the final event.

        The run goes through the same overlap, lock and timeout handling as a scheduled
        one; its slot is the instant of the request.
        """
        return await self._require_scheduler().run_job_now(self)

    def _require_scheduler(self) -> Controller:
        if self._scheduler is None:
            raise SchedulerStateError(f"job {self.name!r} is not registered with a scheduler")
        return self._scheduler

    # -- invoking the task ---------------------------------------------------------

    def call(self, slot: datetime, started: datetime, number: int) -> Awaitable[object]:
        """Start the task for run *number* of *slot*; plain functions go to a worker thread."""
        # The run loop's hot path: no dict for a task without keyword arguments, and no
        # typing.cast (a function call per run).
        kwargs = self.kwargs
        param = self._context_param
        if param is not None:
            context = run_context(self.name, slot, started, number)
            kwargs = {**kwargs, param: context} if kwargs else {param: context}
        if not self._is_async:
            return in_thread(functools.partial(self.func, *self.args, **kwargs))
        if kwargs:
            return self.func(*self.args, **kwargs)  # type: ignore[return-value]
        return self.func(*self.args)  # type: ignore[return-value]


def default_name(func: Callable[..., object]) -> str:
    """``module.qualname`` of a function (what ``name=None`` means)."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    module = getattr(target, "__module__", None) or "<unknown>"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def normalise_tags(tags: str | Iterable[str] | None) -> frozenset[str]:
    """Accept one tag or an iterable of them."""
    if tags is None:
        return NO_TAGS
    if isinstance(tags, str):
        return frozenset((tags,))
    return frozenset(tags)
