"""PostgresLocker: one replica's exclusion and run-ledger claims on a few connections.

The locker hands out holds, keeps in-process exclusion and shards jobs over its channels by
lock key. What its mode decides (the statements, what a dropped connection loses, which
services run) it asks of its :class:`.._modes.base.Exclusion`, never testing the mode
itself; the pieces it is built from live next to it: the statements of a run
(:mod:`.claims`), the holds (:mod:`.hold`), upkeep (:mod:`.upkeep`) and fleet time
(:mod:`.servertime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from logging import DEBUG, INFO
from typing import TYPE_CHECKING, Any

from ..._cancel import cancel_and_wait, task_name, uncancellable
from ..._durations import Seconds
from ..._errors import LockError
from ..._locking.protocols import ASKED, GRANTED_ATTEMPT, Refusal, remember_claim
from ..._logs import get_logger, say
from ..._resources import HeldOpenByBlocks
from ..._service import Service
from .._conn.hosts import warm_up
from .._conn.primary import Server
from .._conn.source import Keepalives, default_application_name, watch_pool
from .._modes import exclusion_for, source_for
from .._modes.base import Channels, Mode
from .._sql.crashes import retries_due_sql, retries_pending_sql
from .._sql.failover import reassert_sql
from .._sql.tables import DEFAULT_TABLE, LedgerTable
from .._statistics import LockerCounts, PostgresLockerStatistics
from .batch import ClaimAnswer, held_back
from .claims import Claims
from .crashes import CrashWatch
from .failover import NewPrimary
from .fleetwatch import FleetWatch
from .foreign import ForeignCallback, ForeignHolders
from .hold import PostgresHold
from .keys import KeySource, LockKeys
from .ledgerless import NoFleetWatch, NoForeignHolders, NoLedgerReads, NoMembership
from .members import Membership
from .readiness import check_channel
from .reads import LedgerReads, ReadsLedger
from .servertime import DEFAULT_AHEAD, DEFAULT_SPREAD, LANES, FairRace, read_server_clock
from .settings import LockerSettings
from .upkeep import LedgerUpkeep, Upkeep

if TYPE_CHECKING:
    from ..._locking.protocols import CrashCallback, FailoverCallback, FleetCallback, Health
    from ..._records import RunRecord

__all__ = ("PostgresHold", "PostgresLocker", "PostgresLockerStatistics")

_CLOSED = (
    "the PostgresLocker is closed (a Scheduler closes the locker it was given when it "
    "shuts down; hold it open with 'async with locker:' to use it across schedulers)"
)

_logger = get_logger("cronlock.postgres")


class PostgresLocker(HeldOpenByBlocks, ReadsLedger):
    """A :class:`cronlock.LedgerLocker` on PostgreSQL: a run ledger, and exclusion in one
    of two places (*mode*; docs/guides/poolers.md says which to use where).

    **Exactly once.** Each slot is *claimed* in a ledger table keyed by (job, slot), in the
    statement that takes the job's exclusion; a claimed slot is answered ``"already_ran"``
    on every replica, for good. Finishing writes the outcome and releases, again in one
    statement. The ledger gives fleet-wide ``last_run``/``last_success``, :meth:`history`,
    catch-up, crash recovery and ``python -m cronlock status``. Its tables are created on
    first use unless *create_table* is false (then run ``python -m cronlock migrate``);
    *table* and *schema* name them (*schema* ``None``: the ``search_path``'s). Rows older
    than *retention* are pruned, keeping each job's latest run and success. ``ledger=False``
    is the lock alone (session mode only); it can run a slot twice (docs/ledger.md).

    **mode="session"** (default): a session advisory lock per running job, on at most
    *sessions* dedicated connections (default 4, 1 to 64; a job uses session ``key %
    sessions``, opened on first use; given a pool, borrowed for the locker's lifetime). A
    dead session is noticed within about *heartbeat* + *statement_timeout* and the leases on
    it are marked :attr:`~PostgresHold.lost` (the scheduler cancels their runs, event
    ``LockLost``); sessions carry server-side TCP *keepalives*. It needs a direct
    connection: a pooler in between is refused (:class:`cronlock.PoolerDetected`).

    **mode="lease"**: no session state. Every statement is one transaction, on one
    connection of the locker's own (given a DSN; no startup parameter a pooler refuses, no
    named prepared statement) or on a connection borrowed from the given pool for that
    statement alone, so it works through PgBouncer in transaction mode and its peers. "A
    run of job J is in progress" is J's row in the ledger's leases table, valid for *lease*
    seconds (default 20) of the **server's** clock and renewed for all runs in flight in one
    statement every ``lease / 4`` s. A replica that cannot renew cancels its runs before
    their leases could expire; a run whose lease expired without an outcome is crashed.

    **Keys.** Advisory-lock keys are namespaced by the ledger (:meth:`lock_key`), so two
    services with ledgers of their own never block each other; ``bare_keys=True`` takes
    ``job_lock_key(job)``, Go's FNV-1a key; ``lock_keys="keyed"`` an HMAC under a secret of
    the ledger's, at which no job name can be aimed (every replica of a ledger must agree:
    docs/coordination.md). Exclusion among this replica's own runs is kept here.

    **Racers.** In a fleet of more than *racers* live replicas (default 3; ``None``: all),
    only *racers* of them claim (chosen by the members table, ``<table>_members``); they
    race as a small fleet does, and the rest stand by (refusal ``"standby"``, no statement).
    So the server's cost per run does not grow with the fleet; slots are missed only while
    every racer is dead and not yet forgotten (45 s).

    **Failure.** A server that cannot be reached, or a statement that does not finish
    within *statement_timeout*, raises :class:`cronlock.LockError`. Every connection
    carries ``application_name`` (default ``cronlock:<host>:<pid>``). :meth:`check` tells
    a locker that can never work as configured (:class:`cronlock.LockerMisconfigured`,
    naming the fix) from a server that is down (:class:`cronlock.LockUnavailable`); a
    Scheduler calls it when it starts, and a readiness probe may.

    **Fleet time, a fair race.** A Scheduler with this locker fires by the server's clock
    (:meth:`read_server_clock`). Each claim waits a pseudo-random ``[0, spread)`` s (default
    10 ms) drawn per slot and lane (eight groups of jobs, by key), so the winner of a slot
    is drawn. Claims go out *claim_ahead* seconds before the slot (default 0.1; at most a
    quarter of the time since the previous slot; ``0``: at the slot), so the winner starts
    on it (:class:`~cronlock.ClaimAheadLocker`).
    """

    def __init__(
        self,
        pool_or_dsn: Any,
        *,
        ledger: bool = True,
        table: str = DEFAULT_TABLE,
        schema: str | None = None,
        create_table: bool = True,
        sessions: int = 4,
        retention: Seconds = timedelta(days=30),
        heartbeat: Seconds | None = 5.0,
        connect_timeout: Seconds = 10.0,
        statement_timeout: Seconds = 5.0,
        application_name: str | None = None,
        keepalives: Keepalives | None = Keepalives(),  # noqa: B008 (frozen, shared safely)
        remember: int = 1024,
        connect_kwargs: Mapping[str, Any] | None = None,
        spread: Seconds = DEFAULT_SPREAD,
        claim_ahead: Seconds = DEFAULT_AHEAD,
        mode: Mode = "session",
        lease: Seconds = 20.0,
        bare_keys: bool = False,
        lock_keys: LockKeys = "fnv1a",
        racers: int | None = 3,
    ) -> None:
        checked = LockerSettings.check(
            mode=mode, ledger=ledger, sessions=sessions, remember=remember, racers=racers,
            lease=lease, retention=retention, heartbeat=heartbeat,
            connect_timeout=connect_timeout, statement_timeout=statement_timeout,
            spread=spread, claim_ahead=claim_ahead, pool=pool_or_dsn,
        )  # fmt: skip
        self._application_name = application_name or default_application_name()
        source = source_for(mode, pool_or_dsn, connect_kwargs, self._application_name)
        self._holder = f"{self._application_name}:{secrets.token_hex(4)}"
        self._exclusion = exclusion_for(
            mode, LedgerTable(table, schema), ledger=ledger, holder=self._holder,
            lease=checked.lease,
        )  # fmt: skip
        # Lock keys: namespaced by the ledger, bare (Go's) on request or without a ledger,
        # or keyed (.keys).
        self._keys = KeySource(lock_keys, None if bare_keys else self._exclusion.ledger)
        self._remember = checked.remember
        self._race = FairRace(checked.spread)
        self._ahead, self._keep = checked.claim_ahead, checked.retention
        self._closed = False
        self._entered = 0  # open async-with blocks: the Scheduler then leaves closing to them
        self._source = source
        self._pool_watch: asyncio.Task[None] | None = None
        self._shards = self._exclusion.channels(
            Channels(
                source,
                sessions=checked.sessions,
                create_table=create_table,
                connect_timeout=checked.connect_timeout,
                statement_timeout=checked.statement_timeout,
                application_name=self._application_name,
                keepalives=keepalives,
                on_open=self._on_session_opened,
                on_server=self._on_server,
                on_drop=self._on_session_dropped,
                on_fenced=self._on_fenced,
                holder=self._holder,
            )
        )
        host = socket.gethostname()
        self._held: dict[int, PostgresHold] = {}
        # A new primary: noticed at each new connection, this replica's recent runs
        # written back where a failover lost them (.failover).
        self._failover = NewPrimary(
            shards=self._shards, exclusion=self._exclusion,
            sql=self._exclusion.ledger_or(lambda: None, reassert_sql), host=host,
            holder=self._holder, remember=checked.remember, keep=self._keep,
            in_flight=lambda: [(h.job, h.slot, h.attempt) for h in self._held.values()],
        )  # fmt: skip
        self._claims = tuple(
            Claims(session, self._exclusion, host, held_back=self._failover.settling)
            for session in self._shards
        )
        self._pending: set[int] = set()
        self._claimed: dict[str, dict[datetime, None]] = {}
        # What refusals told of each job's history, until the scheduler asks (see
        # refusal_history); bounded like the claimed slots.
        self._told: dict[str, tuple[RunRecord | None, RunRecord | None]] = {}
        # The parts that exist only with a ledger, or their stand-ins without one.
        ledger_or = self._exclusion.ledger_or
        self._reads = ledger_or(
            NoLedgerReads,
            lambda t: LedgerReads(
                self._shards, t, lambda: self._closed, key=self._keys.fnv, holder=self._holder
            ),
        )
        self._crashes = CrashWatch(
            self._exclusion.crashed(host, os.getpid()),
            runs=ledger_or(str, lambda t: t.runs),
            retries=ledger_or(str, retries_due_sql),
            pending=ledger_or(str, retries_pending_sql),
            holder=self._holder,
        )
        self._foreign: ForeignHolders | NoForeignHolders = ledger_or(
            NoForeignHolders, lambda t: ForeignHolders(t, self._shards)
        )
        self._members: Membership | NoMembership = ledger_or(
            NoMembership,
            lambda t: Membership(
                t,
                self._shards,
                holder=self._holder,
                racers=checked.racers,
                own_sessions=self._exclusion.heartbeat,
            ),
        )
        cadence = self._members.spread
        # Upkeep: heartbeat, schedules and late outcomes to write, crashes to mark, pruning.
        # Only where a session's death loses its holds is the session worth checking.
        heartbeat = checked.heartbeat if self._exclusion.heartbeat else None
        holding = lambda: {key % len(self._shards) for key in self._held}  # noqa: E731
        self._upkeep: Upkeep = ledger_or(
            lambda: Upkeep(self._shards, heartbeat=heartbeat, holding=holding),
            lambda t: LedgerUpkeep(
                self._shards,
                t,
                retention=checked.retention,
                heartbeat=heartbeat,
                application_name=self._application_name,
                holding=holding,
                busy=lambda: bool(self._held or self._pending),
                host=host,
                crashes=self._crashes,
                exclusion=self._exclusion,
                spread=cadence,
                holder=self._holder,
            ),
        )
        self._fleet: FleetWatch | NoFleetWatch = ledger_or(
            NoFleetWatch, lambda t: FleetWatch(t, self._shards, cadence, self._holder)
        )
        self._count = LockerCounts()

    @property
    def application_name(self) -> str:
        """The ``application_name`` of the lock sessions, as shown in pg_stat_activity."""
        return self._application_name

    @property
    def mode(self) -> Mode:
        """Where exclusion lives: ``"session"`` (advisory locks) or ``"lease"`` (lease rows)."""
        return self._exclusion.mode

    def lock_key(self, job: str) -> int:
        """*job*'s lock key: :func:`~cronlock.postgres.ledger_lock_key` (``job_lock_key`` with
        *bare_keys* or no ledger); ``lock_keys="keyed"``: from the first claim (LockError)."""
        return self._keys.key(job)

    def keyed_keys(self) -> bool:
        """Whether the keys are ``lock_keys="keyed"`` (``KeyedLocker``: no FNV-1a)."""
        return self._keys.kind == "keyed"

    @property
    def ledger(self) -> LedgerTable | None:
        """Where the run ledger lives, or ``None`` in lock-only mode (``ledger=False``)."""
        return self._exclusion.ledger

    def idempotency_namespace(self) -> str:
        """The ledger's name, ``table`` or ``schema.table`` as given (``""`` without a
        ledger): the default namespace of its jobs' idempotency keys
        (:attr:`cronlock.RunContext.namespace`; ``Scheduler(idempotency_namespace=)``
        overrides it)."""
        return self._exclusion.ledger_or(
            str, lambda t: t.table if t.schema is None else f"{t.schema}.{t.table}"
        )

    def _shard(self, key: int) -> int:
        return key % len(self._shards)

    def statistics(self) -> PostgresLockerStatistics:
        """Return the locker's counters."""
        return self._count.snapshot(
            held=len(self._held), shards=self._shards, upkeep=self._upkeep, crashes=self._crashes,
            foreign=self._foreign, renewals=self._exclusion.renewals(), members=self._members,
        )  # fmt: skip

    async def acquire(self, job: str, slot: datetime) -> PostgresHold | Refusal:
        """Claim *slot* of *job*: a hold, or why not.

        ``"locked"``: the job's lock is held, by another replica or by a run in this process.
        ``"already_ran"``: the slot was claimed before, by any replica (with the ledger) or
        by this locker. ``"paused"``: the job is paused fleet-wide (:class:`FleetControl`).
        Raises :class:`cronlock.LockError` when the server cannot be reached or fails. If
        the calling task is cancelled, nothing stays held or claimed.
        """
        if self._closed:
            raise LockError(f"job {job!r}: {_CLOSED}")
        if not self._keys.ready:  # lock_keys="keyed": the ledger's secret, read once
            await self._keys.load(self._shards)
        key = self._keys.key(job)
        if (wait := self._failover.settling(slot)) is not None:
            raise held_back(job, slot, wait)  # and again where a claim reconnects (.batch)
        if key in self._held or key in self._pending:
            self._count.busy_here += 1
            say(_logger, DEBUG, job, slot, "already running in this process")
            return "locked"
        # A slot whose crashed run this replica said it would rerun, or whose failed attempt
        # it retries, is claimed by taking that row over (the attempt after it), ours or not.
        rerun, told = self._crashes.take(job, slot)
        if (refused := self._refused_here(job, slot, rerun)) is not None:
            return refused
        sent = asyncio.get_running_loop().time()  # lease mode trusts a lease from here on
        answer = await self._claim(job, key, slot, rerun)
        if answer.refusal is not None:
            return self._refused(job, key, slot, answer)
        return self._granted(job, key, slot, answer, sent, rerun, told)

    def _refused_here(self, job: str, slot: datetime, rerun: int) -> Refusal | None:
        """Why this process refuses *slot* of *job* (claimed as attempt *rerun*, 0: a
        plain claim) itself, with no statement: the slot was claimed here, or this replica
        stands by; else ``None``."""
        claimed = self._claimed.get(job)
        if claimed and slot in claimed and not rerun:
            self._count.busy_here += 1
            say(_logger, DEBUG, job, slot, "already claimed by this process")
            return "already_ran"
        # In a fleet of more than `racers`, only `racers` replicas claim (._members);
        # run_now() claims the slot even here.
        if not rerun and self._members.standing_by() and not ASKED.get():
            self._count.standby += 1
            return "standby"
        return None

    async def _claim(self, job: str, key: int, slot: datetime, rerun: int) -> ClaimAnswer:
        """Send the claim (its key reserved in-process meanwhile: the session would grant
        it twice, being re-entrant), after the fair race (._servertime) of its lane."""
        self._pending.add(key)
        try:
            await self._race.wait(slot, key % LANES)  # eight lanes per locker
            claims = self._claims[self._shard(key)]
            try:
                answer = await claims.claim(job, key, slot, rerun=rerun)
            except LockError:
                if rerun:  # not answered: the slot's next claim takes the row over still
                    self._crashes.retry(job, slot, rerun)
                raise
        finally:
            self._pending.discard(key)
        if answer.told is not None:
            self._told[job] = answer.told
            if len(self._told) > self._remember:
                del self._told[next(iter(self._told))]
        return answer

    def _refused(self, job: str, key: int, slot: datetime, answer: ClaimAnswer) -> Refusal:
        """Count and say a refusal the server gave."""
        refusal = answer.refusal
        assert refusal is not None
        if refusal == "locked":
            self._count.contended += 1
            self._foreign.refused(job, key, slot, self._shards[self._shard(key)])
            say(_logger, DEBUG, job, slot, "another replica holds the lock")
        elif refusal == "already_ran":
            self._count.already_ran += 1
            say(_logger, DEBUG, job, slot, "another replica already ran the slot")
        return refusal  # "paused": paused fleet-wide (the claim statement read it)

    def _granted(
        self,
        job: str,
        key: int,
        slot: datetime,
        answer: ClaimAnswer,
        sent: float,
        rerun: int,
        told: int,
    ) -> PostgresHold:
        """The hold of a granted claim (sent at *sent*), known to this locker."""
        self._count.granted += 1
        if rerun:
            self._count.reran += 1
            say(_logger, INFO, job, slot, f"took the slot over for attempt {rerun}")
            GRANTED_ATTEMPT.set(told)  # in the run's context: its body is told so
        remember_claim(self._claimed.setdefault(job, {}), slot, None, remember=self._remember)
        shard, attempt = self._shard(key), rerun or 1
        self._failover.claimed(job, slot, attempt)
        hold = PostgresHold(
            job, key, slot, claims=self._claims[shard], generation=answer.generation,
            on_released=self._on_released, attempt=attempt, gone=answer.gone,
        )  # fmt: skip
        self._held[key] = hold
        if not self._exclusion.granted(hold, sent, answer.generation, self._shards[shard]):
            # The session died between its answer and now: the lock died with it.
            hold.mark_lost(LockError(f"job {job!r}: the lock session was dropped"))
            self._count.lost += 1
        return hold

    async def check(self) -> None:
        """Whether this locker can work, for a readiness probe and a scheduler's start.

        Connects as claims would: the first lock session with its mode's set-up (a session
        of its own in session mode: a pooler in between is refused), the run ledger created
        or its state checked (``create_table=False``: missing or older is refused), and in
        lease mode whether a pooler sits in between while asyncpg's statement cache is on;
        then a round trip. The connection is the locker's first session, kept for its claims
        (given a pool in lease mode, each statement borrows one: nothing is kept).

        Raises :class:`cronlock.LockerMisconfigured` naming the fix when the locker can
        never work as configured: a pooler in session mode (:class:`cronlock.PoolerDetected`),
        the statement cache on behind a pooler in lease mode, the ledger missing with
        ``create_table=False``, a user or password refused (by the server or the pooler),
        an unknown database, a privilege the ledger needs. Raises
        :class:`cronlock.LockUnavailable` when the server cannot be reached now (refused,
        timed out, not resolved, starting up, or the connection failed): the locker keeps
        trying on its own. A :class:`~cronlock.Scheduler` calls it at start
        (:class:`~cronlock.CheckableLocker`): the first fails the start, the second does not.
        """
        if self._closed:
            raise LockError(_CLOSED)
        await warm_up()  # asyncpg's imports, off the loop (once)
        await check_channel(self._exclusion, self._shards[0])

    def fleet_pace(self) -> float:
        """How many times less often fleet-wide chores run here (members over *racers*, >= 1)."""
        return self._members.spread()

    def retention(self) -> float:
        """Seconds after its slot a run's row may be pruned (infinite without a ledger)."""
        return self._keep

    def claims_ahead(self) -> float:
        """Seconds before its slot a claim may go out (``claim_ahead``, ClaimAheadLocker)."""
        return self._ahead

    async def read_server_clock(
        self, read: Callable[[], datetime]
    ) -> tuple[datetime, datetime, datetime]:
        """``(read(), the server's clock, read())`` over a lock session, for fleet time."""
        if self._closed:
            raise LockError(_CLOSED)
        return await read_server_clock(self._shards, read)

    def on_crashed(self, callback: CrashCallback) -> None:
        """Call *callback* ``(job, record)`` for each crashed run this locker marks.

        With a ledger, every few seconds the locker marks ``"crashed"`` the runs whose
        replica died mid-run (unfinished, and its session gone or its lease expired); each
        row is marked by one replica, which alone calls its callbacks. A callback returns
        True when it will run that slot again: the next :meth:`acquire` of the slot then
        takes the row over (attempt 2), at most once fleet-wide. The scheduler registers
        itself here (job option ``recover``); adding a callback twice calls it once.
        """
        self._crashes.on_crashed(callback)

    def on_failover(self, callback: FailoverCallback) -> None:
        """Call *callback* ``(job, slot, other)`` for each run of this replica a failover
        lost and the locker wrote back on the new primary (*other* ``None``), and for each
        slot another replica ran too (*other* names it): ``FailoverWatchingLocker``."""
        self._failover.on_failover(callback)

    def _on_server(self, server: Server | None) -> None:
        """A new connection reached *server*: a new primary is noticed here."""
        self._failover.seen(server)

    def on_foreign_holder(self, callback: ForeignCallback) -> None:
        """Call *callback* ``(job, slot, holder)`` once per job whose lock key a session
        outside this fleet holds (its claims are refused; see :mod:`._foreign`)."""
        self._foreign.on_found(callback)

    def watch_fleet(
        self, callback: FleetCallback, jobs: Callable[[], Mapping[str, Health]]
    ) -> None:
        """Call *callback* with each read of the fleet's state (see :class:`FleetWatch`)."""
        self._fleet.add(callback, jobs)
        self._upkeep.health = self._fleet.health
        if any(s.is_open for s in self._shards):
            self._fleet.start()

    def note_schedule(
        self,
        job: str,
        schedule: str,
        next_run: datetime | None,
        *,
        tags: Collection[str] = (),
        target: str | None = None,
    ) -> None:
        """Remember *job*'s schedule, next slot and *tags*, and its function *target*
        (``module.qualname``; ``None``: as before); no I/O (written batched, at close; the
        definition, function and schedule, when it changes: two definitions under one name
        in the ledger are a conflict, :class:`FleetWatch`)."""
        if self._upkeep.note(job, schedule, next_run, tags, target):
            self._members.has(job)  # a new job of ours: our group is the replicas with it
            self._crashes.has(job)  # and its retries left by a replica gone are ours too

    def describe_slots(self, job: str, spec: str | None) -> None:
        """Remember how *job*'s slots are rebuilt (JSON text; ``None``: they cannot be
        written down), written with its note; no I/O. ``history --slots`` reads it."""
        self._upkeep.describe(job, spec)

    def record_slots(
        self,
        job: str,
        first: datetime,
        last: datetime,
        fate: str,
        reason: str,
        into: datetime | None,
    ) -> None:
        """Record that the slots of *job* from *first* to *last* did not run, with their
        *fate* and *reason* (*into*: the slot they coalesced into); no I/O (written at the
        next upkeep tick, or at close, and kept while the server cannot be reached)."""
        self._upkeep.record((job, first, last, fate, reason, into))

    async def prune(self) -> int:
        """Delete ledger rows older than *retention* now; return how many (it runs by
        itself every few minutes: this is pruning on demand)."""
        return await self._upkeep.prune()

    async def close(self) -> None:
        """Write pending schedules and outcomes, then close the lock sessions.

        Every lock on them is released; holds become lost. Idempotent. Borrowed pool
        connections are given back to their pool.
        """
        self._closed = True
        # The background services, in the reverse of the order they start: the mode's
        # (lease renewal), the fleet watch, membership (which leaves the members table on
        # an open session, so the fleet reassigns this replica's jobs at once), upkeep.
        for service in reversed(self._services()):
            await service.stop()
        await self._foreign.stop()
        await self._failover.close()
        for session in self._shards:
            session.closed = True
        watch, self._pool_watch = self._pool_watch, None
        if watch is not None and watch is not asyncio.current_task():
            await cancel_and_wait(watch)
        for claims in self._claims:
            await claims.batcher.wait_idle()  # answers in flight reach their callers
        await self._hand_back_all()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{sum(s.is_open for s in self._shards)} open"
        return f"<PostgresLocker {self._application_name!r} sessions: {state}>"

    # -- the sessions and what runs on them ---------------------------------------------------

    def _services(self) -> tuple[Service, ...]:
        """The locker's background services, in the order they start."""
        return (self._upkeep, self._members, self._fleet, *self._exclusion.services())

    def _on_session_opened(self) -> None:
        if not self._closed:
            for service in self._services():
                service.start()  # each starts once it has work (lease renewal: a lease)
            for claims in self._claims:  # claims sent on a session lost, unanswered
                claims.batcher.settle_doubts()
        if self._pool_watch is None and not self._closed:
            self._pool_watch = watch_pool(self._source, self.close)

    async def _hand_back_all(self) -> None:
        """Write upkeep's pending rows on the first open session (not while holds are
        still held: then close at once), and hand every session's connection back."""
        held = self._held
        if held and any(s.conn is not None for s in self._shards):
            _logger.warning(
                "PostgresLocker closed while holding the locks of %s",
                sorted(hold.job for hold in held.values()),
            )
        flushed = bool(held)
        for session in self._shards:
            async with session.connect_lock:
                conn = session.conn
                if conn is None:
                    continue
                if not flushed:
                    flushed = True
                    with contextlib.suppress(LockError):
                        await uncancellable(
                            self._upkeep.flush(session, conn, session.generation),
                            name=task_name("pg-flush"),
                        )
                await session.hand_back(conn)

    def _on_session_dropped(self, shard: int, reason: str) -> None:
        """A shard's connection was dropped: its mode says what that loses; reconnect at
        once to see which server is there now (.failover)."""
        self._count.lost += self._exclusion.dropped(self._held, shard, len(self._shards), reason)
        if not self._closed:
            self._failover.dropped()

    def _on_fenced(self) -> None:  # a hold could not be renewed in time
        self._count.lost += 1

    def _on_released(self, hold: PostgresHold, unwritten: RunRecord | None) -> None:
        """*hold* was released: forget it; keep an outcome its dead session lost."""
        self._exclusion.released(hold)
        self._failover.ended(hold.job, hold.slot, hold.recorded)
        if unwritten is not None:
            self._upkeep.write_late(hold.job, hold.slot, unwritten, hold.attempt)
        if self._held.get(hold.key) is hold:
            del self._held[hold.key]
        self._count.released += 1
