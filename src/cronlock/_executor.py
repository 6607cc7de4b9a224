"""How one run goes: elector, lock, the task under its timeout, outcome, release, events."""

from __future__ import annotations

import asyncio
import logging
import typing
from collections.abc import Callable
from datetime import datetime, timedelta

from ._cancel import finish_uncancellably
from ._clock import Clock
from ._errors import LockUnavailable
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
from ._locking import Elector, Lease, LosableLease, RecordingLease, lease_hooks
from ._records import RunRecord, error_summary

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
        "_reading",
    )

    def __init__(
        self,
        *,
        clock: Clock,
        loop_time: bool,
        bus: EventBus,
        elector: Elector | None,
        default_timeout: float | None,
        cancel_on_lock_loss: bool = True,
    ) -> None:
        self._cancel_on_lock_loss = cancel_on_lock_loss
        self._reading = False  # a history read is in flight (see refresh_history)
        # On the real clock every run deadline shares one event-loop timer.
        self._deadlines = Deadlines() if loop_time else None
        # Guards of coordinated runs in flight: ended together when leadership is lost.
        self._coordinated: set[RunGuard] = set()
        self._clock = clock
        self._bus = bus
        self._elector = elector
        self._default_timeout = default_timeout

    async def run(self, job: Job, slot: datetime, *, report: bool = True) -> JobEvent | None:
        """Run *slot* of *job* and return the final event (also emitted).

        With ``report=False`` a successful run nobody subscribed to returns ``None``
        instead of building an event no one reads (the run loop's hot path).
        """
        if not job._wiring.coordinated:
            return await self._execute(job, slot, None, report)
        gate = await self._admit(job, slot)
        if isinstance(gate, JobEvent):
            self._bus.emit(gate)
            if isinstance(gate, JobSkipped) and gate.reason in ("already_ran", "locked"):
                # Another replica ran it: learn how the fleet's runs went, from what the
                # refusal said when the locker tells (no read), else from a throttled read.
                batch = job._wiring.batch
                told = None if batch is None else batch.refusal_history(job.name)
                if told is not None:
                    job._state.learn(*told)
                else:
                    await self.refresh_history(job)
            return gate
        if gate is None:
            return await self._execute(job, slot, None, report)
        try:
            return await self._execute(job, slot, gate, report)
        finally:
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
        ledger = job._wiring.ledger
        if ledger is None:
            return
        state = job._state
        now = self._clock.now()
        if not force and (
            self._reading
            or (state.history_checked is not None and now - state.history_checked < HISTORY_REFRESH)
        ):
            return
        state.checked(now)
        self._reading = True
        try:
            last, success = await ledger.last_runs(job.name)
        except Exception as exc:
            _lock_logger.warning("job %r: reading its run history failed: %r", job.name, exc)
            return
        finally:
            self._reading = False
        state.learn(last, success)

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
        locker = job._wiring.locker
        if locker is None:
            return None
        try:
            claim = await locker.acquire(job.name, slot)
        except LockUnavailable as exc:
            # The backend is down and the locker waits before trying it again; it logged
            # the outage once. One ERROR per skipped run would bury that line.
            _lock_logger.debug("job %r slot %s: run skipped: %s", job.name, slot, exc)
            return LockFailed(job.name, slot, exc)
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
        number = job._state.begin()
        started = clock.now()
        if bus.wants(JobStarted):
            bus.emit(JobStarted(job.name, slot, started, number))
        timeout = job.timeout if job.timeout is not None else self._default_timeout
        coordinated = job._wiring.elected
        if timeout is None and lease is None and not coordinated:
            # The common case pays for no timeout machinery at all.
            try:
                result = await job.call(slot, started, number)
            except asyncio.CancelledError:
                self._cancelled(job, slot, started, None)
                raise
            except Exception as exc:
                return self._failed(job, slot, started, exc, None)
            return self._succeeded(job, slot, started, result, report, None)
        guard = RunGuard(clock, timeout, self._deadlines)
        if coordinated:
            self._coordinated.add(guard)
        if lease is not None and lease_hooks(lease).losable:
            typing.cast(LosableLease, lease).on_lost(
                guard.lose if self._cancel_on_lock_loss else _log_loss(job, slot)
            )
        try:
            async with guard:
                result = await job.call(slot, started, number)
        except asyncio.CancelledError:
            self._cancelled(job, slot, started, lease)
            raise
        except Exception as exc:
            finished = clock.now()
            if guard.reason == "timeout" and isinstance(exc, TimeoutError):
                assert timeout is not None
                _logger.error("job %r slot %s timed out after %ss", job.name, slot, timeout)
                record = RunRecord(slot, started, finished, "timed_out", None)
                event: JobEvent = JobTimedOut(job.name, slot, started, finished, timeout)
                return self._end(job, lease, record, event)
            if guard.reason == "lock_lost" and isinstance(exc, TimeoutError):
                _lock_logger.error(
                    "job %r slot %s cancelled: its lock was lost (%s)",
                    job.name,
                    slot,
                    guard.lost_because,
                )
                record = RunRecord(slot, started, finished, "lock_lost", None)
                event = LockLost(job.name, slot, started, finished, guard.lost_because)
                return self._end(job, lease, record, event)
            return self._failed(job, slot, started, exc, lease)
        finally:
            self._coordinated.discard(guard)
        return self._succeeded(job, slot, started, result, report, lease)

    def _end(self, job: Job, lease: Lease | None, record: RunRecord, event: JobEvent) -> JobEvent:
        """A run ended as *record* says: store it, hand it to a recording lease, emit *event*.

        The record goes to the lease directly (the ledger writes it with the release, in
        one round trip), never read back from the job.
        """
        job._state.finish(record)
        if lease is not None and lease_hooks(lease).records:
            typing.cast(RecordingLease, lease).record(record)
        self._bus.emit(event)
        return event

    def _succeeded(
        self,
        job: Job,
        slot: datetime,
        started: datetime,
        result: object,
        report: bool,
        lease: Lease | None,
    ) -> JobEvent | None:
        finished = self._clock.now()
        if lease is not None:
            record = RunRecord(slot, started, finished, "succeeded")
            event = JobSucceeded(job.name, slot, started, finished, result)
            return self._end(job, lease, record, event)
        # The hot path: a plain tuple, made into a RunRecord only if somebody reads it, and
        # no event nobody listens to or waits for.
        job._state.succeeded((slot, started, finished, "succeeded"))
        wanted = self._bus.wants(JobSucceeded)
        if not (report or wanted):
            return None
        event = JobSucceeded(job.name, slot, started, finished, result)
        if wanted:
            self._bus.emit(event)
        return event

    def _failed(
        self, job: Job, slot: datetime, started: datetime, exc: Exception, lease: Lease | None
    ) -> JobEvent:
        finished = self._clock.now()
        _logger.error("job %r slot %s failed", job.name, slot, exc_info=exc)
        record = RunRecord(slot, started, finished, "failed", error_summary(exc))
        return self._end(job, lease, record, JobFailed(job.name, slot, started, finished, exc))

    def _cancelled(self, job: Job, slot: datetime, started: datetime, lease: Lease | None) -> None:
        finished = self._clock.now()
        record = RunRecord(slot, started, finished, "cancelled", None)
        self._end(job, lease, record, JobCancelled(job.name, slot, started, finished))


def _log_loss(job: Job, slot: datetime) -> Callable[[BaseException | None], None]:
    def log(exc: BaseException | None) -> None:
        _lock_logger.error(
            "job %r slot %s: its lock was lost (%s); the run goes on (on_lock_lost='continue')",
            job.name,
            slot,
            exc,
        )

    return log
