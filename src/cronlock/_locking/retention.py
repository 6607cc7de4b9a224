"""How long a slot's ledger row must outlive the slot: the rule both the locker's settings
and the registration of each job check (:class:`~cronlock._locking.kinds.PruningLocker`)."""

from __future__ import annotations

from .._errors import ConfigError

__all__ = ("RETENTION_MARGIN", "check_retention")

RETENTION_MARGIN = 3600.0
"""Seconds a slot's row outlives its job's lateness (jitter and misfire_grace): a replica
whose clock lags, stalls, or waits for its connection claims a slot later than its own
misfire rule says. It is also the floor of a retention, whatever the jobs."""


def check_retention(job: str, jitter: float | None, grace: float | None, keep: float) -> None:
    """Refuse job *job* if its slots can be claimed later than rows are kept (*keep*).

    Raises :class:`~cronlock.ConfigError` naming the job, its ``misfire_grace`` (and
    ``jitter``), the retention and the longest grace it allows. A ``misfire_grace`` of
    ``None`` coalesces late slots into the latest due one: it counts as no grace.
    """
    late = (jitter or 0.0) + (grace or 0.0)
    if late + RETENTION_MARGIN <= keep:
        return
    given = "None" if grace is None else f"{grace:g}s"
    jittered = f" and jitter={jitter:g}s" if jitter else ""
    raise ConfigError(
        f"job {job!r}: misfire_grace={given}{jittered} lets a replica claim a slot that "
        f"late, and its locker prunes rows after retention={keep:g}s: with the margin of "
        f"{RETENTION_MARGIN:g}s for lagging replicas, a slot whose row was pruned could run "
        f"a second time; give the locker retention={late + RETENTION_MARGIN:g} or more, "
        f"or the job misfire_grace={max(keep - RETENTION_MARGIN - (jitter or 0.0), 0):g} "
        "or less"
    )
