"""The fleet at a glance: every job the ledger knows, its tags and its status, in one read.

What the dashboard's summary, filter and ordering need of each of thousands of jobs, and
no more: the facts :func:`._fleet.status_of` judges (its overdue grace and due slot, the
outcome of its latest finished run, the slot of its latest success). Two statements,
whatever the number of jobs: :func:`roster_sql`, one probe of the runs' primary key a
noted job, which settles most of them, then :func:`asked_sql` for the rest (a job whose
latest run failed, is running or is unreadable, and the jobs that have runs but no
note); and the lock holders (:func:`._fleet.held_locks`). The runs of a page of jobs are
then read in full by :func:`._fleet.read_jobs`, for those jobs only.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from ._decode import HIGH, LOW, sane, slot_in_range
from ._fleet import LockHolder, Status, held_locks, overdue_slot, status_of
from ._ledger import LedgerTable

__all__ = ("RosterJob", "asked_sql", "read_roster", "roster_sql")


class RosterJob(NamedTuple):
    """One job of the fleet at a glance (a tuple: thousands are made on each refresh)."""

    name: str
    tags: tuple[str, ...]
    """Its tags, as its replicas noted them (empty: none, noted by an older cronlock, or not
    asked for: see :func:`read_roster`)."""
    status: Status
    holders: tuple[LockHolder, ...] = ()
    """Who holds its lock right now (:func:`._fleet.held_locks`)."""


def _readable(alias: str) -> str:
    """The condition that the run *alias* is one :func:`._decode.decode_run` reads (a run
    with an unreadable instant is skipped there: it is no latest run here either)."""
    return " AND ".join(
        slot_in_range(f"{alias}.{c}") for c in ("slot", "started_at", "finished_at")
    )


def _probe(runs: str, where: str, value: str) -> str:
    """The latest run of job ``k.job`` with *where* and a slot in range, as *value* (NULL
    when it is unreadable): what :meth:`LedgerTable.last_runs_sql` reads, one probe."""
    return f"""(SELECT CASE WHEN {_readable("x")} THEN {value} END FROM {runs} x
                WHERE x.job = k.job AND {where} AND {slot_in_range("x.slot")}
                ORDER BY x.slot DESC LIMIT 1)"""


def _after(runs: str, bound: str, below: str | None = None) -> str:
    """The runs' first job after *bound* (and before *below*): one probe of the key."""
    upper = "" if below is None else f" AND r.job < {below}"
    return f"(SELECT r.job FROM {runs} r WHERE r.job > {bound}{upper} ORDER BY r.job LIMIT 1)"


@lru_cache(maxsize=32)
def roster_sql(table: LedgerTable, tags: bool = True) -> str:
    """``$1`` now: every noted job, in no order: its name, tags (NULL unless *tags*),
    overdue grace, due slot, whether it is the last noted job (*last*), and the greatest run
    from it up to the next noted job (one probe of the runs' primary key): whether that
    run is its own (*mine*) or a later job's (*gap*: the runs table has jobs without a note
    there, up to *below*, the next noted job), whether it is finished and readable (*done*),
    its outcome (``''``: none recorded) and slot. Its own finished run is its latest
    finished one, and its latest success too when it succeeded (a replica writes a
    success's outcome and end at once); when it did not, the latest success matters only
    to a job that is overdue without one.

    The due slot, and the slot of that run, are read only when the due slot fell due more
    than the grace before ``$1`` (NULL otherwise): else :func:`._fleet.overdue_slot` is
    ``None`` whatever they are, and an instant costs the client more than the probe.
    """
    runs, notes = table.runs, table.jobs
    late = (
        f"j.due BETWEEN {LOW} AND {HIGH} AND extract(epoch FROM $1::timestamptz - j.due) > j.grace"
    )
    return f"""
        SELECT n.job, n.tags, n.grace, CASE WHEN n.late THEN n.due END AS due,
               n.below IS NULL AS last, CASE WHEN p.top > n.job THEN n.below END AS below,
               p.top = n.job AS mine, p.top > n.job AS gap, p.done, p.outcome,
               CASE WHEN n.late THEN p.slot END AS slot
        FROM (SELECT j.job, {"j.tags" if tags else "NULL::text[] AS tags"}, j.grace, j.due,
                     coalesce({late}, false) AS late,
                     lead(j.job) OVER (ORDER BY j.job) AS below
              FROM {notes} j) n
        LEFT JOIN LATERAL (
            SELECT x.job AS top, coalesce(x.outcome, '') AS outcome, {sane("x.slot", "slot")},
                   x.finished_at IS NOT NULL AND {_readable("x")} AS done
            FROM {runs} x WHERE x.job >= n.job AND x.job < n.below
            ORDER BY x.job DESC, x.slot DESC LIMIT 1) p ON true"""


@lru_cache(maxsize=32)
def asked_sql(table: LedgerTable) -> str:
    """Array ``$1`` jobs; arrays ``$2`` and ``$3``, bounds (NULL: the start, the end): for
    each job of ``$1`` and each job of the runs table strictly between two bounds or
    before the first noted job, its
    name, whether it is one of ``$1``, the outcome of its latest finished run (``''``:
    none recorded; NULL: none readable) and the slot of its latest success (NULL: none),
    as :meth:`LedgerTable.last_runs_sql` reads them ('last' and 'ok'). One probe of the
    key a job between the bounds, two a job for its runs."""
    runs, notes = table.runs, table.jobs
    first = f"""CASE WHEN g.after IS NULL AND g.below IS NULL
                     THEN (SELECT r.job FROM {runs} r ORDER BY r.job LIMIT 1)
                     WHEN g.after IS NULL
                     THEN (SELECT r.job FROM {runs} r WHERE r.job < g.below ORDER BY r.job LIMIT 1)
                     WHEN g.below IS NULL THEN {_after(runs, "g.after")}
                     ELSE {_after(runs, "g.after", "g.below")} END"""
    last = _probe(runs, "x.finished_at IS NOT NULL", "coalesce(x.outcome, '')")
    success = _probe(runs, "x.outcome = 'succeeded'", "x.slot")
    return f"""
        WITH RECURSIVE found(job, below) AS (
            SELECT {first}, g.below FROM unnest($2::text[], $3::text[]) AS g(after, below)
            UNION ALL
            SELECT f.job, m.job FROM (SELECT min(job) AS job FROM {notes}) m
            CROSS JOIN LATERAL (SELECT r.job FROM {runs} r ORDER BY r.job LIMIT 1) f
            WHERE f.job < m.job
            UNION ALL
            SELECT CASE WHEN u.below IS NULL THEN {_after(runs, "u.job")}
                        ELSE {_after(runs, "u.job", "u.below")} END, u.below
            FROM found u WHERE u.job IS NOT NULL
        ), asked(job, noted) AS (
            SELECT job, true FROM unnest($1::text[]) AS a(job)
            UNION ALL
            SELECT job, false FROM found WHERE job IS NOT NULL
        )
        SELECT k.job, k.noted, {last} AS outcome, {success} AS success FROM asked k"""


async def read_roster(
    conn: Any, table: LedgerTable, paused: frozenset[str], now: datetime, *, tags: bool = True
) -> list[RosterJob]:
    """Every job the ledger knows, in no order, each judged at *now* (server time) with
    *paused* (the jobs paused fleet-wide), with its tags unless *tags* is false (a list not
    filtered by tag needs none: the page's rows read theirs): the same statements however
    many jobs (see the module).

    Run it in one snapshot (a repeatable-read transaction: its statements must see the
    same notes and runs) with JIT off (``SET LOCAL jit = off``): its plan's estimates are
    those of thousands of index probes, which JIT compiles for longer than they take.
    """
    # name: [its tags, grace, due, its latest finished run's outcome, its latest success's slot]
    facts: dict[str, list[Any]] = {}
    asked: list[str] = []
    gaps: list[tuple[str | None, str | None]] = []
    rows = await conn.fetch(roster_sql(table, tags), now)
    for name, labels, grace, due, last, below, mine, gap, done, outcome, slot in rows:
        facts[name] = known = [labels, grace, due, None, None]
        if last or gap:  # the last note's runs are not probed; or a gap
            gaps.append((name, below))
            asked.append(name)
        elif mine and done:
            known[3] = outcome
            if outcome == "succeeded":
                known[4] = slot
            elif overdue_slot(grace, due, None, now) is not None:
                asked.append(name)  # overdue unless a success since: which one is it?
        elif mine:  # running, or unreadable
            asked.append(name)
    if not rows:
        gaps.append((None, None))  # no note: every job of the runs table
    after, before = zip(*gaps, strict=True)
    for name, noted, outcome, success in await conn.fetch(
        asked_sql(table), asked, list(after), list(before)
    ):
        if noted:
            facts[name][3:] = outcome, success
        else:
            facts[name] = [None, None, None, outcome, success]
    held = await held_locks(conn, list(facts), table)
    jobs = []
    for name, (labels, grace, due, outcome, success) in facts.items():
        holders = held.get(name, ())
        status = status_of(
            paused=name in paused,
            overdue=overdue_slot(grace, due, success, now) is not None,
            last_outcome=outcome,
            held=bool(holders),
        )
        jobs.append(RosterJob(name, tuple(labels) if labels else (), status, holders))
    return jobs
