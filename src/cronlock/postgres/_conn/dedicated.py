"""A lock session of a PostgresLocker: one connection, opened on demand, replaced if it dies.

A locker has a few of these, one per shard of lock keys. Every advisory lock of a shard
lives on its session, so the session's life decides theirs: when it is dropped, the locker
is told (the shard's leases are then lost). Statements on it are
serialised and bounded; each new connection bumps the *generation*, and a statement meant
for an older generation is refused rather than sent to a session that holds none of its
locks. A session that cannot connect backs off (:mod:`._backoff`): until its next attempt
is due, :meth:`DedicatedConnection.ensure` fails at once with :class:`cronlock.LockUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ..._cancel import task_name, uncancellable
from ..._clock import monotonic
from ..._errors import LockerMisconfigured, LockError, LockUnavailable, PoolerDetected
from ..._logs import get_logger
from .backoff import Backoff
from .errors import backend_error_types, session_gone, translated
from .primary import Server, read_only, server_of
from .source import ConnectionSource, is_closed, terminate

__all__ = ("DedicatedConnection",)

_logger = get_logger("cronlock.postgres")
_T = TypeVar("_T")


class Turns:
    """The statements of one session, one at a time, in the order they asked, except that
    an *urgent* one (a claim: a job waits to start) goes before every other still waiting.
    A claim then waits at most for the statement in flight, not for a queue of catch-up
    reads and note writes (a thousand jobs each) that a start or a big sync lines up."""

    __slots__ = ("_busy", "_others", "_urgent")

    def __init__(self) -> None:
        self._busy = False
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._others: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        """Whether a statement has the session."""
        return self._busy

    @contextlib.asynccontextmanager
    async def turn(self, *, urgent: bool = False) -> AsyncIterator[None]:
        """The session, once the statements before this one are done."""
        await self._acquire(urgent)
        try:
            yield
        finally:
            self._release()

    async def __aenter__(self) -> None:
        await self._acquire(False)

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    async def _acquire(self, urgent: bool) -> None:
        if not self._busy and not self._urgent and not self._others:
            self._busy = True
            return
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._others).append(waiting)
        try:
            await waiting
        except BaseException:
            if waiting.done() and not waiting.cancelled():
                self._release()  # handed the session as the cancel came: pass it on
            else:
                with contextlib.suppress(ValueError):
                    (self._urgent if urgent else self._others).remove(waiting)
            raise

    def _release(self) -> None:
        """Hand the session to the next waiting (urgent ones first), or free it."""
        for queue in (self._urgent, self._others):
            while queue:
                waiting = queue.popleft()
                if not waiting.done():
                    waiting.set_result(None)
                    return
        self._busy = False


class DedicatedConnection:
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
        connect_timeout: float,
        statement_timeout: float,
        on_open: Callable[[], None],
        on_drop: Callable[[str], None],
        set_up: Callable[[Any], Awaitable[None]] | None = None,
        on_server: Callable[[Server | None], None] | None = None,
    ) -> None:
        self._source = source
        # Told which server each new connection reached (.primary.server_of), after its
        # set-up and before anything else is sent on it: a new primary is noticed there.
        self._on_server = on_server
        # The mode's set-up of each new connection: session locks need a session of their
        # own (settings set, a pooler refused), lease mode sets nothing (a pooler would pass
        # it on to other clients); with a ledger, the ledger is made current.
        self._set_up = set_up
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._on_open = on_open
        self._on_drop = on_drop
        self.conn: Any = None
        """The open connection, or ``None`` between a drop and the next :meth:`ensure`."""
        # Bumped whenever the connection is replaced: a lease of an older generation is lost.
        self.generation = 0
        self.closed = False
        self.connect_lock = asyncio.Lock()
        # One statement at a time on the shared session (asyncpg allows no more); claims
        # before the others waiting.
        self.statement_lock = Turns()
        self.opened = 0
        self.statements = 0
        self.last_ok = float("-inf")
        """Loop time of the last statement that succeeded: proof the session was alive."""
        self.backoff = Backoff(source.describe())
        self._server: Server | None = None

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
                delay = self.backoff.failed(monotonic(), exc, said=self._source.told(exc))
                if not isinstance(exc, LockError) or isinstance(exc, PoolerDetected):
                    raise
                raise LockUnavailable(f"{exc}; reconnecting in {delay:.2f}s") from _cause(exc)
            self.backoff.succeeded(monotonic(), again=self.opened > 0)
            self.generation += 1
            self.conn = conn
            self.opened += 1
            conn.add_termination_listener(self._on_terminated)
            if self._on_server is not None:
                self._on_server(self._server)
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
        """A connection set up as this channel's session, and the cancellation that came
        meanwhile (see :meth:`.source.ConnectionSource.open`): a session set up is kept
        (a scheduler shut down just after it started cancels its catch-up read here), and
        the caller delivers the cancellation after."""
        return await self._source.open(self._set_up_and_identify, timeout=self._connect_timeout)

    async def _set_up_and_identify(self, conn: Any) -> None:
        await (self._set_up or _nothing)(conn)
        self._server = None if self._on_server is None else await server_of(conn)

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
        urgent: bool = False,
    ) -> _T:
        """Run one statement on *conn*, bounded; on failure drop the session (*urgent*: a
        claim, which goes before the other statements waiting, :class:`Turns`).

        The one place a statement's failure becomes a :class:`cronlock.LockError`: of the
        kind :func:`.errors.kind_of` says, naming *what*, the backend's error its cause;
        :func:`.errors.session_gone` if *conn* of *generation* is no longer the session
        (nothing was sent). *keep_on_server_error*: a statement that takes and releases no
        lock (a read, an upkeep write) and got an error answer from the server leaves the
        session sound.
        """
        async with self.statement_lock.turn(urgent=urgent):
            if conn is None or generation != self.generation or is_closed(conn):
                raise session_gone(what)
            self.statements += 1
            try:
                async with asyncio.timeout(self._statement_timeout):
                    result = await call(conn)
            except backend_error_types() as exc:
                import asyncpg  # loaded already: the connection came from it

                if read_only(exc):
                    raise self._not_primary(conn, exc) from exc
                if isinstance(exc, TimeoutError):
                    self._source.went_silent(conn)
                if not (keep_on_server_error and isinstance(exc, asyncpg.PostgresError)):
                    # A statement that timed out or failed leaves us unsure what the server
                    # did: terminating the session is the one way to be sure nothing stays
                    # held (session advisory locks survive a rolled-back statement).
                    self.drop(conn, reason=f"{what} failed: {exc!r}")
                raise translated(exc, what) from exc
            self.last_ok = asyncio.get_running_loop().time()
            return result

    def _not_primary(self, conn: Any, exc: BaseException) -> LockUnavailable:
        """*conn*'s server refused a write (SQLSTATE 25006): it is not the primary (a standby
        we were sent to, a server made read-only). Drop the session and back off as after a
        failed connect: said once, with the fix, then retried, never one error per slot."""
        self.drop(conn, reason="its server is read-only")
        error = self._source.not_primary(conn, exc)
        delay = self.backoff.failed(monotonic(), error, said=self._source.told(error))
        return LockUnavailable(f"{error}; reconnecting in {delay:.2f}s")


def _cause(exc: BaseException) -> BaseException:
    """The asyncpg or OS exception behind *exc*: the ``__cause__`` of every LockError; a
    :class:`cronlock.LockerMisconfigured` itself (its message names the fix, which the
    locker's check reports as it is)."""
    if isinstance(exc, LockerMisconfigured):
        return exc
    return exc.__cause__ or exc


async def _nothing(conn: Any) -> None:
    """No set-up."""
