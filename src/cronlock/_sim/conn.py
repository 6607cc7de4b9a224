"""The client side of a simulated connection: what the connection layer holds where it would
hold an asyncpg ``Connection``, and the connector it gets one from.

Only what the library calls of a connection is here; a call it does not know fails loudly,
so that the model's gaps show (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .rows import Row
from .server import Request, Session
from .statements.session import status

if TYPE_CHECKING:
    from .world import Process, World

__all__ = ("SimConnection", "SimConnector", "TrackedConnector")


class _Version(NamedTuple):
    major: int
    minor: int
    micro: int
    releaselevel: str
    serial: int


_VERSION = _Version(15, 10, 0, "final", 0)


class SimConnection:
    """One client connection to the simulated server, on its process's loop."""

    def __init__(
        self, world: World, process: Process, session: Session, *, cache: bool = True
    ) -> None:
        self._world = world
        self._cache = cache
        self._prepared: set[str] = set()
        self._process = process
        self._session = session
        self._closed = False
        self._listeners: list[Callable[[Any], None]] = []
        self._pending: set[asyncio.Future[Any]] = set()
        session.on_end = self._ended_by_server

    # -- what asyncpg's Connection offers, as far as the library uses it -------------------

    def get_server_pid(self) -> int:
        """The backend's pid, announced at connect."""
        return self._session.pid

    def get_server_version(self) -> _Version:
        """PostgreSQL 15."""
        return _VERSION

    def is_closed(self) -> bool:
        """Whether the connection is closed (by us, or we learnt the server ended it)."""
        return self._closed

    def add_termination_listener(self, callback: Callable[[Any], None]) -> None:
        """Call *callback(conn)* once the connection closes."""
        self._listeners.append(callback)

    def remove_termination_listener(self, callback: Callable[[Any], None]) -> None:
        """Stop calling *callback*."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    def terminate(self) -> None:
        """Drop the connection without a goodbye (the server notices the FIN)."""
        if self._closed:
            return
        self._close_locally()
        self._world.server.client_gone(self._session)

    async def close(self, *, timeout: float | None = None) -> None:
        """Close the connection politely."""
        self.terminate()
        await asyncio.sleep(0)

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Row]:
        """Run *query*; its rows."""
        result = await self._request(query, args)
        return list(result) if isinstance(result, list) else []

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Row | None:
        """Run *query*; its first row or ``None``."""
        result = await self.fetch(query, *args)
        return result[0] if result else None

    async def fetchval(
        self, query: str, *args: Any, column: int = 0, timeout: float | None = None
    ) -> Any:
        """Run *query*; the first column of its first row, or ``None``."""
        row = await self.fetchrow(query, *args)
        return None if row is None else row[column]

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        """Run *query*; its status text."""
        result = await self._request(query, args)
        return result if isinstance(result, str) else status("SELECT", len(result or []))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """``BEGIN`` ... ``COMMIT`` (``ROLLBACK`` when the block raises)."""
        await self._request("BEGIN;", ())
        try:
            yield
        except BaseException:
            if not self._closed:
                with contextlib.suppress(Exception):
                    await self._request("ROLLBACK;", ())
            raise
        await self._request("COMMIT;", ())

    # -- the wire -----------------------------------------------------------------------

    async def _request(self, sql: str, args: tuple[Any, ...]) -> Any:
        import asyncpg

        if self._closed:
            raise asyncpg.ConnectionDoesNotExistError("connection is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.add(future)

        def answer(result: Any, error: BaseException | None) -> None:
            # Runs in the world's turn: the answer reaches this process's loop now.
            def deliver() -> None:
                if future.done():
                    return
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)

            self._process.deliver(deliver)

        # asyncpg prepares a statement (a round trip of its own) before it executes it,
        # unless it kept it prepared from an earlier run on this connection (its cache).
        request = Request(sql, args, answer, prepared=sql in self._prepared)
        self._world.send(self._session, request)
        try:
            result = await future
            if self._cache:
                self._prepared.add(sql)
            return result
        except asyncio.CancelledError:
            request.cancelled = True  # we stop waiting; the server runs it all the same
            raise
        finally:
            self._pending.discard(future)

    def _ended_by_server(self, reason: str) -> None:
        # The server ended the session: the client learns it when the FIN arrives.
        import asyncpg

        def learn() -> None:
            if self._closed:
                return
            error = asyncpg.ConnectionDoesNotExistError(f"connection was closed: {reason}")
            for future in list(self._pending):
                if not future.done():
                    future.set_exception(error)
            self._close_locally()

        self._process.deliver(learn, delay=self._world.latency())

    def _close_locally(self) -> None:
        self._closed = True
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(self)


class SimConnector:
    """What a ``PostgresLocker`` is given instead of a DSN or a pool in the simulation:
    connects its process to the world's server (``ConnectionSource`` accepts any object
    with this ``connect``)."""

    def __init__(self, world: World, process: Process) -> None:
        self._world = world
        self._process = process

    def describe(self) -> str:
        """For error messages."""
        return "simulated PostgreSQL server"

    async def connect(self, timeout: float, **kwargs: Any) -> SimConnection:
        """A new session, within *timeout* seconds (an error as asyncpg's connect raises);
        ``statement_cache_size=0`` among *kwargs*: no statement stays prepared."""
        async with asyncio.timeout(timeout):
            await asyncio.sleep(self._world.latency())
            server = self._world.server
            # A stalled server takes the connection but answers nothing until it resumes
            # (the stall may be extended meanwhile: look again when it should be over).
            while server.up and self._world.now < server.stalled_until:  # noqa: ASYNC110
                await asyncio.sleep(server.stalled_until - self._world.now)
            if not server.up:
                raise ConnectionRefusedError(111, "Connect call failed (simulated)")
            session = server.open_session(self._process.name, lambda reason: None)
            await asyncio.sleep(self._world.latency())
            if not session.alive:
                raise ConnectionRefusedError(111, "Connect call failed (simulated)")
            cache = int(kwargs.get("statement_cache_size", 100)) > 0
            return SimConnection(self._world, self._process, session, cache=cache)


class TrackedConnector(SimConnector):
    """The connector, remembering its process's connections (a kill closes them)."""

    async def connect(self, timeout: float, **kwargs: Any) -> Any:
        conn = await super().connect(timeout, **kwargs)
        self._process.connections.append(conn)
        return conn
