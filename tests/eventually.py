"""The suite's one way to wait for something that happens in its own time.

A test that starts replicas, workers or threads cannot know when they will have done a
thing; it can only look again until they have. :func:`eventually` (in a coroutine) and
:func:`eventually_blocking` (in a plain function, or a thread) look: they call *check*
every *every* seconds until it gives something true, and hand that back, or fail the
test, naming *what*, once *limit* seconds have gone by without it.

*limit* is a liveness bound, never a measure: it only stops a hang, and reaching it is a
failure. So it is generous, and nothing a test asserts depends on it.

    await eventually(lambda: len(replicas.of("ready")) == 3, "three replicas ready")
    row = await eventually(fetch_the_row, "the slot's row", 15, every=0.1)  # async check
    eventually_blocking(server_answers, "the dashboard server to answer", 30, every=0.2)

*check* is always called once more after the last sleep before the deadline counts, so
a condition that became true just in time is seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

import pytest

__all__ = ["eventually", "eventually_blocking"]

T = TypeVar("T")

LIMIT = 60.0  # seconds: the default liveness bound
EVERY = 0.05  # seconds between looks, by default


def _give_up(what: str, limit: float) -> None:
    pytest.fail(f"never happened within {limit:g}s" + (f": {what}" if what else ""))


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]],
    what: str = "",
    limit: float = LIMIT,
    *,
    every: float = EVERY,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T | None], what: str = "", limit: float = LIMIT, *, every: float = EVERY
) -> T: ...


async def eventually(
    check: Callable[[], object], what: str = "", limit: float = LIMIT, *, every: float = EVERY
) -> object:
    """Await until *check()* is true and return what it gave; fail naming *what* after
    *limit* seconds.

    *check* may be a plain function or a coroutine function (its result is awaited). It is
    called at once, then every *every* seconds (``asyncio.sleep``: the event loop runs the
    code under test meanwhile). The deadline is checked after a false answer, so *check*
    is always given its last chance.
    """
    deadline = time.monotonic() + limit
    while True:
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        if time.monotonic() > deadline:
            _give_up(what, limit)
        await asyncio.sleep(every)


def eventually_blocking(
    check: Callable[[], T | None],
    what: str = "",
    limit: float = LIMIT,
    *,
    every: float = EVERY,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`eventually` for a plain function: blocks the thread (``time.sleep``) between
    looks, so never call it on a running event loop.

    An exception of a type in *ignoring* raised by *check* only means "not yet" (say, a
    web page's element that is not there yet, or that a live update replaced).
    """
    deadline = time.monotonic() + limit
    while True:
        found: T | None
        try:
            found = check()
        except ignoring:
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            _give_up(what, limit)
        time.sleep(every)
