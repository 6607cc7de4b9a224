"""What a PostgresElector asks the server, in each mode: take the leadership, prove it, give
it up (the elector's seam between its two modes; the fencing argument is in _elector).

- :class:`SessionBallot` (``mode="session"``): a session advisory lock on the election
  session. Taking it also makes the session die after ``idle_session_timeout`` of silence;
  proving it is reading ``pg_locks`` for our own backend; giving it up is dropping the
  session, which the elector does anyway.
- :class:`LeaseBallot` (``mode="lease"``): one row per election in a table of leaders,
  whose ``expires_at`` is in the **server's** time. Taking it succeeds only when it expired
  (or is ours); proving it renews it; giving it up expires it. No statement depends on its
  session, so it works through a transaction pooler. The server's expiry is ``lease`` plus
  :data:`SERVER_MARGIN` after the statement: the holder's own lease (``lease`` after it
  *sent* the statement, on its monotonic clock) always lapses first.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any

from ..._keys import job_lock_key
from .._conn.errors import backend_error_types
from .._sql.advisory import TRY_LOCK_SQL
from .._sql.tables import quote_ident
from .fencing import ACQUIRE_SQL, HEARTBEAT_SQL

__all__ = ("DEFAULT_LEADERS_TABLE", "SERVER_MARGIN", "LeaseBallot", "SessionBallot")

DEFAULT_LEADERS_TABLE = "cronlock_leaders"
"""The lease-mode elector's table when none is given."""
SERVER_MARGIN = 1.0
"""Seconds the server's expiry of a lease-mode leadership outlasts the holder's own lease."""


class SessionBallot:
    """Leadership as a session advisory lock on ``job_lock_key(name)``."""

    session_bound = True
    """Dropping the session gives the leadership up (the server frees the lock)."""

    def __init__(self, name: str, idle_session_timeout: float) -> None:
        self._key = job_lock_key(name)
        self._idle = str(int(idle_session_timeout * 1000))

    async def prepare(self, conn: Any) -> None:
        """Nothing to prepare: an advisory lock needs no table."""

    async def acquire(self, conn: Any) -> bool:
        """Try the lock; if granted, bound the session's silence (PostgreSQL >= 14)."""
        if conn.get_server_version().major >= 14:
            return bool(await conn.fetchval(ACQUIRE_SQL, self._key, self._idle))
        # No idle_session_timeout: a frozen leader then blocks failover until it wakes.
        return bool(await conn.fetchval(TRY_LOCK_SQL, self._key))

    async def renew(self, conn: Any) -> bool:
        """Whether our own backend still holds the lock (asking it again would prove
        nothing: the lock is re-entrant)."""
        return bool(await conn.fetchval(HEARTBEAT_SQL, self._key))

    async def release(self, conn: Any, *, timeout: float) -> None:
        """Nothing to do: the elector drops the session, which frees the lock."""


class LeaseBallot:
    """Leadership of election *name* as a row of *table* (in *schema*), held as *holder*
    for *lease* seconds of the server's clock (plus :data:`SERVER_MARGIN`)."""

    session_bound = False
    """The row outlives the session: giving it up is a statement (or its expiry)."""

    def __init__(
        self, name: str, *, table: str, schema: str | None, holder: str, lease: float
    ) -> None:
        quoted = quote_ident(table, field="leaders table")
        self._table = (
            quoted if schema is None else f"{quote_ident(schema, field='schema')}.{quoted}"
        )
        self._name = name
        self._holder = f"{holder}:{secrets.token_hex(4)}"
        self._seconds = lease + SERVER_MARGIN
        self._key = job_lock_key(f"cronlock:leaders:{self._table}")

    @property
    def holder(self) -> str:
        """Who this elector is, in the leaders table."""
        return self._holder

    async def prepare(self, conn: Any) -> None:
        """Create the leaders table if missing (concurrent callers serialised)."""
        if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", self._table):
            return
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1::bigint)", self._key)
            if schema := self._table.rpartition(".")[0]:
                await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            await conn.execute(
                f"""CREATE TABLE IF NOT EXISTS {self._table} (
                    name       text        PRIMARY KEY,
                    holder     text        NOT NULL,
                    expires_at timestamptz NOT NULL,
                    since      timestamptz NOT NULL DEFAULT clock_timestamp()
                )"""
            )

    async def acquire(self, conn: Any) -> bool:
        """Take the leadership if it is free (expired) or already ours."""
        row = await conn.fetchval(
            f"""INSERT INTO {self._table} AS l (name, holder, expires_at)
                VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 second')
                ON CONFLICT (name) DO UPDATE
                SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,
                    since = CASE WHEN l.holder = EXCLUDED.holder THEN l.since
                                 ELSE clock_timestamp() END
                WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder
                RETURNING true""",
            self._name,
            self._holder,
            self._seconds,
        )
        return bool(row)

    async def renew(self, conn: Any) -> bool:
        """Extend our unexpired leadership; False once it expired or passed to another."""
        row = await conn.fetchval(
            f"""UPDATE {self._table}
                SET expires_at = clock_timestamp() + $3::float8 * interval '1 second'
                WHERE name = $1 AND holder = $2 AND expires_at > clock_timestamp()
                RETURNING true""",
            self._name,
            self._holder,
            self._seconds,
        )
        return bool(row)

    async def release(self, conn: Any, *, timeout: float) -> None:
        """Give the leadership up now, so another replica need not wait for its expiry;
        bounded by *timeout*, best effort (it expires anyway): never raises a backend error."""
        sql = f"UPDATE {self._table} SET expires_at = '-infinity' WHERE name = $1 AND holder = $2"
        with contextlib.suppress(*backend_error_types()):
            async with asyncio.timeout(timeout):
                await conn.execute(sql, self._name, self._holder)
