"""The two round trips of one run on its lock session: lock and claim; record and unlock.

With a ledger, the first statement takes the job's advisory lock *and* claims the slot in
the ledger, the second records the outcome (or gives the claim back) *and* unlocks; without
one, they are a bare try-lock and unlock. Runs due together share those statements: the
shard's :class:`._batch.Batcher` sends all the claims (and all the ends) waiting on the
session in one statement. Both are made safe against cancellation here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any

from ..._cancel import claim_or_undo, task_name
from ..._errors import LockError
from ..._logs import at, get_logger
from .._conn import Channel
from .._modes.base import Exclusion, Statement
from .batch import Batcher, ClaimAnswer, held_back

__all__ = ("Claims",)

_logger = get_logger("cronlock.postgres")


class Claims:
    """Lock-and-claim and record-and-unlock statements on one lock *session* (a shard).

    *exclusion* gives the statements and rules of the locker's mode. *host* is written to
    the ledger with each claim.
    """

    def __init__(
        self,
        session: Channel,
        exclusion: Exclusion,
        host: str,
        *,
        held_back: Callable[[datetime], float | None] = lambda slot: None,
    ) -> None:
        self._session = session
        self._exclusion = exclusion
        self._host = host
        self._held_back = held_back
        self.batcher = Batcher(session, exclusion, host, held_back=held_back)

    async def claim(self, job: str, key: int, slot: datetime, *, rerun: int = 0) -> ClaimAnswer:
        """Lock (and claim) *slot* of *job*, with the other claims due on this session.

        A claim whose session died is retried once on a fresh one. If our caller is
        cancelled meanwhile, a granted claim is given back before the cancellation is
        delivered. *rerun* (an attempt, 2 or more): take over the slot's row at the attempt
        before it, ``crashed`` or failed, instead (see :mod:`._crashes`); a rare statement
        of its own, not batched.
        """
        attempt: Coroutine[Any, Any, ClaimAnswer] | asyncio.Future[ClaimAnswer]
        takeover = rerun and self._exclusion.takeover(
            key, job, slot, self._host, os.getpid(), rerun
        )
        if takeover:
            attempt = self._rerun_reconnecting(job, key, slot, takeover)
        else:
            attempt = self.batcher.claim(job, key, slot)

        def undo(answer: ClaimAnswer) -> Awaitable[None] | None:
            if answer.refusal is not None:
                return None  # refused: nothing is held, nothing claimed
            # Granted, but our caller is gone: give the slot and the lock back before
            # delivering the cancel, so that another replica may still run the slot.
            return asyncio.create_task(
                self._undo(answer.generation, job, key, slot), name=task_name("pg-undo", job)
            )

        # The claim runs in a task that cancellation does not interrupt: cancelling it
        # mid-flight would leave us unsure whether the server granted the lock (and the
        # statement is shared with other jobs' claims). It is short and bounded; once it is
        # done we know exactly what to undo.
        return await claim_or_undo(attempt, undo, name=task_name("pg-claim", job))

    async def _undo(self, generation: int, job: str, key: int, slot: datetime) -> None:
        end = self.batcher.end(generation, job, key, slot, None, undo=True)
        if end is not None:
            await end

    # -- a takeover (a crashed run's rerun, a retry): one statement of its own -------------

    async def _rerun_reconnecting(
        self, job: str, key: int, slot: datetime, takeover: Statement
    ) -> ClaimAnswer:
        conn, generation = await self._session.ensure()
        if (wait := self._held_back(slot)) is not None:
            raise held_back(job, slot, wait)
        try:
            return await self._rerun(conn, generation, job, key, slot, takeover)
        except LockError as exc:
            if isinstance(exc.__cause__, TimeoutError):
                raise  # a slow server: retrying would only double the wait
        _logger.info("job %r: lock session lost; reconnecting", job, extra=at(job))
        conn, generation = await self._session.ensure()
        return await self._rerun(conn, generation, job, key, slot, takeover)

    async def _rerun(
        self,
        conn: Any,
        generation: int,
        job: str,
        key: int,
        slot: datetime,
        takeover: Statement,
    ) -> ClaimAnswer:
        row = await self._session.run(
            conn,
            generation,
            lambda c: c.fetchrow(takeover.sql, *takeover.args),
            what=f"job {job!r}: the claim statement",
            urgent=True,
        )
        if self._exclusion.stray(row):
            # A lease taken for a row that could not be taken over goes back.
            self.batcher.end(generation, job, key, slot, None, undo=True)
        if row["started_at"] is not None:
            return ClaimAnswer(None, generation)
        if row["paused"]:
            return ClaimAnswer("paused", generation)
        return ClaimAnswer("already_ran" if row["got"] else "locked", generation)
