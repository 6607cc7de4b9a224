"""One lock session's batches: claims, and ends of runs, sent many at a time.

A thousand jobs due at one instant must not cost a thousand round trips on each replica.
Each shard's :class:`Batcher` collects the claims (and the outcomes + unlocks) asked of its
session and sends them together, one statement for all claims and one for all ends
(:mod:`._batchsql`). Nothing waits on a timer: the first request of an idle session starts
a flush at the next turn of the event loop (so every request made in the same turn, such
as all the runs the run loop started for one instant, goes with it), and requests that
arrive while a statement is in flight go with the next one; when both claims and ends are
waiting, the claims go first (a claim delays the start of a run, an end only its unlock),
but ends never wait behind more than two claim statements in a row.
A run alone therefore still costs one round trip to claim and one to finish.

Each caller waits for its own answer on a future; the flush is a task of the batcher that
no caller's cancellation interrupts (the caller's :func:`cronlock._cancel.claim_or_undo`
then undoes what it was granted). A failed statement fails every request in it, with the
error each would have had alone: the session is then dropped (its locks with it), and a
claim whose session died is retried once on a fresh one, as a single claim is.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..._cancel import finish_uncancellably, task_name
from ..._errors import LockError
from ..._locking.protocols import Refusal
from ..._logs import at, get_logger
from .._conn.errors import SessionGone, backend_error_types, backend_errors
from .._sql.advisory import UNLOCK_SQL
from .._sql.claims import TRY_LOCK_MANY_SQL, UNLOCK_MANY_SQL, Prefixed
from .._sql.decode import decode_run

if TYPE_CHECKING:
    from ..._records import RunRecord
    from .._conn.dedicated import LockSession
    from .._modes.exclusion import Exclusion

__all__ = ("MAX_BATCH", "Batcher", "ClaimAnswer", "Told")

_logger = get_logger("cronlock.postgres")

MAX_BATCH = 1000
"""Rows per statement at most: a bigger batch waits for the next one (bounds how long one
statement holds the session, and the statement timeout's reach)."""

Told = tuple["RunRecord | None", "RunRecord | None"]
"""The fleet's latest finished run and latest success of a job, as a claim's answer told."""


@dataclass(frozen=True, slots=True)
class ClaimAnswer:
    """One claim's answer: ``refusal`` ``None`` means granted, on session ``generation``.

    ``told``: for a refused claim with the ledger, the job's latest finished run at or
    before the slot (and it again as the latest success when it succeeded), else ``None``.
    """

    refusal: Refusal | None
    generation: int
    told: Told | None = None


class _Claim:
    __slots__ = ("future", "job", "key", "slot")

    def __init__(self, job: str, key: int, slot: datetime, future: asyncio.Future[Any]) -> None:
        self.job, self.key, self.slot, self.future = job, key, slot, future


class _End:
    __slots__ = (
        "error",
        "future",
        "generation",
        "job",
        "key",
        "outcome",
        "slot",
        "started",
        "undo",
    )

    def __init__(
        self,
        job: str,
        key: int,
        slot: datetime,
        generation: int,
        record: RunRecord | None,
        undo: bool,
        future: asyncio.Future[Any],
    ) -> None:
        self.job, self.key, self.slot, self.generation = job, key, slot, generation
        self.outcome = None if record is None else record.outcome
        self.error = None if record is None else record.error
        self.started = None if record is None else record.started_at
        self.undo, self.future = undo, future


class Batcher:
    """The claims and ends of runs waiting to go to one lock *session*, and their flush.

    *exclusion* gives the statements of the locker's mode (:mod:`._exclusion`); ``None`` is
    lock-only mode (bare try-locks and unlocks). *host* is written to the ledger with each
    claim. :attr:`batches` and :attr:`batched` count the claim and end statements sent and
    the requests they carried.
    """

    def __init__(self, session: LockSession, exclusion: Exclusion | None, host: str) -> None:
        self._session = session
        self._exclusion = exclusion
        self._host = host
        self._pid = os.getpid()
        self._claim_sql = None if exclusion is None else exclusion.claim_sql
        self._finish_sql = None if exclusion is None else exclusion.finish_sql
        self._extra = () if exclusion is None else exclusion.extra
        self._holder = () if exclusion is None else exclusion.holder_args
        # Session mode: a lease lives and dies with the session it was granted on.
        self._bound = exclusion is None or exclusion.session_bound
        ledger = None if exclusion is None else exclusion.table
        self._runs = "" if ledger is None else ledger.runs
        self._claims: list[_Claim] = []
        self._ends: list[_End] = []
        self._flush: asyncio.Task[None] | None = None
        self.batches = 0
        self.batched = 0

    # -- what callers ask --------------------------------------------------------------

    def claim(self, job: str, key: int, slot: datetime) -> asyncio.Future[ClaimAnswer]:
        """Lock (and claim) *slot* of *job* with whatever else is due on this session.

        The future fails with :class:`cronlock.LockError` when the statement failed. Its
        waiter must not cancel it (it would not know what to undo): see :mod:`._claims`.
        """
        if "\x00" in job:
            # The one value the server refuses in text: never let it fail a whole batch.
            raise LockError(f"job {job!r}: a job name cannot contain a NUL character")
        future: asyncio.Future[ClaimAnswer] = asyncio.get_running_loop().create_future()
        self._claims.append(_Claim(job, key, slot, future))
        self._kick()
        return future

    def end(
        self,
        generation: int,
        job: str,
        key: int,
        slot: datetime,
        record: RunRecord | None,
        *,
        undo: bool = False,
    ) -> asyncio.Future[bool] | None:
        """Record *record* (or undo the claim) and unlock, with whatever else ended: the
        future of the answer (False: the statement failed, and the session was terminated,
        which releases the lock server-side), or ``None`` when the session of *generation*
        is gone, the lock with it (a release awaits it with no task of its own)."""
        if self._bound and (generation != self._session.generation or self._session.conn is None):
            return None
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._ends.append(_End(job, key, slot, generation, record, undo, future))
        self._kick()
        return future

    async def wait_idle(self) -> None:
        """Wait until nothing is in flight or waiting (at close); never interrupts a flush."""
        while (flush := self._flush) is not None:
            await finish_uncancellably(asyncio.wait((flush,)))

    # -- the flush -----------------------------------------------------------------------

    def _kick(self) -> None:
        if self._flush is None:
            # The flush starts at the next turn of the loop: everything asked in this
            # turn (the runs started for one instant) goes in its first statement.
            self._flush = asyncio.create_task(self._flushing(), name=task_name("pg-batch"))

    async def _flushing(self) -> None:
        sending: Sequence[_Claim | _End] = ()  # the batch whose statement is in flight
        try:
            in_a_row = 0  # claim statements sent since the last end statement
            while self._ends or self._claims:
                # Claims first: a claim stands between a due slot and the start of its run,
                # an end only between a finished run and its unlock. Ends wait behind at
                # most two claim statements in a row, so claims cannot starve them.
                if self._claims and (not self._ends or in_a_row < 2):
                    claims, self._claims = self._claims[:MAX_BATCH], self._claims[MAX_BATCH:]
                    sending = claims
                    in_a_row += 1
                    await self._send_claims(claims)
                else:
                    ends, self._ends = self._ends[:MAX_BATCH], self._ends[MAX_BATCH:]
                    sending = ends
                    in_a_row = 0
                    await self._send_ends(ends)
                sending = ()
        except BaseException as exc:
            # Only a cancellation (the event loop closing) gets here: nobody may be left
            # waiting on an answer that will never come, the batch in flight included.
            failure = LockError(f"the lock session's batch was interrupted: {exc!r}")
            for request in (*sending, *self._ends, *self._claims):
                if not request.future.done():
                    request.future.set_exception(failure)
            self._ends, self._claims = [], []
            conn = self._session.conn
            if sending and conn is not None:
                # What the interrupted statement did is unknown (it may have taken locks,
                # or not released them): only ending the session makes sure of it.
                self._session.drop(conn, reason=f"its batch was interrupted: {exc!r}")
            raise
        finally:
            self._flush = None

    async def _send_claims(self, claims: list[_Claim]) -> None:
        try:
            answers = await self._claim_reconnecting(claims)
        except Exception as exc:
            for claim in claims:
                if not claim.future.done():
                    claim.future.set_exception(_for_job(exc, claim.job))
            return
        for claim, answer in zip(claims, answers, strict=True):
            if not claim.future.done():
                claim.future.set_result(answer)

    async def _claim_reconnecting(self, claims: list[_Claim]) -> list[ClaimAnswer]:
        session = self._session
        conn, generation = await session.ensure()
        try:
            return await self._claim_once(conn, generation, claims)
        except LockError as exc:
            if isinstance(exc.__cause__, TimeoutError):
                raise  # a slow server: retrying would only double the wait
        # The session died under us (killed, network cut, server restart). Its locks died
        # with it, so one attempt on a fresh session is safe.
        _logger.info(
            "lock session lost during a claim of %d job(s); reconnecting",
            len(claims),
            extra=_about([(claim.job, claim.slot) for claim in claims]),
        )
        conn, generation = await session.ensure()
        return await self._claim_once(conn, generation, claims)

    async def _claim_once(
        self, conn: Any, generation: int, claims: list[_Claim]
    ) -> list[ClaimAnswer]:
        self.batches += 1
        self.batched += len(claims)
        keys = [claim.key for claim in claims]
        run = self._session.run
        with backend_errors("the claim statement failed", session_lost="the lock session was lost"):
            if self._claim_sql is None:
                rows = await run(
                    conn, generation, lambda c: c.fetch(TRY_LOCK_MANY_SQL, keys), what="try-lock"
                )
                answers = [ClaimAnswer(None, generation)] * len(claims)
                for row in rows:
                    if not row["got"]:
                        answers[row["i"] - 1] = ClaimAnswer("locked", generation)
                return answers
            jobs = [claim.job for claim in claims]
            slots = [claim.slot for claim in claims]
            sql, host, pid, extra = self._claim_sql, self._host, self._pid, self._extra
            rows = await run(
                conn,
                generation,
                lambda c: c.fetch(sql, keys, jobs, slots, host, pid, *extra),
                what="claim",
            )
        answers = [ClaimAnswer(None, generation)] * len(claims)
        for row in rows:
            if row["started_at"] is not None:
                continue
            claim = claims[row["i"] - 1]
            if not self._bound and row["stray"]:
                # Lease mode: a lease taken for a slot claimed meanwhile goes straight back.
                self.end(generation, claim.job, claim.key, claim.slot, None, undo=True)
            refusal: Refusal
            if row["paused"]:
                refusal = "paused"
            else:
                refusal = "already_ran" if row["ran"] or row["got"] else "locked"
            told: Told = (None, None)
            if row["p_slot"] is not None:
                last = decode_run(Prefixed(row, "p_"), table=self._runs, job=claim.job)
                if last is not None:
                    told = (last, last if last.outcome == "succeeded" else None)
            answers[row["i"] - 1] = ClaimAnswer(refusal, generation, told)
        return answers

    async def _send_ends(self, ends: list[_End]) -> None:
        session = self._session
        if not self._bound:
            # Lease mode: the leases live in the ledger, not in a session. An end goes out
            # on whatever connection is open now (opened if need be).
            try:
                conn, generation = await session.ensure()
            except LockError:
                conn, generation = None, session.generation
            current = [] if conn is None else ends
            for end in ends if conn is None else ():
                _settle(end.future, False)  # written later, with the lease's release
        else:
            conn, generation = session.conn, session.generation
            current = [end for end in ends if end.generation == generation and conn is not None]
            for end in ends:
                if end.generation != generation or conn is None:
                    _settle(end.future, False)  # that session died: the server unlocked
        if not current:
            return
        self.batches += 1
        self.batched += len(current)
        keys = [end.key for end in current]
        run = session.run
        try:
            if self._finish_sql is None:
                if len(current) == 1:  # the plain statement: the same cost, less to parse
                    released = await run(
                        conn, generation, lambda c: c.fetchval(UNLOCK_SQL, keys[0]), what="unlock"
                    )
                    rows = [{"i": 1, "released": released}]
                else:
                    rows = await run(
                        conn, generation, lambda c: c.fetch(UNLOCK_MANY_SQL, keys), what="unlock"
                    )
            else:
                sql = self._finish_sql
                args = (
                    [end.job for end in current],
                    [end.slot for end in current],
                    [end.outcome for end in current],
                    [end.error for end in current],
                    keys,
                    [end.undo for end in current],
                    self._host,
                    self._pid,
                    [end.started for end in current],
                    *self._holder,
                )
                rows = await run(conn, generation, lambda c: c.fetch(sql, *args), what="finish")
        except SessionGone:
            for end in current:
                _settle(end.future, False)  # the session died: the server released them
            return
        except backend_error_types() as exc:
            _logger.warning(
                "unlock of %s failed (%r); the lock session was terminated, which releases "
                "the locks server-side",
                sorted({end.job for end in current}),
                exc,
                extra=_about([(end.job, end.slot) for end in current]),
            )
            for end in current:
                _settle(end.future, False)
            return
        for row in rows:
            end = current[row["i"] - 1]
            if not row["released"] and (self._bound or not end.undo):
                _logger.warning(
                    "job %r: its %s was no longer held at %s",
                    end.job,
                    "lock" if self._bound else "lease",
                    "unlock" if self._bound else "release (it expired first)",
                    extra=at(end.job, end.slot),
                )
            _settle(end.future, True)


def _about(items: list[tuple[str, datetime]]) -> dict[str, object]:
    """The record attributes of a record about a batch: its job and slot when it holds
    one, none (``None``) for several."""
    return at(*items[0]) if len(items) == 1 else at(None)


def _settle(future: asyncio.Future[Any], value: object) -> None:
    if not future.done():  # a caller cancelled out of a release (shutdown) gave up on it
        future.set_result(value)


def _for_job(exc: Exception, job: str) -> Exception:
    """*exc* as the failure of *job*'s claim: a LockError naming the job, same cause."""
    if isinstance(exc, LockError):
        failure = type(exc)(f"job {job!r}: {exc}")
        failure.__cause__ = exc.__cause__
        return failure
    return exc
