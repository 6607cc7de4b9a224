"""The fleet at a glance: every job the ledger knows, its tags and its status, in one read.

What the dashboard's summary, filter and ordering need of each of thousands of jobs, and
no more: the facts :func:`._fleet.status_of` judges (its overdue grace and due slot, the
outcome of its latest finished run, the slot of its latest success). Two statements,
whatever the number of jobs: :func:`roster_sql`, one probe of the runs' primary key a
noted job, which settles most of them (those come back as names grouped by outcome),
then :func:`asked_sql` for the rest (a job that may be overdue, is running or is
unreadable, and the jobs that have runs but no note); and the lock holders
(:func:`._fleet.held_locks`). The runs of a page of jobs are then read in full by
:func:`._fleet.read_jobs`, for those jobs only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from .._sql.runs import HIGH, LOW, slot_in_range
from .._sql.tables import LedgerTable
from .fleet import LockHolder, Status, held_locks, overdue_slot, status_of

__all__ = ("Roster", "asked_sql", "read_roster", "roster_sql")


@dataclass(frozen=True, slots=True)
class Roster:
    """The fleet at a glance: every job's status, who holds which lock, and which jobs have
    the tags asked for."""

    statuses: dict[str, Status]
    """Every job the ledger knows, in no order, and its status."""
    tagged: frozenset[str] | None
    """The jobs with every tag asked for (``None``: none was asked for)."""
    holders: dict[str, tuple[LockHolder, ...]]
    """Who holds the lock of each job held right now (:func:`._fleet.held_locks`)."""


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
def roster_sql(table: LedgerTable) -> str:
    """``$1`` now, ``$2`` tags: every noted job, in no order, most of them by name only.

    For each noted job: whether it has every tag of ``$2`` (*tagged*), and the greatest
    run from it up to the next noted job (one probe of the runs' primary key): whether
    that run is its own (*mine*) or a later job's (*gap*: the runs table has jobs without
    a note there, up to *below*, the next noted job), whether it is finished and readable
    (*done*), its outcome (``''``: none recorded) and slot; its overdue grace, due slot,
    and whether it is the last noted job (*last*). Its own finished run is its latest
    finished one, and its latest success too when it succeeded (a replica writes a
    success's outcome and end at once); when it did not, the latest success matters only
    to a job that is overdue without one.

    The due slot, and the slot of that run, are read only when the due slot fell due more
    than the grace before ``$1`` (NULL otherwise): else :func:`._fleet.overdue_slot` is
    ``None`` whatever they are. So a job whose own latest run is finished and readable
    and whose due slot is not past its grace (most of a fleet) is judged by that run's
    outcome alone (with whether it is paused or held): such jobs come as one row per
    outcome (*settled*) and *tagged*, their names in the array *names*, the other columns
    NULL; every other job is a row of its own (*names* NULL). Thousands of names in a few
    arrays cost the client far less than a row each; the columns are of built-in types
    (an array of records or of booleans would make asyncpg look its type up on each new
    connection, which costs more than the rest of the read at 500 jobs).
    """
    runs, notes = table.runs, table.jobs
    late = (
        f"j.due BETWEEN {LOW} AND {HIGH} AND extract(epoch FROM $1::timestamptz - j.due) > j.grace"
    )
    # Each other job's facts: its group is itself, these aggregates read its one row.
    facts = ",\n".join(
        f"{fold}({fact}) FILTER (WHERE NOT k.plain) AS {name}"
        for fold, fact, name in (
            ("min", "k.grace", "grace"),
            ("min", "CASE WHEN k.late THEN k.due END", "due"),
            ("bool_and", "k.below IS NULL", "last"),
            ("min", "CASE WHEN k.top > k.job THEN k.below END", "below"),
            ("bool_and", "k.top = k.job", "mine"),
            ("bool_and", "k.top > k.job", "gap"),
            ("bool_and", "k.done", "done"),
            ("min", "k.outcome", "outcome"),
            ("min", f"CASE WHEN k.late AND {slot_in_range('k.slot')} THEN k.slot END", "slot"),
        )
    )
    return f"""
        SELECT CASE WHEN k.plain THEN NULL ELSE k.job END AS job, k.tagged,
               {facts},
               CASE WHEN k.plain THEN k.outcome END AS settled,
               CASE WHEN k.plain THEN array_agg(k.job) END AS names
        FROM (SELECT n.job, n.tagged, n.grace, n.due, n.late, n.below, p.top, p.done,
                     p.outcome, p.slot,
                     coalesce(p.top = n.job AND p.done AND NOT n.late, false) AS plain
              FROM (SELECT j.job, j.grace, j.due, coalesce({late}, false) AS late,
                           cardinality($2::text[]) = 0
                               OR coalesce(j.tags @> $2::text[], false) AS tagged,
                           lead(j.job) OVER (ORDER BY j.job) AS below
                    FROM {notes} j) n
              LEFT JOIN LATERAL (
                  SELECT x.job AS top, coalesce(x.outcome, '') AS outcome, x.slot,
                         x.finished_at IS NOT NULL AND {_readable("x")} AS done
                  FROM {runs} x WHERE x.job >= n.job AND x.job < n.below
                  ORDER BY x.job DESC, x.slot DESC LIMIT 1) p ON true) k
        GROUP BY 1, k.tagged, k.plain, CASE WHEN k.plain THEN k.outcome END"""


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
    conn: Any,
    table: LedgerTable,
    paused: frozenset[str],
    now: datetime,
    *,
    tags: Sequence[str] = (),
) -> Roster:
    """Every job the ledger knows, each judged at *now* (server time) with *paused* (the
    jobs paused fleet-wide), and which of them have every one of *tags*: the same
    statements however many jobs (see the module).

    Run it in one snapshot (a repeatable-read transaction: its statements must see the
    same notes and runs) with JIT off (``SET LOCAL jit = off``): its plan's estimates are
    those of thousands of index probes, which JIT compiles for longer than they take.
    """
    # name: [grace, due, its latest finished run's outcome, its latest success's slot]
    facts: dict[str, list[Any]] = {}
    asked: list[str] = []
    gaps: list[tuple[str | None, str | None]] = []
    plain: list[tuple[str, list[str]]] = []  # (outcome, names): see roster_sql
    tagged: set[str] = set()
    rows = await conn.fetch(roster_sql(table), now, list(tags))
    for name, has_tags, grace, due, last, below, mine, gap, done, outcome, slot, *group in rows:
        settled, names = group
        if names is not None:
            plain.append((settled, names))
            if has_tags and tags:
                tagged.update(names)
            continue
        facts[name] = known = [grace, due, None, None]
        if has_tags:
            tagged.add(name)
        if last or gap:  # the last note's runs are not probed; or a gap
            gaps.append((name, below))
            asked.append(name)
        elif mine and done:
            known[2] = outcome
            if outcome == "succeeded":
                known[3] = slot
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
            facts[name][2:] = outcome, success
        else:
            facts[name] = [None, None, outcome, success]
            if not tags:  # no note, no tags
                tagged.add(name)
    everyone = list(facts)
    for _, names in plain:
        everyone.extend(names)
    held = await held_locks(conn, everyone, table)
    few = held.keys() | paused
    statuses: dict[str, Status] = {}
    for outcome, names in plain:
        # Not overdue (see roster_sql): paused and held decide the rest, and they are the
        # same for all but a few of the names.
        statuses.update(dict.fromkeys(names, _judge(False, outcome, False, False)))
        for name in few.intersection(names):
            statuses[name] = _judge(name in paused, outcome, False, name in held)
    for name, (grace, due, outcome, success) in facts.items():
        overdue = overdue_slot(grace, due, success, now) is not None
        statuses[name] = _judge(name in paused, outcome, overdue, name in held)
    return Roster(statuses, None if not tags else frozenset(tagged), held)


def _judge(paused: bool, outcome: str | None, overdue: bool, held: bool) -> Status:
    return status_of(paused=paused, overdue=overdue, last_outcome=outcome, held=held)
