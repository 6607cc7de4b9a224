"""A simulated asyncpg pool: what a user hands ``PostgresLocker(pool, mode="lease")``.

:class:`SimPool` *is* an ``asyncpg.Pool`` (a subclass that never runs asyncpg's own set-up),
so the library takes the very branch it takes for a user's pool: ``ConnectionSource``
borrows a connection per statement (:mod:`cronlock.postgres._conn.borrowed`),
``check_pool_room`` looks at its size, ``watch_pool`` watches it close. No library code
knows it is simulated.

What it models of asyncpg 0.32's pool, as far as the library (and a user's code holding
connections) uses it: ``max_size`` holders in a LIFO queue that prefers connected ones, the
first ``min_size`` connected at :meth:`SimPool.open` (``create_pool``) and kept connected
(the pool's floor maintenance); ``acquire(timeout=)`` waiting for a free holder and
connecting it if need be; a proxy that refuses every call once released; ``release``
resetting the session (``ROLLBACK`` if a transaction is open, then asyncpg's reset query:
``pg_advisory_unlock_all()``, ``RESET ALL``, ...), terminating the connection if that fails;
a connection that dies while lent hands its holder back at once; ``close`` waiting for
every lent connection; ``terminate``. Anything else of ``asyncpg.Pool`` fails loudly.
"""

from __future__ import annotations

import asyncio
import types
from typing import TYPE_CHECKING, Any

import asyncpg
from asyncpg.connection import Connection, _detect_server_capabilities

from .conn import _VERSION, SimConnection, SimConnector
from .statements.registry import NotModelled
from .statements.session import status

if TYPE_CHECKING:
    from ..postgres._sql.tables import LedgerTable
    from .server import Exec
    from .statements.registry import Statements

__all__ = ("RESET_SQL", "SimPool", "SimPoolProxy", "register")

_CONNECT_TIMEOUT = 60.0
"""asyncpg's default connect timeout: how long a holder's connect may take."""
_FLOOR_RETRY = 1.0


def _reset_query() -> str:
    """The reset query asyncpg sends on release to a PostgreSQL 15 server, built by
    asyncpg's own code (never written out here)."""
    caps = _detect_server_capabilities(_VERSION, types.SimpleNamespace())
    text: str = Connection.get_reset_query(
        types.SimpleNamespace(_reset_query=None, _server_caps=caps)
    )
    return text


RESET_SQL = _reset_query()
"""What ``Pool.release`` runs on a connection before it is lent again."""


def register(statements: Statements, table: LedgerTable) -> None:
    """Teach *statements* the pool's reset query (asyncpg's, not the library's)."""
    statements.add(RESET_SQL, _reset)


def _reset(x: Exec, args: tuple[Any, ...]) -> str:
    # pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL: the session's advisory
    # locks go, its settings return to their startup values (no name was given at connect).
    x.server.unlock_all(x.session)
    x.session.lock_timeout = None
    x.session.application_name = ""
    return status("RESET")


def _known(statements: Statements) -> None:
    """Register the reset query with the server's statements unless it is there already."""
    try:
        statements.lookup(RESET_SQL)
    except NotModelled:
        register(statements, statements.table)


class SimPoolProxy:
    """What ``acquire`` lends: the connection's calls while lent; once released (or its
    connection gone), every call raises ``asyncpg.InterfaceError``, as asyncpg's
    ``PoolConnectionProxy`` does."""

    def __init__(self, holder: _Holder, conn: SimConnection) -> None:
        self._holder = holder
        self._con: SimConnection | None = conn

    def __getattr__(self, name: str) -> Any:
        con = self.__dict__.get("_con")
        if con is None:
            raise asyncpg.InterfaceError(
                f"cannot call Connection.{name}(): connection has been released back to the pool"
            )
        return getattr(con, name)

    def _detach(self) -> None:
        self._con = None


class _Holder:
    """One of the pool's ``max_size`` places: a connection or none, lent or idle."""

    def __init__(self, pool: SimPool) -> None:
        self.pool = pool
        self.con: SimConnection | None = None
        self.proxy: SimPoolProxy | None = None
        self.in_use: asyncio.Future[None] | None = None

    def is_connected(self) -> bool:
        return self.con is not None and not self.con.is_closed()

    def is_idle(self) -> bool:
        return not self.in_use

    async def connect(self) -> None:
        con = await self.pool._connector.connect(_CONNECT_TIMEOUT)
        if self.pool.is_closing():
            await con.close()
            raise asyncpg.InterfaceError("pool is closing")
        self.con = con
        con.add_termination_listener(self._on_close)

    async def acquire(self) -> SimPoolProxy:
        if self.con is None or self.con.is_closed():
            self.con = None
            await self.connect()
        assert self.con is not None
        self.proxy = proxy = SimPoolProxy(self, self.con)
        self.in_use = asyncio.get_running_loop().create_future()
        return proxy

    async def release(self, timeout: float | None) -> None:
        con = self.con
        if con is None or con.is_closed():
            if con is not None:
                con.terminate()
            self._release()  # (a closed connection has handed its holder back already)
            return
        try:
            async with asyncio.timeout(timeout):
                # Connection._reset: a transaction left open is rolled back first.
                if con._session.in_transaction:
                    await con.execute("ROLLBACK;")
                await con.execute(RESET_SQL)
        except (Exception, asyncio.CancelledError):
            con.terminate()  # a reset that failed: the connection goes (the pool replaces it)
            raise
        self._release()

    def _on_close(self, con: Any) -> None:
        # Connection._cleanup -> holder._release_on_close: the holder is free again.
        if con is not self.con:
            return
        self._release()
        self.con = None
        self.pool._maintain_floor()

    def _release(self) -> None:
        if self.in_use is None:
            return
        if not self.in_use.done():
            self.in_use.set_result(None)
        self.in_use = None
        if self.proxy is not None:
            self.proxy._detach()
            self.proxy = None
        self.pool._holders_free.put_nowait(self)


class _HolderQueue(asyncio.LifoQueue[_Holder]):
    """asyncpg's holder queue: LIFO, connected holders first."""

    def _get(self) -> _Holder:
        queue: list[_Holder] = self._queue  # type: ignore[attr-defined]
        for i in range(len(queue) - 1, -1, -1):
            if queue[i].is_connected():
                return queue.pop(i)
        return queue.pop()

    def get_disconnected_nowait(self) -> _Holder:
        queue: list[_Holder] = self._queue  # type: ignore[attr-defined]
        for i in range(len(queue) - 1, -1, -1):
            if not queue[i].is_connected():
                return queue.pop(i)
        raise asyncio.QueueEmpty


class SimPool(asyncpg.Pool):  # type: ignore[misc]  # asyncpg has no type hints
    """An asyncpg pool of *min_size* to *max_size* connections to the world's server,
    made through *connector* (the process's, so that a kill closes them)."""

    def __init__(self, connector: SimConnector, *, min_size: int = 1, max_size: int = 4) -> None:
        # asyncpg's own __init__ is not run: it would connect to a real server.
        if not 0 <= min_size <= max_size or max_size < 1:
            raise ValueError(f"min_size {min_size}, max_size {max_size}")
        self._connector = connector
        # The reset query is asyncpg's own: taught to the server when a pool first needs it.
        _known(connector._world.server.statements)
        self._min = min_size
        self._max = max_size
        self._holder_list = [_Holder(self) for _ in range(max_size)]
        self._holders_free = _HolderQueue(maxsize=max_size)
        for holder in self._holder_list:
            self._holders_free.put_nowait(holder)
        self._is_closing = False
        self._is_closed = False
        self._opened = False
        self._floor: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<SimPool max_size={self._max} size={self.get_size()}>"

    async def open(self) -> SimPool:
        """What ``await asyncpg.create_pool(...)`` does: connect the first *min_size*."""
        holders = self._holder_list
        if self._min:
            await holders[-1].connect()
            await asyncio.gather(*(h.connect() for h in reversed(holders[-self._min : -1])))
        self._opened = True
        return self

    # -- what the library calls --------------------------------------------------------

    async def acquire(self, *, timeout: float | None = None) -> SimPoolProxy:
        """A connection for the caller alone, within *timeout* (``TimeoutError``)."""
        if self._is_closing:
            raise asyncpg.InterfaceError("pool is closing")
        if not self._opened or self._is_closed:
            raise asyncpg.InterfaceError("pool is closed" if self._is_closed else "not open")
        async with asyncio.timeout(timeout):
            holder = await self._holders_free.get()
            try:
                return await holder.acquire()
            except (Exception, asyncio.CancelledError):
                self._holders_free.put_nowait(holder)
                self._maintain_floor()
                raise

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:
        """Give *connection* back: the session is reset first (shielded from the caller's
        cancellation, as asyncpg's is)."""
        if not isinstance(connection, SimPoolProxy) or connection._holder.pool is not self:
            raise asyncpg.InterfaceError(
                f"Pool.release() received invalid connection: {connection!r} is not a "
                "member of this pool"
            )
        if connection.__dict__.get("_con") is None:
            return  # already released
        await asyncio.shield(connection._holder.release(timeout))

    def is_closing(self) -> bool:
        """Whether the pool is closing or closed."""
        return self._is_closed or self._is_closing

    def get_max_size(self) -> int:
        """``max_size``."""
        return self._max

    def get_min_size(self) -> int:
        """``min_size``."""
        return self._min

    def get_size(self) -> int:
        """Connections open now."""
        return sum(h.is_connected() for h in self._holder_list)

    def get_idle_size(self) -> int:
        """Connections open and not lent."""
        return sum(h.is_connected() and h.is_idle() for h in self._holder_list)

    async def close(self) -> None:
        """Wait for every lent connection to come back, then close them all."""
        if self._is_closed:
            return
        self._is_closing = True
        try:
            if self._floor is not None:
                self._floor.cancel()
            await asyncio.gather(*(h.in_use for h in self._holder_list if h.in_use is not None))
            for holder in self._holder_list:
                if holder.con is not None:
                    await holder.con.close()
        except (Exception, asyncio.CancelledError):
            self.terminate()
            raise
        finally:
            self._is_closed, self._is_closing = True, False

    def terminate(self) -> None:
        """Drop every connection at once."""
        self._is_closed = True
        for holder in self._holder_list:
            if holder.con is not None:
                holder.con.terminate()

    # -- asyncpg's floor maintenance -------------------------------------------------

    def _maintain_floor(self) -> None:
        if not self._opened or self.is_closing() or not self._min or self._floor is not None:
            return
        if self.get_size() < self._min:
            self._floor = asyncio.get_event_loop().create_task(self._keep_floor())

    async def _keep_floor(self) -> None:
        try:
            while not self.is_closing() and self.get_size() < self._min:
                try:
                    holder = self._holders_free.get_disconnected_nowait()
                except asyncio.QueueEmpty:
                    return  # acquirers are connecting the others
                failed = False
                try:
                    await holder.connect()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    failed = True
                finally:
                    self._holders_free.put_nowait(holder)
                if failed:
                    await asyncio.sleep(_FLOOR_RETRY)
        finally:
            self._floor = None


def _not_modelled(name: str) -> Any:
    def call(self: SimPool, *args: Any, **kwargs: Any) -> Any:
        raise NotModelled(f"SimPool does not model asyncpg.Pool.{name}()")

    call.__name__ = name
    return call


for _name in (
    "execute",
    "executemany",
    "fetch",
    "fetchrow",
    "fetchval",
    "fetchmany",
    "copy_from_query",
    "copy_from_table",
    "copy_records_to_table",
    "copy_to_table",
    "expire_connections",
    "set_connect_args",
    "get_init_size",
    "__aenter__",
    "__aexit__",
    "__await__",
):
    setattr(SimPool, _name, _not_modelled(_name))
del _name
