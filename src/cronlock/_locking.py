"""The plug-in points for coordination (Locker, Lease, Elector) and the in-memory locker."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from ._records import RunRecord

__all__ = (
    "Elector",
    "FencedElector",
    "InMemoryLocker",
    "Lease",
    "LedgerLocker",
    "Locker",
    "LosableLease",
    "RecordingLease",
    "Refusal",
)

_logger = logging.getLogger("cronlock.lock")


@runtime_checkable
class Lease(Protocol):
    """Proof that this process holds one job's lock for one slot."""

    async def release(self) -> None:
        """Give the lock back. Called exactly once by the scheduler, even on cancellation."""
        ...


Refusal = Literal["locked", "already_ran"]
"""Why a locker declined a slot: another holder has the job's lock, or the slot already ran."""


@runtime_checkable
class Locker(Protocol):
    """Claims the right to run one slot of one job across processes or replicas."""

    async def acquire(self, job: str, slot: datetime) -> Lease | Refusal | None:
        """Return a lease when this caller may run *slot* of *job*, else why not.

        ``None`` or ``"locked"``: another holder has the job's lock, the normal case on every
        replica but one. ``"already_ran"``: the slot was claimed before (lockers that keep a
        record of slots). A backend failure raises :class:`cronlock.LockError`.
        """
        ...


@runtime_checkable
class RecordingLease(Lease, Protocol):
    """A lease that stores the run's outcome (a run ledger) when it is released."""

    def record(self, record: RunRecord) -> None:
        """Remember how the run went; the scheduler calls it just before :meth:`release`."""
        ...


@runtime_checkable
class LosableLease(Lease, Protocol):
    """A lease that can tell when its lock was lost while the run was going on."""

    def on_lost(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call *callback* (once, from the event loop) if the lock is lost before release.

        Losing the lock (session killed, network cut, server restart) means mutual exclusion
        no longer holds; the scheduler cancels the run by default (event ``LockLost``).
        """
        ...


@runtime_checkable
class LedgerLocker(Locker, Protocol):
    """A locker with a durable record of claimed slots, shared by every replica.

    With one, the scheduler catches up after downtime (the first replica up runs a missed
    slot once, within ``misfire_grace``) and ``Job.last_run`` / ``last_success`` are
    fleet-wide.
    """

    async def last_claimed(self, job: str) -> datetime | None:
        """The latest slot of *job* any replica claimed, or ``None`` if none is recorded."""
        ...

    async def last_runs(self, job: str) -> tuple[RunRecord | None, RunRecord | None]:
        """The latest finished run of *job* on any replica, and the latest successful one."""
        ...

    async def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The latest *limit* runs of *job*, newest first (unfinished ones included)."""
        ...

    # Optional, looked up with getattr: ``note_schedule(job, schedule, next_run) -> None``,
    # called (synchronously, on the hot path: no I/O) whenever a replica computes a job's
    # next slot, so a ledger can show schedules and next slots in status views.


@runtime_checkable
class Elector(Protocol):
    """Tells whether this replica is the leader, the only one that runs coordinated jobs."""

    async def is_leader(self) -> bool:
        """Return ``True`` when this replica currently leads."""
        ...


@runtime_checkable
class FencedElector(Elector, Protocol):
    """An elector that says when this replica stops leading, so its runs can be ended."""

    def on_demoted(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call *callback* (from the event loop) each time this replica loses leadership."""
        ...


class _MemoryLease:
    __slots__ = ("_job", "_locker", "_slot")

    def __init__(self, locker: InMemoryLocker, job: str, slot: datetime) -> None:
        self._locker = locker
        self._job = job
        self._slot = slot

    def record(self, record: RunRecord) -> None:
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
        self._held: set[str] = set()
        self._claimed: dict[str, dict[datetime, RunRecord | None]] = {}
        self._remember = remember

    async def acquire(self, job: str, slot: datetime) -> Lease | Refusal | None:
        """Claim *slot* of *job*: a lease, or ``"locked"`` / ``"already_ran"``."""
        if job in self._held:
            return "locked"
        claimed = self._claimed.setdefault(job, {})
        if slot in claimed:
            return "already_ran"
        claimed[slot] = None
        if len(claimed) > self._remember:
            del claimed[min(claimed)]
        self._held.add(job)
        return _MemoryLease(self, job, slot)

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
        """The latest *limit* finished runs of *job*, newest first."""
        runs = [r for r in self._claimed.get(job, {}).values() if r is not None]
        return sorted(runs, key=lambda r: r.slot, reverse=True)[:limit]
