"""What the server and the network raise, and how the backend tells its callers about it.

It imports asyncpg: only the :mod:`cronlock.postgres` subpackage may import it, so that
asyncpg stays an optional extra.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import asyncpg

from .._errors import LockError

__all__ = ("BACKEND_ERRORS", "GONE_OR_FAILED", "SessionGone", "backend_errors")

# What asyncpg and the socket layer raise when the server or the network misbehaves.
# TimeoutError is an OSError, so timeouts we impose ourselves are covered too.
BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
)


class SessionGone(Exception):
    """The session a statement was meant for has been replaced or closed."""


GONE_OR_FAILED: tuple[type[BaseException], ...] = (SessionGone, *BACKEND_ERRORS)


@contextlib.contextmanager
def backend_errors(message: str, *, session_lost: str | None = None) -> Iterator[None]:
    """Translate a backend failure inside the block into :class:`cronlock.LockError`.

    Raises ``LockError(f"{message}: {exc!r}") from exc`` for :data:`BACKEND_ERRORS` (the
    cause stays reachable, e.g. to tell a slow server from a dead session) and for
    :class:`SessionGone`, which becomes ``LockError(session_lost)`` when that is given.
    Everything else, cancellation and a ``LockError`` raised inside included, passes.
    """
    try:
        yield
    except SessionGone as exc:
        raise LockError(session_lost or f"{message}: {exc!r}") from exc
    except BACKEND_ERRORS as exc:
        raise LockError(f"{message}: {exc!r}") from exc
