"""Session mode (``mode="session"``, the seed's recipe): a session advisory lock on a
dedicated connection says who runs a job.

The server releases a session's locks the moment the session ends, so a dropped session
loses the holds granted on it (:meth:`SessionLocks.dropped` marks them lost, and the
scheduler ends their runs), and an end of a hold may only go out on the session that
granted it. A crashed run is an unfinished ledger row whose claiming backend is gone from
``pg_stat_activity`` and whose owner's members row expired (``_sql/crashes.owner_gone``: a
failover leaves every backend unknown, not every replica dead). Upkeep checks the sessions
that hold locks (the heartbeat). It needs a direct connection: a pooler in between is
refused (:func:`refuse_pooler`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from logging import ERROR, INFO
from typing import TYPE_CHECKING, Any, TypeVar

from ..._clock import monotonic
from ..._errors import ConfigError, LockError, PoolerDetected
from ..._keys import job_lock_key
from ..._logs import get_logger
from ..._service import Service
from .._conn import Channel
from .._conn.dedicated import DedicatedConnection
from .._conn.errors import prepared_statements_clash, server_answered
from .._conn.primary import refuse_read_only
from .._conn.source import Keepalives, configure_session
from .._sql import upkeep
from .._sql.claims import TRY_LOCK_SQL, claim_many_sql, finish_many_sql, undo_lost_sql
from .._sql.crashes import crashed_sql, recover_sql
from .._sql.elector import ACQUIRE_SQL
from .._sql.elector import HEARTBEAT_SQL as LEADER_HELD_SQL
from .._sql.runs import late_finish_sql
from .._sql.sessions import BACKEND_PID_SQL, END_LOST_BACKEND_OLD_SQL, END_LOST_BACKEND_SQL
from .._sql.tables import LedgerTable
from .base import (
    Ballot,
    Channels,
    End,
    Exclusion,
    Kept,
    Statement,
    prepare_ledger,
)

if TYPE_CHECKING:
    from ..._records import RunRecord

__all__ = (
    "ELECTOR_KEEPALIVES",
    "SessionBallot",
    "SessionLocks",
    "SessionRules",
    "check_fencing",
    "mark_dropped",
    "pooler_seen",
    "refuse_pooler",
    "set_up_session",
)

_logger = get_logger("cronlock.postgres")
_DROPS_APART = 60.0
"""Seconds within which a locker's lost lock sessions are one outage (said once at ERROR)."""
_A = TypeVar("_A")
_B = TypeVar("_B")


class SessionRules(Exclusion):
    """What holds of session advisory locks, with a ledger or without (see the module)."""

    mode = "session"
    heartbeat = True
    _dropped_said = float("-inf")  # when a lost lock session was last said at ERROR

    def channels(self, given: Channels) -> tuple[Channel, ...]:
        """*sessions* dedicated sessions, set up as lock sessions; a job's lock on
        ``key % sessions``."""
        self._backends: dict[int, int] = {}  # each shard's backend pid, the latest
        set_up = functools.partial(
            self._set_up,
            where=given.source.describe(),
            application_name=given.application_name,
            keepalives=given.keepalives,
            create=given.create_table,
            timeout=given.connect_timeout,
        )
        return tuple(
            DedicatedConnection(
                given.source,
                connect_timeout=given.connect_timeout,
                statement_timeout=given.statement_timeout,
                on_open=given.on_open,
                on_server=given.on_server,
                on_drop=functools.partial(given.on_drop, shard),
                set_up=functools.partial(set_up, shard=shard),
            )
            for shard in range(given.sessions)
        )

    async def _set_up(
        self,
        conn: Any,
        *,
        shard: int,
        where: str,
        application_name: str,
        keepalives: Keepalives | None,
        create: bool,
        timeout: float,
    ) -> None:
        """A new session: set up to hold session locks on the primary (and, with a ledger,
        the ledger made current); the backend of the shard's session before it ended, if
        the server still keeps it (:func:`_end_lost_backend`)."""
        await set_up_session(
            conn, where=where, application_name=application_name, keepalives=keepalives
        )
        # A standby grants advisory locks too, but only against its own sessions.
        await refuse_read_only(conn)
        backends = self._backends
        lost, backends[shard] = backends.get(shard), conn.get_server_pid()
        if lost is not None and lost != backends[shard]:
            await _end_lost_backend(conn, lost, application_name)
        await self._prepare(conn, create=create, timeout=timeout)

    async def _prepare(self, conn: Any, *, create: bool, timeout: float) -> None:
        """Make the ledger current on a new session (without one: nothing to do)."""

    def may_end(self, generation: int, session: Channel) -> bool:
        """Only on the session that granted the lock: a later one holds none of it."""
        return generation == session.generation and session.conn is not None

    async def end_on(self, session: Channel) -> tuple[Any, int] | None:
        """The session as it is: never reconnect for an end (a new session holds nothing)."""
        conn = session.conn
        return None if conn is None else (conn, session.generation)

    def stray(self, row: Mapping[str, Any]) -> bool:
        """Never: a lock taken for a slot claimed meanwhile is given back in the statement."""
        return False

    def unreleased(self, end: End) -> str | None:
        """A lock that was not held at unlock is worth a warning."""
        return "its lock was no longer held at unlock"

    def granted(self, hold: Kept, sent: float, generation: int, session: Channel) -> bool:
        """Lost already if its session died between the answer and now."""
        return session.generation == generation

    def released(self, hold: Kept) -> None:
        """Nothing is kept."""

    def dropped(self, held: Mapping[int, Kept], shard: int, shards: int, reason: str) -> int:
        """The locks on the dropped session are gone: mark their holds lost."""
        now = monotonic()
        said, self._dropped_said = self._dropped_said, now
        # The first lost session of an outage is news (ERROR); the others of the same
        # outage say the same again, and each run they cut is an ERROR of its own.
        level = ERROR if now - said >= _DROPS_APART else INFO
        return mark_dropped(held, shard, shards, reason, level=level)

    def services(self) -> Sequence[Service]:
        """None: upkeep's heartbeat is what checks the sessions."""
        return ()


class SessionLocks(SessionRules):
    """Session advisory locks over the ledger *table* (``mode="session"``), claimed as
    *holder* (the locker's members row; ``None``: a standalone run's, which has none)."""

    def __init__(self, table: LedgerTable, *, holder: str | None = None) -> None:
        self.ledger = self._table = table
        self._holder = holder
        self._claim_sql = claim_many_sql(table)
        self._finish_sql = finish_many_sql(table)
        self._recover_sql = recover_sql(table)
        self._crashed_sql = crashed_sql(table)
        self._late_sql = late_finish_sql(table)
        self._undo_sql = undo_lost_sql(table)

    def ledger_or(self, without: Callable[[], _A], kept: Callable[[LedgerTable], _B]) -> _A | _B:
        """*kept* of the ledger."""
        return kept(self._table)

    async def _prepare(self, conn: Any, *, create: bool, timeout: float) -> None:
        await prepare_ledger(
            conn, table=self._table, create=create, timeout=timeout, mode="session"
        )

    def claim(
        self, keys: list[int], jobs: list[str], slots: list[datetime], host: str, pid: int
    ) -> Statement:
        """Lock and claim (:func:`.._sql.claims.claim_many_sql`)."""
        return Statement(self._claim_sql, (keys, jobs, slots, host, pid, self._holder))

    def finish(self, ends: Sequence[End], host: str, pid: int) -> Statement:
        """Record and unlock (:func:`.._sql.claims.finish_many_sql`)."""
        return Statement(self._finish_sql, _end_args(ends, host, pid))

    def undo_lost(
        self, jobs: list[str], slots: list[datetime], host: str, pid: int
    ) -> Statement | None:
        """Delete the rows of lost claims (:func:`.._sql.claims.undo_lost_sql`)."""
        return Statement(self._undo_sql, (jobs, slots, host, pid))

    def takeover(
        self, key: int, job: str, slot: datetime, host: str, pid: int, attempt: int
    ) -> Statement | None:
        """Lock and take the row over (:func:`.._sql.crashes.recover_sql`)."""
        return Statement(self._recover_sql, (key, job, slot, host, pid, attempt, self._holder))

    def crashed(self, host: str, pid: int) -> Statement | None:
        """Unfinished rows whose claiming session is gone, and their owner (its members
        row) with it."""
        return Statement(self._crashed_sql, (host, pid, self._holder, upkeep.MEMBER_TTL))

    def late_finish(
        self, late: Sequence[tuple[str, datetime, RunRecord, int]], host: str, pid: int
    ) -> Statement | None:
        """The outcomes of runs whose session died (:func:`.._sql.runs.late_finish_sql`)."""
        return Statement(self._late_sql, _late_args(late, host, pid))


async def _end_lost_backend(conn: Any, pid: int, application_name: str) -> None:
    """End backend *pid*, a lock session of this replica whose connection was lost, if the
    server still keeps it: a session whose client was cut off (a network cut, an answer
    lost) lives on until the server's keepalives fail, minutes or hours, holding its
    advisory locks, and no replica could run those jobs meanwhile; this replica already
    counts its holds lost. Waits up to :data:`_END_WAIT` for it to exit (PostgreSQL >= 14).
    A refusal (a role that may not signal it) is logged and set-up goes on."""
    try:
        if conn.get_server_version().major >= 14:
            ended = await conn.fetchval(
                END_LOST_BACKEND_SQL, pid, application_name, int(_END_WAIT * 1000)
            )
        else:
            ended = await conn.fetchval(END_LOST_BACKEND_OLD_SQL, pid, application_name)
    except Exception as exc:
        if not server_answered(exc):
            raise  # the new session failed too: set-up fails as any would
        _logger.warning("could not end backend %d, a lock session lost: %r", pid, exc)
        return
    if ended:
        _logger.warning(
            "ended backend %d, a lock session of this replica the server still kept after "
            "its connection was lost (its locks were held meanwhile)",
            pid,
        )


_END_WAIT = 5.0
"""Seconds a new lock session waits for the lost one's backend to exit."""


def _end_args(ends: Sequence[End], host: str, pid: int) -> tuple[object, ...]:
    """The arguments ``$1``-``$9`` of the finish statements shared by both ledger modes."""
    return (
        [end.job for end in ends],
        [end.slot for end in ends],
        [end.outcome for end in ends],
        [end.error for end in ends],
        [end.key for end in ends],
        [end.undo for end in ends],
        host,
        pid,
        [end.started for end in ends],
    )


def _late_args(
    late: Sequence[tuple[str, datetime, RunRecord, int]], host: str, pid: int
) -> tuple[object, ...]:
    """The arguments ``$1``-``$9`` of the late outcome statements of both ledger modes."""
    return (
        [job for job, _, _, _ in late],
        [slot for _, slot, _, _ in late],
        [record.outcome for _, _, record, _ in late],
        [record.error for _, _, record, _ in late],
        [record.finished_at for _, _, record, _ in late],
        [attempt for _, _, _, attempt in late],
        host,
        pid,
        [record.started_at for _, _, record, _ in late],
    )


def mark_dropped(
    held: Mapping[int, Kept], shard: int, shards: int, reason: str, *, level: int = ERROR
) -> int:
    """Mark lost the holds in *held* (by lock key) on *shard* of *shards*; return how many
    (said at *level*)."""
    lost = [hold for key, hold in held.items() if not hold.lost and key % shards == shard]
    for hold in lost:
        hold.mark_lost(LockError(f"job {hold.job!r}: the lock session was dropped: {reason}"))
    if lost:
        _logger.log(
            level,
            "lock session %d dropped (%s): the locks of %s are lost and may be taken "
            "by another replica",
            shard,
            reason,
            sorted(hold.job for hold in lost),
        )
    return len(lost)


async def set_up_session(
    conn: Any, *, where: str, application_name: str, keepalives: Keepalives | None
) -> None:
    """Set a new session up to hold session locks: its settings, and no pooler between.

    A clash of asyncpg's named prepared statements with another client's (or one missing
    its own) on a pooled backend is what only a transaction pooler does: it is said so.
    """
    try:
        await configure_session(conn, application_name=application_name, keepalives=keepalives)
        await refuse_pooler(conn, where)
    except Exception as exc:
        if not prepared_statements_clash(exc):
            raise
        raise PoolerDetected(
            f"the {where} is reached through a transaction pooler (prepared statements "
            f"clash: {exc!r}); session advisory locks cannot work through it. Use "
            "PostgresLocker(..., mode='lease'), or a direct connection"
        ) from exc


_pooler_told = False  # whether refuse_pooler has logged its ERROR in this process


async def pooler_seen(conn: Any) -> str | None:
    """What shows that a pooler or proxy sits between *conn* and its server (``announced
    pid A, then backends B and C``), or ``None`` when *conn* is a server backend of its own.

    The pid a server announces at connect (asyncpg's ``get_server_pid()``) is that backend's
    own; a pooler or proxy announces one of its making instead, which no backend has. Two
    reads of ``pg_backend_pid()`` in two transactions must also agree. *conn* must keep no
    named prepared statements (``statement_cache_size=0``) when it may be pooled.
    """
    announced = conn.get_server_pid()
    first = await conn.fetchval(BACKEND_PID_SQL)
    second = await conn.fetchval(BACKEND_PID_SQL)
    if first == announced == second:
        return None
    return f"announced pid {announced}, then backends {first} and {second}"


async def refuse_pooler(conn: Any, where: str) -> None:
    """Raise :class:`PoolerDetected` unless *conn* is a server backend of its own
    (:func:`pooler_seen`)."""
    seen = await pooler_seen(conn)
    if seen is None:
        return
    global _pooler_told
    log = _logger.debug if _pooler_told else _logger.error  # said once; retries are quiet
    _pooler_told = True
    log(
        "a connection pooler or proxy sits between this replica and PostgreSQL (%s); session "
        "advisory locks cannot work through it. Use PostgresLocker(..., mode='lease') "
        "(docs/guides/poolers.md), or connect to the server directly",
        seen,
    )
    raise PoolerDetected(
        f"the {where} is reached through a connection pooler or proxy ({seen}): a session "
        "advisory lock taken through PgBouncer in transaction mode, Supavisor, Neon's or "
        "Heroku's pooler or RDS Proxy is not held by a session of ours. Use "
        "PostgresLocker(..., mode='lease'), which needs no session, or a direct connection"
    )


class SessionBallot(Ballot):
    """Leadership as a session advisory lock on ``job_lock_key(name)``.

    Taking it also makes the session die after ``idle_session_timeout`` of silence;
    proving it is reading ``pg_locks`` for our own backend; giving it up is dropping the
    session, which the elector does anyway. The settings must obey the fencing rule
    (:func:`check_fencing`): the server may not free the lock before the lease lapsed.
    """

    def __init__(
        self,
        name: str,
        *,
        idle_session_timeout: float,
        application_name: str,
        keepalives: Keepalives,
        beat: float,
        lease: float,
        takeover: float | None,
    ) -> None:
        self._key = job_lock_key(name)
        self._idle = str(int(idle_session_timeout * 1000))
        self._application_name = application_name
        self._keepalives = keepalives
        # After a reset, the old leader's lease must have lapsed before the new one leads.
        self.takeover_delay = lease if takeover is None else takeover
        check_fencing(
            beat=beat,
            lease=lease,
            takeover=self.takeover_delay,
            idle_session_timeout=idle_session_timeout,
            keepalives=keepalives,
        )

    async def set_up(self, conn: Any) -> None:
        """Label the session, set its keepalives, and refuse a pooler in between and a
        server that is not the primary."""
        await configure_session(
            conn, application_name=self._application_name, keepalives=self._keepalives
        )
        await refuse_pooler(conn, "election session")
        await refuse_read_only(conn)

    async def acquire(self, conn: Any) -> bool:
        """Try the lock; if granted, bound the session's silence (PostgreSQL >= 14)."""
        if conn.get_server_version().major >= 14:
            return bool(await conn.fetchval(ACQUIRE_SQL, self._key, self._idle))
        # No idle_session_timeout: a frozen leader then blocks failover until it wakes.
        return bool(await conn.fetchval(TRY_LOCK_SQL, self._key))

    async def renew(self, conn: Any) -> bool:
        """Whether our own backend still holds the lock (asking it again would prove
        nothing: the lock is re-entrant)."""
        return bool(await conn.fetchval(LEADER_HELD_SQL, self._key))

    async def release(self, conn: Any, *, timeout: float) -> None:
        """Nothing to do: the elector drops the session, which frees the lock."""


# Short enough that a silent cut releases the lock in a few seconds; long enough, relative
# to the 0.75 s default lease, that the server cannot release it before the lease lapses.
ELECTOR_KEEPALIVES = Keepalives(idle=2, interval=1, count=2, user_timeout=3.0)

# Server-side slack, beyond the lease, that the fencing rule insists on.
MIN_MARGIN = 1.0


def check_fencing(
    *,
    beat: float,
    lease: float,
    takeover: float,
    idle_session_timeout: float,
    keepalives: Keepalives,
) -> None:
    """Refuse settings under which the server could free the lock before the lease ends."""
    if beat >= lease:
        raise ConfigError(
            f"heartbeat_interval ({beat:g}s) must be shorter than lease "
            f"({lease:g}s), or every lease lapses before it can be renewed"
        )
    if takeover < lease:
        raise ConfigError(
            f"takeover_delay ({takeover:g}s) must be at least lease "
            f"({lease:g}s): after a connection reset the old leader's lease must "
            "have lapsed before the new leader starts"
        )
    ka = keepalives
    if ka.user_timeout is None:
        raise ConfigError(
            "keepalives.user_timeout must be set for an elector: without it, how soon "
            "the server drops a silent client depends on the host's TCP settings"
        )
    # The earliest the server may notice a silent client, measured from the last packet
    # it received: no keepalive probe before `idle`, no user-timeout abort before
    # `user_timeout`, no idle-session abort before `idle_session_timeout`. Whole seconds
    # and milliseconds, as configure_session and PostgreSQL round them.
    floors = {
        "idle_session_timeout": int(idle_session_timeout * 1000) / 1000,
        "keepalives.idle": float(int(ka.idle)),
        "keepalives.user_timeout": int(ka.user_timeout * 1000) / 1000,
    }
    field, floor = min(floors.items(), key=lambda item: item[1])
    if floor < 2 * lease or floor - lease < MIN_MARGIN:
        raise ConfigError(
            f"{field} ({floor:g}s) is too short for lease ({lease:g}s): it must be "
            f"at least twice the lease and {MIN_MARGIN:g}s longer, so the server cannot "
            "release the lock before the old leader's lease has lapsed"
        )
