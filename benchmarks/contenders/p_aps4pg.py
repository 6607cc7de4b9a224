"""APScheduler 4.0.0a6 multi-node in the peers benchmark: schedulers sharing a PostgreSQL store.

Each replica is an ``AsyncScheduler`` on the same ``SQLAlchemyDataStore`` (asyncpg engine,
a schema of the run's own) with an ``AsyncpgEventBroker`` (PostgreSQL NOTIFY, a channel
of the run's own): the setup its documentation gives for several schedulers sharing a
data store. Every replica adds the same N schedules under fixed ids (the default
``ConflictPolicy.do_nothing`` keeps the first); the data store leases each due schedule to
one scheduler, which creates the job, and any scheduler's worker role acquires and runs it.
``IntervalTrigger(seconds=interval, start_time=first)``, ``misfire_grace_time=60``,
``coalesce=latest``, the rest its defaults (``max_concurrent_jobs`` 100).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from apscheduler import AsyncScheduler, CoalescePolicy, current_job  # type: ignore[import-not-found,unused-ignore]
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore  # type: ignore[import-not-found,unused-ignore]
from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker  # type: ignore[import-not-found,unused-ignore]
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-not-found,unused-ignore]
from sqlalchemy.ext.asyncio import create_async_engine  # type: ignore[import-not-found,unused-ignore]

_record: list[Callable[[int, float], None]] = []


async def job(i: int) -> None:
    # Module level: the data store keeps a reference ("p_aps4pg:job") that every replica
    # resolves by importing this module.
    _record[0](i, current_job.get().scheduled_fire_time.timestamp())


def _url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+asyncpg://", 1)


async def setup(opts: Any) -> None:
    """The schema is the driver's; the first scheduler creates its tables in it."""


async def teardown(opts: Any) -> None:
    """Nothing here: the driver drops the run's schema."""


async def run(
    opts: Any, record: Callable[[int, float], None], ready: Callable[[], None], stop: Any
) -> None:
    _record.append(record)
    engine = create_async_engine(_url(opts.dsn))
    store = SQLAlchemyDataStore(engine, schema=opts.ns)
    broker = AsyncpgEventBroker.from_async_sqla_engine(engine, channel=opts.ns)
    first = datetime.fromtimestamp(opts.first, UTC)
    async with AsyncScheduler(store, broker, identity=f"replica-{opts.replica}") as scheduler:
        for i in range(opts.jobs):
            await scheduler.add_schedule(
                job,
                IntervalTrigger(seconds=opts.interval, start_time=first),
                id=f"j{i}",
                args=(i,),
                misfire_grace_time=60,
                coalesce=CoalescePolicy.latest,
            )
        await scheduler.start_in_background()
        ready()
        await stop.wait()
        await scheduler.stop()
    await engine.dispose()
