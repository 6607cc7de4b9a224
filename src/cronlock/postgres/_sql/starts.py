"""When a run began, as the ledger records it.

A claim is often made ahead of its slot (the claim-ahead window), so the instant of the
claim is not the run's start. The claim writes the later of its own time and the slot (the
body never begins before its slot), and the run's outcome replaces that with the instant
its body really began, as the replica's clock read it.
"""

from __future__ import annotations

__all__ = ("CLAIMED_START", "real_start")

CLAIMED_START = "greatest(clock_timestamp(), l.slot)"
"""The ``started_at`` a claim writes (in a statement whose claimed rows are ``l``)."""


def real_start(claimed: str, reported: str, finished: str) -> str:
    """The ``started_at`` an outcome writes: the start the replica *reported*, kept between
    the *claimed* start and the *finished* instant (a clock that is not the server's, a
    test's fake clock say, cannot make a run begin before its claim or after its end); the
    claimed start when none is reported (an undo)."""
    return f"least({finished}, greatest({claimed}, coalesce({reported}, {claimed})))"
