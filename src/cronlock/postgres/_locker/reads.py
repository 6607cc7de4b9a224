"""A PostgresLocker's reads of the run ledger: one job's history, or many jobs at once.

Reads go to the job's shard, between its lock statements; a read of many jobs (start-up
catch-up) is one statement per :data:`READ_BATCH` jobs, however many jobs there are.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ..._cancel import task_name, uncancellable
from ..._errors import LockError
from ..._keys import job_lock_key
from ..._locking.protocols import LedgerSummary
from ..._pacing import Pacer
from .._sql.crashes import retry_due_sql
from .._sql.runs import (
    Prefixed,
    catch_up_sql,
    decode_history,
    decode_run,
    history_sql,
    last_claimed_sql,
    last_runs_sql,
    report_odd,
)
from .._sql.stored import (
    decode_changes,
    schedule_changes_sql,
    schedule_page_sql,
    schedule_problem_sql,
    schedule_top_sql,
    schedule_window_sql,
)
from .._sql.tables import LedgerTable

if TYPE_CHECKING:
    from ..._records import RunRecord
    from ..._stored.schedule import Change
    from .._conn import Channel
    from .crashes import CrashWatch
    from .ledgerless import NoLedgerReads

__all__ = ("READ_BATCH", "LedgerReads", "ReadsLedger")

READ_BATCH = 2000
"""Jobs per statement of a many-job read (catch-up's, the fleet watch's, the check for
retries left behind): a statement of a few tens of milliseconds, which a claim (that goes
first, ``_conn/dedicated.Turns``) waits for at most; a read of 100,000 names at once held
the session for a few hundred."""
_T = TypeVar("_T")
_DECODED = 50  # stored rows decoded between two looks at the pacer
_PAGE = 2000  # stored rows a statement of a sync reads
_FREEZE_ITEMS = 1 << 30  # a paged read is bulk work (see cronlock._pacing.FREEZE_FROM)
_STORED_KEY = "cronlock:stored-schedules"  # the shard the stored schedules are read on


class LedgerReads:
    """The ledger reads of a locker whose sessions are *shards*; *closed* says if it is.
    *holder* names the locker in the members table: its problems with stored schedules are
    noted under that name (shown while it is a live member)."""

    def __init__(
        self,
        shards: Sequence[Channel],
        table: LedgerTable,
        closed: Callable[[], bool],
        *,
        holder: str,
        key: Callable[[str], int] = job_lock_key,
    ) -> None:
        self._shards = shards
        self._holder = holder
        self._key = key
        self._table = table
        self._closed = closed
        self._catch_up_sql = catch_up_sql(table)

    async def last_claimed(self, job: str) -> datetime | None:
        """The latest slot of *job* any replica claimed."""
        sql = last_claimed_sql(self._table)
        found: datetime | None = await self._read(job, lambda s: s.fetchval(sql, job))
        return found

    async def last_runs(self, job: str) -> tuple[RunRecord | None, RunRecord | None]:
        """The latest finished run of *job* on any replica, and the latest successful one."""
        sql = last_runs_sql(self._table)
        rows = await self._read(job, lambda s: s.fetch(sql, job))
        runs = self._table.runs
        found = {row["kind"]: decode_run(row, table=runs, job=job) for row in rows}
        return found.get("last"), found.get("ok")

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        """The latest *limit* runs of *job*, newest first."""
        sql = history_sql(self._table)
        rows = await self._read(job, lambda s: s.fetch(sql, job, limit))
        runs = self._table.runs
        decoded = (decode_history(row, table=runs, job=job) for row in rows)
        return [record for record in decoded if record is not None]

    async def retry_due(self, job: str, slot: datetime, attempt: int, when: datetime) -> None:
        """Write down that attempt *attempt* of *slot* of *job* is due at *when*
        (:func:`.._sql.crashes.retry_due_sql`)."""
        sql = retry_due_sql(self._table)
        await self._read(job, lambda s: s.execute(sql, job, slot, attempt, when))

    async def summaries(self, jobs: Sequence[str]) -> Mapping[str, LedgerSummary]:
        """Each job's latest claimed slot, latest finished run and latest success.

        One statement per :data:`READ_BATCH` jobs, on the first job's shard. Jobs without
        a row are left out.
        """
        found: dict[str, LedgerSummary] = {}
        seen: set[str] = set()
        chunk: list[str] = []
        # Gathered a batch at a time, between the reads: a pass over 100,000 names in one
        # go would hold the loop for tens of milliseconds.
        for name in jobs:
            if name not in seen:
                seen.add(name)
                chunk.append(name)
                if len(chunk) == READ_BATCH:
                    await self._summarise(chunk, found)
                    chunk = []
        if chunk:
            await self._summarise(chunk, found)
        return found

    async def _summarise(self, chunk: list[str], found: dict[str, LedgerSummary]) -> None:
        """Read the summaries of the jobs named in *chunk* into *found* (one statement)."""
        sql, table = self._catch_up_sql, self._table
        rows: list[Any] = await self._read(chunk[0], functools.partial(_fetch, sql, chunk))
        for row in rows:
            job = row["job"]
            if row["odd_slot"] is not None:
                report_odd(table.runs, job, row["odd_slot"])
            if row["claimed"] is None:
                continue
            last, ok = (
                None
                if row[f"{prefix}slot"] is None
                else decode_run(Prefixed(row, prefix), table=table.runs, job=job)
                for prefix in ("l_", "s_")
            )
            found[job] = LedgerSummary(row["claimed"], last, ok)

    async def stored_changes(self, since: int) -> tuple[int, list[Change]]:
        """The stored schedules' latest revision and changes after *since*: one statement
        (on the shard of a fixed key) when there are fewer than :data:`_PAGE`; else pages
        of that many, each its own statement (a claim goes in between: 100,000 rows at
        once held the session for a few hundred milliseconds), up to the revision the
        first page saw."""
        table = self._table
        rows: list[Any] = await self._read(
            _STORED_KEY, lambda s: s.fetch(schedule_changes_sql(table), since, _PAGE)
        )
        pacer = Pacer(items=len(rows))
        if len(rows) < _PAGE:
            return await _decoded(rows, since, table, pacer)
        top = await self._read(_STORED_KEY, lambda s: s.fetchval(schedule_top_sql(table)))
        top, after, changes = int(top), "", []
        pacer = Pacer(items=_FREEZE_ITEMS)  # bulk work: freezes what it decoded
        page = functools.partial(
            _fetch_page, schedule_window_sql(table), schedule_page_sql(table), since, top
        )
        while True:
            rows, end = await self._read(_STORED_KEY, functools.partial(page, after))
            changes += (await _decoded(rows, since, table, pacer))[1]
            if end is None:
                return top, changes
            after = end

    async def report_problem(self, name: str, revision: int, problem: str) -> None:
        """Note *problem* in revision *revision* of stored schedule *name*, as this locker's
        holder (so it is shown while this locker is a live member, and no longer)."""
        table = self._table
        sql, who = schedule_problem_sql(table), self._holder
        await self._read(_STORED_KEY, lambda s: s.execute(sql, name, revision, problem, who))

    async def _read(self, job: str, call: Callable[[Any], Awaitable[_T]]) -> _T:
        if self._closed():
            raise LockError(f"job {job!r}: the PostgresLocker is closed")
        session = self._shards[self._key(job) % len(self._shards)]
        conn, generation = await session.ensure()
        return await uncancellable(
            session.run(
                conn,
                generation,
                call,
                what=f"job {job!r}: reading the run ledger",
                keep_on_server_error=True,
            ),
            name=task_name("pg-read", job),
        )


async def _decoded(
    rows: list[Any], since: int, table: LedgerTable, pacer: Pacer
) -> tuple[int, list[Change]]:
    """:func:`.._sql.stored.decode_changes` of *rows*, a few at a time, other tasks running
    in between: 100,000 rows take seconds to decode and check."""
    top, changes = since, []
    for start in range(0, len(rows), _DECODED):
        await pacer.pause()
        read, decoded = decode_changes(rows[start : start + _DECODED], since, table=table.schedules)
        top = max(top, read)
        changes += decoded
    return top, changes


async def _fetch_page(
    window: str, sql: str, since: int, top: int, after: str, conn: Any
) -> tuple[list[Any], str | None]:
    """The changes of the next :data:`_PAGE` names after *after* (:func:`.._sql.stored.
    schedule_page_sql`), and the last of those names (``None``: no more)."""
    end: str | None = await conn.fetchval(window, after, _PAGE - 1)
    rows: list[Any] = await conn.fetch(sql, since, top, after, end)
    return rows, end


async def _fetch(sql: str, names: list[str], conn: Any) -> list[Any]:
    rows: list[Any] = await conn.fetch(sql, names)
    return rows


class ReadsLedger:
    """The ledger half of :class:`cronlock.LedgerLocker`, a base of ``PostgresLocker``:
    reads through its :class:`LedgerReads`, and what its refusals told."""

    _reads: LedgerReads | NoLedgerReads
    _told: dict[str, tuple[RunRecord | None, RunRecord | None]]
    _crashes: CrashWatch

    async def last_claimed(self, job: str) -> datetime | None:
        """The latest slot of *job* any replica claimed; ``None`` without a ledger."""
        return await self._reads.last_claimed(job)

    async def last_runs(self, job: str) -> tuple[RunRecord | None, RunRecord | None]:
        """The latest finished run of *job* on any replica, and the latest successful one."""
        return await self._reads.last_runs(job)

    async def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The latest *limit* runs of *job* on any replica, newest first.

        Unfinished runs are included with outcome ``"unfinished"`` and no ``finished_at``.
        Empty without a ledger.
        """
        return await self._reads.history(job, limit)

    async def ledger_summaries(self, jobs: Sequence[str]) -> Mapping[str, LedgerSummary]:
        """The latest claimed slot, finished run and success of each of *jobs*, read in one
        statement per few thousand jobs (start-up catch-up); jobs without a row are left
        out. Empty without a ledger."""
        return await self._reads.summaries(jobs)

    async def stored_changes(self, since: int) -> tuple[int, list[Change]]:
        """The stored schedules' latest revision and every change after revision *since*
        (``FleetControl.add_schedule``...), oldest first: one statement per sync."""
        return await self._reads.stored_changes(since)

    async def report_problem(self, name: str, revision: int, problem: str) -> None:
        """Note in the ledger that this replica cannot run revision *revision* of stored
        schedule *name*, and why (``status`` and the dashboard show it)."""
        await self._reads.report_problem(name, revision, problem)

    def will_retry(self, job: str, slot: datetime, attempt: int) -> None:
        """The next :meth:`acquire` of *slot* of *job* claims attempt *attempt* by taking its
        failed row over in the ledger: granted once fleet-wide, and only while the attempt
        before it is the row's and failed (``retries``). Without a ledger, a plain claim."""
        self._crashes.retry(job, slot, attempt)

    async def retry_due(self, job: str, slot: datetime, attempt: int, when: datetime) -> None:
        """Write down in the ledger that attempt *attempt* of *slot* of *job* is due at
        *when*, while the attempt before it is the row's and failed or timed out: the
        scheduler's retry after a failed attempt (``retries``), which another replica makes
        if this one is gone by then. Nothing without a ledger. Raises
        :class:`cronlock.LockError` when the server cannot be reached or fails."""
        await self._reads.retry_due(job, slot, attempt, when)

    def refusal_history(self, job: str) -> tuple[RunRecord | None, RunRecord | None] | None:
        """What the ledger said with the refusal :meth:`acquire` just gave *job*: the job's
        latest finished run at or before that slot, and it again as the latest success when
        it succeeded. ``None`` when nothing was told (no ledger, no refusal, or asked
        already): a replica that loses a slot learns the fleet's history without a read."""
        return self._told.pop(job, None)
