"""arq 0.28 in the peers benchmark: a worker whose cron jobs enqueue each run under a unique id.

arq's cron jobs are evaluated by every worker: each enqueues the job due next under the id
``<name>:<run time in ms>`` (``unique=True``, arq's default, which its documentation gives
for several workers), so Redis keeps one copy, and whichever worker polls it first runs it.
Fields have second resolution: ``second=None`` is every second, ``second=S`` once a minute.
``microsecond=0`` puts the run time on the whole second like every other contender (arq's
default is 0.123456 s past it). Everything else is arq's default: ``poll_delay`` 0.5 s,
``max_jobs`` 10, ``keep_result`` 0 for cron jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from arq.connections import RedisSettings, create_pool  # type: ignore[import-not-found,unused-ignore]
from arq.cron import cron  # type: ignore[import-not-found,unused-ignore]
from arq.worker import Worker  # type: ignore[import-not-found,unused-ignore]


def _redis(opts: Any) -> Any:
    host, _, port = opts.redis.rpartition(":")
    return RedisSettings(host=host, port=int(port))


async def setup(opts: Any) -> None:
    """Nothing to create: the keys of this run all carry its namespace."""


async def teardown(opts: Any) -> None:
    pool = await create_pool(_redis(opts))
    try:
        keys = [key async for key in pool.scan_iter(match=f"*{opts.ns}*", count=1000)]
        for start in range(0, len(keys), 500):
            await pool.delete(*keys[start : start + 500])
    finally:
        await pool.aclose()


async def run(
    opts: Any, record: Callable[[int, float], None], ready: Callable[[], None], stop: Any
) -> None:
    async def job(ctx: dict[str, Any]) -> None:
        name, _, run_ms = ctx["job_id"].rpartition(":")  # "<ns>-j<i>:<ms>"
        record(int(name.rsplit("-j", 1)[1]), int(run_ms) / 1000)

    second = None if opts.interval == 1 else opts.first % 60
    jobs = [
        cron(job, name=f"{opts.ns}-j{i}", second=second, microsecond=0, unique=True)
        for i in range(opts.jobs)
    ]
    worker = Worker(
        functions=[],
        cron_jobs=jobs,
        redis_settings=_redis(opts),
        queue_name=f"{opts.ns}:queue",
        handle_signals=False,
    )
    main = asyncio.create_task(worker.async_run(), name="arq-worker")
    ready()
    await stop.wait()
    main.cancel()
    await asyncio.gather(main, return_exceptions=True)
    await worker.close()
