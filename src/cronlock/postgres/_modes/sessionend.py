"""How a PostgresLocker's lock sessions end: dropped (their leases are lost) or closed.

A dropped session took every lock on it along: :func:`mark_dropped` marks the leases of
its shard lost, so the scheduler ends their runs. At close, :func:`hand_back_all` writes
what upkeep still holds (schedules, outcomes of lost leases) on the first open session,
then hands each connection back (closed, or returned to the pool it was borrowed from).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from ..._cancel import task_name, uncancellable
from ..._errors import LockError
from ..._logs import get_logger
from .._conn.dedicated import LockSession
from .._conn.errors import gone_or_failed_types
from .._conn.source import ConnectionSource
from .._locker.hold import PostgresHold
from .._locker.upkeep import Upkeep

__all__ = ("POOL_WATCH_INTERVAL", "hand_back_all", "mark_dropped", "watch_pool")

POOL_WATCH_INTERVAL = 0.5
"""Seconds between two looks at whether a borrowed-from pool is closing."""

_logger = get_logger("cronlock.postgres")


def mark_dropped(held: Mapping[int, PostgresHold], shard: int, shards: int, reason: str) -> int:
    """Mark lost the leases in *held* (by lock key) on *shard* of *shards*; return how many."""
    lost = [lease for key, lease in held.items() if not lease.lost and key % shards == shard]
    for lease in lost:
        lease.mark_lost(LockError(f"job {lease.job!r}: the lock session was dropped: {reason}"))
    if lost:
        _logger.error(
            "lock session %d dropped (%s): the locks of %s are lost and may be taken "
            "by another replica",
            shard,
            reason,
            sorted(lease.job for lease in lost),
        )
    return len(lost)


async def hand_back_all(
    shards: Sequence[LockSession], upkeep: Upkeep, held: Mapping[int, PostgresHold]
) -> None:
    """Write upkeep's pending rows on the first open session (not while locks are still
    *held*: then close at once), and hand every session's connection back."""
    if held and any(s.conn is not None for s in shards):
        _logger.warning(
            "PostgresLocker closed while holding the locks of %s",
            sorted(lease.job for lease in held.values()),
        )
    flushed = bool(held)
    for session in shards:
        async with session.connect_lock:
            conn = session.conn
            if conn is None:
                continue
            if not flushed:
                flushed = True
                with contextlib.suppress(*gone_or_failed_types()):
                    await uncancellable(
                        upkeep.flush(session, conn, session.generation),
                        name=task_name("pg-flush"),
                    )
            await session.hand_back(conn)


def watch_pool(
    source: ConnectionSource, close: Callable[[], Awaitable[None]]
) -> asyncio.Task[None] | None:
    """A task that calls *close* once the pool *source* borrows from starts closing.

    ``Pool.close()`` waits for every borrowed connection: closing the pool while a locker
    holds some would hang. The watch hands them back (and says what to fix). ``None`` for
    a DSN."""
    if not source.pooled:
        return None

    async def on_closing() -> None:
        await source.wait_pool_closing(POOL_WATCH_INTERVAL)
        _logger.warning(
            "the asyncpg pool is closing while a PostgresLocker still borrows its "
            "connections; handing them back now (their locks are lost). Shut the "
            "Scheduler down (or close the locker) before closing the pool."
        )
        await close()

    return asyncio.create_task(on_closing(), name=task_name("pool-watch"))
