"""Before and after a gated run: the elector and the lock's claim, the release, and
what a replica that did not run a slot learns of the fleet's runs."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from logging import DEBUG

from .._cancel import finish_uncancellably
from .._clock import Clock
from .._errors import LockError, LockUnavailable, SessionLost, StatementTimeout
from .._events import JobEvent, JobSkipped, LockFailed
from .._locking.protocols import Elector, Hold, hold_hooks
from .._logs import at, get_logger, say
from .job import Job

__all__ = ("HISTORY_REFRESH", "RELEASE_TIMEOUT", "Admission")

_logger = get_logger("cronlock")
_lock_logger = get_logger("cronlock.lock")

# A release that takes longer than this is abandoned (and logged); backends bound
# their own release and terminate the session when it cannot finish.
RELEASE_TIMEOUT = 30.0
# How often a replica that did not run a slot re-reads the job's fleet-wide history.
HISTORY_REFRESH = timedelta(seconds=30)


class Admission:
    """Asks the elector and the job's locker whether a run may start, and releases its hold."""

    __slots__ = ("_clock", "_elector", "_reading")

    def __init__(self, clock: Clock, elector: Elector | None) -> None:
        self._clock = clock
        self._elector = elector
        self._reading = False  # a history read is in flight (see refresh_history)

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
        now = self._clock.now()
        if not force and (
            self._reading
            or (job._history_checked is not None and now - job._history_checked < HISTORY_REFRESH)
        ):
            return
        job._checked(now)
        self._reading = True
        try:
            last, success = await ledger.last_runs(job.name)
        except Exception as exc:
            _lock_logger.warning(
                "job %r: reading its run history failed: %r", job.name, exc, extra=at(job.name)
            )
            return
        finally:
            self._reading = False
        job._learn(last, success)

    async def admit(self, job: Job, slot: datetime) -> Hold | JobEvent | None:
        """Ask the elector, then claim the slot; an event means: do not run."""
        if self._elector is not None:
            try:
                leader = await self._elector.is_leader()
            except Exception as exc:
                _logger.error(
                    "job %r slot %s: elector failed: %r",
                    job.name,
                    slot,
                    exc,
                    extra=at(job.name, slot),
                )
                return LockFailed(job.name, slot, exc)
            if not leader:
                say(_logger, DEBUG, job.name, slot, "not the leader, skipped")
                return JobSkipped(job.name, slot, "not_leader")
        locker = job._wiring.locker
        if locker is None:
            return None
        try:
            claim = await locker.acquire(job.name, slot)
        except (LockUnavailable, SessionLost, StatementTimeout) as exc:
            # The server cannot be reached (the locker logged the outage once, and says when
            # it is back); the run loop claims the slot again while its grace lasts. One
            # ERROR per slot would bury that line.
            _lock_logger.debug(
                "job %r slot %s: not claimed: %s", job.name, slot, exc, extra=at(job.name, slot)
            )
            return LockFailed(job.name, slot, exc)
        except LockError as exc:  # an answer that will repeat: said, without a traceback
            _lock_logger.error(
                "job %r slot %s: lock failed, run skipped: %s",
                job.name,
                slot,
                exc,
                extra=at(job.name, slot),
            )
            return LockFailed(job.name, slot, exc)
        except Exception as exc:
            _lock_logger.error(
                "job %r slot %s: lock failed, run skipped: %s",
                job.name,
                slot,
                exc,
                exc_info=exc,
                extra=at(job.name, slot),
            )
            return LockFailed(job.name, slot, exc)
        if claim is None or claim == "locked":
            say(_lock_logger, DEBUG, job.name, slot, "another holder has the lock")
            return JobSkipped(job.name, slot, "locked")
        if claim == "already_ran":
            say(_lock_logger, DEBUG, job.name, slot, "slot already ran")
            return JobSkipped(job.name, slot, "already_ran")
        if claim == "paused":
            say(_lock_logger, DEBUG, job.name, slot, "paused fleet-wide, skipped")
            return JobSkipped(job.name, slot, "paused")
        if claim == "standby":
            return JobSkipped(job.name, slot, "standby")  # other replicas claim this job
        assert not isinstance(claim, str)
        return claim

    async def release(self, job: Job, slot: datetime, hold: Hold) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                await hold.release()

        try:
            if hold_hooks(hold).bounded:  # safe as it is (a burst ends thousands at once)
                await hold.release()
            else:
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
                extra=at(job.name, slot),
            )
