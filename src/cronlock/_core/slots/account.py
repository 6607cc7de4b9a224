"""The one call that tells a slot's fate: :func:`account`.

Whatever decided it (the run loop finding a slot past its grace or several slots due at
once, catch-up after the fleet was down, slots owed across an outage, the overlap policy,
a pause), the fate is told here, one way: a :class:`~cronlock.SlotsDecided` event (which
the metrics count) and, when the job's locker keeps a ledger that records fates, a record
of the range in it, so that ``python -m cronlock history JOB --slots`` tells it from the
ledger alone. A run that happens tells its own fate, by its row in the ledger.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from ..._events import EventBus, SlotsDecided
from ..._fates import Fate
from ..._logs import at, get_logger
from .fate import count_slots

if TYPE_CHECKING:
    from ..job import Job

__all__ = ("account",)

_logger = get_logger("cronlock")


def account(
    bus: EventBus,
    job: Job,
    fate: Fate,
    first: datetime,
    last: datetime,
    reason: str,
    into: datetime | None = None,
) -> None:
    """Tell that the slots of *job* from *first* to *last* (both included) met *fate*
    for *reason* (*into*: the slot they coalesced into). Never raises: a record that
    cannot be kept is logged, and the run loop goes on."""
    record = job._wiring.record
    if record is not None:
        try:
            record(job.name, first, last, fate, reason, into)
        except Exception:
            _logger.exception(
                "job %r: recording the fate of slot(s) from %s failed",
                job.name,
                first.isoformat(),
                extra=at(job.name, first),
            )
    if bus.silent or not bus.wants(SlotsDecided):
        return
    count = count_slots(job, first, last)
    bus.emit(SlotsDecided(job.name, first, last, count, fate, reason, into))
