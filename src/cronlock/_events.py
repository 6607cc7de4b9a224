"""Frozen, past-tense event classes and the subscription bus that delivers them."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from ._cancel import task_name
from ._fates import Fate
from ._logs import at, get_logger

__all__ = (
    "RUN_ENDINGS",
    "Event",
    "EventBus",
    "JobCancelled",
    "JobCrashed",
    "JobEvent",
    "JobFailed",
    "JobRetrying",
    "JobSkipped",
    "JobStarted",
    "JobSucceeded",
    "JobTimedOut",
    "Listener",
    "LockFailed",
    "LockHeldElsewhere",
    "LockLost",
    "RunOverran",
    "ScheduleRejected",
    "SchedulerStarted",
    "SchedulerStopped",
    "SkipReason",
    "SlotFate",
    "SlotsDecided",
    "Subscription",
)

_logger = get_logger("cronlock.events")

SkipReason = Literal[
    "overlap", "misfire", "locked", "not_leader", "already_ran", "paused", "standby"
]
"""Why a slot did not run here: still busy, too late, another replica has the lock, not the
leader, the run ledger shows the slot already ran, the job is paused fleet-wide, or other
replicas of a large fleet claim this job (``standby``; :class:`JobSkipped`'s ``reason``)."""


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of every event."""


@dataclass(frozen=True, slots=True)
class SchedulerStarted(Event):
    """The scheduler started firing jobs."""


@dataclass(frozen=True, slots=True)
class SchedulerStopped(Event):
    """The scheduler stopped; no job of it is running any more."""


@dataclass(frozen=True, slots=True)
class JobEvent(Event):
    """Base class of the events about one slot of one job.

    *slot* is the scheduled instant (aware UTC) the run belongs to; ``run_now()`` runs carry
    the instant they were requested at.
    """

    job: str
    slot: datetime


@dataclass(frozen=True, slots=True)
class JobStarted(JobEvent):
    """A run began executing the task."""

    started_at: datetime
    run_number: int


@dataclass(frozen=True, slots=True)
class JobSucceeded(JobEvent):
    """A run returned normally."""

    started_at: datetime
    finished_at: datetime
    return_value: object = None


@dataclass(frozen=True, slots=True)
class JobFailed(JobEvent):
    """A run raised; *exception* is what it raised (its traceback was logged)."""

    started_at: datetime
    finished_at: datetime
    exception: BaseException


@dataclass(frozen=True, slots=True)
class JobTimedOut(JobEvent):
    """A run exceeded its timeout and was cancelled."""

    started_at: datetime
    finished_at: datetime
    timeout: float


@dataclass(frozen=True, slots=True)
class RunOverran(JobEvent):
    """The worker thread of a plain-function run that timed out has returned, *overran*
    seconds after its deadline (at *returned_at*; the run started at *started_at* with
    *timeout*).

    A thread cannot be stopped: at the timeout the run is recorded ``"timed_out"``
    (:class:`JobTimedOut`), but it stays in flight, its claim held and its next slots
    handled by its ``overlap`` policy, until its thread returns; then its claim is
    released and this event is emitted. Logged at WARNING.
    """

    started_at: datetime
    returned_at: datetime
    timeout: float
    overran: float


@dataclass(frozen=True, slots=True)
class JobCancelled(JobEvent):
    """A run was cancelled: by the ``replace`` overlap policy, removal, or shutdown."""

    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class JobSkipped(JobEvent):
    """A slot was not run here; *reason* says why."""

    reason: SkipReason


SlotFate = Fate
"""What became of a slot (DESIGN.md §3a): it ran; it was owed and ran late; it was folded
into the run of a later slot of its job (``coalesced``); its grace ran out before it could
run (``missed``); or it was not run for a named reason (``skipped``)."""


@dataclass(frozen=True, slots=True)
class SlotsDecided(JobEvent):
    """The slots of the job from *slot* to *last* (both included; *count* of them) did not
    run, and this replica decided their *fate*: ``"coalesced"`` into the run of slot *into*,
    ``"missed"`` or ``"skipped"``, for *reason* (words: "the server could not be reached",
    "still running", "paused fleet-wide", ...).

    The one account of a slot that did not simply run: the ledger records the same fate
    (``python -m cronlock history JOB --slots``), and ``cronlock_slots_total{fate}`` counts
    it. A slot another replica ran meanwhile ran all the same: the ledger's run wins. A
    run's own fate (``ran``, ``ran_late``) is told by its row in the ledger.
    """

    last: datetime
    count: int
    fate: SlotFate
    reason: str
    into: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobRetrying(JobEvent):
    """Attempt *attempt* - 1 of *slot* failed (or timed out) with *error*; attempt *attempt*
    starts in *delay* seconds (``retries``, ``retry_delay``). With a ledger each attempt is
    claimed in it, so a slot is tried ``1 + retries`` times in the whole fleet."""

    attempt: int
    delay: float
    error: str


@dataclass(frozen=True, slots=True)
class LockFailed(JobEvent):
    """The locker or elector raised; the slot was skipped on this replica."""

    exception: BaseException


@dataclass(frozen=True, slots=True)
class LockLost(JobEvent):
    """The lock of a running run was lost (its session died); the run was cancelled.

    Mutual exclusion no longer held, so by default the scheduler ends the run at once
    (``Scheduler(on_lock_lost="continue")`` lets it finish, logging an error instead).
    """

    started_at: datetime
    finished_at: datetime
    exception: BaseException | None


RUN_ENDINGS: dict[type[Event], str] = {
    JobSucceeded: "succeeded",
    JobFailed: "failed",
    JobTimedOut: "timed_out",
    JobCancelled: "cancelled",
    LockLost: "lock_lost",
}
"""The events that end a run, each with the outcome label metrics and traces give it."""


@dataclass(frozen=True, slots=True)
class JobCrashed(JobEvent):
    """A run of *slot* claimed by *owner* (``host:pid``) died mid-run: this replica found
    its ledger row unfinished and its lock session gone, and marked it ``"crashed"``.

    *recovered*: this replica runs the slot again (the job has ``recover=True`` and the slot
    is within ``misfire_grace``); that run's own events follow. Emitted on the one replica
    that marked the row. (In lease mode the run's lease expired instead.)
    """

    owner: str
    started_at: datetime
    recovered: bool


@dataclass(frozen=True, slots=True)
class LockHeldElsewhere(JobEvent):
    """The job's lock key is held by a session outside this fleet, so its claims (of *slot*
    and after) were refused ``"locked"``: another service contends for the same key (a Go
    service using the recipe, ``locked_run``, ``bare_keys=True`` in a shared database).
    *holder* describes that session (pid, ``application_name``, address). Emitted once per
    job by each replica that found it; the locker logs a WARNING with it.
    """

    holder: str


@dataclass(frozen=True, slots=True)
class RunRestored(JobEvent):
    """This replica's run of *slot* was missing from the ledger of a new primary (a
    failover lost its claim or its outcome: asynchronous replication, a lagging standby),
    and the locker wrote it back, so no replica runs the slot again. Emitted once per run
    written back, by the replica that ran it, with a WARNING (docs/guides/failover.md).
    """


@dataclass(frozen=True, slots=True)
class SlotRanTwice(JobEvent):
    """*slot* ran here and on *other* (the replica named as the ledger names it): a
    failover lost this replica's claim before it could be written back, and *other*
    claimed the slot on the new primary. Logged at ERROR; make such jobs idempotent, or
    use synchronous replication (docs/guides/failover.md)."""

    other: str


@dataclass(frozen=True, slots=True)
class ScheduleRejected(Event):
    """This replica could not register revision *revision* of the stored schedule
    *schedule*, which names task *task*: *reason* says why (no such task here, kwargs that
    do not fit it, a clash with a job defined in code). The other schedules go on; the
    store notes the problem, so ``status`` and the dashboard show it. Emitted once per
    revision by each replica that rejects it (with a WARNING).
    """

    schedule: str
    task: str
    revision: int
    reason: str


Listener = Callable[[Event], object] | Callable[[Event], Awaitable[object]]


class Subscription:
    """Handle returned by ``Scheduler.subscribe()``; call :meth:`unsubscribe` to stop."""

    __slots__ = ("_bus", "callback", "types")

    def __init__(self, bus: EventBus, callback: Listener, types: tuple[type[Event], ...]) -> None:
        self._bus = bus
        self.callback = callback
        self.types = types

    def unsubscribe(self) -> None:
        """Stop delivering events to this callback; calling it twice is harmless."""
        self._bus.remove(self)


class EventBus:
    """Delivers events to subscribers; a failing subscriber is logged, never propagated."""

    __slots__ = ("_pending", "_subs", "_wanted", "silent")

    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._pending: set[asyncio.Task[None]] = set()
        self._wanted: dict[type[Event], bool] = {}
        self.silent = True
        """Nobody is subscribed: the hot path reads this before :meth:`wants`."""

    def add(self, callback: Listener, types: tuple[type[Event], ...]) -> Subscription:
        sub = Subscription(self, callback, types or (Event,))
        self._subs.append(sub)
        self._wanted.clear()
        self.silent = False
        return sub

    def remove(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)
            self._wanted.clear()
            self.silent = not self._subs

    def wants(self, kind: type[Event]) -> bool:
        """Whether any subscriber takes events of *kind* (lets the hot path skip building them)."""
        try:
            return self._wanted[kind]
        except KeyError:
            wanted = self._wanted[kind] = any(issubclass(kind, s.types) for s in self._subs)
            return wanted

    def emit(self, event: Event) -> None:
        """Call sync listeners now; schedule async ones as owned tasks."""
        for sub in tuple(self._subs):
            if not isinstance(event, sub.types):
                continue
            try:
                result = sub.callback(event)
            except Exception:
                _logger.exception(
                    "event listener %r failed on %r", sub.callback, event, extra=_about(event)
                )
                continue
            if inspect.isawaitable(result):
                task = asyncio.create_task(
                    self._await(sub, event, result),
                    name=task_name("listener", event.job if isinstance(event, JobEvent) else None),
                )
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)

    @staticmethod
    async def _await(sub: Subscription, event: Event, result: Awaitable[object]) -> None:
        try:
            await result
        except Exception:
            _logger.exception(
                "event listener %r failed on %r", sub.callback, event, extra=_about(event)
            )

    async def drain(self) -> None:
        """Wait for async listeners still running (used at shutdown)."""
        while self._pending:
            await asyncio.gather(*tuple(self._pending), return_exceptions=True)


def _about(event: Event) -> dict[str, object]:
    """The log record attributes of a record about *event*."""
    return at(event.job, event.slot) if isinstance(event, JobEvent) else at(None)
