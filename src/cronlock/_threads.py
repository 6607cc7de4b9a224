"""Plain (non-async) tasks run in worker threads; counted so a virtual clock can wait."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ("in_thread", "threads_in_flight")

_threads = 0


def threads_in_flight() -> int:
    """How many plain-function runs are executing in worker threads right now."""
    return _threads


async def in_thread(call: Callable[[], object]) -> object:
    """Run *call* in a worker thread (anyio's pool); abandoned, not stopped, on cancel."""
    import anyio.to_thread

    global _threads
    _threads += 1
    try:
        # A thread cannot be cancelled: on timeout or shutdown the run is abandoned and
        # the thread finishes in the background.
        return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
    finally:
        _threads -= 1
