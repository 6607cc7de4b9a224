"""What a PostgresLocker hands out and reports: the lease of one slot, and its counters."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from .._cancel import uncancellable

if TYPE_CHECKING:
    from .._records import RunRecord
    from ._claims import Claims

__all__ = ("PostgresLease", "PostgresLockerStatistics")


@dataclass(frozen=True, slots=True)
class PostgresLockerStatistics:
    """Counters of one :class:`PostgresLocker`, from :meth:`PostgresLocker.statistics`."""

    held: int
    """Leases currently held (lost ones included until they are released)."""
    granted: int
    """Slots granted (locked, and claimed in the ledger) since the locker was created."""
    contended: int
    """Acquires refused ``"locked"`` because another session (replica) holds the lock."""
    busy_here: int
    """Acquires refused in-process: the job is running here, or the slot was claimed."""
    released: int
    """Leases released."""
    lost: int
    """Leases whose session died (or was terminated) while they were held."""
    sessions_opened: int
    """Lock sessions opened: one per shard used, plus one per reconnect."""
    session_open: bool
    """Whether any lock session is open right now."""
    already_ran: int = 0
    """Acquires refused ``"already_ran"`` by the ledger: another replica claimed the slot."""
    statements: int = 0
    """Statements (round trips) sent on the lock sessions, heartbeats and upkeep included."""
    heartbeats: int = 0
    """Heartbeat checks sent while leases were held and their session was otherwise idle."""
    sessions: int = 1
    """Lock sessions (shards) the locker may open: its *sessions* option."""
    sessions_open: int = 0
    """Lock sessions open right now (each is opened on first use by a job of its shard)."""
    connect_attempts: int = 0
    """Connections the lock sessions tried to open, failed ones included. While the server
    is down each session tries again only after a growing wait (backoff), however many
    acquires come in meanwhile."""
    connect_failures: int = 0
    """Connect attempts of the lock sessions that failed."""


class PostgresLease:
    """The lock of one job for one slot, held on the locker's session for that job.

    Made by :meth:`PostgresLocker.acquire`: *claims* are the statements of the job's shard,
    *generation* the session generation the lock was granted on, and *on_released* is
    called once the release is over, with the outcome the release could not write (its
    session was gone) or ``None``.
    """

    __slots__ = (
        "_claims",
        "_done",
        "_generation",
        "_lost",
        "_lost_because",
        "_on_released",
        "_record",
        "_watchers",
        "job",
        "key",
        "slot",
    )

    def __init__(
        self,
        job: str,
        key: int,
        slot: datetime,
        *,
        claims: Claims,
        generation: int,
        on_released: Callable[[PostgresLease, RunRecord | None], None],
    ) -> None:
        self.job = job
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

    @property
    def lost(self) -> bool:
        """Whether the session holding this lock died; the server has then released it."""
        return self._lost

    def record(self, record: RunRecord) -> None:
        """Keep the run's outcome; :meth:`release` writes it to the ledger with the unlock."""
        self._record = record

    def on_lost(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call *callback* once, from the event loop, if the lock is lost before release.

        It receives a :class:`cronlock.LockError` saying why. Registered after the loss, it
        is called soon; after :meth:`release` has started, never.
        """
        if self._done:
            return
        if self._lost:
            asyncio.get_running_loop().call_soon(callback, self._lost_because)
        else:
            self._watchers.append(callback)

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

        Releasing twice, or releasing a lost lease, does nothing on the lock; a lost
        lease's outcome is written to the ledger later, once a session is back. Never
        raises a backend error: when the statement cannot complete the session is
        terminated, which releases the lock server-side. A cancellation that arrives
        meanwhile is re-raised afterwards.
        """
        if self._done:
            return
        self._done = True
        await uncancellable(self._finish(), name=f"cronlock.postgres.release[{self.job}]")

    async def _finish(self) -> None:
        unwritten: RunRecord | None = None
        try:
            if self._lost or not await self._claims.release(
                self._generation, self.job, self.key, self.slot, self._record
            ):
                # The session is gone, and the lock with it; the outcome is still worth
                # keeping: the locker writes it once a session is back.
                unwritten = self._record
        finally:
            # Only now may this process take the job again: before the unlock finished the
            # session still held the key, and re-acquiring would just bump its count.
            self._on_released(self, unwritten)

    def __repr__(self) -> str:
        state = "released" if self._done else "lost" if self._lost else "held"
        return f"<PostgresLease {self.job!r} slot={self.slot.isoformat()} {state}>"
