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
import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..._cancel import finish_uncancellably, task_name
from ..._errors import LockError, LockUnavailable
from ..._locking.protocols import GoneHolder, Refusal
from ..._logs import at, get_logger
from .._conn.errors import gone
from .._sql.runs import Prefixed, decode_run

if TYPE_CHECKING:
    from ..._records import RunRecord
    from .._conn import Channel
    from .._modes.base import Exclusion

__all__ = ("MAX_BATCH", "Batcher", "ClaimAnswer", "Told", "held_back")

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
    ``gone``: for a granted claim that took the job's lease over from a holder that let it
    lapse mid-run (lease mode), that holder, else ``None``.
    """

    refusal: Refusal | None
    generation: int
    told: Told | None = None
    gone: GoneHolder | None = None


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

    *exclusion* gives the statements and rules of the locker's mode
    (:class:`.._modes.base.Exclusion`). *host* is written to the ledger with each claim.
    :attr:`batches` and :attr:`batched` count the claim and end statements sent and the
    requests they carried.
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
        # Seconds a slot's claim must wait still (a new primary was just noticed, on the
        # connection the claims are about to go out on: _locker/failover.py), or None.
        self._held_back = held_back
        self._pid = os.getpid()
        self._runs = exclusion.ledger_or(str, lambda t: t.runs)  # named in what decoding logs
        self._claims: list[_Claim] = []
        self._ends: list[_End] = []
        self._flush: asyncio.Task[None] | None = None
        # Claims sent on a session that died before they were answered: each may have
        # committed, its row then standing for a run that never began. Given back
        # (Exclusion.undo_lost) before the slot is claimed again; bounded.
        self._in_doubt: dict[tuple[str, datetime], None] = {}
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
        if not self._exclusion.may_end(generation, self._session):
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
            conn = self._session.conn
            if self._in_doubt and conn is not None:  # on the session open now, if it is
                with contextlib.suppress(LockError):  # (else: before the next claim)
                    await self._undo_lost(conn, self._session.generation)
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
            answered = await self._claim_reconnecting(claims)
        except Exception as exc:
            for claim in claims:
                if not claim.future.done():
                    claim.future.set_exception(_for_job(exc, claim.job))
            return
        for claim, answer in answered:
            if not claim.future.done():
                claim.future.set_result(answer)

    def _hold_back(self, claims: list[_Claim]) -> list[_Claim]:
        """The claims that may go out now; the others fail with LockUnavailable (their
        slots are owed: the run loop claims them again)."""
        sent = []
        for claim in claims:
            wait = self._held_back(claim.slot)
            if wait is None:
                sent.append(claim)
            elif not claim.future.done():
                claim.future.set_exception(held_back(claim.job, claim.slot, wait))
        return sent

    async def _claim_reconnecting(self, claims: list[_Claim]) -> list[tuple[_Claim, ClaimAnswer]]:
        session = self._session
        conn, generation = await session.ensure()
        claims = self._hold_back(claims)
        try:
            return await self._claim_once(conn, generation, claims)
        except LockError as exc:
            # Sent, unanswered: each claim may have committed (the answer lost with it).
            self._doubt(claims)
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
        again = self._hold_back(claims)
        try:
            return await self._claim_once(conn, generation, again)
        except LockError:
            self._doubt(again)
            raise

    def _doubt(self, claims: list[_Claim]) -> None:
        for claim in claims:
            self._in_doubt[claim.job, claim.slot] = None
        while len(self._in_doubt) > _DOUBTS_KEPT:
            del self._in_doubt[next(iter(self._in_doubt))]

    def settle_doubts(self) -> None:
        """A session is open again: give back the claims in doubt now (not only when their
        slots are claimed again, which may be never: a slot owed coalesces into a later one)."""
        if self._in_doubt:
            self._kick()

    async def _undo_lost(self, conn: Any, generation: int) -> None:
        """Give back the claims that went out unanswered (each may have committed: its row
        would stand for a run that never began, and its slot, claimed again, be refused as
        run already), so that their slots are claimed afresh, or coalesce truly."""
        doubtful = list(self._in_doubt)
        jobs, slots = [job for job, _ in doubtful], [slot for _, slot in doubtful]
        statement = self._exclusion.undo_lost(jobs, slots, self._host, self._pid)
        if statement is not None:
            undone = await self._session.run(
                conn,
                generation,
                lambda c: c.fetchval(statement.sql, *statement.args),
                what="giving back claims whose answer was lost",
                urgent=True,
            )
            if undone:
                _logger.info(
                    "%d claim(s) whose answer was lost had reached the ledger: given back",
                    undone,
                    extra=_about(doubtful),
                )
        for key in doubtful:
            self._in_doubt.pop(key, None)

    async def _claim_once(
        self, conn: Any, generation: int, claims: list[_Claim]
    ) -> list[tuple[_Claim, ClaimAnswer]]:
        if not claims:
            return []
        if self._in_doubt:
            await self._undo_lost(conn, generation)
        self.batches += 1
        self.batched += len(claims)
        keys = [claim.key for claim in claims]
        run = self._session.run
        jobs = [claim.job for claim in claims]
        slots = [claim.slot for claim in claims]
        statement = self._exclusion.claim(keys, jobs, slots, self._host, self._pid)
        rows = await run(
            conn,
            generation,
            lambda c: c.fetch(statement.sql, *statement.args),
            what="the claim statement",
            urgent=True,
        )
        answers = [ClaimAnswer(None, generation)] * len(claims)
        for row in rows:
            if row["started_at"] is not None:
                if row.get("gone_slot") is not None:  # taken over from a holder gone
                    gone = GoneHolder(
                        row["gone_slot"], row["gone_holder"], row["gone_expired"],
                        row["gone_since"], how=self._exclusion.gone_hold,
                    )  # fmt: skip
                    answers[row["i"] - 1] = ClaimAnswer(None, generation, gone=gone)
                continue
            claim = claims[row["i"] - 1]
            if self._exclusion.stray(row):
                # A lease taken for a slot claimed meanwhile goes straight back.
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
        return list(zip(claims, answers, strict=True))

    async def _send_ends(self, ends: list[_End]) -> None:
        session, exclusion = self._session, self._exclusion
        where = await exclusion.end_on(session)
        current = (
            [] if where is None else [e for e in ends if exclusion.may_end(e.generation, session)]
        )
        for end in ends:
            if where is None or not exclusion.may_end(end.generation, session):
                # Its session died (and the server unlocked), or none can be had now (the
                # outcome is written later, with the lease's release).
                _settle(end.future, False)
        if where is None or not current:
            return
        conn, generation = where
        self.batches += 1
        self.batched += len(current)
        statement = exclusion.finish(current, self._host, self._pid)
        try:
            rows = await session.run(
                conn, generation, lambda c: c.fetch(statement.sql, *statement.args), what="finish"
            )
        except LockError as exc:
            if gone(exc):
                for end in current:
                    _settle(end.future, False)  # the session died: the server released them
                return
            _logger.warning(
                "the end of the runs of %s failed (%r); %s",
                sorted({end.job for end in current}),
                exc,
                exclusion.end_failed,
                extra=_about([(end.job, end.slot) for end in current]),
            )
            for end in current:
                _settle(end.future, False)
            return
        for row in rows:
            end = current[row["i"] - 1]
            if not row["released"] and (why := exclusion.unreleased(end)) is not None:
                _logger.warning("job %r: %s", end.job, why, extra=at(end.job, end.slot))
            _settle(end.future, True)


def _about(items: list[tuple[str, datetime]]) -> dict[str, object]:
    """The record attributes of a record about a batch: its job and slot when it holds
    one, none (``None``) for several."""
    return at(*items[0]) if len(items) == 1 else at(None)


def _settle(future: asyncio.Future[Any], value: object) -> None:
    if not future.done():  # a caller cancelled out of a release (shutdown) gave up on it
        future.set_result(value)


_DOUBTS_KEPT = 4096
"""Claims in doubt (sent, unanswered) a batcher remembers; older ones are forgotten."""


def held_back(job: str, slot: datetime, wait: float) -> LockUnavailable:
    """The failure of a claim of *slot* held back *wait* seconds after a new primary."""
    return LockUnavailable(
        f"job {job!r} slot {slot.isoformat()}: due before a new primary was found; "
        f"claimed again in {wait:.1f}s, once every replica wrote back what the failover lost"
    )


def _for_job(exc: Exception, job: str) -> Exception:
    """*exc* as the failure of *job*'s claim: a LockError naming the job, same cause."""
    if isinstance(exc, LockError):
        failure = type(exc)(f"job {job!r}: {exc}")
        failure.__cause__ = exc.__cause__
        return failure
    return exc
