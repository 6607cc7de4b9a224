"""Retries: a failed or timed-out run of a job with ``retries=N`` is tried again, up to N
times per slot in the whole fleet.

The replica whose attempt failed waits the backoff, tells its locker the next attempt's
number (:class:`~cronlock.RetryingLocker`) and dispatches the slot again; a ledger locker
claims that attempt by taking the failed row over (attempt k+1 only while the row is at
attempt k and failed), so however many replicas there are a slot is tried ``1 + retries``
times in the fleet. A cancelled run (shutdown, lock loss, ``replace``) is not retried.

A locker that keeps pending retries (:class:`DurableRetryLocker`: ``PostgresLocker``) is
told when the next attempt is due as the backoff begins, and writes it in its ledger: if
this replica is gone by then (killed, or stopped during the backoff), a replica that has
the job takes the retry over (its crash check, :class:`~cronlock._core.recovery.Recovery`,
:meth:`Retries.resume`) by the same guarded takeover, on the same rules
(:func:`refused`).
Retries stop when the job's next slot falls due or ``misfire_grace`` runs out, whichever is
first: a retry never competes with the slot after it.

The delay before attempt k+1 is ``retry_delay * 2**(k-1)``, capped at :data:`MAX_DELAY`,
then jittered to between half and all of that (the same on every replica, from the job,
slot and attempt: "equal jitter", so that many jobs failing together do not retry
together).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._cancel import task_name
from .._events import EventBus, JobEvent, JobFailed, JobRetrying, JobTimedOut
from .._locking.protocols import Locker
from .._logs import at, get_logger
from .._records import error_summary, timed_out_error
from .job import Job

if TYPE_CHECKING:
    from .._clock import Clock

__all__ = ("MAX_DELAY", "DurableRetryLocker", "Retries", "RetryingLocker", "backoff", "refused")

_logger = get_logger("cronlock")

MAX_DELAY = 300.0
"""Seconds: the longest wait before a retry, however many attempts came before."""
_REMEMBER = 1024  # slots whose retry is on its way, at most


@runtime_checkable
class RetryingLocker(Locker, Protocol):
    """A locker that keeps count of a slot's attempts fleet-wide (``InMemoryLocker``,
    ``PostgresLocker``): told that the next :meth:`acquire` of a slot is attempt *attempt*,
    it grants it only while the slot's previous attempt failed or timed out and nobody
    took it over, so a slot is tried ``1 + retries`` times however many replicas retry."""

    def will_retry(self, job: str, slot: datetime, attempt: int) -> None:
        """The next :meth:`acquire` of *slot* of *job* claims attempt *attempt* (2 or more)."""
        ...


@runtime_checkable
class DurableRetryLocker(RetryingLocker, Protocol):
    """A retrying locker that keeps a slot's pending retry in its ledger, so that another
    replica makes it if the one whose attempt failed is gone by then (``PostgresLocker``)."""

    async def retry_due(self, job: str, slot: datetime, attempt: int, when: datetime) -> None:
        """Write down that attempt *attempt* of *slot* of *job* is due at *when*."""
        ...


def refused(job: Job, slot: datetime, attempt: int, when: datetime) -> str | None:
    """Why attempt *attempt* of *slot* of *job*, starting at *when*, is not made (None: it
    is): the one rule of a retry, here or taken over from a replica gone."""
    if attempt > 1 + job._settings.retries:
        return f"retries={job._settings.retries} were made"
    following = job.slot_after(slot)  # (a run_now() slot is none of the schedule's)
    if following is not None and when >= job.fire_time(following):
        return f"the next slot ({following.isoformat()}) falls due first"
    grace = job.misfire_grace
    if grace is not None and when > job.fire_time(slot) + timedelta(seconds=grace):
        return f"misfire_grace ({grace}s) runs out first"
    return None


def backoff(job: str, slot: datetime, attempt: int, base: float) -> float:
    """Seconds to wait after attempt *attempt* (1: the first run) of *slot* of *job*."""
    ceiling = min(MAX_DELAY, base * 2.0 ** (attempt - 1))
    text = f"{job}\x00{slot.isoformat()}\x00{attempt}".encode()
    fraction = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") / 2**64
    return ceiling * (0.5 + 0.5 * fraction)


class Retries:
    """The retries of one scheduler's run loop: which attempt each slot is at, and the
    decision after a failed one."""

    __slots__ = ("_attempts", "_bus", "_clock", "_dispatch", "_spawn")

    def __init__(
        self,
        clock: Clock,
        bus: EventBus,
        spawn: Callable[..., None],
        dispatch: Callable[[Job, datetime], None],
    ) -> None:
        self._clock = clock
        self._bus = bus
        self._spawn = spawn
        self._dispatch = dispatch
        self._attempts: dict[tuple[str, datetime], int] = {}  # slots being retried here

    def attempt(self, job: Job, slot: datetime) -> int:
        """The attempt a run of *slot* of *job* starting now is (1 unless a retry)."""
        return self._attempts.get((job.name, slot), 1)

    def ended(self, job: Job, slot: datetime, event: JobEvent | None) -> None:
        """A run of *slot* of *job* ended with *event*: retry it if the job says so."""
        key = (job.name, slot)
        attempt = self._attempts.pop(key, 1)
        if isinstance(event, JobFailed):
            error = error_summary(event.exception)
        elif isinstance(event, JobTimedOut):
            error = timed_out_error(event.timeout)
        else:
            return  # it succeeded, was cancelled, or did not run here
        if attempt > job._settings.retries:
            return  # its last attempt
        delay = backoff(job.name, slot, attempt, job._settings.retry_delay)
        when = self._clock.now() + timedelta(seconds=delay)
        why_not = refused(job, slot, attempt + 1, when)
        if why_not is not None:
            _logger.info(
                "job %r slot %s: attempt %d failed and is not retried: %s",
                job.name,
                slot,
                attempt,
                why_not,
                extra=at(job.name, slot),
            )
            return
        _logger.info(
            "job %r slot %s: attempt %d failed; attempt %d in %.1fs",
            job.name,
            slot,
            attempt,
            attempt + 1,
            delay,
            extra=at(job.name, slot),
        )
        self._bus.emit(JobRetrying(job.name, slot, attempt + 1, delay, error))
        self._spawn(self._retry(job, slot, attempt + 1, when), task_name("retry", job.name))

    async def _retry(self, job: Job, slot: datetime, attempt: int, when: datetime) -> None:
        locker = job._wiring.locker
        if isinstance(locker, DurableRetryLocker):
            try:
                await locker.retry_due(job.name, slot, attempt, when)
            except Exception as exc:  # the retry is made here all the same
                _logger.warning(
                    "job %r slot %s: attempt %d could not be written down as due (%s); "
                    "only this replica will make it",
                    job.name,
                    slot,
                    attempt,
                    exc,
                    extra=at(job.name, slot),
                )
        await self._clock.sleep_until(when)
        self.resume(job, slot, attempt)

    def resume(self, job: Job, slot: datetime, attempt: int) -> bool:
        """Make attempt *attempt* of *slot* of *job* now (its claim takes the failed row
        over); False when it is not made: the job was removed or paused, or a run of it
        goes on and its overlap policy is ``"skip"``."""
        if job._scheduler is None or job.paused:
            return False  # removed or paused meanwhile
        if job._active and job.overlap == "skip":  # the next slot's run (a long one) goes on
            _logger.info(
                "job %r slot %s: attempt %d not started: a run of the job is in progress",
                job.name,
                slot,
                attempt,
                extra=at(job.name, slot),
            )
            return False
        attempts = self._attempts
        attempts[job.name, slot] = attempt
        if len(attempts) > _REMEMBER:  # a retry queued, then dropped with its job, say
            del attempts[next(iter(attempts))]
        locker = job._wiring.locker
        if isinstance(locker, RetryingLocker):
            locker.will_retry(job.name, slot, attempt)
        self._dispatch(job, slot)
        return True
