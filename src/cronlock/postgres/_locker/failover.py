"""A new primary: noticed, and what a failover lost of this replica's runs written back.

A standby promoted after a crash has what it had received. With asynchronous replication
(and a standby that lagged) the last claims the old primary acknowledged can be missing on
it: another replica would then claim and run again a slot this one ran (a catch-up, a
slot owed across the outage, a retry), and ``status`` would not show the run at all. So
each new connection says which server it reached (``_conn/primary.server_of``: system
identifier and timeline); a locker that finds another server than before:

1. logs one WARNING naming both;
2. **writes back** what it remembers of its recent runs, its last ``remember`` claims of
   each job with their outcomes (:func:`.._sql.failover.reassert_sql`): a slot the new
   primary lacks gets this replica's row again (a claim the failover lost: a WARNING, and
   the scheduler's :class:`cronlock.RunRestored`), an unfinished row of its own its outcome;
   a row another replica holds for a slot this one ran is a slot run twice (an ERROR, and
   :class:`cronlock.SlotRanTwice`);
3. in lease mode, releases its leases whose release was lost, and takes back those of its
   runs in flight (:meth:`.._modes.base.Exclusion.after_failover`), so a live replica never
   holds a job off until a lease expires (it does this at every reconnect, to the same
   server too: a cut connection loses releases as well);
4. claims no slot due before the change for :data:`SETTLE` seconds (``LockUnavailable``:
   the run loop claims it again every half second while its grace lasts), so that every
   live replica has reconnected and written back its runs before one of them is run again.
   Slots due after the change are claimed at once.

A locker that lost a connection reconnects at once (every half second, within its
backoff), not at its next claim: a replica whose next slot is hours away still writes back
within :data:`SETTLE`. The first server a locker sees is only noted; a server that will
not say which it is (a role without access to the functions) leaves failovers unnoticed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..._cancel import cancel_and_wait, task_name
from ..._clock import SystemClock, monotonic
from ..._errors import LockError
from ..._locking.protocols import FailoverCallback, remember_claim
from ..._logs import at, get_logger
from .._conn import Channel
from .._conn.primary import Server
from .._modes.base import Exclusion, Statement
from .._sql.failover import SERVER_SQL

if TYPE_CHECKING:
    from ..._records import RunRecord

__all__ = ("SETTLE", "NewPrimary")

_logger = get_logger("cronlock.postgres")

SETTLE = 8.0
"""Seconds after a new primary is noticed during which slots due before it are not
claimed: a reconnect's longest backoff (5 s), a reconnect attempt's period and a margin,
time for every live replica to write back what the failover lost of its runs."""
_now = SystemClock.now
"""Wall time, for the rows written back and the change (the locker has no Clock)."""
_BATCH = 1000
"""Runs written back per statement."""
_PROBE_EVERY = 0.5
"""Seconds between two attempts at reconnecting after a lost connection (each refused at
once, without a connect, while the channel's backoff lasts)."""
_TRIES = 5
"""Attempts at writing back, a second apart, before giving up (said at ERROR)."""


@dataclass(slots=True)
class _Ran:
    attempt: int
    started: datetime
    finished: datetime | None = None
    outcome: str | None = None
    error: str | None = None


class NewPrimary:
    """One locker's watch for a new primary (see the module).

    *shards* are the locker's channels (the writing back goes on the first); *in_flight*
    gives its runs in flight as (job, slot, attempt). *sql* is the ledger's
    :func:`.._sql.failover.reassert_sql` (``None``: no ledger, nothing to write back; a
    new primary is still said). *remember* bounds the runs kept per job; *keep* is the
    ledger's retention (seconds after its slot a run's row may be pruned): an older run is
    not written back (its row was pruned, not lost).
    """

    def __init__(
        self,
        *,
        shards: Sequence[Channel],
        exclusion: Exclusion,
        sql: str | None,
        host: str,
        holder: str,
        remember: int,
        keep: float = float("inf"),
        in_flight: Callable[[], Sequence[tuple[str, datetime, int]]],
    ) -> None:
        self._shards = shards
        self._exclusion = exclusion
        self._sql = sql
        self._host, self._pid, self._holder = host, os.getpid(), holder
        self._remember = remember
        self._keep = keep
        self._in_flight = in_flight
        self._runs: dict[str, dict[datetime, _Ran]] = {}
        self._server: Server | None = None
        self._changed_at: datetime | None = None  # wall time the change was noticed
        self._settled_at = float("-inf")  # monotonic time slots before it may be claimed
        self._task: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._fixing: asyncio.Task[None] | None = None
        self._reconnects = False  # a connection was had before: the next is a reconnect
        self._closed = False
        self._callbacks: list[FailoverCallback] = []
        self.failovers = 0
        """New primaries noticed."""
        self.restarts = 0
        """Restarts of the same server noticed (its postmaster started again)."""
        self.restored = 0
        """Runs written back (claims and outcomes a failover lost)."""
        self.twice = 0
        """Slots found run by another replica too."""

    def on_failover(self, callback: FailoverCallback) -> None:
        """Call *callback* ``(job, slot, other)`` for each run written back (*other*
        ``None``) and each slot another replica ran too (*other* names it)."""
        self._callbacks.append(callback)

    # -- what the locker tells ---------------------------------------------------------

    def claimed(self, job: str, slot: datetime, attempt: int) -> None:
        """*slot* of *job* was claimed here (for *attempt*)."""
        runs = self._runs.setdefault(job, {})
        remember_claim(runs, slot, _Ran(attempt, _now()), remember=self._remember)

    def ended(self, job: str, slot: datetime, record: RunRecord | None) -> None:
        """The run of *slot* of *job* ended (*record*: its outcome, if it had one)."""
        ran = self._runs.get(job, {}).get(slot)
        if ran is None:
            return
        ran.finished = _now()
        if record is not None:
            ran.outcome, ran.error = record.outcome, record.error

    def settling(self, slot: datetime) -> float | None:
        """Seconds to wait before *slot* may be claimed (due before a new primary that
        was noticed less than :data:`SETTLE` s ago), or ``None``: claim it now."""
        changed = self._changed_at
        if changed is None or slot >= changed:
            return None
        left = self._settled_at - monotonic()
        return left if left > 0 else None

    def seen(self, server: Server | None) -> None:
        """A new connection reached *server* (``None``: it would not say)."""
        before = self._server
        if server is not None:
            self._server = server
        if server is not None and before is not None:
            if server.identity != before.identity:
                self._changed(server, before)
                return
            if None not in (server.started, before.started) and server.started != before.started:
                self._restarted(server, before)
                return
        if self._reconnects and (self._fixing is None or self._fixing.done()):
            # A connection came back (the same server, or one that would not say): lease
            # rows whose release the outage cut are put right now, not when they expire.
            self._fixing = asyncio.get_running_loop().create_task(
                self._put_leases_right(), name=task_name("pg-leases")
            )
        self._reconnects = True

    async def _put_leases_right(self) -> None:
        try:
            await self._leases(self._shards[0])
        except LockError as exc:  # they expire by themselves; the next reconnect tries
            _logger.debug("putting the leases right after a reconnect failed: %r", exc)

    def _changed(self, server: Server, before: Server) -> None:
        self.failovers += 1
        self._changed_at = _now()
        self._settled_at = monotonic() + SETTLE
        runs = sum(len(runs) for runs in self._runs.values())
        _logger.warning(
            "connected to a new primary (server %s, was %s: a failover or switchover); "
            "writing back this replica's %d recent run(s) where its ledger lacks them; "
            "slots due before now are claimed again in %.0fs",
            server,
            before,
            runs,
            SETTLE,
        )
        self._start_writing_back("the new primary", "failover")

    def _restarted(self, server: Server, before: Server) -> None:
        """The same server, restarted: a crash recovers what it committed, but a snapshot
        restored under the same identity (or a crash with commits not yet flushed) lost the
        last claims and outcomes, and nothing else would tell. So the recent runs are written
        back as after a failover; slots due before are not held back (a restart loses
        nothing, as a rule: they are claimed at once, and a slot run twice is said)."""
        self.restarts += 1
        _logger.info(
            "the server restarted (started %s, was %s); writing back this replica's recent "
            "run(s) where its ledger lacks them (a restored snapshot loses the last ones)",
            server.started,
            before.started,
        )
        self._start_writing_back("the restarted server", "restart")

    def _start_writing_back(self, where: str, what: str) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._write_back(where, what), name=task_name("pg-failover")
            )

    def dropped(self) -> None:
        """A connection was lost: reconnect as soon as the server can be reached, and not
        only at the next claim, so that a replica with no slot due for hours still writes
        back its runs within :data:`SETTLE` of a new primary (a claim, renewal or beat
        would find it later than that)."""
        if self._sql is None or self._closed:
            return
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(
                self._reconnect(), name=task_name("pg-reconnect")
            )

    async def _reconnect(self) -> None:
        shard = self._shards[0]
        while not self._closed:
            await asyncio.sleep(_PROBE_EVERY)
            try:
                await self._run(shard, Statement(SERVER_SQL, ()), "reconnecting")
                return
            except LockError as exc:  # down still: the channel logs outages, and backs off
                _logger.debug("reconnecting after a lost connection: %r", exc)

    async def close(self) -> None:
        """Stop writing back and reconnecting (at the locker's close)."""
        self._closed = True
        for task in (self._task, self._probe, self._fixing):
            if task is not None and task is not asyncio.current_task():
                await cancel_and_wait(task)
        self._task = self._probe = self._fixing = None

    # -- writing back --------------------------------------------------------------------

    async def _write_back(self, where: str, what: str) -> None:
        for attempt in range(1, _TRIES + 1):
            try:
                await self._send(where, what)
                return
            except LockError as exc:
                if attempt == _TRIES:
                    _logger.error(
                        "could not write back this replica's recent runs on %s (%s); a "
                        "slot whose claim the %s lost may run again",
                        where,
                        exc,
                        what,
                    )
                    return
                _logger.debug("writing back recent runs failed (%r); again in 1s", exc)
                await asyncio.sleep(1.0)

    async def _leases(self, shard: Channel) -> None:
        """Lease mode: release this replica's leases of the runs that ended here (their
        release may have been lost) and take back those of its runs in flight; else
        nothing."""
        ended = [
            (job, slot, ran.attempt)
            for job, runs in self._runs.items()
            for slot, ran in runs.items()
            if ran.finished is not None
        ]
        leases = self._exclusion.after_failover(list(self._in_flight()), ended)
        if leases is None:
            return
        row = await self._run(shard, leases, "putting the leases right")
        if row and row[0]["released"]:
            _logger.info(
                "released %d lease(s) of this replica whose release the outage lost",
                row[0]["released"],
            )

    async def _send(self, where: str, what: str) -> None:
        shard = self._shards[0]
        await self._leases(shard)
        if self._sql is None:
            return
        pruned = _now() - timedelta(seconds=self._keep) if self._keep < 1e9 else None
        items = [
            (job, slot, ran)
            for job, runs in self._runs.items()
            for slot, ran in runs.items()
            if pruned is None or slot >= pruned
        ]
        restored: list[tuple[str, datetime]] = []
        for start in range(0, len(items), _BATCH):
            batch = items[start : start + _BATCH]
            statement_args = (
                [job for job, _, _ in batch],
                [slot for _, slot, _ in batch],
                [ran.attempt for _, _, ran in batch],
                [ran.started for _, _, ran in batch],
                [ran.finished for _, _, ran in batch],
                [ran.outcome for _, _, ran in batch],
                [ran.error for _, _, ran in batch],
                self._host,
                self._pid,
                self._holder,
            )
            rows = await self._run(
                shard, Statement(self._sql, statement_args), "writing back recent runs"
            )
            for row in rows:
                job, slot, _ = batch[row["i"] - 1]
                if row["other"] is not None:
                    self._twice(job, slot, row["other"])
                elif row["restored"] or row["finished"]:
                    restored.append((job, slot))
        if restored:
            self.restored += len(restored)
            shown = ", ".join(f"{job}@{slot.isoformat()}" for job, slot in restored[:5])
            more = f" and {len(restored) - 5} more" if len(restored) > 5 else ""
            _logger.warning(
                "%s lacked %d run(s) of this replica (claims or outcomes the %s lost), "
                "written back: %s%s",
                where[0].upper() + where[1:],
                len(restored),
                what,
                shown,
                more,
            )
            for job, slot in restored:
                self._tell(job, slot, None)

    def _twice(self, job: str, slot: datetime, other: str) -> None:
        self.twice += 1
        _logger.error(
            "job %r slot %s ran twice: here and on %s, which claimed it on the new primary "
            "after the failover lost this replica's claim",
            job,
            slot.isoformat(),
            other,
            extra=at(job, slot),
        )
        self._tell(job, slot, other)

    def _tell(self, job: str, slot: datetime, other: str | None) -> None:
        for callback in self._callbacks:
            try:
                callback(job, slot, other)
            except Exception:
                _logger.exception("a failover callback failed")

    async def _run(self, shard: Channel, statement: Statement, what: str) -> list[Any]:
        conn, generation = await shard.ensure()
        return await shard.run(
            conn,
            generation,
            lambda c: c.fetch(statement.sql, *statement.args),
            what=what,
            keep_on_server_error=True,
        )
