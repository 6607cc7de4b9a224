"""How one run goes: elector, lock, the task under its timeout, outcome, release, events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

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
)
from ._job import Job, RunContext, RunRecord
from ._locking import Elector, Lease, Locker, finish_uncancellably

if TYPE_CHECKING:
    from ._job import Outcome

__all__ = ("Executor",)

_logger = logging.getLogger("cronlock")
_lock_logger = logging.getLogger("cronlock.lock")

# A lease release that takes longer than this is abandoned (and logged); backends bound
# their own release and terminate the session when it cannot finish.
RELEASE_TIMEOUT = 30.0


class Executor:
    """Runs single slots of jobs; shared by every job of one scheduler."""

    __slots__ = ("_bus", "_clock", "_default_timeout", "_elector", "_locker")

    def __init__(
        self,
        *,
        clock: Clock,
        bus: EventBus,
        locker: Locker | None,
        elector: Elector | None,
        default_timeout: float | None,
    ) -> None:
        self._clock = clock
        self._bus = bus
        self._locker = locker
        self._elector = elector
        self._default_timeout = default_timeout

    async def run(self, job: Job, slot: datetime) -> JobEvent:
        """Run *slot* of *job* and return the final event (also emitted)."""
        lease: Lease | None = None
        if job.distributed:
            gate = await self._admit(job, slot)
            if isinstance(gate, JobEvent):
                return self._emit(gate)
            lease = gate
        if lease is None:
            return await self._execute(job, slot)
        try:
            return await self._execute(job, slot)
        finally:
            await self._release(job, slot, lease)

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

    async def _execute(self, job: Job, slot: datetime) -> JobEvent:
        clock = self._clock
        job.run_count += 1
        started = clock.now()
        ctx = RunContext(job.name, slot, started, job.run_count)
        self._bus.emit(JobStarted(job.name, slot, started, job.run_count))
        timeout = job.timeout if job.timeout is not None else self._default_timeout
        outcome: Outcome
        error: str | None = None
        try:
            async with self._timeout(timeout) as expired:
                result = await job.call(ctx)
        except asyncio.CancelledError:
            finished = clock.now()
            if expired():
                # Our deadline fired: the run is over, the cancellation was ours.
                assert timeout is not None
                _logger.error("job %r slot %s timed out after %ss", job.name, slot, timeout)
                self._record(job, slot, started, finished, "timed_out", None)
                return self._emit(JobTimedOut(job.name, slot, started, finished, timeout))
            self._record(job, slot, started, finished, "cancelled", None)
            self._emit(JobCancelled(job.name, slot, started, finished))
            raise
        except TimeoutError as exc:
            finished = clock.now()
            if expired():
                assert timeout is not None
                _logger.error("job %r slot %s timed out after %ss", job.name, slot, timeout)
                self._record(job, slot, started, finished, "timed_out", None)
                return self._emit(JobTimedOut(job.name, slot, started, finished, timeout))
            outcome, error = "failed", _summary(exc)
            _logger.error("job %r slot %s failed", job.name, slot, exc_info=exc)
            self._record(job, slot, started, finished, outcome, error)
            return self._emit(JobFailed(job.name, slot, started, finished, exc))
        except Exception as exc:
            finished = clock.now()
            _logger.error("job %r slot %s failed", job.name, slot, exc_info=exc)
            self._record(job, slot, started, finished, "failed", _summary(exc))
            return self._emit(JobFailed(job.name, slot, started, finished, exc))
        finished = clock.now()
        self._record(job, slot, started, finished, "succeeded", None)
        return self._emit(JobSucceeded(job.name, slot, started, finished, result))

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

    @contextlib.asynccontextmanager
    async def _timeout(self, seconds: float | None) -> AsyncIterator[Callable[[], bool]]:
        """``asyncio.timeout`` on the real clock; a clock-driven deadline otherwise.

        A fake clock's time is not the event loop's, so the deadline is watched by a task
        sleeping on the clock, which moves the asyncio deadline to "now" when it wakes.
        Either way the task sees an ordinary asyncio cancellation at the deadline.
        """
        if seconds is None:
            yield _never
            return
        if isinstance(self._clock, SystemClock):
            async with asyncio.timeout(seconds) as cm:
                yield cm.expired
            return
        deadline = self._clock.now() + timedelta(seconds=seconds)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as cm:

            async def watchdog() -> None:
                await self._clock.sleep_until(deadline)
                cm.reschedule(loop.time())

            dog = asyncio.create_task(watchdog(), name="cronlock-timeout")
            try:
                yield cm.expired
            finally:
                dog.cancel()
                # Wait for the watchdog without letting its cancellation count as ours.
                await finish_uncancellably(asyncio.wait((dog,)))


def _never() -> bool:
    return False


def _summary(exc: BaseException) -> str:
    text = (
        f"{type(exc).__name__}: {exc}".strip().splitlines()[0] if str(exc) else type(exc).__name__
    )
    return text[:500]
