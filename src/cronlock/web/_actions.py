"""The dashboard's actions on the fleet, through :class:`cronlock.postgres.FleetControl`.

The dashboard writes nothing itself: pause, resume and trigger are FleetControl's, so a
button does exactly what ``python -m cronlock pause JOB`` does.
"""

from __future__ import annotations

from typing import Any

from ..postgres._ops.control import FleetControl
from ..postgres._sql.tables import LedgerTable

__all__ = ("ACTIONS", "act")

ACTIONS = frozenset({"pause", "resume", "trigger"})


async def act(source: Any, table: LedgerTable, verb: str, job: str) -> None:
    """Pause, resume or trigger *job* on every replica (*source*: a pool or a DSN)."""
    async with FleetControl(source, table=table.table, schema=table.schema) as control:
        if verb == "pause":
            await control.pause(job)
        elif verb == "resume":
            await control.resume(job)
        elif verb == "trigger":
            await control.trigger(job)  # the page does not wait for the run
        else:
            raise ValueError(f"unknown action {verb!r}")
