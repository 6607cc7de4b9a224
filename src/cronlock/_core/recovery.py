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
loop like any other run: overlap policy, concurrency cap, elector and locker; a task of
its own sees it through (:meth:`Recovery._rerun`): dispatched once the job has no run in
flight here, claimed again while the job's lock is held by another replica or the server
cannot be reached, and said, at WARNING, if it is not made after all (the scheduler
stopped, the grace passed meanwhile).

A locker that keeps pending retries also reports, with the failed attempt's record, a
retry whose replica is gone before making it (``retries``, :mod:`.retries`): this replica
makes it now if its own job would (:func:`.retries.refused`; not paused).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from .._clock import Clock
from .._events import (
    EventBus,
    JobCrashed,
    JobEvent,
    JobSkipped,
    LockFailed,
    LockHeldElsewhere,
    RunRestored,
    SlotRanTwice,
)
from .._locking.protocols import (
    CrashWatchingLocker,
    FailoverWatchingLocker,
    ForeignWatchingLocker,
)
from .._logs import at, get_logger
from .._records import NEVER_BEGAN, RunRecord
from .job import Job
from .outage import unreachable
from .retries import refused
from .runloop import RunLoop, misfired
from .wiring import Wiring

__all__ = ("RECHECK", "Recovery")

_logger = get_logger("cronlock")

RECHECK = timedelta(seconds=0.05)
"""How often a rerun waiting for the job's run in flight here looks again (:meth:`Recovery.
_rerun`), and its first wait before it claims again a slot refused for now."""
_LONGEST = timedelta(seconds=1)  # the longest wait between two claims of one rerun


class Recovery:
    """The crash callback of one scheduler, registered once with each locker that has one.

    *jobs* is the scheduler's registry (a live view) and *loop* returns its run loop, or
    ``None`` while it is not running (crashes are then left to other replicas).
    """

    __slots__ = ("_bus", "_clock", "_held", "_jobs", "_loop", "_watched")

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
        self._held: set[asyncio.Task[None]] = set()  # reruns held back (_rerun)

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
            if _coalesces(job, record):
                return False
            self._rerun(loop, job, record)
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
        self._rerun(loop, job, record)
        return True

    def _rerun(self, loop: RunLoop, job: Job, record: RunRecord) -> None:
        """Run *record*'s slot again, in a task of its own that sees the rerun through.

        Handed to the run loop as any slot, a rerun could be lost unsaid: owed, then
        coalesced into a later slot (_core/outage), when the job's claim or release of that
        later slot is in flight here; dropped when another rerun of the job already waits
        for its run (one is kept); refused ``"locked"`` when another replica runs the job
        at that moment (a job due every second is held much of the time). So the rerun
        waits until the job has no run in flight here, is dispatched with a waiter for its
        outcome, and is claimed again, while its grace lasts, when the job's lock was held
        elsewhere or the server could not be reached. The locker keeps the row's takeover
        until then (``CrashWatch.take``)."""
        task = asyncio.get_running_loop().create_task(self._see_through(loop, job, record))
        self._held.add(task)
        task.add_done_callback(self._held.discard)

    async def _see_through(self, loop: RunLoop, job: Job, record: RunRecord) -> None:
        slot = record.slot
        pause = RECHECK
        try:
            while True:
                if job._active:  # its run here goes on, or its claim or release: wait
                    await self._clock.sleep_until(self._clock.now() + RECHECK)
                    why_not = self._still(loop, job, record)
                    if why_not is not None:
                        break
                    continue
                why_not = self._still(loop, job, record)
                if why_not is not None:
                    break
                if _coalesces(job, record):
                    return
                waiter: asyncio.Future[JobEvent] = asyncio.get_running_loop().create_future()
                loop.dispatch(job, slot, waiter)
                event = await waiter
                if _refused_for_good(event):
                    why_not = (
                        "its row was finished meanwhile (its replica, alive, wrote its "
                        "outcome late) or taken over by another replica"
                    )
                    break
                if not _refused_for_now(event):
                    return  # it ran (whatever its outcome)
                await self._clock.sleep_until(self._clock.now() + pause)
                pause = min(pause * 2, _LONGEST)
        except asyncio.CancelledError:
            self._gave_up(job, slot, "the scheduler stopped")
            raise
        self._gave_up(job, slot, why_not)

    def _still(self, loop: RunLoop, job: Job, record: RunRecord) -> str | None:
        """Why the rerun of *record* is not to be made now after all, or None."""
        if self._loop() is not loop:
            return "the scheduler stopped"
        if self._jobs.get(job.name) is not job:
            return "the job was removed"
        return self._why_not(job, record)

    @staticmethod
    def _gave_up(job: Job, slot: datetime, why_not: str) -> None:
        _logger.warning(
            "job %r slot %s: the crashed run is not run again after all: %s",
            job.name,
            slot.isoformat(),
            why_not,
            extra=at(job.name, slot),
        )

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


def _coalesces(job: Job, record: RunRecord) -> bool:
    """Whether *record*, a run of this replica whose lock was lost before it began, is
    owed no more: a later slot of the job was fired since (the loss is written once the
    server answers again, after an outage), into which it coalesces, as a slot whose claim
    failed does (_core/outage.py), rather than running after it."""
    dispatched = job._dispatched
    if record.error != NEVER_BEGAN or dispatched is None or dispatched <= record.slot:
        return False
    _logger.debug(
        "job %r slot %s: its lock was lost before the run began; coalesced into slot %s, "
        "fired since",
        job.name,
        record.slot.isoformat(),
        dispatched.isoformat(),
        extra=at(job.name, record.slot),
    )
    return True


def _refused_for_good(event: JobEvent) -> bool:
    """Whether a rerun's claim ended in *event* because the slot's row is no longer one to
    take over (``already_ran``): the rerun announced is not made, and says so."""
    return isinstance(event, JobSkipped) and event.reason == "already_ran"


def _refused_for_now(event: JobEvent) -> bool:
    """Whether a rerun's claim ended in *event* for a reason that may pass: the job's lock
    held by another replica's run, or the server out of reach."""
    if isinstance(event, JobSkipped):
        return event.reason == "locked"
    return isinstance(event, LockFailed) and unreachable(event.exception)
