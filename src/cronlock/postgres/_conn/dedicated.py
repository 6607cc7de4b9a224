"""A lock session of a PostgresLocker: one connection, opened on demand, replaced if it dies.

A locker has a few of these, one per shard of lock keys. Every advisory lock of a shard
lives on its session, so the session's life decides theirs: when it is dropped, the locker
is told (the shard's leases are then lost). Statements on it are
serialised and bounded; each new connection bumps the *generation*, and a statement meant
for an older generation is refused rather than sent to a session that holds none of its
locks. A session that cannot connect backs off (:mod:`._backoff`): until its next attempt
is due, :meth:`LockSession.ensure` fails at once with :class:`cronlock.LockUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..._cancel import finish_uncancellably, task_name, uncancellable
from ..._clock import monotonic
from ..._errors import LockError, LockUnavailable, PoolerDetected
from ..._logs import get_logger
from .._sql.tables import LedgerTable, ledger_state, migrate
from .backoff import Backoff
from .errors import SessionGone, backend_error_types, backend_errors
from .source import (
    ConnectionSource,
    Keepalives,
    configure_session,
    is_closed,
    terminate,
)

__all__ = ("LockSession", "refuse_pooler")

_logger = get_logger("cronlock.postgres")
_T = TypeVar("_T")


class LockSession:
    """One of a locker's dedicated sessions: connect, set up, run statements, drop.

    *on_open* is called after each new connection is set up; *on_drop* with the reason
    whenever the current connection is dropped (its locks are then gone). Only
    :meth:`ensure` connects, and not once :attr:`closed` is set, nor while
    :attr:`backoff` says to wait after a failed connect.
    """

    def __init__(
        self,
        source: ConnectionSource,
        *,
        table: LedgerTable | None,
        create_table: bool,
        connect_timeout: float,
        statement_timeout: float,
        application_name: str,
        keepalives: Keepalives | None,
        on_open: Callable[[], None],
        on_drop: Callable[[str], None],
        session_locks: bool = True,
    ) -> None:
        self._source = source
        # Session locks need a session of their own: its settings are set, and a pooler is
        # refused. Lease mode sets nothing on the session (a pooler would pass it on to
        # other clients); its application_name is a startup parameter instead.
        self._session_locks = session_locks
        self._table = table
        self._create_table = create_table
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._application_name = application_name
        self._keepalives = keepalives
        self._on_open = on_open
        self._on_drop = on_drop
        self.conn: Any = None
        """The open connection, or ``None`` between a drop and the next :meth:`ensure`."""
        # Bumped whenever the connection is replaced: a lease of an older generation is lost.
        self.generation = 0
        self.closed = False
        self.connect_lock = asyncio.Lock()
        # One statement at a time on the shared session (asyncpg allows no more).
        self.statement_lock = asyncio.Lock()
        self.opened = 0
        self.statements = 0
        self.last_ok = float("-inf")
        """Loop time of the last statement that succeeded: proof the session was alive."""
        self.backoff = Backoff(source.describe())

    @property
    def is_open(self) -> bool:
        """Whether a connection is open right now."""
        return self.conn is not None and not is_closed(self.conn)

    async def ensure(self) -> tuple[Any, int]:
        """The open connection and its generation; connect (and set up) if there is none.

        Raises :class:`LockUnavailable` (a :class:`LockError`) when the connect fails, and,
        without trying, while the backoff after a failed connect lasts or another task's
        retry is in flight: callers never queue up behind a server that is down. The
        outage is logged here, once (see :class:`._backoff.Backoff`).
        """
        conn = self.conn
        if conn is not None and not is_closed(conn):
            return conn, self.generation
        if not self.closed:
            self._refuse_while_down(retrying=self.connect_lock.locked())
        async with self.connect_lock:
            if self.closed:
                raise LockError("the PostgresLocker is closed")
            if self.conn is not None:
                if not is_closed(self.conn):
                    return self.conn, self.generation  # another task reconnected
                self.drop(self.conn, reason="its connection was closed")
            self._refuse_while_down(retrying=False)  # another task's attempt just failed
            self.backoff.trying()
            try:
                conn, interrupted = await self._connect()
            except Exception as exc:
                delay = self.backoff.failed(monotonic(), exc)
                if not isinstance(exc, LockError) or isinstance(exc, PoolerDetected):
                    raise
                raise LockUnavailable(f"{exc}; reconnecting in {delay:.2f}s") from _cause(exc)
            self.backoff.succeeded(monotonic(), again=self.opened > 0)
            self.generation += 1
            self.conn = conn
            self.opened += 1
            conn.add_termination_listener(self._on_terminated)
            self._on_open()
            if interrupted is not None:
                raise interrupted
            return conn, self.generation

    def _refuse_while_down(self, *, retrying: bool) -> None:
        backoff = self.backoff
        if not backoff.failures:
            return  # never failed, or connected since: go ahead (and queue if need be)
        left = backoff.wait(monotonic())
        if left <= 0 and not retrying:
            return
        when = f"reconnecting in {left:.2f}s" if left > 0 else "a reconnect is in progress"
        last = backoff.last_error
        raise LockUnavailable(
            f"the lock session is down ({backoff.failures} failed connect(s), the last: "
            f"{last}); {when}"
        ) from (None if last is None else _cause(last))

    async def _connect(self) -> tuple[Any, BaseException | None]:
        """A connection set up as a lock session, and the cancellation that came meanwhile.

        The setup runs to its end even if we are cancelled meanwhile (it is bounded by
        connect_timeout), and a session set up is kept: cut off mid-statement, it would have
        to be terminated, costing a pool its connection (a scheduler shut down just after it
        started cancels its catch-up read here). The caller keeps the session, then delivers
        the cancellation.
        """
        conn = await self._source.checkout(timeout=self._connect_timeout)
        setup = asyncio.create_task(self._set_up(conn), name=task_name("pg-setup"))
        try:
            await finish_uncancellably(setup)
        except BaseException as exc:
            if not setup.done() or setup.cancelled() or setup.exception() is not None:
                # An unconfigured session we do not keep must not linger.
                # terminate() is synchronous, so a second cancel cannot skip it.
                terminate(conn)
                raise
            return conn, exc  # set up: keep it, then deliver the cancellation
        return conn, None

    async def _set_up(self, conn: Any) -> None:
        import asyncpg  # loaded already: the connection came from it

        try:
            with backend_errors("could not set up the lock session"):
                async with asyncio.timeout(self._connect_timeout):
                    if self._session_locks:
                        await configure_session(
                            conn,
                            application_name=self._application_name,
                            keepalives=self._keepalives,
                        )
                        await refuse_pooler(conn, self._source.describe())
                    await self._prepare_ledger(conn)
        except LockError as exc:
            # asyncpg's named prepared statements meet another client's on a pooled backend
            # (or miss their own): only a transaction pooler does that. Say so.
            pooled = (asyncpg.DuplicatePreparedStatementError, asyncpg.InvalidSQLStatementNameError)
            if self._session_locks and isinstance(exc.__cause__, pooled):
                raise PoolerDetected(
                    f"the {self._source.describe()} is reached through a transaction pooler "
                    f"(prepared statements clash: {exc.__cause__!r}); session advisory locks "
                    "cannot work through it. Use PostgresLocker(..., mode='lease'), or a "
                    "direct connection"
                ) from exc.__cause__
            raise

    async def _prepare_ledger(self, conn: Any) -> None:
        table = self._table
        if table is None:
            return
        # Once per session: a ledger made by an older cronlock is upgraded here too.
        state = await ledger_state(conn, table)
        if state == "current":
            return
        if not self._create_table:
            problem = "does not exist" if state == "missing" else "predates this cronlock"
            raise LockError(
                f"the run ledger table {table.runs} {problem}; "
                f"{'create' if state == 'missing' else 'upgrade'} it with "
                "'python -m cronlock migrate --dsn DSN' (with --schema/--table as configured), "
                "or pass create_table=True"
            )
        done = await migrate(conn, table, timeout=self._connect_timeout)
        if done:
            _logger.info("%s the run ledger %s", done, table.runs)

    def _on_terminated(self, conn: object) -> None:
        # asyncpg calls this soon after the connection closes, whatever closed it.
        if conn is self.conn:
            self.drop(conn, reason="its connection was closed")

    def drop(self, conn: Any, *, reason: str, kill: bool = True) -> None:
        """Forget *conn*; its locks are lost. Terminate it unless *kill* is false."""
        if conn is self.conn:
            self.conn = None
            self.generation += 1
            if not self.closed:
                self.backoff.lost(monotonic())
            self._on_drop(reason)
        with contextlib.suppress(*backend_error_types()):  # a proxy already handed back
            conn.remove_termination_listener(self._on_terminated)
        if kill:
            terminate(conn)

    async def hand_back(self, conn: Any) -> None:
        """Drop *conn* without killing it, once an in-flight statement is done; check it in."""
        async with self.statement_lock:  # let an in-flight statement finish first
            self.drop(conn, reason="the locker was closed", kill=False)
        await uncancellable(
            self._source.checkin(conn, timeout=self._statement_timeout),
            name=task_name("pg-close"),
        )

    async def run(
        self,
        conn: Any,
        generation: int,
        call: Callable[[Any], Awaitable[_T]],
        *,
        what: str,
        keep_on_server_error: bool = False,
    ) -> _T:
        """Run one statement on *conn*, bounded; on failure drop the session.

        Raises :class:`SessionGone` if *conn* of *generation* is no longer the session.
        *keep_on_server_error*: a statement that takes and releases no lock (a read, an
        upkeep write) and got an error answer from the server leaves the session sound.
        """
        async with self.statement_lock:
            if conn is None or generation != self.generation or is_closed(conn):
                raise SessionGone
            self.statements += 1
            try:
                async with asyncio.timeout(self._statement_timeout):
                    result = await call(conn)
            except backend_error_types() as exc:
                import asyncpg  # loaded already: the connection came from it

                if not (keep_on_server_error and isinstance(exc, asyncpg.PostgresError)):
                    # A statement that timed out or failed leaves us unsure what the server
                    # did: terminating the session is the one way to be sure nothing stays
                    # held (session advisory locks survive a rolled-back statement).
                    self.drop(conn, reason=f"{what} failed: {exc!r}")
                raise
            self.last_ok = asyncio.get_running_loop().time()
            return result


_pooler_told = False  # whether refuse_pooler has logged its ERROR in this process


async def refuse_pooler(conn: Any, where: str) -> None:
    """Raise :class:`PoolerDetected` unless *conn* is a server backend of its own.

    The pid a server announces at connect (asyncpg's ``get_server_pid()``) is that backend's
    own; a pooler or proxy announces one of its making instead, which no backend has. Two
    reads of ``pg_backend_pid()`` in two transactions must also agree.
    """
    announced = conn.get_server_pid()
    first = await conn.fetchval("SELECT pg_backend_pid()")
    second = await conn.fetchval("SELECT pg_backend_pid()")
    if first == announced == second:
        return
    seen = f"announced pid {announced}, then backends {first} and {second}"
    global _pooler_told
    log = _logger.debug if _pooler_told else _logger.error  # said once; retries are quiet
    _pooler_told = True
    log(
        "a connection pooler or proxy sits between this replica and PostgreSQL (%s); session "
        "advisory locks cannot work through it. Use PostgresLocker(..., mode='lease') "
        "(docs/guides/poolers.md), or connect to the server directly",
        seen,
    )
    raise PoolerDetected(
        f"the {where} is reached through a connection pooler or proxy ({seen}): a session "
        "advisory lock taken through PgBouncer in transaction mode, Supavisor, Neon's or "
        "Heroku's pooler or RDS Proxy is not held by a session of ours. Use "
        "PostgresLocker(..., mode='lease'), which needs no session, or a direct connection"
    )


def _cause(exc: BaseException) -> BaseException:
    """The asyncpg or OS exception behind *exc*: the ``__cause__`` of every LockError."""
    return exc.__cause__ or exc
