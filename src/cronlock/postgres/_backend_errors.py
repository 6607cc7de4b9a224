"""What the server and the network raise, and how the backend tells its callers about it.

Only :mod:`cronlock.postgres` imports this module, so asyncpg stays an optional extra.
"""

from __future__ import annotations

import asyncpg

__all__ = ("BACKEND_ERRORS", "GONE_OR_FAILED", "SessionGone")

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
