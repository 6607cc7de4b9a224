"""The plug-in points for coordination (Locker, Lease, Elector) and the in-memory locker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from datetime import datetime
from typing import Literal, Protocol, TypeVar, runtime_checkable

__all__ = ("Elector", "InMemoryLocker", "Lease", "Locker", "Refusal", "finish_uncancellably")

_logger = logging.getLogger("cronlock.lock")
_T = TypeVar("_T")


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
class Elector(Protocol):
    """Tells whether this replica is the leader, the only one that runs coordinated jobs."""

    async def is_leader(self) -> bool:
        """Return ``True`` when this replica currently leads."""
        ...


async def finish_uncancellably(aw: Awaitable[_T]) -> _T:
    """Run *aw* to completion even if the calling task is cancelled, then re-raise.

    ``asyncio.shield`` alone is not enough for cleanup: the outer await raises at the first
    cancel while the inner operation goes on unobserved, and a plain ``await`` in
    ``finally`` survives one cancel but not two. So keep awaiting the shielded inner task,
    however many cancels arrive, and deliver the cancellation once it has finished.
    Bound *aw* with its own timeout: this function waits for it indefinitely.
    """
    inner = asyncio.ensure_future(aw)
    cancelled = False
    while not inner.done():
        try:
            # asyncio.wait never cancels what it waits for, unlike a bare await.
            await asyncio.wait((inner,))
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        # Deliver the cancellation we absorbed. Task.uncancel() was never called, so
        # asyncio.timeout() and TaskGroup still see the pending request and account for it.
        error = None if inner.cancelled() else inner.exception()
        raise asyncio.CancelledError from error
    return inner.result()


class _MemoryLease:
    __slots__ = ("_key", "_locker")

    def __init__(self, locker: InMemoryLocker, key: str) -> None:
        self._locker = locker
        self._key = key

    async def release(self) -> None:
        self._locker._held.discard(self._key)


class InMemoryLocker:
    """One process's locker: mutual exclusion per job and de-duplication per slot.

    Several schedulers in one process that share this locker run each slot of a job once.
    It coordinates nothing across processes; use :class:`cronlock.FileLocker` on one host
    or :class:`cronlock.postgres.PostgresLocker` across hosts.

    *remember* bounds how many claimed slots are kept per job for de-duplication.
    """

    def __init__(self, *, remember: int = 1024) -> None:
        self._held: set[str] = set()
        self._claimed: dict[str, dict[datetime, None]] = {}
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
            del claimed[next(iter(claimed))]
        self._held.add(job)
        return _MemoryLease(self, job)
