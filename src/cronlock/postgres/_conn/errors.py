"""What the server and the network raise, and how the backend tells its callers about it.

Only the :mod:`cronlock.postgres` subpackage may import asyncpg, so that it stays an
optional extra, and it does so on first use rather than at import: the exception classes
are looked up the first time :func:`backend_error_types` is called. An ``except`` clause
evaluates its expression only when an exception reaches it, and no asyncpg exception can
reach one before a connection was made (which imports asyncpg anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import Iterator

from ..._errors import LockError, ServerError, SessionLost, StatementTimeout

__all__ = (
    "SessionGone",
    "backend_error_types",
    "backend_errors",
    "backend_failure",
    "cut_off",
    "gone",
    "gone_or_failed_types",
    "ignoring_backend_errors",
    "kind_of",
    "ledger_missing",
    "lock_not_available",
    "permission_denied",
    "prepared_statements_clash",
    "server_answered",
    "session_gone",
    "translated",
)


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


def backend_failure(exc: BaseException) -> bool:
    """Whether *exc* is one of :func:`backend_error_types`: the server or the network
    failed (for a boundary that decides what to say, not what to catch)."""
    return isinstance(exc, backend_error_types())


@functools.cache
def gone_or_failed_types() -> tuple[type[BaseException], ...]:
    """:class:`SessionGone` and :func:`backend_error_types`: a statement did not go through."""
    return (SessionGone, *backend_error_types())


@contextlib.contextmanager
def backend_errors(message: str, *, session_lost: str | None = None) -> Iterator[None]:
    """Translate a backend failure inside the block into a :class:`cronlock.LockError`: the
    one boundary where the backend's errors become cronlock's.

    Raises ``kind(f"{message}: {exc!r}") from exc`` for :func:`backend_error_types`, where
    *kind* is :func:`kind_of` the error (the cause stays reachable), and for
    :class:`SessionGone`, which becomes ``SessionLost(session_lost)`` when that is given.
    Everything else, cancellation and a ``LockError`` raised inside included, passes.
    """
    try:
        yield
    except SessionGone as exc:
        raise SessionLost(session_lost or f"{message}: {exc!r}") from exc
    except backend_error_types() as exc:
        raise kind_of(exc)(f"{message}: {exc!r}") from exc


def kind_of(exc: BaseException) -> type[LockError]:
    """Which :class:`cronlock.LockError` a backend error is: a statement that timed out
    (ours or the server's cancel), an error answer of a sound session, or a lost session."""
    if isinstance(exc, TimeoutError):
        return StatementTimeout
    asyncpg = sys.modules["asyncpg"]  # loaded: the error came from it
    if isinstance(exc, asyncpg.QueryCanceledError):
        return StatementTimeout
    if isinstance(exc, asyncpg.PostgresConnectionError | asyncpg.OperatorInterventionError):
        return SessionLost  # a protocol error, or the server ended the session
    if isinstance(exc, asyncpg.PostgresError):
        return ServerError
    return SessionLost


def server_answered(exc: BaseException) -> bool:
    """Whether *exc* is (or was caused by) an error answer of the server: the statement
    failed, and the session is as sound as before it."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return False
    return isinstance(exc, asyncpg.PostgresError) or isinstance(
        exc.__cause__, asyncpg.PostgresError
    )


def ledger_missing(exc: BaseException) -> bool:
    """Whether *exc* says the ledger's tables are missing or older than this cronlock (a
    table, a column or the schema not found)."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return False
    missing = (
        asyncpg.UndefinedTableError,
        asyncpg.UndefinedColumnError,  # a ledger an older cronlock made, not upgraded
        asyncpg.InvalidSchemaNameError,
    )
    return isinstance(exc, missing) or isinstance(exc.__cause__, missing)


def permission_denied(exc: BaseException) -> bool:
    """Whether *exc* (or its cause) is the server refusing a statement for a privilege the
    role lacks (SQLSTATE 42501): on a table, a column, a schema, the database; or a DDL
    statement of a table the role does not own."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return False
    denied = asyncpg.InsufficientPrivilegeError
    return isinstance(exc, denied) or isinstance(exc.__cause__, denied)


def lock_not_available(exc: BaseException) -> bool:
    """Whether *exc* is the server giving up on a lock: waited past ``lock_timeout``
    (``SET LOCAL lock_timeout``), or refused at once (``NOWAIT``)."""
    asyncpg = sys.modules.get("asyncpg")
    return asyncpg is not None and isinstance(exc, asyncpg.LockNotAvailableError)


def cut_off(exc: BaseException) -> bool:
    """Whether a block that raised *exc* may have left its connection in a state unknown:
    a cancellation, a timeout, or a backend error (raised, or translated into a LockError)."""
    if isinstance(exc, asyncio.CancelledError | TimeoutError):
        return True
    if isinstance(exc, SessionGone):
        return False
    types = backend_error_types()
    return isinstance(exc, types) or isinstance(exc.__cause__, types)


def ignoring_backend_errors() -> contextlib.suppress:
    """A block whose backend errors are of no consequence (a best-effort goodbye)."""
    return contextlib.suppress(*backend_error_types())


def session_gone(what: str) -> SessionLost:
    """The error of a statement (*what*) whose session was replaced or closed before it
    went out: nothing was sent (:func:`gone` tells it from a session lost mid-statement)."""
    error = SessionLost(f"{what}: the session was lost; try again")
    error.__cause__ = SessionGone()
    return error


def gone(exc: BaseException) -> bool:
    """Whether *exc* says its statement never went out: its session was gone already."""
    return isinstance(exc.__cause__, SessionGone)


def translated(exc: BaseException, what: str) -> LockError:
    """The :class:`cronlock.LockError` a backend error *exc* of statement *what* is (see
    :func:`kind_of`), its cause *exc*."""
    error = kind_of(exc)(f"{what} failed: {exc!r}")
    error.__cause__ = exc
    return error


def prepared_statements_clash(exc: BaseException) -> bool:
    """Whether *exc* is asyncpg's named prepared statements meeting another client's (or
    missing their own) on a pooled backend: what only a transaction pooler does."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return False
    clash = (asyncpg.DuplicatePreparedStatementError, asyncpg.InvalidSQLStatementNameError)
    return isinstance(exc, clash)
