"""The fleet's membership, and which replicas claim: a fleet's cost that does not grow with
the fleet.

When every replica claims every slot, the server answers N claims per slot, and a fleet of
100 pods costs it twelve times what 3 do for the same runs. So the replicas of a ledger
register in its members table (one statement per replica every :data:`MEMBERS_EVERY`
seconds, which also reads the live members back), and in a fleet of more than *racers*
(default 3) only *racers* of them claim: the live members whose names hash lowest. They
race for every slot exactly as a fleet of *racers* replicas does (the fair race, claims
ahead, the ledger); every other replica stands by (refusal ``"standby"``, no statement). So
100 replicas cost the server what 3 do, plus the heartbeats. A fleet of at most *racers*
members races as before.

Every replica computes the same active set from the same member list, and two replicas
that see the list a moment apart only disagree on who claims, never on the exclusion: the
ledger and the job's lock or lease still decide who runs. The price: if every active
replica dies at once, no slot runs until the members table forgets them (their rows expire
after :data:`MEMBER_TTL` seconds); one dying leaves the others racing, as in a small fleet.
A replica that stops deletes its row, so a rolling deploy hands over at once. A replica
races for its first ``3 * MEMBERS_EVERY`` seconds whatever its rank: it cannot yet tell a
member that died from a live one, and it is most often the replacement of one that died
(a crash loop, a killed pod), so a fleet whose racers keep dying and coming back never
waits for their rows to expire. The price is a few more racers while a deploy rolls.

The members table is also how a replica is known to be alive: a run is ``crashed`` only
when its owner's row has expired (``_sql/crashes.owner_gone``), not because its session pid
is unknown to a server that took over; in session mode, also when the session its row names
is gone from the server it beat on (``_sql/crashes.sessions_gone``: a killed replica, told
in seconds rather than a time to live). So every locker with a ledger beats, with
``racers=None`` too (one small statement every :data:`MEMBERS_EVERY` seconds per replica,
not waiting for its flush); a beat that fails is tried again every second until one gets
through, so that a replica back from an outage renews its row before the others' checks
could take it for dead.

Replicas are grouped by the set of jobs they have (a digest): during a rolling deploy that
adds a job, the replicas that have it choose racers among themselves.

The same count scales the fleet-wide background work (:meth:`Membership.spread`): with N
members each replica that stands by polls the control table, checks for crashes, writes
schedule notes and estimates fleet time N / racers times less often, so the fleet as a
whole does them at about twice the rate of a fleet of *racers* (the racers at their usual
rate, the others together at that rate again). It still reads the fleet's latest runs
every 15 s: its metrics (last success, overdue) must be right whichever replica is scraped.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Sequence

from ..._clock import monotonic
from ..._errors import LockError
from ..._logs import get_logger
from ..._service import Service
from .._conn import Channel
from .._sql.tables import LedgerTable
from .._sql.upkeep import MEMBER_TTL, MEMBERS_EVERY, heartbeat_sql, leave_sql

__all__ = ("MEMBERS_EVERY", "MEMBER_TTL", "Membership")

_logger = get_logger("cronlock.postgres")

_AGAIN = 1.0
"""Seconds before a heartbeat that failed, or found no open session, is tried again: a
replica back from an outage shows it is alive at once (the crash checks, below)."""


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Membership(Service):
    """One locker's place in its fleet (see the module): the heartbeat task, the live
    members seen last, and whether this replica is one of the racers."""

    kind = "pg-members"

    def __init__(
        self,
        table: LedgerTable,
        sessions: Sequence[Channel],
        *,
        holder: str,
        racers: int | None,
        own_sessions: bool = False,
    ) -> None:
        # *own_sessions*: the sessions are this replica's own lock sessions (session mode),
        # so the row names the one it beats on (_sql/upkeep.heartbeat_sql).
        self._sql = heartbeat_sql(table)
        self._own_sessions = own_sessions
        self._leave_sql = leave_sql(table)
        self._sessions = sessions
        self._holder = holder
        self._racers = racers
        self._digest = 0
        self._members: tuple[str, ...] = ()
        self._rank = 0  # members whose names hash lower than ours
        self._seen_at = float("-inf")
        self._born = monotonic()
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

    def standing_by(self) -> bool:
        """Whether this replica stands by: the fleet has more than *racers* members and
        *racers* of them hash lower. False while the members are not known, and while this
        replica is young (its first three heartbeat periods: see the module) — judged by a
        view of the members read after its youth: one read before may still list members
        whose rows expired since (a crash loop's dead predecessors)."""
        racers = self._racers
        return (
            racers is not None
            and self.size > racers
            and self._rank >= racers
            and self._seen_at - self._born >= 3 * MEMBERS_EVERY
        )

    def spread(self) -> float:
        """How many times less often than alone each fleet-wide background chore runs here:
        ``members / racers`` on a replica that stands by, 1 on a racer (it does the work:
        triggers, crash checks, notes and fleet time stay as prompt as in a small fleet)."""
        racers, size = self._racers, self.size
        if racers is None or not self.standing_by():
            return 1.0
        return size / racers

    def _see(self, others: Sequence[str]) -> None:
        members = tuple(sorted({*others, self._holder}))
        self._seen_at = monotonic()
        if members == self._members:
            return
        if self._members:
            _logger.info("fleet members: %d (were %d)", len(members), len(self._members))
        self._members = members
        mine = _point(self._holder)
        self._rank = sum(1 for member in members if _point(member) < mine)

    def _wanted(self) -> bool:
        return True  # racers=None too: the row is how the fleet knows this replica is alive

    async def stop(self) -> None:
        """Stop the heartbeats and leave the table, so the fleet reassigns our jobs now."""
        if not self.running:
            return
        await super().stop()
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
        except LockError as exc:  # it expires by itself
            _logger.debug("leaving the members table failed: %r", exc)

    def _open(self) -> Channel | None:
        """The first open session: the heartbeat never opens one itself."""
        return next((s for s in self._sessions if s.is_open and not s.closed), None)

    async def beat(self) -> bool:
        """One heartbeat on an open session (none open: skipped, False): write our row, read
        the others. Raises the backend's errors."""
        session = self._open()
        if session is None:
            return False
        conn, generation = session.conn, session.generation
        digest = f"{self._digest:016x}"
        self.beats += 1
        rows = await session.run(
            conn,
            generation,
            lambda c: c.fetch(self._sql, self._holder, digest, MEMBER_TTL, self._own_sessions),
            what="the members heartbeat",
            keep_on_server_error=True,
        )
        self._see([row["holder"] for row in rows])
        return True

    async def _serve(self) -> None:
        # The first beat half a period in or later (a random part of it): replicas started
        # together spread their heartbeats out, and a session just opened serves its
        # start-up claims and catch-up first. Until then, this replica races (and its runs
        # are taken for alive by their claim's age: _sql/crashes.owner_gone).
        await asyncio.sleep(random.uniform(0.5, 1.0) * MEMBERS_EVERY)
        while True:
            beaten = False
            try:
                beaten = await self.beat()
            except Exception as exc:  # the sessions log outages; the view ages out by itself
                _logger.debug("the members heartbeat failed: %r", exc)
            await asyncio.sleep(MEMBERS_EVERY if beaten else min(_AGAIN, MEMBERS_EVERY))
