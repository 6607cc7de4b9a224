"""The dashboard's stored schedules: one page of them, filtered by name, each with the kwargs
this viewer may see; and the edit and removal an operator whom ``authorize`` admits may make
(through :class:`cronlock.postgres.FleetControl`, as ``python -m cronlock schedules
update|remove`` does).

A page reads its own rows only (``LIMIT``/``OFFSET`` on the names' index) and one row of
counts, so 100,000 schedules cost what 100 do but for the count. Kwargs are what a tenant's
schedule carries (its customer's id, at times an API key): they are shown in full only to
whom ``authorize`` allows the verb ``read-kwargs`` of that schedule; to anyone else, what
the ``redact`` hook returns (the hook not given, or returning ``None``: nothing).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from starlette.exceptions import HTTPException
from starlette.requests import Request

from .._errors import CronlockError
from .._schedules.schedule import Schedule
from .._stored.json import schedule_from_text
from .._stored.schedule import StoredSchedule
from ..postgres._ops.control import FleetControl
from ..postgres._sql.schema import TABLE_EXISTS_SQL
from ..postgres._sql.stored import decode_stored, schedules_count_sql, schedules_page_sql
from ..postgres._sql.tables import LedgerTable
from ._authorize import Action, Gate
from ._listing import Filter, filter_param

__all__ = (
    "SCHEDULE_ACTIONS",
    "Redact",
    "ScheduleView",
    "Schedules",
    "change_schedule",
    "parse_change",
    "read_schedules",
    "schedules_param",
    "shown",
)

_logger = logging.getLogger("cronlock.web")

SCHEDULE_ACTIONS = frozenset({"update-schedule", "remove-schedule"})
READ_KWARGS = "read-kwargs"

Redact = Callable[
    [str, Mapping[str, Any]],
    Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None,
]
"""``redact(name, kwargs)``: what a viewer who may not read a stored schedule's kwargs
(``authorize`` does not allow ``read-kwargs`` of it) is shown of them: a dict (e.g. the
kwargs with their secrets masked), or ``None`` to show nothing. Sync or async."""

Shown = Literal["all", "redacted", "hidden"]


def schedules_param(request: Request) -> Filter:
    """The schedules page's filter from the query: ``q`` (names containing it, any case),
    ``page``, ``per_page``, read as the job list reads them; a bad value is a 400."""
    params = request.query_params
    if "status" in params or "tag" in params:
        raise HTTPException(400, "the schedules list takes q, page and per_page only")
    return filter_param(request)


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A stored schedule as one viewer sees it: *kwargs* the JSON text shown (``None``:
    hidden), *shown* how much of them."""

    schedule: StoredSchedule
    kwargs: str | None
    shown: Shown

    def json(self) -> dict[str, Any]:
        """The row for the JSON API."""
        s = self.schedule
        return {
            "name": s.name,
            "task": s.task,
            "schedule": str(s.schedule),
            "kwargs": None if self.kwargs is None else json.loads(self.kwargs),
            "kwargs_shown": self.shown,
            "options": json.loads(json.dumps(dict(s.options), default=str)),
            "revision": s.revision,
            "paused": s.paused,
            "rejected": s.rejected,
            "problems": dict(s.problems),
            "updated_at": None if s.updated_at is None else s.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class Schedules:
    """One page of the stored schedules, and how many there are."""

    rows: list[StoredSchedule]
    total: int
    """Every stored schedule of the ledger."""
    matched: int
    """Those the filter keeps."""
    rejected: int
    """Those every live replica rejected."""
    filter: Filter

    @property
    def pages(self) -> int:
        """How many pages the matched schedules fill (at least one)."""
        return max(1, math.ceil(self.matched / self.filter.per_page))

    def json(self, views: list[ScheduleView]) -> dict[str, Any]:
        """The page for the JSON API, its rows as *views*."""
        return {
            "total": self.total,
            "matched": self.matched,
            "rejected": self.rejected,
            "page": self.filter.page,
            "pages": self.pages,
            "per_page": self.filter.per_page,
            "schedules": [view.json() for view in views],
        }


async def read_schedules(conn: Any, table: LedgerTable, wanted: Filter) -> Schedules:
    """The page *wanted* of *table*'s stored schedules (none in a ledger that has no table
    for them yet): three statements, the page's rows only. Rows no replica could read are
    left out of the page (and reported, :func:`decode_stored`)."""
    if not await conn.fetchval(TABLE_EXISTS_SQL, table.schedules):
        return Schedules([], 0, 0, 0, wanted)
    counts = await conn.fetchrow(schedules_count_sql(table), wanted.text)
    offset = (wanted.page - 1) * wanted.per_page
    rows = await conn.fetch(schedules_page_sql(table), wanted.text, wanted.per_page, offset)
    decoded = [s for row in rows if (s := decode_stored(row, table=table.schedules)) is not None]
    return Schedules(decoded, counts["total"], counts["matched"], counts["rejected"], wanted)


async def _redacted(redact: Redact, stored: StoredSchedule) -> str | None:
    """What *redact* shows of *stored*'s kwargs, as JSON text; ``None`` (shown nothing)
    when it says so, raises or returns what is not a JSON object. Fails closed."""
    try:
        answer = redact(stored.name, dict(stored.kwargs))
        if inspect.isawaitable(answer):
            answer = await answer
        if answer is None:
            return None
        if not isinstance(answer, Mapping):
            raise TypeError(f"expected a dict or None, got {type(answer).__name__}")
        return json.dumps(dict(answer), sort_keys=True, ensure_ascii=False)
    except Exception as exc:  # the hook's: hide the kwargs, never the page
        # Its type only: the error's text may quote the kwargs it was to hide.
        _logger.warning(
            "dashboard: redact(%r, ...) failed (%s); its kwargs are hidden",
            stored.name,
            type(exc).__name__,
        )
        return None


async def shown(
    request: Request, rows: list[StoredSchedule], authorize: Gate | None, redact: Redact | None
) -> list[ScheduleView]:
    """*rows* as the viewer of *request* may see them: kwargs in full where ``authorize``
    allows ``read-kwargs`` of the schedule, else what *redact* shows (nothing without it)."""
    actions = [Action(READ_KWARGS, s.name) for s in rows]
    allowed: list[str | None] = [None] * len(rows)
    if authorize is not None:
        allowed = await authorize.verdicts(request, actions)
    views = []
    for stored, who in zip(rows, allowed, strict=True):
        if who is not None:
            full = json.dumps(dict(stored.kwargs), sort_keys=True, ensure_ascii=False)
            views.append(ScheduleView(stored, full, "all"))
            continue
        text = None if redact is None else await _redacted(redact, stored)
        views.append(ScheduleView(stored, text, "hidden" if text is None else "redacted"))
    return views


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


def parse_change(verb: str, form: dict[str, str]) -> Action:
    """The change *form* asks of a stored schedule, as ``authorize`` is shown it: *verb*,
    the schedule's name, and the fields an update changes with their new values
    (``schedule``, ``kwargs``). What is no schedule or no JSON object is a 400."""
    name = form.get("schedule", "")
    if verb == "remove-schedule":
        return Action(verb, name)
    fields: dict[str, Any] = {}
    text = form.get("kwargs", "").strip()
    try:
        schedule = _schedule(form)
        kwargs = None if not text else json.loads(text)
    except (CronlockError, ValueError, RecursionError) as exc:  # RecursionError: deep JSON
        raise HTTPException(400, str(exc) or type(exc).__name__) from None
    if kwargs is not None and not isinstance(kwargs, dict):
        raise HTTPException(400, "kwargs: expected a JSON object")
    if schedule is not None:
        fields["schedule"] = schedule
    if kwargs is not None:
        fields["kwargs"] = kwargs
    return Action(verb, name, fields)


async def change_schedule(source: Any, table: LedgerTable, change: Action, who: str) -> None:
    """Apply *change* (:func:`parse_change`'s) as *who* (``""``: this process, as
    ``FleetControl`` names it). A change the verbs refuse is a 400 with their message; an
    unknown name a 404."""
    name = change.target
    try:
        async with FleetControl(
            source, table=table.table, schema=table.schema, who=who or None
        ) as control:
            if change.verb == "remove-schedule":
                if not await control.remove_schedule(name):
                    raise HTTPException(404, f"unknown schedule: {name}")
                return
            await control.update_schedule(
                name, schedule=change.fields.get("schedule"), kwargs=change.fields.get("kwargs")
            )
    except KeyError as exc:  # JobLookupError: no such schedule
        raise HTTPException(404, str(exc.args[0]) if exc.args else "unknown schedule") from None
    except (CronlockError, ValueError) as exc:  # a refused schedule or option
        raise HTTPException(400, str(exc)) from None
