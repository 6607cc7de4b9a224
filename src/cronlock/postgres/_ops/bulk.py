"""Stored schedules in bulk, verbs of :class:`~cronlock.postgres.FleetControl`: put many
at once (create or replace by name), and make the schedules under a name prefix equal to
a desired set (what a service with a tenants table writes by hand otherwise).

Each batch is checked whole before any statement, schedule by schedule as
``add_schedule`` checks one (:class:`.stored._Checked`: the same messages, naming the
schedule), then written in one transaction of a few statements whatever its size: the
changes' lock, the schedules as arrays (``unnest``: one statement), the removals, and the
job notes. A batch is one revision: a replica's sync (``revision > N``) reads all of it or
none of it, since it commits at once. A schedule already stored as given is left alone,
and a batch that changes nothing takes no revision: putting or syncing the same set twice
is a no-op the second time, which replicas never hear of.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from ..._errors import ConfigError, JobConflictError, ScheduleError
from ..._stored import limits
from ..._stored.json import overdue_grace
from ..._stored.schedule import StoredSchedule
from .._locker.upkeep import tags_json
from .._sql.fleet import SERVER_CLOCK_SQL
from .._sql.stored import (
    count_schedules_sql,
    forget_jobs_sql,
    lock_notes_sql,
    next_revision_sql,
    put_schedules_sql,
    remove_missing_sql,
)
from .._sql.tables import LedgerTable
from .._sql.upkeep import note_sql
from .stored import _Checked, schedules_change

__all__ = ("OFF_LOOP_FROM", "BulkVerbs", "ScheduleChanges", "check_batch")

OFF_LOOP_FROM = 1000
"""Batches of this many schedules or more are checked and prepared in a worker thread: tens
of microseconds each, a 100,000 schedule batch would hold the caller's event loop (a web
service's) for seconds; the thread lets it run between (small batches stay on the loop:
a thread would cost more than it saves)."""

_T = TypeVar("_T")


async def _off_loop(size: int, fn: Callable[[], _T]) -> _T:
    if size < OFF_LOOP_FROM:
        return fn()
    return await asyncio.to_thread(fn)


@dataclass(frozen=True, slots=True)
class ScheduleChanges:
    """What :meth:`~cronlock.postgres.FleetControl.put_schedules` or
    :meth:`~cronlock.postgres.FleetControl.sync_schedules` did: how many schedules it
    *added* (not stored, or removed before), *updated* (stored otherwise: replaced),
    *removed* (the set sync's, under its prefix) and left *unchanged* (stored as given),
    and the *revision* the changes share (``None``: nothing changed, no revision taken)."""

    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    revision: int | None = None

    @property
    def changed(self) -> int:
        """How many schedules were added, updated or removed."""
        return self.added + self.updated + self.removed


def check_batch(
    schedules: Iterable[StoredSchedule], *, prefix: str | None, min_interval: float
) -> list[_Checked]:
    """Every schedule of a batch checked as ``add_schedule`` checks one, in order, before
    any statement: raises for the first that is refused, naming it (and the field and
    value), for a name given twice, and with *prefix* (a set sync) for a name outside it.
    Options given as ``None`` are left out (a put replaces the whole schedule: an option
    not given is not set)."""
    checked: list[_Checked] = []
    seen: set[str] = set()
    for index, stored in enumerate(schedules):
        if not isinstance(stored, StoredSchedule):
            raise ConfigError(
                f"schedule #{index + 1} of the batch: expected a StoredSchedule, got "
                f"{type(stored).__name__} {stored!r:.80}"
            )
        options = {key: value for key, value in stored.options.items() if value is not None}
        one = _Checked(
            stored.name, stored.task, stored.schedule, stored.kwargs, options, min_interval
        )
        if one.name in seen:
            raise ScheduleError(f"schedule {one.name!r} is given twice in the batch")
        if prefix is not None and not one.name.startswith(prefix):
            raise ScheduleError(
                f"schedule {one.name!r}: its name does not start with the prefix {prefix!r} "
                "being synced (a set sync changes only the schedules under its prefix)"
            )
        seen.add(one.name)
        checked.append(one)
    return checked


def _prepared(
    batch: list[_Checked], now: datetime
) -> tuple[list[str], list[str], dict[tuple[str, str], datetime]]:
    """Each schedule's and options' JSON text, and the first slot after *now* of each
    distinct pair, as add_schedule finds it (refused if it never fires): tenants share a
    handful of schedules, so each is worked out once."""
    texts: dict[int, str] = {}  # schedules checked alike share their JSON: made once

    def text(data: dict[str, Any]) -> str:
        made = texts.get(id(data))
        if made is None:
            made = texts[id(data)] = json.dumps(data, sort_keys=True)
        return made

    schedules = [text(one.schedule_json) for one in batch]
    options = [text(one.options_json) for one in batch]
    firsts: dict[tuple[str, str], datetime] = {}
    for one, schedule, option in zip(batch, schedules, options, strict=True):
        if (schedule, option) not in firsts:
            firsts[schedule, option] = one.first_slot(now)
    return schedules, options, firsts


def _name(one: _Checked) -> str:
    return one.name


async def write_batch(
    conn: Any,
    table: LedgerTable,
    who: str,
    batch: list[_Checked],
    prefix: str | None,
    max_schedules: int,
) -> ScheduleChanges:
    """Store *batch* (checked) in one transaction and, with *prefix*, remove the stored
    schedules under it that *batch* does not name; one revision for all of it, none when
    nothing changed. A batch that would leave more than *max_schedules* stored is refused
    whole (``_stored/limits.check_count``).

    Rows are written in code point order of the names, the order in which a replica
    writes its jobs' notes (``_locker/upkeep``), so that the two never wait for each
    other crosswise (a deadlock, which the server resolves by failing one of them)."""
    batch = sorted(batch, key=_name)
    names = [one.name for one in batch]
    # Prepared before the changes' lock, so that a large batch holds it only while it
    # writes (other changes wait for it at most LOCK_WAIT).
    now: datetime = await conn.fetchval(SERVER_CLOCK_SQL)
    schedules, options, firsts = await _off_loop(len(batch), lambda: _prepared(batch, now))
    async with schedules_change(conn, table):
        revision: int = await conn.fetchval(next_revision_sql(table))
        rows = await conn.fetch(
            put_schedules_sql(table),
            names,
            [one.task for one in batch],
            schedules,
            [one.kwargs_json for one in batch],
            options,
            revision,
            who,
        )
        in_code = sorted(row["name"] for row in rows if row["in_code"])
        if in_code:  # raised inside the transaction: nothing of the batch is written
            others = f" (and {len(in_code) - 1} more)" if len(in_code) > 1 else ""
            raise JobConflictError(
                f"schedule {in_code[0]!r}{others}: a job defined in code has this name (it "
                "has runs in the ledger); choose another name"
            )
        added = {row["name"]: bool(row["added"]) for row in rows}
        removed: list[str] = []
        if prefix is not None:
            gone = await conn.fetch(remove_missing_sql(table), prefix, names, revision, who)
            removed = [row["name"] for row in gone]
            if removed:
                # The notes of the removed and the written, locked in one pass in order
                # first: deleting some and then writing others would take two passes.
                await conn.execute(lock_notes_sql(table), sorted({*removed, *added}))
                await conn.execute(forget_jobs_sql(table), removed)
        if any(added.values()):  # the ledger's limit, counted with the batch's changes
            stored = await conn.fetchval(count_schedules_sql(table))
            if stored > max_schedules:
                first = next(name for name, new in added.items() if new)
                limits.check_count(first, stored - 1, max_schedules)
        written = [
            (one, firsts[schedule, option])
            for one, schedule, option in zip(batch, schedules, options, strict=True)
            if one.name in added
        ]
        if written:
            # The jobs' schedule notes, as add_schedule writes one (overdue by its grace
            # after the first slot unless some replica runs it), in one statement.
            await conn.execute(
                note_sql(table),
                [one.name for one, _ in written],
                [str(one.schedule) for one, _ in written],
                [first for _, first in written],
                who,
                [overdue_grace(one.settings) for one, _ in written],
                [first for _, first in written],
                0.0,
                [tags_json(one.settings.tags) for one, _ in written],
                [None] * len(written),  # how its slots are rebuilt: the replicas say
            )
    new = sum(added.values())
    return ScheduleChanges(
        added=new,
        updated=len(added) - new,
        removed=len(removed),
        unchanged=len(batch) - len(added),
        revision=revision if added or removed else None,
    )


class BulkVerbs:
    """The stored schedules' bulk verbs (a base of ``FleetControl``)."""

    _table: LedgerTable
    _who: str
    _min_interval: float
    _max_schedules: int

    async def _call(self, fn: Any) -> Any:
        raise NotImplementedError  # FleetControl's

    async def put_schedules(self, schedules: Iterable[StoredSchedule]) -> ScheduleChanges:
        """Store each of *schedules*: create it, or replace the one stored under its name
        (task, schedule, kwargs and options, all of them: an option not given is not set;
        a cron or calendar schedule without a zone is stored in UTC, as by
        :meth:`add_schedule`). The fields of a :class:`~cronlock.StoredSchedule` beyond
        those (revision, pause, problems) are not read, so what :meth:`schedules` lists
        can be put back as it is.

        Every schedule is checked first, as :meth:`add_schedule` checks one: the first
        refused raises (:class:`~cronlock.ScheduleError` naming it, the field and the
        value; :class:`~cronlock.JobConflictError` for a name a job defined in code has)
        and nothing is stored. Then the whole batch is one transaction and one revision,
        which replicas pick up at their next sync; a schedule stored as given already is
        left alone (a batch that changes nothing takes no revision). Written in a few
        statements whatever the number of schedules: tens of thousands a second."""
        given = list(schedules)
        least = self._min_interval
        batch = await _off_loop(
            len(given), lambda: check_batch(given, prefix=None, min_interval=least)
        )
        if not batch:
            return ScheduleChanges()
        table, who = self._table, self._who
        done: ScheduleChanges = await self._call(
            lambda conn: write_batch(conn, table, who, batch, None, self._max_schedules)
        )
        return done

    async def sync_schedules(
        self, prefix: str, schedules: Iterable[StoredSchedule]
    ) -> ScheduleChanges:
        """Make the stored schedules whose names start with *prefix* exactly *schedules*:
        add those not stored, replace those stored otherwise, remove the others under
        *prefix* (schedules outside it are left alone), in one transaction and one
        revision. Idempotent: a second sync of the same set changes nothing and takes no
        revision. Each of *schedules* must start with *prefix* and is checked as by
        :meth:`put_schedules`, before anything is written; an empty *prefix* covers every
        stored schedule (an empty set then removes them all)."""
        if not isinstance(prefix, str):
            raise ConfigError(f"sync_schedules: prefix must be a string, got {prefix!r}")
        given = list(schedules)
        least = self._min_interval
        batch = await _off_loop(
            len(given), lambda: check_batch(given, prefix=prefix, min_interval=least)
        )
        table, who = self._table, self._who
        done: ScheduleChanges = await self._call(
            lambda conn: write_batch(conn, table, who, batch, prefix, self._max_schedules)
        )
        return done
