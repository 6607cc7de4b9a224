"""The fleet's membership, and which replicas claim each job: a fleet's cost that does not
grow with the fleet.

When every replica claims every slot, the server answers N claims per slot, and a fleet of
100 pods costs it twelve times what 3 do for the same runs. So the replicas of a ledger
register in its members table (one statement per replica every :data:`MEMBERS_EVERY`
seconds, which also reads the live members back), and each job is assigned, by a hash ring
over the live members, to *racers* of them (default 3): the first claims at the slot, as
every replica does today; the others :data:`BACKUP_DELAY` seconds later each (answered
``"already_ran"`` by the ledger when the first ran it, or running it when the first could
not: died, stalled, busy); every other replica stands by (``"standby"``, no statement).
A fleet of at most *racers* members races as before: every replica claims every slot.

Every replica computes the same assignment from the same member list, and a member list
seen a moment apart by two replicas only changes who claims, never the exclusion: the
ledger and the job's lock or lease still decide who runs. The price: a job whose *racers*
assigned replicas all die at once is not run until the members table forgets them (their
rows expire after :data:`MEMBER_TTL` seconds). A replica that stops deletes its row, so a
rolling deploy moves its jobs at once.

Replicas are grouped by the set of jobs they have (a digest): during a rolling deploy that
adds a job, it is assigned among the replicas that have it, never to ones that do not.

The same count scales the fleet-wide background work (:meth:`Membership.spread`): with N
members each replica polls the control table, reads the fleet's runs, checks for crashes
and writes schedule notes N / racers times less often, so the fleet as a whole sends them at
the rate of a fleet of *racers*.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import random
from collections.abc import Sequence

from .._cancel import cancel_and_wait, task_name
from .._clock import monotonic
from .._logs import get_logger
from ._backend_errors import gone_or_failed_types
from ._ledger import LedgerTable
from ._session import LockSession

__all__ = ("BACKUP_DELAY", "MEMBERS_EVERY", "MEMBER_TTL", "Membership")

_logger = get_logger("cronlock.postgres")

MEMBERS_EVERY = 15.0
"""Seconds between two heartbeats of one replica in the members table."""
MEMBER_TTL = 3 * MEMBERS_EVERY
"""Seconds a member row lives without a heartbeat (and a replica trusts its last view)."""
BACKUP_DELAY = 0.25
"""Seconds after the first racer that each further racer of a job claims its slot."""
_POINTS = 32  # places of each member on the ring: an even share of the jobs each


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def heartbeat_sql(table: LedgerTable) -> str:
    """``$1`` holder, ``$2`` group digest, ``$3`` seconds to live: upsert this member and
    return the other live members of its group (rows expired long ago are deleted)."""
    members = table.members
    return f"""
        WITH me AS (
            INSERT INTO {members} AS m (holder, fleet, expires_at)
            VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 second')
            ON CONFLICT (holder) DO UPDATE
            SET fleet = EXCLUDED.fleet, expires_at = EXCLUDED.expires_at
        ), gone AS (
            DELETE FROM {members} WHERE expires_at < clock_timestamp() - interval '1 hour'
        )
        SELECT holder FROM {members}
        WHERE fleet = $2 AND expires_at > clock_timestamp() AND holder <> $1"""


class Membership:
    """One locker's place in its fleet (see the module): the heartbeat task, the live
    members seen last, and the rank of this replica among each job's racers."""

    def __init__(
        self,
        table: LedgerTable,
        sessions: Sequence[LockSession],
        *,
        holder: str,
        racers: int | None,
    ) -> None:
        self._sql = heartbeat_sql(table)
        self._leave_sql = f"DELETE FROM {table.members} WHERE holder = $1"
        self._sessions = sessions
        self._holder = holder
        self._racers = racers
        self._digest = 0
        self._members: tuple[str, ...] = ()
        self._ring: list[tuple[int, str]] = []
        self._points: list[int] = []
        self._ranks: dict[str, int] = {}
        self._seen_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self.beats = 0
        """Heartbeat statements sent."""

    @property
    def size(self) -> int:
        """Live members of this replica's group, itself included (0: not known yet)."""
        return len(self._members) if monotonic() - self._seen_at < MEMBER_TTL else 0

    def has(self, job: str) -> None:
        """*job* is one of this replica's, told once per job (its group is the replicas
        with the same jobs: the digest is the XOR of their names' hashes)."""
        self._digest ^= _point(job)

    def rank(self, job: str) -> int | None:
        """This replica's place among *job*'s racers (0 claims first), *racers* when it
        stands by, ``None`` while every replica races (a small fleet, or none known)."""
        racers = self._racers
        if racers is None or self.size <= racers:
            return None
        rank = self._ranks.get(job)
        if rank is None:
            rank = self._ranks[job] = self._place(job, racers)
        return rank

    def spread(self) -> float:
        """How many times less often than one replica alone each fleet-wide background
        chore runs here: ``members / racers``, at least 1."""
        racers, size = self._racers, self.size
        return 1.0 if racers is None or size <= racers else size / racers

    def _place(self, job: str, racers: int) -> int:
        seen: list[str] = []
        ring, points = self._ring, self._points
        start = bisect.bisect(points, _point(job))
        for i in range(len(ring)):
            holder = ring[(start + i) % len(ring)][1]
            if holder in seen:
                continue
            if holder == self._holder:
                return len(seen)
            seen.append(holder)
            if len(seen) == racers:
                break
        return racers

    def _see(self, others: Sequence[str]) -> None:
        members = tuple(sorted({*others, self._holder}))
        self._seen_at = monotonic()
        if members == self._members:
            return
        if self._members:
            _logger.info("fleet members: %d (were %d)", len(members), len(self._members))
        self._members = members
        self._ring = sorted((_point(f"{m}#{i}"), m) for m in members for i in range(_POINTS))
        self._points = [point for point, _ in self._ring]
        self._ranks.clear()

    def start(self) -> None:
        """Start the heartbeat task, unless it runs already."""
        if self._task is None and self._racers is not None:
            self._task = asyncio.get_running_loop().create_task(
                self._beat_forever(), name=task_name("pg-members")
            )

    async def stop(self) -> None:
        """Stop the heartbeats and leave the table, so the fleet reassigns our jobs now."""
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        session = self._open()
        if session is None or not self._seen_at > float("-inf"):
            return  # never joined, or no session to say so on
        conn = session.conn
        try:
            await session.run(
                conn,
                session.generation,
                lambda c: c.execute(self._leave_sql, self._holder),
                what="leaving the members table",
                keep_on_server_error=True,
            )
        except gone_or_failed_types() as exc:  # it expires by itself
            _logger.debug("leaving the members table failed: %r", exc)

    def _open(self) -> LockSession | None:
        """The first open session: the heartbeat never opens one itself."""
        return next((s for s in self._sessions if s.is_open and not s.closed), None)

    async def beat(self) -> None:
        """One heartbeat on an open session (none open: skipped): write our row, read the
        others. Raises the backend's errors."""
        session = self._open()
        if session is None:
            return
        conn, generation = session.conn, session.generation
        digest = f"{self._digest:016x}"
        self.beats += 1
        rows = await session.run(
            conn,
            generation,
            lambda c: c.fetch(self._sql, self._holder, digest, MEMBER_TTL),
            what="the members heartbeat",
            keep_on_server_error=True,
        )
        self._see([row["holder"] for row in rows])

    async def _beat_forever(self) -> None:
        # The first beat a random part of a period in: replicas started together spread
        # their heartbeats out, and a session just opened serves its first claims first.
        await asyncio.sleep(random.uniform(0.1, 0.5) * MEMBERS_EVERY)
        while True:
            try:
                await self.beat()
            except Exception as exc:  # the sessions log outages; the view ages out by itself
                _logger.debug("the members heartbeat failed: %r", exc)
            await asyncio.sleep(MEMBERS_EVERY)
