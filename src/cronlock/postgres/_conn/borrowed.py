"""Lease mode on a user's pool: every statement on a connection borrowed for it alone.

:class:`BorrowedConnections` is a :class:`~cronlock.postgres._conn.Channel` as a
:class:`.dedicated.DedicatedConnection` is (the batcher, upkeep, the fleet watch and the
reads call it the same way), but holds no connection: each
statement borrows one from the pool, runs in its own transaction, and gives it back. So a
lease-mode locker given a pool costs the server no connection between statements, and a
transaction pooler in front of the pool is no problem: nothing lives in a session.

A statement that fails or times out costs its connection (terminated, so the pool replaces
it): what the server did with it is unknown, and in lease mode that is harmless (a claim
that committed unseen is a lease that expires, i.e. a crashed run; see :mod:`._leasesql`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..._clock import monotonic
from ..._errors import LockError, LockUnavailable
from ..._logs import get_logger
from .backoff import Backoff
from .errors import (
    backend_error_types,
    backend_errors,
    server_answered,
    session_gone,
    translated,
)
from .primary import FIX, NotPrimary, Server, read_only, server_of
from .source import ConnectionSource

__all__ = ("BorrowedConnections",)

_logger = get_logger("cronlock.postgres")
_T = TypeVar("_T")


class _Borrowing:
    """What :attr:`BorrowedConnections.conn` is while open: no connection, a promise of one."""

    __slots__ = ("statements",)

    def __init__(self, statements: BorrowedConnections) -> None:
        self.statements = statements

    def is_closed(self) -> bool:
        return self.statements.closed


class BorrowedConnections:
    """A lease-mode locker's statements on its user's *source* (a pool): one borrowed
    connection per statement, bounded by *statement_timeout*; *set_up* (the ledger made
    current) runs on the first one; *on_open* is called once, when that first one succeeded.

    A :class:`~cronlock.postgres._conn.Channel`, as a dedicated connection is (whoever sends
    statements on a channel sends them here alike), with no connection to keep.
    """

    def __init__(
        self,
        source: ConnectionSource,
        *,
        set_up: Callable[[Any], Awaitable[None]],
        connect_timeout: float,
        statement_timeout: float,
        on_open: Callable[[], None],
        on_server: Callable[[Server | None], None] | None = None,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        self._source = source
        # Told once when statements stop getting through (nothing is held, so nothing is
        # lost; the locker reconnects at once to see which server it finds then).
        self._on_drop = on_drop
        # Told which server the first statement reached, and again the first time one gets
        # through after any failed: a new primary is noticed there (.primary.server_of).
        self._on_server = on_server
        self._recheck = False
        self._set_up = set_up  # the ledger made current, on the first statement's connection
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._on_open = on_open
        self._ready = False
        self.conn: Any = _Borrowing(self)
        self.generation = 1
        """Never changes: nothing of a lease depends on a connection."""
        self.closed = False
        """Set at the locker's close: no new start (:meth:`ensure`); the statements of the
        close itself (its last notes) still go, as on a dedicated connection still open."""
        self._handed_back = False
        self.connect_lock = asyncio.Lock()
        self.opened = 0
        self.statements = 0
        self.last_ok = float("-inf")
        self.backoff = Backoff(source.describe())

    @property
    def is_open(self) -> bool:
        """Whether statements can be sent (the ledger was prepared and we are not closed)."""
        return self._ready and not self.closed

    async def ensure(self) -> tuple[Any, int]:
        """Prepare the ledger on the first call; then return at once."""
        if self.closed:
            raise LockError("the PostgresLocker is closed")
        if not self._ready:
            self._refuse_while_not_primary()
            async with self.connect_lock:
                if not self._ready:
                    try:
                        await self._prepare()
                    except NotPrimary as exc:
                        raise self._not_primary(exc) from exc.__cause__
        return self.conn, self.generation

    def _refuse_while_not_primary(self) -> None:
        """Fail at once, without borrowing, while the wait after a failed borrow or a
        read-only server lasts (it was said once): callers never queue up behind it."""
        left = self.backoff.wait(monotonic())
        if left > 0:
            raise LockUnavailable(
                f"the {self._source.describe()} gave no usable connection "
                f"({self.backoff.last_error}); trying again in {left:.2f}s"
            )

    def _not_primary(self, error: NotPrimary) -> LockUnavailable:
        """The pool's server is not the primary: say it once (:mod:`.backoff`), back off."""
        delay = self.backoff.failed(monotonic(), error)
        return LockUnavailable(f"{error}; trying again in {delay:.2f}s")

    async def _prepare(self) -> None:
        async with self._source.lend(
            timeout=self._connect_timeout, checkin_timeout=self._statement_timeout
        ) as conn:
            with backend_errors("could not prepare the run ledger"):
                async with asyncio.timeout(self._connect_timeout):
                    await self._set_up(conn)
                    server = None if self._on_server is None else await server_of(conn)
        if self._on_server is not None:
            self._on_server(server)
        self._ready = True
        self.opened += 1
        self.backoff.succeeded(monotonic(), again=False)
        self._on_open()

    def _cut_off(self, reason: str) -> None:
        """Statements stopped getting through: the next one that does asks which server
        it reached, and the locker is told (once until then)."""
        if self._recheck:
            return
        self._recheck = True
        if self._on_drop is not None:
            self._on_drop(reason)

    def drop(self, conn: Any, *, reason: str, kill: bool = True) -> None:
        """Nothing to drop: no connection is kept between statements."""

    async def hand_back(self, conn: Any) -> None:
        """Stop sending statements (the close's last step); nothing is held."""
        self.closed = self._handed_back = True

    async def run(
        self,
        conn: Any,
        generation: int,
        call: Callable[[Any], Awaitable[_T]],
        *,
        what: str,
        keep_on_server_error: bool = False,
        urgent: bool = False,
    ) -> _T:
        """Run one statement on a connection borrowed for it alone, bounded (*urgent*
        changes nothing here: statements wait for a connection, not for each other).

        Raises :class:`cronlock.LockError` as a dedicated connection's :meth:`run` does
        (:func:`.errors.session_gone` once closed).
        """
        if self._handed_back:
            raise session_gone(what)
        self._refuse_while_not_primary()
        self.statements += 1
        lent = self._source.lend(
            timeout=self._connect_timeout,
            checkin_timeout=self._statement_timeout,
            keep_on_server_error=keep_on_server_error,
        )
        self.backoff.trying()
        try:
            borrowed = await lent.__aenter__()
        except LockError as exc:  # no connection: the pool's server is down, or it is full
            self._cut_off(f"no connection could be borrowed: {exc}")
            delay = self.backoff.failed(monotonic(), exc)
            raise LockUnavailable(f"{exc}; trying again in {delay:.2f}s") from (
                exc.__cause__ or exc
            )
        try:
            async with asyncio.timeout(self._statement_timeout):
                if self._recheck and self._on_server is not None:
                    # The first statement through after a failure: is this still the
                    # server of before? (Told before the statement, which may depend on it.)
                    self._recheck = False
                    self._on_server(await server_of(borrowed))
                result = await call(borrowed)
        except BaseException as exc:
            await lent.__aexit__(type(exc), exc, exc.__traceback__)  # terminated if cut off
            if not isinstance(exc, backend_error_types()):
                raise
            if not server_answered(exc):
                self._cut_off(f"{what} failed: {exc!r}")  # another server, maybe, next time
            _logger.debug("%s failed on a borrowed connection: %r", what, exc)
            if read_only(exc):
                self._cut_off("its server is read-only")
                # The borrowed connection was terminated (the pool replaces it): its
                # server is read-only, and the pool's next may be too.
                error = NotPrimary(
                    f"the {self._source.describe()} lent a connection to a read-only "
                    f"server, not the primary ({type(exc).__name__}: {exc}); {FIX}"
                )
                raise self._not_primary(error) from exc
            raise translated(exc, what) from exc
        await lent.__aexit__(None, None, None)
        if self.backoff.failures:
            self.backoff.succeeded(monotonic(), again=True)  # "reconnected after ..."
        self.last_ok = asyncio.get_running_loop().time()
        return result
