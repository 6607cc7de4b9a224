"""Fleet-wide control: pause, resume and trigger a job on every replica at once.

The state lives in the ledger's control table (``<table>_control``, created by ``migrate``
like the ledger's other tables). Replicas never read it on their own schedule to obey a
pause: the claim statement itself refuses a paused job (the batched
``_sql/claims.claim_many_sql``, and ``_sql/leases`` or ``_locker/crashes`` for a rerun), so a
pause takes effect at the next slot on every replica with no extra round trip. A trigger
is a slot of its own (the server's time when it was asked for): replicas that run the job
pick it up from :class:`FleetWatch`'s poll and claim it like any slot, so it runs once
fleet-wide.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from ..._durations import Seconds, optional_seconds, positive_int, to_seconds
from ..._errors import ConfigError, JobConflictError, JobLookupError, LockError
from ..._logs import get_logger
from ..._names import unknown_job
from ..._records import RunRecord
from ..._stored.limits import DEFAULT_MAX_SCHEDULES, DEFAULT_MIN_INTERVAL
from .._conn.errors import backend_errors
from .._conn.source import ConnectionSource
from .._sql.control import (
    known_job_sql,
    pause_sql,
    paused_sql,
    resume_sql,
    retire_sql,
    trigger_sql,
    triggered_sql,
)
from .._sql.fleet import JIT_OFF_SQL, jobs_sql
from .._sql.runs import decode_run
from .._sql.schema import migrate
from .._sql.tables import DEFAULT_TABLE, LedgerTable
from .bulk import BulkVerbs
from .fleet import Status, job_status, read_jobs, read_paused, server_now
from .rejected import refuse_rejected
from .roster import read_roster
from .stored import ScheduleVerbs

__all__ = (
    "WAIT_EVERY",
    "FleetControl",
    "Triggered",
    "refuse_unknown",
    "retire_job",
)

_logger = get_logger("cronlock.postgres")

_TIMEOUT = 10.0


def _job_name(job: object, verb: str) -> str:
    if not isinstance(job, str) or not job:
        raise ConfigError(f"FleetControl.{verb}: job must be a non-empty string, got {job!r}")
    return job


async def retire_job(conn: Any, table: LedgerTable, job: str, who: str, *, force: bool) -> None:
    """Retire *job* (see :meth:`FleetControl.retire`): refused with
    :class:`~cronlock.JobLookupError` when the ledger does not know it and, unless *force*,
    with :class:`~cronlock.JobConflictError` when it is not absent (a live replica runs
    it: it would be back at its next slot)."""
    await refuse_unknown(conn, table, job)
    if not force:
        found = await read_jobs(conn, table, [job])
        paused = await read_paused(conn, table)
        state = job_status(found[0], await server_now(conn), paused=job in paused)
        if state != "absent":
            raise JobConflictError(
                f"job {job!r} is {state}, not absent: a live replica still runs it, and would "
                "announce it again at its next slot; retire a job once no replica has it (a "
                "deploy removed it, or the fleet is gone), or pass force"
            )
    await conn.execute(retire_sql(table), job, who)


async def refuse_unknown(conn: Any, table: LedgerTable, job: str) -> None:
    """Raise :class:`~cronlock.JobLookupError` (``unknown job: NAME (did you mean
    OTHER?)``) unless the ledger knows *job*: a replica noted its schedule or claimed a slot
    of it. The rule of :class:`FleetControl` and of the command line's verbs alike."""
    if await conn.fetchval(known_job_sql(table), job):
        return
    known = [row["job"] for row in await conn.fetch(jobs_sql(table))]
    raise JobLookupError(unknown_job(job, known))


WAIT_EVERY = 0.5
"""Seconds between two reads of the ledger by :meth:`Triggered.wait`."""


class Triggered:
    """A run asked for by :meth:`FleetControl.trigger`: its job and trigger slot, and
    :meth:`wait` for its outcome."""

    __slots__ = ("_control", "_sql", "job", "slot")

    def __init__(self, control: FleetControl, job: str, slot: datetime) -> None:
        self._control = control
        self._sql = triggered_sql(control.ledger)
        self.job = job
        """The job triggered."""
        self.slot = slot
        """The trigger's slot (server time): the run's slot in the ledger."""

    def __repr__(self) -> str:
        return f"Triggered(job={self.job!r}, slot={self.slot.isoformat()!r})"

    async def _read(self, slot: datetime) -> Any:
        return await self._control._call(lambda c: c.fetchrow(self._sql, self.job, slot))

    async def wait(self, timeout: Seconds | None = None) -> RunRecord:
        """Wait until a replica has run the trigger and return its :class:`RunRecord`
        (``manual`` true; any outcome: ``succeeded``, ``failed``, ``crashed``...).

        Reads the ledger every :data:`WAIT_EVERY` seconds through the :class:`FleetControl`
        (so call it inside its ``async with``). A later trigger of the job that replaced
        this one before any replica claimed it is followed: that run serves both. Raises
        :class:`TimeoutError` after *timeout* seconds (``None``: no limit), for instance
        when no replica running the job is up (a trigger is dropped after
        :data:`.._locker.fleetwatch.TRIGGER_EXPIRES` seconds).
        """
        limit = optional_seconds(timeout, field="timeout", allow_zero=True)
        slot = self.slot
        try:
            async with asyncio.timeout(limit):
                while True:
                    row = await self._read(slot)
                    if row["slot"] is not None:
                        runs = self._control.ledger.runs
                        record = decode_run(row, table=runs, job=self.job)
                        if record is not None and record.finished_at is not None:
                            return record
                    elif row["pending"] is not None and row["pending"] > slot:
                        slot = row["pending"]
                        continue
                    await asyncio.sleep(WAIT_EVERY)
        except TimeoutError:
            raise TimeoutError(
                f"job {self.job!r}: the run triggered for {self.slot.isoformat()} did not "
                f"finish within {limit} s"
            ) from None


class FleetControl(ScheduleVerbs, BulkVerbs):
    """Pause, resume and trigger jobs on every replica that shares a run ledger.

    ``async with FleetControl(pool_or_dsn) as control: await control.pause("nightly")``.
    *table* and *schema* name the ledger as the replicas' :class:`PostgresLocker` does; its
    tables are created (or upgraded) on entry if needed. Given a DSN it opens one connection
    for the block; given an ``asyncpg.Pool`` it borrows one per call.

    A pause is honoured by every replica at its next claim of the job (the claim statement
    reads it: no polling), and lasts until :meth:`resume`, across restarts and deploys.
    A trigger runs the job once, now, on exactly one replica (one that has the job
    registered and running), even while it is paused. Schedules the application keeps in
    the ledger are added, changed and removed here too (:meth:`add_schedule`), or in
    bulk (:meth:`put_schedules`, :meth:`sync_schedules`), held to the limits of
    docs/guides/stored-schedules.md: *min_interval* is the shortest gap in seconds two slots
    of a stored schedule may have (as the replicas' ``stored_min_interval``),
    *max_schedules* how many schedules the ledger may hold (checked when one is added).

    *who* is recorded as who made each change (a pause's ``paused_by``, a trigger's
    ``triggered_by``, a stored schedule's ``updated_by``, a retire's ``retired_by``): your
    operator's name, as the dashboard passes the one ``authorize`` returned; by default
    this process, ``host:pid``.
    """

    def __init__(
        self,
        pool_or_dsn: Any,
        *,
        table: str = DEFAULT_TABLE,
        schema: str | None = None,
        who: str | None = None,
        min_interval: Seconds = DEFAULT_MIN_INTERVAL,
        max_schedules: int = DEFAULT_MAX_SCHEDULES,
    ) -> None:
        if who is not None and not (isinstance(who, str) and who.strip()):
            raise ConfigError(f"FleetControl: who must be a non-empty string, got {who!r}")
        # Given a DSN, no named prepared statements: it works through a transaction pooler.
        kwargs = {"statement_cache_size": 0} if isinstance(pool_or_dsn, str) else None
        self._source = ConnectionSource(pool_or_dsn, kwargs)
        self._table = LedgerTable(table, schema)
        self._min_interval = to_seconds(
            min_interval, field="min_interval", allow_zero=True, error=ConfigError
        )
        self._max_schedules = positive_int(
            max_schedules, field="max_schedules", owner="FleetControl"
        )
        self._conn: Any = None
        self._held = contextlib.AsyncExitStack()  # the connection lent for the block
        self._who = who if who is not None else f"{socket.gethostname()}:{os.getpid()}"
        self._ready = False

    @property
    def ledger(self) -> LedgerTable:
        """Where the ledger (and its control table) lives."""
        return self._table

    async def __aenter__(self) -> Self:
        if not self._source.pooled:  # a DSN: one connection lent for the block
            self._conn = await self._held.enter_async_context(
                self._source.lend(timeout=_TIMEOUT, keep_on_server_error=True)
            )
        try:
            await self._call(lambda c: self._prepare(c))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._conn = None
        held, self._held = self._held, contextlib.AsyncExitStack()
        await held.aclose()

    async def _prepare(self, conn: Any) -> None:
        if not self._ready:
            await migrate(conn, self._table, timeout=_TIMEOUT)
            self._ready = True

    async def _call(self, fn: Any) -> Any:
        with backend_errors("fleet control: the statement failed"):
            if self._conn is not None:
                return await fn(self._conn)
            if self._source.pooled:
                async with self._source.lend(timeout=_TIMEOUT, keep_on_server_error=True) as conn:
                    await self._prepare(conn)
                    return await fn(conn)
        raise LockError("FleetControl is not open: use it as 'async with FleetControl(...)'")

    async def _known(self, job: object, verb: str, force: bool) -> str:
        name = _job_name(job, verb)
        if not force:
            await self._call(lambda c: refuse_unknown(c, self._table, name))
        return name

    async def pause(self, job: str, *, force: bool = False) -> None:
        """Stop *job* on every replica from its next slot on (a run in flight goes on).

        A job the ledger does not know (no replica noted or ran it) is refused with
        :class:`~cronlock.JobLookupError`, as by the command line, unless *force* (as
        ``--force``); so are :meth:`resume` and :meth:`trigger`."""
        name = await self._known(job, "pause", force)
        await self._call(lambda c: c.execute(pause_sql(self._table), name, self._who))

    async def resume(self, job: str, *, force: bool = False) -> None:
        """Let *job* run again on every replica, from its next slot (missed slots stay
        missed)."""
        name = await self._known(job, "resume", force)
        await self._call(lambda c: c.execute(resume_sql(self._table), name))

    async def trigger(self, job: str, *, force: bool = False) -> Triggered:
        """Run *job* once, now, on exactly one replica (within about a second); return the
        :class:`Triggered` run, whose :meth:`~Triggered.wait` gives its outcome. The run's
        ledger row is marked ``manual``.

        A stored schedule that every live replica rejected (none has its task, or its
        kwargs fit nowhere: status ``rejected``) is refused with
        :class:`~cronlock.ScheduleRejectedError`, naming its revision and the problem,
        unless *force*: no replica would run it."""
        name = _job_name(job, "trigger")
        if not force:
            await self._call(lambda c: refuse_rejected(c, self._table, name))
        name = await self._known(name, "trigger", force)
        slot = await self._call(lambda c: c.fetchval(trigger_sql(self._table), name, self._who))
        return Triggered(self, name, slot)

    async def retire(self, job: str, *, force: bool = False) -> None:
        """Retire *job*, a job no live replica runs any more (status ``absent``: a deploy
        removed it from the code, or its fleet is gone for good): it leaves ``status``, its
        ``--check``, the dashboard and the fleet's summary until a replica notes it again
        (one that has it starts, or runs its next slot). Its runs stay in the ledger.

        A job the ledger does not know is refused with :class:`~cronlock.JobLookupError`;
        one that is not absent with :class:`~cronlock.JobConflictError`, unless *force*
        (it would be back within a slot: a live replica announces it)."""
        name = _job_name(job, "retire")
        await self._call(lambda c: retire_job(c, self._table, name, self._who, force=force))

    async def statuses(self) -> dict[str, Status]:
        """Every job the ledger knows (retired ones left out) and its state, by the rule of
        ``python -m cronlock status`` and the dashboard, from the ledger alone: ``paused``,
        ``conflict``, ``rejected``, ``absent``, ``overdue``, ``failing``, ``running``, ``ok``
        or ``new`` (see the observability guide)."""

        async def read(conn: Any) -> dict[str, Status]:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                await conn.execute(JIT_OFF_SQL)
                paused = await read_paused(conn, self._table)
                now = await server_now(conn)
                return (await read_roster(conn, self._table, paused, now)).statuses

        result: dict[str, Status] = await self._call(read)
        return result

    async def paused(self) -> frozenset[str]:
        """The jobs paused fleet-wide."""
        rows = await self._call(lambda c: c.fetch(paused_sql(self._table)))
        return frozenset(row["job"] for row in rows)
