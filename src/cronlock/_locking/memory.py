"""The in-process locker: mutual exclusion per job and a run ledger per slot, in memory."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from .._durations import positive_int
from .._records import RunRecord
from .protocols import Hold, Refusal

__all__ = ("InMemoryLocker",)

_NO_ATTEMPTS: tuple[RunRecord, ...] = ()


class _MemoryHold:
    __slots__ = ("_attempt", "_earlier", "_job", "_locker", "_slot")

    def __init__(
        self,
        locker: InMemoryLocker,
        job: str,
        slot: datetime,
        attempt: int,
        earlier: tuple[RunRecord, ...] = _NO_ATTEMPTS,
    ) -> None:
        self._locker = locker
        self._job = job
        self._slot = slot
        self._attempt = attempt
        self._earlier = earlier  # the slot's attempts before this one, oldest first

    def record(self, record: RunRecord) -> None:
        if self._attempt > 1:
            record = dataclasses.replace(record, attempt=self._attempt, attempts=self._earlier)
        self._locker._claimed[self._job][self._slot] = record

    async def release(self) -> None:
        self._locker._held.discard(self._job)


class InMemoryLocker:
    """One process's locker: mutual exclusion per job and a run ledger per slot.

    Several schedulers in one process that share it run each slot of a job once, catch up
    on slots missed while none of them was running, and see each other's runs in
    ``Job.last_run``/``last_success``: the single-process model of what
    :class:`cronlock.postgres.PostgresLocker` does across hosts. It coordinates nothing
    across processes; use :class:`cronlock.FileLocker` on one host.

    *remember* bounds how many claimed slots are kept per job.
    """

    def __init__(self, *, remember: int = 1024) -> None:
        remember = positive_int(remember, field="remember", owner="InMemoryLocker")
        self._held: set[str] = set()
        self._claimed: dict[str, dict[datetime, RunRecord | None]] = {}
        self._remember = remember
        self._retrying: dict[tuple[str, datetime], int] = {}  # will_retry's, until claimed

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        """Claim *slot* of *job*: a hold, or ``"locked"`` / ``"already_ran"``."""
        if job in self._held:
            return "locked"
        claimed = self._claimed.setdefault(job, {})
        attempt, earlier = 1, _NO_ATTEMPTS
        if slot in claimed:
            # A retry takes the slot over only from the attempt before it, once it failed;
            # the attempt it takes over is kept in the retry's record (its ``attempts``).
            attempt = self._retrying.pop((job, slot), 0)
            before = claimed[slot]
            if not (
                before is not None
                and before.outcome in ("failed", "timed_out")
                and before.attempt == attempt - 1
            ):
                return "already_ran"
            earlier = (*before.attempts, dataclasses.replace(before, attempts=()))
        claimed[slot] = None
        if len(claimed) > self._remember:
            del claimed[min(claimed)]
        self._held.add(job)
        return _MemoryHold(self, job, slot, attempt, earlier)

    def will_retry(self, job: str, slot: datetime, attempt: int) -> None:
        """The next :meth:`acquire` of *slot* of *job* claims attempt *attempt*: granted
        only while the slot's attempt before it failed or timed out."""
        self._retrying[job, slot] = attempt

    async def last_claimed(self, job: str) -> datetime | None:
        """The latest slot of *job* claimed through this locker."""
        claimed = self._claimed.get(job)
        return max(claimed) if claimed else None

    async def last_runs(self, job: str) -> tuple[RunRecord | None, RunRecord | None]:
        """The latest finished run of *job*, and the latest successful one."""
        runs = [r for r in self._claimed.get(job, {}).values() if r is not None]
        last = max(runs, key=lambda r: r.slot, default=None)
        ok = max((r for r in runs if r.outcome == "succeeded"), key=lambda r: r.slot, default=None)
        return last, ok

    async def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The latest *limit* finished runs of *job*, newest first: one record per slot,
        its latest attempt, with the earlier ones of a retried slot in its ``attempts``."""
        runs = [r for r in self._claimed.get(job, {}).values() if r is not None]
        return sorted(runs, key=lambda r: r.slot, reverse=True)[:limit]
