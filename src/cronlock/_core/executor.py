"""How one run goes: elector, lock, the task under its timeout, outcome, release, events."""

from __future__ import annotations

import asyncio
import typing
from asyncio import current_task
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import datetime, timedelta
from logging import DEBUG
from typing import Any, cast

from .._clock import Clock
from .._events import (
    EventBus,
    JobCancelled,
    JobEvent,
    JobFailed,
    JobSkipped,
    JobStarted,
    JobSucceeded,
    JobTimedOut,
    LockLost,
    RunOverran,
)
from .._locking.protocols import (
    GRANTED_ATTEMPT,
    Elector,
    Hold,
    InheritingHold,
    LosableHold,
    RecordingHold,
    hold_hooks,
)
from .._logs import at, get_logger, say
from .._records import NEVER_BEGAN, PAUSED_BEFORE_START, RunRecord, error_summary, timed_out_error
from .._schedules.interval import IntervalSchedule
from .._threads import ThreadRun
from .admission import Admission
from .guard import Deadlines, Lane, RunGuard, take_back
from .job import Job
from .slots.account import account
from .slots.gone import held_by_gone

__all__ = ("BEGUN", "Executor")

_FOREVER = timedelta.max  # no misfire grace

_logger = get_logger("cronlock")

BEGUN: ContextVar[bool] = ContextVar("cronlock_begun", default=False)
"""Set in a general-path run's task once the run began (:meth:`Executor._execute`): the run
loop then knows whether the run it sees end counted towards ``max_runs`` already."""
_lock_logger = get_logger("cronlock.lock")


class Executor:
    """Runs single slots of jobs; shared by every job of one scheduler."""

    __slots__ = (
        "_admission",
        "_bus",
        "_cancel_on_lock_loss",
        "_clock",
        "_deadlines",
        "_default_timeout",
        "_elected_guards",
        "_loop",
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
        self._loop = asyncio.get_running_loop()  # made by Scheduler.start, in its loop
        # On the real clock every run deadline shares one event-loop timer.
        self._deadlines = Deadlines() if loop_time else None
        # Guards of elected runs (started as leader): ended together when leadership is lost.
        self._elected_guards: set[RunGuard] = set()
        self._clock = clock
        self._bus = bus
        self._admission = Admission(clock, elector)
        self._default_timeout = default_timeout

    async def run(
        self,
        job: Job,
        slot: datetime,
        *,
        report: bool = True,
        tell: Callable[[JobEvent], None] | None = None,
        attempt: int = 1,
    ) -> JobEvent | None:
        """Run *slot* of *job* and return the final event (also emitted); *attempt* is the
        try at the slot it is (2, 3, ... for retries: ``RunContext.attempt``).

        With ``report=False`` a successful run nobody subscribed to returns ``None``
        instead of building an event no one reads (the run loop's hot path). *tell* is
        given the outcome as soon as it is known when the run goes on past it: a plain
        function's run that timed out, whose thread the run waits for (:meth:`_overrun`).
        """
        if not job._wiring.gated:
            return await self._execute(job, slot, None, report, tell, attempt)
        job._waits(True)
        try:
            gate = await self._admission.admit(job, slot)
        finally:
            job._waits(False)
        if isinstance(gate, JobEvent):
            self._bus.emit(gate)
            if type(gate) is JobSkipped and gate.reason == "paused":
                account(self._bus, job, "skipped", slot, slot, "paused fleet-wide")
            if isinstance(gate, JobSkipped) and gate.reason in ("already_ran", "locked"):
                # Another replica ran it: learn how the fleet's runs went, from what the
                # refusal said when the locker tells (no read), else from a throttled read.
                batch = job._wiring.batch
                told = None if batch is None else batch.refusal_history(job.name)
                if told is not None:
                    job._learn(*told)
                else:
                    await self._admission.refresh_history(job)
            return gate
        if gate is None:
            return await self._execute(job, slot, None, report, tell, attempt)
        if hold_hooks(gate).inherits and (gone := cast(InheritingHold, gate).took_over()):
            held_by_gone(self._bus, job, slot, gone)
        try:
            if not report:  # a slot of its schedule (a run asked for starts whatever)
                if job._wiring.ahead:  # fired ahead for its claim: start on time
                    await self._until(job, slot, gate)
                if job._paused:  # paused while its claim was out: checked at the instant
                    return self._withdrawn(job, slot, gate)
            # A timed-out thread's run returns only once the thread has: the claim is
            # released below, never while the work still goes on. A hold granted for a
            # later try (the ledger's takeover of a crashed run's slot: 2) tells the body.
            attempt = max(attempt, GRANTED_ATTEMPT.get())
            return await self._execute(job, slot, gate, report, tell, attempt)
        finally:
            job._waits(True)
            try:
                await self._admission.release(job, slot, gate)
            finally:
                job._waits(False)

    async def _until(self, job: Job, slot: datetime, hold: Hold) -> None:
        """Wait for the instant *slot* fires at; cancelled meanwhile, the run is recorded
        ``"cancelled"`` (the claim is kept: the slot does not run elsewhere either)."""
        start = job.fire_time(slot)
        if start <= self._clock.now():
            return
        try:
            await self._clock.sleep_until(start)
        except asyncio.CancelledError:
            self._cancelled(job, slot, self._clock.now(), hold)
            raise

    def _withdrawn(self, job: Job, slot: datetime, hold: Hold) -> JobEvent:
        """*job* was paused here after its slot's claim went out (ahead of the slot, or
        while the claim's round trip was on): the run does not begin. The claim is given
        back as a run that never began, recorded ``"cancelled"`` (the other replicas were
        refused this slot, so none runs it); the event is ``JobSkipped(reason="paused")``."""
        now = self._clock.now()
        say(_logger, DEBUG, job.name, slot, "paused before its slot began, not run")
        record = RunRecord(slot, now, now, "cancelled", PAUSED_BEFORE_START)
        return self._end(job, hold, record, JobSkipped(job.name, slot, "paused"))

    def timeout_of(self, job: Job) -> float | None:
        """The job's timeout, or the scheduler's default."""
        return job.timeout if job.timeout is not None else self._default_timeout

    def takes_direct(self, job: Job) -> bool:
        """Whether runs of *job* nobody waits for can take the direct path (see
        :meth:`run_direct`): no elector or locker to ask, and no timeout or one on the real
        clock's shared timers; a job with retries never: its outcome decides a retry)."""
        return (
            not job._wiring.gated
            and not job._settings.retries
            and (self._deadlines is not None or self.timeout_of(job) is None)
        )

    def fast_of(self, job: Job) -> tuple[timedelta, timedelta, Lane | None] | None:
        """What the run loop's fast path needs to fire *job*: (step to the next slot, misfire
        grace, deadline lane); None when its runs need the general rules (not a grid
        schedule, a jitter, run cap, end, note, locker, elector, or a virtual clock's
        timeout)."""
        schedule = job._schedule  # anchor + k * interval: the next slot is one addition away
        if (
            type(schedule) is not IntervalSchedule
            or job.jitter
            or job.max_runs is not None
            or job._settings.stop_at is not None
            or job._wiring.note is not None
            or not self.takes_direct(job)
        ):
            return None
        grace = _FOREVER if job.misfire_grace is None else timedelta(seconds=job.misfire_grace)
        return (schedule.interval, grace, self.lane_of(job))

    def lane_of(self, job: Job) -> Lane | None:
        """The deadline lane of a run of *job* on the direct path (None: no timeout)."""
        timeout = self.timeout_of(job)
        if timeout is None:
            return None
        assert self._deadlines is not None
        return self._deadlines.lane(timeout)

    async def run_direct(
        self,
        job: Job,
        slot: datetime,
        lane: Lane | None,
        ended: Callable[[Job, asyncio.Task[Any] | None], None],
    ) -> None:
        """Run *slot* of *job* on the direct path (the common run: see :meth:`takes_direct`;
        nobody waits for its event), under *lane*'s timeout (None: none). One coroutine does
        what :meth:`run`, ``_execute`` and :class:`RunGuard` do; the outcome goes to the same
        recorders; *ended* is called with the task last."""
        task = current_task(self._loop)
        assert task is not None
        try:
            number = job._begin()
            bus = self._bus
            started = self._clock.now()
            if not bus.silent and bus.wants(JobStarted):
                bus.emit(JobStarted(job.name, slot, started, number))
            cancelling = 0
            if lane is not None:
                # RunGuard's rules, inline: at the deadline the lane cancels the task (and
                # drops its entry); on the way out take_back() says whose cancellation it was.
                cancelling = task.cancelling()
                lane.watch(task)
            call: Awaitable[object] | None = None  # a ThreadRun: see _overrun
            try:
                call = job.call(slot, started, number)
                result = await call
            except asyncio.CancelledError as exc:
                if lane is None or lane.drop(task) or not take_back(task, cancelling, exc):
                    self._cancelled(job, slot, started, None)
                    raise
            except Exception as exc:
                if lane is None or lane.drop(task) or not take_back(task, cancelling, exc):
                    self._failed(job, slot, started, exc, None)
                    return
            else:
                if lane is not None and lane.entries.pop(task, None) is None:  # lane.drop()
                    take_back(task, cancelling, None)  # expired as it returned: a success
                self._succeeded(job, slot, started, result, False, None)
                return
            assert lane is not None  # only a deadline gets here
            self._timed_out(job, slot, started, lane.seconds)
            await self._overrun(job, slot, started, lane.seconds, call)
        except Exception:  # a bug of ours: never let it kill the scheduler
            _logger.exception(
                "job %r slot %s: internal error", job.name, slot, extra=at(job.name, slot)
            )
        finally:
            ended(job, task)

    def _timed_out(
        self,
        job: Job,
        slot: datetime,
        started: datetime,
        timeout: float | None,
        hold: Hold | None = None,
    ) -> JobEvent:
        assert timeout is not None
        finished = self._clock.now()
        error = timed_out_error(timeout)
        _logger.error("job %r slot %s %s", job.name, slot, error, extra=at(job.name, slot))
        record = RunRecord(slot, started, finished, "timed_out", error)
        event = JobTimedOut(job.name, slot, started, finished, timeout)
        return self._end(job, hold, record, event)

    async def _overrun(
        self,
        job: Job,
        slot: datetime,
        started: datetime,
        timeout: float | None,
        call: Awaitable[object] | None,
    ) -> None:
        """A run timed out (recorded already); if its body is a worker thread still going,
        the run stays in flight until the thread returns: its task does not end, so the
        run loop applies the job's overlap policy to the slots due meanwhile, and its claim
        (released by the caller once we return) is kept, and renewed in lease mode. A
        thread cannot be stopped; holding on is what keeps a second copy from starting.

        Cancelled meanwhile (a shutdown past ``stop_timeout``, ``overlap="replace"``), we
        stop waiting: the claim is released and the thread goes on in the background.
        """
        if not isinstance(call, ThreadRun) or not call.running:
            return
        assert timeout is not None
        name = job.name
        _logger.warning(
            "job %r slot %s: its thread cannot be stopped and still runs; the run stays in "
            "flight (its claim held, overlap=%r applies) until the thread returns",
            name,
            slot,
            job.overlap,
            extra=at(name, slot),
        )
        try:
            await call.wait_returned()
        except asyncio.CancelledError:
            _logger.warning(
                "job %r slot %s: cancelled while its timed-out thread still runs; its claim "
                "is released, the thread goes on in the background",
                name,
                slot,
                extra=at(name, slot),
            )
            raise
        returned = self._clock.now()
        overran = max((returned - started).total_seconds() - timeout, 0.0)
        _logger.warning(
            "job %r slot %s: its thread returned %.3fs past its %ss timeout%s",
            name,
            slot,
            overran,
            timeout,
            "" if call.error is None else ", raising",
            exc_info=call.error,
            extra=at(name, slot),
        )
        self._bus.emit(RunOverran(name, slot, started, returned, timeout, overran))

    def demote(self, reason: BaseException | None) -> None:
        """This replica stopped leading: end its elected runs (event ``LockLost``)."""
        if not self._cancel_on_lock_loss:
            _lock_logger.error("leadership lost (%s); elected runs go on", reason)
            return
        for guard in tuple(self._elected_guards):
            guard.lose(reason)

    async def refresh_history(self, job: Job, *, force: bool = False) -> None:
        """Copy the fleet-wide last run and last success from a ledger into *job* (see
        :meth:`Admission.refresh_history`)."""
        await self._admission.refresh_history(job, force=force)

    async def _execute(
        self,
        job: Job,
        slot: datetime,
        hold: Hold | None,
        report: bool,
        tell: Callable[[JobEvent], None] | None = None,
        attempt: int = 1,
    ) -> JobEvent | None:
        clock = self._clock
        bus = self._bus
        number = job._begin()
        BEGUN.set(True)  # in the run task's context: the run loop reads it at the end
        started = clock.now()
        if bus.wants(JobStarted):
            bus.emit(JobStarted(job.name, slot, started, number))
        timeout = self.timeout_of(job)
        elected = job._wiring.elected
        guard = RunGuard(clock, timeout, self._deadlines)
        if elected:
            self._elected_guards.add(guard)
        lost = (
            hold is not None
            and hold_hooks(hold).losable
            and bool(
                typing.cast(LosableHold, hold).on_lost(
                    guard.lose if self._cancel_on_lock_loss else _log_loss(job, slot)
                )
            )
        )
        call: Awaitable[object] | None = None  # a ThreadRun: see _overrun
        try:
            async with guard:
                if lost:
                    # Lost before the body began (claimed ahead, its session died while the
                    # run waited for its slot): the loss's callback is due at this turn of
                    # the loop; take it here, so that the body never starts without its lock.
                    await asyncio.sleep(0)
                call = job.call(slot, started, number, attempt)
                result = await call
        except asyncio.CancelledError:
            self._cancelled(job, slot, started, hold)
            raise
        except Exception as exc:
            if guard.ended_run and guard.reason == "timeout":
                timed_out = self._timed_out(job, slot, started, timeout, hold)
                if tell is not None:
                    tell(timed_out)
                await self._overrun(job, slot, started, timeout, call)
                return timed_out
            if guard.ended_run:  # its lock was lost
                finished = clock.now()
                if lost:  # no body ran: nothing was cancelled, and the slot is owed
                    _lock_logger.warning(
                        "job %r slot %s not begun: its lock was lost before the run began "
                        "(%s); the slot is owed",
                        job.name,
                        slot,
                        guard.lost_because,
                        extra=at(job.name, slot),
                    )
                else:
                    _lock_logger.error(
                        "job %r slot %s cancelled: its lock was lost (%s)",
                        job.name,
                        slot,
                        guard.lost_because,
                        extra=at(job.name, slot),
                    )
                # Lost before the body began: nothing ran, and the ledger says so (the
                # slot is then claimed again: _core/recovery.py).
                record = RunRecord(
                    slot, started, finished, "lock_lost", NEVER_BEGAN if lost else None
                )
                event: JobEvent = LockLost(job.name, slot, started, finished, guard.lost_because)
                return self._end(job, hold, record, event)
            return self._failed(job, slot, started, exc, hold)
        finally:
            self._elected_guards.discard(guard)
        return self._succeeded(job, slot, started, result, report, hold)

    def _end(self, job: Job, hold: Hold | None, record: RunRecord, event: JobEvent) -> JobEvent:
        """A run ended as *record* says: store it, hand it to a recording hold, emit *event*.

        The record goes to the hold directly (the ledger writes it with the release, in
        one round trip), never read back from the job.
        """
        job._finish(record)
        if hold is not None and hold_hooks(hold).records:
            typing.cast(RecordingHold, hold).record(record)
        self._bus.emit(event)
        return event

    def _succeeded(
        self,
        job: Job,
        slot: datetime,
        started: datetime,
        result: object,
        report: bool,
        hold: Hold | None,
    ) -> JobEvent | None:
        """A run succeeded (every path records a success here; other outcomes: :meth:`_end`).
        Its event is returned if *report* (somebody waits for it), else None."""
        finished = self._clock.now()
        if _logger.isEnabledFor(DEBUG):  # every run, on every replica: not INFO
            duration = (finished - started).total_seconds()
            _logger.debug(
                "job %r slot %s succeeded in %.3f s",
                job.name,
                slot,
                duration,
                extra={**at(job.name, slot), "duration": duration},
            )
        if hold is not None:
            record = RunRecord(slot, started, finished, "succeeded")
            event = JobSucceeded(job.name, slot, started, finished, result)
            return self._end(job, hold, record, event)
        # The hot path: a plain tuple, made into a RunRecord only if somebody reads it, and
        # no event nobody listens to or waits for.
        job._succeeded((slot, started, finished, "succeeded"))
        bus = self._bus
        wanted = not bus.silent and bus.wants(JobSucceeded)
        if not (report or wanted):
            return None
        event = JobSucceeded(job.name, slot, started, finished, result)
        if wanted:
            bus.emit(event)
        return event

    def _failed(
        self, job: Job, slot: datetime, started: datetime, exc: Exception, hold: Hold | None
    ) -> JobEvent:
        finished = self._clock.now()
        _logger.error(
            "job %r slot %s failed", job.name, slot, exc_info=exc, extra=at(job.name, slot)
        )
        record = RunRecord(slot, started, finished, "failed", error_summary(exc))
        return self._end(job, hold, record, JobFailed(job.name, slot, started, finished, exc))

    def _cancelled(self, job: Job, slot: datetime, started: datetime, hold: Hold | None) -> None:
        finished = self._clock.now()
        record = RunRecord(slot, started, finished, "cancelled", None)
        self._end(job, hold, record, JobCancelled(job.name, slot, started, finished))


def _log_loss(job: Job, slot: datetime) -> Callable[[BaseException | None], None]:
    def log(exc: BaseException | None) -> None:
        _lock_logger.error(
            "job %r slot %s: its lock was lost (%s); the run goes on (on_lock_lost='continue')",
            job.name,
            slot,
            exc,
            extra=at(job.name, slot),
        )

    return log
