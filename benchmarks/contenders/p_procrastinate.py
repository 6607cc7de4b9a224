"""procrastinate 3.10 in the peers benchmark: periodic tasks, deferred once per time, and a worker.

Every worker runs procrastinate's periodic deferrer: for each periodic task it defers a
job for each scheduled time it has passed, and the database refuses a second defer of the
same (task, periodic id, time), so each time is deferred once; any worker then fetches
and runs it (LISTEN/NOTIFY wakes the workers). One task registered N times with
``@app.periodic(cron=..., periodic_id=f"j{i}")`` and the job's number in its kwargs, as its
documentation says for several schedules of one task. The cron takes a sixth field for
seconds: ``* * * * * *`` is every second, ``* * * * * S`` once a minute at second S. The
deferrer wakes 0.5 s after each scheduled time, by design (its ``MARGIN``). The worker's
concurrency is 10 (procrastinate's default is 1; arq's ``max_jobs`` is 10), the rest its
defaults. The tables live in a schema of the run's own (``search_path``), dropped after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import procrastinate  # type: ignore[import-not-found,unused-ignore]

CONCURRENCY = 10


def _app(opts: Any) -> Any:
    connector = procrastinate.PsycopgConnector(
        conninfo=opts.dsn, kwargs={"options": f"-c search_path={opts.ns}"}
    )
    return procrastinate.App(connector=connector)


async def setup(opts: Any) -> None:
    """The schema is the driver's; procrastinate's tables, types and functions go into it."""
    app = _app(opts)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def teardown(opts: Any) -> None:
    """Nothing here: the driver drops the run's schema."""


async def run(
    opts: Any, record: Callable[[int, float], None], ready: Callable[[], None], stop: Any
) -> None:
    app = _app(opts)

    @app.task(name="bench_job")
    async def job(timestamp: int, i: int) -> None:
        record(i, float(timestamp))

    cron = "* * * * * *" if opts.interval == 1 else f"* * * * * {opts.first % 60}"
    for i in range(opts.jobs):
        app.periodic(cron=cron, periodic_id=f"j{i}", task_kwargs={"i": i})(job)
    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=CONCURRENCY, install_signal_handlers=False),
            name="procrastinate-worker",
        )
        ready()
        await stop.wait()
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
