"""The fates of a slot (DESIGN.md §3a) and the rule every teller of them shares.

``ran``: claimed once, its run ended with an outcome. ``ran_late``: the same, begun later
than its fire time allows (:func:`started_late`). ``coalesced``: owed with later slots of
its job, and folded into the run of a later one (``into``). ``missed``: its grace ran out
before it could run. ``skipped``: not run for a named reason (paused, still running).

Shared by the run engine (which decides fates), the metrics and the command line (which
reads them from the ledger): no import of either.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

__all__ = ("FATES", "LATE_AFTER", "Fate", "started_late")

Fate = Literal["ran", "ran_late", "coalesced", "missed", "skipped"]
"""What became of a slot (DESIGN.md §3a): it ran; it was owed and ran late; it was folded
into the run of a later slot of its job (``coalesced``); its grace ran out before it could
run (``missed``); or it was not run for a named reason (``skipped``)."""

FATES: Final[tuple[Fate, ...]] = ("ran", "ran_late", "coalesced", "missed", "skipped")

LATE_AFTER: Final = 1.0
"""Seconds after its fire time (the slot plus its jitter) by which a run that began later
began late: its slot was owed (the server away, the job busy, the fleet down) and ran
late. The same figure for the metric, the events and ``history --slots``."""


def started_late(fire: datetime, started: datetime, jitter: float | None = None) -> bool:
    """Whether a run of a slot firing at *fire* that began at *started* began late. With
    *jitter* (seconds), *fire* is the slot itself and any start within the jitter counts
    as on time (``history --slots`` reads the slot, not its jittered fire time)."""
    allowed = LATE_AFTER + (jitter or 0.0)
    return (started - fire).total_seconds() > allowed
