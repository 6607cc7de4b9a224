"""Upkeep of a PostgresLocker's sessions: heartbeat, schedule notes, late outcomes, pruning.

One background task per locker, from its first session to its close. It never opens a
session itself (only acquiring and reading do), and it rides on the lock sessions: the
heartbeat checks each session that holds leases (so a heartbeat that fails drops that
session like any other statement would); writes, the check for crashed runs
(:mod:`._crashes`) and pruning use any open session.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ..._cancel import task_name, uncancellable
from ..._errors import LockError
from ..._logs import get_logger
from ..._pacing import Pacer
from ..._service import Service
from .._conn import Channel
from .._conn.background import execute_briefly, fetch_without_jit
from .._conn.errors import gone, lock_not_available
from .._conn.source import is_closed
from .._sql.definitions import define_sql, stale_definitions_sql
from .._sql.slots import prune_slots_sql, record_slots_sql
from .._sql.tables import LedgerTable
from .._sql.upkeep import HEARTBEAT_SQL, note_sql, prune_sql
from .crashes import CHECK_EVERY, CrashWatch

if TYPE_CHECKING:
    from ..._locking.protocols import Health
    from ..._records import RunRecord
    from .._modes.base import Exclusion

__all__ = (
    "COMPLAIN_EVERY",
    "NOTE_EVERY",
    "NOTE_LATEST",
    "PRUNE_BATCH",
    "PRUNE_EVERY",
    "WRITTEN",
    "LedgerUpkeep",
    "Upkeep",
    "tags_json",
)

_logger = get_logger("cronlock.postgres")
Fate = tuple[str, datetime, datetime, str, str, "datetime | None"]
"""A record of slots that did not run: (job, first, last, fate, reason, into)."""
_T = TypeVar("_T")

WRITTEN = 250
"""Jobs whose schedule notes (or definitions) one statement writes: a claim waits for the
statement in flight on its session, and 1,000 definitions a statement took the server
60-200 ms under load (250: a quarter of that)."""
_HEALTH_SLICE = 100  # jobs whose health is computed between two looks at the pacer
NOTE_EVERY = 5.0
"""Seconds between writes of changed job schedules (``note_schedule``) per locker."""
NOTE_LATEST = 30.0
"""Seconds: while runs hold leases, changed schedules wait, at most this long."""
PRUNE_EVERY = 300.0
"""Seconds between two prunes of the ledger by one locker (plus up to 20% jitter)."""
PRUNE_BATCH = 1000
"""Rows one prune statement deletes at most; a full batch is followed by another soon."""
COMPLAIN_EVERY = 600.0
"""Seconds: an upkeep duty that keeps failing the same way is logged again this often."""


class _Complaints:
    """Which upkeep duties fail, told at WARNING: when a duty starts failing or fails
    another way, then every ``COMPLAIN_EVERY`` seconds while it goes on; its recovery at
    INFO. A session that went away is not a duty's failure (its drop is told where it is
    dropped, and the next session retries): DEBUG."""

    def __init__(self) -> None:
        self._failing: dict[str, tuple[str, float]] = {}  # duty: (error's type, told at)

    def failed(self, duty: str, exc: BaseException) -> None:
        if gone(exc):
            _logger.debug("upkeep (%s) skipped: the lock session is gone", duty)
            return
        if exc.__cause__ is not None and lock_not_available(exc.__cause__):
            # Rows another transaction holds (a bulk change, until it commits): the write
            # gave up at once, so as not to hold the session; written at the next try.
            _logger.debug("upkeep (%s) waits for a lock another transaction holds", duty)
            return
        now = asyncio.get_running_loop().time()
        kind = type(exc).__name__
        known = self._failing.get(duty)
        if known is not None and known[0] == kind and now - known[1] < COMPLAIN_EVERY:
            _logger.debug("upkeep (%s) failed again: %r", duty, exc)
            return
        self._failing[duty] = (kind, now)
        _logger.warning(
            "PostgresLocker upkeep (%s) failed; the other duties go on, this one is retried: %r",
            duty,
            exc,
        )

    def succeeded(self, duty: str) -> None:
        if self._failing.pop(duty, None) is not None:
            _logger.info("PostgresLocker upkeep (%s) works again", duty)


class Upkeep(Service):
    """The upkeep every locker has: the heartbeat of the sessions that hold locks.

    *sessions* are the locker's shards; *holding* gives the indexes of those holding locks
    right now: only they are worth a heartbeat, every *heartbeat* seconds (``None``: none,
    as in lease mode, whose renewals prove its leases). Without a ledger this is all there
    is; :class:`LedgerUpkeep` adds the ledger's duties.
    """

    kind = "pg-upkeep"

    def __init__(
        self,
        sessions: Sequence[Channel],
        *,
        heartbeat: float | None,
        holding: Callable[[], Collection[int]],
    ) -> None:
        self._sessions = sessions
        self._heartbeat = heartbeat
        self._holding = holding
        self.heartbeats = 0
        self.health: Callable[[], Mapping[str, Health]] = dict
        """The jobs' overdue graces and due slots, written with their schedules (set by the
        fleet watch)."""

    def note(
        self,
        job: str,
        schedule: str,
        next_run: datetime | None,
        tags: Collection[str] = (),
        target: str | None = None,
    ) -> bool:
        """Remember *job*'s schedule, next slot and tags (and its function, *target*, when
        given); written if changed, batched. True when *job* was never noted before.
        Without a ledger: nowhere to write, False."""
        return False

    def write_late(self, job: str, slot: datetime, record: RunRecord, attempt: int = 1) -> None:
        """Keep the outcome of a hold whose session died, to write once a session is back
        (without a ledger: nowhere to write it)."""

    def describe(self, job: str, spec: str | None) -> None:
        """Remember how *job*'s slots are rebuilt, written with its note (without a
        ledger: nowhere to write it)."""

    def record(self, fate: Fate) -> None:
        """Keep the record of a range of slots that did not run, to write batched (without
        a ledger: nowhere to write it)."""

    async def prune(self) -> int:
        """Prune the ledger now; return how many rows went (without a ledger: none)."""
        return 0

    async def flush(self, session: Channel, conn: Any, generation: int) -> None:
        """Write what waits to be written, on *session* (at close; without a ledger:
        nothing)."""

    def _tick(self) -> float:
        """Seconds between two turns of the task."""
        return min(self._heartbeat or NOTE_EVERY, NOTE_EVERY)

    async def _duties(self, now: float, tick: float, session: Channel, conn: Any,
                      generation: int) -> None:  # fmt: skip
        """What a turn does on an open session besides the heartbeat."""

    def _any_open(self) -> tuple[Channel, Any, int] | None:
        """The first session with an open connection, that connection and its generation."""
        for session in self._sessions:
            conn = session.conn
            if conn is not None and not is_closed(conn):
                return session, conn, session.generation
        return None

    async def _beat(self, session: Channel) -> None:
        """Check one session that holds leases; a failure drops it (run() does that)."""
        conn, generation = session.conn, session.generation
        if conn is None or is_closed(conn):
            return  # already dropped, or about to be: its leases are (being) marked lost
        self.heartbeats += 1
        try:
            await session.run(
                conn, generation, lambda c: c.fetchval(HEARTBEAT_SQL), what="the heartbeat"
            )
        except LockError as exc:
            _logger.debug("lock session heartbeat failed: %r", exc)

    async def _beat_all(self, sessions: Sequence[Channel]) -> None:
        await asyncio.gather(*(self._beat(session) for session in sessions))

    async def _serve(self) -> None:
        """Owned by the locker from the first session to its close."""
        tick = self._tick()
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            beat = self._heartbeat
            if beat is not None:
                # Every session holding leases, at once: a cut one is noticed within about
                # heartbeat + statement_timeout, however many sessions it cut.
                due = [
                    self._sessions[i]
                    for i in self._holding()
                    if now - self._sessions[i].last_ok >= beat
                ]
                if due:
                    await uncancellable(self._beat_all(due), name=task_name("pg-heartbeat"))
            found = self._any_open()
            if found is not None:  # only acquire reconnects: upkeep never opens a session
                await self._duties(now, tick, *found)


class LedgerUpkeep(Upkeep):
    """Upkeep with a run ledger *table*: the heartbeat, and the ledger's duties on any open
    session (schedule notes, late outcomes, the crash check, pruning; see the module).

    *busy* says whether claims or runs are in flight (changed schedules then wait).
    *crashes* checks for crashed runs every few seconds; *host* is this replica's, whose own
    runs' late outcomes are written, in the statement of the locker's *exclusion*.
    """

    def __init__(
        self,
        sessions: Sequence[Channel],
        table: LedgerTable,
        *,
        retention: float,
        heartbeat: float | None,
        application_name: str,
        holding: Callable[[], Collection[int]],
        busy: Callable[[], bool] = lambda: False,
        host: str,
        crashes: CrashWatch,
        exclusion: Exclusion,
        spread: Callable[[], float] = lambda: 1.0,
        holder: str = "",
    ) -> None:
        super().__init__(sessions, heartbeat=heartbeat, holding=holding)
        # Each job's definition (its function and schedule) as this replica has it, and
        # those not written yet: written when it starts and when one changes, never per
        # slot (_sql/definitions.py: two definitions under one name in the fleet).
        self._holder = holder
        self._targets: dict[str, str] = {}
        self._definitions: dict[str, str] = {}
        self._undefined: set[str] = set()
        self._table = table
        self._retention = retention
        self._application_name = application_name
        self._busy = busy
        self._notes: dict[str, tuple[str, datetime | None, Collection[str]]] = {}
        self._dirty: set[str] = set()
        self._dirty_at: float | None = None  # loop time a tick first saw unwritten notes
        self._late: list[tuple[str, datetime, RunRecord, int]] = []
        self._specs: dict[str, str | None] = {}  # how each job's slots are rebuilt
        self._fates: list[Fate] = []  # records of slots that did not run, to write
        self._host = host
        self._crashes = crashes
        # Fleet-wide chores (crash checks, schedule notes) run N / racers times less often
        # on each replica of a large fleet (._members).
        self._spread = spread
        # Writes the late outcomes in the locker's mode (lease mode releases the lease too).
        self._exclusion = exclusion
        self._crash_at = 0.0  # loop time of the next check for crashed runs
        self._complaints = _Complaints()
        self._noted_at = float("-inf")
        self._prune_at = PRUNE_EVERY * random.uniform(0.2, 0.4)  # relative until started
        self._stale_full = False  # the last prune's batch of gone replicas' definitions

    def note(
        self,
        job: str,
        schedule: str,
        next_run: datetime | None,
        tags: Collection[str] = (),
        target: str | None = None,
    ) -> bool:
        """Remember *job*'s schedule, next slot and tags, and its function (*target*,
        ``module.qualname``: ``None``, as it was); written if changed, batched. True when
        *job* was never noted before."""
        if target is not None and self._targets.get(job) != target:
            self._targets[job] = target
            self._define(job, schedule)
        known = self._notes.get(job)
        if known == (schedule, next_run, tags):
            return False
        if known is not None and known[0] != schedule:
            self._define(job, schedule)
        self._notes[job] = (schedule, next_run, tags)
        self._dirty.add(job)
        return known is None

    def _define(self, job: str, schedule: str) -> None:
        """*job*'s definition, once its function is known: written if it changed."""
        target = self._targets.get(job)
        if target is None:
            return
        definition = f"{target} on {schedule}"
        if self._definitions.get(job) != definition:
            self._definitions[job] = definition
            self._undefined.add(job)

    def note_delay(self) -> float:
        """The longest this replica takes to write a changed note: a flush waits until
        ``NOTE_EVERY`` (times the fleet's spread) passed since the last one, and at most
        ``NOTE_LATEST`` for runs holding leases, then for the next tick. Twice it is the
        margin a published grace stands by past its next slot (see
        :func:`.._sql.upkeep.note_sql`)."""
        return max(NOTE_EVERY * self._spread(), NOTE_LATEST) + NOTE_EVERY

    def write_late(self, job: str, slot: datetime, record: RunRecord, attempt: int = 1) -> None:
        """Keep the outcome of a hold whose session died, to write once a session is back."""
        self._late.append((job, slot, record, attempt))

    def describe(self, job: str, spec: str | None) -> None:
        """Remember how *job*'s slots are rebuilt; its note is written again if it changed."""
        if spec is not None and self._specs.get(job) != spec:
            self._specs[job] = spec
            if job in self._notes:
                self._dirty.add(job)

    def record(self, fate: Fate) -> None:
        """Keep the record of a range of slots that did not run (written at the next tick,
        kept while the server cannot be reached)."""
        self._fates.append(fate)

    async def prune(self) -> int:
        """Prune batches now, connecting if needed, until one is not full; return the total."""
        total = 0
        while True:
            found = self._any_open()
            session = found[0] if found else self._sessions[0]
            conn, generation = found[1:] if found else await session.ensure()
            deleted = await uncancellable(
                self._prune_batch(session, conn, generation), name=task_name("pg-prune")
            )
            total += deleted
            if deleted < PRUNE_BATCH and not self._stale_full:
                return total

    def _starting(self, now: float) -> None:
        self._prune_at += now

    def _tick(self) -> float:
        return min(super()._tick(), CHECK_EVERY)

    async def _duties(self, now: float, tick: float, session: Channel, conn: Any,
                      generation: int) -> None:  # fmt: skip
        # Each duty on its own: one that fails (a server error on its statement) must
        # not stop the others, a failing note must not stop pruning or the crash check.
        if self._late:
            await self._duty("late outcomes", self._write_late, session, conn, generation)
        if self._fates:
            await self._duty("slots' fates", self._write_fates, session, conn, generation)
        # Written at once, whatever runs: only at start and when a definition changes, and
        # the fleet's conflict check (._fleetwatch) waits for them.
        if self._undefined:
            await self._duty("job definitions", self._write_definitions, session, conn,
                             generation)  # fmt: skip
        # Notes wait while runs hold leases (a burst's claims and ends come first:
        # the schedules of thousands of jobs are a long statement), within reason.
        if self._dirty and self._dirty_at is None:
            self._dirty_at = now
        if (
            self._dirty_at is not None
            and now - self._noted_at >= NOTE_EVERY * self._spread()
            and (now - self._dirty_at >= NOTE_LATEST or not self._busy())
        ):
            await self._duty("schedule notes", self._write_notes, session, conn, generation)
        # Other replicas' runs whose session is gone (ours are left to the late
        # writes above, which replace a "crashed" another replica may have set).
        if now >= self._crash_at:
            # Less half a tick: with a tick of CHECK_EVERY, a check on every tick.
            self._crash_at = now + CHECK_EVERY * self._spread() - tick / 2
            await self._duty("crash check", self._crashes.check, session, conn, generation)
        if now >= self._prune_at:
            deleted = await self._duty("prune", self._prune_batch, session, conn, generation)
            full = (deleted is not None and deleted >= PRUNE_BATCH) or self._stale_full
            self._prune_at = now + (tick if full else PRUNE_EVERY * random.uniform(1, 1.2))

    async def _duty(
        self,
        duty: str,
        fn: Callable[[Channel, Any, int], Coroutine[Any, Any, _T]],
        session: Channel,
        conn: Any,
        generation: int,
    ) -> _T | None:
        """Run one upkeep duty, uncancellably; its failure is told (:class:`_Complaints`)
        and swallowed, so the next duty runs, and this one is tried again next time."""
        try:
            result = await uncancellable(fn(session, conn, generation), name=task_name("pg-upkeep"))
        except LockError as exc:
            # A dead session was dropped (its leases marked lost, which is logged) by run();
            # a server error on upkeep leaves it sound, and says something is wrong.
            self._complaints.failed(duty, exc)
            return None
        except Exception:
            # A bug, or a row no decoding foresaw: said loudly, and upkeep goes on (its
            # heartbeats and crash checks must not stop in silence).
            _logger.exception("lock session upkeep (%s) failed unexpectedly", duty)
            return None
        self._complaints.succeeded(duty)
        return result

    def _report_lost(
        self, late: list[tuple[str, datetime, RunRecord, int]], unmarked: set[tuple[str, datetime]]
    ) -> None:
        """Runs cut off by a lost lock, now written: crashes for recovery (:mod:`._crashes`).
        Only those written over an unfinished row (*unmarked*): another replica that
        marked one crashed reported it (and reruns it on that word), and one taken over
        since is another attempt's."""
        crashes = self._crashes
        for job, slot, record, attempt in late:
            if record.outcome == "lock_lost" and attempt == 1 and (job, slot) in unmarked:
                crashes.lost(job, replace(record, slot=slot, owner=f"{self._host}:{os.getpid()}"))

    async def flush(self, session: Channel, conn: Any, generation: int) -> None:
        """Write changed job schedules and outcomes of lost leases, on *session*; each is
        tried even if the other fails (the first failure is raised after both)."""
        failure: BaseException | None = None
        for write in (self._write_late, self._write_notes, self._write_fates):
            try:
                await write(session, conn, generation)
            except LockError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    async def _write_late(self, session: Channel, conn: Any, generation: int) -> None:
        """Write the outcomes of lost leases (kept for the next try if that fails)."""
        if not self._late:
            return
        late, self._late = self._late, []
        statement = self._exclusion.late_finish(late, self._host, os.getpid())
        if statement is None:
            return
        try:
            written = await session.run(
                conn,
                generation,
                lambda c: c.fetch(statement.sql, *statement.args),
                what="writing late outcomes",
                keep_on_server_error=True,
            )
        except BaseException:
            self._late[:0] = late
            raise
        self._report_lost(late, {(row["job"], row["slot"]) for row in written if row["unmarked"]})

    async def _write_fates(self, session: Channel, conn: Any, generation: int) -> None:
        """Write the records of slots that did not run, :data:`WRITTEN` a statement (those
        not written are kept for the next try if one fails)."""
        while self._fates:
            chunk, self._fates = self._fates[:WRITTEN], self._fates[WRITTEN:]
            columns = list(zip(*chunk, strict=True))
            try:
                await session.run(
                    conn,
                    generation,
                    functools.partial(
                        execute_briefly, record_slots_sql(self._table), *columns, self._holder
                    ),
                    what="recording slots' fates",
                    keep_on_server_error=True,
                )
            except BaseException:
                self._fates[:0] = chunk
                raise

    async def _write_notes(self, session: Channel, conn: Any, generation: int) -> None:
        """Write changed job schedules, :data:`WRITTEN` a statement (those not written are
        kept for the next try if one fails), each statement's jobs in name order (two
        replicas writing the same notes lock their rows in one order: no deadlock; each
        statement is its own transaction). The 100,000 notes of a bulk change are built a
        slice at a time (:class:`cronlock._pacing.Pacer`): each job's health is computed
        when its note is written, and one sort of all the names held the loop for tens of
        milliseconds."""
        if not self._dirty:
            return
        dirty, self._dirty, self._dirty_at = self._dirty, set(), None
        names = list(dirty)
        known = self.health()  # a view: each job's health is computed when looked up
        delay = 2 * self.note_delay()
        pacer = Pacer()
        for start in range(0, len(names), WRITTEN):
            chunk = sorted(names[start : start + WRITTEN])
            health: list[Any] = []
            for at in range(0, len(chunk), _HEALTH_SLICE):
                await pacer.pause()
                health += [known.get(name) for name in chunk[at : at + _HEALTH_SLICE]]
            try:
                await session.run(
                    conn,
                    generation,
                    self._notes_statement(chunk, delay, health),
                    what="writing schedules",
                    keep_on_server_error=True,
                )
            except BaseException:
                self._dirty.update(names[start:])
                raise
        self._noted_at = asyncio.get_running_loop().time()

    def _notes_statement(
        self, names: list[str], delay: float, health: list[Any]
    ) -> Callable[[Any], Coroutine[Any, Any, Any]]:
        """The statement writing the notes of *names* (:func:`.._sql.upkeep.note_sql`)."""
        notes = [self._notes[name] for name in names]
        return functools.partial(
            execute_briefly,
            note_sql(self._table),
            names,
            [schedule for schedule, _, _ in notes],
            [next_run for _, next_run, _ in notes],
            self._application_name,
            [None if h is None else h[0] for h in health],
            [None if h is None else h[1] for h in health],
            delay,
            [tags_json(tags) for _, _, tags in notes],
            [self._specs.get(name) for name in names],
        )

    async def _write_definitions(self, session: Channel, conn: Any, generation: int) -> None:
        """Write the definitions changed since the last write, :data:`WRITTEN` a statement
        (those not written are kept for the next try if one fails)."""
        if not self._undefined:
            return
        undefined, self._undefined = self._undefined, set()
        names = list(undefined)
        for start in range(0, len(names), WRITTEN):
            chunk = sorted(names[start : start + WRITTEN])  # in name order, as notes are
            definitions = [self._definitions[name] for name in chunk]
            try:
                await session.run(
                    conn,
                    generation,
                    functools.partial(
                        execute_briefly, define_sql(self._table), self._holder, chunk, definitions
                    ),
                    what="writing job definitions",
                    keep_on_server_error=True,
                )
            except BaseException:
                self._undefined.update(names[start:])
                raise

    async def _prune_batch(self, session: Channel, conn: Any, generation: int) -> int:
        """Delete a batch of old runs (return how many), one of the definitions of
        replicas gone an hour and one of the slots' fates as old as the runs pruned
        (:attr:`_stale_full` when either batch was full: the caller prunes again soon, as
        after a full batch of runs)."""
        table = self._table
        deleted = await session.run(
            conn,
            generation,
            lambda c: c.fetchval(prune_sql(table), self._retention, PRUNE_BATCH),
            what="pruning the ledger",
            keep_on_server_error=True,
        )
        if deleted:
            _logger.debug(
                "pruned %d run(s) older than %gs from %s", deleted, self._retention, table.runs
            )
        rows = await session.run(
            conn,
            generation,
            lambda c: fetch_without_jit(c, stale_definitions_sql(table), self._holder, PRUNE_BATCH),
            what="pruning the definitions of replicas gone",
            keep_on_server_error=True,
        )
        stale = int(rows[0][0]) if rows else 0
        if stale:
            _logger.debug("pruned %d definition(s) of gone replicas", stale)
        fates = await session.run(
            conn,
            generation,
            lambda c: c.fetchval(prune_slots_sql(table), self._retention, PRUNE_BATCH),
            what="pruning the slots' fates",
            keep_on_server_error=True,
        )
        self._stale_full = stale >= PRUNE_BATCH or (fates or 0) >= PRUNE_BATCH
        return int(deleted)


def tags_json(tags: Collection[str]) -> str:
    """*tags* as :func:`.._sql.upkeep.note_sql` takes them: a JSON array, sorted; a tag the
    server cannot store (one with a NUL character) is left out. Made once per set of tags
    (jobs share a few: 100,000 notes are written a statement at a time)."""
    if isinstance(tags, frozenset):
        made = _tag_texts.get(tags)
        if made is None:
            if len(_tag_texts) >= 256:
                _tag_texts.clear()
            made = _tag_texts[tags] = _tags_text(tags)
        return made
    return _tags_text(tags)


_tag_texts: dict[frozenset[str], str] = {}


def _tags_text(tags: Collection[str]) -> str:
    return json.dumps(sorted(tag for tag in tags if "\x00" not in tag))
