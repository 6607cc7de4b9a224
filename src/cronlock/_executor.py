"""How one run goes: elector, lock, the task under its timeout, outcome, release, events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ._cancel import finish_uncancellably
from ._clock import Clock, SystemClock
from ._events import (
    EventBus,
    JobCancelled,
    JobEvent,
    JobFailed,
    JobSkipped,
    JobStarted,
    JobSucceeded,
    JobTimedOut,
    LockFailed,
    LockLost,
)
from ._guard import Deadlines, RunGuard
from ._job import Job
from ._locking import Elector, Lease, Locker
from ._records import RunRecord

if TYPE_CHECKING:
    from ._records import Outcome

__all__ = ("Executor",)

_logger = logging.getLogger("cronlock")
_lock_logger = logging.getLogger("cronlock.lock")

# A lease release that takes longer than this is abandoned (and logged); backends bound
# their own release and terminate the session when it cannot finish.
RELEASE_TIMEOUT = 30.0
# How often a replica that did not run a slot re-reads the job's fleet-wide history.
HISTORY_REFRESH = timedelta(seconds=30)


class Executor:
    """Runs single slots of jobs; shared by every job of one scheduler."""

    __slots__ = (
        "_bus",
        "_cancel_on_lock_loss",
        "_clock",
        "_coordinated",
        "_deadlines",
        "_default_timeout",
        "_elector",
        "_locker",
        "_reading",
    )

    def __init__(
        self,
        *,
        clock: Clock,
        bus: EventBus,
        locker: Locker | None,
        elector: Elector | None,
        default_timeout: float | None,
        cancel_on_lock_loss: bool = True,
    ) -> None:
        self._cancel_on_lock_loss = cancel_on_lock_loss
        self._reading = False  # a history read is in flight (see refresh_history)
        self._deadlines = Deadlines() if isinstance(clock, SystemClock) else None
        # Guards of coordinated runs in flight: ended together when leadership is lost.
        self._coordinated: set[RunGuard] = set()
        self._clock = clock
        self._bus = bus
        self._locker = locker
        self._elector = elector
        self._default_timeout = default_timeout

    async def run(self, job: Job, slot: datetime, *, report: bool = True) -> JobEvent | None:
        """Run *slot* of *job* and return the final event (also emitted).

        With ``report=False`` a successful run nobody subscribed to returns ``None``
        instead of building an event no one reads (the run loop's hot path).
        """
        if not job.distributed or (
            self._elector is None and self._locker is None and job.locker is None
        ):
            return await self._execute(job, slot, None, report)
        gate = await self._admit(job, slot)
        if isinstance(gate, JobEvent):
            self._emit(gate)
            if isinstance(gate, JobSkipped) and gate.reason in ("already_ran", "locked"):
                await self.refresh_history(job)  # another replica ran it: learn how it went
            return gate
        if gate is None:
            return await self._execute(job, slot, None, report)
        try:
            return await self._execute(job, slot, gate, report)
        finally:
            record = getattr(gate, "record", None)
            if record is not None and job.last_run is not None and job.last_run.slot == slot:
                record(job.last_run)  # the ledger stores the outcome with the release
            await self._release(job, slot, gate)

    def demote(self, reason: BaseException | None) -> None:
        """This replica stopped leading: end its coordinated runs (event ``LockLost``)."""
        if not self._cancel_on_lock_loss:
            _lock_logger.error("leadership lost (%s); coordinated runs go on", reason)
            return
        for guard in tuple(self._coordinated):
            guard.lose(reason)

    async def refresh_history(self, job: Job, *, force: bool = False) -> None:
        """Copy the fleet-wide last run and last success from a ledger into *job*.

        Replicas that lose the race for a slot call this, so it is throttled twice: once
        per job per ``HISTORY_REFRESH``, and one read at a time per scheduler (a read that
        finds another in flight is dropped). Reads share the locker's connection with the
        lock statements; without the throttle, a thousand jobs losing every second would
        queue a thousand reads a second in front of the locks (measured: the replicas
        then fell behind and missed most slots).
        """
        locker = job.locker or self._locker
        last_runs = getattr(locker, "last_runs", None)
        if last_runs is None:
            return
        now = self._clock.now()
        if not force and (
            self._reading
            or (job.history_checked is not None and now - job.history_checked < HISTORY_REFRESH)
        ):
            return
        job.history_checked = now
        self._reading = True
        try:
            last, success = await last_runs(job.name)
        except Exception as exc:
            _lock_logger.warning("job %r: reading its run history failed: %r", job.name, exc)
            return
        finally:
            self._reading = False
        if last is not None and (job.last_run is None or last.slot > job.last_run.slot):
            job.last_run = last
        if success is not None and (
            job.last_success is None or success.slot > job.last_success.slot
        ):
            job.last_success = success

    async def _admit(self, job: Job, slot: datetime) -> Lease | JobEvent | None:
        """Ask the elector, then claim the slot; an event means: do not run."""
        if self._elector is not None:
            try:
                leader = await self._elector.is_leader()
            except Exception as exc:
                _logger.error("job %r slot %s: elector failed: %r", job.name, slot, exc)
                return LockFailed(job.name, slot, exc)
            if not leader:
                _logger.debug("job %r slot %s: not the leader, skipped", job.name, slot)
                return JobSkipped(job.name, slot, "not_leader")
        locker = job.locker or self._locker
        if locker is None:
            return None
        try:
            claim = await locker.acquire(job.name, slot)
        except Exception as exc:
            _lock_logger.error(
                "job %r slot %s: lock failed, run skipped: %s",
                job.name,
                slot,
                exc,
                exc_info=exc,
            )
            return LockFailed(job.name, slot, exc)
        if claim is None or claim == "locked":
            _lock_logger.debug("job %r slot %s: another holder has the lock", job.name, slot)
            return JobSkipped(job.name, slot, "locked")
        if claim == "already_ran":
            _lock_logger.debug("job %r slot %s: slot already ran", job.name, slot)
            return JobSkipped(job.name, slot, "already_ran")
        assert not isinstance(claim, str)
        return claim

    async def _release(self, job: Job, slot: datetime, lease: Lease) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                await lease.release()

        try:
            await finish_uncancellably(bounded())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _lock_logger.error(
                "job %r slot %s: releasing the lock failed: %r",
                job.name,
                slot,
                exc,
                exc_info=exc,
            )

    async def _execute(
        self, job: Job, slot: datetime, lease: Lease | None, report: bool
    ) -> JobEvent | None:
        clock = self._clock
        bus = self._bus
        job.run_count += 1
        started = clock.now()
        if bus.wants(JobStarted):
            bus.emit(JobStarted(job.name, slot, started, job.run_count))
        timeout = job.timeout if job.timeout is not None else self._default_timeout
        coordinated = job.distributed and self._elector is not None
        if timeout is None and lease is None and not coordinated:
            # The common case pays for no timeout machinery at all.
            try:
                result = await job.call(slot, started)
            except asyncio.CancelledError:
                self._cancelled(job, slot, started)
                raise
            except Exception as exc:
                return self._failed(job, slot, started, exc)
            return self._succeeded(job, slot, started, result, report)
        guard = RunGuard(clock, timeout, self._deadlines)
        if coordinated:
            self._coordinated.add(guard)
        if lease is not None:
            watch = getattr(lease, "on_lost", None)
            if watch is not None:
                watch(guard.lose if self._cancel_on_lock_loss else _log_loss(job, slot))
        try:
            async with guard:
                result = await job.call(slot, started)
        except asyncio.CancelledError:
            self._coordinated.discard(guard)
            self._cancelled(job, slot, started)
            raise
        except Exception as exc:
            self._coordinated.discard(guard)
            finished = clock.now()
            if guard.reason == "timeout" and isinstance(exc, TimeoutError):
                assert timeout is not None
                _logger.error("job %r slot %s timed out after %ss", job.name, slot, timeout)
                self._record(job, slot, started, finished, "timed_out", None)
                return self._emit(JobTimedOut(job.name, slot, started, finished, timeout))
            if guard.reason == "lock_lost" and isinstance(exc, TimeoutError):
                _lock_logger.error(
                    "job %r slot %s cancelled: its lock was lost (%s)",
                    job.name,
                    slot,
                    guard.lost_because,
                )
                self._record(job, slot, started, finished, "lock_lost", None)
                return self._emit(LockLost(job.name, slot, started, finished, guard.lost_because))
            return self._failed(job, slot, started, exc)
        self._coordinated.discard(guard)
        return self._succeeded(job, slot, started, result, report)

    def _succeeded(
        self, job: Job, slot: datetime, started: datetime, result: object, report: bool
    ) -> JobEvent | None:
        finished = self._clock.now()
        job._last_run = job._last_success = (slot, started, finished, "succeeded")
        wanted = self._bus.wants(JobSucceeded)
        if not (report or wanted):
            return None
        event = JobSucceeded(job.name, slot, started, finished, result)
        if wanted:
            self._bus.emit(event)
        return event

    def _failed(self, job: Job, slot: datetime, started: datetime, exc: Exception) -> JobEvent:
        finished = self._clock.now()
        _logger.error("job %r slot %s failed", job.name, slot, exc_info=exc)
        self._record(job, slot, started, finished, "failed", _summary(exc))
        return self._emit(JobFailed(job.name, slot, started, finished, exc))

    def _cancelled(self, job: Job, slot: datetime, started: datetime) -> None:
        finished = self._clock.now()
        self._record(job, slot, started, finished, "cancelled", None)
        self._emit(JobCancelled(job.name, slot, started, finished))

    def _record(
        self,
        job: Job,
        slot: datetime,
        started: datetime,
        finished: datetime,
        outcome: Outcome,
        error: str | None,
    ) -> None:
        record = RunRecord(slot, started, finished, outcome, error)
        job.last_run = record
        if outcome == "succeeded":
            job.last_success = record

    def _emit(self, event: JobEvent) -> JobEvent:
        self._bus.emit(event)
        return event


def _log_loss(job: Job, slot: datetime) -> Callable[[BaseException | None], None]:
    def log(exc: BaseException | None) -> None:
        _lock_logger.error(
            "job %r slot %s: its lock was lost (%s); the run goes on (on_lock_lost='continue')",
            job.name,
            slot,
            exc,
        )

    return log


def _summary(exc: BaseException) -> str:
    text = (
        f"{type(exc).__name__}: {exc}".strip().splitlines()[0] if str(exc) else type(exc).__name__
    )
    return text[:500]
