"""A TCP proxy that can fall silent: a host that dropped off the network, as a client sees it.

The failover benchmark (benchmarks/failover.py) puts one in two places:

- in front of the primary, as the first host of the replicas' multi-host DSN: at the
  fault it falls silent and the primary is crashed, so the replicas meet a primary that
  drops packets instead of refusing connections;
- between the standby and the primary (the standby's ``primary_conninfo``): falling
  silent 3 s before the crash, it keeps the standby from *receiving* the last 3 s of WAL;
- between PgBouncer and the servers, as a virtual IP: :meth:`SilentProxy.retarget` moves
  it to the promoted standby, as an HA manager moves its VIP after a promotion.

:meth:`SilentProxy.silence` is final: from then on every byte is dropped, in both
directions, on the open connections and on new ones, which are accepted and never
answered; a close or reset on either side is not passed on. The client learns nothing,
as when the peer's packets stop arriving: only its own timeouts end its waits. (A real
dropped SYN would leave ``connect()`` itself hanging; here the TCP handshake completes and
the server's greeting never comes, which a PostgreSQL client waits for just the same.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class SilentProxy:
    """A TCP proxy on a free port of 127.0.0.1 to *target*, until :meth:`silence`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0
        """Connections clients opened to the proxy: an outside count of connect attempts."""
        self.silent = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen; return the port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def retarget(self, host: str, port: int) -> None:
        """Send new connections to *host*:*port* from now on (a virtual IP moved to another
        server); open ones stay where they are."""
        self.target = (host, port)

    def silence(self) -> None:
        """Drop every byte from now on, and pass no close on: the target is gone silent."""
        self.silent = True

    async def close(self) -> None:
        """Stop listening and abort every connection (both ends)."""
        if self._server is not None:
            self._server.close()
        for writer in tuple(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()
        for task in tuple(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(writer)  # kept, so that close() aborts it
        if self.silent:
            self._spawn(self._swallow(reader))
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            if self.silent:  # the target died while silent: say nothing
                self._spawn(self._swallow(reader))
            else:
                writer.transport.abort()  # refused: the client is refused too
            return
        self._writers.add(up_writer)
        self._spawn(self._pipe(reader, up_writer))
        self._spawn(self._pipe(up_reader, writer))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run *coroutine* in a task that :meth:`close` cancels and awaits."""
        task = asyncio.create_task(coroutine, name="failover-proxy")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        """Read and drop whatever the client sends, forever (until close)."""
        with contextlib.suppress(ConnectionError, OSError):
            while await reader.read(65536):
                pass

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                if self.silent:
                    continue  # dropped
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        # The source closed or reset. Passed on while the proxy forwards; once silent,
        # the other end must not learn of it.
        if not self.silent:
            with contextlib.suppress(Exception):
                dst.transport.abort()
