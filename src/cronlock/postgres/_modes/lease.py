"""Lease mode (``mode="lease"``): a lease row says who runs a job; its renewal, and the fence
that ends a run in time.

A row of the ledger's leases table whose expiry, in the server's time, is in the future says
who runs a job (:mod:`.._sql.leases`). No statement depends on its session, so a dropped
connection loses nothing, an end goes out on whatever connection is open, and the mode works
through a transaction pooler; a crashed run is an unfinished row whose lease expired and
whose owner's members row expired too (:func:`.._sql.crashes.owner_gone`).

A lease expires in the server's time, *lease* seconds after it was last taken or renewed.
One task per locker renews every lease it holds in **one** statement every ``lease / 4``
seconds, however many runs are in flight (:func:`._leasesql.renew_sql`).

**The fence.** A replica that cannot renew (partitioned, its server unreachable, its process
frozen) must stop running before its lease could pass to another replica. Each lease is
trusted until ``sent + lease - margin`` on this process's monotonic clock, where *sent* is
when the claim or the last successful renewal was **sent**: the server stamped the expiry
after that instant, so it lies at least *lease* seconds after it, and the margin
(``lease / 4``) covers the time a run needs to be cancelled. When that instant passes, the
lease is marked lost, and the scheduler cancels its run (event ``LockLost``), exactly as a
dropped session does in session mode. A lease the renewal found expired or taken over is
lost at once.

A frozen process is fenced too: when it wakes, its loop runs this task's timer before it
could send any statement, so a run never goes on past its lease unnoticed. What no fence
can stop is code that never yields to the event loop (a blocking call in a job).
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from logging import WARNING
from typing import TYPE_CHECKING, Any, TypeVar

from ..._cancel import cancel_and_wait, task_name
from ..._errors import ConfigError, LockerMisconfigured, LockError
from ..._keys import job_lock_key
from ..._logs import get_logger, say
from ..._service import Service
from .._conn import Channel
from .._conn.borrowed import BorrowedConnections
from .._conn.dedicated import DedicatedConnection
from .._conn.errors import ignoring_backend_errors, prepared_statements_clash
from .._conn.primary import refuse_read_only
from .._sql import upkeep
from .._sql.elector import (
    LEADERS_EXIST_SQL,
    XACT_LOCK_SQL,
    leaders_acquire_sql,
    leaders_ddl,
    leaders_release_sql,
    leaders_renew_sql,
)
from .._sql.failover import lease_reassert_sql
from .._sql.leases import (
    lease_claim_many_sql,
    lease_crashed_sql,
    lease_finish_many_sql,
    lease_late_finish_sql,
    lease_recover_sql,
    lease_undo_lost_sql,
    renew_sql,
)
from .._sql.sessions import PREPARED_AS_SQL, cache_probe_sql
from .._sql.tables import LedgerTable, quote_ident
from .base import (
    FENCED,
    Ballot,
    Channels,
    End,
    Exclusion,
    Kept,
    Statement,
    prepare_ledger,
)
from .session import _end_args, _late_args

if TYPE_CHECKING:
    from ..._records import RunRecord

__all__ = ("DEFAULT_LEADERS_TABLE", "SERVER_MARGIN", "LeaseBallot", "LeaseKeeper", "LeaseRows")

_logger = get_logger("cronlock.postgres")
_A = TypeVar("_A")
_B = TypeVar("_B")


class LeaseKeeper(Service):
    """Renews one locker's leases on its *session* and fences them (see the module).

    The locker tells it of each lease :meth:`granted` and :meth:`released`; *lost* is
    called with each lease this keeper marks lost (for the locker's counters).
    """

    kind = "pg-renew"

    def __init__(
        self,
        session: Channel,
        table: LedgerTable,
        *,
        holder: str,
        lease: float,
        lost: Callable[[], None],
    ) -> None:
        self._session = session
        self._sql = renew_sql(table)
        self._holder = holder
        self._lease = lease
        self._every = lease / 4
        self._margin = lease / 4
        self._lost = lost
        self._trusted: dict[Kept, float] = {}
        self._wake = asyncio.Event()
        self.renewals = 0
        """Renewal statements sent."""
        self.fenced = 0
        """Leases marked lost because they could not be renewed in time."""

    def _wanted(self) -> bool:
        return bool(self._trusted)  # from the first lease on

    def granted(self, lease: Kept, sent: float) -> None:
        """*lease* was granted by a claim sent at loop time *sent*: trust it until the fence."""
        self._trust(lease, sent)
        self.start()
        self._wake.set()

    def released(self, lease: Kept) -> None:
        """*lease* is being released: no more renewals, no fence."""
        self._trusted.pop(lease, None)

    def _trust(self, lease: Kept, sent: float) -> None:
        """Trust *lease* until the fence of a claim or renewal sent at *sent* (the hold
        knows it too: a run claimed ahead does not begin past it)."""
        until = self._trusted[lease] = sent + self._lease - self._margin
        lease.trusted_until = until

    def _fence(self, now: float) -> None:
        for lease, until in list(self._trusted.items()):
            if until <= now:
                self._lose(lease, FENCED)

    def _lose(self, lease: Kept, why: str) -> None:
        self._trusted.pop(lease, None)
        if lease.lost:
            return
        self.fenced += 1
        say(_logger, WARNING, lease.job, lease.slot, f"the lease is lost: {why}")
        lease.mark_lost(LockError(f"job {lease.job!r}: its lease is lost: {why}"))
        self._lost()

    async def _serve(self) -> None:
        """Owned by the locker: from its first lease to its close.

        The renewal statement runs in a task of its own: a statement stuck on a frozen
        network (until its statement timeout) must not hold the fence back.
        """
        loop = asyncio.get_running_loop()
        next_renewal = loop.time() + self._every
        renewal: asyncio.Task[None] | None = None
        try:
            while True:
                now = loop.time()
                self._fence(now)
                if now >= next_renewal and (renewal is None or renewal.done()):
                    next_renewal = now + self._every
                    if self._trusted:
                        renewal = loop.create_task(
                            self._renew(), name=task_name("pg-renew-statement")
                        )
                        renewal.add_done_callback(lambda _: self._wake.set())
                # While a renewal is in flight its end wakes us (the done callback): waking
                # for the renewal already due would spin the loop until the statement ends
                # (up to its statement timeout, on a hung server).
                in_flight = renewal is not None and not renewal.done()
                due = () if in_flight else (next_renewal,)
                wake_at = min((*due, *self._trusted.values()), default=None)
                self._wake.clear()
                try:
                    async with asyncio.timeout(
                        None if wake_at is None else max(0.0, wake_at - loop.time())
                    ):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            if renewal is not None:
                await cancel_and_wait(renewal)

    async def _renew(self) -> None:
        leases = [lease for lease in self._trusted if not lease.lost]
        if not leases:
            return
        loop = asyncio.get_running_loop()
        sent = loop.time()
        jobs = [lease.job for lease in leases]
        slots = [lease.slot for lease in leases]
        session, sql = self._session, self._sql
        self.renewals += 1
        try:
            conn, generation = await session.ensure()
            rows = await session.run(
                conn,
                generation,
                lambda c: c.fetch(sql, jobs, slots, self._holder, self._lease),
                what="renewing the leases",
                keep_on_server_error=True,
                urgent=True,  # before bulk reads and writes: a lease not renewed in time ends runs
            )
        except LockError as exc:
            _logger.info("renewing %d lease(s) failed: %s; trying again", len(leases), exc)
            return
        renewed = {row["job"] for row in rows}
        for lease in leases:
            if lease not in self._trusted:
                continue  # released meanwhile
            if lease.job in renewed:
                self._trust(lease, sent)
            else:
                self._lose(lease, "it had expired, or another replica holds it now")


class LeaseRows(Exclusion):
    """Lease rows over the ledger *table*, held as *holder* for *lease* seconds."""

    mode = "lease"
    heartbeat = False  # the renewals prove the leases; nothing lives in a session
    gone_hold = "lease lapsed unreleased"
    end_failed = (
        "their outcomes are written and their leases released once a connection is back "
        "(or the leases expire)"
    )

    def __init__(self, table: LedgerTable, *, holder: str, lease: float) -> None:
        self.ledger = self._table = table
        self._holder = holder
        self._lease = lease
        self._claim_sql = lease_claim_many_sql(table)
        self._finish_sql = lease_finish_many_sql(table)
        self._recover_sql = lease_recover_sql(table)
        self._crashed_sql = lease_crashed_sql(table)
        self._late_sql = lease_late_finish_sql(table)
        self._undo_sql = lease_undo_lost_sql(table)
        self._keeper: LeaseKeeper | None = None
        self._where = "PostgreSQL server"
        # A probe of our own: another client's statement on a pooled backend is not ours.
        self._probe_sql = cache_probe_sql(secrets.token_hex(8))

    def ledger_or(self, without: Callable[[], _A], kept: Callable[[LedgerTable], _B]) -> _A | _B:
        """*kept* of the ledger."""
        return kept(self._table)

    def channels(self, given: Channels) -> tuple[Channel, ...]:
        """One channel: a connection of ours given a DSN (kept, so a statement costs one
        round trip), or none given a pool (each statement borrows one for itself). Nothing
        is set on a session (a pooler would pass it on to other clients)."""
        set_up = functools.partial(
            _set_up, table=self._table, create=given.create_table, timeout=given.connect_timeout
        )
        self._where = given.source.describe()
        shard: Channel
        if given.source.pooled:
            shard = BorrowedConnections(
                given.source,
                set_up=set_up,
                connect_timeout=given.connect_timeout,
                statement_timeout=given.statement_timeout,
                on_open=given.on_open,
                on_server=given.on_server,
                on_drop=functools.partial(given.on_drop, 0),
            )
        else:
            shard = DedicatedConnection(
                given.source,
                connect_timeout=given.connect_timeout,
                statement_timeout=given.statement_timeout,
                on_open=given.on_open,
                on_server=given.on_server,
                on_drop=functools.partial(given.on_drop, 0),
                set_up=set_up,
            )
        self._keeper = LeaseKeeper(
            shard, self._table, holder=self._holder, lease=self._lease, lost=given.on_fenced
        )
        return (shard,)

    async def check(self, channel: Channel) -> None:
        """Connect as claims would (the ledger made current), then look, on one backend in
        one transaction, whether a pooler sits in between (the backend is not the one the
        connection announced) while asyncpg's statement cache is on (a statement stays
        prepared under asyncpg's name): then claims would run as whatever another client
        prepared under that name on a backend the pooler hands over, and this refuses.

        A pooler that renames prepared statements (PgBouncer >= 1.21 with
        ``max_prepared_statements``) leaves no name of asyncpg's on the backend: accepted.
        """
        try:
            conn, generation = await channel.ensure()
            (announced, backend), names = await channel.run(
                conn,
                generation,
                functools.partial(_probe_statement_cache, sql=self._probe_sql),
                what="checking the statement cache",
                keep_on_server_error=True,
            )
        except LockError as exc:
            if not prepared_statements_clash(exc.__cause__ or exc):
                raise
            raise self._cached(f"prepared statements clash: {exc.__cause__!r}") from exc
        if announced != backend and any(name.startswith("__asyncpg_") for name in names):
            raise self._cached(f"announced pid {announced}, then backend {backend}")

    def _cached(self, seen: str) -> LockerMisconfigured:
        return LockerMisconfigured(
            f"the connections of the {self._where} keep asyncpg's statement cache and reach "
            f"PostgreSQL through a connection pooler ({seen}): mode='lease' statements would "
            "run as prepared statements of other clients. Create the pool with "
            "statement_cache_size=0 (asyncpg.create_pool(..., statement_cache_size=0)), or "
            "give the locker a DSN (its connection then has no statement cache unless "
            "connect_kwargs set one)"
        )

    def claim(
        self, keys: list[int], jobs: list[str], slots: list[datetime], host: str, pid: int
    ) -> Statement:
        """Take leases and claim (:func:`.._sql.leases.lease_claim_many_sql`)."""
        return Statement(self._claim_sql, (keys, jobs, slots, host, pid, self._holder, self._lease))

    def finish(self, ends: Sequence[End], host: str, pid: int) -> Statement:
        """Record and release the leases (:func:`.._sql.leases.lease_finish_many_sql`)."""
        return Statement(self._finish_sql, (*_end_args(ends, host, pid), self._holder))

    def undo_lost(
        self, jobs: list[str], slots: list[datetime], host: str, pid: int
    ) -> Statement | None:
        """Delete the rows of lost claims and release their leases
        (:func:`.._sql.leases.lease_undo_lost_sql`)."""
        return Statement(self._undo_sql, (jobs, slots, host, pid, self._holder))

    def takeover(
        self, key: int, job: str, slot: datetime, host: str, pid: int, attempt: int
    ) -> Statement | None:
        """Take the lease and the row over (:func:`.._sql.leases.lease_recover_sql`)."""
        return Statement(
            self._recover_sql, (key, job, slot, host, pid, self._holder, self._lease, attempt)
        )

    def crashed(self, host: str, pid: int) -> Statement | None:
        """Unfinished rows whose lease expired, and whose owner (its members row) is gone."""
        return Statement(self._crashed_sql, (host, pid, self._holder, upkeep.MEMBER_TTL))

    def late_finish(
        self, late: Sequence[tuple[str, datetime, RunRecord, int]], host: str, pid: int
    ) -> Statement | None:
        """Late outcomes, and the release of their leases."""
        return Statement(self._late_sql, (*_late_args(late, host, pid), self._holder))

    def may_end(self, generation: int, session: Channel) -> bool:
        """Always: a lease lives in the ledger, not in a session."""
        return True

    async def end_on(self, session: Channel) -> tuple[Any, int] | None:
        """Whatever connection is open now, opened if need be; ``None`` when it cannot be
        (the outcome is then written later, with the lease's release)."""
        try:
            return await session.ensure()
        except LockError:
            return None

    def stray(self, row: Mapping[str, Any]) -> bool:
        """A lease taken for a slot claimed meanwhile goes straight back."""
        return bool(row["stray"])

    def unreleased(self, end: End) -> str | None:
        """A lease that expired before its release is worth a warning (an undo's is not)."""
        return None if end.undo else "its lease was no longer held at release (it expired first)"

    def granted(self, hold: Kept, sent: float, generation: int, session: Channel) -> bool:
        """Trusted from *sent* on, renewed until released (the keeper's fence)."""
        assert self._keeper is not None  # channels() made it
        self._keeper.granted(hold, sent)
        return True

    def released(self, hold: Kept) -> None:
        """No more renewals, no fence."""
        if self._keeper is not None:
            self._keeper.released(hold)

    def dropped(self, held: Mapping[int, Kept], shard: int, shards: int, reason: str) -> int:
        """Nothing is lost: the leases stay held, and renewed."""
        return 0

    def services(self) -> Sequence[Service]:
        """The lease keeper."""
        return () if self._keeper is None else (self._keeper,)

    def after_failover(
        self,
        held: Sequence[tuple[str, datetime, int]],
        ended: Sequence[tuple[str, datetime, int]] = (),
    ) -> Statement | None:
        """Release this holder's leases of the runs that *ended* here whose release the
        outage lost (those only: a lease granted since stands on a live run), and take
        back the leases of the runs in flight here
        (:func:`.._sql.failover.lease_reassert_sql`)."""
        return Statement(
            lease_reassert_sql(self._table),
            (
                self._holder,
                *([run[i] for run in held] for i in range(3)),
                self._lease,
                *([run[i] for run in ended] for i in range(3)),
            ),
        )

    def renewals(self) -> tuple[int, int]:
        """The keeper's renewal statements, and the holds it fenced."""
        keeper = self._keeper
        return (0, 0) if keeper is None else (keeper.renewals, keeper.fenced)


async def _probe_statement_cache(conn: Any, *, sql: str) -> tuple[tuple[int, int], list[str]]:
    """``((the pid *conn* announced, the backend's), the names the probe *sql* is prepared
    under there)``, both read in one transaction, so on one backend even through a pooler."""
    async with conn.transaction():
        backend = await conn.fetchval(sql)
        names = await conn.fetchval(PREPARED_AS_SQL, sql)
    return (conn.get_server_pid(), backend), list(names)


DEFAULT_LEADERS_TABLE = "cronlock_leaders"
"""The lease-mode elector's table when none is given."""
SERVER_MARGIN = 1.0
"""Seconds the server's expiry of a lease-mode leadership outlasts the holder's own lease."""


class LeaseBallot(Ballot):
    """Leadership of election *name* as a row of *table* (in *schema*), held as *holder*
    for *lease* seconds of the server's clock (plus :data:`SERVER_MARGIN`).

    Taking it succeeds only when it expired (or is ours); proving it renews it; giving it up
    expires it. No statement depends on its session, so it works through a transaction
    pooler. The holder's own lease (``lease`` after it *sent* the statement, on its
    monotonic clock) always lapses first, so a new leader may lead as soon as it holds the
    row (no takeover delay by default).
    """

    def __init__(
        self,
        name: str,
        *,
        table: str,
        schema: str | None,
        holder: str,
        beat: float,
        lease: float,
        takeover: float | None,
    ) -> None:
        if beat >= lease:
            raise ConfigError(
                f"heartbeat_interval ({beat:g}s) must be shorter than lease "
                f"({lease:g}s), or every lease lapses before it can be renewed"
            )
        quoted = quote_ident(table, field="leaders table")
        self._table = (
            quoted if schema is None else f"{quote_ident(schema, field='schema')}.{quoted}"
        )
        self._name = name
        self._holder = f"{holder}:{secrets.token_hex(4)}"
        self._seconds = lease + SERVER_MARGIN
        self._key = job_lock_key(f"cronlock:leaders:{self._table}")
        self._acquire_sql = leaders_acquire_sql(self._table)
        self._renew_sql = leaders_renew_sql(self._table)
        self._release_sql = leaders_release_sql(self._table)
        self.takeover_delay = 0.0 if takeover is None else takeover

    @property
    def holder(self) -> str:
        """Who this elector is, in the leaders table."""
        return self._holder

    async def set_up(self, conn: Any) -> None:
        """Refuse a server that is not the primary; create the leaders table if missing
        (concurrent callers serialised)."""
        await refuse_read_only(conn)
        if await conn.fetchval(LEADERS_EXIST_SQL, self._table):
            return
        async with conn.transaction():
            await conn.execute(XACT_LOCK_SQL, self._key)
            for statement in leaders_ddl(self._table):
                await conn.execute(statement)

    async def acquire(self, conn: Any) -> bool:
        """Take the leadership if it is free (expired) or already ours."""
        row = await conn.fetchval(self._acquire_sql, self._name, self._holder, self._seconds)
        return bool(row)

    async def renew(self, conn: Any) -> bool:
        """Extend our unexpired leadership; False once it expired or passed to another."""
        row = await conn.fetchval(self._renew_sql, self._name, self._holder, self._seconds)
        return bool(row)

    async def release(self, conn: Any, *, timeout: float) -> None:
        """Give the leadership up now, so another replica need not wait for its expiry;
        bounded by *timeout*, best effort (it expires anyway): never raises a backend error."""
        with ignoring_backend_errors():
            async with asyncio.timeout(timeout):
                await conn.execute(self._release_sql, self._name, self._holder)


async def _set_up(conn: Any, *, table: LedgerTable, create: bool, timeout: float) -> None:
    """A lease-mode channel's set-up: the primary's (a standby takes no lease), the ledger
    made current."""
    await refuse_read_only(conn)
    await prepare_ledger(conn, table=table, create=create, timeout=timeout, mode="lease")
