"""Plain (non-async) tasks run in worker threads; counted so a virtual clock can wait."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator
from typing import Any

__all__ = ("ThreadRun", "in_thread", "threads_in_flight")

_threads = 0


def threads_in_flight() -> int:
    """How many plain-function runs are executing in worker threads right now, awaited.

    A thread whose run stopped awaiting it (timed out, cancelled) is not counted: it may
    never return, and a virtual clock that waited for it would hang.
    """
    return _threads


class ThreadRun:
    """A plain function's call in a worker thread (anyio's pool), awaited once for its result.

    A thread cannot be stopped. When the await is cancelled (a timeout, a shutdown) it
    raises at once and the thread goes on; :meth:`wait_returned` then waits for the thread
    itself, so that the run it belongs to can stay in flight until the work has ended.
    """

    __slots__ = ("_call", "_returned", "error")

    def __init__(self, call: Callable[[], object]) -> None:
        self._call = call
        self._returned: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        """What the thread raised, once it has returned (None: it returned a value)."""

    def __await__(self) -> Generator[Any, None, object]:
        return self._run().__await__()

    @property
    def running(self) -> bool:
        """Whether the thread started and has not returned yet."""
        return self._returned is not None and not self._returned.done()

    async def wait_returned(self) -> None:
        """Wait until the thread has returned (at once if it never started or has)."""
        if self._returned is not None:
            # Shielded: cancelling this wait must not cancel the future the thread sets.
            await asyncio.shield(self._returned)

    async def _run(self) -> object:
        import anyio.to_thread

        global _threads
        loop = asyncio.get_running_loop()
        self._returned = returned = loop.create_future()
        _threads += 1
        try:
            # abandon_on_cancel: a cancellation ends this await at once, not the thread.
            return await anyio.to_thread.run_sync(
                self._work, loop, returned, abandon_on_cancel=True
            )
        finally:
            _threads -= 1

    def _work(self, loop: asyncio.AbstractEventLoop, returned: asyncio.Future[None]) -> object:
        """In the worker thread: the call, then tell the loop that the thread is done."""
        try:
            return self._call()
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            # The loop may be closed by now (the scheduler stopped without waiting for us).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set, returned)


def _set(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def in_thread(call: Callable[[], object]) -> ThreadRun:
    """Run *call* in a worker thread when awaited; see :class:`ThreadRun`."""
    return ThreadRun(call)
