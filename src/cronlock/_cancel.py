"""Cancellation-safe waiting: the three cleanup patterns every backend and the run loop share.

asyncio cancellation is edge-triggered: a plain ``await`` in ``finally`` survives one
cancel, not two, and ``asyncio.shield`` keeps the inner operation alive while the outer
await raises at once. Cleanup that must finish (an unlock, a claim's undo, a task we own)
therefore keeps awaiting the inner operation until it is done, then re-raises.
This module depends on nothing else in cronlock.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = (
    "RUN_TASK",
    "cancel_and_wait",
    "claim_or_undo",
    "finish_uncancellably",
    "task_name",
    "uncancellable",
)

_T = TypeVar("_T")


async def finish_uncancellably(aw: Awaitable[_T]) -> _T:
    """Run *aw* to completion even if the calling task is cancelled, then re-raise.

    Keep awaiting the shielded inner task, however many cancels arrive, and deliver the
    cancellation once it has finished. Bound *aw* with its own timeout: this function waits
    for it indefinitely.
    """
    inner = asyncio.ensure_future(aw)
    if inner.done():
        return inner.result()
    cancelled = False
    loop = asyncio.get_running_loop()
    while not inner.done():
        # A bare future woken by the inner one's completion: what asyncio.wait does, at a
        # fraction of its cost (runs end in thousands at once), and never cancelling it.
        waiter: asyncio.Future[None] = loop.create_future()
        wake = functools.partial(_wake, waiter)
        inner.add_done_callback(wake)
        try:
            await waiter
        except asyncio.CancelledError:
            cancelled = True
            inner.remove_done_callback(wake)
    if cancelled:
        # Deliver the cancellation we absorbed. Task.uncancel() was never called, so
        # asyncio.timeout() and TaskGroup still see the pending request and account for it.
        error = None if inner.cancelled() else inner.exception()
        raise asyncio.CancelledError from error
    return inner.result()


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def uncancellable(coro: Coroutine[Any, Any, _T], *, name: str) -> _T:
    """Run *coro* in its own named task to completion, whatever cancels us meanwhile.

    A cancellation that arrives meanwhile is re-raised afterwards. *coro* must bound itself
    with a timeout.
    """
    return await finish_uncancellably(asyncio.create_task(coro, name=name))


async def cancel_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """Cancel *tasks* and wait until every one has ended, even if we are cancelled meanwhile.

    Their outcomes are not raised (a task we cancel is expected to end cancelled); a
    cancellation of the caller is delivered once they have all ended.
    """
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    await finish_uncancellably(asyncio.wait(tasks))


async def claim_or_undo(
    attempt: Coroutine[Any, Any, _T] | asyncio.Future[_T],
    undo: Callable[[_T], Awaitable[None] | None],
    *,
    name: str,
) -> _T:
    """Run a claim to completion; if our caller was cancelled meanwhile, undo what it got.

    The claim runs in its own task that a cancellation does not interrupt (or is a future
    that some other task resolves, such as a batch of claims): a statement cancelled
    mid-flight may still have been granted by the backend, and we would not know what to
    undo. Once it has finished we know exactly: when it returned a result and the caller
    is being cancelled, ``undo(result)`` runs (itself shielded) before the cancellation is
    delivered, so nothing stays held by nobody.
    """
    task = (
        attempt if isinstance(attempt, asyncio.Future) else asyncio.create_task(attempt, name=name)
    )
    try:
        return await finish_uncancellably(task)
    except asyncio.CancelledError:
        if not task.cancelled() and task.exception() is None:
            pending = undo(task.result())
            if pending is not None:
                await finish_uncancellably(pending)
        raise


def task_name(kind: str, job: str | None = None) -> str:
    """The name of a task cronlock spawns: ``cronlock-<kind>`` or ``cronlock-<kind>:<job>``.

    One scheme for every task, so ``asyncio.all_tasks()`` and debuggers show who owns what.
    """
    return f"cronlock-{kind}" if job is None else f"cronlock-{kind}:{job}"


RUN_TASK = task_name("run", "")
"""A run task's name is this plus its job's: ``task_name("run", job)`` without the call."""
