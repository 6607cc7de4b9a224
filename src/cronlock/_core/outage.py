"""Slots owed across an outage: claimed late, once, while their grace lasts.

A slot whose claim failed because the locker's server could not be reached (it is down,
restarting, failing over; a pooler blinked: :class:`~cronlock.LockUnavailable`, a session
lost or a statement that timed out) did not run anywhere, as far as this replica knows.
With a run ledger it is *owed*: the run loop claims it again every :data:`RETRY_EVERY`
seconds until the claim is answered. Answered, it runs late, once (the ledger lets one
replica run it; the others are told ``already_ran``), or it is refused as any claim may be.
A slot whose ``misfire_grace`` passes first is reported missed: a WARNING, and
``JobSkipped(reason="misfire")``, the event a missed slot always has.

Only the latest owed slot of a job is kept: an older one it supersedes coalesces into it,
as missed slots do at start (DESIGN.md: one run of the latest slot within the grace); so
does an owed slot of a job that fired a later slot since (its claim got through first).
When nothing is owed any more, one INFO line sums the outage up: how many slots were owed,
claimed late, missed and coalesced.
Without a ledger nothing is owed: a late claim could not tell whether the slot ran.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .._clock import Clock
from .._errors import LockUnavailable, SessionLost, StatementTimeout
from .._events import EventBus, JobSkipped
from .._logs import at, get_logger
from .catchup import misfired
from .slots.account import account

if TYPE_CHECKING:
    from .job import Job

__all__ = ("RETRY_EVERY", "Owed", "unreachable")

_logger = get_logger("cronlock")

RETRY_EVERY = 0.5
"""Seconds between two claims of the slots owed across an outage (a claim made while the
locker waits before reconnecting is refused at once, without a statement)."""


_UNREACHABLE = "owed: the locker's server could not be reached"

_QUIET = 2.0
"""Seconds with nothing owed after which an outage is taken to be over (and summed up)."""


def unreachable(exc: BaseException) -> bool:
    """Whether a claim that failed with *exc* never reached a server that could answer it
    (as opposed to a refusal, a configuration error or a server error, which repeat)."""
    return isinstance(exc, LockUnavailable | SessionLost | StatementTimeout)


class Owed:
    """The slots one run loop owes across an outage, and the task that claims them again.

    *dispatch* is the run loop's; *spawn* runs a coroutine in a task the run loop owns
    (cancelled and awaited at its stop).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        bus: EventBus,
        dispatch: Callable[[Job, datetime], None],
        owe_these: Callable[[Job, list[datetime]], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._clock = clock
        self._bus = bus
        self._dispatch = dispatch
        self._owe_these = owe_these  # catch_up="all": every owed slot, in order
        self._spawn = spawn
        self._owed: dict[Job, datetime] = {}
        self._each: dict[Job, set[datetime]] = {}  # catch_up="all" jobs' owed slots
        self._retrying = False
        # What became of the slots owed since nothing was: (job name, slot) -> "claimed",
        # "missed" or "coalesced", and when the first was owed (for the summary).
        self._fate: dict[tuple[str, datetime], str] = {}
        self._since: datetime | None = None
        # The slots older owed ones were told coalesced into, per job (the latest few): one
        # of them refused "locked" is owed again (:meth:`carries`).
        self._into: dict[Job, set[datetime]] = {}

    def __len__(self) -> int:
        return len(self._owed) + len(self._each)

    def owe(self, job: Job, slot: datetime) -> None:
        """*slot* of *job* could not be claimed for want of the server: claim it later."""
        if self._since is None:
            self._since = self._clock.now()
        if job._settings.catch_up == "all":
            self._each.setdefault(job, set()).add(slot)
            self._fate[(job.name, slot)] = "owed"
            if not self._retrying:
                self._retrying = True
                self._spawn(self.retry())
            return
        known = self._owed.get(job)
        if known is not None and known >= slot:
            if known > slot and self._fate.get((job.name, slot)) != "coalesced":
                # An older slot's claim failed after a later one was owed: it coalesces.
                self._fate[(job.name, slot)] = "coalesced"
                account(self._bus, job, "coalesced", slot, slot, _UNREACHABLE, known)
                self._carried(job, known)
            return
        if known is not None:
            self._fate[(job.name, known)] = "coalesced"
            account(self._bus, job, "coalesced", known, known, _UNREACHABLE, slot)
            self._carried(job, slot)
        first = (job.name, slot) not in self._fate
        self._fate.setdefault((job.name, slot), "owed")
        if first:
            _logger.debug(
                "job %r slot %s: not claimed (the server cannot be reached); claiming it "
                "again until misfire_grace passes",
                job.name,
                slot.isoformat(),
                extra=at(job.name, slot),
            )
        self._owed[job] = slot  # an older one coalesces into it
        if not self._retrying:
            self._retrying = True
            self._spawn(self.retry())

    def _carried(self, job: Job, into: datetime) -> None:
        """Older owed slots of *job* were told coalesced into *into* (kept: the latest 8)."""
        kept = self._into.setdefault(job, set())
        kept.add(into)
        if len(kept) > 8:
            kept.discard(min(kept))

    def carries(self, job: Job, slot: datetime) -> bool:
        """Whether older owed slots of *job* were told coalesced into *slot*: refused
        ``"locked"`` (the job held for another slot: a claim stuck in the outage, answered
        late, or a later slot's run), it is owed again, so that it runs, late, once the job
        is free, or coalesces into a later slot this replica fires, rather than leaving
        them coalesced into nothing."""
        kept = self._into.get(job)
        return kept is not None and slot in kept

    async def retry(self) -> None:
        """Claim the owed slots again every :data:`RETRY_EVERY` s, until none is owed for
        a while; then sum the outage up."""
        try:
            # A claim made again may fail again (and owe its slot again) once its answer
            # comes: the outage is over when nothing was owed for _QUIET seconds.
            idle = 0.0
            while idle < _QUIET:
                await self._sleep(RETRY_EVERY)
                if not self._owed and not self._each:
                    idle += RETRY_EVERY
                    continue
                idle = 0.0
                owed, self._owed = self._owed, {}
                each, self._each = self._each, {}
                now = self._clock.now()
                for job, slot in owed.items():
                    if job._scheduler is None:
                        continue  # removed meanwhile
                    self._again(job, slot, now)
                for job, slots in each.items():
                    if job._scheduler is not None:
                        for slot in slots:
                            self._fate[(job.name, slot)] = "claimed"
                        self._owe_these(job, sorted(slots))
            self._sum_up()
        finally:
            self._retrying = False

    async def _sleep(self, seconds: float) -> None:
        await self._clock.sleep_until(self._clock.now() + timedelta(seconds=seconds))

    def _sum_up(self) -> None:
        """Nothing is owed any more: one INFO line on what became of the slots."""
        fate, self._fate = self._fate, {}
        since, self._since = self._since, None
        if not fate or since is None:
            return
        counts = {kind: sum(1 for f in fate.values() if f == kind) for kind in set(fate.values())}
        _logger.info(
            "the locker's server answers again: of %d slot(s) due while it could not be "
            "reached (since %s, %.1fs ago), %d claimed late, %d missed (past "
            "misfire_grace), %d coalesced into a later one",
            len(fate),
            since.isoformat(timespec="seconds"),
            (self._clock.now() - since).total_seconds(),
            counts.get("claimed", 0),
            counts.get("missed", 0),
            counts.get("coalesced", 0),
        )

    def _again(self, job: Job, slot: datetime, now: datetime) -> None:
        if job._dispatched is not None and job._dispatched > slot:
            # A later slot of the job was fired since (its claim got through, or it is
            # owed instead): this one coalesces into it, as missed slots do at start.
            self._fate[(job.name, slot)] = "coalesced"
            account(self._bus, job, "coalesced", slot, slot, _UNREACHABLE, job._dispatched)
            self._carried(job, job._dispatched)
            _logger.debug(
                "job %r slot %s: coalesced into a later slot fired since",
                job.name,
                slot.isoformat(),
                extra=at(job.name, slot),
            )
            return
        grace = job.misfire_grace
        lateness = misfired(grace, job.fire_time(slot), now)
        if lateness is not None:
            _logger.warning(
                "job %r slot %s: missed: the server could not be reached until %.0fs "
                "after it, past misfire_grace (%ss)",
                job.name,
                slot.isoformat(),
                lateness,
                grace,
                extra=at(job.name, slot),
            )
            self._bus.emit(JobSkipped(job.name, slot, "misfire"))
            reason = f"{_UNREACHABLE} until past misfire_grace ({grace}s)"
            account(self._bus, job, "missed", slot, slot, reason)
            self._fate[(job.name, slot)] = "missed"
            return
        self._fate[(job.name, slot)] = "claimed"
        # A failed claim of this dispatch owes the slot again (the run loop's _run).
        self._dispatch(job, slot)
