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
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..._logs import at, get_logger
from .._sql.decode import R_RUN, decode_run
from .._sql.tables import LedgerTable

if TYPE_CHECKING:
    from ..._locking.protocols import CrashCallback
    from ..._records import RunRecord
    from .._conn.dedicated import LockSession

__all__ = ("CHECK_EVERY", "TAKEN_OVER", "CrashWatch", "crashed_sql", "recover_sql")

_logger = get_logger("cronlock.postgres")

CHECK_EVERY = 3.0
"""Seconds between two checks for crashed runs by one locker (while a session is open)."""
_REMEMBER = 1024  # slots awaiting their rerun, per locker; older ones are forgotten


def crashed_sql(table: LedgerTable) -> str:
    """Mark unfinished runs whose claiming session is gone ``crashed``; return them.

    ``$1`` host, ``$2`` pid: this process's own runs are left alone, since it writes their
    real outcome itself once a session is back (a run whose session died under a live
    replica ends ``lock_lost``). Concurrent checks by several replicas mark each row once:
    the second one finds it finished.
    """
    return f"""
        UPDATE {table.runs} AS r
        SET outcome = 'crashed', finished_at = clock_timestamp(),
            error = 'its replica (' || r.host || ':' || r.pid
                    || ') died mid-run: lock session gone'
        WHERE r.finished_at IS NULL AND r.session IS NOT NULL
          AND NOT (r.host = $1::text AND r.pid = $2::integer)
          AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.session)
        RETURNING r.job, {R_RUN}"""


TAKEN_OVER = """r.attempt = {attempt} - 1
              AND (r.outcome IN ('failed', 'timed_out')
                   OR (r.outcome IN ('crashed', 'lock_lost') AND r.attempt = 1))"""
"""Which row a takeover claiming attempt *attempt* may take: the attempt before it, failed
or timed out (a retry), or crashed or cut off on its first attempt (a crashed run's rerun)."""


def recover_sql(table: LedgerTable) -> str:
    """Lock and take over a slot's row, in one statement: the claim of a crashed run's rerun
    or of a failed run's retry.

    The same parameters and answers as :func:`._batchsql.claim_many_sql` (*ran* is always
    false: the row is expected; a job paused fleet-wide is refused as by the claim), and
    ``$6`` the attempt to claim. Only the row at the attempt before it is taken over, and
    only while it failed or timed out, or was marked ``crashed`` (or ``lock_lost``) on its
    first attempt (:data:`TAKEN_OVER`; this replica as owner, started now): a crashed run is
    rerun at most once fleet-wide, and every attempt of a retried slot is claimed once. A
    lock granted for a row that cannot be taken over is given back in the same statement.
    """
    return f"""
        WITH p AS MATERIALIZED (
            SELECT EXISTS (SELECT 1 FROM {table.control}
                           WHERE job = $2 AND paused_at IS NOT NULL) AS paused
        ), l AS MATERIALIZED (
            SELECT p.paused,
                   CASE WHEN p.paused THEN false ELSE pg_try_advisory_lock($1::bigint) END AS got
            FROM p
        ), up AS (
            INSERT INTO {table.runs} AS r (job, slot, host, pid, session, attempt)
            SELECT $2::text, $3::timestamptz, $4::text, $5::integer, pg_backend_pid(),
                   $6::smallint
            FROM l WHERE l.got
            ON CONFLICT (job, slot) DO UPDATE
            SET host = EXCLUDED.host, pid = EXCLUDED.pid, session = EXCLUDED.session,
                started_at = clock_timestamp(), finished_at = NULL, outcome = NULL,
                error = NULL, attempt = $6::smallint
            WHERE {TAKEN_OVER.format(attempt="$6::smallint")}
            RETURNING r.started_at
        ), c AS MATERIALIZED (
            SELECT l.paused, l.got, (SELECT started_at FROM up) AS started_at FROM l
        )
        SELECT false AS ran, c.paused, c.got, c.started_at,
               CASE WHEN c.got AND c.started_at IS NULL
                    THEN pg_advisory_unlock($1::bigint) END AS undone
        FROM c"""


class CrashWatch:
    """One locker's part in crash detection: the check, who to tell, what to rerun."""

    __slots__ = (
        "_args",
        "_callbacks",
        "_host",
        "_pid",
        "_recoverable",
        "_runs",
        "_sql",
        "marked",
        "rerun",
    )

    def __init__(
        self, sql: str, host: str, args: tuple[object, ...] = (), *, runs: str = ""
    ) -> None:
        # The mode's check (session gone, or lease expired: Exclusion.crashed_sql) and the
        # arguments it takes after host and pid; *runs* names the table in what it logs.
        self._sql = sql
        self._runs = runs
        self._args = args
        self._host = host
        self._pid = os.getpid()
        self._callbacks: list[CrashCallback] = []
        self._recoverable: dict[tuple[str, datetime], int] = {}  # the attempt to claim
        self.marked = 0
        """Rows this locker marked ``crashed``."""
        self.rerun = 0
        """Of those, how many a callback said it would run again."""

    @classmethod
    def of(cls, exclusion: Any, host: str) -> CrashWatch | None:
        """The watch of a locker whose exclusion (:class:`._exclusion.Exclusion`) is
        *exclusion*: its mode's check; ``None`` without a ledger (nothing to check)."""
        if exclusion is None:
            return None
        table = exclusion.table
        runs = "" if table is None else table.runs
        return cls(exclusion.crashed_sql, host, exclusion.holder_args, runs=runs)

    def on_crashed(self, callback: CrashCallback) -> None:
        """Tell *callback* of each row marked from now on (once, however often added)."""
        if callback not in self._callbacks:
            self._callbacks.append(callback)

    def take(self, job: str, slot: datetime) -> int:
        """The attempt *slot* of *job* is to be claimed as, by taking its row over (a rerun
        or a retry), and forgets it (one claim); 0: a plain claim."""
        if not self._recoverable:  # the usual case, asked once per claim
            return 0
        return self._recoverable.pop((job, slot), 0)

    def retry(self, job: str, slot: datetime, attempt: int) -> None:
        """The next claim of *slot* of *job* takes its failed row over as *attempt*."""
        self._remember(job, slot, attempt)

    def _remember(self, job: str, slot: datetime, attempt: int) -> None:
        self._recoverable[job, slot] = attempt
        if len(self._recoverable) > _REMEMBER:
            del self._recoverable[next(iter(self._recoverable))]

    async def check(self, session: LockSession, conn: Any, generation: int) -> int:
        """Mark crashed runs on *session* and report each; return how many were marked."""
        rows = await session.run(
            conn,
            generation,
            lambda c: c.fetch(self._sql, self._host, self._pid, *self._args),
            what="checking for crashed runs",
            keep_on_server_error=True,
        )
        for row in rows:
            record = decode_run(row, table=self._runs, job=row["job"])
            if record is not None:  # marked, but a row no callback could use (._decode)
                self._report(row["job"], record)
        return len(rows)

    def lost(self, job: str, record: RunRecord) -> None:
        """This replica's run *record* of *job* (first attempt) was cut off because its lock
        was lost, and its outcome is now in the ledger: report it as a crash (a callback may
        rerun the slot, taking the ``lock_lost`` row over)."""
        self._report(job, record, marked=False)

    def _report(self, job: str, record: RunRecord, *, marked: bool = True) -> None:
        self.marked += marked
        rerun = False
        for callback in tuple(self._callbacks):
            try:
                rerun = bool(callback(job, record)) or rerun
            except Exception:
                _logger.exception(
                    "crash callback %r failed on job %r", callback, job, extra=at(job)
                )
        if rerun:
            self.rerun += 1
            self._remember(job, record.slot, 2)
        _logger.warning(
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
