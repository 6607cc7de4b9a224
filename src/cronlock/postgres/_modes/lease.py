"""Lease mode: the renewal of a replica's leases, and the fence that ends a run in time.

A lease expires in the server's time, *lease* seconds after it was last taken or renewed.
One task per locker renews every lease it holds in **one** statement every ``lease / 4``
seconds, however many runs are in flight (:func:`._leasesql.renew_sql`).

**The fence.** A replica that cannot renew (partitioned, its server unreachable, its process
frozen) must stop running before its lease could pass to another replica. Each lease is
trusted until ``sent + lease - margin`` on this process's monotonic clock, where *sent* is
when the claim or the last successful renewal was **sent**: the server stamped the expiry
after that instant, so it lies at least *lease* seconds after it, and the margin
(``lease / 4``) covers the time a run needs to be cancelled. When that instant passes, the
lease is marked lost, and the scheduler cancels its run (event ``LockLost``), exactly as a
dropped session does in session mode. A lease the renewal found expired or taken over is
lost at once.

A frozen process is fenced too: when it wakes, its loop runs this task's timer before it
could send any statement, so a run never goes on past its lease unnoticed. What no fence
can stop is code that never yields to the event loop (a blocking call in a job).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from logging import WARNING
from typing import TYPE_CHECKING

from ..._cancel import cancel_and_wait, task_name
from ..._errors import LockError
from ..._logs import get_logger, say
from .._conn.dedicated import LockSession
from .._conn.errors import backend_errors
from .._locker.hold import PostgresHold
from .._sql.leases import renew_sql
from .._sql.tables import LedgerTable

if TYPE_CHECKING:
    from .exclusion import Exclusion

__all__ = ("LeaseKeeper",)

_logger = get_logger("cronlock.postgres")


class LeaseKeeper:
    """Renews one locker's leases on its *session* and fences them (see the module).

    The locker tells it of each lease :meth:`granted` and :meth:`released`; *lost* is
    called with each lease this keeper marks lost (for the locker's counters).
    """

    def __init__(
        self,
        session: LockSession,
        table: LedgerTable,
        *,
        holder: str,
        lease: float,
        lost: Callable[[PostgresHold], None],
    ) -> None:
        self._session = session
        self._sql = renew_sql(table)
        self._holder = holder
        self._lease = lease
        self._every = lease / 4
        self._margin = lease / 4
        self._lost = lost
        self._trusted: dict[PostgresHold, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.renewals = 0
        """Renewal statements sent."""
        self.fenced = 0
        """Leases marked lost because they could not be renewed in time."""

    @classmethod
    def of(
        cls,
        exclusion: Exclusion | None,
        session: LockSession,
        *,
        holder: str,
        lost: Callable[[PostgresHold], None],
    ) -> LeaseKeeper | None:
        """The keeper of a locker whose exclusion is *exclusion*: ``None`` but in lease mode."""
        if exclusion is None or exclusion.mode != "lease" or exclusion.table is None:
            return None
        return cls(session, exclusion.table, holder=holder, lease=exclusion.lease, lost=lost)

    def granted(self, lease: PostgresHold, sent: float) -> None:
        """*lease* was granted by a claim sent at loop time *sent*: trust it until the fence."""
        self._trusted[lease] = sent + self._lease - self._margin
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._keep(), name=task_name("pg-renew")
            )
        self._wake.set()

    def released(self, lease: PostgresHold) -> None:
        """*lease* is being released: no more renewals, no fence."""
        self._trusted.pop(lease, None)

    async def stop(self) -> None:
        """Cancel the task and wait until it is done (at close)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    def _fence(self, now: float) -> None:
        for lease, until in list(self._trusted.items()):
            if until <= now:
                self._lose(lease, "it could not be renewed in time (fenced before it expires)")

    def _lose(self, lease: PostgresHold, why: str) -> None:
        self._trusted.pop(lease, None)
        if lease.lost:
            return
        self.fenced += 1
        say(_logger, WARNING, lease.job, lease.slot, f"the lease is lost: {why}")
        lease.mark_lost(LockError(f"job {lease.job!r}: its lease is lost: {why}"))
        self._lost(lease)

    async def _keep(self) -> None:
        """Owned by the locker: from its first lease to its close.

        The renewal statement runs in a task of its own: a statement stuck on a frozen
        network (until its statement timeout) must not hold the fence back.
        """
        loop = asyncio.get_running_loop()
        next_renewal = loop.time() + self._every
        renewal: asyncio.Task[None] | None = None
        try:
            while True:
                now = loop.time()
                self._fence(now)
                if now >= next_renewal and (renewal is None or renewal.done()):
                    next_renewal = now + self._every
                    if self._trusted:
                        renewal = loop.create_task(
                            self._renew(), name=task_name("pg-renew-statement")
                        )
                        renewal.add_done_callback(lambda _: self._wake.set())
                wake_at = min((next_renewal, *self._trusted.values()))
                self._wake.clear()
                try:
                    async with asyncio.timeout(max(0.0, wake_at - loop.time())):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            if renewal is not None:
                await cancel_and_wait(renewal)

    async def _renew(self) -> None:
        leases = [lease for lease in self._trusted if not lease.lost]
        if not leases:
            return
        loop = asyncio.get_running_loop()
        sent = loop.time()
        jobs = [lease.job for lease in leases]
        slots = [lease.slot for lease in leases]
        session, sql = self._session, self._sql
        self.renewals += 1
        try:
            conn, generation = await session.ensure()
            with backend_errors("renewing the leases failed"):
                rows = await session.run(
                    conn,
                    generation,
                    lambda c: c.fetch(sql, jobs, slots, self._holder, self._lease),
                    what="renewing leases",
                    keep_on_server_error=True,
                )
        except LockError as exc:
            _logger.info("renewing %d lease(s) failed: %s; trying again", len(leases), exc)
            return
        renewed = {row["job"] for row in rows}
        for lease in leases:
            if lease not in self._trusted:
                continue  # released meanwhile
            if lease.job in renewed:
                self._trusted[lease] = sent + self._lease - self._margin
            else:
                self._lose(lease, "it had expired, or another replica holds it now")
