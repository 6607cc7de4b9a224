"""A service with cronlock's metrics as a multi-worker server runs it:
``uvicorn tests.services.metrics_app:app --workers 3``, ``PROMETHEUS_MULTIPROC_DIR`` set.

Each worker runs a scheduler on one run ledger (``CRONLOCK_METRICS_DSN``,
``CRONLOCK_METRICS_TABLE``) with a job that fails every second, and serves ``/metrics``
from :func:`cronlock.prometheus.scrape_registry`; every answer names the worker that gave
it (``x-worker-pid``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from prometheus_client import make_asgi_app
from starlette.applications import Starlette

import cronlock.prometheus
from cronlock import Scheduler
from cronlock.postgres import PostgresLocker

from ..multiworker import pid_marked

_metrics = make_asgi_app(cronlock.prometheus.scrape_registry())
_FAILURE = "fails every second"


class _Expected(logging.Filter):
    """Leaves the job's own failures out of the log: the test looks for tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, RuntimeError) and str(error) == _FAILURE)


logging.getLogger("cronlock").addFilter(_Expected())


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """The pool, the scheduler and its metrics; closed in the reverse order."""
    async with asyncpg.create_pool(os.environ["CRONLOCK_METRICS_DSN"], min_size=1) as pool:
        scheduler = Scheduler(
            locker=PostgresLocker(pool, table=os.environ["CRONLOCK_METRICS_TABLE"])
        )

        @scheduler.every(1, name="fails")
        async def fails() -> None:
            raise RuntimeError(_FAILURE)

        metrics = cronlock.prometheus.instrument(scheduler)
        try:
            async with scheduler:
                yield
        finally:
            metrics.close()


_app = Starlette(lifespan=lifespan)
_app.mount("/metrics", _metrics)
app = pid_marked(_app)
"""The service, each answer marked with this worker's pid."""
