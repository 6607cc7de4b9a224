"""What a PostgresLocker hands out: the hold on one slot."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from ..._cancel import finish_uncancellably
from ..._errors import LockError
from ..._locking.protocols import BoundedRelease, GoneHolder
from .._modes.base import FENCED

if TYPE_CHECKING:
    from ..._records import RunRecord
    from .claims import Claims

__all__ = ("PostgresHold",)


class PostgresHold(BoundedRelease):
    """The lock of one job for one slot, held on the locker's session for that job.

    Made by :meth:`PostgresLocker.acquire`: *claims* are the statements of the job's shard,
    *generation* the session generation the lock was granted on, and *on_released* is
    called once the release is over, with the outcome the release could not write (its
    session was gone) or ``None``. *attempt* is 2 for the rerun of a crashed run.
    """

    __slots__ = (
        "_claims",
        "_done",
        "_generation",
        "_gone",
        "_lost",
        "_lost_because",
        "_on_released",
        "_record",
        "_watchers",
        "attempt",
        "job",
        "key",
        "slot",
        "trusted_until",
    )

    def __init__(
        self,
        job: str,
        key: int,
        slot: datetime,
        *,
        claims: Claims,
        generation: int,
        on_released: Callable[[PostgresHold, RunRecord | None], None],
        attempt: int = 1,
        gone: GoneHolder | None = None,
    ) -> None:
        self.job = job
        self._gone = gone
        self.attempt = attempt
        self.key = key
        self.slot = slot
        self._claims = claims
        self._generation = generation
        self._on_released = on_released
        self._lost = False
        self._lost_because: BaseException | None = None
        self._watchers: list[Callable[[BaseException | None], None]] = []
        self._record: RunRecord | None = None
        self._done = False
        self.trusted_until = math.inf
        """Loop time until which the hold may be trusted without a word from the server (a
        lease's fence, set by the mode's keeper; infinite for a session's lock)."""

    @property
    def lost(self) -> bool:
        """Whether the session holding this lock died; the server has then released it."""
        return self._lost

    @property
    def recorded(self) -> RunRecord | None:
        """The run's outcome, once :meth:`record` kept it."""
        return self._record

    def record(self, record: RunRecord) -> None:
        """Keep the run's outcome; :meth:`release` writes it to the ledger with the unlock."""
        self._record = record

    def on_lost(self, callback: Callable[[BaseException | None], None]) -> bool:
        """Call *callback* once, from the event loop, if the lock is lost before release;
        return whether it is lost already.

        It receives a :class:`cronlock.LockError` saying why. Registered after the loss, it
        is called soon; after :meth:`release` has started, never.
        """
        if self._done:
            return False
        loop = asyncio.get_running_loop()
        if not self._lost and loop.time() >= self.trusted_until:
            # Its fence passed, and the keeper's timer has not told it yet: a process that
            # wakes from a freeze runs due callbacks in any order, and a run claimed ahead
            # must not begin on a lease another replica may hold by now.
            self.mark_lost(LockError(f"job {self.job!r}: its lease is lost: {FENCED}"))
        if self._lost:
            loop.call_soon(callback, self._lost_because)
            return True
        self._watchers.append(callback)
        return False

    def mark_lost(self, because: BaseException) -> None:
        """Note that the session holding this lock was dropped; called by the locker.

        The :meth:`on_lost` callbacks then run with *because*, unless the release started.
        """
        self._lost = True
        self._lost_because = because
        watchers, self._watchers = self._watchers, []
        if self._done:
            return  # being released: nobody is running under this lock any more
        loop = asyncio.get_running_loop()
        for callback in watchers:
            loop.call_soon(callback, because)

    async def release(self) -> None:
        """Record the outcome (with a ledger) and unlock, in one bounded round trip.

        Releasing twice, or releasing a lost hold, does nothing on the lock; a lost
        hold's outcome is written to the ledger later, once a session is back. Never
        raises a backend error: when the statement cannot complete the session is
        terminated, which releases the lock server-side. A cancellation that arrives
        meanwhile is re-raised afterwards.
        """
        if self._done:
            return
        self._done = True
        end = None
        if not self._lost:
            end = self._claims.batcher.end(
                self._generation, self.job, self.key, self.slot, self._record
            )
        if end is None:
            # The session is gone, and the lock with it; the outcome is still worth
            # keeping: the locker writes it once a session is back.
            self._on_released(self, self._record)
            return
        # Awaited with no task of its own (runs end in thousands at once): the batch's
        # answer tells this hold first, then wakes us, however often we were cancelled.
        end.add_done_callback(self._ended)
        await finish_uncancellably(end)

    def _ended(self, end: asyncio.Future[bool]) -> None:
        # Only now may this process take the job again: before the unlock finished the
        # session still held the key, and re-acquiring would just bump its count.
        # False: the session died first (with the lock); the outcome is written later.
        gone = not end.cancelled() and end.exception() is None and not end.result()
        self._on_released(self, self._record if gone else None)

    def took_over(self) -> GoneHolder | None:
        """The holder that let this job's lease lapse unreleased mid-run, when this hold's
        claim took the lease over from it (lease mode), else ``None``."""
        return self._gone

    def __repr__(self) -> str:
        state = "released" if self._done else "lost" if self._lost else "held"
        return f"<PostgresHold {self.job!r} slot={self.slot.isoformat()} {state}>"
