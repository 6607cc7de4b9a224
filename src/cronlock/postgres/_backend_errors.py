"""What the server and the network raise, and how the backend tells its callers about it.

Only the :mod:`cronlock.postgres` subpackage may import asyncpg, so that it stays an
optional extra, and it does so on first use rather than at import: the exception classes
are looked up the first time :func:`backend_error_types` is called. An ``except`` clause
evaluates its expression only when an exception reaches it, and no asyncpg exception can
reach one before a connection was made (which imports asyncpg anyway).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from .._errors import LockError

__all__ = ("SessionGone", "backend_error_types", "backend_errors", "gone_or_failed_types")


class SessionGone(Exception):
    """The session a statement was meant for has been replaced or closed."""


@functools.cache
def backend_error_types() -> tuple[type[BaseException], ...]:
    """What asyncpg and the socket layer raise when the server or the network misbehaves.

    TimeoutError is an OSError, so timeouts we impose ourselves are covered too. The first
    call imports asyncpg; later ones return the same tuple.
    """
    import asyncpg

    return (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)


@functools.cache
def gone_or_failed_types() -> tuple[type[BaseException], ...]:
    """:class:`SessionGone` and :func:`backend_error_types`: a statement did not go through."""
    return (SessionGone, *backend_error_types())


@contextlib.contextmanager
def backend_errors(message: str, *, session_lost: str | None = None) -> Iterator[None]:
    """Translate a backend failure inside the block into :class:`cronlock.LockError`.

    Raises ``LockError(f"{message}: {exc!r}") from exc`` for :func:`backend_error_types` (the
    cause stays reachable, e.g. to tell a slow server from a dead session) and for
    :class:`SessionGone`, which becomes ``LockError(session_lost)`` when that is given.
    Everything else, cancellation and a ``LockError`` raised inside included, passes.
    """
    try:
        yield
    except SessionGone as exc:
        raise LockError(session_lost or f"{message}: {exc!r}") from exc
    except backend_error_types() as exc:
        raise LockError(f"{message}: {exc!r}") from exc
