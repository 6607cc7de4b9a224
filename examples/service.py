"""What both example services share: settings, the heartbeat table, the jobs, the /jobs view.

The services differ only in how their web framework starts and stops them
(``fastapi_app.py``: a lifespan; ``aiohttp_app.py``: a cleanup context). Both do the same
three things in the same order:

1. open the application's asyncpg pool (and create the heartbeat table if it is missing);
2. enter the scheduler (``async with scheduler``), whose ``PostgresLocker`` borrows a few
   connections from that pool for its advisory locks and run ledger;
3. at shutdown, leave the scheduler first (it waits up to ``stop_timeout`` for runs in
   flight, then closes the locker it was given, which hands its connections back), then
   close the pool, which then returns at once.

Every setting comes from the environment, so one command starts a service and the tests
can point it at a table and a schema of their own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from cronlock import Job, RunContext, RunRecord, Scheduler
from cronlock.postgres import PostgresLocker

__all__ = (
    "HeartbeatTable",
    "Settings",
    "build_scheduler",
    "configure_logging",
    "jobs_view",
    "open_pool",
)

logger = logging.getLogger("examples")


# Environment variable -> (field, type); the defaults are the dataclass's.
_FROM_ENV: dict[str, tuple[str, type[str] | type[float]]] = {
    "HEARTBEAT_TABLE": ("table", str),
    "LEDGER_TABLE": ("ledger_table", str),
    "HEARTBEAT_SECONDS": ("heartbeat_seconds", float),
    "REPORT_CRON": ("report_cron", str),
    "REPORT_SECONDS": ("report_seconds", float),
    "STOP_TIMEOUT": ("stop_timeout", float),
    "SCHEDULER_TZ": ("tz", str),
    "APPLICATION_NAME": ("application_name", str),
    "LOG_LEVEL": ("log_level", str),
    "JOB_PREFIX": ("job_prefix", str),
}


@dataclass(frozen=True, slots=True)
class Settings:
    """The service's settings, read from the environment by :meth:`from_env`.

    ============================ ==================== ==========================================
    variable                     default              meaning
    ============================ ==================== ==========================================
    ``DATABASE_DSN``             (required)           the PostgreSQL server (asyncpg DSN)
    ``HEARTBEAT_TABLE``          ``heartbeat``        the table each run writes a row to
    ``LEDGER_TABLE``             ``cronlock_runs``    cronlock's run ledger (``PostgresLocker``)
    ``HEARTBEAT_SECONDS``        ``1``                the heartbeat job's interval
    ``REPORT_CRON``              ``*/10 * * * * *``   the slow job's cron (6 fields, seconds first)
    ``REPORT_SECONDS``           ``3``                how long the slow job works
    ``STOP_TIMEOUT``             ``10``               how long shutdown waits for runs in flight
    ``SCHEDULER_TZ``             ``UTC``              the scheduler's time zone
    ``APPLICATION_NAME``         ``cronlock-example`` prefix of the sessions' application_name
    ``LOG_LEVEL``                ``INFO``             the level of the service's own log lines
    ``JOB_PREFIX``               (none)               put before the job names (see below)
    ============================ ==================== ==========================================

    A job's name is its advisory lock's key on the whole database, whatever schema or
    ledger table the service uses: two deployments sharing one database (a staging copy,
    a test run) need a ``JOB_PREFIX`` each, or each one's runs hold the other's locks and
    slots are skipped on both.
    """

    dsn: str
    table: str = "heartbeat"
    ledger_table: str = "cronlock_runs"
    heartbeat_seconds: float = 1.0
    report_cron: str = "*/10 * * * * *"
    report_seconds: float = 3.0
    stop_timeout: float = 10.0
    tz: str = "UTC"
    application_name: str = "cronlock-example"
    log_level: str = "INFO"
    job_prefix: str = ""

    @classmethod
    def from_env(cls) -> Settings:
        """The settings from the environment; ``DATABASE_DSN`` must be set."""
        dsn = os.environ.get("DATABASE_DSN")
        if not dsn:
            raise RuntimeError(
                "set DATABASE_DSN to a PostgreSQL server, e.g. "
                "DATABASE_DSN=postgresql://postgres@127.0.0.1:5432/postgres"
            )
        values: dict[str, Any] = {}
        for variable, (field, kind) in _FROM_ENV.items():
            raw = os.environ.get(variable)
            if raw:
                try:
                    values[field] = kind(raw)
                except ValueError:
                    raise ValueError(f"{variable}={raw!r} is not a number") from None
        return cls(dsn=dsn, **values)

    def session_name(self, role: str) -> str:
        """``<APPLICATION_NAME>:<role>:<pid>``: who holds a session, in pg_stat_activity."""
        return f"{self.application_name}:{role}:{os.getpid()}"


def configure_logging(settings: Settings) -> None:
    """Log lines with the worker's pid (a no-op where the server configured logging)."""
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    level = settings.log_level.upper()
    logging.getLogger("examples").setLevel(level)
    logging.getLogger("cronlock").setLevel(level)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class HeartbeatTable:
    """One row per run: job, slot, the worker's pid, when it started and finished.

    There is deliberately no unique key on (job, slot): the table is a witness of how
    often each slot ran, so a slot run twice would show as two rows.
    """

    def __init__(self, pool: Any, name: str) -> None:
        self._pool = pool
        self._name = _quote(name)

    async def create(self) -> None:
        """Create the table if it is missing.

        Workers start together, and concurrent ``CREATE TABLE IF NOT EXISTS`` of one name
        can fail on PostgreSQL's catalog; a transaction-scoped advisory lock serialises it.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self._name)
            await conn.execute(
                f"""
                CREATE TABLE IF NOT EXISTS {self._name} (
                    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    job         text        NOT NULL,
                    slot        timestamptz NOT NULL,
                    pid         integer     NOT NULL,
                    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
                    finished_at timestamptz
                )
                """
            )

    async def started(self, ctx: RunContext) -> int:
        """Record that this worker started the run of *ctx*; returns the row's id."""
        row_id: int = await self._pool.fetchval(
            f"INSERT INTO {self._name} (job, slot, pid) VALUES ($1, $2, $3) RETURNING id",
            ctx.job,
            ctx.slot,
            os.getpid(),
        )
        return row_id

    async def finished(self, row_id: int) -> None:
        """Record that the run of row *row_id* finished."""
        await self._pool.execute(
            f"UPDATE {self._name} SET finished_at = clock_timestamp() WHERE id = $1", row_id
        )

    async def runs_per_worker(self, since: datetime) -> dict[int, int]:
        """How many runs each worker pid started since *since*."""
        rows = await self._pool.fetch(
            f"SELECT pid, count(*) FROM {self._name} WHERE started_at >= $1 GROUP BY pid",
            since,
        )
        return {row[0]: row[1] for row in rows}

    async def recent(self, limit: int) -> list[dict[str, Any]]:
        """The latest *limit* rows, newest first, as JSON-ready dicts."""
        rows = await self._pool.fetch(
            f"SELECT job, slot, pid, started_at, finished_at FROM {self._name} "
            "ORDER BY id DESC LIMIT $1",
            limit,
        )
        return [
            {
                "job": row["job"],
                "slot": _iso(row["slot"]),
                "pid": row["pid"],
                "started_at": _iso(row["started_at"]),
                "finished_at": _iso(row["finished_at"]),
            }
            for row in rows
        ]


async def open_pool(settings: Settings) -> Any:
    """The application's asyncpg pool, with the heartbeat table created if missing.

    The scheduler's ``PostgresLocker`` borrows up to ``sessions`` (default 4) of these
    connections for its lifetime, so the pool is sized for that plus the requests' needs.
    """
    pool = await asyncpg.create_pool(
        settings.dsn,
        min_size=1,
        max_size=10,
        server_settings={"application_name": settings.session_name("app")},
    )
    try:
        await HeartbeatTable(pool, settings.table).create()
    except BaseException:
        await pool.close()
        raise
    return pool


def build_scheduler(pool: Any, settings: Settings) -> Scheduler:
    """The service's scheduler and its two jobs, coordinated through *pool*'s server.

    Every worker builds the same scheduler; the locker's advisory locks and run ledger let
    exactly one of them run each slot. The scheduler closes the locker when it shuts down
    (the ownership rule), so the caller only closes the pool, afterwards.
    """
    table = HeartbeatTable(pool, settings.table)
    scheduler = Scheduler(
        tz=settings.tz,
        stop_timeout=settings.stop_timeout,
        locker=PostgresLocker(
            pool,
            table=settings.ledger_table,
            application_name=settings.session_name("cronlock"),
        ),
    )

    prefix = settings.job_prefix

    @scheduler.every(seconds=settings.heartbeat_seconds, name=f"{prefix}heartbeat", timeout=30)
    async def heartbeat(ctx: RunContext) -> None:
        """A short job: one row per slot, written by whichever worker won the slot."""
        row_id = await table.started(ctx)
        await table.finished(row_id)
        logger.info("heartbeat %s ran here", ctx.slot.strftime("%H:%M:%S"))

    @scheduler.cron(settings.report_cron, seconds=True, name=f"{prefix}report", timeout=120)
    async def report(ctx: RunContext) -> None:
        """A slow job: counts the last minute's runs per worker, then works for a while.

        At shutdown a run of it may be in flight: the scheduler waits for it (up to
        ``stop_timeout``) before it closes the locker, so its row and its ledger entry are
        finished, not left half done.
        """
        row_id = await table.started(ctx)
        counts = await table.runs_per_worker(since=ctx.slot - timedelta(minutes=1))
        logger.info(
            "report %s started; runs per worker pid in the last minute: %s",
            ctx.slot.strftime("%H:%M:%S"),
            counts,
        )
        await asyncio.sleep(settings.report_seconds)  # stands in for real work
        await table.finished(row_id)
        logger.info("report %s finished", ctx.slot.strftime("%H:%M:%S"))

    return scheduler


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _record(record: RunRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "slot": _iso(record.slot),
        "started_at": _iso(record.started_at),
        "finished_at": _iso(record.finished_at),
        "outcome": record.outcome,
        # The ledger names the worker that ran it; a run of this worker has no owner set.
        "by": record.owner or f"{socket.gethostname()}:{os.getpid()}",
    }


def _job(job: Job) -> dict[str, Any]:
    return {
        "name": job.name,
        "schedule": str(job.schedule),
        "next_run": _iso(job.next_run),
        "last_run": _record(job.last_run),
        "last_success": _record(job.last_success),
        "running_here": job.running,
        "runs_here": job.run_count,
    }


def jobs_view(scheduler: Scheduler) -> dict[str, Any]:
    """What ``GET /jobs`` answers: this worker's pid and each job's state.

    ``last_run``/``last_success`` are fleet-wide (whichever worker ran it, as ``by``:
    ``host:pid``; a worker that lost a slot reads the run ledger, at most every 30
    seconds); ``next_run``, ``running_here`` and ``runs_here`` are this worker's.
    """
    return {"pid": os.getpid(), "jobs": [_job(job) for job in scheduler.jobs]}
