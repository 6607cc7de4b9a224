"""An aiohttp service whose scheduled jobs run once per slot across all its workers.

Run it (from the repository root) as three worker processes under gunicorn::

    DATABASE_DSN=postgresql://postgres@127.0.0.1:5432/postgres \\
        gunicorn examples.aiohttp_app:app_factory --worker-class aiohttp.GunicornWebWorker \\
        --workers 3 --bind 127.0.0.1:8080 --graceful-timeout 30

or as one process: ``python -m aiohttp.web -H 127.0.0.1 -P 8080
examples.aiohttp_app:app_factory``. Each worker runs the same scheduler; PostgreSQL advisory
locks and the run ledger let one of them run each slot. ``GET /jobs`` shows each job's
next and last run, ``GET /heartbeats`` the latest rows the jobs wrote. Stop it with Ctrl-C
or SIGTERM: each worker waits for its runs in flight (up to ``STOP_TIMEOUT``), then closes
its locker and its pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from cronlock import Scheduler

from .service import (
    HeartbeatTable,
    Settings,
    build_scheduler,
    configure_logging,
    jobs_view,
    open_pool,
)

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
SCHEDULER = web.AppKey("scheduler", Scheduler)


async def scheduler_ctx(app: web.Application) -> AsyncIterator[None]:
    """Pool first, then the scheduler; at shutdown the scheduler first, then the pool."""
    settings = app[SETTINGS]
    pool = await open_pool(settings)
    try:
        scheduler = build_scheduler(pool, settings)
        app[POOL] = pool
        app[SCHEDULER] = scheduler
        # Leaving this block stops firing, waits for runs in flight (stop_timeout), then
        # closes the PostgresLocker, which gives its borrowed connections back to the pool.
        async with scheduler:
            yield
    finally:
        await pool.close()


async def jobs(request: web.Request) -> web.Response:
    """Each job's next run (this worker) and last run and success (fleet-wide)."""
    return web.json_response(jobs_view(request.app[SCHEDULER]))


async def heartbeats(request: web.Request) -> web.Response:
    """The latest rows the jobs wrote, newest first: which worker ran which slot."""
    try:
        limit = int(request.query.get("limit", "20"))
    except ValueError:
        raise web.HTTPBadRequest(text="limit must be an integer") from None
    if not 1 <= limit <= 500:
        raise web.HTTPBadRequest(text="limit must be between 1 and 500")
    table = HeartbeatTable(request.app[POOL], request.app[SETTINGS].table)
    return web.json_response({"rows": await table.recent(limit)})


async def app_factory(argv: list[str] | None = None) -> web.Application:
    """The application (gunicorn's aiohttp worker awaits it; ``python -m aiohttp.web`` too).

    *argv* is what ``python -m aiohttp.web`` passes on; the settings come from the
    environment.
    """
    settings = Settings.from_env()
    configure_logging(settings)
    app = web.Application()
    app[SETTINGS] = settings
    app.cleanup_ctx.append(scheduler_ctx)
    app.router.add_get("/jobs", jobs)
    app.router.add_get("/heartbeats", heartbeats)
    return app
