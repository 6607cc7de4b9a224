"""The simulated PostgreSQL server: sessions, advisory locks, server time, statements
answered one at a time per session, and the server-side faults.

A statement arrives after the network's delay, waits while the server is stalled or a table
it touches is locked (up to the session's ``lock_timeout``), then runs atomically at one
virtual instant (:mod:`.statements` says what each named statement does) and commits; its
answer travels back after the network's delay. What the simulated server does not model is
listed in docs/testing.md.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .db import Database
from .rows import Row

__all__ = ("Request", "Session", "SimServer")

NOTICE_DEAD_PEER = 60.0
"""Seconds until the server ends a session whose client went silent without closing
(the locker's keepalives: ``tcp_user_timeout`` 60 s)."""


@dataclass(eq=False, slots=True)
class Request:
    """One statement sent by a client: its text, its arguments, where its answer goes."""

    sql: str
    args: tuple[Any, ...]
    answer: Callable[[Any, BaseException | None], None]
    cancelled: bool = False
    done: bool = False
    prepared: bool = False
    """The client had it prepared: it goes straight to execution. One that is not waits
    (on a table lock, say) in its prepare step, and never executes if its client is gone
    by the time that step ends (the execute message is sent only after the prepare's
    answer)."""


@dataclass(eq=False, slots=True)
class Session:
    """A backend: its pid, who opened it, its locks and settings, its queue of statements."""

    pid: int
    client: str
    application_name: str = ""
    queue: deque[Request] = field(default_factory=deque)
    busy: bool = False
    alive: bool = True
    cut: bool = False
    """The network between client and server is gone: nothing arrives, nothing leaves."""
    closing: bool = False
    """Its client is gone; it ends once the statement it is running ends."""
    client_left: bool = False
    """Its client closed or terminated the connection (the backend may not know yet)."""
    in_transaction: bool = False
    lock_timeout: float | None = None
    xact_locks: list[int] = field(default_factory=list)
    on_end: Callable[[str], None] | None = None


class SimServer:
    """One database server (a primary; a failover swaps its identity and loses commits)."""

    def __init__(self, world: Any, statements: Any) -> None:
        """*world*: the :class:`.world.World` it lives in; *statements*: what it answers
        (:class:`.statements.Statements`)."""
        self.world = world
        self.statements = statements
        self.db = Database()
        self.sessions: dict[int, Session] = {}
        self.locks: dict[int, tuple[int, int]] = {}  # key -> (pid, count)
        self._pids = itertools.count(1001)
        self.system = "7300000000000000001"
        self.timeline = 1
        self.started = world.at(world.now)
        """``pg_postmaster_start_time()``: when it last started (a restart changes it)."""
        self.up = True
        self.stalled_until = 0.0
        self.table_locks: dict[str, float] = {}  # quoted table name -> locked until
        self.skew = 0.0  # seconds the server's clock reads off true time
        self.reply_lost: list[Callable[[Request, Session], bool]] = []
        self.reply_hang: list[tuple[Callable[[Request, Session], bool], float]] = []
        self._lock_waiters: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.statements_run = 0

    # -- time ---------------------------------------------------------------------------

    def clock(self) -> datetime:
        """``clock_timestamp()``: the server's own clock."""
        instant: datetime = self.world.at(self.world.clock.now + self.skew)
        return instant

    # -- sessions -----------------------------------------------------------------------

    def open_session(self, client: str, on_end: Callable[[str], None]) -> Session:
        """A new backend for *client*."""
        session = Session(next(self._pids), client, on_end=on_end)
        self.sessions[session.pid] = session
        return session

    def end_session(self, session: Session, reason: str, *, tell_client: bool = True) -> None:
        """The backend exits: its locks are released, its queued statements never run."""
        if not session.alive:
            return
        session.alive = False
        self.sessions.pop(session.pid, None)
        for key, (pid, _) in list(self.locks.items()):
            if pid == session.pid:
                del self.locks[key]
        session.queue.clear()
        if tell_client and not session.cut and session.on_end is not None:
            session.on_end(reason)

    def client_gone(self, session: Session) -> None:
        """The client closed or terminated its connection (its goodbye arrives now)."""
        if session.cut:
            return  # a goodbye on a cut network never arrives: noticed by keepalives
        session.client_left = True  # in its socket now, whenever the backend reads it
        self.world.call_at(max(self.world.now, self.stalled_until), self._ended_by_client, session)

    def _ended_by_client(self, session: Session) -> None:
        if session.busy:
            # A backend notices its client is gone only when it next talks to it: a
            # statement it is executing (or waiting on a lock for) goes on to its end and
            # commits (seen on PostgreSQL 15: a prepared claim blocked behind a table lock,
            # its client timed out and gone, committed once the lock was released; one
            # blocked in its prepare step never executed: tests/postgres/
            # test_sim_agreement.py).
            session.closing = True
            return
        self.end_session(session, "the client closed it", tell_client=False)

    def cut(self, session: Session) -> None:
        """The network to this session's client is gone for good; the server notices after
        :data:`NOTICE_DEAD_PEER` seconds and ends the session."""
        session.cut = True
        self.world.call_at(
            self.world.now + NOTICE_DEAD_PEER, self.end_session, session, "keepalives"
        )

    # -- statements ---------------------------------------------------------------------

    def arrive(self, session: Session, request: Request) -> None:
        """*request* reached the server."""
        if not session.alive or session.cut:
            return
        session.queue.append(request)
        if not session.busy:
            self._next(session)

    def _next(self, session: Session) -> None:
        if session.closing:
            session.busy = False
            self.end_session(session, "the client closed it", tell_client=False)
            return
        if not session.queue or not session.alive:
            session.busy = False
            return
        session.busy = True
        self._attempt(session, session.queue[0], self.world.now)

    def _attempt(self, session: Session, request: Request, since: float) -> None:
        """Run *request* now if nothing holds it back, else look again when that ends."""
        if not session.alive:
            return
        # A statement the client gave up on runs all the same: the library ends such a
        # session (terminate) rather than ask the server to cancel the statement.
        now = self.world.now
        if now < self.stalled_until or not self.up:
            if self.up:
                self.world.call_at(self.stalled_until, self._attempt, session, request, since)
            return
        blocked = self._blocked_until(request.sql)
        if blocked is not None:
            timeout = session.lock_timeout
            if timeout is not None and blocked - since > timeout:
                self.world.call_at(since + timeout, self._lock_timed_out, session, request)
            else:
                self.world.call_at(blocked, self._attempt, session, request, since)
            return
        session.queue.popleft()
        if session.client_left and not request.prepared:
            self._next(session)  # its client left during the prepare step: nothing runs
            return
        self._execute(session, request)
        self._next(session)

    def _lock_timed_out(self, session: Session, request: Request) -> None:
        if not session.alive or request.done:
            return
        import asyncpg

        session.queue.popleft()
        self._reply(session, request, None, asyncpg.LockNotAvailableError("lock timeout"))
        self._next(session)

    def _blocked_until(self, sql: str) -> float | None:
        until = None
        for name, end in self.table_locks.items():
            if end > self.world.now and name in sql:
                until = end if until is None else max(until, end)
        return until

    def _execute(self, session: Session, request: Request) -> None:
        handler = self.statements.lookup(request.sql)
        self.db.begin(self.clock())
        try:
            result = handler(Exec(self, session), request.args)
        except BaseException as exc:
            self.db.rollback()
            import asyncpg

            if isinstance(exc, asyncpg.PostgresError):
                self._reply(session, request, None, exc)
                return
            raise
        self.db.commit()
        self.statements_run += 1
        self._reply(session, request, result, None)

    def _reply(
        self, session: Session, request: Request, result: Any, error: BaseException | None
    ) -> None:
        request.done = True
        for armed in self.reply_lost:
            if armed(request, session):
                self.reply_lost.remove(armed)
                self.world.log(f"fault: the answer to {session.client}'s statement is lost")
                self.cut(session)
                return
        delay = self.world.latency()
        for armed, hang in self.reply_hang:
            if armed(request, session):
                self.reply_hang.remove((armed, hang))
                self.world.log(f"fault: the answer to {session.client}'s statement hangs {hang}s")
                delay += hang
                break
        self.world.call_at(self.world.now + delay, self._deliver, session, request, result, error)

    def _deliver(
        self, session: Session, request: Request, result: Any, error: BaseException | None
    ) -> None:
        if session.cut:
            return
        request.answer(result, error)

    # -- advisory locks -----------------------------------------------------------------

    def try_lock(self, session: Session, key: int) -> bool:
        """``pg_try_advisory_lock``: re-entrant for the holding session."""
        held = self.locks.get(key)
        if held is None:
            self.locks[key] = (session.pid, 1)
            return True
        pid, count = held
        if pid == session.pid:
            self.locks[key] = (pid, count + 1)
            return True
        return False

    def unlock(self, session: Session, key: int) -> bool:
        """``pg_advisory_unlock``: whether this session held it."""
        held = self.locks.get(key)
        if held is None or held[0] != session.pid:
            return False
        pid, count = held
        if count > 1:
            self.locks[key] = (pid, count - 1)
        else:
            del self.locks[key]
        return True

    def unlock_all(self, session: Session) -> None:
        """``pg_advisory_unlock_all``."""
        for key, (pid, _) in list(self.locks.items()):
            if pid == session.pid:
                del self.locks[key]

    def holder_of(self, key: int) -> Session | None:
        """The session holding advisory lock *key*, if any."""
        held = self.locks.get(key)
        return None if held is None else self.sessions.get(held[0])

    # -- whole-server faults --------------------------------------------------------------

    def crash(self, down: float, *, lose: int = 0, new_identity: bool = False) -> None:
        """Every backend dies; the server takes *down* seconds to come back (a restart, or
        a standby promoted missing the last *lose* commits, with a new timeline)."""
        for session in list(self.sessions.values()):
            self.end_session(session, "the server crashed")
        self.up = False
        lost = self.db.lose_last(lose)
        if new_identity:
            self.timeline += 1
        self.world.log(f"server down for {down}s, {lost} commit(s) lost, timeline {self.timeline}")
        self.world.call_at(self.world.now + down, self._back)

    def _back(self) -> None:
        self.up = True
        self.started = self.clock()
        self.world.log("server up")


class Exec:
    """What a statement's handler sees: the data, the session, the server's clock and locks."""

    __slots__ = ("db", "now", "server", "session")

    def __init__(self, server: SimServer, session: Session) -> None:
        self.server = server
        self.session = session
        self.db = server.db
        self.now = server.clock()

    @property
    def pid(self) -> int:
        """``pg_backend_pid()``."""
        return self.session.pid

    def try_lock(self, key: int) -> bool:
        """``pg_try_advisory_lock(key)`` for this session."""
        return self.server.try_lock(self.session, key)

    def unlock(self, key: int) -> bool:
        """``pg_advisory_unlock(key)`` for this session."""
        return self.server.unlock(self.session, key)

    def session_alive(self, pid: int | None) -> bool:
        """Whether backend *pid* is alive (``pg_stat_activity`` has it)."""
        return pid is not None and pid in self.server.sessions

    @staticmethod
    def row(names: list[str] | tuple[str, ...], *values: Any) -> Row:
        """One answer row."""
        return Row(names, values)


_ = heapq  # (kept for the lock waiters of a later blocking-lock model)
