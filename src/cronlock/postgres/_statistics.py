"""The counters a PostgresLocker and a PostgresElector report (``statistics()``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("PostgresElectorStatistics", "PostgresLockerStatistics")


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
