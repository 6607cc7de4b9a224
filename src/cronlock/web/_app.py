"""The dashboard as an ASGI app: pages, their live fragments, the JSON API and the actions.

Every page is read from the run ledger on each request (no scheduler in this process):
the jobs list, a job's page with its paged run history and chart, and the same data as
JSON. Actions (pause, resume, trigger) exist only when an *authorize* callable is given;
each is a POST with a CSRF token, and every refusal is a 403, naming its cause, before
anything is written. The CSRF key is the fleet's (the ledger's, unless one is given), read
once per process, so every worker of a multi-process server accepts every page's token.
Reads are open to whoever reaches the mount unless an *authorize_read* callable gates them
(:mod:`._csrf`); what a request may ask is bounded before it is served (:mod:`._listing`),
and so are the connections it may open (:mod:`._source`) and the rows it reads
(:mod:`._reads`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

import asyncpg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._errors import ConfigError, JobConflictError
from ..postgres._locker.secrets import fleet_secret
from ..postgres._ops.control import FleetControl
from ..postgres._ops.fleet import STATUSES, read_jobs, read_paused, read_runs, server_now
from ..postgres._ops.roster import read_roster
from ..postgres._sql.fleet import JIT_OFF_SQL
from ..postgres._sql.slots import recent_slot_records_sql
from ..postgres._sql.tables import DEFAULT_TABLE, LedgerTable
from ._authorize import Action, Authorize, Gate, ReadRefused, client
from ._csrf import COOKIE, Csrf
from ._headers import SecurityHeaders, crashed
from ._listing import (
    MAX_PAGE,
    Filter,
    Listing,
    before_param,
    filter_param,
    limit_param,
    listing,
    read_form,
    select,
)
from ._model import chart, job_view, run_json, run_view
from ._reads import SafeReads
from ._schedules import (
    SCHEDULE_ACTIONS,
    Redact,
    change_schedule,
    parse_change,
    read_schedules,
    schedules_param,
    shown,
)
from ._source import Source, Unavailable

__all__ = ("Action", "Authorize", "Redact", "app")

_logger = logging.getLogger("cronlock.web")
_HERE = Path(__file__).parent
_CSRF_KEY = "web.csrf"  # its row in the ledger's secrets table
_GAPS_SHOWN = 20  # a job page's latest records of slots that did not run

# The dashboard writes nothing itself: pause, resume and trigger are FleetControl's, so a
# button does exactly what ``python -m cronlock pause JOB`` does.
ACTIONS = frozenset({"pause", "resume", "trigger", "retire"})


async def act(source: Any, table: LedgerTable, verb: str, job: str, who: str) -> None:
    """Pause, resume, trigger or retire *job* on every replica (*source*: a pool or a DSN)
    as *who* (``""``: this process, as ``FleetControl`` names it)."""
    async with FleetControl(
        source, table=table.table, schema=table.schema, who=who or None
    ) as control:
        if verb == "pause":
            await control.pause(job)
        elif verb == "resume":
            await control.resume(job)
        elif verb == "trigger":
            await control.trigger(job)  # the page does not wait for the run
        elif verb == "retire":
            await control.retire(job)  # an absent job only (the button shows on those)
        else:
            raise ValueError(f"unknown action {verb!r}")


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(_HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["url"] = lambda name: quote(str(name), safe="")
    env.filters["utc"] = lambda t: "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")
    # A run's slot and start are never missing: None is a value the ledger holds that is
    # not a readable instant (_reads).
    env.filters["required"] = lambda t: "invalid" if t is None else env.filters["utc"](t)
    env.filters["local"] = lambda t, zone: _local(t, zone)
    env.filters["seconds"] = lambda s: "-" if s is None else f"{s:.3f} s"
    env.globals["ago"] = _ago
    return env


def _local(value: datetime | None, zone: str) -> str:
    if value is None:
        return "-"
    try:
        local = value.astimezone(ZoneInfo(zone))
    except (ValueError, KeyError, OSError):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


def _ago(value: datetime | None, now: datetime) -> str:
    if value is None:
        return ""
    seconds = (now - value).total_seconds()
    ahead = seconds < 0
    seconds = abs(seconds)
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "min")):
        if seconds >= size:
            amount = f"{seconds / size:.0f} {unit}"
            break
    else:
        amount = f"{seconds:.0f} s"
    return f"in {amount}" if ahead else f"{amount} ago"


class _Dashboard:
    def __init__(
        self,
        source: Any,
        table: LedgerTable,
        authorize: Authorize | None,
        authorize_read: Authorize | None,
        *,
        redact: Redact | None,
        refresh: float,
        page_size: int,
        csrf_secret: bytes | str | None,
        title: str,
        max_connections: int,
    ) -> None:
        self.source = Source(source, table, max_connections)
        self.connection = self.source.connection
        self.table = table
        self.authorize = None if authorize is None else Gate(authorize)
        self.authorize_read = None if authorize_read is None else Gate(authorize_read)
        self.redact = redact
        self.refresh = refresh
        self.page_size = page_size
        self._csrf = None if csrf_secret is None else Csrf(csrf_secret)
        self._csrf_lock = asyncio.Lock()
        self.title = title
        self.env = _environment()

    # -- reads -------------------------------------------------------------------------

    async def jobs(self, wanted: Filter) -> tuple[Listing, datetime]:
        """One page of the job list: a bounded number of statements, however many jobs.

        Every job is judged from the roster (a few facts each); the page's rows only are
        read in full. One snapshot for both, so a row's status is the one it was counted
        and chosen by; JIT off, which would compile the roster's thousands of index
        probes for longer than they take.
        """
        async with self.snapshot() as conn:
            reads = SafeReads(conn, self.table)
            paused = await read_paused(conn, self.table)
            now = await server_now(conn)
            roster = await read_roster(reads, self.table, paused, now, tags=wanted.tags)
            chosen = select(roster, wanted)
            fleet = await read_jobs(
                reads,
                self.table,
                chosen.names,
                holders=roster.holders,
                conflicts=roster.conflicts,
                rejected=roster.rejected,
            )
        return listing(chosen, fleet, paused, now, wanted), now

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[Any]:
        """A connection in a read-only transaction of one snapshot, JIT off."""
        async with (
            self.connection() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            await conn.execute(JIT_OFF_SQL)
            yield conn

    async def job(self, name: str, before: datetime | None, limit: int) -> dict[str, Any]:
        async with self.connection() as conn:
            reads = SafeReads(conn, self.table)
            found = await read_jobs(reads, self.table, [name])
            if not found:
                raise HTTPException(404, "no such job in the run ledger")
            runs = await read_runs(reads, self.table, name, limit + 1, before)
            paused = await read_paused(conn, self.table)
            now = await server_now(conn)
            gaps = await conn.fetch(recent_slot_records_sql(self.table), name, _GAPS_SHOWN)
        views = [run_view(r) for r in runs[:limit]]
        return {
            "job": job_view(found[0], now, paused=name in paused),
            "gaps": [dict(row.items()) for row in gaps if row["slot"] is not None],
            "runs": views,
            "more": views[-1].slot if len(runs) > limit else None,
            "chart": chart(views),
            "now": now,
        }

    async def csrf(self) -> Csrf:
        """The fleet's CSRF key: the one given, or the ledger's (made there by the first
        process that needs it), read once per process."""
        if self._csrf is None:
            async with self._csrf_lock:
                if self._csrf is None:
                    async with self.connection() as conn:
                        self._csrf = Csrf(await fleet_secret(conn, self.table, _CSRF_KEY))
        return self._csrf

    # -- rendering ---------------------------------------------------------------------

    async def page(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        cookie, new, token = "", False, ""
        reader = context.pop("reader", True)
        # A read-only dashboard needs no key and sets no cookie; who may not read gets
        # neither.
        if self.authorize is not None and reader:
            try:
                csrf = await self.csrf()
            except (HTTPException, Unavailable):
                if template != "error.html":
                    raise
            else:
                cookie, new = csrf.cookie(request)
                token = csrf.token(cookie)
        base = request.scope.get("root_path", "").rstrip("/")
        html = self.env.get_template(template).render(
            base=base,
            title=self.title,
            refresh=self.refresh,
            actions=self.authorize is not None,
            csrf=token,
            partial=request.query_params.get("partial") == "1",
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        if new:
            response.set_cookie(
                COOKIE,
                cookie,
                path=base or "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    async def readable(self, request: Request) -> None:
        """Raise the 403 of a request that ``authorize_read`` refuses."""
        gate = self.authorize_read
        if gate is not None and await gate.verdict(request, Action("read", "")) is None:
            raise ReadRefused


def app(
    dsn_or_pool: str | Any,
    *,
    authorize: Authorize | None = None,
    authorize_read: Authorize | None = None,
    table: str = DEFAULT_TABLE,
    schema: str | None = None,
    refresh: float = 3.0,
    page_size: int = 50,
    csrf_secret: bytes | str | None = None,
    title: str = "cronlock",
    max_connections: int = 4,
    redact: Redact | None = None,
) -> Starlette:
    """The fleet dashboard, an ASGI app to mount (``app.mount("/cron", web.app(pool))``).

    *dsn_or_pool*: an ``asyncpg.Pool`` (a connection is borrowed per request) or a DSN
    (one connection per request, closed after it, at most *max_connections* at once, the
    other requests waiting for one; nothing to close at shutdown). It only
    reads the run ledger (*table*, *schema*, as the replicas' ``PostgresLocker`` names it)
    unless *authorize* is given: then pause, resume and trigger buttons appear, and a POST
    that *authorize* (sync or async) does not allow is refused with a 403. It allows with
    ``True`` or a non-empty string, which names who asked in the log of each action
    (``cronlock.web``, INFO) and is recorded as who made the change (a schedule's
    ``updated_by``, a pause's ``paused_by``). Given the request alone, it decides for every
    action alike; a callable that also accepts a second positional argument is given the
    :class:`Action` too (its verb, its target job or schedule, the fields it changes).
    *authorize_read*, given, gates every page and JSON answer the same way (the static
    files stay open); without it, anyone who reaches the mount reads the whole fleet.
    A stored schedule's kwargs are shown only to whom *authorize* allows ``read-kwargs``
    of it; others see what *redact* (``redact(name, kwargs)``, :data:`Redact`) returns of
    them, or nothing.
    *refresh*: seconds between the pages' live updates. *csrf_secret*: the key of the
    CSRF tokens; by default the fleet's, kept in the ledger's ``<table>_secrets`` table
    (made by the first process that needs it), so that every process serving the
    dashboard accepts the others' pages. Given, it must be the same in every process.
    """
    if not (isinstance(refresh, int | float) and refresh > 0):
        raise ConfigError(f"web.app: refresh must be a positive number of seconds, got {refresh!r}")
    if not (isinstance(page_size, int) and 1 <= page_size <= MAX_PAGE):
        raise ConfigError(f"web.app: page_size must be 1 to {MAX_PAGE}, got {page_size!r}")
    if not (isinstance(max_connections, int) and max_connections >= 1):
        raise ConfigError(f"web.app: max_connections must be 1 or more, got {max_connections!r}")
    if not isinstance(dsn_or_pool, str) and not isinstance(dsn_or_pool, asyncpg.Pool):
        raise ConfigError(f"web.app: expected a DSN or an asyncpg.Pool, got {dsn_or_pool!r}")
    board = _Dashboard(
        dsn_or_pool,
        LedgerTable(table, schema),
        authorize,
        authorize_read,
        redact=redact,
        refresh=float(refresh),
        page_size=page_size,
        csrf_secret=csrf_secret,
        title=title,
        max_connections=max_connections,
    )

    async def index(request: Request) -> Response:
        await board.readable(request)
        wanted = filter_param(request)
        shown, now = await board.jobs(wanted)
        return await board.page(
            request, "jobs.html", jobs=shown.jobs, listed=shown, now=now, statuses=STATUSES
        )

    async def job_page(request: Request) -> Response:
        await board.readable(request)
        data = await board.job(
            request.path_params["name"],
            before_param(request),
            limit_param(request, board.page_size),
        )
        return await board.page(request, "job.html", before=before_param(request), **data)

    async def api_jobs(request: Request) -> Response:
        await board.readable(request)
        shown, now = await board.jobs(filter_param(request))
        return JSONResponse(
            {"now": now.isoformat(), "read_only": board.authorize is None, **shown.json()}
        )

    async def api_runs(request: Request) -> Response:
        await board.readable(request)
        data = await board.job(
            request.path_params["name"],
            before_param(request),
            limit_param(request, board.page_size),
        )
        more = data["more"]
        return JSONResponse(
            {
                "job": data["job"].name,
                "runs": [run_json(r) for r in data["runs"]],
                "next_before": None if more is None else more.isoformat(),
            }
        )

    async def schedules(request: Request) -> tuple[Any, list[Any]]:
        await board.readable(request)
        wanted = schedules_param(request)
        async with board.snapshot() as conn:
            found = await read_schedules(conn, board.table, wanted)
        return found, await shown(request, found.rows, board.authorize, board.redact)

    async def schedules_page(request: Request) -> Response:
        found, views = await schedules(request)
        return await board.page(request, "schedules.html", listed=found, schedules=views)

    async def api_schedules(request: Request) -> Response:
        found, views = await schedules(request)
        return JSONResponse({"read_only": board.authorize is None, **found.json(views)})

    async def action(request: Request) -> Response:
        await board.readable(request)
        verb = request.path_params["action"]
        if verb not in ACTIONS and verb not in SCHEDULE_ACTIONS:
            raise HTTPException(404, "no such action")
        # Every refusal comes before any job is touched (only the fleet's key may be made,
        # once), and names its cause: the browser's owner reads it, not the site that
        # forged the form (it cannot read the answer). A read-only dashboard refuses
        # before reading the body, and the form is read only up to its limit.
        if board.authorize is None:
            raise HTTPException(403, "this dashboard is read-only")
        form = await read_form(request)
        refusal = (await board.csrf()).refusal(request, form.get("csrf"))
        if refusal is not None:
            raise HTTPException(403, refusal)
        if verb in SCHEDULE_ACTIONS:
            asked = parse_change(verb, form)  # a 400 for what is no schedule or JSON
        else:
            asked = Action(verb, form.get("job", ""))
        job = asked.target
        who = await board.authorize.verdict(request, asked)
        if who is None:
            _logger.info("dashboard: refused %s %r from %s", verb, job, client(request))
            if not board.authorize.per_action:
                raise HTTPException(403, "refused: you may not change jobs here")
            raise HTTPException(403, f"refused: you may not {verb} {job!r}")
        base = request.scope.get("root_path", "").rstrip("/")
        if verb in SCHEDULE_ACTIONS:
            async with board.source.slot():
                await change_schedule(board.source.source, board.table, asked, who)
            _logger.info("dashboard: %s %r by %s from %s", verb, job, who or "an unnamed "
                         "operator", client(request))  # fmt: skip
            return RedirectResponse(base + "/schedules", status_code=303)
        async with board.connection() as conn:
            if not await read_jobs(SafeReads(conn, board.table), board.table, [job]):
                raise HTTPException(404, "no such job in the run ledger")
        async with board.source.slot():
            try:
                await act(board.source.source, board.table, verb, job, who)
            except JobConflictError as exc:  # retire: a live replica runs it after all
                raise HTTPException(409, str(exc)) from None
        _logger.info(
            "dashboard: %s %r by %s from %s",
            verb,
            job,
            who or "an unnamed operator",
            client(request),
        )
        # A retired job has no page (it left the dashboard): back to the list.
        back = form.get("back") == "job" and verb != "retire"
        target = f"/jobs/{quote(job, safe='')}" if back else "/"
        return RedirectResponse(base + target, status_code=303)

    async def failed(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 503
        detail = exc.detail if isinstance(exc, HTTPException) else "the database did not answer"
        if request.url.path.startswith(request.scope.get("root_path", "") + "/api/"):
            return JSONResponse({"error": detail}, status_code=code)
        reader = not isinstance(exc, ReadRefused)
        return await board.page(
            request, "error.html", status=code, code=code, detail=detail, reader=reader
        )

    routes = [
        Route("/", index),
        Route("/api/jobs", api_jobs),
        Route("/api/jobs/{name:path}/runs", api_runs),
        Route("/schedules", schedules_page),
        Route("/api/schedules", api_schedules),
        Route("/actions/{action}", action, methods=["POST"]),
        Route("/jobs/{name:path}", job_page),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[SecurityHeaders.middleware()],
        exception_handlers={HTTPException: failed, Unavailable: failed, Exception: crashed},
    )
