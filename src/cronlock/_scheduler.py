"""The public Scheduler: job registration, decorators, the verbs on one job, the fleet-wide
views, the tasks stored schedules may name, lifecycle, introspection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, time, tzinfo
from types import MappingProxyType, TracebackType
from typing import Any, Literal, Never, TypeVar, Unpack, overload

from ._clock import Clock
from ._core.fleetclock import on_loop_time, scheduler_clock
from ._core.fleetstate import FleetState
from ._core.job import Job, default_name, new_job
from ._core.recovery import Recovery
from ._core.runloop import RunLoop
from ._core.settings import (
    DEFAULT_DELAY,
    JobOptions,
    Recall,
    check_option_names,
    with_catch_up,
    with_retries,
)
from ._core.wiring import Wiring, checkable, wire
from ._durations import Seconds, optional_seconds, positive_int, to_seconds
from ._errors import (
    ConfigError,
    JobConflictError,
    JobLookupError,
    LockUnavailable,
    SchedulerStateError,
)
from ._events import (
    Event,
    EventBus,
    JobEvent,
    Listener,
    SchedulerStarted,
    SchedulerStopped,
    Subscription,
)
from ._keys import job_lock_key
from ._locking.protocols import CheckableLocker, Elector, Locker, check_retention
from ._logs import get_logger
from ._names import unknown_job
from ._records import DEFAULT_MISFIRE_GRACE, CatchUpPolicy, Overlap
from ._resources import Resources
from ._schedules.interval import IntervalSchedule
from ._schedules.schedule import MIN_INTERVAL, Schedule, bind_zone, check_interval, check_jitter
from ._schedules.tz import TimeZone, resolve_tz
from ._stored.decode import warm_up
from ._stored.limits import DEFAULT_MIN_INTERVAL
from ._stored.schedule import ScheduleStore
from ._stored.sync import StoredSync

__all__ = ("JobOptions", "Scheduler", "job_named")

_logger = get_logger("cronlock")
_F = TypeVar("_F", bound=Callable[..., object])
_UNSET = object()  # no job wired yet


def job_named(jobs: Mapping[str, Job], job: Job | str, *, field: str = "job") -> Job:
    """The registered job *job* names (a name, or the :class:`~cronlock.Job` itself).

    Raises :class:`~cronlock.JobLookupError` for a name not registered (the message of
    :func:`unknown_job`) and for a job registered with another scheduler, or removed;
    :class:`TypeError` for anything else.
    """
    if isinstance(job, Job):
        if jobs.get(job.name) is not job:
            raise JobLookupError(f"job {job.name!r} is not registered with this scheduler")
        return job
    if not isinstance(job, str):
        raise TypeError(f"{field} must be a Job or a job's name, got {job!r}")
    found = jobs.get(job)
    if found is None:
        raise JobLookupError(unknown_job(job, jobs))
    return found


class Scheduler:
    """Runs async (and plain) functions on schedules; coordinates replicas through a locker.

    Use it as an async context manager (``async with scheduler:``), or call
    :meth:`start` and :meth:`shutdown`. Jobs are registered with the decorators
    (:meth:`cron`, :meth:`every`, :meth:`daily`, :meth:`weekly`, :meth:`monthly`,
    :meth:`once`) or :meth:`add_job`, before or after starting.

    *tz* is the zone of wall-clock schedules created without their own (default UTC,
    never the host's zone). *max_concurrent* caps the runs in flight; due runs past the
    cap wait in slot order. *stop_timeout* is how long :meth:`shutdown` waits for runs in
    flight before cancelling them. *default_timeout* applies to jobs without ``timeout``.
    *locker* coordinates every job not registered with ``distributed=False``; *elector*
    restricts coordinated jobs to the leader replica. *on_lock_lost* says what happens to a
    run whose lock is lost mid-run (its database session died): ``"cancel"`` it (default;
    event ``LockLost``) or let it ``"continue"`` (logged at ERROR). *fleet_clock*: fire by the
    locker's server clock (default with PostgreSQL: see docs/coordination.md, "Fleet time").
    *sync_every*: seconds between two reads of the stored schedules, when the locker keeps
    them (``PostgresLocker``; see :meth:`task` and docs/guides/stored-schedules.md).
    *stored_min_interval*: the shortest gap in seconds two slots of a stored schedule may
    have here; one with a shorter gap is rejected, as a row past any other limit is (set
    it as the ``FleetControl(min_interval=)`` that stores them; 1 s by default).
    *idempotency_namespace*: what keeps this service's idempotency keys
    (:attr:`RunContext.idempotency_key <cronlock.RunContext.idempotency_key>`, for handing
    slots off to a queue) apart from another service's on a shared broker; by default the
    name of each job's ledger (``PostgresLocker``: its table, ``schema.table`` with a
    schema), or ``""`` without one (docs/guides/queues.md).

    **Naming a job.** The verbs on one job (:meth:`get_job`, :meth:`remove`,
    :meth:`update`, :meth:`pause_job`, :meth:`resume_job`, :meth:`run_job_now`, and the
    fleet-wide views) take a :class:`~cronlock.Job` or its name. A name no job of this
    scheduler has is refused with :class:`~cronlock.JobLookupError` (``unknown job: NAME
    (did you mean OTHER?)``), as is a job of another scheduler.

    **Ownership.** The scheduler closes the lockers and electors it was given (and the jobs'
    ``locker=``) when it shuts down, unless one is held open with ``async with`` (then that
    block closes it): after ``async with scheduler:`` nothing cronlock opened or borrowed is
    still held, and closing the pool it borrowed from returns at once.
    """

    def __init__(
        self,
        *,
        tz: TimeZone | tzinfo | None = "UTC",
        max_concurrent: int | None = None,
        stop_timeout: Seconds = 30.0,
        default_timeout: Seconds | None = None,
        clock: Clock | None = None,
        locker: Locker | None = None,
        elector: Elector | None = None,
        on_lock_lost: Literal["cancel", "continue"] = "cancel",
        fleet_clock: bool | None = None,
        sync_every: Seconds = 2.0,
        stored_min_interval: Seconds = DEFAULT_MIN_INTERVAL,
        idempotency_namespace: str | None = None,
    ) -> None:
        self._tz = resolve_tz(tz)
        if idempotency_namespace is not None and not (
            isinstance(idempotency_namespace, str) and idempotency_namespace.isprintable()
        ):
            raise ConfigError(
                "Scheduler: idempotency_namespace must be a string of printable characters, "
                f"got {idempotency_namespace!r}"
            )
        self._namespace = idempotency_namespace
        if max_concurrent is not None:
            max_concurrent = positive_int(max_concurrent, field="max_concurrent", owner="Scheduler")
        self._max_concurrent = max_concurrent
        self._stop_timeout = to_seconds(
            stop_timeout, field="stop_timeout", allow_zero=True, error=ConfigError
        )
        self._default_timeout = optional_seconds(
            default_timeout, field="default_timeout", error=ConfigError
        )
        self._clock: Clock = scheduler_clock(clock, locker, fleet_clock)
        self._locker = locker
        self._elector = elector
        self._resources = Resources()
        self._wirings: dict[tuple[bool, int], Wiring] = {}
        self._last_wiring: tuple[object, Wiring] = (_UNSET, Wiring())  # (JobSettings, its)
        self._resources.add(locker)
        self._resources.add(elector)
        # The lockers checked at start (CheckableLocker): the scheduler's, and each job's own.
        self._checks: dict[int, CheckableLocker] = {}
        self._add_check(checkable(locker))
        if on_lock_lost not in ("cancel", "continue"):
            raise ConfigError(
                f"Scheduler: on_lock_lost must be 'cancel' or 'continue', got {on_lock_lost!r}"
            )
        self._on_lock_lost = on_lock_lost
        self._bus = EventBus()
        self._jobs: dict[str, Job] = {}
        self._recall = Recall()  # this scheduler's last registration, for the next one
        self._keys: dict[int, str] = {}  # lock keys of the jobs that take a lock
        self._loop: RunLoop | None = None
        # Told by crash-watching lockers of runs whose replica died (recover=True reruns).
        self._recovery = Recovery(
            jobs=self._jobs, clock=self._clock, bus=self._bus, loop=lambda: self._loop
        )
        self._fleet = FleetState(self._jobs, lambda: self._loop, self._default_timeout)
        self._sync_every = to_seconds(sync_every, field="sync_every", error=ConfigError)
        self._stored_min_interval = to_seconds(
            stored_min_interval, field="stored_min_interval", allow_zero=True, error=ConfigError
        )
        self._tasks: dict[str, Callable[..., object]] = {}
        self._stored: StoredSync | None = None

    # -- properties ------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        """The clock the scheduler reads and sleeps on."""
        return self._clock

    @property
    def tz(self) -> Any:
        """The default zone of wall-clock schedules (a ``ZoneInfo``)."""
        return self._tz

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`shutdown`."""
        return self._loop is not None

    @property
    def jobs(self) -> tuple[Job, ...]:
        """Every registered job, in registration order."""
        return tuple(self._jobs.values())

    # -- registration ------------------------------------------------------------------

    def add_job(
        self,
        /,
        func: Callable[..., object],
        schedule: Schedule,
        *,
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        tags: str | Iterable[str] | None = None,
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
        retries: int = 0,
        retry_delay: Seconds = DEFAULT_DELAY,
        catch_up: CatchUpPolicy = "latest",
        **unknown: Never,
    ) -> Job:
        """Register *func* to run on *schedule*; return the :class:`~cronlock.Job`.

        The options are :class:`~cronlock.JobOptions` (the decorators take them too).
        Everything is checked here, so a typo fails at startup, not at the first firing.
        """
        name = name or default_name(func)
        if unknown:  # (a type checker flags them: Never)
            check_option_names(name, unknown)
        if name in self._jobs:
            raise JobConflictError(f"a job named {name!r} is already registered")
        if type(schedule) is not IntervalSchedule:  # bind_zone() returns those as they are
            schedule = bind_zone(schedule, self._tz)
        elif schedule.interval < MIN_INTERVAL:  # only these can be too fine: one call fewer
            check_interval(name, schedule)  # raises
        job = new_job(
            func,
            schedule,
            name,
            args,
            kwargs,
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
            self,
            self._recall,
        )
        if retries or retry_delay is not DEFAULT_DELAY:  # (most jobs have none: one test)
            job._settings = with_retries(job._settings, name, retries, retry_delay)
        if catch_up != "latest":  # (most jobs coalesce: one test)
            job._settings = with_catch_up(job._settings, name, catch_up)
        settings = job._settings
        if settings.jitter:  # shorter than the gap between two slots, or the job is not kept
            check_jitter(name, schedule, settings.jitter)
        last = self._last_wiring  # the last job's: jobs registered in a row share settings
        wiring = last[1] if last[0] is settings else None
        if wiring is None:
            wiring = self._wire(settings.distributed, settings.locker)
            self._last_wiring = (settings, wiring)
        if wiring.retention is not None:  # its slots stay claimable for less than that
            check_retention(name, settings.jitter, settings.misfire_grace, wiring.retention)
        # Only a job that takes a lock on an FNV-1a key has one to check: an FNV-1a in
        # Python costs more than the rest of a job's validation, a job that never locks
        # cannot contend for its key, and a keyed locker's keys are not these.
        key = None
        if wiring.locker is not None and wiring.fnv_keys:
            key = job_lock_key(name)
            other = self._keys.get(key)
            if other is not None:
                raise JobConflictError(
                    f"jobs {other!r} and {name!r} have the same lock key {key}; rename one"
                )
        job._wiring = wiring
        self._jobs[name] = job
        if key is not None:
            self._keys[key] = name
        if self._loop is not None:
            now = self._clock.now()
            self._fleet.added(job, now)
            self._loop.schedule(job, now)
        return job

    def _wire(self, distributed: bool, locker: Locker | None) -> Wiring:
        """The Wiring of jobs with *distributed* and *locker*: one for all jobs alike."""
        alike = (distributed, id(locker))
        wiring = self._wirings.get(alike)
        if wiring is None:
            self._resources.add(locker)
            wiring = self._wirings[alike] = wire(
                distributed=distributed,
                own=locker,
                default=self._locker,
                elector=self._elector,
                namespace=self._namespace,
            )
            # Once per Wiring: both register once per locker, and jobs alike share it.
            self._recovery.watch(wiring)
            self._fleet.watch(wiring)
            self._add_check(wiring.check)
        return wiring

    def _add_check(self, locker: CheckableLocker | None) -> None:
        if locker is not None:
            self._checks.setdefault(id(locker), locker)

    def _decorator(self, schedule: Schedule, options: JobOptions) -> Callable[[_F], _F]:
        def register(func: _F) -> _F:
            self.add_job(func, schedule, **options)
            return func

        return register

    def cron(
        self,
        expr: str,
        *,
        seconds: bool = False,
        tz: TimeZone | None = None,
        **options: Unpack[JobOptions],
    ) -> Callable[[_F], _F]:
        """Decorator: run on a cron expression (see :func:`cronlock.cron`)."""
        from ._schedules.cron import cron

        return self._decorator(cron(expr, seconds=seconds, tz=tz), options)

    def every(
        self,
        interval: Seconds | None = None,
        *,
        seconds: float = 0,
        minutes: float = 0,
        hours: float = 0,
        days: float = 0,
        anchor: datetime | None = None,
        **options: Unpack[JobOptions],
    ) -> Callable[[_F], _F]:
        """Decorator: run at ``anchor + k * interval`` (see :func:`cronlock.every`)."""
        from ._schedules.interval import every

        schedule = every(
            interval, seconds=seconds, minutes=minutes, hours=hours, days=days, anchor=anchor
        )
        return self._decorator(schedule, options)

    def daily(
        self,
        at: str | time | Sequence[str | time] = "03:00",
        *,
        every: int = 1,
        tz: TimeZone | None = None,
        **options: Unpack[JobOptions],
    ) -> Callable[[_F], _F]:
        """Decorator: run every *every* days at *at* (see :func:`cronlock.daily`)."""
        from ._schedules.calendar import daily

        return self._decorator(daily(at, every=every, tz=tz), options)

    def weekly(
        self,
        on: str | int | Sequence[str | int] = "mon",
        at: str | time | Sequence[str | time] = "03:00",
        *,
        every: int = 1,
        tz: TimeZone | None = None,
        **options: Unpack[JobOptions],
    ) -> Callable[[_F], _F]:
        """Decorator: run on weekday(s) *on* at *at* (see :func:`cronlock.weekly`)."""
        from ._schedules.calendar import weekly

        return self._decorator(weekly(on, at, every=every, tz=tz), options)

    def monthly(
        self,
        on: int | Sequence[int] = 1,
        at: str | time | Sequence[str | time] = "03:00",
        *,
        every: int = 1,
        tz: TimeZone | None = None,
        **options: Unpack[JobOptions],
    ) -> Callable[[_F], _F]:
        """Decorator: run on day(s) *on* of the month at *at* (see :func:`cronlock.monthly`)."""
        from ._schedules.calendar import monthly

        return self._decorator(monthly(on, at, every=every, tz=tz), options)

    def once(
        self, at: datetime | Sequence[datetime] | None = None, **options: Unpack[JobOptions]
    ) -> Callable[[_F], _F]:
        """Decorator: run once at *at* (or at each instant given), or as soon as started."""
        from ._schedules.once import once

        return self._decorator(once(at), options)

    # -- stored schedules' tasks ------------------------------------------------------------

    @overload
    def task(self, name: _F, /) -> _F: ...

    @overload
    def task(self, name: str | None = None, /) -> Callable[[_F], _F]: ...

    def task(self, name: str | _F | None = None, /) -> _F | Callable[[_F], _F]:
        """Decorator: make a function a task that stored schedules may name.

        ``@scheduler.task("send-report")`` names it; bare ``@scheduler.task`` uses its
        ``module.qualname``. The function takes what a job's function takes (a
        :class:`~cronlock.RunContext` where annotated, then the schedule's kwargs). A
        stored schedule naming a task no replica has is reported, never silently idle.
        """
        if callable(name):
            return self._add_task(name, None)

        def register(func: _F) -> _F:
            return self._add_task(func, name)

        return register

    def _add_task(self, func: _F, name: str | None) -> _F:
        key = default_name(func) if name is None else name
        if not isinstance(key, str) or not key:
            raise ConfigError(f"task: name must be a non-empty string, got {key!r}")
        other = self._tasks.get(key)
        if other is not None and other is not func:
            raise JobConflictError(f"a task named {key!r} is already registered ({other!r})")
        self._tasks[key] = func
        return func

    @property
    def tasks(self) -> Mapping[str, Callable[..., object]]:
        """The tasks stored schedules may name, by name (read-only)."""
        return MappingProxyType(self._tasks)

    @property
    def stored_jobs(self) -> tuple[str, ...]:
        """The names of the jobs registered here from stored schedules, sorted."""
        return tuple(sorted(self._stored.applied)) if self._stored is not None else ()

    # -- control -------------------------------------------------------------------------

    def subscribe(self, callback: Listener, *event_types: type[Event]) -> Subscription:
        """Call *callback* (sync or async) with each event of *event_types* (default: all).

        A callback that raises is logged and never disturbs a run.
        """
        return self._bus.add(callback, event_types)

    def get_job(self, name: str | Job) -> Job:
        """The job called *name*; raises :class:`~cronlock.JobLookupError` if none."""
        return job_named(self._jobs, name, field="name")

    def remove(self, job: str | Job) -> None:
        """Unregister a job; a run of it in flight goes on to its end."""
        found = job_named(self._jobs, job)
        if self._loop is not None:
            self._loop.unschedule(found)
        found._forget_plan()
        del self._jobs[found.name]
        self._fleet.forget(found.name)
        if found._wiring.locker is not None and found._wiring.fnv_keys:  # it has a key here
            del self._keys[job_lock_key(found.name)]
        found._scheduler = None

    def remove_by_tags(self, *tags: str) -> list[Job]:
        """Unregister every job carrying any of *tags*; return them."""
        wanted = set(tags)
        removed = [job for job in self._jobs.values() if job.tags & wanted]
        for job in removed:
            self.remove(job)
        return removed

    def update(self, name: str | Job, schedule: Schedule) -> Job:
        """Give job *name* a new schedule, keeping its history and options."""
        job = job_named(self._jobs, name, field="name")
        check_interval(job.name, schedule)
        job.set_schedule(check_jitter(job.name, bind_zone(schedule, self._tz), job.jitter))
        if self._loop is not None and not job.paused:
            self._loop.schedule(job, self._clock.now())
        return job

    def pause_job(self, job: str | Job) -> None:
        """Stop firing *job* (same as ``job.pause()``)."""
        found = job_named(self._jobs, job)
        found._halt()
        if self._loop is not None:
            self._loop.unschedule(found)

    def resume_job(self, job: str | Job) -> None:
        """Fire *job* again from its next slot after now (same as ``job.resume()``)."""
        found = job_named(self._jobs, job)
        if not found.paused:
            return
        found._unhalt()
        if self._loop is not None:
            self._loop.schedule(found, self._clock.now())

    async def run_job_now(self, job: str | Job) -> JobEvent:
        """Run *job* once now, here (same as ``await job.run_now()``); return its final
        event. Not marked manual in a ledger: a fleet-wide trigger
        (:meth:`cronlock.postgres.FleetControl.trigger`) is."""
        found = job_named(self._jobs, job)
        if self._loop is None:
            raise SchedulerStateError(f"job {found.name!r}: run_now() needs a started scheduler")
        waiter: asyncio.Future[JobEvent] = asyncio.get_running_loop().create_future()
        self._loop.dispatch(found, self._clock.now(), waiter)
        return await waiter

    # -- fleet-wide views -------------------------------------------------------------------

    def overdue(self) -> tuple[Job, ...]:
        """The jobs that stopped: a slot fell due more than the job's grace ago and no run
        of it or of a later slot succeeded (anywhere in the fleet, with a run ledger).

        The grace is the job's ``alert_after``, by default its ``misfire_grace`` plus its
        timeout. A job that never succeeded is judged from the scheduler's start. Paused
        jobs (here or fleet-wide) are never overdue.
        """
        return self._fleet.overdue(self._clock.now())

    def without_success_since(self, job: Job | str) -> datetime | None:
        """Since when *job* (a job or its name) has gone without a success: when its latest
        successful run ended (anywhere in the fleet, with a run ledger), or, if it never
        succeeded, when it was first seen: with a ledger, when a replica first noted it
        there (so the instant survives restarts; learned with the fleet's latest runs,
        read every 15 s: the scheduler's start until then), else when this scheduler
        started. ``None`` before the scheduler started. Computed from memory, no I/O.

        Unlike :meth:`overdue`, which counts from a slot falling due, this is the rule "no
        success in N days": ``now - without_success_since(job) > N days``, whatever the
        schedule. An unknown name raises :class:`~cronlock.JobLookupError`.
        """
        return self._fleet.without_success_since(job_named(self._jobs, job))

    def paused_fleet_wide(self, job: Job | str) -> bool:
        """Whether *job* (a job or its name) is paused on every replica
        (``cronlock.postgres.FleetControl``), as of its locker's last read, about a second
        old. An unknown name raises :class:`~cronlock.JobLookupError`."""
        return self._fleet.paused(job_named(self._jobs, job))

    def in_conflict(self, job: Job | str) -> bool:
        """Whether other live replicas of *job*'s ledger (a job or its name) define a job
        of that name otherwise, another function or schedule: two services sharing one
        ledger, or a rolling deploy that changed it, until its old replicas stop. As of its
        locker's last read, at most about 15 seconds old; ``False`` without a ledger. An
        unknown name raises :class:`~cronlock.JobLookupError`."""
        return self._fleet.in_conflict(job_named(self._jobs, job))

    def rejected_schedules(self) -> frozenset[str]:
        """The stored schedules (``FleetControl.add_schedule``) of this scheduler's ledger
        that every live replica rejected: no replica has the task, or the kwargs fit it
        nowhere, so none runs them (status ``rejected``). As of its locker's last read,
        every 15 s or so (one statement); empty without a run ledger, and before the first
        read. What the gauge ``cronlock_schedule_rejected`` reports."""
        return self._fleet.rejected()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start firing jobs; returns once running. Raises if already started.

        First each locker that can (:class:`~cronlock.CheckableLocker`, such as
        ``PostgresLocker``) is checked, one connection each, which it keeps: one that can
        never work as configured raises its :class:`~cronlock.LockerMisconfigured` (a
        :class:`~cronlock.LockError` naming the fix) and the scheduler does not start
        (what it was given is closed, as a shutdown would); one whose server is only
        unreachable logs a WARNING, and the scheduler starts and catches up once it is back.
        """
        if self._loop is not None:
            raise SchedulerStateError("the scheduler is already running")
        self._resources.check_open()
        await self._check_lockers()
        store = self._stored_store()
        self._loop = RunLoop(
            clock=self._clock,
            # Decided once: the real clock sleeps on event-loop timers, a virtual one on itself.
            loop_time=on_loop_time(self._clock),
            bus=self._bus,
            max_concurrent=self._max_concurrent,
            jobs=self._jobs,
            elector=self._elector,
            default_timeout=self._default_timeout,
            cancel_on_lock_loss=self._on_lock_lost == "cancel",
        )
        self._fleet.started(self._clock.now())
        active = [job for job in self._jobs.values() if not job._paused]
        self._loop.plan_all(active, self._clock.now())
        # Only jobs whose locker keeps a ledger catch up: none without such a wiring.
        ledgers = any(wiring.ledger is not None for wiring in self._wirings.values())
        self._loop.start(catch_up=active if ledgers else ())
        if store is not None:
            # The stored schedules are read and registered with the run loop going: the
            # jobs in code keep their slots while 100,000 of them are (in slices), and
            # each is planned as it is registered, then caught up like the others.
            await self._load_stored(store, catch_up=ledgers)
            if self._stored is not None:
                self._stored.start()
        _logger.info("scheduler started with %d job(s)", len(self._jobs))
        self._bus.emit(SchedulerStarted())

    async def _check_lockers(self) -> None:
        """Check each locker that can tell whether it works (one connection each, which it
        keeps for its claims). One that never will as configured fails the start, after
        the scheduler closed what it was given (as a shutdown would); one whose server is
        only down does not: its jobs' slots are claimed once it is back, within their
        ``misfire_grace``."""
        for locker in self._checks.values():
            try:
                await locker.check()
            except LockUnavailable as exc:
                _logger.warning(
                    "starting although %r cannot reach its server (%s); its jobs' slots "
                    "are claimed once it is back",
                    locker,
                    exc,
                )
            except BaseException:
                await self._resources.close()
                raise

    def _stored_store(self) -> ScheduleStore | None:
        """The scheduler's locker when it keeps stored schedules and tasks may run them
        (wired for the fleet's reads: rejected everywhere is read there); else None."""
        store = self._locker
        if not self._tasks or not isinstance(store, ScheduleStore):
            return None
        # The fleet's reads, with no job of our own too: rejected everywhere is read there.
        self._wire(True, None)
        return store

    async def _load_stored(self, store: ScheduleStore, *, catch_up: bool) -> None:
        """Register every stored schedule (one read, applied in slices while the run loop
        goes on), then catch the new jobs up; a failed read is logged and the sync tries
        again."""
        if self._stored is None:
            self._stored = StoredSync(
                self,
                self._tasks,
                store,
                self._clock,
                self._bus,
                self._sync_every,
                self._stored_min_interval,
            )
        stored = self._stored
        stored.added = []
        await asyncio.to_thread(warm_up)  # the imports decoding may need, off the loop
        try:
            await stored.sync()
        except Exception as exc:  # the start goes on: the sync reads them again, alone
            _logger.error("reading the stored schedules failed: %r; retrying", exc)
        added, stored.added = stored.added, None
        if catch_up and added and self._loop is not None:
            self._loop.catch_up(added, self._clock.now())

    async def shutdown(self, timeout: Seconds | None = None) -> None:
        """Stop firing; wait up to *timeout* (default ``stop_timeout``) for runs in flight,
        then cancel them and wait for their cleanup; then close the lockers and electors it
        was given, except those held open with ``async with``. Calling it twice is harmless.
        """
        loop, self._loop = self._loop, None
        if loop is None:
            return
        wait = optional_seconds(timeout, field="timeout", allow_zero=True)
        if self._stored is not None:
            await self._stored.stop()
        await loop.stop(self._stop_timeout if wait is None else wait)
        await self._bus.drain()
        await self._resources.close()
        _logger.info("scheduler stopped")
        self._bus.emit(SchedulerStopped())

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()
