"""The two round trips of one run on its lock session: lock and claim; record and unlock.

With a ledger, the first statement takes the job's advisory lock *and* claims the slot in
the ledger, the second records the outcome (or gives the claim back) *and* unlocks; without
one, they are a bare try-lock and unlock. Both are made safe against cancellation here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._cancel import claim_or_undo, task_name
from .._errors import LockError
from .._locking import Refusal
from .._logs import at, get_logger
from ._advisory import TRY_LOCK_SQL, UNLOCK_SQL
from ._backend_errors import BACKEND_ERRORS, SessionGone, backend_errors
from ._crashes import recover_sql
from ._ledger import LedgerTable
from ._session import LockSession

if TYPE_CHECKING:
    from .._records import RunRecord

__all__ = ("Claims",)

_logger = get_logger("cronlock.postgres")


class Claims:
    """Lock-and-claim and record-and-unlock statements on one lock *session* (a shard).

    *table* ``None`` is lock-only mode; *host* is written to the ledger with each claim.
    """

    def __init__(self, session: LockSession, table: LedgerTable | None, host: str) -> None:
        self._session = session
        self._table = table
        self._host = host
        self._recover_sql = None if table is None else recover_sql(table)

    async def claim_reconnecting(
        self, job: str, key: int, slot: datetime, *, rerun: bool = False
    ) -> tuple[Refusal | None, int]:
        """Lock (and claim) *slot* of *job*, reconnecting once if the session died.

        Returns ``None`` (granted) or the refusal, with the session generation it ran on.
        *rerun*: take over the slot's ``crashed`` row instead (see :mod:`._crashes`).
        """
        conn, generation = await self._session.ensure()
        try:
            return await self._claim(conn, generation, job, key, slot, rerun), generation
        except LockError as exc:
            if isinstance(exc.__cause__, TimeoutError):
                raise  # a slow server: retrying would only double the wait
        # The session died under us (killed, network cut, server restart). Its locks died
        # with it, so one attempt on a fresh session is safe.
        _logger.info("job %r: lock session lost; reconnecting", job, extra=at(job))
        conn, generation = await self._session.ensure()
        return await self._claim(conn, generation, job, key, slot, rerun), generation

    async def _attempt(
        self, conn: Any, generation: int, job: str, key: int, slot: datetime, rerun: bool
    ) -> Refusal | None:
        """One round trip: lock (and claim, with the ledger); ``None`` means granted."""
        run = self._session.run
        if self._table is None:
            got = await run(
                conn, generation, lambda c: c.fetchval(TRY_LOCK_SQL, key), what="try-lock"
            )
            return None if got else "locked"
        sql = self._recover_sql if rerun and self._recover_sql else self._table.claim_sql
        pid = os.getpid()
        row = await run(
            conn,
            generation,
            lambda c: c.fetchrow(sql, key, job, slot, self._host, pid),
            what="claim",
        )
        if row["started_at"] is not None:
            return None
        if row["paused"]:
            return "paused"
        return "already_ran" if row["ran"] or row["got"] else "locked"

    async def _claim(
        self, conn: Any, generation: int, job: str, key: int, slot: datetime, rerun: bool
    ) -> Refusal | None:
        def undo(refusal: Refusal | None) -> Awaitable[None] | None:
            if refusal is not None:
                return None  # refused: nothing is held, nothing claimed
            # Granted, but our caller is gone: give the slot and the lock back before
            # delivering the cancel, so that another replica may still run the slot.
            return asyncio.create_task(
                self._unclaim(conn, generation, job, key, slot),
                name=task_name("pg-undo", job),
            )

        # Run the statement in a task that cancellation does not interrupt: cancelling it
        # mid-flight would leave us unsure whether the server granted the lock, and would
        # send a cancel request to a session shared by the shard's running jobs. It is
        # short and bounded; once it is done we know exactly what to undo.
        with backend_errors(
            f"job {job!r}: the claim statement failed",
            session_lost=f"job {job!r}: the lock session was lost; try again",
        ):
            return await claim_or_undo(
                self._attempt(conn, generation, job, key, slot, rerun),
                undo,
                name=task_name("pg-claim", job),
            )

    async def _unclaim(
        self, conn: Any, generation: int, job: str, key: int, slot: datetime
    ) -> None:
        await self.finish(conn, generation, job, key, slot, None, unclaim=True)

    async def release(
        self, generation: int, job: str, key: int, slot: datetime, record: RunRecord | None
    ) -> bool:
        """Record *record* (if any) and unlock on the session the lock was granted on.

        False when that session (of *generation*) is gone, with the lock, or the statement
        failed (the session is then terminated, which releases the lock server-side).
        """
        return await self.finish(self._session.conn, generation, job, key, slot, record)

    async def finish(
        self,
        conn: Any,
        generation: int,
        job: str,
        key: int,
        slot: datetime,
        record: RunRecord | None,
        *,
        unclaim: bool = False,
    ) -> bool:
        """Record (or undo) the claim and unlock: one round trip. False if it failed."""
        table, run = self._table, self._session.run
        try:
            if table is None:
                released = await run(
                    conn, generation, lambda c: c.fetchval(UNLOCK_SQL, key), what="unlock"
                )
            elif unclaim:
                sql, pid = table.unclaim_sql, os.getpid()
                released = await run(
                    conn,
                    generation,
                    lambda c: c.fetchval(sql, job, slot, self._host, pid, key),
                    what="unclaim",
                )
            else:
                sql = table.finish_sql
                outcome = None if record is None else record.outcome
                error = None if record is None else record.error
                row = await run(
                    conn,
                    generation,
                    lambda c: c.fetchrow(sql, job, slot, outcome, error, key),
                    what="finish",
                )
                released = row["released"]
        except SessionGone:
            return False  # the session died: the server already released the lock
        except BACKEND_ERRORS as exc:
            _logger.warning(
                "job %r: unlock failed (%r); the lock session was terminated, which "
                "releases the lock server-side",
                job,
                exc,
                extra=at(job),
            )
            return False
        if not released:
            _logger.warning("job %r: its lock was no longer held at unlock", job, extra=at(job))
        return True
