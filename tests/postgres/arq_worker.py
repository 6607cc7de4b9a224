"""A real arq worker process for the hand-off tests (test_queue_arq.py).

``python arq_worker.py --redis URL --queue Q``: runs arq's worker on queue *Q* with one
function, ``handoff(ctx, slot)``, which appends ``{"key": <arq job id>, "slot": slot}`` to
the Redis list ``Q:executed`` (the test reads what was executed, and how often, there).
Prints ``{"event": "running"}`` once the worker started; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Any

from arq.connections import RedisSettings
from arq.worker import Worker, func


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", required=True)
    parser.add_argument("--queue", required=True)
    args = parser.parse_args()

    async def handoff(ctx: dict[str, Any], slot: str) -> None:
        line = json.dumps({"key": ctx["job_id"], "slot": slot})
        await ctx["redis"].rpush(f"{args.queue}:executed", line)

    worker = Worker(
        functions=[func(handoff, name="handoff")],
        queue_name=args.queue,
        redis_settings=RedisSettings.from_dsn(args.redis),
        handle_signals=False,
        poll_delay=0.1,
        keep_result=3600,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    running = asyncio.create_task(worker.async_run(), name="arq-worker")
    print(json.dumps({"event": "running"}), flush=True)
    await stop.wait()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    await worker.close()


if __name__ == "__main__":
    asyncio.run(main())
