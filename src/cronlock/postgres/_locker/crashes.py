"""Crashed runs: found, marked ``crashed``, reported, and rerun at most once fleet-wide.

Each claim records the backend pid of the session that made it (``session``). While a run
goes on, that session holds the job's advisory lock, so it is alive and listed in
``pg_stat_activity``. An unfinished row whose session is gone is therefore a crash: its
replica died (or lost its session) mid-run, and the server released its lock. Every
locker with a ledger looks for such rows every :data:`CHECK_EVERY` seconds, in one
``UPDATE ... RETURNING`` that marks them, so exactly one replica gets each row.

A recycled pid can only delay the check (the row looks alive until that backend ends);
it can never make a live run look crashed, since a live run's session keeps its pid.

The replica that marked a row tells its callbacks (the scheduler); if one will rerun the
slot, the locker's next acquire of that slot uses :func:`recover_sql`, which takes the row
over only while it is ``crashed`` on its first attempt: one rerun fleet-wide, never more.

A run cut off because its lock was lost (its session died, or its lease could not be
renewed: outcome ``lock_lost``) did not finish either, and is reported the same way by the
replica that ran it (:meth:`CrashWatch.lost`), once its outcome is in the ledger: a job
with ``recover=True`` has that slot run again too (a server restart or failover cuts off
every run in flight; they are not lost for good). The takeover treats ``lock_lost`` on a
first attempt as it treats ``crashed``.

Retries are durable the same way. The replica whose attempt failed writes down when the
next attempt is due (``retry_at``, :meth:`LedgerReads.retry_due
<cronlock.postgres._locker.reads.LedgerReads.retry_due>`) and makes it itself at that
instant. The same check looks for pending retries of this replica's jobs due
:data:`RETRY_MARGIN` seconds ago or more whose owner is gone (its members row expired or
deleted: killed, or stopped during the backoff), clears each as it returns it (one replica
gets it) and reports it to the callbacks with the failed attempt's record; one that will
make the retry has the next claim of the slot take the row over as the next attempt: the
same guarded takeover, so each attempt is claimed once fleet-wide.
"""

from __future__ import annotations

import functools
from datetime import datetime
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

from ..._logs import at, get_logger
from ..._records import NEVER_BEGAN
from .._sql import upkeep
from .._sql.runs import decode_run

if TYPE_CHECKING:
    from ..._locking.protocols import CrashCallback
    from ..._records import RunRecord
    from .._conn import Channel
    from .._modes.base import Statement

__all__ = ("CHECKED", "CHECK_EVERY", "RETRY_MARGIN", "CrashWatch")

CHECKED = 2000
"""Jobs per statement of the check for retries left behind (as ``reads.READ_BATCH``):
a claim waits for one such statement at most, not for a read of 100,000 names."""
_logger = get_logger("cronlock.postgres")

CHECK_EVERY = 3.0
"""Seconds between two checks for crashed runs by one locker (while a session is open)."""
RETRY_MARGIN = 5.0
"""Seconds past its due time before another replica takes a pending retry over: its own
replica, alive, makes it at that instant (give or take its clock's offset)."""
_REMEMBER = 1024  # slots awaiting their rerun, per locker; older ones are forgotten


class CrashWatch:
    """One locker's part in crash detection: the check, who to tell, what to rerun."""

    __slots__ = (
        "_callbacks",
        "_check",
        "_holder",
        "_jobs",
        "_pending",
        "_recoverable",
        "_reruns",
        "_retries",
        "_runs",
        "marked",
        "rerun",
        "retried",
    )

    def __init__(
        self,
        check: Statement | None,
        *,
        runs: str = "",
        retries: str = "",
        pending: str = "",
        holder: str = "",
    ) -> None:
        # The mode's check (session gone, or lease expired: Exclusion.crashed), None when
        # there is nothing to check (no ledger); *runs* names the table in what it logs.
        # *retries*: the statement that takes pending retries over (_sql/crashes.
        # retries_due_sql; "" without a ledger), as *holder*, for the jobs of has(), sent
        # the names of those among the jobs *pending* finds (retries_pending_sql).
        self._check = check
        self._runs = runs
        self._retries = retries
        self._pending = pending
        self._holder = holder
        self._jobs: dict[str, None] = {}
        self.retried = 0
        """Pending retries of gone replicas a callback said it would make."""
        self._callbacks: list[CrashCallback] = []
        # The attempt to claim, and the one its body is told (the same, but for a run
        # whose lock was lost before its body began: its body's first try is told 1).
        self._recoverable: dict[tuple[str, datetime], tuple[int, int]] = {}
        self._reruns: set[tuple[str, datetime]] = set()  # of those, crashed runs' reruns
        self.marked = 0
        """Rows this locker marked ``crashed``."""
        self.rerun = 0
        """Of those, how many a callback said it would run again."""

    @property
    def checks(self) -> bool:
        """Whether there is anything to check (a ledger)."""
        return self._check is not None

    def on_crashed(self, callback: CrashCallback) -> None:
        """Tell *callback* of each row marked from now on (once, however often added)."""
        if callback not in self._callbacks:
            self._callbacks.append(callback)

    def has(self, job: str) -> None:
        """*job* is one of this replica's: its pending retries may be taken over here."""
        self._jobs[job] = None

    def take(self, job: str, slot: datetime) -> tuple[int, int]:
        """The attempt *slot* of *job* is to be claimed as, by taking its row over (a rerun
        or a retry), and the attempt its body is told. ``(0, 1)``: a plain claim.

        A crashed run's rerun is kept (until forgotten among the oldest): its claim may be
        refused for now (the job's lock held by another replica's run), and the scheduler
        claims it again (``_core/recovery``); the takeover itself lets one claim through,
        fleet-wide. A retry's is forgotten (one claim)."""
        if not self._recoverable:  # the usual case, asked once per claim
            return 0, 1
        key = (job, slot)
        found = self._recoverable.get(key)
        if found is None:
            return 0, 1
        if key not in self._reruns:
            del self._recoverable[key]
        return found

    def retry(self, job: str, slot: datetime, attempt: int) -> None:
        """The next claim of *slot* of *job* takes its failed row over as *attempt*."""
        self._remember(job, slot, attempt)

    def _remember(
        self,
        job: str,
        slot: datetime,
        attempt: int,
        told: int | None = None,
        *,
        rerun: bool = False,
    ) -> None:
        key = (job, slot)
        self._recoverable[key] = (attempt, attempt if told is None else told)
        if rerun:
            self._reruns.add(key)
        else:
            self._reruns.discard(key)
        if len(self._recoverable) > _REMEMBER:
            oldest = next(iter(self._recoverable))
            del self._recoverable[oldest]
            self._reruns.discard(oldest)

    async def check(self, session: Channel, conn: Any, generation: int) -> int:
        """Mark crashed runs on *session* and report each; return how many were marked."""
        check = self._check
        if check is None:
            return 0
        rows = await session.run(
            conn,
            generation,
            lambda c: c.fetch(check.sql, *check.args),
            what="checking for crashed runs",
            keep_on_server_error=True,
        )
        for row in rows:
            record = decode_run(row, table=self._runs, job=row["job"])
            if record is not None:  # marked, but a row no callback could use (._decode)
                self._report(row["job"], record)
        if self._retries and self._jobs:
            await self._take_retries(session, conn, generation)
        return len(rows)

    async def _take_retries(self, session: Channel, conn: Any, generation: int) -> None:
        """Take over the pending retries of this replica's jobs whose replica is gone: a
        look at which jobs have one first, then the take-over sent those names only."""
        sql, jobs = self._retries, self._jobs
        if self._pending:
            pending = await session.run(
                conn,
                generation,
                functools.partial(_fetch_retries, self._pending, RETRY_MARGIN),
                what="checking for retries left by replicas gone",
                keep_on_server_error=True,
            )
            names = [row["job"] for row in pending if row["job"] in jobs]
        else:
            names = list(jobs)
        for start in range(0, len(names), CHECKED):  # a claim may go in between
            chunk = names[start : start + CHECKED]
            rows = await session.run(
                conn,
                generation,
                functools.partial(
                    _fetch_retries, sql, chunk, RETRY_MARGIN, self._holder, upkeep.MEMBER_TTL
                ),
                what="checking for retries left by replicas gone",
                keep_on_server_error=True,
            )
            for row in rows:
                record = decode_run(row, table=self._runs, job=row["job"])
                if record is not None:
                    self._report_retry(row["job"], record)

    def _report_retry(self, job: str, record: RunRecord) -> None:
        """*record*, attempt k of its slot, failed and its replica is gone before making
        attempt k + 1: a callback that makes it has this locker take the row over."""
        retry = self._tell(job, record)
        if retry:
            self.retried += 1
            self._remember(job, record.slot, record.attempt + 1)
        _logger.log(
            WARNING if retry else INFO,
            "job %r slot %s: attempt %d failed on %s, gone before making attempt %d; %s",
            job,
            record.slot.isoformat(),
            record.attempt,
            record.owner,
            record.attempt + 1,
            "this replica makes it" if retry else "this replica does not make it",
            extra=at(job, record.slot),
        )

    def _tell(self, job: str, record: RunRecord) -> bool:
        """Tell each callback of *record*; whether one will run the slot again."""
        again = False
        for callback in tuple(self._callbacks):
            try:
                again = bool(callback(job, record)) or again
            except Exception:
                _logger.exception(
                    "crash callback %r failed on job %r", callback, job, extra=at(job)
                )
        return again

    def lost(self, job: str, record: RunRecord) -> None:
        """This replica's run *record* of *job* (first attempt) was cut off because its lock
        was lost, and its outcome is now in the ledger: report it as a crash (a callback may
        rerun the slot, taking the ``lock_lost`` row over)."""
        self._report(job, record, marked=False)

    def _report(self, job: str, record: RunRecord, *, marked: bool = True) -> None:
        self.marked += marked
        rerun = self._tell(job, record)
        if rerun:
            self.rerun += 1
            # A run whose lock was lost before its body began: its rerun is the body's first.
            self._remember(job, record.slot, 2, 1 if record.error == NEVER_BEGAN else 2, rerun=True)
        # This replica's own run cut off by a lost lock was said at ERROR when it was
        # cancelled: its record reaching the ledger is news only if it is run again.
        _logger.log(
            WARNING if marked or rerun else INFO,
            "job %r slot %s: the run by %s (started %s, attempt %d) crashed (%s); %s%s",
            job,
            record.slot.isoformat(),
            record.owner,
            record.started_at.isoformat(),
            record.attempt,
            record.error,
            "marked crashed" if marked else "its lock was lost",
            "; this replica runs it again" if rerun else "",
            extra=at(job, record.slot),
        )


async def _fetch_retries(sql: str, *args: Any) -> list[Any]:
    """``conn.fetch(sql, *args)``, the connection given last (as a session runs a call)."""
    *values, conn = args
    rows: list[Any] = await conn.fetch(sql, *values)
    return rows
