"""The soak's TCP proxy: one per replica, between it and the server (or the pooler).

Faults it models, on this replica's connections only:

- :meth:`FaultProxy.reset`: every open connection is aborted at both ends (RST), as a
  broken path or a restarted middlebox would.
- :meth:`FaultProxy.partition`: bytes stop in both directions and new connections hang.
  If the partition lasts longer than *server_notice* seconds, the server side of each
  connection is aborted then (the server's keepalives noticed the dead peer); when the
  partition heals, the client side of those connections is aborted (its next packet
  meets a reset), and connections the server never gave up on carry on.

And :meth:`FaultProxy.retarget`, for a failover: new connections go to another server (a
moved address: a DNS name, a virtual IP), open ones are aborted (they led to the old one).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.postgres.proxy import TcpProxy


class _Pair:
    """One proxied connection: the client's end and the server's end."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client, self.server = client, server
        self.server_gone = False

    def abort_server(self) -> None:
        self.server_gone = True
        with contextlib.suppress(Exception):
            self.server.transport.abort()

    def abort(self) -> None:
        for writer in (self.client, self.server):
            with contextlib.suppress(Exception):
                writer.transport.abort()


class FaultProxy(TcpProxy):
    """A TCP proxy on a free port of 127.0.0.1 to *target*, with faults on command (the
    tests' :class:`TcpProxy`, whose ``cut`` is :meth:`reset` here)."""

    def __init__(self, target_host: str, target_port: int, *, server_notice: float) -> None:
        super().__init__(target_host, target_port)
        self.server_notice = server_notice
        self._pairs: set[_Pair] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._hung: set[asyncio.StreamWriter] = set()
        self._notice: asyncio.TimerHandle | None = None

    @property
    def partitioned(self) -> bool:
        return not self._flowing.is_set()

    def reset(self) -> None:
        """Abort every open connection, at both ends."""
        for pair in tuple(self._pairs):
            pair.abort()
        self._pairs.clear()

    def partition(self) -> None:
        """Stop every byte; the server gives up on the connections after *server_notice*."""
        self._flowing.clear()
        loop = asyncio.get_running_loop()
        self._notice = loop.call_later(self.server_notice, self._server_notices)

    def heal(self) -> None:
        """End the partition: bytes flow again where the server kept the connection."""
        if self._notice is not None:
            self._notice.cancel()
            self._notice = None
        for pair in tuple(self._pairs):
            if pair.server_gone:
                pair.abort()
                self._pairs.discard(pair)
        for writer in tuple(self._hung):  # a connect that never got through: reset now
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._hung.clear()
        self._flowing.set()

    def retarget(self, port: int) -> None:
        """Send new connections to *port* (same host) and abort the open ones."""
        self.target = (self.target[0], port)
        self.reset()

    def cut(self) -> None:
        """What the tests' proxy calls a cut: :meth:`reset`."""
        self.reset()

    async def close(self) -> None:
        self.heal()
        await super().close()

    def _server_notices(self) -> None:
        self._notice = None
        for pair in tuple(self._pairs):
            pair.abort_server()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.partitioned:
            self._hung.add(writer)  # the handshake never gets through while partitioned
            return
        upstream = await self._upstream(writer)
        if upstream is None:
            return
        up_reader, up_writer = upstream
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            self._spawn(self._pair_pipe(pair, src, dst))

    async def _pair_pipe(
        self, pair: _Pair, src: asyncio.StreamReader, dst: asyncio.StreamWriter
    ) -> None:
        try:
            while data := await src.read(65536):
                await self._flowing.wait()
                if pair.server_gone:
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                await self._flowing.wait()  # inside a partition nobody learns of it yet
            finally:
                pair.abort()
                self._pairs.discard(pair)
