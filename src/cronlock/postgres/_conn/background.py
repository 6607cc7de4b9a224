"""Background statements on a shared session, kept short: :func:`fetch_without_jit`,
:func:`execute_briefly`.

A locker's upkeep and fleet reads share its session with its claims (lease mode has one
connection for everything), so a claim waits for whichever of them is in flight. Two
things made such a statement long while it did almost nothing.

**The JIT compiler.**
PostgreSQL compiles a statement whose estimated cost passes ``jit_above_cost`` (100,000 by
default, and JIT is on by default, managed services included). A few statements of the
ledger are estimated far above that while they touch almost nothing: the conflict check
of the fleet's definitions (:func:`.._sql.definitions.conflicts_sql`), whose joins the
planner cannot size, was estimated at 676,000 and spent 0.5-0.8 s compiling 78
functions to read no row, on the connection a lease-mode replica's claims wait for. Such
a statement runs in a transaction of its own with ``SET LOCAL jit = off``: nothing stays
set on the session (a transaction pooler hands it on clean), at the cost of two more round
trips for a read made every few seconds.

**Row locks.** A note or definition write upserts rows that an operator's bulk change
(``put_schedules`` of 100,000 schedules) holds until it commits: the write waited for it,
0.2-0.5 s, and the claims queued behind it with it. Such a write runs in a transaction of
its own with ``SET LOCAL lock_timeout`` of :data:`BRIEF_LOCK_WAIT`: past that it fails
(``LockNotAvailableError``), changes nothing, and its rows are written at the next try.
"""

from __future__ import annotations

from typing import Any

__all__ = ("BRIEF_LOCK_WAIT", "NO_JIT_SQL", "execute_briefly", "fetch_without_jit")

NO_JIT_SQL = "SET LOCAL jit = off"
"""Turns the JIT compiler off until the end of the transaction."""
BRIEF_LOCK_WAIT = 0.05
"""Seconds a background write waits for a row lock before it gives up (tried again later)."""
_BRIEF_SQL = f"SET LOCAL lock_timeout = '{round(BRIEF_LOCK_WAIT * 1000)}ms'"


async def fetch_without_jit(conn: Any, sql: str, *args: Any) -> list[Any]:
    """``conn.fetch(sql, *args)`` in a transaction of its own, planned without JIT."""
    async with conn.transaction():
        await conn.execute(NO_JIT_SQL)
        rows: list[Any] = await conn.fetch(sql, *args)
        return rows


async def execute_briefly(sql: str, *args: Any) -> Any:
    """``conn.execute(sql, *values)`` (the connection given last, as a session runs a call)
    in a transaction of its own that waits at most :data:`BRIEF_LOCK_WAIT` for a lock."""
    *values, conn = args
    async with conn.transaction():
        await conn.execute(_BRIEF_SQL)
        return await conn.execute(sql, *values)
