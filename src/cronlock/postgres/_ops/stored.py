"""Stored schedules' verbs of :class:`~cronlock.postgres.FleetControl`: add, update,
remove and list the schedules the application keeps in the ledger.

Each change is one transaction (:func:`schedules_change`): the changes' lock (so revisions
commit in order), the schedule's row, the next revision, the new row, and the job's
schedule note (so that a schedule no replica runs, for want of its task, shows as overdue).
No change waits more than :data:`LOCK_WAIT` seconds for a lock: past it, it fails saying
so, and nothing is changed. Everything a
replica would refuse that can be known here is refused here, with the schedule's name:
a schedule that cannot be stored or never fires, kwargs that are not JSON, an option that
is unknown, wrong or not storable, and a name a job defined in code has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any

from ..._errors import JobConflictError, JobLookupError, LockError, ScheduleError
from ..._names import check_job_name
from ..._schedules.calendar import CalendarSchedule
from ..._schedules.cron import CronSchedule
from ..._schedules.schedule import Schedule
from ..._stored import limits
from ..._stored.json import (
    check_stored,
    first_slot,
    kwargs_read_back,
    options_from_json,
    options_to_json,
    overdue_grace,
    schedule_from_json,
    schedule_to_json,
)
from ..._stored.schedule import StoredSchedule
from .._conn.errors import lock_not_available
from .._locker.upkeep import tags_json
from .._sql.fleet import SERVER_CLOCK_SQL
from .._sql.schema import lock_timeout_sql
from .._sql.stored import (
    NONE_REMOVED,
    count_schedules_sql,
    decode_stored,
    forget_job_sql,
    job_in_code_sql,
    list_schedules_sql,
    next_revision_sql,
    put_schedule_sql,
    remove_schedule_sql,
    schedule_for_update_sql,
    schedules_lock_sql,
)
from .._sql.tables import LedgerTable
from .._sql.upkeep import note_sql

__all__ = ("LOCK_WAIT", "ScheduleVerbs", "schedules_change")

LOCK_WAIT = 5.0
"""Seconds a change of the stored schedules waits at most for a lock: the changes' lock
(another change in progress, or a session that took it and kept it) or a schedule's row
(a replica noting a problem with it, a session editing it by hand)."""


@contextlib.asynccontextmanager
async def schedules_change(conn: Any, table: LedgerTable) -> AsyncIterator[None]:
    """One change of *table*'s stored schedules: a transaction that waits at most
    :data:`LOCK_WAIT` seconds for any lock (``SET LOCAL``: a pooler never hands it on) and
    first takes the changes' lock, held to its commit. A lock not had in time raises
    :class:`~cronlock.LockError` naming the ledger and the lock (the transaction is
    rolled back: nothing changed)."""
    try:
        async with conn.transaction():
            await conn.execute(lock_timeout_sql(LOCK_WAIT))
            try:
                await conn.execute(schedules_lock_sql(table))
            except Exception as exc:
                if not lock_not_available(exc):
                    raise
                raise LockError(
                    f"ledger {table.runs}: another session holds the stored schedules' lock "
                    f"(a change in progress, or a session that took it and kept it); gave up "
                    f"after {LOCK_WAIT:g} s, nothing was changed: try again"
                ) from exc
            yield
    except Exception as exc:
        if not lock_not_available(exc):
            raise
        raise LockError(
            f"ledger {table.runs}: another session holds a lock on a stored schedule's row "
            f"(in {table.schedules}) or its job note; gave up after {LOCK_WAIT:g} s, "
            "nothing was changed: try again"
        ) from exc


_SHARED = 1024  # distinct (schedule, options) checked results remembered
# Each (schedule, options, min_interval) checked, and what it gave: the tenants of a batch
# share a few (a report at one of 24 hours), and a schedule's checks (its JSON both ways,
# its rate sampled, its options settled) cost ~100 us each. Successes only: a refusal is
# raised for each schedule that has it, naming that schedule.
_shared: dict[Any, tuple[Any, ...]] = {}


def _schedule_part(
    name: str, schedule: Schedule, options: Mapping[str, Any], min_interval: float
) -> tuple[Any, ...]:
    """Schedule *name*'s schedule and options checked, as a replica will read them back
    (:mod:`cronlock._stored.decode`) and check them (add_job there): their JSON, the
    schedule and options read back from it, the schedule as its job will have it (zone
    bound) and the job's settings."""
    schedule_json = schedule_to_json(schedule, owner=name)
    options_json = options_to_json(options, owner=name)
    limits.check_json_text(name, "schedule", json.dumps(schedule_json))
    limits.check_json_text(name, "options", json.dumps(options_json))
    read = schedule_from_json(schedule_json)
    read_options = options_from_json(options_json)
    limits.check_options(name, read_options)
    bound, settings = check_stored(name, read, read_options)
    limits.check_rate(name, read, min_interval)
    return schedule_json, options_json, read, read_options, bound, settings


class _Checked:
    """A schedule and its options as they will be stored, checked."""

    def __init__(
        self,
        name: str,
        task: str,
        schedule: Schedule,
        kwargs: Mapping[str, Any] | None,
        options: Mapping[str, Any],
        min_interval: float,
    ) -> None:
        self.name = check_job_name(name, field="schedule name")
        self.task = limits.check_task(name, task)
        limits.check_json_value(name, "kwargs", kwargs)  # before it is made JSON
        self.kwargs_json, self.kwargs = kwargs_read_back(kwargs, owner=name)
        limits.check_json_text(name, "kwargs", self.kwargs_json)
        try:
            # The values with their types: True == 1, and recover=1 is refused.
            given = tuple(sorted((k, type(v), v) for k, v in options.items()))
            key: Any = (schedule, given, min_interval)
            shared = _shared.get(key)
        except TypeError:  # an unhashable option (tags as a list) or schedule
            key, shared = None, None
        if shared is None:
            shared = _schedule_part(name, schedule, options, min_interval)
            if key is not None:
                if len(_shared) >= _SHARED:
                    _shared.clear()
                _shared[key] = shared
        self.schedule_json, self.options_json, self.schedule, options_read = shared[:4]
        self.options = dict(options_read)
        self._bound, self.settings = shared[4:]

    def first_slot(self, now: datetime) -> datetime:
        """The first slot after *now* (the server's time); raises if it never fires."""
        first = first_slot(self._bound, self.settings, now)
        if first is None:
            stop_at = self.settings.stop_at
            raise ScheduleError(
                f"schedule {self.name!r}: {self.schedule} never fires after {now.isoformat()}"
                + ("" if stop_at is None else f" and before stop_at {stop_at.isoformat()}")
            )
        return first

    def stored(self, revision: int) -> StoredSchedule:
        return StoredSchedule(
            self.name, self.task, self.schedule, self.kwargs, self.options, revision
        )


class ScheduleVerbs:
    """The stored schedules' verbs (a base of ``FleetControl``)."""

    _table: LedgerTable
    _who: str
    _min_interval: float
    _max_schedules: int

    async def _call(self, fn: Any) -> Any:
        raise NotImplementedError  # FleetControl's

    async def add_schedule(
        self,
        name: str,
        task: str,
        schedule: Schedule,
        *,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> StoredSchedule:
        """Store a schedule: job *name* runs task *task* (``@scheduler.task``) on *schedule*
        with *kwargs*, on every replica that has the task, each slot once in the fleet.

        *options* are job options: ``timeout``, ``overlap``, ``jitter``, ``misfire_grace``,
        ``start_at``, ``stop_at``, ``tags``, ``recover``, ``alert_after``. A schedule
        without a zone runs in UTC. Replicas pick it up at their next sync (``sync_every``,
        2 s by default). Raises :class:`~cronlock.ScheduleError` for what no replica could
        run (naming the schedule and the value) and :class:`~cronlock.JobConflictError`
        when *name* is stored already or is a job defined in code; a schedule past a limit
        (``min_interval``, ``max_schedules``, sizes: docs/guides/stored-schedules.md) is a
        :class:`~cronlock.ScheduleError` too.
        """
        # Checked before any statement, as a replica checks the row (docs: the limits).
        checked = _Checked(name, task, schedule, kwargs, options, self._min_interval)
        return await self._change(name, lambda _: checked, adding=True)

    async def update_schedule(
        self,
        name: str,
        *,
        task: str | None = None,
        schedule: Schedule | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> StoredSchedule:
        """Change stored schedule *name*: what is given replaces what is stored (each of
        *options* on its own; ``None`` clears one), the rest stays; a cron or calendar
        *schedule* that names no zone keeps the stored one (``tz="UTC"`` moves it to UTC).
        A change of the schedule alone keeps the job on each replica (a run in flight goes
        on, its next slot is the new schedule's); any other change replaces the job. Raises
        :class:`~cronlock.JobLookupError` for a name not stored."""

        def merged(old: StoredSchedule | None) -> _Checked:
            if old is None:  # (_change refuses that first)
                raise JobLookupError(f"unknown schedule: {name}")
            return _Checked(
                name,
                old.task if task is None else task,
                old.schedule if schedule is None else in_zone_of(schedule, old.schedule),
                old.kwargs if kwargs is None else kwargs,
                {**old.options, **options},
                self._min_interval,
            )

        return await self._change(name, merged, adding=False)

    async def remove_schedule(self, name: str) -> bool:
        """Remove stored schedule *name*: replicas drop its job at their next sync (a run in
        flight goes on). Its runs stay in the ledger. False if it was not stored."""
        table = self._table

        async def remove(conn: Any) -> bool:
            async with schedules_change(conn, table):
                revision = await conn.fetchval(next_revision_sql(table))
                done = await conn.execute(remove_schedule_sql(table), name, revision, self._who)
                if done == NONE_REMOVED:
                    return False
                await conn.execute(forget_job_sql(table), name)
                return True

        removed: bool = await self._call(remove)
        return removed

    async def schedules(self) -> list[StoredSchedule]:
        """Every stored schedule, by name: its task, schedule, kwargs, options, revision,
        fleet-wide pause, the problems live replicas reported with its revision (those of
        replicas that exited are left out) and whether every live replica rejected it
        (:attr:`~cronlock.StoredSchedule.rejected`: its status is ``rejected``)."""
        rows = await self._call(lambda c: c.fetch(list_schedules_sql(self._table)))
        table = self._table.schedules
        return [s for row in rows if (s := decode_stored(row, table=table)) is not None]

    async def _unknown(self, conn: Any, name: str) -> str:
        names = [row["name"] for row in await conn.fetch(list_schedules_sql(self._table))]
        close = difflib.get_close_matches(name, names, n=1)
        return f"unknown schedule: {name}" + (f" (did you mean {close[0]}?)" if close else "")

    async def _change(
        self,
        name: str,
        make: Callable[[StoredSchedule | None], _Checked],
        *,
        adding: bool,
    ) -> StoredSchedule:
        """Add schedule *name* (*adding*), or update it to what *make* makes of the stored
        one, in one transaction."""
        table = self._table

        async def change(conn: Any) -> StoredSchedule:
            async with schedules_change(conn, table):
                row = await conn.fetchrow(schedule_for_update_sql(table), name)
                old = None if row is None or row["removed"] else row
                if adding:
                    if old is not None:
                        raise JobConflictError(
                            f"schedule {name!r} is stored already; update_schedule changes it"
                        )
                    if await conn.fetchval(job_in_code_sql(table), name):
                        raise JobConflictError(
                            f"schedule {name!r}: a job defined in code has this name (it has "
                            "runs in the ledger); choose another name"
                        )
                    stored = await conn.fetchval(count_schedules_sql(table))
                    limits.check_count(name, stored, self._max_schedules)
                    new = make(None)
                else:
                    was = None if old is None else decode_stored(old, table=table.schedules)
                    if was is None:
                        raise JobLookupError(await self._unknown(conn, name))
                    if was.unreadable is not None:  # nothing of it to keep: say so
                        raise ScheduleError(
                            f"schedule {name!r}: its stored row cannot be read "
                            f"({was.unreadable}); remove it and add it again"
                        )
                    new = make(was)
                first = new.first_slot(await conn.fetchval(SERVER_CLOCK_SQL))
                revision = await conn.fetchval(next_revision_sql(table))
                await conn.execute(
                    put_schedule_sql(table),
                    name,
                    revision,
                    new.task,
                    json.dumps(new.schedule_json),
                    new.kwargs_json,
                    json.dumps(new.options_json),
                    self._who,
                )
                # The job's schedule note, as a replica running it writes it: overdue by
                # its grace after the first slot unless some replica runs it.
                await conn.execute(
                    note_sql(table),
                    [name],
                    [str(new.schedule)],
                    [first],
                    self._who,
                    [overdue_grace(new.settings)],
                    [first],
                    0.0,
                    [tags_json(new.settings.tags)],
                    [None],  # how its slots are rebuilt: the replicas running it say
                )
                return new.stored(revision)

        result: StoredSchedule = await self._call(change)
        return result


def in_zone_of(schedule: Schedule, stored: Schedule) -> Schedule:
    """*schedule* in *stored*'s zone when it names none (an edit that leaves the zone out
    keeps it: a tenant's 08:00 must not move to 08:00 UTC); else *schedule* as it is."""
    zoned = CronSchedule | CalendarSchedule
    if isinstance(schedule, zoned) and schedule.tz is None and isinstance(stored, zoned):
        return dataclasses.replace(schedule, tz=stored.tz)
    return schedule
