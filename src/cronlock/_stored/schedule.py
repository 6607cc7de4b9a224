"""Schedules kept in a store instead of in code: what one is, and what a store offers.

An application adds, changes and removes them while it runs (``FleetControl.add_schedule``
with PostgreSQL); every replica reads the store's changes (:mod:`._storedsync`) and
registers each one as a job of the task it names (``@scheduler.task``). Once registered, a
stored schedule's job is a job like any other: the same ledger, catch-up, crash recovery,
pause and trigger, metrics and overdue verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from .._schedules.schedule import Schedule

__all__ = ("Change", "ScheduleStore", "StoredSchedule")


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """One stored schedule, as :meth:`cronlock.postgres.FleetControl.schedules` reads it.

    *name* is its job's name, *task* the name of the task it runs (``@scheduler.task``),
    *kwargs* the keyword arguments each run is given, *options* the job options stored
    with it (``timeout``, ``overlap``, ``jitter``, ``misfire_grace``, ``start_at``,
    ``stop_at``, ``tags``, ``recover``, ``alert_after``). *revision* grows with every change
    to the store; *paused* is the job's fleet-wide pause. *problems* maps each live replica
    (its holder, as the ledger's members table names it) that could not register this
    revision to why (no such task there, kwargs that do not fit the task); a replica that
    exited is left out. :attr:`problem` says it in one line. *rejected* is true when every
    live replica of the ledger gave a problem with this revision: no replica runs it
    (status ``rejected``). *unreadable* says why a row cannot be read or breaks a limit
    (written by hand: see the stored-schedules guide's limits); its schedule then never
    fires, its kwargs and options are empty, and no replica runs it.
    """

    name: str
    task: str
    schedule: Schedule
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    revision: int = 0
    paused: bool = False
    updated_at: datetime | None = None
    problems: Mapping[str, str] = field(default_factory=dict)
    rejected: bool = False
    unreadable: str | None = None

    @property
    def problem(self) -> str | None:
        """The replicas' problems with this revision in one line (``None``: none said any):
        each reason once, with the replicas that gave it; for an unreadable row none has
        said yet, why it is unreadable."""
        if not self.problems:
            return None if self.unreadable is None else f"unreadable: {self.unreadable}"
        by: dict[str, list[str]] = {}
        for replica, reason in sorted(self.problems.items()):
            by.setdefault(reason, []).append(replica)
        return "; ".join(f"{reason} ({', '.join(names)})" for reason, names in by.items())


Change = tuple[str, int, StoredSchedule | None]
"""One change of a store: a schedule's name, the revision of the change, and the schedule
as it now is (``None``: removed)."""


@runtime_checkable
class ScheduleStore(Protocol):
    """What a scheduler's locker offers when it keeps stored schedules (``PostgresLocker``).

    The scheduler reads the changes since the last revision it saw, in one call per sync
    however many schedules there are, and reports what it could not register.
    """

    async def stored_changes(self, since: int) -> tuple[int, list[Change]]:
        """The store's latest revision and every change after revision *since* (``0``:
        everything stored), oldest first, one per schedule."""
        ...

    async def report_problem(self, name: str, revision: int, problem: str) -> None:
        """Note that this replica could not register revision *revision* of *name*."""
        ...
