"""What the fleet says about this scheduler's jobs: pauses, triggers, latest runs, overdue.

A locker that reads the fleet's shared state (:class:`~cronlock.FleetWatchingLocker`, the
PostgreSQL locker with its ledger) hands :class:`FleetState` a :class:`~cronlock.FleetView`
every second or so. FleetState keeps the jobs paused fleet-wide (for status views and
metrics; the locker itself refuses their claims) and those in conflict (other live replicas
define them otherwise: for metrics), starts the runs triggered fleet-wide (each one is
a slot claimed like any other, so one replica runs it), and copies the fleet's latest run
and success into each job, so that every replica, even one that never ran the job,
reports the fleet's last success, and keeps each job's first-seen instant in the ledger
and the stored schedules every live replica rejected (for metrics: no replica runs them).
The overdue rule and the "without success since" rule are written once here. (The time
the fleet shares, the database server's clock, is another module's: ``_fleetclock``.)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta

from .._events import JobEvent, JobSkipped, LockFailed
from .._locking.protocols import FleetView, FleetWatchingLocker, Health
from .._logs import at, get_logger
from .job import Job
from .runloop import RunLoop
from .settings import grace
from .wiring import Wiring

__all__ = ("FleetState", "grace")

_logger = get_logger("cronlock")
_REMEMBER = 256  # triggers already started, per locker (each is started once)


class FleetState:
    """The fleet callback of one scheduler, registered once with each locker that has one.

    *jobs* is the scheduler's registry (a live view), *loop* returns its run loop or
    ``None`` while it is not running (triggers are then left to other replicas).
    """

    __slots__ = (
        "_added",
        "_conflicts",
        "_default_timeout",
        "_dues",
        "_first_seen",
        "_jobs",
        "_loop",
        "_paused",
        "_rejected",
        "_since",
        "_started",
        "_watched",
    )

    def __init__(
        self,
        jobs: Mapping[str, Job],
        loop: Callable[[], RunLoop | None],
        default_timeout: float | None,
    ) -> None:
        self._jobs = jobs
        self._loop = loop
        self._default_timeout = default_timeout
        self._watched: dict[int, FleetWatchingLocker] = {}
        self._paused: dict[int, frozenset[str]] = {}
        # Per locker: its jobs that other live replicas of its ledger define otherwise.
        self._conflicts: dict[int, frozenset[str]] = {}
        self._rejected: dict[int, frozenset[str]] = {}  # per locker, as it last read them
        self._started: dict[int, dict[tuple[str, datetime], None]] = {}
        self._since: datetime | None = None
        # Per job of a locker with a ledger: when a replica first noted it there (so a job
        # that never succeeded is judged from then, across restarts, not from our start).
        self._first_seen: dict[str, datetime] = {}
        # Per job added while the scheduler ran (a stored schedule added at runtime): when.
        # Such a job is due from then, not from the scheduler's start.
        self._added: dict[str, datetime] = {}
        # Per job: (the instant its due slot was computed after, that slot). A schedule's
        # next_after can cost tens of microseconds (cron): computed again only when the
        # job's latest success moved, not on every scrape of 10,000 jobs.
        self._dues: dict[str, tuple[datetime, datetime | None]] = {}

    def watch(self, wiring: Wiring) -> None:
        """Register with the job's locker, if it reads the fleet (once per locker)."""
        locker = wiring.fleet
        if locker is None or id(locker) in self._watched:
            return
        key = id(locker)
        self._watched[key] = locker
        self._started[key] = {}
        locker.watch_fleet(functools.partial(self._seen, key), functools.partial(self._health, key))

    def started(self, now: datetime) -> None:
        """The scheduler started at *now*: a job that never succeeded is judged from then."""
        self._since = now

    def added(self, job: Job, now: datetime) -> None:
        """*job* was added at *now*, while the scheduler runs: it is not due before."""
        self._added[job.name] = now
        self._dues.pop(job.name, None)

    def forget(self, name: str) -> None:
        """The job *name* was removed: what was known of it goes (a job added again later
        under that name is due from then)."""
        for known in (self._added, self._dues, self._first_seen):
            known.pop(name, None)

    def paused(self, job: Job) -> bool:
        """Whether *job* is paused fleet-wide (as of its locker's last read)."""
        fleet = job._wiring.fleet
        return fleet is not None and job.name in self._paused.get(id(fleet), ())

    def in_conflict(self, job: Job) -> bool:
        """Whether other live replicas of *job*'s ledger define it otherwise (as of its
        locker's last read of them, at most about 15 seconds old)."""
        fleet = job._wiring.fleet
        return fleet is not None and job.name in self._conflicts.get(id(fleet), ())

    def rejected(self) -> frozenset[str]:
        """The stored schedules every live replica of a ledger rejected, as each locker
        last read them (see :meth:`cronlock.Scheduler.rejected_schedules`)."""
        found = self._rejected.values()
        return next(iter(found)) if len(found) == 1 else frozenset().union(*found)

    def _health(self, key: int) -> Mapping[str, Health]:
        return _HealthView(self, key)

    def due(self, job: Job) -> datetime | None:
        """The slot *job* is due by: its first slot after its latest success; if it never
        succeeded, after the ledger first noted it (else after the scheduler started), and
        never before it was added (a schedule added at runtime is not due from before its
        creation); ``None`` while paused or finished."""
        if job.paused or self.paused(job) or job._next_run is None:
            return None
        success = job.last_success
        since = success.slot if success is not None else self._never_succeeded(job.name)
        if since is None:
            return None
        cached = self._dues.get(job.name)
        if cached is not None and cached[0] == since:
            return cached[1]
        due = job.slot_after(since)
        self._dues[job.name] = (since, due)
        return due

    def _never_succeeded(self, name: str) -> datetime | None:
        """Since when a job that never succeeded has gone without: when the ledger first
        noted it (else the scheduler's start), and not before it was added."""
        since = self._first_seen.get(name, self._since)
        added = self._added.get(name)
        if added is not None and (since is None or added > since):
            return added
        return since

    def health(self, job: Job) -> Health:
        """*job*'s overdue grace and the slot it is due by."""
        return grace(job._settings, self._default_timeout), self.due(job)

    def _seen(self, key: int, view: FleetView) -> None:
        self._paused[key] = view.paused
        if view.conflicts is not None:
            self._conflicts[key] = frozenset(view.conflicts)
        if view.rejected is not None:
            self._rejected[key] = view.rejected
        if view.runs is not None:
            for name, (last, success) in view.runs.items():
                job = self._jobs.get(name)
                if job is not None and id(job._wiring.fleet) == key:
                    job._learn(last, success)
        if view.first_seen is not None:
            for name, seen in view.first_seen.items():
                job = self._jobs.get(name)
                if job is not None and id(job._wiring.fleet) == key:
                    self._first_seen[name] = seen
        loop = self._loop()
        if loop is None or not view.triggers:
            return
        started = self._started[key]
        for name, slot in view.triggers.items():
            job = self._jobs.get(name)
            if job is None or id(job._wiring.fleet) != key or job.paused:
                continue  # not ours, or paused here: another replica takes it
            if (name, slot) in started:
                continue
            started[(name, slot)] = None
            if len(started) > _REMEMBER:
                del started[next(iter(started))]
            _logger.info(
                "job %r: triggered fleet-wide; claiming slot %s",
                name,
                slot.isoformat(),
                extra=at(name, slot),
            )
            waiter: asyncio.Future[JobEvent] = asyncio.get_running_loop().create_future()
            waiter.add_done_callback(functools.partial(self._tried, started, (name, slot)))
            loop.dispatch(job, slot, waiter)

    @staticmethod
    def _tried(
        started: dict[tuple[str, datetime], None],
        trigger: tuple[str, datetime],
        waiter: asyncio.Future[JobEvent],
    ) -> None:
        """A triggered slot this replica could not even try (the job was still running
        here, its lock was busy, the locker failed) is tried again at the next poll, if no
        replica has claimed it by then."""
        if waiter.cancelled():
            return
        event = waiter.result()
        if isinstance(event, LockFailed) or (
            isinstance(event, JobSkipped) and event.reason in ("overlap", "locked")
        ):
            started.pop(trigger, None)

    def without_success_since(self, job: Job) -> datetime | None:
        """See :meth:`cronlock.Scheduler.without_success_since`."""
        if self._since is None:
            return None
        success = job.last_success
        if success is not None and success.finished_at is not None:
            return success.finished_at
        return self._first_seen.get(job.name, self._since)

    def overdue(self, now: datetime) -> tuple[Job, ...]:
        """The jobs overdue at *now* (see :meth:`cronlock.Scheduler.overdue`)."""
        return tuple(job for job in self._jobs.values() if self.is_overdue(job, now))

    def is_overdue(self, job: Job, now: datetime) -> bool:
        """Whether *job* is overdue at *now*: its first slot after its latest success
        (anywhere in the fleet, with a ledger), or after the scheduler started if it never
        succeeded, fell due more than its grace ago. Paused and finished jobs never are."""
        due = self.due(job)
        if due is None:
            return False
        limit = timedelta(seconds=grace(job._settings, self._default_timeout))
        return now - job.fire_time(due) > limit


class _HealthView(Mapping[str, Health]):
    """The health of a locker's jobs, each computed only when asked for (the locker lists
    the names every poll, and wants the health of the few whose notes it writes). A view
    of the scheduler's registry: nothing is copied when it is made (100,000 jobs copied
    into a dict of their own held the event loop for tens of milliseconds each time)."""

    __slots__ = ("_fleet", "_key")

    def __init__(self, fleet: FleetState, key: int) -> None:
        self._fleet = fleet
        self._key = key

    def __getitem__(self, name: str) -> Health:
        job = self._fleet._jobs[name]
        if id(job._wiring.fleet) != self._key:
            raise KeyError(name)
        return self._fleet.health(job)

    def __iter__(self) -> Iterator[str]:
        # Over a snapshot of the names (one copy in C; the registry may change while they
        # are gone through), each job looked at as it comes: a reader can go through
        # 100,000 a slice at a time (filtering them in one go held the loop 30-60 ms).
        key, jobs = self._key, self._fleet._jobs
        for name in list(jobs):
            job = jobs.get(name)
            if job is not None and id(job._wiring.fleet) == key:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)
