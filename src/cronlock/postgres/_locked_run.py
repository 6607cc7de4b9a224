"""Standalone locked runs: ``locked_run`` and ``run_locked`` on a dedicated connection."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar, TypeVarTuple, Unpack

from .._cancel import claim_or_undo, task_name, uncancellable
from .._durations import Seconds, to_seconds
from .._errors import ConfigError, LockError, PoolerDetected
from .._keys import job_lock_key
from .._locking.protocols import Refusal
from .._logs import at, get_logger
from .._names import check_job_name
from ._conn.errors import backend_errors, ignoring_backend_errors
from ._conn.source import ConnectionSource, is_closed, terminate
from ._modes.session import SessionLocks
from ._sql.claims import TRY_LOCK_ON_SQL, UNLOCK_SQL
from ._sql.schema import migrate
from ._sql.sessions import SAME_BACKEND_SQL
from ._sql.tables import DEFAULT_TABLE, LedgerTable

__all__ = ("RunLock", "locked_run", "run_locked")

_logger = get_logger("cronlock.postgres")
_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


class RunLock:
    """What :func:`locked_run` yields: truthy when this session holds the job's lock (and,
    with a *slot*, has claimed that slot in the run ledger).

    *reason* says why not when falsy: ``"locked"`` (another session holds the lock),
    ``"already_ran"`` (the slot was claimed before, by any copy, finished or not) or
    ``"paused"`` (the job is paused fleet-wide); ``None`` when acquired. *lost* turns true if
    the connection holding the lock dies while the body runs; the server has then released
    the lock and another replica may take it.
    """

    __slots__ = ("_acquired", "_lost", "key", "name", "reason", "slot")

    def __init__(
        self,
        name: str,
        key: int,
        *,
        acquired: bool,
        reason: Refusal | None = None,
        slot: datetime | None = None,
    ) -> None:
        self.name = name
        self.key = key
        self.slot = slot
        self.reason: Refusal | None = None if acquired else (reason or "locked")
        self._acquired = acquired
        self._lost = False

    def __bool__(self) -> bool:
        return self._acquired

    @property
    def acquired(self) -> bool:
        """Whether this session got the lock (also what ``bool()`` says)."""
        return self._acquired

    @property
    def lost(self) -> bool:
        """Whether the lock's connection died after it was granted."""
        return self._lost

    def __repr__(self) -> str:
        state = "lost" if self._lost else "acquired" if self._acquired else self.reason
        at_slot = "" if self.slot is None else f" slot={self.slot.isoformat()}"
        return f"<RunLock {self.name!r} key={self.key}{at_slot} {state}>"


class _LockedRun(AbstractAsyncContextManager[RunLock]):
    """The context manager behind :func:`locked_run`; single use."""

    def __init__(
        self,
        source: ConnectionSource,
        name: str,
        acquire_timeout: float,
        unlock_timeout: float,
        claim: SlotClaim | None = None,
    ) -> None:
        self._source = source
        self._name = name
        # With a slot, the ledger's namespaced key (what a PostgresLocker on that ledger
        # takes); without, the bare Go-compatible key.
        self._claim = claim
        self._key = job_lock_key(name) if claim is None else claim.key
        self._slot = None if claim is None else claim.slot
        self._acquire_timeout = acquire_timeout
        self._unlock_timeout = unlock_timeout
        self._conn: Any = None
        # The connection of the block: lent by the source, handed back at the end.
        self._lent = source.lend(timeout=acquire_timeout, checkin_timeout=unlock_timeout)
        self._result = RunLock(name, self._key, acquired=True, slot=self._slot)
        self._entered = False

    async def __aenter__(self) -> RunLock:
        if self._entered:
            raise RuntimeError("a locked_run() context manager can be entered only once")
        self._entered = True
        conn = await self._lent.__aenter__()
        # From here on we own conn, and every path must hand it back.
        # The try-lock runs in its own task that a cancellation does not interrupt: a
        # statement cancelled mid-flight may still have been granted by the server, and we
        # would not know whether to unlock. Waiting for it (it does not block server-side)
        # tells us exactly what to undo when we were cancelled meanwhile: the lock, if
        # granted, and the connection. A try-lock that failed has terminated conn itself.

        # With a slot, the undo of a granted claim also deletes the claim's row, in the
        # same statement as the unlock (the ledger's own undo), so the slot stays free.

        def undo(refused: Refusal | None) -> Awaitable[None]:
            return asyncio.create_task(
                self._give_back(conn, locked=refused is None, undo=True),
                name=task_name("locked-run-release", self._name),
            )

        try:
            refused = await claim_or_undo(
                self._try_lock(conn), undo, name=task_name("locked-run-try-lock", self._name)
            )
        except Exception as exc:  # the try-lock failed: conn is terminated, hand it back
            await self._lent.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        if refused is not None:
            _logger.debug("job %r: not running (%s)", self._name, refused, extra=at(self._name))
            await self._give_back_uncancellably(conn, locked=False)
            return RunLock(self._name, self._key, acquired=False, reason=refused, slot=self._slot)
        self._conn = conn
        conn.add_termination_listener(self._on_connection_lost)
        return self._result

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn, self._conn = self._conn, None
        if conn is None:  # not acquired: nothing held, the connection is already back
            return
        # A pool proxy whose connection died has been reclaimed by its pool already.
        with ignoring_backend_errors():
            conn.remove_termination_listener(self._on_connection_lost)
        # Runs whatever ended the body: return, exception, cancellation (once or repeatedly)
        # or an asyncio.timeout() deadline. A cancellation that arrives meanwhile is
        # delivered after the unlock, so the caller still sees it.
        outcome, error = _outcome(exc)
        await self._give_back_uncancellably(conn, locked=True, outcome=outcome, error=error)

    def _on_connection_lost(self, _conn: object) -> None:
        self._result._lost = True
        _logger.error(
            "job %r: the connection holding its lock was closed while the job ran; "
            "the server released the lock",
            self._name,
            extra=at(self._name),
        )

    async def _try_lock(self, conn: Any) -> Refusal | None:
        """Try the lock (and the slot's claim) on *conn*; ``None`` when granted, else why
        not. If that fails, terminate *conn* and raise LockError.

        A try-lock that failed or timed out may still have been granted by the server:
        dropping the session is the one way to be sure nothing stays held.
        """
        claim = self._claim
        try:
            with backend_errors(f"job {self._name!r}: pg_try_advisory_lock failed"):
                async with asyncio.timeout(self._acquire_timeout):
                    if claim is None:
                        got = await conn.fetchval(TRY_LOCK_ON_SQL, self._key, conn.get_server_pid())
                    else:
                        # The same backend check, before the ledger is touched; the claim
                        # statement then takes the lock itself.
                        got = await conn.fetchval(SAME_BACKEND_SQL, conn.get_server_pid())
                        if got is not None:
                            return await claim.claim(conn)
            if got is None:
                raise PoolerDetected(
                    f"job {self._name!r}: the connection is not a server backend of its own "
                    "(a pooler or proxy answers for it): a session advisory lock cannot be "
                    "held through it, so none was taken. locked_run needs a direct "
                    "connection to the server"
                )
            return None if got else "locked"
        except BaseException:
            terminate(conn)  # synchronous: nothing can interrupt it
            raise

    async def _give_back_uncancellably(
        self, conn: Any, *, locked: bool, outcome: str | None = None, error: str | None = None
    ) -> None:
        await uncancellable(
            self._give_back(conn, locked=locked, outcome=outcome, error=error),
            name=task_name("locked-run-release", self._name),
        )

    async def _give_back(
        self,
        conn: Any,
        *,
        locked: bool,
        outcome: str | None = None,
        error: str | None = None,
        undo: bool = False,
    ) -> None:
        """Unlock if *locked* (with a slot: recording *outcome*, or deleting the claim with
        *undo*, in the same statement), then return the connection; bounded by
        unlock_timeout.

        When that cannot complete, terminate the connection: the server then releases
        every lock of the session. Never raises a backend error.
        """
        try:
            if not is_closed(conn):
                with backend_errors(f"job {self._name!r}: the unlock failed"):
                    async with asyncio.timeout(self._unlock_timeout):
                        if locked and not await self._unlock(conn, outcome, error, undo=undo):
                            _logger.warning(
                                "job %r: its lock was no longer held by this session at unlock",
                                self._name,
                                extra=at(self._name),
                            )
        except LockError as exc:
            _logger.warning(
                "job %r: could not unlock within %gs (%r); terminating the connection, "
                "which releases the lock server-side",
                self._name,
                self._unlock_timeout,
                exc.__cause__,
                extra=at(self._name),
            )
            terminate(conn)
        await self._lent.__aexit__(None, None, None)  # given back (a dead one: dropped)

    async def _unlock(
        self, conn: Any, outcome: str | None, error: str | None, *, undo: bool
    ) -> bool:
        if self._claim is None:
            return bool(await conn.fetchval(UNLOCK_SQL, self._key))
        return await self._claim.end(conn, outcome=outcome, error=error, undo=undo)


def to_slot(slot: object, name: str) -> datetime:
    """*slot* as an aware UTC datetime; a naive one or a non-datetime is refused."""
    if not isinstance(slot, datetime) or slot.utcoffset() is None:
        raise ConfigError(
            f"job {name!r}: slot must be an aware datetime (the instant the run stands for, "
            f"e.g. datetime.now(UTC).replace(second=0, microsecond=0)), got {slot!r}"
        )
    return slot.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """Job *name*'s claim of *slot* in *table*, taken and ended on one connection."""

    table: LedgerTable
    name: str
    slot: datetime
    create_table: bool

    @property
    def key(self) -> int:
        """The job's lock key in the ledger's namespace: the one a PostgresLocker takes."""
        return self.table.lock_key(self.name)

    async def claim(self, conn: Any) -> Refusal | None:
        """Lock and claim the slot; ``None`` when claimed (the lock is then held), else why
        not: ``"already_ran"`` (claimed before, by anyone, finished or not), ``"paused"``
        (paused fleet-wide) or ``"locked"`` (another session holds the job's lock)."""
        if self.create_table:
            await migrate(conn, self.table)
        claim = SessionLocks(self.table).claim(
            [self.key], [self.name], [self.slot], socket.gethostname(), os.getpid()
        )
        row = await conn.fetchrow(claim.sql, *claim.args)
        if row["started_at"] is not None:
            return None
        if row["paused"]:
            return "paused"
        if row["ran"] or row["got"]:  # got, but the insert conflicted: unlocked already
            return "already_ran"
        return "locked"

    async def end(self, conn: Any, *, outcome: str | None, error: str | None, undo: bool) -> bool:
        """Record *outcome* (or, with *undo*, delete the claim) and unlock, in one
        statement; whether the lock was still held."""
        # The body began as the claim was taken: the claim's start stands (started None).
        end = _End(self.name, self.key, self.slot, outcome, error, undo)
        finish = SessionLocks(self.table).finish([end], socket.gethostname(), os.getpid())
        row = await conn.fetchrow(finish.sql, *finish.args)
        return bool(row["released"])


@dataclass(frozen=True, slots=True)
class _End:
    """A standalone run's end, as the session mode's finish statement reads one."""

    job: str
    key: int
    slot: datetime
    outcome: str | None
    error: str | None
    undo: bool
    generation: int = 0
    started: datetime | None = None


def _outcome(exc: BaseException | None) -> tuple[str, str | None]:
    """The ledger outcome of a body that ended with *exc* (``None``: it returned)."""
    if exc is None:
        return "succeeded", None
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled", None
    return "failed", repr(exc)


def locked_run(
    pool_or_dsn: Any,
    name: str,
    *,
    slot: datetime | None = None,
    table: str | None = None,
    schema: str | None = None,
    create_table: bool = True,
    acquire_timeout: Seconds = 10.0,
    unlock_timeout: Seconds = 5.0,
) -> AbstractAsyncContextManager[RunLock]:
    """Hold job *name*'s advisory lock for the duration of an ``async with`` block.

    Yields a :class:`RunLock` that is truthy when this session got the lock and falsy when
    another session holds it (the caller should then skip the work)::

        async with locked_run(pool, "nightly-reindex") as acquired:
            if acquired:
                await reindex()

    *pool_or_dsn* is an ``asyncpg.Pool`` (one connection is borrowed for the block) or a DSN
    (one connection is opened for the block and closed after it). The lock is taken with
    ``pg_try_advisory_lock(job_lock_key(name))`` and released on that same connection; the
    unlock runs however the block ends, including cancellation, repeated cancellation and
    an ``asyncio.timeout()`` expiring during the cleanup, and a cancelled acquire leaves
    nothing held. The unlock is bounded by *unlock_timeout*; past it the connection is
    terminated, which releases the lock server-side.

    *acquire_timeout* bounds waiting for a connection (an exhausted pool or an unreachable
    server raises :class:`cronlock.LockError` after it, rather than hanging) and, separately,
    the try-lock statement. Backend failures raise :class:`cronlock.LockError`; exceptions
    from the block propagate unchanged.

    **Once per slot.** The lock alone only prevents overlap: a copy that starts after
    another finished runs again. Pass *slot*, an aware datetime naming the instant the run
    stands for (for a script that system cron starts on every host each minute, that minute:
    ``datetime.now(UTC).replace(second=0, microsecond=0)``), and the run is claimed in the
    run ledger (*table*, default ``cronlock_runs``, in *schema*: the ledger a
    :class:`PostgresLocker` uses, created on first use unless *create_table* is false), so
    that every other copy for that slot, during or after this one, gets a falsy
    :class:`RunLock` whose ``reason`` is ``"already_ran"``. The lock is then the ledger's
    namespaced key (the one a ``PostgresLocker`` on that ledger takes for *name*), and the
    block's end is recorded: ``"succeeded"``, ``"failed"`` (with the exception's repr) or
    ``"cancelled"``, as ``python -m cronlock history`` shows. A cancelled acquire deletes its
    claim with the unlock, leaving the slot free.
    """
    if slot is None and (table is not None or schema is not None):
        raise ConfigError(f"job {name!r}: table= and schema= are the ledger's, and need slot=")
    claim = None
    if slot is not None:
        check_job_name(name)  # a key of the ledger, as a scheduler's job name is
        ledger = LedgerTable(DEFAULT_TABLE if table is None else table, schema)
        claim = SlotClaim(ledger, name, to_slot(slot, name), create_table)
    return _LockedRun(
        ConnectionSource(pool_or_dsn),
        name,
        to_seconds(acquire_timeout, field="acquire_timeout", error=ConfigError),
        to_seconds(unlock_timeout, field="unlock_timeout", error=ConfigError),
        claim,
    )


async def run_locked(
    pool_or_dsn: Any,
    name: str,
    fn: Callable[[Unpack[_Ts]], Awaitable[_T]],
    *args: *_Ts,
    slot: datetime | None = None,
    table: str | None = None,
    schema: str | None = None,
    create_table: bool = True,
    acquire_timeout: Seconds = 10.0,
    unlock_timeout: Seconds = 5.0,
) -> tuple[bool, _T | None]:
    """Run ``await fn(*args)`` under job *name*'s lock, unless another session holds it
    (or, with *slot*, unless that slot was claimed before).

    Returns ``(False, None)`` when it did not run, else ``(True, result)``.
    Same guarantees and options as :func:`locked_run`; *fn*'s exceptions propagate.
    """
    async with locked_run(
        pool_or_dsn,
        name,
        slot=slot,
        table=table,
        schema=schema,
        create_table=create_table,
        acquire_timeout=acquire_timeout,
        unlock_timeout=unlock_timeout,
    ) as lock:
        if not lock:
            return False, None
        return True, await fn(*args)
