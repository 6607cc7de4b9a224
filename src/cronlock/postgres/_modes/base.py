"""The seam between the coordination modes: what a mode decides, as behaviour.

A :class:`PostgresLocker <cronlock.postgres.PostgresLocker>` is built from parts that do not
know which mode they serve (the batcher, the claims, upkeep, the crash watch, the locker
itself); each asks its :class:`Exclusion` whenever the modes would differ. There are three:

- :class:`~._modes.session.SessionLocks` (``mode="session"``): a session advisory lock on a
  dedicated connection says who runs a job; a dropped session loses its holds.
- :class:`~._modes.lease.LeaseRows` (``mode="lease"``): a lease row, valid in the server's
  time, says it; nothing lives in a session, and a holder that cannot renew is fenced.
- :class:`~._modes.bare.BareLocks` (``ledger=False``): the seed's recipe, session advisory
  locks and no ledger at all.

:func:`cronlock.postgres._modes.exclusion_for` is the one place a mode is chosen.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from ..._errors import LockerMisconfigured
from ..._logs import get_logger
from ..._service import Service
from .._sql.grants import missing_privileges
from .._sql.schema import CURRENT_USER_SQL, ledger_state, migrate
from .._sql.sessions import BACKEND_PID_SQL

if TYPE_CHECKING:
    from ..._records import RunRecord
    from .._conn import Channel
    from .._conn.primary import Server
    from .._conn.source import ConnectionSource, Keepalives
    from .._sql.tables import LedgerTable

__all__ = (
    "FENCED",
    "Ballot",
    "Channels",
    "End",
    "Exclusion",
    "Kept",
    "Mode",
    "Statement",
    "prepare_ledger",
)

_logger = get_logger("cronlock.postgres")
_A = TypeVar("_A")
_B = TypeVar("_B")

Mode = Literal["session", "lease"]
"""``PostgresLocker(mode=...)``: where exclusion lives."""


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement's text and its arguments, built together (no ``$n`` to count)."""

    sql: str
    args: tuple[object, ...]


class End(Protocol):
    """What a mode reads of one run's end (the batcher's requests are ends)."""

    @property
    def job(self) -> str:
        """The job's name."""
        ...

    @property
    def key(self) -> int:
        """Its lock key."""
        ...

    @property
    def slot(self) -> datetime:
        """The slot its run stood for."""
        ...

    @property
    def generation(self) -> int:
        """The channel generation its hold was granted on."""
        ...

    @property
    def outcome(self) -> str | None:
        """How the run ended (``None``: an undo)."""
        ...

    @property
    def error(self) -> str | None:
        """What failed, if anything."""
        ...

    @property
    def started(self) -> datetime | None:
        """When the run began (``None``: the claim's start stands)."""
        ...

    @property
    def undo(self) -> bool:
        """Whether the claim is given back rather than recorded."""
        ...


FENCED = "it could not be renewed in time (fenced before it expires)"
"""Why a lease is lost when its fence passes (said by its keeper, or by the hold itself
when a run claimed ahead would begin past it: ``PostgresHold.on_lost``)."""


class Kept(Protocol):
    """What a mode reads and does of a hold it keeps (a PostgresHold)."""

    job: str
    slot: datetime
    trusted_until: float
    """Loop time until which the hold may be trusted (a lease's fence; the keeper sets it)."""

    @property
    def lost(self) -> bool:
        """Whether the hold is lost."""
        ...

    def mark_lost(self, because: BaseException) -> None:
        """Mark the hold lost *because* (the scheduler then ends its run)."""
        ...


@dataclass(frozen=True, slots=True)
class Channels:
    """What a mode needs to make a locker's connections (see :meth:`Exclusion.channels`)."""

    source: ConnectionSource
    sessions: int
    create_table: bool
    connect_timeout: float
    statement_timeout: float
    application_name: str
    keepalives: Keepalives | None
    on_open: Callable[[], None]
    on_server: Callable[[Server | None], None]
    """Told which server each new connection reached (a new primary is noticed there)."""
    on_drop: Callable[[int, str], None]
    on_fenced: Callable[[], None]
    holder: str


class Exclusion(abc.ABC):
    """Where a locker's exclusion lives, and every rule that follows from it.

    Implementations hold the statements of their mode over one ledger (or none), and the
    locker's state of that mode (lease mode's renewals).
    """

    mode: Mode
    """What ``PostgresLocker.mode`` reports."""
    ledger: LedgerTable | None
    """The run ledger, or ``None`` (``ledger=False``)."""
    heartbeat: bool
    """Whether upkeep checks the sessions that hold locks (their death loses them)."""
    end_failed = "the lock session was terminated, which releases the locks server-side"
    """What becomes of the locks of runs whose end statement failed (said in a WARNING)."""
    gone_hold = "lock session ended mid-run"
    """How the hold of a holder that is gone ended, in words (a claim that took its job
    over tells the slots it held: ``GoneHolder.how``)."""

    @abc.abstractmethod
    def ledger_or(self, without: Callable[[], _A], kept: Callable[[LedgerTable], _B]) -> _A | _B:
        """*kept* of the run ledger, or *without* one (``ledger=False``): how the locker
        makes the parts that exist only with a ledger, never asking whether it has one."""

    # -- connections -------------------------------------------------------------------

    @abc.abstractmethod
    def channels(self, given: Channels) -> tuple[Channel, ...]:
        """The locker's shards: a job's statements go on ``shards[key % len(shards)]``."""

    async def check(self, channel: Channel) -> None:
        """Connect *channel* as claims would (a new connection gets the mode's set-up, the
        ledger made current), and prove it with a round trip. Raises
        :class:`cronlock.LockerMisconfigured` for what this mode cannot work with (the set-up
        of session locks refuses a pooler), a :class:`cronlock.LockError` otherwise."""
        conn, generation = await channel.ensure()
        await channel.run(
            conn,
            generation,
            lambda c: c.fetchval(BACKEND_PID_SQL),
            what="checking the connection",
            keep_on_server_error=True,
        )

    # -- statements ----------------------------------------------------------------------

    @abc.abstractmethod
    def claim(
        self, keys: list[int], jobs: list[str], slots: list[datetime], host: str, pid: int
    ) -> Statement:
        """Claim many slots; answers one row per slot: ``i``, ``started_at`` (granted when
        not null), ``ran``, ``got``, ``paused``, ``stray``, and the ``p_*`` run told."""

    @abc.abstractmethod
    def finish(self, ends: Sequence[End], host: str, pid: int) -> Statement:
        """Record many outcomes (or undo claims) and release; answers ``i``, ``released``."""

    def undo_lost(
        self, jobs: list[str], slots: list[datetime], host: str, pid: int
    ) -> Statement | None:
        """Give back claims of this process whose answer was lost (the session died with
        the claim in flight): their rows, if they committed, stand for runs that never
        began; answers ``undone``. ``None``: nothing to give back (no ledger)."""
        return None

    @abc.abstractmethod
    def takeover(
        self, key: int, job: str, slot: datetime, host: str, pid: int, attempt: int
    ) -> Statement | None:
        """Claim *slot* by taking its row over as *attempt*; ``None``: a plain claim."""

    @abc.abstractmethod
    def crashed(self, host: str, pid: int) -> Statement | None:
        """Mark crashed runs of other replicas; ``None``: there is nothing to check."""

    @abc.abstractmethod
    def late_finish(self, late: Sequence[tuple[str, datetime, RunRecord, int]],
                    host: str, pid: int) -> Statement | None:  # fmt: skip
        """Write outcomes kept since their release failed; ``None``: nothing to write."""

    # -- holds -----------------------------------------------------------------------------

    @abc.abstractmethod
    def may_end(self, generation: int, session: Channel) -> bool:
        """Whether an end of a hold granted on *generation* can still go out on *session*."""

    @abc.abstractmethod
    async def end_on(self, session: Channel) -> tuple[Any, int] | None:
        """The connection and generation ends go out on now, or ``None`` (they wait)."""

    @abc.abstractmethod
    def stray(self, row: Mapping[str, Any]) -> bool:
        """Whether a refused claim's *row* took something to give back at once."""

    @abc.abstractmethod
    def unreleased(self, end: End) -> str | None:
        """What to say of an end whose release found nothing held, or ``None`` (expected)."""

    @abc.abstractmethod
    def granted(self, hold: Kept, sent: float, generation: int,
                session: Channel) -> bool:  # fmt: skip
        """*hold* was granted by a claim sent at loop time *sent*: start keeping it; return
        False when it is lost already (its session died since)."""

    @abc.abstractmethod
    def released(self, hold: Kept) -> None:
        """*hold* is being released: stop keeping it."""

    @abc.abstractmethod
    def dropped(self, held: Mapping[int, Kept], shard: int, shards: int,
                reason: str) -> int:  # fmt: skip
        """Shard *shard* of *shards* lost its connection: mark what that loses; how many."""

    @abc.abstractmethod
    def services(self) -> Sequence[Service]:
        """The mode's background services, in the order they start (stopped in reverse)."""

    def after_failover(
        self,
        held: Sequence[tuple[str, datetime, int]],
        ended: Sequence[tuple[str, datetime, int]] = (),
    ) -> Statement | None:
        """What to put right on a new primary or after a reconnect besides the runs
        (``_locker/failover.py``), given the runs in flight here and the recent runs that
        ended here, each as (job, slot, attempt); ``None``: nothing."""
        return None

    def renewals(self) -> tuple[int, int]:
        """Lease renewal statements sent, and holds fenced (lost unrenewed): 0 but in lease
        mode."""
        return 0, 0


class Ballot(abc.ABC):
    """What a PostgresElector asks the server in its mode: take the leadership, prove it,
    give it up. The elector's fencing argument is in :mod:`cronlock.postgres._elector`."""

    takeover_delay: float
    """Seconds a new leader waits after the grant before it leads (the default when the
    user gives none)."""

    @abc.abstractmethod
    async def set_up(self, conn: Any) -> None:
        """Set a new election session up (its settings, the leaders table)."""

    @abc.abstractmethod
    async def acquire(self, conn: Any) -> bool:
        """Take the leadership if it is free; whether it was granted."""

    @abc.abstractmethod
    async def renew(self, conn: Any) -> bool:
        """Prove (or extend) the leadership; False once it is no longer ours."""

    @abc.abstractmethod
    async def release(self, conn: Any, *, timeout: float) -> None:
        """Give the leadership up before the session is dropped; never raises a backend
        error (best effort)."""


async def prepare_ledger(
    conn: Any,
    *,
    table: LedgerTable,
    create: bool,
    timeout: float,
    mode: Literal["session", "lease"] = "session",
) -> None:
    """Make sure the run ledger *table* is current on *conn*: created (or upgraded from an
    older cronlock's) when *create*, else refused with the command that does it; and that
    the role has a replica's grants in *mode* (:mod:`.._sql.grants`), else refused naming
    those it lacks. Once per new session (or, borrowing, once per locker)."""
    state = await ledger_state(conn, table)
    if state == "current":
        await _refuse_missing_grants(conn, table, mode)
        return
    if not create:
        problem = "does not exist" if state == "missing" else "predates this cronlock"
        raise LockerMisconfigured(
            f"the run ledger table {table.runs} {problem}; "
            f"{'create' if state == 'missing' else 'upgrade'} it with "
            "'python -m cronlock migrate --dsn DSN' (with --schema/--table as configured), "
            "or pass create_table=True"
        )
    done = await migrate(conn, table, timeout=timeout)
    if done:
        _logger.info("%s the run ledger %s", done, table.runs)
    await _refuse_missing_grants(conn, table, mode)


async def _refuse_missing_grants(
    conn: Any, table: LedgerTable, mode: Literal["session", "lease"]
) -> None:
    """Refuse a role that lacks a replica's grant: once, at the set-up, naming what to grant,
    rather than one permission error a slot that names a table but not the privilege."""
    missing = await missing_privileges(conn, table, "replica", mode=mode)
    if missing:
        user = await conn.fetchval(CURRENT_USER_SQL)
        raise LockerMisconfigured(
            f"role {user} lacks {'; '.join(missing)}, which a replica in {mode} mode needs on "
            f"the run ledger {table.runs}: grant it ('python -m cronlock grants --mode "
            f"{mode}' prints every grant a replica needs)"
        )
