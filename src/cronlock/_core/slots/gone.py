"""Slots held by a holder that is gone: owed, and told, when another replica takes over.

A holder that dies, freezes or is cut off mid-run keeps its job's lease until the lease
lapses (lease mode), or its lock until its lock session ends (session mode: at once for a
killed one; a frozen one's is ended by the crash check once its membership expires): every
other replica's claim of the job's slots meanwhile is refused as ``locked``, the answer a
healthy fleet gives every slot, and the holder itself says nothing of them. The claim that
takes the job over learns whose it was
(:class:`~cronlock._locking.protocols.GoneHolder`); no slot of the job between that
holder's run and this one ran. Those due after the holder's last sign of life are owed
(DESIGN.md: held by the dead is owed, not lost) and, with one run due now, coalesce into it:
:func:`held_by_gone` tells their fate and says so once, at WARNING.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..._events import EventBus
from ..._logs import at, get_logger
from .account import account
from .fate import COUNT_AT_MOST

if TYPE_CHECKING:
    from ..._locking.protocols import GoneHolder
    from ..job import Job

__all__ = ("held_by_gone",)

_logger = get_logger("cronlock")

_A_MICROSECOND = timedelta(microseconds=1)


def held_by_gone(bus: EventBus, job: Job, slot: datetime, gone: GoneHolder) -> None:
    """*slot* of *job* was claimed by taking the job over from *gone*: tell the slots
    between that were held by it (due after its last sign of life, and claimed before its
    hold lapsed: a slot's claim goes out up to the locker's claim-ahead before it; later
    ones fell due while nothing held the job, which is another account) coalesced into
    *slot*. Never raises."""
    try:
        before = min(slot, gone.lapsed + job._wiring.ahead + _A_MICROSECOND)
        first, last, count = _between(job, max(gone.slot, gone.since), gone.slot, before)
    except Exception:  # a schedule that fails: the run goes on, untold
        _logger.exception("job %r: the slots held by %s could not be listed", job.name, gone)
        return
    if first is None or last is None:
        return
    ended = f"whose {gone.how} by {gone.lapsed.isoformat(timespec='seconds')}"
    reason = f"owed: held by {gone.holder}, {ended} (killed, frozen or cut off mid-run)"
    _logger.warning(
        "job %r: %d slot(s) from %s to %s were held by %s, %s (killed, frozen or cut off "
        "mid-run): coalesced into slot %s, which runs now",
        job.name,
        count,
        first.isoformat(),
        last.isoformat(),
        gone.holder,
        ended,
        slot.isoformat(),
        extra=at(job.name, slot),
    )
    account(bus, job, "coalesced", first, last, reason, into=slot)


def _between(
    job: Job, since: datetime, held: datetime, slot: datetime
) -> tuple[datetime | None, datetime | None, int]:
    """The first and last slot of *job* after *held*, at or after *since*, before *slot*
    (*slot* itself or the instant after the hold lapsed), and how many (counted up to
    :data:`.fate.COUNT_AT_MOST`)."""
    nxt = job.slot_after(held)
    while nxt is not None and nxt < since:
        nxt = job.following(nxt)
    first = last = None
    count = 0
    while nxt is not None and nxt < slot and count < COUNT_AT_MOST:
        first = first or nxt
        last, count = nxt, count + 1
        nxt = job.following(nxt)
    return first, last, count
