"""PostgresLocker: one replica's advisory locks and run-ledger claims on one session."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import asyncpg

from ._durations import Seconds, optional_seconds, to_seconds
from ._errors import LockError
from ._keys import job_lock_key
from ._locking import Refusal, finish_uncancellably
from ._pg_common import (
    BACKEND_ERRORS,
    TRY_LOCK_SQL,
    UNLOCK_SQL,
    ConnectionSource,
    Keepalives,
    configure_session,
    default_application_name,
    is_closed,
    terminate,
    uncancellable,
)
from ._pg_ledger import DEFAULT_TABLE, LedgerTable, migrate, tables_exist, to_record

if TYPE_CHECKING:
    from ._job import RunRecord

__all__ = ("PostgresLease", "PostgresLocker", "PostgresLockerStatistics")

_logger = logging.getLogger("cronlock.postgres")
_T = TypeVar("_T")

NOTE_EVERY = 5.0
"""Seconds between writes of changed job schedules (``note_schedule``) per locker."""
PRUNE_EVERY = 300.0
"""Seconds between two prunes of the ledger by one locker (plus up to 20% jitter)."""
PRUNE_BATCH = 1000
"""Rows one prune statement deletes at most; a full batch is followed by another soon."""


class _SessionGone(Exception):
    """The session a statement was meant for has been replaced or closed."""


_GONE_OR_FAILED: tuple[type[BaseException], ...] = (_SessionGone, *BACKEND_ERRORS)


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
    """Lock sessions opened: one, plus one per reconnect."""
    session_open: bool
    """Whether a lock session is open right now."""
    already_ran: int = 0
    """Acquires refused ``"already_ran"`` by the ledger: another replica claimed the slot."""
    statements: int = 0
    """Statements (round trips) sent on the lock session, heartbeats and upkeep included."""
    heartbeats: int = 0
    """Heartbeat checks sent while leases were held and the session was otherwise idle."""


class PostgresLease:
    """The lock of one job for one slot, held on the locker's session."""

    __slots__ = (
        "_done",
        "_generation",
        "_locker",
        "_lost",
        "_lost_because",
        "_record",
        "_watchers",
        "job",
        "key",
        "slot",
    )

    def __init__(
        self, locker: PostgresLocker, job: str, key: int, slot: datetime, generation: int
    ) -> None:
        self._locker = locker
        self.job = job
        self.key = key
        self.slot = slot
        self._generation = generation
        self._lost = False
        self._lost_because: BaseException | None = None
        self._watchers: list[Callable[[BaseException | None], None]] = []
        self._record: RunRecord | None = None
        self._done = False

    @property
    def lost(self) -> bool:
        """Whether the session holding this lock died; the server has then released it."""
        return self._lost

    def record(self, record: RunRecord) -> None:
        """Keep the run's outcome; :meth:`release` writes it to the ledger with the unlock."""
        self._record = record

    def on_lost(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call *callback* once, from the event loop, if the lock is lost before release.

        It receives a :class:`cronlock.LockError` saying why. Registered after the loss, it
        is called soon; after :meth:`release` has started, never.
        """
        if self._done:
            return
        if self._lost:
            asyncio.get_running_loop().call_soon(callback, self._lost_because)
        else:
            self._watchers.append(callback)

    def _mark_lost(self, because: BaseException) -> None:
        self._lost = True
        self._lost_because = because
        watchers, self._watchers = self._watchers, []
        if self._done:
            return  # being released: nobody is running under this lock any more
        loop = asyncio.get_running_loop()
        for callback in watchers:
            loop.call_soon(callback, because)

    async def release(self) -> None:
        """Record the outcome (with a ledger) and unlock, in one bounded round trip.

        Releasing twice, or releasing a lost lease, does nothing on the lock; a lost
        lease's outcome is written to the ledger later, once a session is back. Never
        raises a backend error: when the statement cannot complete the session is
        terminated, which releases the lock server-side. A cancellation that arrives
        meanwhile is re-raised afterwards.
        """
        if self._done:
            return
        self._done = True
        await uncancellable(
            self._locker._release(self), name=f"cronlock.postgres.release[{self.job}]"
        )

    def __repr__(self) -> str:
        state = "released" if self._done else "lost" if self._lost else "held"
        return f"<PostgresLease {self.job!r} slot={self.slot.isoformat()} {state}>"


class PostgresLocker:
    """A :class:`cronlock.LedgerLocker` on PostgreSQL: advisory locks plus a run ledger.

    **Exactly once.** A lock alone only keeps two replicas from running a job *at the
    same time*: a replica whose clock lags finds the lock free after the first one finished
    and runs the slot again. So by default each slot is also *claimed* in a ledger table
    keyed by (job, slot), in the same statement that takes the lock; a claimed slot is
    answered ``"already_ran"`` on every replica, for good. Finishing writes the outcome and
    unlocks, again in one statement: two round trips per run, as with the lock alone. The
    ledger gives fleet-wide ``last_run``/``last_success``, :meth:`history`, catch-up after
    downtime, and ``python -m cronlock status``. Its tables are created on first use unless
    *create_table* is false (then run ``python -m cronlock migrate``); *table* and *schema*
    name them (*schema* ``None``: the session's ``search_path``). Rows older than
    *retention* are pruned, a batch every few minutes, keeping each job's latest run and
    latest success. ``ledger=False`` is the lock alone, for databases where no table may be
    created; it can run a slot twice (see docs/ledger.md for the measured rate).

    **Connections.** All locks this replica holds live on *one* dedicated lock session,
    however many jobs run at once; statements on it are serialised. Given a DSN, the
    locker opens that connection itself (``asyncpg.connect``, no pool, so no pool reset can
    drop its locks); given an ``asyncpg.Pool``, it borrows one connection for its lifetime
    (close the locker before the pool). The session is opened on first use.

    **Exclusion.** Advisory locks are re-entrant within a session, so exclusion among this
    replica's own runs is enforced here: a job whose lock this locker holds is answered
    ``"locked"`` without a round trip. Across replicas, ``pg_try_advisory_lock(job_lock_key
    (job))`` decides who runs, and the ledger's primary key which slots ran.

    **Failure.** If the session dies, every lock on it is gone: its leases are marked
    :attr:`~PostgresLease.lost` (the scheduler then cancels their runs, event ``LockLost``)
    and the next :meth:`acquire` reconnects. While leases are held, the session is checked
    every *heartbeat* seconds when no other statement proved it alive, so a dead session is
    noticed within about *heartbeat* + *statement_timeout* even after a silent network cut
    (``heartbeat=None`` turns the check off). A server that cannot be reached, or a
    statement that does not finish within *statement_timeout*, raises
    :class:`cronlock.LockError` (the session is then terminated, so nothing stays held).
    The session carries ``application_name`` (default ``cronlock:<host>:<pid>``) and
    server-side TCP *keepalives*.
    """

    def __init__(
        self,
        pool_or_dsn: Any,
        *,
        ledger: bool = True,
        table: str = DEFAULT_TABLE,
        schema: str | None = None,
        create_table: bool = True,
        retention: Seconds = timedelta(days=30),
        heartbeat: Seconds | None = 5.0,
        connect_timeout: Seconds = 10.0,
        statement_timeout: Seconds = 5.0,
        application_name: str | None = None,
        keepalives: Keepalives | None = Keepalives(),  # noqa: B008 (frozen, shared safely)
        remember: int = 1024,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._source = ConnectionSource(pool_or_dsn, connect_kwargs)
        self._table = LedgerTable(table, schema) if ledger else None
        self._create_table = create_table
        self._retention = to_seconds(retention, field="retention")
        self._heartbeat = optional_seconds(heartbeat, field="heartbeat")
        self._connect_timeout = to_seconds(connect_timeout, field="connect_timeout")
        self._statement_timeout = to_seconds(statement_timeout, field="statement_timeout")
        self._application_name = application_name or default_application_name()
        self._keepalives = keepalives
        self._remember = remember
        self._host = socket.gethostname()
        self._session: Any = None
        # Bumped whenever the session is replaced: a lease of an older generation is lost.
        self._generation = 0
        self._connect_lock = asyncio.Lock()
        # One statement at a time on the shared session (asyncpg allows no more).
        self._statement_lock = asyncio.Lock()
        self._held: dict[int, PostgresLease] = {}
        self._pending: set[int] = set()
        self._claimed: dict[str, dict[datetime, None]] = {}
        # Upkeep: schedules to write, outcomes of lost leases to write, pruning.
        self._notes: dict[str, tuple[str, datetime | None]] = {}
        self._dirty: set[str] = set()
        self._late: list[tuple[str, datetime, RunRecord]] = []
        self._keeper: asyncio.Task[None] | None = None
        self._last_ok = self._noted_at = float("-inf")
        self._prune_at = PRUNE_EVERY * random.uniform(0.2, 0.4)  # relative until started
        self._closed = False
        self._granted = self._contended = self._busy_here = self._already_ran = 0
        self._released = self._lost = self._sessions_opened = 0
        self._statements = self._heartbeats = 0

    @property
    def application_name(self) -> str:
        """The ``application_name`` of the lock session, as shown in pg_stat_activity."""
        return self._application_name

    @property
    def ledger(self) -> LedgerTable | None:
        """Where the run ledger lives, or ``None`` in lock-only mode (``ledger=False``)."""
        return self._table

    def statistics(self) -> PostgresLockerStatistics:
        """Return the locker's counters."""
        return PostgresLockerStatistics(
            held=len(self._held),
            granted=self._granted,
            contended=self._contended,
            busy_here=self._busy_here,
            released=self._released,
            lost=self._lost,
            sessions_opened=self._sessions_opened,
            session_open=self._session is not None and not is_closed(self._session),
            already_ran=self._already_ran,
            statements=self._statements,
            heartbeats=self._heartbeats,
        )

    async def acquire(self, job: str, slot: datetime) -> PostgresLease | Refusal:
        """Claim *slot* of *job*: a lease, or why not.

        ``"locked"``: the job's lock is held, by another replica or by a run in this process.
        ``"already_ran"``: the slot was claimed before, by any replica (with the ledger) or
        by this locker. Raises :class:`cronlock.LockError` when the server cannot be reached
        or fails. If the calling task is cancelled, nothing stays held or claimed.
        """
        if self._closed:
            raise LockError(f"job {job!r}: the PostgresLocker is closed")
        key = job_lock_key(job)
        if key in self._held or key in self._pending:
            self._busy_here += 1
            _logger.debug("job %r slot %s: already running in this process", job, slot)
            return "locked"
        claimed = self._claimed.get(job)
        if claimed and slot in claimed:
            self._busy_here += 1
            _logger.debug("job %r slot %s: already claimed by this process", job, slot)
            return "already_ran"
        # Reserve the key in-process first: the session would grant it twice (re-entrant).
        self._pending.add(key)
        try:
            refusal, generation = await self._claim_reconnecting(job, key, slot)
        finally:
            self._pending.discard(key)
        if refusal == "locked":
            self._contended += 1
            _logger.debug("job %r slot %s: another replica holds the lock", job, slot)
            return refusal
        if refusal == "already_ran":
            self._already_ran += 1
            _logger.debug("job %r slot %s: another replica already ran the slot", job, slot)
            return refusal
        self._granted += 1
        claimed = self._claimed.setdefault(job, {})
        claimed[slot] = None
        if len(claimed) > self._remember:
            del claimed[next(iter(claimed))]
        lease = PostgresLease(self, job, key, slot, generation)
        self._held[key] = lease
        return lease

    # -- the ledger (LedgerLocker) ---------------------------------------------------------

    async def last_claimed(self, job: str) -> datetime | None:
        """The latest slot of *job* any replica claimed; ``None`` without a ledger."""
        if self._table is None:
            return None
        sql = self._table.last_claimed_sql
        found: datetime | None = await self._read(job, lambda s: s.fetchval(sql, job))
        return found

    async def last_runs(self, job: str) -> tuple[RunRecord | None, RunRecord | None]:
        """The latest finished run of *job* on any replica, and the latest successful one."""
        if self._table is None:
            return None, None
        sql = self._table.last_runs_sql
        rows = await self._read(job, lambda s: s.fetch(sql, job))
        found = {row["kind"]: to_record(row) for row in rows}
        return found.get("last"), found.get("ok")

    async def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The latest *limit* runs of *job* on any replica, newest first.

        Unfinished runs are included with outcome ``"unfinished"`` and no ``finished_at``.
        Empty without a ledger.
        """
        if self._table is None:
            return []
        sql = self._table.history_sql
        rows = await self._read(job, lambda s: s.fetch(sql, job, limit))
        return [to_record(row) for row in rows]

    def note_schedule(self, job: str, schedule: str, next_run: datetime | None) -> None:
        """Remember *job*'s schedule and next slot for status views; no I/O.

        Changed values are written in one batched statement every few seconds, and at
        :meth:`close`.
        """
        if self._table is None or self._notes.get(job) == (schedule, next_run):
            return
        self._notes[job] = (schedule, next_run)
        self._dirty.add(job)

    async def prune(self) -> int:
        """Delete ledger rows older than *retention* now; return how many.

        Runs by itself every few minutes; call it to prune on demand.
        """
        if self._table is None:
            return 0
        total = 0
        while True:
            session, generation = await self._ensure_session()
            try:
                deleted = await uncancellable(
                    self._prune_batch(session, generation), name="cronlock.postgres.prune"
                )
            except _GONE_OR_FAILED as exc:
                raise LockError(f"pruning the run ledger failed: {exc!r}") from exc
            total += deleted
            if deleted < PRUNE_BATCH:
                return total

    async def close(self) -> None:
        """Write pending schedules and outcomes, then close the lock session.

        Every lock on it is released; held leases become lost. Idempotent. A borrowed pool
        connection is given back to its pool.
        """
        self._closed = True
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            await finish_uncancellably(asyncio.wait((keeper,)))
        async with self._connect_lock:
            session = self._session
            if session is None:
                return
            if self._held:
                _logger.warning(
                    "PostgresLocker closed while holding the locks of %s",
                    sorted(lease.job for lease in self._held.values()),
                )
            else:
                with contextlib.suppress(*_GONE_OR_FAILED):
                    await uncancellable(
                        self._flush(session, self._generation), name="cronlock.postgres.flush"
                    )
            async with self._statement_lock:  # let an in-flight statement finish first
                self._drop_session(session, reason="the locker was closed", kill=False)
            await uncancellable(
                self._source.checkin(session, timeout=self._statement_timeout),
                name="cronlock.postgres.close",
            )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the session -----------------------------------------------------------------------

    async def _ensure_session(self) -> tuple[Any, int]:
        session = self._session
        if session is not None and not is_closed(session):
            return session, self._generation
        async with self._connect_lock:
            if self._closed:
                raise LockError("the PostgresLocker is closed")
            if self._session is not None:
                if not is_closed(self._session):
                    return self._session, self._generation  # another task reconnected
                self._drop_session(self._session, reason="its connection was closed")
            conn = await self._source.checkout(timeout=self._connect_timeout)
            try:
                async with asyncio.timeout(self._connect_timeout):
                    await configure_session(
                        conn, application_name=self._application_name, keepalives=self._keepalives
                    )
                    await self._prepare_ledger(conn)
            except BaseException as exc:
                # Includes cancellation: an unconfigured session we do not keep must not
                # linger. terminate() is synchronous, so a second cancel cannot skip it.
                terminate(conn)
                if isinstance(exc, BACKEND_ERRORS):
                    raise LockError(f"could not set up the lock session: {exc!r}") from exc
                raise
            self._generation += 1
            self._session = conn
            self._sessions_opened += 1
            conn.add_termination_listener(self._on_terminated)
            if self._keeper is None:
                loop = asyncio.get_running_loop()
                self._prune_at += loop.time()
                self._keeper = loop.create_task(self._keep(), name="cronlock.postgres.upkeep")
            return conn, self._generation

    async def _prepare_ledger(self, conn: Any) -> None:
        table = self._table
        if table is None or await tables_exist(conn, table):
            return
        if not self._create_table:
            raise LockError(
                f"the run ledger table {table.runs} does not exist; create it with "
                "'python -m cronlock migrate --dsn DSN' (with --schema/--table as configured), "
                "or pass create_table=True"
            )
        if await migrate(conn, table, timeout=self._connect_timeout):
            _logger.info("created the run ledger %s", table.runs)

    def _on_terminated(self, conn: object) -> None:
        # asyncpg calls this soon after the connection closes, whatever closed it.
        if conn is self._session:
            self._drop_session(conn, reason="its connection was closed")

    def _drop_session(self, session: Any, *, reason: str, kill: bool = True) -> None:
        """Forget *session*; its leases are lost. Terminate it unless *kill* is false."""
        if session is self._session:
            self._session = None
            self._generation += 1
            lost = [lease for lease in self._held.values() if not lease._lost]
            for lease in lost:
                lease._mark_lost(
                    LockError(f"job {lease.job!r}: the lock session was dropped: {reason}")
                )
            self._lost += len(lost)
            if lost:
                _logger.error(
                    "lock session dropped (%s): the locks of %s are lost and may be taken "
                    "by another replica",
                    reason,
                    sorted(lease.job for lease in lost),
                )
        with contextlib.suppress(*BACKEND_ERRORS):  # a proxy already handed back
            session.remove_termination_listener(self._on_terminated)
        if kill:
            terminate(session)

    async def _run(
        self,
        session: Any,
        generation: int,
        call: Callable[[Any], Awaitable[_T]],
        *,
        what: str,
        keep_on_server_error: bool = False,
    ) -> _T:
        """Run one statement on *session*, bounded; on failure drop the session.

        *keep_on_server_error*: a statement that takes and releases no lock (a read, an
        upkeep write) and got an error answer from the server leaves the session sound.
        """
        async with self._statement_lock:
            if session is None or generation != self._generation or is_closed(session):
                raise _SessionGone
            self._statements += 1
            try:
                async with asyncio.timeout(self._statement_timeout):
                    result = await call(session)
            except BACKEND_ERRORS as exc:
                if not (keep_on_server_error and isinstance(exc, asyncpg.PostgresError)):
                    # A statement that timed out or failed leaves us unsure what the server
                    # did: terminating the session is the one way to be sure nothing stays
                    # held (session advisory locks survive a rolled-back statement).
                    self._drop_session(session, reason=f"{what} failed: {exc!r}")
                raise
            self._last_ok = asyncio.get_running_loop().time()
            return result

    async def _read(self, job: str, call: Callable[[Any], Awaitable[_T]]) -> _T:
        if self._closed:
            raise LockError(f"job {job!r}: the PostgresLocker is closed")
        session, generation = await self._ensure_session()
        try:
            return await uncancellable(
                self._run(
                    session, generation, call, what="a ledger read", keep_on_server_error=True
                ),
                name=f"cronlock.postgres.read[{job}]",
            )
        except _SessionGone as exc:
            raise LockError(f"job {job!r}: the lock session was lost; try again") from exc
        except BACKEND_ERRORS as exc:
            raise LockError(f"job {job!r}: reading the run ledger failed: {exc!r}") from exc

    # -- claim and release -----------------------------------------------------------------

    async def _claim_reconnecting(
        self, job: str, key: int, slot: datetime
    ) -> tuple[Refusal | None, int]:
        session, generation = await self._ensure_session()
        try:
            return await self._claim(session, generation, job, key, slot), generation
        except LockError as exc:
            if isinstance(exc.__cause__, TimeoutError):
                raise  # a slow server: retrying would only double the wait
        # The session died under us (killed, network cut, server restart). Its locks died
        # with it, so one attempt on a fresh session is safe.
        _logger.info("job %r: lock session lost; reconnecting", job)
        session, generation = await self._ensure_session()
        return await self._claim(session, generation, job, key, slot), generation

    async def _attempt(
        self, session: Any, generation: int, job: str, key: int, slot: datetime
    ) -> Refusal | None:
        """One round trip: lock (and claim, with the ledger); ``None`` means granted."""
        if self._table is None:
            got = await self._run(
                session, generation, lambda s: s.fetchval(TRY_LOCK_SQL, key), what="try-lock"
            )
            return None if got else "locked"
        sql, pid = self._table.claim_sql, os.getpid()
        row = await self._run(
            session,
            generation,
            lambda s: s.fetchrow(sql, key, job, slot, self._host, pid),
            what="claim",
        )
        if row["started_at"] is not None:
            return None
        return "already_ran" if row["ran"] or row["got"] else "locked"

    async def _claim(
        self, session: Any, generation: int, job: str, key: int, slot: datetime
    ) -> Refusal | None:
        # Run the statement in a task that cancellation does not interrupt: cancelling it
        # mid-flight would leave us unsure whether the server granted the lock, and would
        # send a cancel request to a session shared by every running job. It is short and
        # bounded; once it is done we know exactly what to undo.
        attempt = asyncio.create_task(
            self._attempt(session, generation, job, key, slot),
            name=f"cronlock.postgres.claim[{job}]",
        )
        try:
            return await finish_uncancellably(attempt)
        except asyncio.CancelledError:
            if not attempt.cancelled() and attempt.exception() is None and attempt.result() is None:
                # Granted, but our caller is gone: give the slot and the lock back before
                # delivering the cancel, so that another replica may still run the slot.
                await uncancellable(
                    self._finish(session, generation, job, key, slot, None, unclaim=True),
                    name=f"cronlock.postgres.undo[{job}]",
                )
            raise
        except _SessionGone as exc:
            raise LockError(f"job {job!r}: the lock session was lost; try again") from exc
        except BACKEND_ERRORS as exc:
            raise LockError(f"job {job!r}: the claim statement failed: {exc!r}") from exc

    async def _finish(
        self,
        session: Any,
        generation: int,
        job: str,
        key: int,
        slot: datetime,
        record: RunRecord | None,
        *,
        unclaim: bool = False,
    ) -> bool:
        """Record (or undo) the claim and unlock: one round trip. False if it failed."""
        table = self._table
        try:
            if table is None:
                released = await self._run(
                    session, generation, lambda s: s.fetchval(UNLOCK_SQL, key), what="unlock"
                )
            elif unclaim:
                sql, pid = table.unclaim_sql, os.getpid()
                released = await self._run(
                    session,
                    generation,
                    lambda s: s.fetchval(sql, job, slot, self._host, pid, key),
                    what="unclaim",
                )
            else:
                sql = table.finish_sql
                outcome = None if record is None else record.outcome
                error = None if record is None else record.error
                row = await self._run(
                    session,
                    generation,
                    lambda s: s.fetchrow(sql, job, slot, outcome, error, key),
                    what="finish",
                )
                released = row["released"]
        except _SessionGone:
            return False  # the session died: the server already released the lock
        except BACKEND_ERRORS as exc:
            _logger.warning(
                "job %r: unlock failed (%r); the lock session was terminated, which "
                "releases the lock server-side",
                job,
                exc,
            )
            return False
        if not released:
            _logger.warning("job %r: its lock was no longer held at unlock", job)
        return True

    async def _release(self, lease: PostgresLease) -> None:
        try:
            done = not lease._lost and await self._finish(
                self._session, lease._generation, lease.job, lease.key, lease.slot, lease._record
            )
            if not done and self._table is not None and lease._record is not None:
                # The session is gone, and the lock with it; the outcome is still worth
                # keeping: upkeep writes it once a session is back.
                self._late.append((lease.job, lease.slot, lease._record))
        finally:
            # Only now may this process take the job again: before the unlock finished the
            # session still held the key, and re-acquiring would just bump its count.
            if self._held.get(lease.key) is lease:
                del self._held[lease.key]
            self._released += 1

    # -- upkeep: heartbeat, schedules, late outcomes, pruning ---------------------------------

    async def _keep(self) -> None:
        """Owned by the locker from the first session to :meth:`close`."""
        tick = min(self._heartbeat or NOTE_EVERY, NOTE_EVERY)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick)
            session, generation = self._session, self._generation
            if session is None or is_closed(session):
                continue  # only acquire reconnects: upkeep alone never opens a session
            now = loop.time()
            try:
                beat = self._heartbeat
                if beat is not None and self._held and now - self._last_ok >= beat:
                    self._heartbeats += 1
                    await uncancellable(
                        self._run(
                            session,
                            generation,
                            lambda s: s.fetchval("SELECT 1"),
                            what="the heartbeat",
                        ),
                        name="cronlock.postgres.heartbeat",
                    )
                if self._table is None:
                    continue
                if self._late or (self._dirty and now - self._noted_at >= NOTE_EVERY):
                    await uncancellable(
                        self._flush(session, generation), name="cronlock.postgres.flush"
                    )
                if now >= self._prune_at:
                    deleted = await uncancellable(
                        self._prune_batch(session, generation), name="cronlock.postgres.prune"
                    )
                    full = deleted >= PRUNE_BATCH
                    self._prune_at = now + (tick if full else PRUNE_EVERY * random.uniform(1, 1.2))
            except _GONE_OR_FAILED as exc:
                # A dead session was dropped (its leases marked lost) by _run; a server
                # error on upkeep leaves it sound. Either way, try again next tick.
                _logger.debug("lock session upkeep failed: %r", exc)

    async def _flush(self, session: Any, generation: int) -> None:
        """Write changed job schedules and outcomes of lost leases."""
        table = self._table
        if table is None:
            return
        late, self._late = self._late, []
        if late:
            jobs, slots, records = zip(*late, strict=True)
            args = (
                list(jobs),
                list(slots),
                [r.outcome for r in records],
                [r.error for r in records],
                [r.finished_at for r in records],
            )
            try:
                await self._run(
                    session,
                    generation,
                    lambda s: s.execute(table.late_finish_sql, *args),
                    what="writing late outcomes",
                    keep_on_server_error=True,
                )
            except BaseException:
                self._late[:0] = late
                raise
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        names = sorted(dirty)
        notes = [self._notes[name] for name in names]
        try:
            await self._run(
                session,
                generation,
                lambda s: s.execute(
                    table.note_sql,
                    names,
                    [schedule for schedule, _ in notes],
                    [next_run for _, next_run in notes],
                    self._application_name,
                ),
                what="writing schedules",
                keep_on_server_error=True,
            )
        except BaseException:
            self._dirty |= dirty
            raise
        self._noted_at = asyncio.get_running_loop().time()

    async def _prune_batch(self, session: Any, generation: int) -> int:
        table = self._table
        assert table is not None
        deleted = await self._run(
            session,
            generation,
            lambda s: s.fetchval(table.prune_sql, self._retention, PRUNE_BATCH),
            what="pruning the ledger",
            keep_on_server_error=True,
        )
        if deleted:
            _logger.debug(
                "pruned %d run(s) older than %gs from %s", deleted, self._retention, table.runs
            )
        return int(deleted)
