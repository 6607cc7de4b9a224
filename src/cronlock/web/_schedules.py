"""The dashboard's stored schedules: the list, and the edit and removal an operator whom
``authorize`` admits may make (through :class:`cronlock.postgres.FleetControl`, as
``python -m cronlock schedules update|remove`` does)."""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException

from .._errors import CronlockError
from .._schedules.schedule import Schedule
from .._stored.json import schedule_from_text
from .._stored.schedule import StoredSchedule
from ..postgres._ops.control import FleetControl
from ..postgres._sql.schema import TABLE_EXISTS_SQL
from ..postgres._sql.stored import decode_stored, list_schedules_sql
from ..postgres._sql.tables import LedgerTable

__all__ = ("SCHEDULE_ACTIONS", "change_schedule", "read_schedules")

SCHEDULE_ACTIONS = frozenset({"update-schedule", "remove-schedule"})


async def read_schedules(conn: Any, table: LedgerTable) -> list[StoredSchedule]:
    """Every stored schedule of *table*'s ledger (none in a ledger that has no table for
    them yet); rows no replica could read are left out (and reported, :mod:`._decode`)."""
    if not await conn.fetchval(TABLE_EXISTS_SQL, table.schedules):
        return []
    rows = await conn.fetch(list_schedules_sql(table))
    return [s for row in rows if (s := decode_stored(row, table=table.schedules)) is not None]


def _schedule(form: dict[str, str]) -> Schedule | None:
    """The new schedule the edit form gives (a cron expression, six fields with seconds, or
    seconds for every), or ``None`` to keep the stored one."""
    expr, seconds = form.get("cron", "").strip(), form.get("every", "").strip()
    return schedule_from_text(
        cron=expr or None,
        seconds=len(expr.split()) == 6,
        tz=form.get("tz", "").strip() or None,
        every=seconds or None,
    )


async def change_schedule(source: Any, table: LedgerTable, verb: str, form: dict[str, str]) -> str:
    """Apply *verb* to the stored schedule the form names; return its name. A change the
    verbs refuse is a 400 with their message; an unknown name a 404."""
    name = form.get("schedule", "")
    try:
        async with FleetControl(source, table=table.table, schema=table.schema) as control:
            if verb == "remove-schedule":
                if not await control.remove_schedule(name):
                    raise HTTPException(404, f"unknown schedule: {name}")
                return name
            text = form.get("kwargs", "").strip()
            kwargs = None if not text else json.loads(text)
            if kwargs is not None and not isinstance(kwargs, dict):
                raise HTTPException(400, "kwargs: expected a JSON object")
            await control.update_schedule(name, schedule=_schedule(form), kwargs=kwargs)
    except KeyError as exc:  # JobLookupError: no such schedule
        raise HTTPException(404, str(exc.args[0]) if exc.args else "unknown schedule") from None
    except (CronlockError, ValueError) as exc:  # a refused schedule, option or JSON
        raise HTTPException(400, str(exc)) from None
    return name
