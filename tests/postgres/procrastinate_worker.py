"""A real procrastinate worker process for the hand-off tests (test_queue_procrastinate.py).

``python procrastinate_worker.py --conninfo DSN --queue Q``: runs procrastinate's worker on
queue *Q* of the database *DSN* (its schema applied there by the test), with one task,
``handoff(slot)``, which prints ``{"event": "ran", "key": <the job's queueing_lock>,
"slot": slot}``. Prints ``{"event": "running"}`` first; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

import procrastinate


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conninfo", required=True)
    parser.add_argument("--queue", required=True)
    args = parser.parse_args()
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.conninfo))

    @app.task(name="handoff", queue=args.queue, pass_context=True)
    async def handoff(context: procrastinate.JobContext, slot: str) -> None:
        assert context.job is not None
        emit(event="ran", key=context.job.queueing_lock, slot=slot)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(
                queues=[args.queue],
                install_signal_handlers=False,
                fetch_job_polling_interval=0.2,
            ),
            name="procrastinate-worker",
        )
        emit(event="running")
        await stop.wait()
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main())
