"""The statements of the lock alone (``ledger=False``): many try-locks, many unlocks.

They answer in the shape of the ledger's claims and ends (:mod:`.claims`), so the batcher
reads both alike: a granted try-lock has a ``started_at``, a refused one is ``locked``.
"""

from __future__ import annotations

__all__ = ("TRY_LOCK_MANY_SQL", "UNLOCK_MANY_SQL")

TRY_LOCK_MANY_SQL = """
    WITH t AS MATERIALIZED (
        SELECT u.i, pg_try_advisory_lock(u.key) AS got
        FROM unnest($1::bigint[]) WITH ORDINALITY AS u(key, i)
    )
    SELECT t.i, CASE WHEN t.got THEN clock_timestamp() END AS started_at, false AS ran,
           t.got, false AS paused, false AS stray, NULL::timestamptz AS p_slot
    FROM t"""
"""``$1`` keys; answers (i, started_at, ran, got, paused, stray, p_slot) per key. The
``MATERIALIZED`` CTE takes each lock exactly once."""

UNLOCK_MANY_SQL = """
    SELECT u.i, pg_advisory_unlock(u.key) AS released
    FROM unnest($1::bigint[]) WITH ORDINALITY AS u(key, i)"""
"""``$1`` keys; answers (i, released)."""
