"""A TCP proxy the tests control, to put faults between a client and PostgreSQL.

Modes: ``pass`` forwards bytes; ``refuse`` closes new connections at once; ``freeze``
holds bytes in both directions (a hung network or a frozen peer) until thawed. ``cut()``
drops every open connection, as a broken network path would. ``deafen()`` drops, for good,
whatever the server sends on the connections open now (new ones pass): a statement reaches
the server and commits, its answer is lost. ``accepted`` counts the
connections clients opened to the proxy: an outside count of connect attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

Mode = Literal["pass", "refuse", "freeze"]


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode: Mode = "pass"
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.accepted = 0
        self._clients: set[asyncio.StreamWriter] = set()
        self._deaf: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode == "freeze":
            self._thawed.clear()
        else:
            self._thawed.set()

    def deafen(self) -> None:
        """Lose every answer the server sends on the connections open now."""
        self._deaf.update(self._clients)

    def cut(self) -> None:
        for writer in tuple(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in tuple(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "refuse":
            writer.transport.abort()
            return
        upstream = await self._upstream(writer)
        if upstream is None:
            return
        up_reader, up_writer = upstream
        self._writers.update((writer, up_writer))
        self._clients.add(writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            self._spawn(self._pipe(src, dst))

    async def _upstream(
        self, client: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the target for *client*; ``None`` (the client reset) if refused."""
        try:
            return await asyncio.open_connection(*self.target)
        except OSError:
            client.transport.abort()
            return None

    def _spawn(self, pipe: Coroutine[Any, Any, None]) -> None:
        """Run *pipe* in a task that :meth:`close` cancels."""
        task = asyncio.create_task(pipe, name="proxy-pipe")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self._thawed.wait()
                if dst in self._deaf:
                    continue  # an answer lost
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.transport.abort()
            self._writers.discard(dst)


def via(dsn: str, port: int) -> str:
    """*dsn* with its host and port replaced by a proxy's on this machine."""
    parts = urlsplit(dsn)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))
