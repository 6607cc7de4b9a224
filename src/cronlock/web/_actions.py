"""The dashboard's actions on the fleet, through :class:`cronlock.postgres.FleetControl`.

The dashboard writes nothing itself: pause, resume and trigger are FleetControl's, so a
button does exactly what ``python -m cronlock pause JOB`` does.
"""

from __future__ import annotations

from typing import Any

from ..postgres._ledger import LedgerTable

__all__ = ("ACTIONS", "act", "read_paused")

ACTIONS = frozenset({"pause", "resume", "trigger"})


async def read_paused(conn: Any, table: LedgerTable) -> frozenset[str]:
    """The jobs paused fleet-wide (none until fleet control exists)."""
    return frozenset()


async def act(source: Any, table: LedgerTable, verb: str, job: str) -> None:
    """Pause, resume or trigger *job* on every replica."""
    raise NotImplementedError(f"{verb} {job!r}: fleet control is not available yet")
