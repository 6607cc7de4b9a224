"""Catch-up at start: slots that passed before this replica started and no replica claimed.

At start the run loop plans each job's first slot after the start instant; every slot from
that one on is the run loop's. Catch-up looks only at the slots before it: those after the
latest slot any replica claimed (the ledger says which) are the ones that may have passed
while no replica ran them. Reading that for every job costs one statement per few thousand
jobs with a :class:`~cronlock._locking.protocols.BatchLedgerLocker` (one read per job otherwise), so
it is done within moments of the start, not one job at a time behind the lock claims.

What it logs means what it says. A slot still within its ``misfire_grace`` may be in
flight on a replica that lags (its claim not yet written): it is not reported, the latest
such slot is dispatched like any late slot (the ledger lets one replica run it; the others
find it ``already_ran``). Only slots whose grace had passed by the time of the read, which
no replica's run loop fires any more, are logged as missed, at WARNING.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .._clock import Clock
from .._events import EventBus, JobSkipped
from .._locking.protocols import BatchLedgerLocker
from .._logs import at, get_logger
from .._pacing import Pacer
from .slots.account import account
from .slots.fate import ONE_MICROSECOND

if TYPE_CHECKING:
    from .executor import Executor
    from .job import Job

__all__ = ("MAX_OWED", "CatchUp", "latest_due", "misfired", "owed_slots")

_logger = get_logger("cronlock")


def misfired(grace: float | None, fire: datetime, now: datetime) -> float | None:
    """How late a slot due at *fire* is at *now*, when that is past *grace*; else None.

    The one misfire rule, for a slot found late by the run loop, for one found missed by
    catch-up after downtime, and for the rerun of a crashed run.
    """
    lateness = (now - fire).total_seconds()
    return lateness if grace is not None and lateness > grace else None


def claim_time(job: Job, fire: datetime, gap: timedelta) -> datetime:
    """When the run loop pops a slot firing at *fire*: a coordinated job whose locker
    claims ahead (:class:`~cronlock.ClaimAheadLocker`) pops early, by at most a quarter of
    *gap* (the time between two of its slots), so that its claim is answered by the slot."""
    ahead = job._wiring.ahead
    return fire - min(ahead, gap / 4) if ahead else fire


def latest_due(job: Job, slot: datetime, now: datetime) -> tuple[datetime, datetime | None]:
    """The latest slot due by *now* (from *slot* on) and the one after it."""
    following = job.following(slot)
    if following is None or job.fire_time(following) > now:
        return slot, following  # the usual case: one slot due
    # Behind (a stall, a sleep): gallop back from now to find a recent due slot
    # instead of walking every missed slot of a fine-grained schedule.
    latest = following
    span = timedelta(seconds=1)
    while now - span > latest:
        probe = job.slot_after(now - span)
        if probe is not None and job.fire_time(probe) <= now:
            latest = probe
            break
        span *= 2
    following = job.slot_after(latest)
    while following is not None and job.fire_time(following) <= now:
        latest, following = following, job.slot_after(following)
    return latest, following


def last_before(job: Job, slot: datetime, bound: datetime) -> datetime:
    """The latest slot of *job* from *slot* (itself before *bound*) on, before *bound*."""
    span = timedelta(seconds=1)
    latest = slot
    while bound - span > slot:  # gallop back from *bound*, as latest_due does from now
        probe = job.slot_after(bound - span)
        if probe is not None and probe < bound:
            latest = probe
            break
        span *= 2
    following = job.following(latest)
    while following is not None and following < bound:
        latest, following = following, job.following(following)
    return latest


MAX_OWED = 1000
"""Slots a ``catch_up="all"`` job owes at most: older ones are missed."""


def owed_slots(
    job: Job, first: datetime, last: datetime, now: datetime
) -> tuple[list[datetime], datetime | None]:
    """The slots of *job* from *first* to *last* still within their grace at *now*, oldest
    first (at most :data:`MAX_OWED`), and the last of those before them, past it (``None``:
    none is). Galloped to the grace's edge, not walked, for a long outage."""
    grace = job.misfire_grace
    start = first
    if grace is not None and misfired(grace, job.fire_time(first), now) is not None:
        edge = now - timedelta(seconds=grace)
        probe = job.slot_after(edge - timedelta(seconds=job.jitter or 0.0) - _MICRO)
        while probe is not None and probe <= last and job.fire_time(probe) < edge:
            probe = job.following(probe)
        start = last + _MICRO if probe is None or probe > last else max(probe, first)
    owed: list[datetime] = []
    slot: datetime | None = start
    while slot is not None and slot <= last:
        owed.append(slot)
        slot = job.following(slot)
    if len(owed) > MAX_OWED:
        start = owed[-MAX_OWED]
        del owed[:-MAX_OWED]
    return owed, (None if start <= first else start - _MICRO)


_MICRO = timedelta(microseconds=1)
_NO_REPLICA = "no replica ran them"


class CatchUp:
    """The run loop's catch-up at start: reads the ledger, then dispatches or reports.

    *dispatch* is the run loop's; the run loop owns the task this runs in.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        bus: EventBus,
        executor: Executor,
        dispatch: Callable[[Job, datetime], None],
        owe_each: Callable[[Job, datetime, datetime, str], None],
    ) -> None:
        self._clock = clock
        self._bus = bus
        self._executor = executor
        self._dispatch = dispatch
        self._owe_each = owe_each  # catch_up="all": each slot, in order

    async def all(
        self,
        planned: Sequence[tuple[Job, datetime | None]],
        started: datetime,
        read: Callable[[], None] = lambda: None,
    ) -> None:
        """Catch up on the jobs of *planned*, each with the first slot the run loop planned
        for it, for the slots due by *started*; *read* is called once the batched reads of
        the ledger are done (the run loop claims nothing before: a claim of a planned slot
        read back as the latest would hide the slots before it).

        Jobs whose locker reads in batches are read together, one batch per locker; the
        rest one at a time. Each job is decided on its own: one whose history or schedule
        raises is logged, and the others are caught up. The decisions of many jobs are made
        in slices (:class:`~cronlock._pacing.Pacer`), other tasks running in between; the
        runs they call for are dispatched together once a batch is decided, so that their
        claims, all due at once, still go out in batches.
        """
        batched: dict[BatchLedgerLocker, tuple[list[tuple[Job, datetime | None]], list[str]]]
        batched = {}
        single: list[tuple[Job, datetime | None]] = []
        pacer = Pacer()
        for pair in planned:  # (100,000 stored schedules' jobs at a start: in slices too)
            await pacer.pause()
            job = pair[0]
            wiring = job._wiring
            if wiring.ledger is None:
                continue  # nothing to catch up from
            if wiring.batch is not None:
                group, names = batched.setdefault(wiring.batch, ([], []))
                group.append(pair)
                names.append(job.name)
            else:
                single.append(pair)
        for locker, (group, names) in batched.items():
            try:
                found = await locker.ledger_summaries(names)
            except Exception as exc:
                _logger.error(
                    "reading the run ledger for catch-up of %d job(s) failed: %r",
                    len(group),
                    exc,
                    extra=at(None),
                )
                continue
            now = self._clock.now()
            due: list[tuple[Job, datetime]] = []
            for job, first in group:
                await pacer.pause()
                summary = found.get(job.name)
                if summary is None or job._scheduler is None:
                    continue  # the ledger never saw it (a new job starts fresh), or removed
                try:
                    job._checked(now)
                    job._learn(summary.last_run, summary.last_success)
                    slot = self.decision(job, summary.last_claimed, started, first)
                except Exception:
                    # One job's odd history (a bug, a row no check foresaw) must not cost
                    # the catch-up of the others.
                    _logger.exception("job %r: catch-up failed", job.name, extra=at(job.name))
                    continue
                if slot is not None:
                    due.append((job, slot))
            self._dispatch_all(due)
        read()
        for job, first in single:
            if job._scheduler is not None:  # still registered
                try:
                    await self.one(job, started, first)
                except Exception:
                    _logger.exception("job %r: catch-up failed", job.name, extra=at(job.name))

    def _dispatch_all(self, due: list[tuple[Job, datetime]]) -> None:
        """Dispatch the runs a batch's decisions called for, in one go (their claims are
        batched); one that raises is logged and the others go on."""
        for job, slot in due:
            if job._scheduler is None:
                continue  # removed while the batch was decided
            try:
                self._dispatch(job, slot)
            except Exception:
                _logger.exception("job %r: catch-up failed", job.name, extra=at(job.name))

    async def one(self, job: Job, started: datetime, planned: datetime | None) -> None:
        """Catch up on one *job* through its ledger, one read at a time."""
        ledger = job._wiring.ledger
        if ledger is None:
            return
        await self._executor.refresh_history(job, force=True)
        try:
            last = await ledger.last_claimed(job.name)
        except Exception as exc:
            _logger.error(
                "job %r: reading the run ledger for catch-up failed: %r",
                job.name,
                exc,
                extra=at(job.name),
            )
            return
        slot = self.decision(job, last, started, planned)
        if slot is not None:
            self._dispatch(job, slot)

    def decision(
        self, job: Job, last: datetime | None, started: datetime, planned: datetime | None
    ) -> datetime | None:
        """Deal with the slots of *job* after *last* (latest claimed) due by *started* and
        before *planned* (the first slot the run loop planned).

        The latest of them runs once when still within ``misfire_grace`` (returned: the
        slot to dispatch), else it is reported missed (``JobSkipped(reason="misfire")``).
        A job the ledger never saw (*last* None) is not caught up: a new deployment starts
        fresh.
        """
        if last is None:
            return None
        first = job.slot_after(last)
        if first is None or job.fire_time(first) > started:
            return None  # nothing passed before the start: the run loop has every slot
        if planned is not None and first >= planned:
            return None  # planned by the run loop in the instant before *started*
        now = self._clock.now()
        latest, _ = latest_due(job, first, started)
        if planned is not None and latest >= planned:
            # *planned* fell due between the planning and *started* (the first slots are
            # planned before the loop starts; stored ones while the others are read): the
            # run loop runs it now, and the slots before it are caught up by that run, or
            # (catch_up="all") each owed.
            latest = last_before(job, first, planned)
            if job._settings.catch_up != "all":
                _logger.info(
                    "job %r: slot(s) %s not claimed when this replica started; catching up "
                    "with one run of %s, due now",
                    job.name,
                    _span(first, latest),
                    planned.isoformat(),
                    extra=at(job.name, planned),
                )
                reason = "no replica ran them; caught up by one run of the latest"
                account(
                    self._bus, job, "coalesced", first, planned - ONE_MICROSECOND, reason, planned
                )
                return None
        if job._settings.catch_up == "all":
            _logger.info(
                "job %r: slot(s) %s not claimed when this replica started; catching up "
                "with a run of each within misfire_grace, in order",
                job.name,
                _span(first, latest),
                extra=at(job.name, latest),
            )
            self._owe_each(job, first, latest, _NO_REPLICA)
            return None
        grace = job.misfire_grace
        lateness = misfired(grace, job.fire_time(latest), now)
        if lateness is not None:
            _logger.warning(
                "job %r: slot(s) %s passed while no replica ran them; %.0fs late is past "
                "misfire_grace (%ss): reported missed",
                job.name,
                _span(first, latest),
                lateness,
                grace,
                extra=at(job.name, latest),
            )
            self._bus.emit(JobSkipped(job.name, latest, "misfire"))
            reason = f"no replica ran; past misfire_grace ({grace}s) when one started"
            account(self._bus, job, "missed", first, latest, reason)
            return None
        if latest > first:
            reason = "no replica ran them; caught up by one run of the latest"
            account(self._bus, job, "coalesced", first, latest - ONE_MICROSECOND, reason, latest)
        # The latest slot is still within its grace: run it. Older ones whose grace has
        # passed are missed for good (no run loop fires them any more); those still within
        # it may be in flight on a replica that lags, and are not reported as missed.
        if grace is not None and misfired(grace, job.fire_time(first), now) is not None:
            stale, _ = latest_due(job, first, now - timedelta(seconds=grace))
            _logger.warning(
                "job %r: slot(s) %s passed while no replica ran them; catching up with one "
                "run of %s",
                job.name,
                _span(first, stale),
                latest.isoformat(),
                extra=at(job.name, latest),
            )
        else:
            _logger.info(
                "job %r: slot(s) %s not claimed when this replica started; catching up "
                "with one run of %s",
                job.name,
                _span(first, latest),
                latest.isoformat(),
                extra=at(job.name, latest),
            )
        return latest


def _span(first: datetime, last: datetime) -> str:
    return first.isoformat() if first == last else f"{first.isoformat()} .. {last.isoformat()}"
