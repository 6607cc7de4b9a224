"""Catch-up after downtime: run a slot that no replica ran while all were down."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._events import EventBus, JobSkipped
from ._job import Job

if TYPE_CHECKING:
    from ._clock import Clock
    from ._executor import Executor
    from ._runloop import RunLoop

__all__ = ("catch_up",)

_logger = logging.getLogger("cronlock")


async def catch_up(
    job: Job,
    *,
    clock: Clock,
    loop: RunLoop,
    executor: Executor,
    bus: EventBus,
    locker: object,
) -> None:
    """If slots of *job* passed since the last one any replica claimed, deal with them.

    Called once per coordinated job at start when the locker keeps a ledger. The latest
    missed slot runs once (the ledger lets one replica claim it, the others skip it
    ``already_ran``) when it is within ``misfire_grace``; otherwise it is reported missed.
    A job the ledger has never seen is not caught up: a new deployment starts fresh.
    """
    await executor.refresh_history(job, force=True)
    last_claimed = getattr(locker, "last_claimed", None)
    if last_claimed is None:
        return
    try:
        last = await last_claimed(job.name)
    except Exception as exc:
        _logger.error("job %r: reading the run ledger for catch-up failed: %r", job.name, exc)
        return
    if last is None:
        return
    now = clock.now()
    first = job.slot_after(last)
    if first is None or job.fire_time(first) > now:
        return
    if job.next_run is not None and first >= job.next_run:
        return  # the run loop has it already
    latest, _ = loop.latest_due(job, first, now)
    lateness = (now - job.fire_time(latest)).total_seconds()
    span = (
        f"{first.isoformat()}"
        if latest == first
        else f"{first.isoformat()} .. {latest.isoformat()}"
    )
    if job.misfire_grace is not None and lateness > job.misfire_grace:
        _logger.warning(
            "job %r: slot(s) %s passed while no replica ran them; %.0fs late is past "
            "misfire_grace (%ss): reported missed",
            job.name,
            span,
            lateness,
            job.misfire_grace,
        )
        bus.emit(JobSkipped(job.name, latest, "misfire"))
        return
    _logger.warning(
        "job %r: slot(s) %s passed while no replica ran them; catching up with one run of %s",
        job.name,
        span,
        latest.isoformat(),
    )
    loop.dispatch(job, latest)
