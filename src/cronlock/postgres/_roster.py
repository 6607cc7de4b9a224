"""The fleet at a glance: every job the ledger knows, its tags and its status, in one read.

What the dashboard's summary, filter and ordering need of each of thousands of jobs, and
no more: the facts :func:`._fleet.status_of` judges (its overdue grace and due slot, the
outcome of its latest finished run, the slot of its latest success), read in one
statement of index probes (a few a job, on the runs' primary key), and the lock holders
in one more (:func:`._fleet.read_holders`). The runs of a page of jobs are then read in
full by :func:`._fleet.read_jobs`, for those jobs only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from ._decode import sane, slot_in_range
from ._fleet import LockHolder, Status, overdue_slot, read_holders, status_of
from ._ledger import LedgerTable

__all__ = ("RosterJob", "read_roster", "roster_sql")


@dataclass(frozen=True, slots=True)
class RosterJob:
    """One job of the fleet at a glance."""

    name: str
    tags: tuple[str, ...]
    """Its tags, as its replicas noted them (empty: none, or noted by an older cronlock)."""
    status: Status
    holders: tuple[LockHolder, ...] = ()
    """Who holds its lock right now (:func:`._fleet.read_holders`)."""


def _readable(alias: str) -> str:
    """The condition that the run *alias* is one :func:`._decode.decode_run` reads (a run
    with an unreadable instant is skipped there: it is no latest run here either)."""
    return " AND ".join(slot_in_range(f"{alias}.{c}") for c in ("started_at", "finished_at"))


@lru_cache(maxsize=32)
def roster_sql(table: LedgerTable) -> str:
    """Every job with a schedule note or a run, in no order: its name, tags, overdue grace,
    due slot, the outcome of its latest finished run (``''``: none recorded; NULL: no
    readable one) and the slot of its latest success (NULL: none): what
    :meth:`LedgerTable.last_runs_sql` reads as ``'last'`` and ``'ok'``.

    Mostly one probe of the runs' primary key a noted job: the greatest (job, slot) from
    the job up to the next noted one. When it is the job's own and finished, it is the
    latest finished run, and the latest success too when it succeeded (a replica writes
    a success's outcome and end at once); otherwise (running, failed, unreadable) the two
    latest runs are read as ``last_runs_sql`` does. When it is a later job's, the runs
    table has jobs without a note there (a removed stored schedule, ``locked_run`` with a
    slot): they are found one probe each, up to the next note.
    """
    runs, notes = table.runs, table.jobs
    sane_slot = slot_in_range("x.slot")
    readable = _readable("x")

    def latest(alias: str, upper: str) -> str:
        return f"""LEFT JOIN LATERAL (
            SELECT x.job AS top, x.slot, x.outcome, x.started_at, x.finished_at
            FROM {runs} x WHERE x.job >= {alias}.job{upper}
            ORDER BY x.job DESC, x.slot DESC LIMIT 1) p ON true"""

    def after(bound: str, below: str | None = None) -> str:
        upper = "" if below is None else f" AND r.job < {below}"
        return f"(SELECT r.job FROM {runs} r WHERE r.job > {bound}{upper} ORDER BY r.job LIMIT 1)"

    def probe(where: str, value: str) -> str:
        return f"""(SELECT CASE WHEN {readable} THEN {value} END FROM {runs} x
                    WHERE x.job = k.job AND {where} AND {sane_slot}
                    ORDER BY x.slot DESC LIMIT 1)"""

    last = probe("x.finished_at IS NOT NULL", "coalesce(x.outcome, '')")
    success = probe("x.outcome = 'succeeded'", "x.slot")
    own = f"p.top = k.job AND p.finished_at IS NOT NULL AND {slot_in_range('p.slot')}"
    own_readable = _readable("p")
    return f"""
        WITH RECURSIVE noted AS (
            SELECT j.job, j.tags, j.grace, {sane("j.due", "due")},
                   lead(j.job) OVER (ORDER BY j.job) AS below
            FROM {notes} j
        ), probed AS (
            SELECT n.*, p.* FROM noted n {latest("n", " AND x.job < n.below")}
            WHERE n.below IS NOT NULL
            UNION ALL
            SELECT n.*, p.* FROM noted n {latest("n", "")} WHERE n.below IS NULL
        ), unnoted(job, below) AS (
            SELECT {after("n.job", "n.below")}, n.below FROM probed n
            WHERE n.top > n.job AND n.below IS NOT NULL
            UNION ALL
            SELECT {after("n.job")}, NULL FROM probed n WHERE n.top > n.job AND n.below IS NULL
            UNION ALL
            SELECT f.job, m.job FROM (SELECT min(job) AS job FROM noted) m
            CROSS JOIN LATERAL (SELECT r.job FROM {runs} r ORDER BY r.job LIMIT 1) f
            WHERE m.job IS NULL OR f.job < m.job
            UNION ALL
            SELECT CASE WHEN u.below IS NULL THEN {after("u.job")}
                        ELSE {after("u.job", "u.below")} END, u.below
            FROM unnoted u WHERE u.job IS NOT NULL
        ), known AS (
            SELECT k.job, k.tags, k.grace, k.due,
                   CASE WHEN k.top IS NULL OR k.top < k.job THEN NULL
                        WHEN {own.replace("p.", "k.")}
                        THEN CASE WHEN {own_readable.replace("p.", "k.")}
                                  THEN coalesce(k.outcome, '') END
                        ELSE {last} END AS outcome,
                   CASE WHEN k.top IS NULL OR k.top < k.job THEN NULL
                        WHEN {own.replace("p.", "k.")} AND k.outcome = 'succeeded'
                        THEN CASE WHEN {own_readable.replace("p.", "k.")} THEN k.slot END
                        ELSE {success} END AS success
            FROM probed k
            UNION ALL
            SELECT k.job, NULL, NULL, NULL, {last}, {success}
            FROM unnoted k WHERE k.job IS NOT NULL
        )
        SELECT job, tags, grace, due, outcome, success FROM known"""


async def read_roster(
    conn: Any, table: LedgerTable, paused: frozenset[str], now: datetime
) -> list[RosterJob]:
    """Every job the ledger knows, in name order, each judged at *now* (server time) with
    *paused* (the jobs paused fleet-wide): two statements for the facts and the holders of
    every job (three more once the ledger has a secret table and leases), however many.

    Run it with JIT off (``SET LOCAL jit = off``): its plan's estimates are those of
    thousands of index probes, which JIT compiles for longer than they take.
    """
    rows = await conn.fetch(roster_sql(table))
    rows.sort(key=lambda row: row["job"])
    names = [row["job"] for row in rows]
    held = await read_holders(conn, names, table)
    jobs = []
    for name, tags, grace, due, outcome, success in rows:
        overdue = overdue_slot(grace, due, success, now) is not None
        holders = held[name]
        status = status_of(
            paused=name in paused, overdue=overdue, last_outcome=outcome, held=bool(holders)
        )
        jobs.append(RosterJob(name, tuple(tags or ()), status, holders))
    return jobs
