"""Reading the fleet from the run ledger: every job's last runs, lock holders, run pages.

What the ``status`` and ``history`` verbs print and what the web dashboard shows come from
here, so the command line and the page never disagree. Read-only: nothing here writes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from ..._keys import job_lock_key, keyed_lock_key, ledger_lock_key
from ..._records import RunRecord
from .._locker.keys import SECRET_NAME
from .._sql.control import paused_sql
from .._sql.definitions import conflicted_sql
from .._sql.fleet import (
    ABSENT_AFTER,
    HOLDERS_SQL,
    SERVER_CLOCK_SQL,
    jobs_sql,
    named_jobs_sql,
)
from .._sql.leases import lease_holders_sql
from .._sql.runs import (
    decode_history,
    decode_run,
    history_sql,
    last_runs_many_sql,
    report_odd,
    runs_page_sql,
)
from .._sql.schema import READABLE_TABLE_SQL, TABLES_EXIST_SQL
from .._sql.tables import LedgerTable
from .._sql.upkeep import read_secret_sql
from .rejected import read_rejected
from .slots import next_slot_of

__all__ = (
    "ABSENT_AFTER",
    "READ_BATCH",
    "STATUSES",
    "FleetJob",
    "LockHolder",
    "Status",
    "absent",
    "due_slot",
    "held_locks",
    "job_status",
    "overdue_slot",
    "read_conflicts",
    "read_holders",
    "read_jobs",
    "read_paused",
    "read_runs",
    "server_now",
    "status_of",
)


@dataclass(frozen=True, slots=True)
class LockHolder:
    """A server session holding a job's advisory lock right now, or (lease mode) the
    replica holding its unexpired lease."""

    pid: int
    """The holder's backend pid."""
    application: str
    """Its ``application_name`` (cronlock sets one naming the replica), or ``""``."""
    address: str | None
    """Its client address, ``None`` over a Unix socket."""

    def describe(self) -> str:
        """``pid 123 app 10.0.0.5``: one line for a table cell."""
        where = f" {self.address}" if self.address else ""
        return f"pid {self.pid} {self.application or '?'}{where}"


@dataclass(frozen=True, slots=True)
class FleetJob:
    """One job as the ledger knows it: its schedule note and its latest runs fleet-wide."""

    name: str
    schedule: str | None
    """The schedule as a replica noted it (``str(schedule)``), ``None`` if none did."""
    next_run: datetime | None
    """The next slot a replica noted, ``None`` if unknown or none is left."""
    noted_at: datetime | None
    """When a replica last wrote the note."""
    last_run: RunRecord | None
    """The latest finished run, whatever its outcome."""
    last_success: RunRecord | None
    last_failure: RunRecord | None
    """The latest run that did not succeed (unfinished ones included)."""
    holders: tuple[LockHolder, ...]
    """Who holds the job's lock right now (empty when nobody runs it)."""
    grace: float | None = None
    """Seconds a slot may stay without a success before the job is overdue, as its replicas
    noted it (the largest, when they give different ones: see ``_sql/upkeep.note_sql``);
    ``None`` when they did not (an older cronlock, or the job is paused)."""
    due: datetime | None = None
    """The slot its replicas said it is due by: its first slot after its latest success."""
    tags: tuple[str, ...] = ()
    """Its tags as its replicas noted them, sorted (empty: none, or an older cronlock's note)."""
    conflict: bool = False
    """Whether live replicas gave it different definitions (:func:`read_conflicts`)."""
    rejected: bool = False
    """A stored schedule every live replica rejected (``_ops/rejected.py``): none runs it."""
    spec: str | None = None
    """How its slots are rebuilt, as its replicas noted (JSON text; ``None``: they did not)."""

    def overdue_since(self, now: datetime) -> datetime | None:
        """The late slot when the job is overdue at *now* (server time), else ``None``.

        The rule of ``status --check`` (:func:`overdue_slot`): the slot the job should have
        run by now, from its note and its runs alone, fell due more than its grace ago and
        no run of it or of a later slot succeeded since, whether its replicas are up or
        gone. A job whose replicas never said is not judged.
        """
        ok = self.last_success
        success = None if ok is None else ok.slot
        return overdue_slot(self.grace, self.due, self.next_run, success, now, self.spec)

    def absent(self, now: datetime) -> bool:
        """Whether no live replica runs the job at *now* (server time): :func:`absent`."""
        return absent(self.next_run, now)

    @property
    def failing(self) -> bool:
        """Its latest finished run did not succeed."""
        return self.last_run is not None and self.last_run.outcome != "succeeded"


Status = Literal[
    "paused", "conflict", "rejected", "absent", "overdue", "failing", "running", "ok", "new"
]
"""A job at a glance, in this order of precedence: paused fleet-wide; two live definitions
(schedules or functions) under its name in one ledger; a stored schedule
every live replica rejected (its task is nowhere, its kwargs do not fit); absent (no live
replica runs it: the fleet is gone, or a deploy removed it); overdue (a slot fell due past
its grace and nothing at or after it succeeded); its latest run failed; a replica holds its
lock now; its latest run succeeded; it never ran."""

STATUSES: tuple[Status, ...] = get_args(Status)
"""Every :data:`Status`, in order of precedence (what ``status --state`` accepts)."""


def job_status(job: FleetJob, now: datetime, *, paused: bool) -> Status:
    """*job*'s :data:`Status` at *now* (server time), *paused* fleet-wide or not.

    The one rule for the dashboard's badge and the ``status`` verb's STATE column.
    """
    last = job.last_run
    return status_of(
        paused=paused,
        overdue=job.overdue_since(now) is not None,
        last_outcome=None if last is None else last.outcome,
        held=bool(job.holders),
        absent=job.absent(now),
        conflict=job.conflict,
        rejected=job.rejected,
    )


def due_slot(
    due: datetime | None,
    next_run: datetime | None,
    success: datetime | None,
    following: Callable[[datetime], datetime | None] | None = None,
) -> datetime | None:
    """The slot a job should have run by, from its note alone (*due*: the first slot after
    its latest success, as its replicas last said; *next_run*: the next slot they noted)
    and the slot of its latest success (*success*): *due* while nothing at or after it
    succeeded; else the noted next slot, while nothing at or after that one succeeded (a
    note written before the success it was due by: so a fleet that is gone, whose note
    no replica will write again, is judged by the slots it left); else ``None`` (a run
    after the note: a live replica writes the next one within seconds), unless the job's
    slots can be rebuilt (*following*, from its ``spec``): then the slot after that
    success, so that a fleet killed between a run and its next note is judged by the slot
    it should have run next. ``None`` too when the replicas said nothing is due (*due*
    ``None``: paused, finished)."""
    if due is None:
        return None
    if success is None or success < due:
        return due
    if next_run is not None and success < next_run:
        return next_run
    return None if following is None else following(success)


def overdue_slot(
    grace: float | None,
    due: datetime | None,
    next_run: datetime | None,
    success: datetime | None,
    now: datetime,
    spec: str | None = None,
) -> datetime | None:
    """The rule of :meth:`FleetJob.overdue_since`, over its facts: the slot the job
    should have run by (:func:`due_slot`) when it fell due more than *grace* seconds
    before *now*, else ``None``."""
    if grace is None:
        return None
    slot = due_slot(due, next_run, success, next_slot_of(spec))
    if slot is None:
        return None
    return slot if (now - slot).total_seconds() > grace else None


def absent(next_run: datetime | None, now: datetime) -> bool:
    """The rule of :meth:`FleetJob.absent`: the job's noted next slot passed more than
    :data:`ABSENT_AFTER` seconds before *now* and no replica noted a later one, so none
    fired it (a deploy removed the job, or every replica that has it is gone: stopped,
    killed, scaled to zero). A job with no next slot (finished, or only ever run by hand)
    never is."""
    return next_run is not None and (now - next_run).total_seconds() > ABSENT_AFTER


def status_of(
    *,
    paused: bool,
    overdue: bool,
    last_outcome: str | None,
    held: bool,
    absent: bool = False,
    rejected: bool = False,
    conflict: bool = False,
) -> Status:
    """The rule of :func:`job_status`, over a job's facts: *paused* fleet-wide, in
    *conflict* (two definitions under its name), *rejected*
    by every live replica (a stored schedule), *absent* (:func:`absent`), *overdue*
    (:func:`overdue_slot`), the outcome of its latest finished run (``None``: none; a run
    without an outcome is not a success), and whether anyone *held* its lock. The fleet's
    summary (:mod:`._roster`) judges every job with it, the job's own row with
    :func:`job_status`: one rule."""
    if paused:
        return "paused"
    if conflict:
        return "conflict"
    if rejected:
        return "rejected"
    if absent:
        return "absent"
    if overdue:
        return "overdue"
    if last_outcome is not None and last_outcome != "succeeded":
        return "failing"
    if held:
        return "running"
    return "ok" if last_outcome is not None else "new"


_KEYS_KEPT = 200_000  # names whose keys are kept (a dashboard asks for the same every refresh)
# Per (runs table, keyed secret): the names whose keys are known, and each key's name.
# FNV-1a or an HMAC in Python costs microseconds a key: computed once per name, not on
# every refresh of a list of thousands.
_NAMED: dict[tuple[str | None, bytes | None], tuple[set[str], dict[int, str]]] = {}


def _names_by_key(runs: str | None, secret: bytes | None, names: set[str]) -> dict[int, str]:
    """Each lock key of *names* (bare; namespaced by the ledger's *runs* table; keyed by
    *secret*) and its name, with those of names asked before (the caller keeps its own)."""
    known, by_key = _NAMED.setdefault((runs, secret), (set(), {}))
    if len(known) >= _KEYS_KEPT:
        known.clear()
        by_key.clear()
    for name in names.difference(known):
        known.add(name)
        by_key[job_lock_key(name)] = name
        if runs is not None:
            by_key[ledger_lock_key(runs, name)] = name
        if secret is not None:
            by_key[keyed_lock_key(secret, name)] = name
    return by_key


async def read_holders(
    conn: Any, names: Sequence[str], table: LedgerTable | None = None
) -> dict[str, tuple[LockHolder, ...]]:
    """Who holds each job's lock now (:func:`held_locks`), every one of *names* a key."""
    held = await held_locks(conn, names, table)
    return {name: held.get(name, ()) for name in names}


async def held_locks(
    conn: Any, names: Sequence[str], table: LedgerTable | None = None
) -> dict[str, tuple[LockHolder, ...]]:
    """Who holds the lock of each of *names* held now: one query over ``pg_locks``, however
    many *names* (two to four more with *table*: which of its secrets and leases tables
    there are, its secret, its leases).

    Every key of a job is looked up: the bare one (``locked_run``, ``bare_keys=True``) and,
    given the ledger *table*, its namespaced one and, once a replica made the ledger's
    secret, its keyed one (``lock_keys="keyed"``). With *table*, the holders of unexpired
    leases (lease mode) are included too: their *pid* is the replica's process id, their
    *application* the lease's holder, their address unknown.
    """
    runs = None if table is None else table.runs  # quoted once: it namespaces the keys
    secret: bytes | None = None
    secrets = leases = False
    if table is not None:
        secrets, leases = await conn.fetchrow(READABLE_TABLE_SQL, table.secrets, table.leases)
    # lock_keys="keyed": once a replica made the ledger's secret, for a role that may read it
    # (a reader may not: the secrets table holds the dashboard's CSRF key too).
    if table is not None and secrets:
        value = await conn.fetchval(read_secret_sql(table), SECRET_NAME)
        secret = None if value is None else bytes(value)
    wanted = set(names)
    by_key = _names_by_key(runs, secret, wanted)
    found: dict[str, list[LockHolder]] = {}
    for row in await conn.fetch(HOLDERS_SQL):
        name = by_key.get(row["key"])
        if name is not None and name in wanted:
            holder = LockHolder(row["pid"], row["application_name"] or "", row["addr"])
            found.setdefault(name, []).append(holder)
    if table is not None and leases:
        for row in await conn.fetch(lease_holders_sql(table)):
            if row["job"] in wanted:
                holder = LockHolder(row["pid"] or 0, row["holder"], None)
                found.setdefault(row["job"], []).append(holder)
    return {name: tuple(holders) for name, holders in found.items()}


READ_BATCH = 5000
"""Jobs per statement of the latest-runs read of :func:`read_jobs`."""


async def read_jobs(
    conn: Any,
    table: LedgerTable,
    only: Sequence[str] | None = None,
    *,
    holders: Mapping[str, tuple[LockHolder, ...]] | None = None,
    conflicts: frozenset[str] | None = None,
    rejected: Collection[str] | None = None,
) -> list[FleetJob]:
    """Every job the ledger knows (a replica noted its schedule or claimed a slot of it, or
    it is a stored schedule every live replica rejected), in name order; with *only*, those
    of them that exist, in the order given.

    A bounded number of statements, however many jobs: one for the jobs, two for their
    conflicts (:func:`read_conflicts`), two to five for the lock holders, one per
    :data:`READ_BATCH` jobs for their latest runs (three index probes a job on the primary
    key), two for the stored schedules rejected everywhere. With *only*, the jobs read are
    those only; with *holders* (:func:`read_holders` of them, read already), the lock
    holders are not read; with *conflicts* (:func:`read_conflicts`, read already), nor are
    the jobs in conflict; with *rejected* (the names of ``_ops/rejected.read_rejected``,
    read already), nor are those.
    """
    if rejected is None:
        rejected = (await read_rejected(conn, table)).keys()
    if only is None:
        rows = await conn.fetch(jobs_sql(table))
        # A stored schedule no replica ever noted (none has its task) is a job all the same.
        unnoted = set(rejected).difference(row["job"] for row in rows)
        if unnoted:
            rows = sorted([*rows, *map(_unnoted, unnoted)], key=lambda row: row["job"])
    else:
        known = {row["job"]: row for row in await conn.fetch(named_jobs_sql(table), list(only))}
        for name in set(only).intersection(rejected).difference(known):
            known[name] = _unnoted(name)
        rows = [known[name] for name in dict.fromkeys(only) if name in known]
    names = [row["job"] for row in rows]
    if conflicts is None:
        conflicts = await read_conflicts(conn, table, None if only is None else names)
    if holders is None:
        holders = await read_holders(conn, names, table)
    latest: dict[tuple[str, str], RunRecord | None] = {}
    sql, runs = last_runs_many_sql(table), table.runs
    for start in range(0, len(names), READ_BATCH):
        for r in await conn.fetch(sql, names[start : start + READ_BATCH]):
            latest[r["job"], r["kind"]] = decode_run(r, table=runs, job=r["job"])
    jobs = []
    for row in rows:
        if row["odd"] is not None:  # its odd times read as unknown (._decode)
            report_odd(table.jobs, row["job"], row["odd"], kept=True)
        name = row["job"]
        last = {kind: latest.get((name, kind)) for kind in ("last", "ok", "failed")}
        jobs.append(
            FleetJob(
                name=row["job"],
                schedule=row["schedule"],
                next_run=row["next_run"],
                noted_at=row["updated_at"],
                last_run=last.get("last"),
                last_success=last.get("ok"),
                last_failure=last.get("failed"),
                holders=holders.get(row["job"], ()),
                grace=row["grace"],
                due=row["due"],
                tags=tuple(row["tags"] or ()),
                conflict=name in conflicts,
                rejected=name in rejected,
                spec=row["spec"],
            )
        )
    return jobs


def _unnoted(name: str) -> dict[str, Any]:
    """The row of :func:`.._sql.fleet.jobs_sql` of a job without a note or a run."""
    columns = ("schedule", "next_run", "updated_at", "grace", "due", "tags", "odd", "spec")
    return dict.fromkeys(columns) | {"job": name}


async def read_runs(
    conn: Any, table: LedgerTable, job: str, limit: int, before: datetime | None = None
) -> list[RunRecord]:
    """The latest *limit* runs of *job*, newest first, one per slot with its earlier
    attempts (``RunRecord.attempts``); with *before*, those of earlier slots only (the next
    page: pass the oldest slot of the previous one)."""
    if before is None:
        rows = await conn.fetch(history_sql(table), job, limit)
    else:
        rows = await conn.fetch(runs_page_sql(table), job, limit, before)
    decoded = (decode_history(row, table=table.runs, job=job) for row in rows)
    return [record for record in decoded if record is not None]


async def server_now(conn: Any) -> datetime:
    """The database server's clock: the fleet's shared time, which overdue is judged by."""
    now: datetime = await conn.fetchval(SERVER_CLOCK_SQL)
    return now


async def read_conflicts(
    conn: Any, table: LedgerTable, only: Sequence[str] | None = None
) -> frozenset[str]:
    """The jobs (of *only*, when given) to which live replicas of the ledger give different
    definitions, another function or schedule (``_sql/definitions.py``): two services on
    one ledger, or a rolling deploy that changed the job, while old and new replicas
    overlap. Two statements (whether the tables exist: an older ledger has none)."""
    if only is not None and not only:
        return frozenset()
    members, definitions = await conn.fetchrow(TABLES_EXIST_SQL, table.members, table.definitions)
    if not (members and definitions):
        return frozenset()
    if only is None:
        rows = await conn.fetch(conflicted_sql(table))
    else:
        rows = await conn.fetch(conflicted_sql(table, named=True), list(only))
    return frozenset(row["job"] for row in rows)


async def read_paused(conn: Any, table: LedgerTable) -> frozenset[str]:
    """The jobs paused fleet-wide (:class:`~cronlock.postgres.FleetControl`)."""
    return frozenset(row["job"] for row in await conn.fetch(paused_sql(table)))
