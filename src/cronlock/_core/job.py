"""Jobs: a task bound to a schedule and options; its run state is read through properties.

The run state lives in the job's own slots, declared by its base
:class:`cronlock._core.state.RunState`, whose methods are the only code that changes it. What
the options are checked into is shared by jobs alike (:mod:`cronlock._core.settings`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from .._clock import Clock
from .._durations import Seconds
from .._errors import ScheduleError, SchedulerStateError
from .._events import JobEvent
from .._locking.protocols import Locker
from .._names import check_job_name
from .._records import CatchUpPolicy, Overlap, RunRecord, run_context
from .._schedules.interval import IntervalSchedule
from .._schedules.schedule import Schedule
from .._threads import in_thread
from .settings import NO_KWARGS, NO_TAGS, JobSettings, Recall, normalise_tags, settle, slot_after
from .state import RunState, fresh
from .tasks import Shape, task_shape
from .wiring import Wiring


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
    "new_job",
    "normalise_tags",
)

# Jobs not yet wired share this one (Wiring is frozen); add_job sets the real one.
_UNWIRED = Wiring()


def jitter_offset(name: str, slot: datetime, jitter: float) -> timedelta:
    """A delay in ``[0, jitter)`` that every replica derives the same way from (name, slot)."""
    digest = hashlib.blake2b(f"{name}\x00{slot.isoformat()}".encode(), digest_size=8).digest()
    fraction = int.from_bytes(digest, "big") / 2**64
    return timedelta(microseconds=int(fraction * jitter * 1_000_000))


class Job(RunState):
    """A task registered with a :class:`~cronlock.Scheduler`.

    Read its state (``next_run``, ``last_run``, ``last_success``, ``running``,
    ``run_count``) and control it (``pause()``, ``resume()``, ``run_now()``). Created by
    ``Scheduler.add_job`` and the decorators, never directly.
    """

    # Slots for what is the job's own, its schedule, and what its task is (a tuple that
    # jobs given the same task share); its options in one JobSettings that jobs given the
    # same options share (every slot is one more store at registration and one more
    # reference the garbage collector follows, job by job). The run state's slots come
    # from RunState.
    __slots__ = (
        "_schedule",
        "_scheduler",
        "_settings",
        "_task",
        "_wiring",
        "args",
        "func",
        "kwargs",
        "name",
    )
    # Its public fields, in the order its repr (and a match statement) gives them.
    __match_args__ = (
        "name",
        "func",
        "schedule",
        "args",
        "kwargs",
        "tags",
        "timeout",
        "overlap",
        "jitter",
        "max_runs",
        "start_at",
        "stop_at",
        "misfire_grace",
        "distributed",
        "locker",
        "recover",
        "alert_after",
    )

    name: str
    func: Callable[..., object]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    # Derived once from the configuration (never run state).
    _scheduler: Controller | None
    # (is async, the RunContext parameter's name or None, its position in the call or None
    # for by keyword): the call shape, from the args checked at registration (_tasks)
    _task: Shape
    _schedule: Schedule
    _wiring: Wiring
    _settings: JobSettings

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__match_args__)
        return f"{type(self).__qualname__}({fields})"

    # -- options kept in records shared by jobs alike (read-only) ----------------------

    @property
    def timeout(self) -> float | None:
        """Seconds a run may take before it is cancelled (None: the scheduler's default)."""
        return self._settings.timeout

    @property
    def overlap(self) -> Overlap:
        """What a slot does while a run of this job is in flight (``"skip"``, ...)."""
        return self._settings.overlap

    @property
    def jitter(self) -> float | None:
        """Seconds of deterministic delay at most after each slot, if given."""
        return self._settings.jitter

    @property
    def max_runs(self) -> int | None:
        """Runs on this replica after which the job stops firing, if given."""
        return self._settings.max_runs

    @property
    def misfire_grace(self) -> float | None:
        """Seconds a slot may be late and still run (None: any lateness)."""
        return self._settings.misfire_grace

    @property
    def schedule(self) -> Schedule:
        """When the job runs (replace it with :meth:`Scheduler.update`)."""
        return self._schedule

    @property
    def stop_at(self) -> datetime | None:
        """No slot after this instant (aware UTC), if given."""
        return self._settings.stop_at

    @property
    def tags(self) -> frozenset[str]:
        """The job's tags (see :meth:`Scheduler.remove_by_tags`)."""
        return self._settings.tags

    @property
    def start_at(self) -> datetime | None:
        """No slot before this instant (aware UTC), if given."""
        return self._settings.start_at

    @property
    def distributed(self) -> bool:
        """False for a job that runs on every replica, without the locker or elector."""
        return self._settings.distributed

    @property
    def locker(self) -> Locker | None:
        """The job's own locker, if given (else the scheduler's coordinates it)."""
        return self._settings.locker

    @property
    def retries(self) -> int:
        """How many times a failed or timed-out run of a slot is tried again (fleet-wide)."""
        return self._settings.retries

    @property
    def retry_delay(self) -> float:
        """Seconds before the first retry, doubled for each one after (jittered, capped)."""
        return self._settings.retry_delay

    @property
    def catch_up(self) -> CatchUpPolicy:
        """What runs of the slots it owes (several due at once): ``"latest"``, the latest
        within its grace (the older coalesce into it), or ``"all"``, each, in order."""
        return self._settings.catch_up

    @property
    def recover(self) -> bool:
        """Whether a run whose replica died mid-run is run again (crash-watching lockers)."""
        return self._settings.recover

    @property
    def alert_after(self) -> float | None:
        """How long after a slot fell due, with no success since, the job is overdue
        (default: ``misfire_grace`` + ``timeout``); see :meth:`Scheduler.overdue`."""
        return self._settings.alert_after

    # -- run state (read-only; cronlock._core.state changes it) ----------------------------

    @property
    def next_run(self) -> datetime | None:
        """The next slot this replica will fire (aware UTC), or None when paused or exhausted."""
        return self._next_run

    @property
    def last_run(self) -> RunRecord | None:
        """The most recent finished run (fleet-wide when the locker keeps a ledger)."""
        return self._last_run_record()

    @property
    def last_success(self) -> RunRecord | None:
        """The most recent successful run (fleet-wide when the locker keeps a ledger)."""
        return self._last_success_record()

    @property
    def run_count(self) -> int:
        """How many runs started on this replica."""
        return self._run_count

    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._paused

    @property
    def running(self) -> bool:
        """True while at least one run of this job is in flight on this replica."""
        return self._active > 0

    # -- schedule maths ------------------------------------------------------------

    def set_schedule(self, schedule: Schedule) -> None:
        """Replace the schedule (history stays)."""
        self._schedule = schedule

    def following(self, slot: datetime) -> datetime | None:
        """The slot after *slot*, itself a slot of this job (the run loop's hot path)."""
        schedule = self._schedule
        if type(schedule) is not IntervalSchedule:
            return self.slot_after(slot)
        nxt: datetime = slot + schedule.interval
        stop_at = self._settings.stop_at
        if stop_at is not None and nxt > stop_at:
            return None
        return nxt

    def slot_after(self, after: datetime) -> datetime | None:
        """The job's first slot strictly after *after*, honouring start_at and stop_at."""
        return slot_after(self._schedule, self._settings, after)

    def fire_time(self, slot: datetime) -> datetime:
        """When *slot* fires: the slot itself, delayed by the deterministic jitter."""
        jitter = self._settings.jitter
        if jitter:
            return slot + jitter_offset(self.name, slot, jitter)
        return slot

    def next_runs(self, n: int, *, after: datetime | None = None) -> list[datetime]:
        """The next *n* slots after *after* (default: the next run, inclusive)."""
        out: list[datetime] = []
        if after is None:
            planned = self._next_run
            if planned is None:
                if self._scheduler is None or self._paused:
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
        return self._settings.distributed

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

    def call(
        self, slot: datetime, started: datetime, number: int, attempt: int = 1
    ) -> Awaitable[object]:
        """Start the task for run *number* of *slot* (its try *attempt* at the slot); plain
        functions go to a worker thread."""
        # The run loop's hot path: no dict for a task without keyword arguments, and no
        # typing.cast (a function call per run). Where the context goes was settled when
        # the args were checked (_tasks.TaskInfo.check): nothing is looked up here.
        args, kwargs = self.args, self.kwargs
        is_async, param, at = self._task
        if param is not None:
            context = run_context(self.name, slot, started, number, attempt, self._wiring.namespace)
            if at is None:
                kwargs = {**kwargs, param: context} if kwargs else {param: context}
            elif at == 0:
                args = (context, *args)
            else:
                args = (*args[:at], context, *args[at:])
        if not is_async:
            return in_thread(functools.partial(self.func, *args, **kwargs))
        if kwargs:
            return self.func(*args, **kwargs)  # type: ignore[return-value]
        return self.func(*args)  # type: ignore[return-value]


def new_job(
    func: Callable[..., object],
    schedule: Schedule,
    name: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    tags: str | Iterable[str] | None,
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
    scheduler: Controller,
    recall: Recall,
) -> Job:
    """A :class:`Job` of *scheduler* with these options, each checked (raises
    :class:`~cronlock.ScheduleError` naming the job, the option and the value); what
    ``Scheduler.add_job`` registers.

    Written out, not generated, and with no ``__init__``: one call that checks each option
    and stores each field once (a service registering 100,000 jobs pays for every call
    and store here, and ``Job(...)`` would cost a call through the type more).
    """
    job = fresh(Job)  # its run state: nothing planned, nothing run
    if type(args) is not tuple:
        args = tuple(args)
    kwargs = dict(kwargs) if kwargs else NO_KWARGS
    tags = NO_TAGS if tags is None else normalise_tags(tags)
    check_job_name(name)  # a key of the ledger: refused here, not by its statements
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
    last = recall.settings  # one read: a registration in another thread replaces it whole
    if (
        tags is last.tags
        and timeout is last.timeout
        and overlap is last.overlap
        and jitter is last.jitter
        and max_runs is last.max_runs
        and start_at is last.start_at
        and stop_at is last.stop_at
        and misfire_grace is last.misfire_grace
        and distributed is last.distributed
        and locker is last.locker
        and recover is last.recover
        and alert_after is last.alert_after
        and last.settings is not None
    ):  # the very objects the last job was given, checked then
        settings = last.settings
    else:
        settings = settle(
            name,
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
            recall,
        )
    job._settings = settings
    job.name, job.func, job.args, job.kwargs = name, func, args, kwargs
    task = recall.task
    # The very task and count of args the last job had, no kwargs: checked then. This is
    # task_shape's own reuse test, written out for the common case; the two must agree.
    if (
        func is task.func
        and len(args) == task.arg_count
        and kwargs is NO_KWARGS
        and not task.kwarg_names
    ):
        job._task = task.shape
    else:
        job._task = task_shape(name, func, args, kwargs, recall)
    job._scheduler = scheduler
    job._wiring = _UNWIRED
    job._schedule = schedule
    return job


def default_name(func: Callable[..., object]) -> str:
    """``module.qualname`` of a function (what ``name=None`` means)."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    module = getattr(target, "__module__", None) or "<unknown>"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"
