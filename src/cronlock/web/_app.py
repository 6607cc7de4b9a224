"""The dashboard as an ASGI app: pages, their live fragments, the JSON API and the actions.

Every page is read from the run ledger on each request (no scheduler in this process):
the jobs list, a job's page with its paged run history and chart, and the same data as
JSON. Actions (pause, resume, trigger) exist only when an *authorize* callable is given;
each is a POST with a CSRF token, and every refusal is a 403, naming its cause, before
anything is written. The CSRF key is the fleet's (the ledger's, unless one is given), read
once per process, so every worker of a multi-process server accepts every page's token.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote
from zoneinfo import ZoneInfo

import asyncpg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._dsn import connect_failure
from .._errors import ConfigError
from ..postgres._fleet import read_jobs, read_paused, read_runs, server_now
from ..postgres._ledger import DEFAULT_TABLE, LedgerTable
from ..postgres._secrets import fleet_secret
from ._actions import ACTIONS, act
from ._csrf import COOKIE, Csrf
from ._headers import SecurityHeaders
from ._model import chart, job_view, run_json, run_view

__all__ = ("Authorize", "app")

_logger = logging.getLogger("cronlock.web")
_HERE = Path(__file__).parent
_MAX_PAGE = 500
_MAX_FORM = 4096
_CSRF_KEY = "web.csrf"  # its row in the ledger's secrets table

Authorize = Callable[[Request], bool | Awaitable[bool]]
"""Decides whether *request* may pause, resume or trigger: ``True`` allows it."""


class _Unavailable(Exception):
    """The database could not be read; the page says so, without the details."""


async def _connect(dsn: str) -> Any:
    """A connection of *dsn*; a failure is logged without the DSN's password, which a
    parse error of a malformed DSN may quote (:mod:`cronlock._dsn`)."""
    try:
        return await asyncpg.connect(dsn, timeout=10, statement_cache_size=0)
    except Exception as exc:
        _logger.warning("dashboard: cannot connect to PostgreSQL: %s", connect_failure(dsn, exc))
        raise _Unavailable from None


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(_HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["url"] = lambda name: quote(str(name), safe="")
    env.filters["utc"] = lambda t: "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")
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
        *,
        refresh: float,
        page_size: int,
        csrf_secret: bytes | str | None,
        title: str,
    ) -> None:
        self.source = source
        self.table = table
        self.authorize = authorize
        self.refresh = refresh
        self.page_size = page_size
        self._csrf = None if csrf_secret is None else Csrf(csrf_secret)
        self._csrf_lock = asyncio.Lock()
        self.title = title
        self.env = _environment()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        try:
            if isinstance(self.source, str):
                # No named prepared statements: it works through a transaction pooler too.
                conn = await _connect(self.source)
                try:
                    yield conn
                finally:
                    await conn.close()
            else:
                async with self.source.acquire(timeout=10) as conn:
                    yield conn
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError) as exc:
            raise HTTPException(
                503,
                f"no current run ledger {self.table.runs} here: start a replica, or run "
                "'python -m cronlock migrate --dsn ...' to create or upgrade it",
            ) from exc
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # Logged for the operator; the page never shows it (it may name hosts or users).
            _logger.warning("dashboard: the database could not be read: %r", exc)
            raise _Unavailable from exc

    # -- reads -------------------------------------------------------------------------

    async def jobs(self) -> tuple[list[Any], datetime]:
        async with self.connection() as conn:
            fleet = await read_jobs(conn, self.table)
            paused = await read_paused(conn, self.table)
            now = await server_now(conn)
        return [job_view(job, now, paused=job.name in paused) for job in fleet], now

    async def job(self, name: str, before: datetime | None, limit: int) -> dict[str, Any]:
        async with self.connection() as conn:
            found = await read_jobs(conn, self.table, [name])
            if not found:
                raise HTTPException(404, "no such job in the run ledger")
            runs = await read_runs(conn, self.table, name, limit + 1, before)
            paused = await read_paused(conn, self.table)
            now = await server_now(conn)
        views = [run_view(r) for r in runs[:limit]]
        return {
            "job": job_view(found[0], now, paused=name in paused),
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
        cookie, new = Csrf.cookie(request)
        token = ""
        if self.authorize is not None:  # a read-only dashboard needs no key, writes nothing
            try:
                token = (await self.csrf()).token(cookie)
            except (HTTPException, _Unavailable):
                if template != "error.html":
                    raise
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

    async def allowed(self, request: Request) -> bool:
        if self.authorize is None:
            return False
        verdict = self.authorize(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True


def _before(request: Request) -> datetime | None:
    text = request.query_params.get("before")
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise HTTPException(400, "before must be an ISO 8601 instant with an offset") from None
    if value.tzinfo is None:
        raise HTTPException(400, "before must be an ISO 8601 instant with an offset")
    return value


def _limit(request: Request, default: int) -> int:
    text = request.query_params.get("limit", str(default))
    if not text.isdigit() or not 1 <= int(text) <= _MAX_PAGE:
        raise HTTPException(400, f"limit must be a whole number from 1 to {_MAX_PAGE}")
    return int(text)


def app(
    dsn_or_pool: str | Any,
    *,
    authorize: Authorize | None = None,
    table: str = DEFAULT_TABLE,
    schema: str | None = None,
    refresh: float = 3.0,
    page_size: int = 50,
    csrf_secret: bytes | str | None = None,
    title: str = "cronlock",
) -> Starlette:
    """The fleet dashboard, an ASGI app to mount (``app.mount("/cron", web.app(pool))``).

    *dsn_or_pool*: an ``asyncpg.Pool`` (a connection is borrowed per request) or a DSN
    (one connection per request, closed after it; nothing to close at shutdown). It only
    reads the run ledger (*table*, *schema*, as the replicas' ``PostgresLocker`` names it)
    unless *authorize* is given: then pause, resume and trigger buttons appear, and a POST
    that *authorize* (sync or async) does not answer ``True`` is refused with a 403.
    *refresh*: seconds between the pages' live updates. *csrf_secret*: the key of the
    CSRF tokens; by default the fleet's, kept in the ledger's ``<table>_secrets`` table
    (made by the first process that needs it), so that every process serving the
    dashboard accepts the others' pages. Given, it must be the same in every process.
    """
    if not (isinstance(refresh, int | float) and refresh > 0):
        raise ConfigError(f"web.app: refresh must be a positive number of seconds, got {refresh!r}")
    if not (isinstance(page_size, int) and 1 <= page_size <= _MAX_PAGE):
        raise ConfigError(f"web.app: page_size must be 1 to {_MAX_PAGE}, got {page_size!r}")
    if not isinstance(dsn_or_pool, str) and not isinstance(dsn_or_pool, asyncpg.Pool):
        raise ConfigError(f"web.app: expected a DSN or an asyncpg.Pool, got {dsn_or_pool!r}")
    board = _Dashboard(
        dsn_or_pool,
        LedgerTable(table, schema),
        authorize,
        refresh=float(refresh),
        page_size=page_size,
        csrf_secret=csrf_secret,
        title=title,
    )

    async def index(request: Request) -> Response:
        jobs, now = await board.jobs()
        return await board.page(request, "jobs.html", jobs=jobs, now=now)

    async def job_page(request: Request) -> Response:
        data = await board.job(
            request.path_params["name"], _before(request), _limit(request, board.page_size)
        )
        return await board.page(request, "job.html", before=_before(request), **data)

    async def api_jobs(request: Request) -> Response:
        jobs, now = await board.jobs()
        return JSONResponse(
            {
                "now": now.isoformat(),
                "read_only": board.authorize is None,
                "jobs": [job.json() for job in jobs],
            }
        )

    async def api_runs(request: Request) -> Response:
        data = await board.job(
            request.path_params["name"], _before(request), _limit(request, board.page_size)
        )
        more = data["more"]
        return JSONResponse(
            {
                "job": data["job"].name,
                "runs": [run_json(r) for r in data["runs"]],
                "next_before": None if more is None else more.isoformat(),
            }
        )

    async def action(request: Request) -> Response:
        verb = request.path_params["action"]
        if verb not in ACTIONS:
            raise HTTPException(404, "no such action")
        body = await request.body()
        if len(body) > _MAX_FORM:
            raise HTTPException(413, "form too large")
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        # Every refusal comes before any job is touched (only the fleet's key may be made,
        # once), and names its cause: the browser's owner reads it, not the site that
        # forged the form (it cannot read the answer).
        if board.authorize is None:
            raise HTTPException(403, "this dashboard is read-only")
        refusal = (await board.csrf()).refusal(request, form.get("csrf"))
        if refusal is not None:
            raise HTTPException(403, refusal)
        if not await board.allowed(request):
            raise HTTPException(403, "refused: you may not change jobs here")
        job = form.get("job", "")
        async with board.connection() as conn:
            if not await read_jobs(conn, board.table, [job]):
                raise HTTPException(404, "no such job in the run ledger")
        await act(board.source, board.table, verb, job)
        _logger.info("dashboard: %s %r", verb, job)
        target = f"/jobs/{quote(job, safe='')}" if form.get("back") == "job" else "/"
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(base + target, status_code=303)

    async def failed(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 503
        detail = exc.detail if isinstance(exc, HTTPException) else "the database did not answer"
        if request.url.path.startswith(request.scope.get("root_path", "") + "/api/"):
            return JSONResponse({"error": detail}, status_code=code)
        return await board.page(request, "error.html", status=code, code=code, detail=detail)

    routes = [
        Route("/", index),
        Route("/api/jobs", api_jobs),
        Route("/api/jobs/{name:path}/runs", api_runs),
        Route("/actions/{action}", action, methods=["POST"]),
        Route("/jobs/{name:path}", job_page),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[SecurityHeaders.middleware()],
        exception_handlers={HTTPException: failed, _Unavailable: failed},
    )
