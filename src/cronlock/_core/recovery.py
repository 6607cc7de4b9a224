"""A scheduler's answer to a crashed run: report it, and run the slot again if the job asks.

A locker that watches for crashes (:class:`~cronlock.CrashWatchingLocker`) calls
:class:`Recovery` for each run it marked ``"crashed"``: a run whose replica died mid-run.
The one rule of a rerun is here: the job is registered with this scheduler, opted in
(``recover=True``), is not paused, the run was not itself a rerun, and the slot is still
within ``misfire_grace`` (the run loop's one misfire rule). A run of this replica whose
lock was lost before its body began (``NEVER_BEGAN``) is claimed again without opting in:
nothing ran, so running the slot is exactly once; unless a later slot of the job was fired
since (its loss is known only once the server answers again), into which it coalesces, as a
slot owed across an outage does (:mod:`.outage`). The rerun goes through the run
loop like any other run: overlap policy, concurrency cap, elector and locker.

A locker that keeps pending retries also reports, with the failed attempt's record, a
retry whose replica is gone before making it (``retries``, :mod:`.retries`): this replica
makes it now if its own job would (:func:`.retries.refused`; not paused).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from .._clock import Clock
from .._events import EventBus, JobCrashed, LockHeldElsewhere, RunRestored, SlotRanTwice
from .._locking.protocols import (
    CrashWatchingLocker,
    FailoverWatchingLocker,
    ForeignWatchingLocker,
)
from .._logs import at, get_logger
from .._records import NEVER_BEGAN, RunRecord
from .job import Job
from .retries import refused
from .runloop import RunLoop, misfired
from .wiring import Wiring

__all__ = ("Recovery",)

_logger = get_logger("cronlock")


class Recovery:
    """The crash callback of one scheduler, registered once with each locker that has one.

    *jobs* is the scheduler's registry (a live view) and *loop* returns its run loop, or
    ``None`` while it is not running (crashes are then left to other replicas).
    """

    __slots__ = ("_bus", "_clock", "_jobs", "_loop", "_watched")

    def __init__(
        self,
        *,
        jobs: Mapping[str, Job],
        clock: Clock,
        bus: EventBus,
        loop: Callable[[], RunLoop | None],
    ) -> None:
        self._jobs = jobs
        self._clock = clock
        self._bus = bus
        self._loop = loop
        self._watched: dict[int, CrashWatchingLocker] = {}

    def watch(self, wiring: Wiring) -> None:
        """Register with the job's locker, if it reports crashes (once per locker), and for
        its reports of locks held outside the fleet and of failovers, if it makes them."""
        locker = wiring.crashes
        if locker is not None and id(locker) not in self._watched:
            self._watched[id(locker)] = locker
            locker.on_crashed(self)
            if isinstance(locker, ForeignWatchingLocker):  # once per locker, like the above
                locker.on_foreign_holder(self.held_elsewhere)
            if isinstance(locker, FailoverWatchingLocker):
                locker.on_failover(self.failed_over)

    def held_elsewhere(self, name: str, slot: datetime, holder: str) -> None:
        """A locker found *name*'s lock held outside the fleet: say so, as an event."""
        if name in self._jobs:
            self._bus.emit(LockHeldElsewhere(name, slot, holder))

    def failed_over(self, name: str, slot: datetime, other: str | None) -> None:
        """A locker wrote back a run of *name* a failover lost (*other* ``None``), or found
        *slot* run by *other* too: say so, as an event (the locker logged it)."""
        if name in self._jobs:
            self._bus.emit(
                RunRestored(name, slot) if other is None else SlotRanTwice(name, slot, other)
            )

    def __call__(self, name: str, record: RunRecord) -> bool:
        """A locker marked *record* of job *name* crashed; True if this replica reruns it."""
        loop = self._loop()
        job = self._jobs.get(name)
        if loop is None or job is None or job._wiring.crashes is None:
            return False  # not ours to report (the locker logged it)
        if record.outcome in ("failed", "timed_out"):
            return self._retry(loop, job, record)
        if record.outcome == "lock_lost" and record.error == NEVER_BEGAN:
            # This replica's own run, whose lock was lost before its body began: nothing
            # ran, so the slot is claimed again (taking the row over), recover or not.
            if self._why_not(job, record) is not None:
                return False
            if job._dispatched is not None and job._dispatched > record.slot:
                # A later slot of the job was fired since the lock was lost (the loss is
                # written once the server answers again, after an outage): this slot is
                # owed no more than one whose claim failed, and coalesces into the later
                # one (_core/outage.py), rather than running after it.
                _logger.debug(
                    "job %r slot %s: its lock was lost before the run began; coalesced "
                    "into slot %s, fired since",
                    name,
                    record.slot.isoformat(),
                    job._dispatched.isoformat(),
                    extra=at(name, record.slot),
                )
                return False
            loop.rerun(job, record.slot)
            return True
        why_not = self._why_not(job, record) if job.recover else "recover=False"
        owner = record.owner or "?"
        self._bus.emit(JobCrashed(name, record.slot, owner, record.started_at, why_not is None))
        if why_not is not None:
            if job.recover:
                _logger.warning(
                    "job %r slot %s: the crashed run is not run again: %s",
                    name,
                    record.slot.isoformat(),
                    why_not,
                    extra=at(name, record.slot),
                )
            return False
        loop.rerun(job, record.slot)
        return True

    def _retry(self, loop: RunLoop, job: Job, record: RunRecord) -> bool:
        """Attempt *record.attempt* of its slot failed and its replica is gone before the
        next one: make it here if this replica's job would (the locker logs the outcome)."""
        attempt = record.attempt + 1
        why_not = (
            "the job is paused"
            if job.paused
            else refused(job, record.slot, attempt, self._clock.now())
        )
        if why_not is not None:
            _logger.info(
                "job %r slot %s: attempt %d, left by %s, is not made: %s",
                job.name,
                record.slot.isoformat(),
                attempt,
                record.owner or "?",
                why_not,
                extra=at(job.name, record.slot),
            )
            return False
        return loop.retry(job, record.slot, attempt)

    def _why_not(self, job: Job, record: RunRecord) -> str | None:
        if job.paused:
            return "the job is paused"
        if record.attempt > 1:
            return f"it was already a rerun (attempt {record.attempt})"
        lateness = misfired(job.misfire_grace, job.fire_time(record.slot), self._clock.now())
        if lateness is not None:
            return f"{lateness:.1f}s late is past misfire_grace ({job.misfire_grace}s)"
        return None
