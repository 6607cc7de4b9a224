"""The two session advisory lock statements, in the form every part of the backend uses.

``pg_try_advisory_lock``, never the blocking form: losers skip at once, they do not queue.
The run ledger combines them with its claims (:mod:`._ledger`); the lock-only locker,
standalone runs and the election send them as they are.
"""

from __future__ import annotations

__all__ = ("TRY_LOCK_ON_SQL", "TRY_LOCK_SQL", "UNLOCK_SQL")

TRY_LOCK_SQL = "SELECT pg_try_advisory_lock($1::bigint)"
TRY_LOCK_ON_SQL = """
    SELECT CASE WHEN pg_backend_pid() = $2::integer THEN pg_try_advisory_lock($1::bigint) END"""
"""The try-lock, taken only on the backend the connection announced (``$2``): NULL, and no
lock taken, when a pooler or proxy handed the statement to another one (:class:`cronlock.
PoolerDetected`). It costs no round trip of its own."""
UNLOCK_SQL = "SELECT pg_advisory_unlock($1::bigint)"
