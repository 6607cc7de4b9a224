"""The fleet watch: one replica's reads of what the fleet says of its jobs.

Every :data:`POLL_EVERY` seconds one statement reads the pauses and the triggered runs of
the jobs this locker's schedulers run (a trigger is taken by exactly one replica, in that
statement), and every :data:`RUNS_EVERY` seconds (times the fleet's spread) the fleet's
latest runs of them, whether another live replica defines one of them otherwise
(:mod:`.conflicts`) and the stored schedules every live replica rejected (one statement);
each read goes to the schedulers as a :class:`cronlock.FleetView`.
The operators' side writes what is read here (:mod:`.._ops.control`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections import ChainMap
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..._cancel import task_name, uncancellable
from ..._errors import LockError
from ..._keys import job_lock_key
from ..._locking.protocols import FleetCallback, FleetView, Health
from ..._logs import get_logger
from ..._pacing import Pacer
from ..._records import RunRecord
from ..._service import Service
from .._conn import Channel
from .._sql.control import poll_sql
from .._sql.runs import decode_run, last_runs_many_sql, report_odd
from .._sql.schema import first_seen_sql
from .._sql.stored import rejected_sql
from .._sql.tables import LedgerTable
from .conflicts import ConflictWatch
from .reads import READ_BATCH

__all__ = ("POLL_EVERY", "RUNS_EVERY", "TRIGGER_EXPIRES", "FleetWatch")

_logger = get_logger("cronlock.postgres")

TRIGGER_EXPIRES = 3600
"""Seconds after which a trigger no replica claimed is dropped (nobody runs that job)."""

POLL_EVERY = 1.0
"""Seconds between two reads of the control table by one locker (triggers start within it)."""
RUNS_EVERY = 15.0
"""Seconds between two reads of the fleet's latest runs of this locker's jobs."""
_DECODED = 100  # rows decoded between two looks at the pacer
_LISTED = 1000  # job names listed between two looks at the pacer


class FleetWatch(Service):
    """A locker's reads of the fleet's shared state, one task from its first session on.

    Every :data:`POLL_EVERY` seconds it reads the control table (pauses, pending triggers:
    one small statement), and every :data:`RUNS_EVERY` seconds the latest run and success of
    every watched job (one statement per :data:`.reads.READ_BATCH` jobs, two index probes a
    job; and, while some have none known yet, their first-seen instants, one more), their conflicts
    (:class:`.conflicts.ConflictWatch`, one more) and the names of the stored schedules
    rejected everywhere (one more, for ``cronlock_schedule_rejected``); it hands
    each read to the callbacks as :class:`~cronlock.FleetView` s: the control table's, then
    one per statement of runs, then the conflicts and rejected schedules. It reads on the locker's
    lock *sessions*.
    """

    kind = "pg-fleet"

    def __init__(
        self,
        table: LedgerTable,
        sessions: Sequence[Channel],
        spread: Callable[[], float] = lambda: 1.0,
        holder: str = "",
    ) -> None:
        # In a large fleet each replica reads N / racers times less often (._members): the
        # fleet as a whole reads at the rate of a small one.
        self._spread = spread
        self._poll_sql = poll_sql(table)
        self._runs_sql = last_runs_many_sql(table, ("last", "ok"))
        self._first_seen_sql = first_seen_sql(table)
        self._rejected_sql = rejected_sql(table)
        # Each job's first-seen instant never changes once noted: read once a job.
        self._first_seen: dict[str, datetime] = {}
        self._runs, self._control = table.runs, table.control
        self._sessions = sessions
        self._watchers: list[tuple[FleetCallback, Callable[[], Mapping[str, Health]]]] = []
        self._runs_at = float("-inf")
        self.reads = 0
        self.conflicts = ConflictWatch(table, holder)
        """Two definitions under one name: this locker's jobs' conflicts (:mod:`.conflicts`)."""

    @property
    def watched(self) -> bool:
        """Whether anyone watches (the task is started only then)."""
        return bool(self._watchers)

    def add(self, callback: FleetCallback, jobs: Callable[[], Mapping[str, Health]]) -> None:
        """Call *callback* with each read; *jobs* gives the jobs to read runs of."""
        self._watchers.append((callback, jobs))

    def names(self) -> list[str]:
        """Every watched job, in no particular order (sorting 100,000 names held the event
        loop for tens of milliseconds; the reads sort each statement's own)."""
        if len(self._watchers) == 1:  # one scheduler on this locker (the usual case)
            return list(iter(self._watchers[0][1]()))  # (list(mapping) asks its len first)
        return list({name for _, jobs in self._watchers for name in jobs()})

    async def _names_paced(self, pacer: Pacer) -> list[str]:
        """:meth:`names`, gone through :data:`_LISTED` at a time between looks at *pacer*."""
        if len(self._watchers) != 1:
            return self.names()
        names: list[str] = []
        listed = iter(self._watchers[0][1]())
        while chunk := list(itertools.islice(listed, _LISTED)):
            names += chunk
            await pacer.pause()
        return names

    def health(self) -> Mapping[str, Health]:
        """Each watched job's overdue grace and the slot it is due by, computed when read."""
        maps = [jobs() for _, jobs in self._watchers]
        if len(maps) == 1:  # one scheduler on this locker (the usual case): no ChainMap
            return maps[0]
        return ChainMap(*maps)  # type: ignore[arg-type]

    def _wanted(self) -> bool:
        return bool(self._watchers)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self.read_once(loop.time(), self._tell)
            except LockError as exc:
                # The lock sessions log outages themselves; the next read tries again.
                _logger.debug("reading the fleet's state failed: %s", exc)
            except Exception:
                # Anything else is a bug or a row no decoding foresaw: said loudly, and the
                # watch goes on (pauses, triggers and the fleet's runs must keep coming).
                _logger.exception("reading the fleet's state failed unexpectedly")
            await asyncio.sleep(POLL_EVERY * self._spread())

    def _tell(self, view: FleetView) -> None:
        for callback, _ in tuple(self._watchers):
            try:
                callback(view)
            except Exception:
                _logger.exception("fleet callback %r failed", callback)

    async def _read(self, call: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run *call* on an open lock session; with none open, on the shard of a watched job
        (which that job's runs open anyway): the watch alone opens no extra session."""
        sessions = self._sessions
        session = next((s for s in sessions if s.is_open), None)
        if session is None:
            first = min(self.names(), default="")
            session = sessions[job_lock_key(first) % len(sessions)]
        conn, generation = await session.ensure()
        return await uncancellable(
            session.run(
                conn, generation, call, what="reading the fleet's state", keep_on_server_error=True
            ),
            name=task_name("pg-fleet-read"),
        )

    async def read_once(self, now: float, tell: Callable[[FleetView], None]) -> None:
        """Read the control table and *tell* what it says (pauses, triggers); when the
        latest runs are due at *now*, read them too and tell them in further views, each
        with the runs and first-seen instants of :data:`.reads.READ_BATCH` jobs, the last
        with the conflicts and the stored schedules rejected everywhere. The rows of
        100,000 jobs are decoded a slice at a time (:class:`cronlock._pacing.Pacer`)."""
        rows = await self._read(lambda c: c.fetch(self._poll_sql, float(TRIGGER_EXPIRES)))
        self.reads += 1
        paused = frozenset(row["job"] for row in rows if row["paused"])
        triggers = {row["job"]: row["trigger_slot"] for row in rows if row["trigger_slot"]}
        for row in rows:
            if row["odd"] is not None:
                report_odd(self._control, row["job"], f"trigger_slot={row['odd']}")
        tell(FleetView(paused=paused, triggers=triggers))
        # Not spread out: every replica's gauges (overdue, last success) must stay right,
        # standing by or not, and this read is one statement every RUNS_EVERY seconds.
        if now - self._runs_at < RUNS_EVERY:
            return
        seen, pacer = self._first_seen, Pacer()
        names = await self._names_paced(pacer)
        for start in range(0, len(names), READ_BATCH):
            chunk = sorted(names[start : start + READ_BATCH])
            found: list[Any] = await self._read(
                functools.partial(_fetch_names, self._runs_sql, chunk)
            )
            self._runs_at = now
            told: dict[tuple[str, str], RunRecord | None] = {}
            for at in range(0, len(found), _DECODED):
                await pacer.pause()
                for row in found[at : at + _DECODED]:
                    job = row["job"]
                    told[(row["kind"], job)] = decode_run(row, table=self._runs, job=job)
            unknown = [name for name in chunk if name not in seen]
            if unknown:
                noted = await self._read(
                    functools.partial(_fetch_names, self._first_seen_sql, unknown)
                )
                seen.update((row["job"], row["first_seen"]) for row in noted)
            await pacer.pause()
            tell(
                FleetView(
                    paused=paused,
                    runs={
                        name: (told.get(("last", name)), told.get(("ok", name))) for name in chunk
                    },
                    first_seen={name: seen[name] for name in chunk if name in seen},
                )
            )
        self._runs_at = now
        conflicts = await self.conflicts.read(self._read, now)
        found = await self._read(lambda c: c.fetch(self._rejected_sql))
        tell(
            FleetView(
                paused=paused,
                conflicts=conflicts,
                rejected=frozenset(row["name"] for row in found),
            )
        )


async def _fetch_names(sql: str, names: list[str], conn: Any) -> list[Any]:
    rows: list[Any] = await conn.fetch(sql, names)
    return rows
