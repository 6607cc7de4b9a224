"""cronlock in the peers benchmark: a Scheduler with a PostgresLocker (its defaults) per replica.

Every replica registers the same N jobs ``every(interval, anchor=first)`` and claims each
slot from PostgreSQL (session mode, the run ledger in a schema of the run's own, fleet time
and the fair race on: the defaults). A skewed replica is skewed the same way as the peers'
(libfaketime), not through ``OffsetClock`` as in run.py's *skew* scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cronlock import RunContext, Scheduler, every
from cronlock.postgres import PostgresLocker


async def setup(opts: Any) -> None:
    """The schema is the driver's; the locker creates the ledger's tables in it."""


async def teardown(opts: Any) -> None:
    """Nothing here: the driver drops the run's schema (advisory locks end with sessions)."""


async def run(
    opts: Any, record: Callable[[int, float], None], ready: Callable[[], None], stop: Any
) -> None:
    async def job(i: int, ctx: RunContext) -> None:
        record(i, ctx.slot.timestamp())

    locker = PostgresLocker(opts.dsn, schema=opts.ns)
    scheduler = Scheduler(locker=locker)
    schedule = every(opts.interval, anchor=datetime.fromtimestamp(opts.first, UTC))
    for i in range(opts.jobs):
        # Job names of this run alone: advisory locks are per database, not per schema.
        scheduler.add_job(job, schedule, name=f"{opts.ns}-j{i}", args=(i,))
    async with locker, scheduler:
        ready()
        await stop.wait()
