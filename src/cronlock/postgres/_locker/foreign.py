"""Locks held outside the fleet: a job's key taken by a session that runs none of its slots.

Advisory locks are database-wide. A session outside this ledger's fleet may hold a job's
key: a Go service using the seed's recipe, ``locked_run`` on the same name, a cronlock
service with ``bare_keys=True`` sharing the database. Every claim of that job is then
answered ``"locked"``, and its slots are lost without any error. So a ``"locked"`` answer
sets off a look at who holds the key: at most once per job every :data:`LOOK_EVERY`
seconds, and one look every :data:`LOOK_SPACING` seconds per locker. A holder with no
unfinished run of the job in this ledger and no live lease of it, seen twice
:data:`CONFIRM_AFTER` seconds apart (a racing claimant of our own holds its lock only for
its claim statement, and its row is committed by then), is reported: a WARNING once per
job, the locker's ``foreign_holders`` counter, and the callbacks (the scheduler emits
:class:`cronlock.LockHeldElsewhere`).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from ..._cancel import task_name
from ..._locking.protocols import ForeignCallback
from ..._logs import at, get_logger
from .._conn import Channel
from .._sql.tables import LedgerTable
from .._sql.upkeep import holders_sql

__all__ = ("CONFIRM_AFTER", "LOOK_EVERY", "LOOK_SPACING", "ForeignCallback", "ForeignHolders")

_logger = get_logger("cronlock.postgres")

LOOK_EVERY = 60.0
"""Seconds between two looks at one job's lock holder, at most."""
LOOK_SPACING = 5.0
"""Seconds between two looks of one locker, whatever the job: a burst's thousands of
refusals cost one look, and claims never queue behind looks."""
CONFIRM_AFTER = 0.2
"""Seconds between the two sightings of a holder outside the fleet before it is reported."""


class ForeignHolders:
    """One locker's looks at who holds the keys of jobs it was refused (see the module)."""

    def __init__(self, table: LedgerTable, sessions: tuple[Channel, ...]) -> None:
        self._sql = holders_sql(table)
        self._sessions = sessions
        self._looked: dict[str, float] = {}
        self._reported: set[str] = set()
        self._callbacks: list[ForeignCallback] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_look = float("-inf")
        self.found = 0
        """Jobs reported held outside the fleet."""

    def on_found(self, callback: ForeignCallback) -> None:
        """Tell *callback* of each job found held outside the fleet (once per job)."""
        if callback not in self._callbacks:
            self._callbacks.append(callback)

    def refused(self, job: str, key: int, slot: datetime, session: Channel) -> None:
        """*job*'s claim of *slot* was answered "locked": look at its holder, unless that
        was done lately or reported already. No I/O here: the look is a task of its own."""
        if job in self._reported or self._tasks:
            return  # one look at a time: a burst of refusals costs one statement, not many
        now = asyncio.get_running_loop().time()
        if now < self._next_look or now - self._looked.get(job, float("-inf")) < LOOK_EVERY:
            return
        self._looked[job] = now
        self._next_look = now + LOOK_SPACING
        if len(self._looked) > 4096:
            del self._looked[next(iter(self._looked))]
        task = asyncio.create_task(
            self._look(job, key, slot, session), name=task_name("pg-foreign", job)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Cancel the looks in flight (at close)."""
        for task in tuple(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _holders(self, session: Channel, job: str, key: int) -> dict[int, str]:
        conn, generation = await session.ensure()
        rows = await session.run(
            conn,
            generation,
            lambda c: c.fetch(self._sql, key, job),
            what="looking at a lock's holder",
            keep_on_server_error=True,
        )
        return {row["pid"]: _describe(row) for row in rows}

    async def _look(self, job: str, key: int, slot: datetime, session: Channel) -> None:
        try:
            first = await self._holders(session, job, key)
            if not first:
                return  # released before we looked: the next look is LOOK_EVERY away
            await asyncio.sleep(CONFIRM_AFTER)
            second = await self._holders(session, job, key)
        except Exception as exc:  # LockError: a later refusal looks again
            _logger.debug("job %r: looking at its lock's holder failed: %r", job, exc)
            return
        still = [second[pid] for pid in first if pid in second]
        if not still or job in self._reported:
            return
        self._reported.add(job)
        self.found += 1
        holder = still[0]
        _logger.warning(
            "job %r: its lock is held by a session outside this fleet (%s), so its slots "
            "are refused ('locked') and do not run here. Advisory locks are database-wide: "
            "a session of any role that may connect to this database can take any key, and "
            "pg_locks shows every held key to every role. If that role is another service "
            "of yours that shares the job's key (a Go service using the recipe, locked_run, "
            "a cronlock service with bare_keys=True), give the services keys of their own "
            "(cronlock's default: keys namespaced by the ledger). If you do not know it, "
            "keyed lock keys do not help (the key is read, not computed): give this service "
            "a database of its own, or use mode='lease', whose exclusion is rows of the "
            "ledger that only roles with its grants can write",
            job,
            holder,
            extra=at(job, slot),
        )
        for callback in tuple(self._callbacks):
            try:
                callback(job, slot, holder)
            except Exception:
                _logger.exception("foreign-holder callback %r failed", callback, extra=at(job))


def _describe(row: Any) -> str:
    """The holder as the server knows it (backend pid, role, address), then the
    ``application_name`` it gave itself, marked as its own claim."""
    where = f" from {row['addr']}" if row["addr"] else " (local socket)"
    named = f"calls itself {row['app']!r}" if row["app"] else "no application_name"
    return f"backend pid {row['pid']}, role {row['role'] or '?'}{where}, {named}"
