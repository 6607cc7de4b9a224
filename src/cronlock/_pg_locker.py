"""PostgresLocker: all of one replica's advisory locks on one dedicated session."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from ._durations import Seconds, to_seconds
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

__all__ = ("PostgresLease", "PostgresLocker", "PostgresLockerStatistics")

_logger = logging.getLogger("cronlock.postgres")


class _SessionGone(Exception):
    """The session a statement was meant for has been replaced or closed."""


@dataclass(frozen=True, slots=True)
class PostgresLockerStatistics:
    """Counters of one :class:`PostgresLocker`, from :meth:`PostgresLocker.statistics`."""

    held: int
    """Leases currently held (lost ones included until they are released)."""
    granted: int
    """Locks granted by the server since the locker was created."""
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


class PostgresLease:
    """The lock of one job for one slot, held on the locker's session."""

    __slots__ = (
        "_done",
        "_generation",
        "_locker",
        "_lost",
        "_lost_because",
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
        self._done = False

    @property
    def lost(self) -> bool:
        """Whether the session holding this lock died; the server has then released it."""
        return self._lost

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
        """Unlock, bounded by the locker's statement timeout, surviving any cancellation.

        Releasing twice, or releasing a lost lease, does nothing. Never raises a backend
        error: when the unlock cannot complete the session is terminated, which releases
        the lock server-side. A cancellation that arrives meanwhile is re-raised afterwards.
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
    """A :class:`cronlock.Locker` on PostgreSQL session advisory locks.

    **Connections.** All locks this replica holds live on *one* dedicated lock session,
    however many jobs run at once: 50 concurrent runs still use one server connection.
    Statements on it are serialised (two short round trips per run: try-lock and unlock).
    Given a DSN, the locker opens that connection itself (``asyncpg.connect``, no pool, so
    no pool reset can drop its locks). Given an ``asyncpg.Pool``, it borrows one connection
    from the pool and keeps it for its lifetime, so the pool has one fewer for other work;
    close the locker before the pool. The session is opened on the first :meth:`acquire`.

    **Exclusion.** Advisory locks are re-entrant within a session, so exclusion among this
    replica's own runs is enforced here: a job whose lock this locker holds is answered
    ``"locked"``, and a slot this locker already claimed ``"already_ran"`` (it remembers the
    last *remember* slots per job). Across replicas the server decides, with
    ``pg_try_advisory_lock(job_lock_key(job))``; whether another replica already ran a slot
    only a run ledger can tell.

    **Failure.** If the session dies, every lock on it is gone: its leases are marked
    :attr:`~PostgresLease.lost`, and the next :meth:`acquire` reconnects. A server that cannot
    be reached, or a statement that does not finish within *statement_timeout*, raises
    :class:`cronlock.LockError` (the session is then terminated, so nothing stays held).

    The session carries ``application_name`` (default ``cronlock:<host>:<pid>``) and the
    server-side TCP *keepalives*, so that pg_stat_activity shows who holds what and a
    network cut releases the locks within about a minute rather than hours.
    """

    def __init__(
        self,
        pool_or_dsn: Any,
        *,
        connect_timeout: Seconds = 10.0,
        statement_timeout: Seconds = 5.0,
        application_name: str | None = None,
        keepalives: Keepalives | None = Keepalives(),  # noqa: B008 (frozen, shared safely)
        remember: int = 1024,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._source = ConnectionSource(pool_or_dsn, connect_kwargs)
        self._connect_timeout = to_seconds(connect_timeout, field="connect_timeout")
        self._statement_timeout = to_seconds(statement_timeout, field="statement_timeout")
        self._application_name = application_name or default_application_name()
        self._keepalives = keepalives
        self._remember = remember
        self._session: Any = None
        # Bumped whenever the session is replaced: a lease of an older generation is lost.
        self._generation = 0
        self._connect_lock = asyncio.Lock()
        # One statement at a time on the shared session (asyncpg allows no more).
        self._statement_lock = asyncio.Lock()
        self._held: dict[int, PostgresLease] = {}
        self._pending: set[int] = set()
        self._claimed: dict[str, dict[datetime, None]] = {}
        self._closed = False
        self._granted = self._contended = self._busy_here = 0
        self._released = self._lost = self._sessions_opened = 0

    @property
    def application_name(self) -> str:
        """The ``application_name`` of the lock session, as shown in pg_stat_activity."""
        return self._application_name

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
        )

    async def acquire(self, job: str, slot: datetime) -> PostgresLease | Refusal:
        """Claim *slot* of *job*: a lease, or why not.

        ``"locked"``: the job's lock is held, by another replica or by a run in this process.
        ``"already_ran"``: this locker already claimed that slot. Raises
        :class:`cronlock.LockError` when the server cannot be reached or fails. If the
        calling task is cancelled, nothing stays held.
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
            granted, generation = await self._try_lock_reconnecting(job, key)
        finally:
            self._pending.discard(key)
        if not granted:
            self._contended += 1
            _logger.debug("job %r slot %s: another replica holds the lock", job, slot)
            return "locked"
        self._granted += 1
        claimed = self._claimed.setdefault(job, {})
        claimed[slot] = None
        if len(claimed) > self._remember:
            del claimed[next(iter(claimed))]
        lease = PostgresLease(self, job, key, slot, generation)
        self._held[key] = lease
        return lease

    async def close(self) -> None:
        """Close the lock session, releasing every lock on it; held leases become lost.

        Idempotent. A borrowed pool connection is given back to its pool.
        """
        self._closed = True
        async with self._connect_lock:
            session = self._session
            if session is None:
                return
            if self._held:
                _logger.warning(
                    "PostgresLocker closed while holding the locks of %s",
                    sorted(lease.job for lease in self._held.values()),
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

    # -- internals ---------------------------------------------------------------------

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
            return conn, self._generation

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

    async def _statement(self, session: Any, generation: int, sql: str, key: int) -> bool:
        """Run one lock statement on *session*, bounded; on failure drop the session."""
        async with self._statement_lock:
            if session is None or generation != self._generation or is_closed(session):
                raise _SessionGone
            try:
                async with asyncio.timeout(self._statement_timeout):
                    return bool(await session.fetchval(sql, key))
            except BACKEND_ERRORS as exc:
                # A statement that timed out or failed leaves us unsure what the server did:
                # terminating the session is the one way to be sure nothing stays held.
                self._drop_session(session, reason=f"a lock statement failed: {exc!r}")
                raise

    async def _try_lock_reconnecting(self, job: str, key: int) -> tuple[bool, int]:
        session, generation = await self._ensure_session()
        try:
            return await self._try_lock(session, generation, job, key), generation
        except LockError as exc:
            if isinstance(exc.__cause__, TimeoutError):
                raise  # a slow server: retrying would only double the wait
        # The session died under us (killed, network cut, server restart). Its locks died
        # with it, so one attempt on a fresh session is safe.
        _logger.info("job %r: lock session lost; reconnecting", job)
        session, generation = await self._ensure_session()
        return await self._try_lock(session, generation, job, key), generation

    async def _try_lock(self, session: Any, generation: int, job: str, key: int) -> bool:
        # Run the statement in a task that cancellation does not interrupt: cancelling it
        # mid-flight would leave us unsure whether the server granted the lock, and would
        # send a cancel request to a session shared by every running job. It is short and
        # bounded; once it is done we know exactly what to undo.
        attempt = asyncio.create_task(
            self._statement(session, generation, TRY_LOCK_SQL, key),
            name=f"cronlock.postgres.try_lock[{job}]",
        )
        try:
            return await finish_uncancellably(attempt)
        except asyncio.CancelledError:
            if not attempt.cancelled() and attempt.exception() is None and attempt.result():
                # Granted, but our caller is gone: give it back before delivering the cancel.
                await uncancellable(
                    self._unlock(session, generation, key, job),
                    name=f"cronlock.postgres.undo[{job}]",
                )
            raise
        except _SessionGone as exc:
            raise LockError(f"job {job!r}: the lock session was lost; try again") from exc
        except BACKEND_ERRORS as exc:
            raise LockError(f"job {job!r}: pg_try_advisory_lock failed: {exc!r}") from exc

    async def _unlock(self, session: Any, generation: int, key: int, job: str) -> None:
        try:
            released = await self._statement(session, generation, UNLOCK_SQL, key)
        except _SessionGone:
            return  # the session died: the server already released the lock
        except BACKEND_ERRORS as exc:
            _logger.warning(
                "job %r: unlock failed (%r); the lock session was terminated, which "
                "releases the lock server-side",
                job,
                exc,
            )
            return
        if not released:
            _logger.warning("job %r: its lock was no longer held at unlock", job)

    async def _release(self, lease: PostgresLease) -> None:
        try:
            if not lease._lost:
                await self._unlock(self._session, lease._generation, lease.key, lease.job)
        finally:
            # Only now may this process take the job again: before the unlock finished the
            # session still held the key, and re-acquiring would just bump its count.
            if self._held.get(lease.key) is lease:
                del self._held[lease.key]
            self._released += 1
