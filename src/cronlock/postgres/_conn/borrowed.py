"""Lease mode on a user's pool: every statement on a connection borrowed for it alone.

:class:`PooledStatements` stands where a :class:`._session.LockSession` stands (the batcher,
upkeep, the fleet watch and the reads call it the same way), but holds no connection: each
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
from ..._errors import LockError
from ..._logs import get_logger
from .._sql.tables import LedgerTable, ledger_state, migrate
from .backoff import Backoff
from .dedicated import LockSession
from .errors import SessionGone, backend_error_types, backend_errors
from .source import ConnectionSource, terminate

__all__ = ("PooledStatements",)

_logger = get_logger("cronlock.postgres")
_T = TypeVar("_T")


class _Borrowing:
    """What :attr:`PooledStatements.conn` is while open: no connection, a promise of one."""

    __slots__ = ("statements",)

    def __init__(self, statements: PooledStatements) -> None:
        self.statements = statements

    def is_closed(self) -> bool:
        return self.statements.closed


class PooledStatements(LockSession):
    """A lease-mode locker's statements on its user's *source* (a pool): one borrowed
    connection per statement, bounded by *statement_timeout*; the ledger is prepared on the
    first one; *on_open* is called once, when that first one succeeded.

    A :class:`LockSession` in interface only (whoever sends statements on a session sends
    them here alike); none of its connection handling is used.
    """

    def __init__(
        self,
        source: ConnectionSource,
        *,
        table: LedgerTable,
        create_table: bool,
        connect_timeout: float,
        statement_timeout: float,
        on_open: Callable[[], None],
    ) -> None:  # no super().__init__(): there is no connection to manage
        self._source = source
        self._ledger = table
        self._create_table = create_table
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._on_open = on_open
        self._ready = False
        self.conn: Any = _Borrowing(self)
        self.generation = 1
        """Never changes: nothing of a lease depends on a connection."""
        self.closed = False
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
            async with self.connect_lock:
                if not self._ready:
                    await self._prepare()
        return self.conn, self.generation

    async def _prepare(self) -> None:
        conn = await self._source.checkout(timeout=self._connect_timeout)
        try:
            with backend_errors("could not prepare the run ledger"):
                async with asyncio.timeout(self._connect_timeout):
                    state = await ledger_state(conn, self._ledger)
                    if state != "current":
                        if not self._create_table:
                            raise LockError(
                                f"the run ledger table {self._ledger.runs} is missing or "
                                "predates this cronlock; run 'python -m cronlock migrate'"
                            )
                        done = await migrate(conn, self._ledger, timeout=self._connect_timeout)
                        if done:
                            _logger.info("%s the run ledger %s", done, self._ledger.runs)
        except BaseException:
            terminate(conn)
            await self._source.checkin(conn, timeout=self._statement_timeout)
            raise
        await self._source.checkin(conn, timeout=self._statement_timeout)
        self._ready = True
        self.opened += 1
        self.backoff.succeeded(monotonic(), again=False)
        self._on_open()

    def drop(self, conn: Any, *, reason: str, kill: bool = True) -> None:
        """Nothing to drop: no connection is kept between statements."""

    async def hand_back(self, conn: Any) -> None:
        """Stop sending statements (at close); nothing is held."""
        self.closed = True

    async def run(
        self,
        conn: Any,
        generation: int,
        call: Callable[[Any], Awaitable[_T]],
        *,
        what: str,
        keep_on_server_error: bool = False,
    ) -> _T:
        """Run one statement on a connection borrowed for it alone, bounded.

        Raises :class:`SessionGone` once closed; the backend's errors as they come.
        """
        if self.closed:
            raise SessionGone
        self.statements += 1
        borrowed = await self._source.checkout(timeout=self._connect_timeout)
        try:
            async with asyncio.timeout(self._statement_timeout):
                result = await call(borrowed)
        except BaseException as exc:
            import asyncpg  # loaded already: the pool came from it

            if not (keep_on_server_error and isinstance(exc, asyncpg.PostgresError)):
                # Cut mid-statement or failed: the connection's state is unknown, and only
                # this connection is lost by terminating it.
                terminate(borrowed)
            if isinstance(exc, backend_error_types()):
                _logger.debug("%s failed on a borrowed connection: %r", what, exc)
            raise
        finally:
            await self._source.checkin(borrowed, timeout=self._statement_timeout)
        self.last_ok = asyncio.get_running_loop().time()
        return result
