"""The counters a PostgresLocker and a PostgresElector report (``statistics()``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ("LockerCounts", "PostgresElectorStatistics", "PostgresLockerStatistics")


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
    crashed: int = 0
    """Runs of other replicas this locker found crashed and marked so in the ledger."""
    reran: int = 0
    """Slots of crashed runs this locker claimed again, for their rerun (attempt 2)."""
    connect_attempts: int = 0
    """Connections the lock sessions tried to open, failed ones included. While the server
    is down each session tries again only after a growing wait (backoff), however many
    acquires come in meanwhile."""
    connect_failures: int = 0
    """Connect attempts of the lock sessions that failed."""
    foreign_holders: int = 0
    """Jobs whose lock key a session outside this fleet was found holding (reported once)."""
    fenced: int = 0
    """Lease mode: leases marked lost because they could not be renewed in time."""
    renewals: int = 0
    """Lease mode: renewal statements sent (one renews every lease in flight)."""
    standby: int = 0
    """Slots this replica did not claim: others are the job's racers (``racers``)."""
    members: int = 0
    """Live replicas of this one's fleet (same ledger, same jobs), as last read."""


@dataclass(frozen=True, slots=True)
class PostgresElectorStatistics:
    """Counters of one :class:`PostgresElector`, from :meth:`PostgresElector.statistics`.

    *leader*: leading right now. *terms*: times it became leader. *demotions*: times it
    stopped (closing while leader included). *polls*: lock attempts as a follower.
    *heartbeats*: successful heartbeats. *sessions_opened*: election sessions opened (one
    more after each demotion or lost connection). *lease_remaining*: seconds left on the
    lease, ``None`` when not holding the lock.
    """

    leader: bool
    terms: int
    demotions: int
    polls: int
    heartbeats: int
    sessions_opened: int
    lease_remaining: float | None


class LockerCounts:
    """The counters a PostgresLocker keeps itself (the only writer); :meth:`snapshot` adds
    its parts' own to make a :class:`PostgresLockerStatistics`."""

    __slots__ = (
        "already_ran",
        "busy_here",
        "contended",
        "granted",
        "lost",
        "released",
        "reran",
        "standby",
    )

    def __init__(self) -> None:
        self.granted = self.contended = self.busy_here = self.already_ran = 0
        self.released = self.lost = self.reran = self.standby = 0

    def snapshot(
        self, *, held: int, shards: Sequence[Any], upkeep: Any, crashes: Any, foreign: Any,
        renewals: tuple[int, int], members: Any,
    ) -> PostgresLockerStatistics:  # fmt: skip
        """The statistics now, from these counts and the locker's parts (``None``: absent)."""
        return PostgresLockerStatistics(
            held=held,
            granted=self.granted,
            contended=self.contended,
            busy_here=self.busy_here,
            released=self.released,
            lost=self.lost,
            sessions_opened=sum(s.opened for s in shards),
            session_open=any(s.is_open for s in shards),
            already_ran=self.already_ran,
            statements=sum(s.statements for s in shards),
            heartbeats=upkeep.heartbeats,
            sessions=len(shards),
            sessions_open=sum(s.is_open for s in shards),
            crashed=0 if crashes is None else crashes.marked,
            foreign_holders=0 if foreign is None else foreign.found,
            fenced=renewals[1],
            renewals=renewals[0],
            standby=self.standby,
            members=0 if members is None else members.size,
            reran=self.reran,
            connect_attempts=sum(s.backoff.attempts for s in shards),
            connect_failures=sum(s.backoff.total_failures for s in shards),
        )
