"""Reads planned without the server's JIT compiler: :func:`fetch_without_jit`.

PostgreSQL compiles a statement whose estimated cost passes ``jit_above_cost`` (100,000 by
default, and JIT is on by default, managed services included). A few statements of the
ledger are estimated far above that while they touch almost nothing: the conflict check
of the fleet's definitions (:func:`.._sql.definitions.conflicts_sql`), whose joins the
planner cannot size, was estimated at 676,000 and spent 0.5-0.8 s compiling 78
functions to read no row, on the connection a lease-mode replica's claims wait for. Such
a statement runs in a transaction of its own with ``SET LOCAL jit = off``: nothing stays
set on the session (a transaction pooler hands it on clean), at the cost of two more round
trips for a read made every few seconds.
"""

from __future__ import annotations

from typing import Any

__all__ = ("NO_JIT_SQL", "fetch_without_jit")

NO_JIT_SQL = "SET LOCAL jit = off"
"""Turns the JIT compiler off until the end of the transaction."""


async def fetch_without_jit(conn: Any, sql: str, *args: Any) -> list[Any]:
    """``conn.fetch(sql, *args)`` in a transaction of its own, planned without JIT."""
    async with conn.transaction():
        await conn.execute(NO_JIT_SQL)
        rows: list[Any] = await conn.fetch(sql, *args)
        return rows
