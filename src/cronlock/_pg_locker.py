"""PostgresLocker: one replica's advisory locks and run-ledger claims on one session.

The locker hands out leases and keeps in-process exclusion; the pieces it is built from
live next to it: the session (:mod:`._pg_session`), the statements of a run
(:mod:`._pg_claim`), the leases (:mod:`._pg_lease`) and upkeep (:mod:`._pg_upkeep`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ._durations import Seconds, optional_seconds, to_seconds
from ._errors import LockError
from ._keys import job_lock_key
from ._locking import Refusal
from ._pg_claim import Claims
from ._pg_common import (
    BACKEND_ERRORS,
    ConnectionSource,
    Keepalives,
    default_application_name,
    uncancellable,
)
from ._pg_lease import PostgresLease, PostgresLockerStatistics
from ._pg_ledger import DEFAULT_TABLE, LedgerTable, to_record
from ._pg_session import GONE_OR_FAILED, LockSession, SessionGone
from ._pg_upkeep import Upkeep

if TYPE_CHECKING:
    from ._job import RunRecord

__all__ = ("PostgresLease", "PostgresLocker", "PostgresLockerStatistics")

_logger = logging.getLogger("cronlock.postgres")
_T = TypeVar("_T")


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
        source = ConnectionSource(pool_or_dsn, connect_kwargs)
        self._table = LedgerTable(table, schema) if ledger else None
        retention_s = to_seconds(retention, field="retention")
        heartbeat_s = optional_seconds(heartbeat, field="heartbeat")
        connect_timeout_s = to_seconds(connect_timeout, field="connect_timeout")
        statement_timeout_s = to_seconds(statement_timeout, field="statement_timeout")
        self._application_name = application_name or default_application_name()
        self._remember = remember
        self._lock_session = LockSession(
            source,
            table=self._table,
            create_table=create_table,
            connect_timeout=connect_timeout_s,
            statement_timeout=statement_timeout_s,
            application_name=self._application_name,
            keepalives=keepalives,
            on_open=self._on_session_opened,
            on_drop=self._on_session_dropped,
        )
        self._claims = Claims(self._lock_session, self._table, socket.gethostname())
        self._held: dict[int, PostgresLease] = {}
        self._pending: set[int] = set()
        self._claimed: dict[str, dict[datetime, None]] = {}
        # Upkeep: heartbeat, schedules to write, outcomes of lost leases to write, pruning.
        self._upkeep = Upkeep(
            self._lock_session,
            self._table,
            retention=retention_s,
            heartbeat=heartbeat_s,
            application_name=self._application_name,
            holding=lambda: bool(self._held),
        )
        self._granted = self._contended = self._busy_here = self._already_ran = 0
        self._released = self._lost = 0

    @property
    def application_name(self) -> str:
        """The ``application_name`` of the lock session, as shown in pg_stat_activity."""
        return self._application_name

    @property
    def ledger(self) -> LedgerTable | None:
        """Where the run ledger lives, or ``None`` in lock-only mode (``ledger=False``)."""
        return self._table

    @property
    def _session(self) -> Any:
        """The lock session's connection, or ``None`` (for tests and debugging)."""
        return self._lock_session.conn

    def statistics(self) -> PostgresLockerStatistics:
        """Return the locker's counters."""
        session = self._lock_session
        return PostgresLockerStatistics(
            held=len(self._held),
            granted=self._granted,
            contended=self._contended,
            busy_here=self._busy_here,
            released=self._released,
            lost=self._lost,
            sessions_opened=session.opened,
            session_open=session.is_open,
            already_ran=self._already_ran,
            statements=session.statements,
            heartbeats=self._upkeep.heartbeats,
        )

    async def acquire(self, job: str, slot: datetime) -> PostgresLease | Refusal:
        """Claim *slot* of *job*: a lease, or why not.

        ``"locked"``: the job's lock is held, by another replica or by a run in this process.
        ``"already_ran"``: the slot was claimed before, by any replica (with the ledger) or
        by this locker. Raises :class:`cronlock.LockError` when the server cannot be reached
        or fails. If the calling task is cancelled, nothing stays held or claimed.
        """
        if self._lock_session.closed:
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
            refusal, generation = await self._claims.claim_reconnecting(job, key, slot)
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
        self._upkeep.note(job, schedule, next_run)

    async def prune(self) -> int:
        """Delete ledger rows older than *retention* now; return how many.

        Runs by itself every few minutes; call it to prune on demand.
        """
        return await self._upkeep.prune()

    async def close(self) -> None:
        """Write pending schedules and outcomes, then close the lock session.

        Every lock on it is released; held leases become lost. Idempotent. A borrowed pool
        connection is given back to its pool.
        """
        session = self._lock_session
        session.closed = True
        await self._upkeep.stop()
        async with session.connect_lock:
            conn = session.conn
            if conn is None:
                return
            if self._held:
                _logger.warning(
                    "PostgresLocker closed while holding the locks of %s",
                    sorted(lease.job for lease in self._held.values()),
                )
            else:
                with contextlib.suppress(*GONE_OR_FAILED):
                    await uncancellable(
                        self._upkeep.flush(conn, session.generation),
                        name="cronlock.postgres.flush",
                    )
            await session.hand_back(conn)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the session and what runs on it -----------------------------------------------------

    def _on_session_opened(self) -> None:
        self._upkeep.start()

    def _on_session_dropped(self, reason: str) -> None:
        """Every lock on the dropped session is gone: mark its leases lost."""
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

    async def _read(self, job: str, call: Callable[[Any], Awaitable[_T]]) -> _T:
        if self._lock_session.closed:
            raise LockError(f"job {job!r}: the PostgresLocker is closed")
        conn, generation = await self._lock_session.ensure()
        try:
            return await uncancellable(
                self._lock_session.run(
                    conn, generation, call, what="a ledger read", keep_on_server_error=True
                ),
                name=f"cronlock.postgres.read[{job}]",
            )
        except SessionGone as exc:
            raise LockError(f"job {job!r}: the lock session was lost; try again") from exc
        except BACKEND_ERRORS as exc:
            raise LockError(f"job {job!r}: reading the run ledger failed: {exc!r}") from exc

    async def _release(self, lease: PostgresLease) -> None:
        try:
            done = not lease._lost and await self._claims.finish(
                self._lock_session.conn,
                lease._generation,
                lease.job,
                lease.key,
                lease.slot,
                lease._record,
            )
            if not done and self._table is not None and lease._record is not None:
                # The session is gone, and the lock with it; the outcome is still worth
                # keeping: upkeep writes it once a session is back.
                self._upkeep.write_late(lease.job, lease.slot, lease._record)
        finally:
            # Only now may this process take the job again: before the unlock finished the
            # session still held the key, and re-acquiring would just bump its count.
            if self._held.get(lease.key) is lease:
                del self._held[lease.key]
            self._released += 1
