"""A FastAPI service whose scheduled jobs run once per slot across all its workers.

Run it (from the repository root) as three worker processes under uvicorn's supervisor::

    DATABASE_DSN=postgresql://postgres@127.0.0.1:5432/postgres \\
        uvicorn examples.fastapi_app:app --workers 3 --timeout-graceful-shutdown 30

Each worker runs the same scheduler; PostgreSQL advisory locks and the run ledger let one
of them run each slot. ``GET /jobs`` shows each job's next and last run, ``GET
/heartbeats`` the latest rows the jobs wrote. Stop it with Ctrl-C or SIGTERM: each worker
waits for its runs in flight (up to ``STOP_TIMEOUT``), then closes its locker and its pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Query, Request

from cronlock import Scheduler

from .service import (
    HeartbeatTable,
    Settings,
    build_scheduler,
    configure_logging,
    jobs_view,
    open_pool,
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Pool first, then the scheduler; at shutdown the scheduler first, then the pool."""
    settings = Settings.from_env()
    configure_logging(settings)
    pool = await open_pool(settings)
    try:
        scheduler = build_scheduler(pool, settings)
        app.state.settings = settings
        app.state.pool = pool
        app.state.scheduler = scheduler
        # Leaving this block stops firing, waits for runs in flight (stop_timeout), then
        # closes the PostgresLocker, which gives its borrowed connections back to the pool.
        async with scheduler:
            yield
    finally:
        await pool.close()


app = FastAPI(title="cronlock example (FastAPI)", lifespan=lifespan)


def _scheduler(request: Request) -> Scheduler:
    scheduler: Scheduler = request.app.state.scheduler
    return scheduler


@app.get("/jobs")
async def jobs(request: Request) -> dict[str, Any]:
    """Each job's next run (this worker) and last run and success (fleet-wide)."""
    return jobs_view(_scheduler(request))


@app.get("/heartbeats")
async def heartbeats(request: Request, limit: int = Query(20, ge=1, le=500)) -> dict[str, Any]:
    """The latest rows the jobs wrote, newest first: which worker ran which slot."""
    settings: Settings = request.app.state.settings
    table = HeartbeatTable(request.app.state.pool, settings.table)
    return {"rows": await table.recent(limit)}
