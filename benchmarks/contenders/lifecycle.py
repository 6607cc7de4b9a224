"""How a benchmark's replica process ends: on SIGTERM or SIGINT, when the driver that
started it is gone (it must not outlive it), or after *max_seconds* at the latest.

The replica scripts run as ``python contenders/<script>.py``, so this folder is first on
their ``sys.path`` and they import it by its bare name, in any contender's virtualenv.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

__all__ = ("stop_when_told",)


def stop_when_told(max_seconds: float, poll: float) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """An event set when the process should stop, and the task that watches the driver
    (every *poll* seconds; cancel it on the way out)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    parent = os.getppid()

    async def orphaned() -> None:
        deadline = time.monotonic() + max_seconds
        while os.getppid() == parent and time.monotonic() < deadline:
            await asyncio.sleep(poll)
        stop.set()

    return stop, loop.create_task(orphaned(), name="orphaned")
