"""PostgresElector: leader election on one session advisory lock, fenced by a client lease.

Why two replicas can never both see ``is_leader() == True`` (docs/election.md has the long
version). Let ``lease`` be the client's lease and ``floor`` the earliest the server could
notice a silent client, measured from the last packet it received from that client:
``min(idle_session_timeout, tcp_keepalives_idle, tcp_user_timeout)``; the constructor
refuses settings where ``floor`` is not comfortably above ``lease``.

1. A heartbeat sent at client time *s* that the server answers "this backend holds the key"
   proves the lock was held when the server read it, at or after *s*. The client counts
   itself leader only until ``s + lease`` (monotonic), whatever its tasks are doing.
2. A *silent* failure (network cut, frozen proxy, frozen client) releases the lock no
   earlier than ``s + floor > s + lease``: the old leader has stopped before anyone can
   acquire.
3. A *loud* failure (RST, the client process killed, ``pg_terminate_backend``) releases the
   lock at once, at server time *r* after the last successful heartbeat, hence after *s*.
   The replica that acquires it next only counts itself leader ``takeover_delay >= lease``
   after the grant reached it, at or after ``r + lease > s + lease``: again after the old
   lease lapsed.

What is *not* covered: code of a frozen leader keeps running for a moment when the process
wakes, until its run is cancelled; and the argument assumes both hosts' clocks advance at
about the same rate (the margin between ``floor`` and ``lease`` absorbs small drift).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from .._cancel import cancel_and_wait, task_name, uncancellable
from .._clock import monotonic
from .._durations import Seconds, optional_seconds, to_seconds
from .._errors import ConfigError, LockError
from .._logs import get_logger
from .._resources import HeldOpenByBlocks
from ._conn.errors import backend_errors, ignoring_backend_errors
from ._conn.source import (
    Keepalives,
    default_application_name,
    is_closed,
    terminate,
)
from ._modes import ballot_for, source_for
from ._modes.base import Mode
from ._modes.lease import DEFAULT_LEADERS_TABLE
from ._modes.session import ELECTOR_KEEPALIVES
from ._sql.elector import SETTINGS_SQL
from ._statistics import PostgresElectorStatistics

__all__ = ("PostgresElector",)

_logger = get_logger("cronlock.election")


class _Demoted(Exception):
    """Ends a term; the message says why."""


class _Term:
    """One stretch of holding the lock, from the grant to the demotion."""

    __slots__ = ("announced", "ended", "leader_from", "lease_until")

    def __init__(self, lease_until: float, leader_from: float) -> None:
        self.lease_until = lease_until
        self.leader_from = leader_from
        self.announced = False
        self.ended = asyncio.Event()


class PostgresElector(HeldOpenByBlocks):
    """A :class:`cronlock.FencedElector` on one PostgreSQL session advisory lock, or, with
    ``mode="lease"``, on a lease row in the server's time.

    **mode="lease"** works through a transaction pooler: the leadership is a row of *table*
    (``cronlock_leaders``, in *schema*) taken when expired, renewed by each heartbeat, and
    expiring on the server *lease* + 1 s after the last one; the leader stops *lease* after
    sending it, before anyone can take the row, so *takeover_delay* defaults to 0 and the
    session settings below do not apply. Closing gives the row up at once.

    **mode="session"** (default):
    Every replica runs one; the one whose dedicated session holds
    ``pg_try_advisory_lock(job_lock_key(name))`` leads. Followers retry every
    *poll_interval*. The leader checks in ``pg_locks`` every *heartbeat_interval* that its
    own backend still holds the key, and leads only while its last successful heartbeat is
    younger than *lease* (client monotonic time, so a stuck loop or a frozen process stops
    leading on its own). A new leader waits *takeover_delay* (default: *lease*) after the
    grant before :meth:`is_leader` says ``True``. The session is configured so the server
    cannot release the lock after a silent failure before the lease has lapsed: see
    ``docs/election.md``. On demotion the ``on_demoted`` callbacks run, the session is
    dropped (which frees the lock server-side) and the replica follows again.

    **Connections.** Given a DSN, the elector opens its own session with
    ``asyncpg.connect``. Given an ``asyncpg.Pool``, it borrows one connection for as long
    as the session lives and terminates it afterwards (the pool replaces it), so neither the
    lock nor the session settings ever go back into the pool. Connect through PgBouncer in
    session mode at most, and to the primary.

    Use ``async with elector:`` (or :meth:`start` / :meth:`close`). :meth:`is_leader` also
    starts it on first use, so ``Scheduler(elector=PostgresElector(dsn))`` works; close it
    to release the lock at once rather than when the process exits.
    """

    def __init__(
        self,
        pool_or_dsn: Any,
        *,
        name: str = "cronlock-leader",
        poll_interval: Seconds = 1.0,
        heartbeat_interval: Seconds = 0.25,
        lease: Seconds = 0.75,
        takeover_delay: Seconds | None = None,
        idle_session_timeout: Seconds = 2.0,
        keepalives: Keepalives = ELECTOR_KEEPALIVES,
        connect_timeout: Seconds = 5.0,
        statement_timeout: Seconds = 5.0,
        application_name: str | None = None,
        connect_kwargs: Mapping[str, Any] | None = None,
        mode: Mode = "session",
        table: str = DEFAULT_LEADERS_TABLE,
        schema: str | None = None,
    ) -> None:
        self._application_name = application_name or default_application_name()
        self._source = source_for(mode, pool_or_dsn, connect_kwargs, self._application_name)
        self._name = name
        self._poll = to_seconds(poll_interval, field="poll_interval", error=ConfigError)
        self._beat = to_seconds(heartbeat_interval, field="heartbeat_interval", error=ConfigError)
        self._lease = to_seconds(lease, field="lease", error=ConfigError)
        delay = optional_seconds(
            takeover_delay, field="takeover_delay", allow_zero=True, error=ConfigError
        )
        self._idle_timeout = to_seconds(
            idle_session_timeout, field="idle_session_timeout", error=ConfigError
        )
        self._keepalives = keepalives
        self._connect_timeout = to_seconds(
            connect_timeout, field="connect_timeout", error=ConfigError
        )
        self._statement_timeout = to_seconds(
            statement_timeout, field="statement_timeout", error=ConfigError
        )
        # The mode's ballot: what taking, proving and giving up the leadership are, and
        # the settings its fencing needs (checked here).
        self._ballot = ballot_for(
            mode,
            name,
            beat=self._beat,
            lease=self._lease,
            takeover=delay,
            idle_session_timeout=self._idle_timeout,
            keepalives=keepalives,
            application_name=self._application_name,
            table=table,
            schema=schema,
        )
        self._takeover = self._ballot.takeover_delay
        self._callbacks: list[Callable[[BaseException | None], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._entered = 0  # open async-with blocks: the Scheduler then leaves closing to them
        self._conn: Any = None
        # asyncpg runs one statement at a time per connection; session_settings() queues.
        self._statement_lock = asyncio.Lock()
        self._term: _Term | None = None
        self._terms = self._demotions = self._polls = 0
        self._heartbeats = self._sessions_opened = 0
        # Repeated failures (a database that is down) are logged once at WARNING, then DEBUG.
        self._failing = False

    # -- public API ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The election's name; in session mode its lock key is ``job_lock_key(name)``."""
        return self._name

    @property
    def application_name(self) -> str:
        """The ``application_name`` of the election session, as shown in pg_stat_activity."""
        return self._application_name

    @property
    def is_leader_now(self) -> bool:
        """Like :meth:`is_leader`, without starting the elector."""
        return self._leading()

    @property
    def terms(self) -> int:
        """Times this replica became leader."""
        return self._terms

    def statistics(self) -> PostgresElectorStatistics:
        """Return the elector's counters."""
        term = self._term
        return PostgresElectorStatistics(
            leader=self._leading(),
            terms=self._terms,
            demotions=self._demotions,
            polls=self._polls,
            heartbeats=self._heartbeats,
            sessions_opened=self._sessions_opened,
            lease_remaining=None if term is None else term.lease_until - monotonic(),
        )

    async def is_leader(self) -> bool:
        """Return ``True`` while this replica leads. Starts the elector on first use.

        Computed on the spot from the lease, so it turns ``False`` the moment the lease
        lapses, even if the background task has not run since (a blocked event loop).
        """
        if self._task is None and not self._closed:
            await self.start()
        return self._leading()

    def on_demoted(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call *callback* from the event loop, with a :class:`cronlock.LockError` saying
        why, each time this replica stops leading (closing the elector included)."""
        self._callbacks.append(callback)

    async def session_settings(self) -> dict[str, float]:
        """The server-side settings the fencing relies on, read on the election session.

        For diagnostics and tests: ``idle_session_timeout`` (set when the lock is granted),
        ``tcp_keepalives_idle``, ``tcp_keepalives_interval``, ``tcp_user_timeout`` (in
        seconds) and ``tcp_keepalives_count``, as the server has them for this session
        (zero over a Unix-domain socket). Raises :class:`cronlock.LockError` when there is
        no session or the query fails.
        """
        conn = self._conn
        if conn is None or is_closed(conn):
            raise LockError(f"election {self._name!r}: no election session is open")
        with backend_errors(f"election {self._name!r}: reading settings failed"):
            async with self._statement_lock, asyncio.timeout(self._statement_timeout):
                rows = await conn.fetch(SETTINGS_SQL)
        return {row["name"]: row["seconds"] for row in rows}

    async def start(self) -> None:
        """Start following (and, when the lock is free, leading) in a background task.

        Returns at once; idempotent. Raises :class:`cronlock.LockError` once closed.
        """
        if self._closed:
            raise LockError(f"election {self._name!r}: the PostgresElector is closed")
        if self._task is None:
            self._task = asyncio.create_task(self._main(), name=task_name("election", self._name))

    async def close(self) -> None:
        """Stop leading or following and drop the session, which frees the lock at once.

        Idempotent. The replica stops counting itself leader *before* the lock is freed.
        A cancellation that arrives meanwhile is re-raised once the task has finished.
        """
        self._closed = True
        task, self._task = self._task, None
        if task is None:
            return
        # Its outcome is not raised; we keep waiting through further cancels, so the
        # session is surely gone when close() returns.
        await cancel_and_wait(task)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun."""
        return self._closed

    async def _on_enter(self) -> None:
        await self.start()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "leader" if self._leading() else "follower"
        return f"<PostgresElector {self._name!r} {state}>"

    # -- internals -------------------------------------------------------------------------

    def _leading(self) -> bool:
        # Real monotonic time, never the scheduler's Clock: a fake or offset clock must not
        # stretch a lease that the server's timers measure in real seconds.
        term = self._term
        if term is None or term.ended.is_set():
            return False
        now = monotonic()
        conn = self._conn
        if not term.leader_from <= now < term.lease_until or conn is None or is_closed(conn):
            return False
        self._announce(term)
        return True

    def _announce(self, term: _Term) -> None:
        if not term.announced:
            term.announced = True
            self._terms += 1
            _logger.info("election %r: became leader (term %d)", self._name, self._terms)

    def _end_term(self, reason: str) -> None:
        """Stop leading now; idempotent. Must run *before* the session is dropped."""
        term, self._term = self._term, None
        if term is None:
            return
        term.ended.set()
        if not term.announced:  # is_leader() never said True in this term: nothing to undo
            _logger.info("election %r: gave the lock up before leading (%s)", self._name, reason)
            return
        self._demotions += 1
        _logger.info("election %r: lost leadership (%s)", self._name, reason)
        error = LockError(f"election {self._name!r}: lost leadership: {reason}")
        loop = asyncio.get_running_loop()
        for callback in self._callbacks:
            loop.call_soon(callback, error)

    async def _main(self) -> None:
        # The task must outlive every failure but its own cancellation (close()).
        while True:
            try:
                await self._session()
            except Exception as exc:
                level = logging.DEBUG if self._failing else logging.WARNING
                self._failing = True
                _logger.log(level, "election %r: %s; retrying", self._name, exc)
            await asyncio.sleep(self._poll)

    async def _session(self) -> None:
        """Open a session, follow until the lock is granted, lead until demoted."""
        conn = await self._open()
        self._conn = conn

        def lost(_: object) -> None:
            if self._conn is conn:  # asyncpg calls this soon after the connection closes
                self._end_term("the connection to the server was lost")

        conn.add_termination_listener(lost)
        try:
            send, received = await self._follow(conn)
            self._term = _Term(send + self._lease, received + self._takeover)
            await self._lead(conn, self._term)
        except _Demoted as exc:
            self._end_term(str(exc))
        except asyncio.CancelledError:
            self._end_term("the elector was closed" if self._closed else "cancelled")
            raise
        except BaseException as exc:
            self._end_term(f"unexpected error: {exc!r}")
            raise
        finally:
            if not is_closed(conn):
                # Demoted already (above): give the leadership up, so that another replica
                # need not wait (lease mode's row; session mode drops the session below).
                release = self._ballot.release(conn, timeout=self._statement_timeout)
                await uncancellable(release, name=task_name("election-release"))
            # Synchronous from here on, so no cancellation can come between demoting
            # (above) and dropping the session, which is what frees the lock.
            self._conn = None
            with ignoring_backend_errors():
                conn.remove_termination_listener(lost)
            terminate(conn)

    async def _open(self) -> Any:
        conn, interrupted = await self._source.open(
            self._ballot.set_up, timeout=self._connect_timeout
        )
        if interrupted is not None:
            terminate(conn)  # synchronous: a second cancel cannot skip it
            raise interrupted
        self._sessions_opened += 1
        if self._failing:
            _logger.info("election %r: connected again", self._name)
        self._failing = False
        return conn

    async def _follow(self, conn: Any) -> tuple[float, float]:
        """Try the lock every poll_interval; return (send, receive) times of the grant."""
        while True:
            send = monotonic()
            # A timeout or failure leaves us unsure whether the server granted the lock;
            # the caller then terminates the session, which settles it.
            with backend_errors("taking the leadership failed"):
                async with self._statement_lock, asyncio.timeout(self._statement_timeout):
                    got = await self._ballot.acquire(conn)
            received = monotonic()
            self._polls += 1
            if got:
                _logger.debug("election %r: lock granted; taking over", self._name)
                return send, received
            _logger.debug("election %r: another replica leads", self._name)
            await asyncio.sleep(self._poll)

    async def _lead(self, conn: Any, term: _Term) -> None:
        """Heartbeat until demoted: raises _Demoted, or returns if the term already ended."""
        next_beat = term.lease_until - self._lease + self._beat
        while True:
            while (now := monotonic()) < next_beat:
                wake = next_beat
                if not term.announced:
                    if now >= term.leader_from:
                        self._announce(term)
                    else:
                        wake = min(wake, term.leader_from)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wake - now):
                        await term.ended.wait()  # set when the connection is lost
                if term.ended.is_set():
                    return
            send = monotonic()
            left = term.lease_until - send
            if left <= 0:
                raise _Demoted("the lease lapsed before the next heartbeat; loop blocked?")
            try:
                with backend_errors("the heartbeat"):
                    async with asyncio.timeout(left), self._statement_lock:
                        held = await self._ballot.renew(conn)
            except LockError as exc:
                cause = exc.__cause__
                if isinstance(cause, TimeoutError):
                    raise _Demoted(
                        f"no heartbeat answer within the lease ({self._lease:g}s)"
                    ) from cause
                raise _Demoted(f"the heartbeat failed: {cause!r}") from cause
            if not held:
                raise _Demoted("the server no longer shows this replica holding the leadership")
            if monotonic() >= term.lease_until:
                # Answered, but only after a stall: is_leader() may already have said
                # False, and flip-flopping without on_demoted would confuse the scheduler.
                raise _Demoted("the lease lapsed while the heartbeat was in flight")
            term.lease_until = send + self._lease
            self._heartbeats += 1
            next_beat = send + self._beat
