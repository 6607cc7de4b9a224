"""Stored schedules rejected everywhere: read, and refused a trigger.

A stored schedule is *rejected everywhere* when every live replica of the ledger (an
unexpired row of its members table, at least one) reported a problem with its current
revision: no replica has its task, or its kwargs fit the task nowhere. No replica runs it,
so its status is ``rejected`` (``_ops/fleet.status_of``) whatever its runs say, and a
trigger of it would wait for nobody: :func:`refuse_rejected` says so, for
``FleetControl.trigger`` and the ``trigger`` verb alike. Read in one statement
(``_sql/stored.rejected_sql``), however many schedules and members.
"""

from __future__ import annotations

from typing import Any

from ..._errors import ScheduleRejectedError
from ..._stored.schedule import StoredSchedule
from .._sql.schema import TABLE_EXISTS_SQL
from .._sql.stored import decode_stored, rejected_sql
from .._sql.tables import LedgerTable

__all__ = ("read_rejected", "refuse_rejected", "rejected_message")


async def read_rejected(conn: Any, table: LedgerTable) -> dict[str, StoredSchedule]:
    """Each stored schedule of *table*'s ledger that every live replica rejected, by name
    (none in a ledger that has no table for stored schedules yet)."""
    if not await conn.fetchval(TABLE_EXISTS_SQL, table.schedules):
        return {}
    rows = await conn.fetch(rejected_sql(table))
    found = (decode_stored(row, table=table.schedules) for row in rows)
    return {stored.name: stored for stored in found if stored is not None}


def rejected_message(stored: StoredSchedule) -> str:
    """One line: *stored* (rejected everywhere), its revision and the replicas' problem."""
    return (
        f"stored schedule {stored.name} (revision {stored.revision}) is rejected by every "
        f"live replica: {stored.problem}; no replica can run it until one that can "
        f"registers it (deploy its task, or fix the schedule)"
    )


async def refuse_rejected(conn: Any, table: LedgerTable, job: str) -> None:
    """Raise :class:`~cronlock.ScheduleRejectedError` when *job* is a stored schedule every
    live replica rejected (:func:`rejected_message`). The rule of ``FleetControl.trigger``
    and of the command line's ``trigger`` alike."""
    stored = (await read_rejected(conn, table)).get(job)
    if stored is not None:
        raise ScheduleRejectedError(rejected_message(stored))
