"""The fleet's reads for the operators' side: job notes, lock holders, the roster of
every job at a glance, the server's clock, and the bounded form the dashboard reads them in.

What the ``status`` and ``history`` verbs print and what the web dashboard shows are read
with these (``postgres/_ops/fleet.py``, ``_ops/roster.py``, ``web/``), so the command line
and the page never disagree. Read-only: nothing here writes.

The roster (:func:`roster_sql`, :func:`asked_sql`) is what the dashboard's summary,
filter and ordering need of each of thousands of jobs, and no more: two statements,
whatever the number of jobs; ``_ops/roster.py`` judges their answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache

from .runs import HIGH, LOW, Latest, latest_run, odd_list, sane, slot_in_range
from .tables import LedgerTable

__all__ = (
    "ABSENT_AFTER",
    "HOLDERS_SQL",
    "JIT_OFF_SQL",
    "SERVER_CLOCK_SQL",
    "asked_sql",
    "bounded_sql",
    "jobs_sql",
    "named_jobs_sql",
    "roster_sql",
)

ABSENT_AFTER = 90.0
"""Seconds past the next slot its replicas noted after which a job whose slot no replica
fired since is absent: a live replica notes the next one within ``NOTE_LATEST`` plus
``NOTE_EVERY`` (35 s) of each slot (``_locker/upkeep``)."""

SERVER_CLOCK_SQL = "SELECT clock_timestamp()"
"""No parameters: the database server's clock, the fleet's shared time."""

JIT_OFF_SQL = "SET LOCAL jit = off"
"""No parameters: JIT off for the transaction (the roster's plans are estimated at thousands
of index probes, which JIT compiles for longer than they take)."""

# A bigint advisory key k is stored in pg_locks as classid = k >> 32, objid = k & 0xffffffff
# (objsubid = 1); advisory locks are per database, hence the database filter. Every granted
# one is read (as many as runs in progress, not as jobs) and mapped to names in Python: a
# filter by key would send two or three keys a job.
HOLDERS_SQL = """
SELECT (l.classid::int8 << 32) | l.objid::int8 AS key, a.pid, a.application_name,
       host(a.client_addr) AS addr, a.backend_start
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def jobs_sql(table: LedgerTable) -> str:
    """Every job with a schedule note or a run: its schedule, tags, next slot, grace, due
    slot, and how its slots are rebuilt (``spec``, JSON text).

    Distinct jobs of the runs table come from a recursive skip scan of the primary
    key: one index probe per job, however many runs each has.
    """
    return f"""
        WITH RECURSIVE seen(job) AS (
            (SELECT job FROM {table.runs} ORDER BY job LIMIT 1)
            UNION ALL
            SELECT (SELECT r.job FROM {table.runs} r WHERE r.job > seen.job
                    ORDER BY r.job LIMIT 1)
            FROM seen WHERE seen.job IS NOT NULL
        )
        SELECT coalesce(j.job, s.job) AS job, j.schedule, j.tags,
               {sane("j.next_run", "next_run")},
               {sane("j.updated_at", "updated_at")}, j.grace, {sane("j.due", "due")},
               {odd_list((f"j.{c}", c) for c in ("next_run", "updated_at", "due"))} AS odd,
               j.spec::text AS spec
        FROM {table.jobs} j
        FULL JOIN (SELECT job FROM seen WHERE job IS NOT NULL) s ON s.job = j.job
        WHERE j.retired_at IS NULL
        ORDER BY 1"""


def named_jobs_sql(table: LedgerTable) -> str:
    """``$1`` job names: :func:`jobs_sql`'s rows of those of them the ledger
    knows (a schedule note or a run), in no order: an index probe or two a name.

    Each is a subquery with a LIMIT, which the planner keeps as a probe of the key: as a
    join (or an ``EXISTS``), it may hash every note (or every run) for a page of names.
    """
    return f"""
        SELECT u.job, j.schedule, j.tags, {sane("j.next_run", "next_run")},
               {sane("j.updated_at", "updated_at")}, j.grace, {sane("j.due", "due")},
               {odd_list((f"j.{c}", c) for c in ("next_run", "updated_at", "due"))} AS odd,
               j.spec::text AS spec
        FROM unnest($1::text[]) AS u(job)
        LEFT JOIN LATERAL (SELECT * FROM {table.jobs} n WHERE n.job = u.job LIMIT 1) j ON true
        WHERE (j.job IS NOT NULL
               OR (SELECT true FROM {table.runs} r WHERE r.job = u.job LIMIT 1))
          AND j.retired_at IS NULL"""


def _readable(alias: str) -> str:
    """The condition that the run *alias* is one :func:`.runs.decode_run` reads (a run
    with an unreadable instant is skipped there: it is no latest run here either)."""
    return " AND ".join(
        slot_in_range(f"{alias}.{c}") for c in ("slot", "started_at", "finished_at")
    )


def _probe(runs: str, kind: Latest, value: str) -> str:
    """The latest run of *kind* of job ``k.job``, as *value* (NULL when it is unreadable):
    what :func:`.runs.last_runs_sql` reads, one probe (:func:`.runs.latest_run`)."""
    readable = f"CASE WHEN {_readable('x')} THEN {value} END"
    return f"({latest_run(runs, 'k.job', kind, columns=readable, alias='x')})"


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
    whether it is the last noted job (*last*), and whether it is *retired* (left out by
    the caller; its row still bounds the runs-only jobs after it). Its own finished run
    is its latest finished one, and its latest success too when it succeeded (a replica writes a
    success's outcome and end at once); when it did not, the latest success matters only
    to a job that is overdue without one.

    The due slot, the noted next slot, and the slot of that run, are read only when the
    due slot or the next slot fell due more than the grace (or ``ABSENT_AFTER``) before
    ``$1`` (NULL otherwise): else ``_ops/fleet.overdue_slot`` is
    ``None`` and the job is not absent, whatever they are. So a job whose own latest run
    is finished and readable and whose due slot is not past its grace (most of a fleet),
    nor its next slot, is judged by that run's
    outcome alone (with whether it is paused or held): such jobs come as one row per
    outcome (*settled*) and *tagged*, their names in the array *names*, the other columns
    NULL; every other job is a row of its own (*names* NULL). Thousands of names in a few
    arrays cost the client far less than a row each; the columns are of built-in types
    (an array of records or of booleans would make asyncpg look its type up on each new
    connection, which costs more than the rest of the read at 500 jobs).
    """
    runs, notes = table.runs, table.jobs
    # May be overdue or absent (_ops/fleet.overdue_slot, absent): its due slot, or its
    # noted next slot, is past its grace (or ABSENT_AFTER).
    late = f"""(j.due BETWEEN {LOW} AND {HIGH}
                AND extract(epoch FROM $1::timestamptz - j.due) > j.grace)
               OR (j.next_run BETWEEN {LOW} AND {HIGH}
                   AND extract(epoch FROM $1::timestamptz - j.next_run)
                       > least(j.grace, {ABSENT_AFTER}))"""
    # Each other job's facts: its group is itself, these aggregates read its one row.
    facts = ",\n".join(
        f"{fold}({fact}) FILTER (WHERE NOT k.plain) AS {name}"
        for fold, fact, name in (
            ("min", "k.grace", "grace"),
            ("min", "CASE WHEN k.late THEN k.due END", "due"),
            (
                "min",
                f"CASE WHEN k.late AND {slot_in_range('k.next_run')} THEN k.next_run END",
                "next_run",
            ),
            ("bool_and", "k.below IS NULL", "last"),
            ("min", "CASE WHEN k.top > k.job THEN k.below END", "below"),
            ("bool_and", "k.top = k.job", "mine"),
            ("bool_and", "k.top > k.job", "gap"),
            ("bool_and", "k.done", "done"),
            ("min", "k.outcome", "outcome"),
            ("min", f"CASE WHEN k.late AND {slot_in_range('k.slot')} THEN k.slot END", "slot"),
            ("bool_and", "k.retired", "retired"),
            ("min", "CASE WHEN k.late THEN k.spec END", "spec"),
        )
    )
    return f"""
        SELECT CASE WHEN k.plain THEN NULL ELSE k.job END AS job, k.tagged,
               {facts},
               CASE WHEN k.plain THEN k.outcome END AS settled,
               CASE WHEN k.plain THEN array_agg(k.job) END AS names
        FROM (SELECT n.job, n.tagged, n.grace, n.due, n.next_run, n.late, n.below, p.top, p.done,
                     p.outcome, p.slot, n.retired, n.spec,
                     coalesce(p.top = n.job AND p.done AND NOT n.late AND NOT n.retired,
                              false) AS plain
              FROM (SELECT j.job, j.grace, j.due, j.next_run, coalesce({late}, false) AS late,
                           j.spec::text AS spec,
                           j.retired_at IS NOT NULL AS retired,
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
    as :func:`.runs.last_runs_sql` reads them ('last' and 'ok'). One probe of the
    key a job between the bounds, two a job for its runs."""
    runs, notes = table.runs, table.jobs
    first = f"""CASE WHEN g.after IS NULL AND g.below IS NULL
                     THEN (SELECT r.job FROM {runs} r ORDER BY r.job LIMIT 1)
                     WHEN g.after IS NULL
                     THEN (SELECT r.job FROM {runs} r WHERE r.job < g.below ORDER BY r.job LIMIT 1)
                     WHEN g.below IS NULL THEN {_after(runs, "g.after")}
                     ELSE {_after(runs, "g.after", "g.below")} END"""
    last = _probe(runs, "last", "coalesce(x.outcome, '')")
    success = _probe(runs, "ok", "x.slot")
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


def bounded_sql(
    sql: str,
    columns: Iterable[str],
    order: str = "",
    *,
    instants: frozenset[str],
    earliest: str,
    latest: str,
    prefixes: Mapping[str, int],
) -> str:
    """*sql* (a fleet read, same parameters) run as a subquery ``q`` whose *columns* are
    filtered, in that order, then *order* (an ``ORDER BY`` of ``q``'s columns, or ``""``):
    each of *instants* is NULL unless finite and between *earliest* and *latest* (UTC
    timestamps as text), each of *prefixes* is cut to that many characters, the others as
    they are. The dashboard's reads: any row decodable and bounded, its meaning and order
    those of the read."""

    def column(name: str) -> str:
        source = f"q.{name}"
        if name in instants:
            return (
                f"CASE WHEN isfinite({source}) AND {source} BETWEEN '{earliest}'::timestamptz "
                f"AND '{latest}'::timestamptz THEN {source} END AS {name}"
            )
        if name in prefixes:
            return f"substr({source}, 1, {prefixes[name]}) AS {name}"
        return source

    select = ", ".join(column(name) for name in columns)
    return f"SELECT {select} FROM ({sql}) AS q{order}"
