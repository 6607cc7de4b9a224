"""How statements reach the server: the one connection layer of the backend.

Every statement any part of the backend sends goes out on a :class:`Channel`: a dedicated
connection, replaced when it dies (:mod:`.dedicated`: a locker's shards in session mode,
its connection of its own in lease mode), or a connection borrowed for each statement
(:mod:`.borrowed`: lease mode on a user's pool). Where connections come from, how one is
opened, lent and handed back, and how the server's and the network's errors become
:class:`cronlock.LockError` subclasses live here (:mod:`.source`, :mod:`.errors`), and
nowhere else names asyncpg's error types. Reconnecting backs off (:mod:`.backoff`).

This package re-exports nothing but the protocol it is about.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .backoff import Backoff

__all__ = ("Channel",)

_T = TypeVar("_T")


class Channel(Protocol):
    """Where one shard's statements go: ``conn, generation = await channel.ensure()``, then
    ``await channel.run(conn, generation, lambda c: c.fetch(...), what=...)``.

    Each new connection bumps :attr:`generation`; a statement meant for an older one is
    refused (:class:`.errors.SessionGone`) rather than sent where none of its locks live.
    """

    conn: Any
    """The open connection (or the promise of one), ``None`` between a drop and the next
    :meth:`ensure`."""
    generation: int
    closed: bool
    connect_lock: asyncio.Lock
    opened: int
    """Connections opened (or, borrowing, the ledger prepared) so far."""
    statements: int
    last_ok: float
    """Loop time of the last statement that succeeded."""
    backoff: Backoff

    @property
    def is_open(self) -> bool:
        """Whether statements can go out right now."""
        ...

    async def ensure(self) -> tuple[Any, int]:
        """The connection and its generation; connect (and set up) if there is none."""
        ...

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
        """Run one statement on *conn* of *generation*, bounded by the statement timeout:
        the error boundary, where a failure becomes a :class:`cronlock.LockError` naming
        *what*. An *urgent* statement (a claim) goes before the others waiting for the
        channel."""
        ...

    def drop(self, conn: Any, *, reason: str, kill: bool = True) -> None:
        """Forget *conn* (its session's locks are then lost); terminate it unless not
        *kill*."""
        ...

    async def hand_back(self, conn: Any) -> None:
        """Give *conn* back at close, once a statement in flight is done."""
        ...
