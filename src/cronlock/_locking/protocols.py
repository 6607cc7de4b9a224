"""The plug-in points for coordination (Locker, Hold, Elector) and their capabilities.

Optional capabilities (a ledger, crash reports, recording or losable holds, a fenced
elector) are typed Protocols. They are checked once — when a job is registered
(:func:`cronlock._core.wiring.wire`) or once per hold class (:func:`hold_hooks`) — never
probed again on every run.

Also the two rules every locker with a ledger shares: how long a slot's row must outlive
the slot (:func:`check_retention`), and which claimed slots a locker remembers
(:func:`remember_claim`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, TypeVar, runtime_checkable

from .._errors import ConfigError
from .._records import RunRecord

__all__ = (
    "ASKED",
    "RETENTION_MARGIN",
    "BatchLedgerLocker",
    "BoundedRelease",
    "CheckableLocker",
    "ClaimAheadLocker",
    "CrashCallback",
    "CrashWatchingLocker",
    "Elector",
    "FailoverCallback",
    "FailoverWatchingLocker",
    "FencedElector",
    "FleetCallback",
    "FleetView",
    "FleetWatchingLocker",
    "ForeignCallback",
    "ForeignWatchingLocker",
    "GoneHolder",
    "Health",
    "Hold",
    "HoldHooks",
    "InheritingHold",
    "KeyedLocker",
    "LedgerLocker",
    "LedgerSummary",
    "Locker",
    "LosableHold",
    "NamespacedLocker",
    "PruningLocker",
    "RecordingHold",
    "Refusal",
    "Resource",
    "ScheduleNotingLocker",
    "ServerClockLocker",
    "SlotRecordingLocker",
    "check_retention",
    "hold_hooks",
    "remember_claim",
)


@runtime_checkable
class Hold(Protocol):
    """Proof that this process holds one job's lock for one slot, until :meth:`release`.

    What :meth:`Locker.acquire` grants. A hold has no expiry of its own: in the PostgreSQL
    locker's lease mode a *lease* (a row valid for a while, renewed) stands behind it, in
    session mode an advisory lock. Formerly named ``Lease``.
    """

    async def release(self) -> None:
        """Give the lock back. Called exactly once by the scheduler, even on cancellation."""
        ...


Refusal = Literal["locked", "already_ran", "paused", "standby"]
"""Why a locker declined a slot: another holder has the job's lock, the slot already ran, the
job is paused fleet-wide (:class:`cronlock.postgres.FleetControl`), or other replicas of a
large fleet claim this job and this one stands by (``PostgresLocker(racers=...)``)."""


@runtime_checkable
class Locker(Protocol):
    """Claims the right to run one slot of one job across processes or replicas."""

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal | None:
        """Return a hold when this caller may run *slot* of *job*, else why not.

        ``None`` or ``"locked"``: another holder has the job's lock, the normal case on every
        replica but one. ``"already_ran"``: the slot was claimed before (lockers that keep a
        record of slots). ``"paused"``: the job is paused fleet-wide. A backend failure
        raises :class:`cronlock.LockError`.
        """
        ...


@runtime_checkable
class RecordingHold(Hold, Protocol):
    """A hold that stores the run's outcome (a run ledger) when it is released."""

    def record(self, record: RunRecord) -> None:
        """Remember how the run went; the scheduler calls it just before :meth:`release`."""
        ...


@runtime_checkable
class LosableHold(Hold, Protocol):
    """A hold that can tell when its lock was lost while the run was going on."""

    def on_lost(self, callback: Callable[[BaseException | None], None]) -> bool:
        """Call *callback* (once, from the event loop) if the lock is lost before release;
        return whether it is lost already (the callback is then called soon: a run claimed
        ahead may lose its lock before its slot, and the scheduler then ends it before its
        task starts).

        Losing the lock (session killed, network cut, server restart) means mutual exclusion
        no longer holds; the scheduler cancels the run by default (event ``LockLost``).
        """
        ...


@dataclass(frozen=True, slots=True)
class GoneHolder:
    """The holder a hold took its job over from: it let its own hold lapse unreleased
    mid-run (killed, frozen, cut off), so every slot of the job after *slot* until the new
    hold's was refused to the others while nobody ran it (DESIGN.md: held by the dead is
    owed, not lost)."""

    slot: datetime
    """The slot of the gone holder's run."""
    holder: str
    """Who it was (the locker's holder name)."""
    lapsed: datetime
    """When its hold lapsed (the server's time)."""
    since: datetime
    """Its last sign of life as far as the hold tells (a lease's last renewal)."""
    how: str = "lease lapsed unreleased"
    """How its hold ended, in words (after "whose"): its lease lapsed unreleased (lease
    mode), or the lock session it held the job's lock on ended mid-run (session mode:
    killed, frozen and ended by the crash check, cut off), at or before *lapsed*."""


@runtime_checkable
class InheritingHold(Hold, Protocol):
    """A hold that tells when it took its job over from a holder that is gone."""

    def took_over(self) -> GoneHolder | None:
        """The gone holder this hold took the job over from, or ``None`` (the usual case:
        the previous run ended and released its hold). No I/O."""
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
        """The latest *limit* runs of *job*, newest first (unfinished ones included): one
        record per slot, its latest attempt, the earlier ones in its ``attempts``."""
        ...


@dataclass(frozen=True, slots=True)
class LedgerSummary:
    """What a ledger says of one job: the latest slot claimed, the latest finished run and
    the latest success (each ``None`` when there is none)."""

    last_claimed: datetime | None
    last_run: RunRecord | None
    last_success: RunRecord | None


@runtime_checkable
class BatchLedgerLocker(LedgerLocker, Protocol):
    """A ledger locker that reads for many jobs at once and tells a losing replica the
    fleet's history with its refusal, so neither costs a round trip per job."""

    async def ledger_summaries(self, jobs: Sequence[str]) -> Mapping[str, LedgerSummary]:
        """The ledger's summary of each of *jobs* (start-up catch-up), in one read."""
        ...

    def refusal_history(self, job: str) -> tuple[RunRecord | None, RunRecord | None] | None:
        """What the refusal just given to *job* said of the fleet's latest finished run and
        latest success; ``None`` if it said nothing. Consumed: no I/O, asked once."""
        ...


@runtime_checkable
class ScheduleNotingLocker(Locker, Protocol):
    """A locker that wants to know each job's schedule and next slot (for status views).

    A locker whose ``note_schedule`` also takes a ``tags`` keyword is given each job's
    tags with it (a ``frozenset`` of strings; the dashboard filters by them); one written
    for an older cronlock, without it, is called as before.
    """

    def note_schedule(self, job: str, schedule: str, next_run: datetime | None) -> None:
        """Called whenever this replica plans a job's next slot: synchronous, no I/O."""
        ...


@runtime_checkable
class SlotRecordingLocker(Locker, Protocol):
    """A locker whose ledger tells every slot's fate (DESIGN.md §3a): it is told how to
    rebuild each job's slots, and records the slots that did not run with their fate and
    reason, so that ``python -m cronlock history JOB --slots`` reads them from the ledger
    alone. Both calls are synchronous and do no I/O (written batched, as notes are).
    """

    def describe_slots(self, job: str, spec: str | None) -> None:
        """*spec*: JSON text naming *job*'s schedule, jitter, ``misfire_grace``,
        ``start_at`` and ``stop_at`` (``None``: a schedule that cannot be written down)."""
        ...

    def record_slots(
        self,
        job: str,
        first: datetime,
        last: datetime,
        fate: str,
        reason: str,
        into: datetime | None,
    ) -> None:
        """The slots of *job* from *first* to *last* (both included) met *fate*
        (``"coalesced"`` into *into*, ``"missed"``, ``"skipped"``) for *reason*."""
        ...


@runtime_checkable
class ServerClockLocker(Locker, Protocol):
    """A locker that can read its server's clock, the one clock every replica shares.

    A scheduler with such a locker fires slots by fleet time, its clock plus the measured
    offset to the server's (``Scheduler(fleet_clock=...)``, :mod:`cronlock._core.fleetclock`).
    """

    async def read_server_clock(
        self, read: Callable[[], datetime]
    ) -> tuple[datetime, datetime, datetime]:
        """One reading of the server's clock, between two calls of *read*.

        Returns ``(read() just before the request, the server's clock, read() just after
        the answer)``, *read* called as close to the round trip as possible (not while
        waiting for a busy session). Raises :class:`cronlock.LockError` when the server
        cannot be reached.
        """
        ...


@runtime_checkable
class ClaimAheadLocker(Locker, Protocol):
    """A locker whose claims go out a moment before their slot, so runs start on it.

    A scheduler fires a coordinated job's slot :meth:`claims_ahead` seconds early (at
    most a quarter of the time since the job's previous slot): the claim's round trip, and
    any wait the locker adds before it, then end before the slot, and a run that won its
    claim starts at the slot's instant, not a
    round trip after it. A job with a run of its own still in flight is claimed at its slot.
    """

    def claims_ahead(self) -> float:
        """Seconds before a slot that its claim may be sent (0: at the slot)."""
        ...


@runtime_checkable
class CheckableLocker(Locker, Protocol):
    """A locker that can tell, before any run, whether it can work as it is configured.

    A scheduler calls :meth:`check` of each such locker when it starts (``async with
    scheduler`` / :meth:`~cronlock.Scheduler.start`): a misconfiguration fails the start,
    so a service whose locker can never work is not reported started; a server that is
    merely down does not (the scheduler starts, and catches up once it is back).
    """

    async def check(self) -> None:
        """Connect as claims would, and prove it with a round trip.

        Raises :class:`cronlock.LockUnavailable` when the backend cannot be reached right
        now (it may be later), and any other :class:`cronlock.LockError` (best:
        :class:`cronlock.LockerMisconfigured`, naming the fix) when it never will be as
        configured. What it opens, the locker keeps for its claims.
        """
        ...


CrashCallback = Callable[[str, RunRecord], bool]
"""Told of each crashed run a locker found: ``(job, record)``; returns True when the caller
runs that slot again (the locker then lets its next acquire of the slot take it over)."""


@runtime_checkable
class PruningLocker(Protocol):
    """A ledger locker that deletes the rows of old slots, after :meth:`retention` seconds.

    A slot's row is what answers a late claim of it ``"already_ran"``: once pruned, a
    replica still within the job's ``misfire_grace`` of that slot could claim it again
    and run it twice. So a job's slots must stay late for less than the retention, with
    a margin to spare (:func:`check_retention`, when it is registered).
    """

    def retention(self) -> float:
        """Seconds after its slot that a row may be pruned."""
        ...


@runtime_checkable
class KeyedLocker(Protocol):
    """A locker that may take lock keys of its own rather than FNV-1a of the job's name.

    The scheduler refuses two jobs whose FNV-1a keys collide when they are registered; for
    a locker whose :meth:`keyed_keys` is true that check would guard the wrong keys, and let
    a name built to collide with another job's refuse that job's registration.
    """

    def keyed_keys(self) -> bool:
        """True when the keys are not FNV-1a of the job's name (no collision to refuse)."""
        ...


@runtime_checkable
class NamespacedLocker(Protocol):
    """A locker whose ledger has a name that keeps its jobs' idempotency keys apart from
    another service's (:attr:`cronlock.RunContext.namespace`; ``PostgresLocker``)."""

    def idempotency_namespace(self) -> str:
        """The default namespace of its jobs' idempotency keys (``""``: none)."""
        ...


# -- how long a slot's ledger row must outlive the slot ---------------------------------
# The rule both a pruning locker's settings and the registration of each job check.

RETENTION_MARGIN = 3600.0
"""Seconds a slot's row outlives its job's lateness (jitter and misfire_grace): a replica
whose clock lags, stalls, or waits for its connection claims a slot later than its own
misfire rule says. It is also the floor of a retention, whatever the jobs."""


def check_retention(job: str, jitter: float | None, grace: float | None, keep: float) -> None:
    """Refuse job *job* if its slots can be claimed later than rows are kept (*keep*).

    Raises :class:`~cronlock.ConfigError` naming the job, its ``misfire_grace`` (and
    ``jitter``), the retention and the longest grace it allows. A ``misfire_grace`` of
    ``None`` coalesces late slots into the latest due one: it counts as no grace.
    """
    late = (jitter or 0.0) + (grace or 0.0)
    if late + RETENTION_MARGIN <= keep:
        return
    given = "None" if grace is None else f"{grace:g}s"
    jittered = f" and jitter={jitter:g}s" if jitter else ""
    raise ConfigError(
        f"job {job!r}: misfire_grace={given}{jittered} lets a replica claim a slot that "
        f"late, and its locker prunes rows after retention={keep:g}s: with the margin of "
        f"{RETENTION_MARGIN:g}s for lagging replicas, a slot whose row was pruned could run "
        f"a second time; give the locker retention={late + RETENTION_MARGIN:g} or more, "
        f"or the job misfire_grace={max(keep - RETENTION_MARGIN - (jitter or 0.0), 0):g} "
        "or less"
    )


@runtime_checkable
class CrashWatchingLocker(Locker, Protocol):
    """A locker that notices runs whose replica died mid-run, and can have them rerun.

    It marks such a run ``"crashed"`` in its ledger and calls each callback with the job
    and the run's record; if one returns True, its next :meth:`acquire` of that slot may
    claim it once more (once fleet-wide).
    """

    def on_crashed(self, callback: CrashCallback) -> None:
        """Call *callback* (from the event loop) for each crashed run this locker marks."""
        ...


ASKED: ContextVar[bool] = ContextVar("cronlock_asked", default=False)
"""True inside a run someone asked for (``run_now()``), not one the schedule fired: a
locker of a large fleet that stands by for scheduled slots still claims such a run."""

GRANTED_ATTEMPT: ContextVar[int] = ContextVar("cronlock_granted_attempt", default=1)
"""Set by a locker's :meth:`~Locker.acquire`, in the run's own context, when the hold it
grants is for a later try at the slot than the first (a run ledger's takeover of a crashed
run's slot: 2): the scheduler tells the body that attempt (``RunContext.attempt``)."""

ForeignCallback = Callable[[str, datetime, str], None]
"""Told of a job whose lock key a session outside the fleet holds: ``(job, slot, holder)``."""


@runtime_checkable
class ForeignWatchingLocker(Locker, Protocol):
    """A locker that notices when a job's lock is held by a session outside its fleet (its
    claims are then refused ``"locked"``, slot after slot); the scheduler emits
    :class:`~cronlock.LockHeldElsewhere` for each job it reports."""

    def on_foreign_holder(self, callback: ForeignCallback) -> None:
        """Call *callback* once per job found held outside the fleet."""
        ...


FailoverCallback = Callable[[str, datetime, "str | None"], None]
"""Told of a run a failover lost and the locker wrote back, ``(job, slot, None)``, or of a
slot another replica ran too, ``(job, slot, other)``."""


@runtime_checkable
class FailoverWatchingLocker(Locker, Protocol):
    """A locker that notices a new primary and writes back the runs a failover lost; the
    scheduler emits :class:`~cronlock.RunRestored` and :class:`~cronlock.SlotRanTwice`
    for what it reports."""

    def on_failover(self, callback: FailoverCallback) -> None:
        """Call *callback* for each run written back and each slot found run twice."""
        ...


@dataclass(frozen=True, slots=True)
class FleetView:
    """What a locker last read of the fleet's shared state.

    *paused*: the jobs paused fleet-wide. *triggers*: per job, the slot of a run asked for
    fleet-wide and not claimed yet (claim it like any slot: one replica runs it). *runs*:
    per job, the latest finished run and the latest success of any replica, or ``None``
    when this read did not include them (they are read less often). *first_seen*: per
    job, when a replica first noted it in the ledger (jobs not noted yet are left out),
    ``None`` when this read did not include it (read with *runs*). *conflicts*: per job
    that other live replicas of the ledger define otherwise (another function or
    schedule under its name), those replicas; jobs without are left out; ``None`` when
    this read did not include them (read with *runs*). *rejected*: the stored schedules of
    the ledger that every live replica rejected (no replica runs them), ``None`` when this
    read did not include them (read with *runs*).
    """

    paused: frozenset[str] = frozenset()
    triggers: Mapping[str, datetime] = dataclasses.field(default_factory=dict)
    runs: Mapping[str, tuple[RunRecord | None, RunRecord | None]] | None = None
    first_seen: Mapping[str, datetime] | None = None
    conflicts: Mapping[str, frozenset[str]] | None = None
    rejected: frozenset[str] | None = None


FleetCallback = Callable[[FleetView], None]
Health = tuple[float, datetime | None]
"""A job's overdue grace in seconds, and the slot it is due by (its first slot after its
latest success; ``None``: nothing due)."""


@runtime_checkable
class FleetWatchingLocker(Locker, Protocol):
    """A locker that reads the fleet's shared state (pauses, triggers, latest runs) and
    tells the scheduler, every second or so, with no read per job or per scrape."""

    def watch_fleet(
        self, callback: FleetCallback, jobs: Callable[[], Mapping[str, Health]]
    ) -> None:
        """Call *callback* (from the event loop) with each :class:`FleetView` read.

        *jobs* gives the jobs whose latest runs to read, with each one's :data:`Health`
        (published for ``python -m cronlock status --check``).
        """
        ...


@runtime_checkable
class Resource(Protocol):
    """A locker or elector that holds connections or tasks until it is closed.

    The ownership rule: a :class:`~cronlock.Scheduler` closes the resources it was given
    (its locker, its elector, the jobs' own lockers) when it shuts down, so nothing it
    opened or borrowed is left behind — unless the user holds one open with ``async with``,
    which then closes it at the end of that block (use that to share one locker between
    schedulers, or to keep it across a restart of the scheduler).
    """

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun; a closed resource is never used again."""
        ...

    @property
    def held_open(self) -> bool:
        """True while an ``async with`` block holds it open."""
        ...

    async def close(self) -> None:
        """Give back everything held (idempotent)."""
        ...


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


class BoundedRelease:
    """A base class for holds whose :meth:`~Hold.release` bounds itself in time and runs
    to its end even when the caller is cancelled (re-raising the cancellation after):
    the scheduler then awaits it as it is, with no timeout or task of its own around it."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class HoldHooks:
    """Which optional hold capabilities a hold class has."""

    records: bool
    losable: bool
    bounded: bool = False
    """Its release bounds itself and survives cancellation (:class:`BoundedRelease`)."""
    inherits: bool = False
    """It tells when it took its job over from a gone holder (:class:`InheritingHold`)."""


@functools.cache
def _hooks_of(kind: type) -> HoldHooks:
    return HoldHooks(
        issubclass(kind, RecordingHold),
        issubclass(kind, LosableHold),
        issubclass(kind, BoundedRelease),
        issubclass(kind, InheritingHold),
    )


def hold_hooks(hold: Hold) -> HoldHooks:
    """The optional capabilities of *hold*, checked once per hold class."""
    return _hooks_of(type(hold))


# -- which claimed slots a locker remembers: the latest *remember* of each job -----------
# A locker keeps the slots it claimed, per job, so that it can answer "already_ran" by
# itself; it keeps a bounded number of them and forgets the earliest claims first. The
# lockers share this rule rather than each spelling it out.

_S = TypeVar("_S")
_V = TypeVar("_V")


def remember_claim(claimed: dict[_S, _V], slot: _S, value: _V, *, remember: int) -> None:
    """Add *slot* (with *value*) to *claimed*, then forget claims beyond *remember*.

    *claimed* holds one job's claims in the order they were made (a dict keeps insertion
    order), so the ones forgotten are the earliest claimed.
    """
    claimed[slot] = value
    while len(claimed) > remember:
        del claimed[next(iter(claimed))]
