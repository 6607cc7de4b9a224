"""A replica process of the queue hand-off tests (test_queue_arq.py, test_queue_procrastinate.py):
a scheduler on a real PostgresLocker (ledger on) whose one job, ``handoff``, hands each slot
of ``every(1)`` off to a queue with a sender of :mod:`cronlock.queues`, until SIGTERM.

``python handoff_replica.py --dsn DSN --kind arq|procrastinate --broker URL --queue Q
--namespace NS --id NAME``: *broker* is the Redis URL (arq) or the PostgreSQL conninfo of
procrastinate's tables. The job's message goes to queue *Q*, to the worker's function
``handoff`` with the slot as ``slot``. Prints JSON lines: ``{"event": "running"}`` once
started; ``{"event": "sent", "replica", "slot"}`` for each run that succeeded,
``{"event": "failed", ...}`` for one that failed; ``{"event": "log", "replica", "slot",
"message"}`` for each line of the ``cronlock.queues`` logger.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from cronlock import Event, JobFailed, JobSucceeded, Scheduler, every
from cronlock.postgres import PostgresLocker
from cronlock.queues import arq_sender, procrastinate_sender


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class _Lines(logging.Handler):
    def __init__(self, replica: str) -> None:
        super().__init__(logging.INFO)
        self.replica = replica

    def emit(self, record: logging.LogRecord) -> None:
        slot = getattr(record, "slot", None)
        emit(event="log", replica=self.replica, slot=slot, message=record.getMessage())


@contextlib.asynccontextmanager
async def sender(args: argparse.Namespace) -> AsyncIterator[Callable[..., Any]]:
    if args.kind == "arq":
        from arq import create_pool
        from arq.connections import RedisSettings

        redis = await create_pool(RedisSettings.from_dsn(args.broker))
        try:
            yield arq_sender(redis, "handoff", _queue_name=args.queue, slot_kwarg="slot")
        finally:
            await redis.aclose()
    else:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.broker))

        @app.task(name="handoff", queue=args.queue)
        def handoff(slot: str) -> None:  # run by the test's worker, never here
            raise AssertionError("a replica only defers")

        async with app.open_async():
            yield procrastinate_sender(handoff, slot_kwarg="slot")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--kind", choices=("arq", "procrastinate"), required=True)
    parser.add_argument("--broker", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--id", required=True)
    args = parser.parse_args()
    logger = logging.getLogger("cronlock.queues")
    logger.setLevel(logging.INFO)
    logger.addHandler(_Lines(args.id))
    locker = PostgresLocker(args.dsn, racers=None)
    scheduler = Scheduler(locker=locker, stop_timeout=5, idempotency_namespace=args.namespace)

    def tell(event: Event) -> None:
        if isinstance(event, JobSucceeded | JobFailed):
            emit(
                event="sent" if isinstance(event, JobSucceeded) else "failed",
                replica=args.id,
                slot=event.slot.isoformat(),
            )

    scheduler.subscribe(tell)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with sender(args) as send:
        scheduler.add_job(send, every(1), name="handoff", retries=2, retry_delay=0.2)
        async with locker, scheduler:
            emit(event="running")
            await stop.wait()
    emit(event="stopped", replica=args.id)


if __name__ == "__main__":
    asyncio.run(main())
