"""Stored schedules in the ledger: their table, statements and decoding.

One row per schedule in ``<table>_schedules``, keyed by name. Every change (an add, an
update, a removal, which leaves a tombstone; or a batch of them, which share one revision)
takes the next *revision*, under the changes' lock (a row lock on the table's lock row,
:func:`schedules_lock_sql`) held to its commit: revisions commit in order, so a replica
that read everything up to revision N never later finds a change numbered N or below. A
sync is one statement, ``revision > N``, on the revision index, however many schedules
there are; a batch commits at once, so a sync reads all of it or none of it (a read cut
into pages must not end inside a revision).

A replica's problem with a revision (no such task there, kwargs that do not fit) is noted
in the row, keyed by the replica's holder (its members row's), and shown while the row is
at that revision and its reporter is a live member (an unexpired members row): the blame of
a process that exited goes with it (its row is deleted at a graceful close, or expires
``MEMBER_TTL`` seconds after a kill). A schedule whose revision every live member reported
a problem with (at least one live member) is *rejected everywhere*: no replica runs it.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from ..._stored.decode import MAX_REASON, decode_row
from ..._stored.limits import MAX_JSON_BYTES, MAX_NAME, shortened
from ..._stored.schedule import Change, StoredSchedule
from .runs import report_odd, sane
from .tables import LedgerTable

__all__ = (
    "LOCK_ROW",
    "NONE_REMOVED",
    "count_schedules_sql",
    "decode_changes",
    "decode_stored",
    "forget_job_sql",
    "forget_jobs_sql",
    "job_in_code_sql",
    "list_schedules_sql",
    "next_revision_sql",
    "put_schedule_sql",
    "put_schedules_sql",
    "rejected_sql",
    "remove_missing_sql",
    "remove_schedule_sql",
    "schedule_changes_sql",
    "schedule_for_update_sql",
    "schedule_page_sql",
    "schedule_problem_sql",
    "schedule_top_sql",
    "schedule_window_sql",
    "schedules_count_sql",
    "schedules_lock_sql",
    "schedules_page_sql",
)

NONE_REMOVED = "UPDATE 0"
"""The status :func:`remove_schedule_sql` answers when no such schedule was stored."""

# Reads return the JSON columns as text (no codec to register on anyone's connection).
_BASE = f"""s.name, s.revision, s.removed, s.task, s.schedule::text AS schedule,
    s.kwargs::text AS kwargs, s.options::text AS options, {sane("s.updated_at", "updated_at")}"""
# What a replica's sync reads: the problems as stored (it does not read them).
_COLUMNS = f"""{_BASE},
    CASE WHEN s.problem_revision = s.revision THEN s.problems::text END AS problems"""
# What the operators read, joined with _live() as l: the problems of live reporters only,
# and whether every live member reported one (a row no cronlock wrote, whose problems are
# not an object, is passed on as it is: decode_stored reports it).
_LIVE_COLUMNS = f"""{_BASE},
    CASE WHEN s.problem_revision IS DISTINCT FROM s.revision THEN NULL
         WHEN jsonb_typeof(s.problems) <> 'object' THEN s.problems::text
         ELSE (SELECT jsonb_object_agg(p.key, p.value) FROM jsonb_each(s.problems) p
               WHERE p.key = ANY(l.holders))::text END AS problems"""
_REJECTED = """coalesce(s.problem_revision = s.revision AND jsonb_typeof(s.problems) = 'object'
                     AND cardinality(l.holders) > 0 AND s.problems ?& l.holders, false)"""


def _live(table: LedgerTable) -> str:
    """The live members' holders as one row ``l(holders)`` (an empty array: none)."""
    return f"""(SELECT coalesce(array_agg(m.holder), '{{}}') AS holders FROM {table.members} m
                WHERE m.expires_at > clock_timestamp()) l"""


LOCK_ROW = ""
"""The name of the schedules table's lock row: no schedule's (a job's name is never empty),
a tombstone at revision 0 that no read returns (a sync reads ``revision > N``, the lists
leave tombstones out)."""


@functools.cache
def schedules_lock_sql(table: LedgerTable) -> str:
    """No parameters: the lock every change of the stored schedules takes first, held to
    its commit, so that revisions commit in order: the lock row's row lock, the row made by
    the first change. An upsert that updates nothing still locks the row it finds, and
    waits for a change that holds it (or that is inserting it) to end.

    A row lock, not an advisory one: only a role that may write the schedules table can
    take it (``FOR UPDATE`` and ``ON CONFLICT DO UPDATE`` need ``UPDATE`` on it), where any
    session of any role can take any advisory key; and the changes wait for it at most
    their ``lock_timeout``."""
    return f"""
            INSERT INTO {table.schedules} AS s (name, revision, removed, task, schedule,
                                                updated_by)
            VALUES ('{LOCK_ROW}', 0, true, '', '{{}}', 'cronlock: the lock of changes')
            ON CONFLICT (name) DO UPDATE SET revision = s.revision WHERE false"""


@functools.cache
def next_revision_sql(table: LedgerTable) -> str:
    """No parameters: the revision the next change takes (under :func:`schedules_lock_sql`)."""
    return f"SELECT coalesce(max(revision), 0) + 1 FROM {table.schedules}"


@functools.cache
def schedule_for_update_sql(table: LedgerTable) -> str:
    """``$1`` name: the schedule's row, locked for the change (inside the transaction)."""
    return f"""SELECT {_COLUMNS}, false AS paused, false AS rejected FROM {table.schedules} s
                   WHERE s.name = $1::text FOR UPDATE"""


@functools.cache
def put_schedule_sql(table: LedgerTable) -> str:
    """``$1`` name, ``$2`` revision, ``$3`` task, ``$4`` schedule, ``$5`` kwargs, ``$6``
    options (JSON texts), ``$7`` who: add the schedule, or replace it (its problems go)."""
    return f"""
            INSERT INTO {table.schedules} AS s
                (name, revision, task, schedule, kwargs, options, updated_by)
            VALUES ($1::text, $2::bigint, $3::text, $4::jsonb, $5::jsonb, $6::jsonb, $7::text)
            ON CONFLICT (name) DO UPDATE
            SET revision = EXCLUDED.revision, removed = false, task = EXCLUDED.task,
                schedule = EXCLUDED.schedule, kwargs = EXCLUDED.kwargs,
                options = EXCLUDED.options, updated_at = clock_timestamp(),
                updated_by = EXCLUDED.updated_by, problems = NULL, problem_revision = NULL"""


@functools.cache
def remove_schedule_sql(table: LedgerTable) -> str:
    """``$1`` name, ``$2`` revision, ``$3`` who: a tombstone, so that running replicas see
    the schedule go (:data:`NONE_REMOVED` when it was not stored)."""
    return f"""
            UPDATE {table.schedules} SET revision = $2::bigint, removed = true,
                updated_at = clock_timestamp(), updated_by = $3::text, problems = NULL,
                problem_revision = NULL
            WHERE name = $1::text AND NOT removed"""


@functools.cache
def list_schedules_sql(table: LedgerTable) -> str:
    """No parameters: every stored schedule, by name, with its fleet-wide pause, the
    problems its live reporters have with its revision, and whether it is rejected
    everywhere (what ``FleetControl.schedules()`` lists, ``status`` and the dashboard show).
    One statement: the members table is read once, not once a schedule."""
    return f"""
            SELECT {_LIVE_COLUMNS}, c.paused_at IS NOT NULL AS paused, {_REJECTED} AS rejected
            FROM {table.schedules} s CROSS JOIN {_live(table)}
            LEFT JOIN {table.control} c ON c.job = s.name
            WHERE NOT s.removed ORDER BY s.name"""


# A name the dashboard's filter keeps: it contains $1, in any case ('' keeps every name).
_NAMED = "strpos(lower(s.name), lower($1::text)) > 0"


@functools.cache
def schedules_page_sql(table: LedgerTable) -> str:
    """``$1`` text, ``$2`` limit, ``$3`` offset: one page of :func:`list_schedules_sql`'s
    rows, of the names containing the text (any case), by name. Only the page's rows are
    read (the primary key, in name order) and joined: the cost is the page's, not the
    ledger's."""
    return f"""
            SELECT {_LIVE_COLUMNS}, c.paused_at IS NOT NULL AS paused, {_REJECTED} AS rejected
            FROM (SELECT * FROM {table.schedules} s WHERE NOT s.removed AND {_NAMED}
                  ORDER BY s.name LIMIT $2::bigint OFFSET $3::bigint) s
            CROSS JOIN {_live(table)}
            LEFT JOIN {table.control} c ON c.job = s.name
            ORDER BY s.name"""


@functools.cache
def schedules_count_sql(table: LedgerTable) -> str:
    """``$1`` text: how many schedules are stored (``total``), how many of them
    :func:`schedules_page_sql` keeps for that text (``matched``), and how many every live
    member rejected (``rejected``): one row, no schedule's columns sent."""
    return f"""
            SELECT count(*) AS total, count(*) FILTER (WHERE {_NAMED}) AS matched,
                   count(*) FILTER (WHERE {_REJECTED}) AS rejected
            FROM {table.schedules} s CROSS JOIN {_live(table)}
            WHERE NOT s.removed"""


@functools.cache
def count_schedules_sql(table: LedgerTable) -> str:
    """No parameters: how many schedules are stored (tombstones left out)."""
    return f"SELECT count(*) FROM {table.schedules} WHERE NOT removed"


@functools.cache
def rejected_sql(table: LedgerTable) -> str:
    """No parameters: :func:`list_schedules_sql`'s rows of the schedules rejected
    everywhere only (every live member reported a problem with the current revision):
    one statement, whatever the number of schedules or members."""
    return f"""
            SELECT {_LIVE_COLUMNS}, c.paused_at IS NOT NULL AS paused, true AS rejected
            FROM {table.schedules} s CROSS JOIN {_live(table)}
            LEFT JOIN {table.control} c ON c.job = s.name
            WHERE NOT s.removed AND {_REJECTED} ORDER BY s.name"""


@functools.cache
def schedule_changes_sql(table: LedgerTable) -> str:
    """``$1`` since, ``$2`` at most: the first changes after that revision, oldest first
    (the first read, from 0, leaves the tombstones out), each with its fleet-wide pause. A
    sync reads that many first (on the revision index): fewer came back, it read them all;
    else it reads the lot in pages (:func:`schedule_page_sql`)."""
    return f"""
            SELECT {_COLUMNS}, c.paused_at IS NOT NULL AS paused, false AS rejected
            FROM {table.schedules} s LEFT JOIN {table.control} c ON c.job = s.name
            WHERE s.revision > $1::bigint AND (NOT s.removed OR $1::bigint > 0)
            ORDER BY s.revision
            LIMIT $2::int"""


@functools.cache
def schedule_top_sql(table: LedgerTable) -> str:
    """The latest revision of the stored schedules (``NULL``: none yet)."""
    return f"SELECT max(revision) FROM {table.schedules}"


@functools.cache
def schedule_window_sql(table: LedgerTable) -> str:
    """``$1`` after, ``$2`` skip: the name ``$2`` names after the name *after* (``NULL``:
    fewer are left), the end of a page of :func:`schedule_page_sql` (on the primary key,
    without reading the rows)."""
    return f"""
            SELECT name FROM {table.schedules} WHERE name > $1::text
            ORDER BY name OFFSET $2::int LIMIT 1"""


@functools.cache
def schedule_page_sql(table: LedgerTable) -> str:
    """``$1`` since, ``$2`` up to, ``$3`` after, ``$4`` to (``NULL``: no end): one page of
    the changes after revision *since* and up to revision *up to*, the schedules named
    after *after* and up to *to* (a few thousand names: :func:`schedule_window_sql`), in
    name order. One statement for 100,000 changes held the session, and the claims waiting
    behind it, for a few hundred milliseconds. A schedule changed again while the pages
    are read is past *up to*: the next sync reads it.

    Every page costs the same (a few milliseconds for 2,000 rows) in every plan: a range
    of the primary key, never the revision index (the revision bounds are written so no
    plan reads it: a plan that did read every row of the revision, then kept a page of
    them, 70 ms a page; with a ``LIMIT`` in place of the range, custom plans sorted the
    whole table, 90-120 ms), and the pause is a subquery (a join's plan, made while the
    control table was empty, scanned it once a row)."""
    return f"""
            SELECT {_COLUMNS},
                   EXISTS (SELECT FROM {table.control} c
                           WHERE c.job = s.name AND c.paused_at IS NOT NULL) AS paused,
                   false AS rejected
            FROM {table.schedules} s
            WHERE s.name > $3::text AND ($4::text IS NULL OR s.name <= $4::text)
              AND s.revision + 0 > $1::bigint AND s.revision + 0 <= $2::bigint
              AND (NOT s.removed OR $1::bigint > 0)
            ORDER BY s.name"""


@functools.cache
def schedule_problem_sql(table: LedgerTable) -> str:
    """``$1`` name, ``$2`` revision, ``$3`` problem, ``$4`` who (the replica's holder, as
    in the members table): a replica's problem with that revision of the schedule, shown
    while the schedule is at it and the replica is a live member."""
    return f"""
            UPDATE {table.schedules}
            SET problems = CASE WHEN problem_revision = $2::bigint
                                THEN coalesce(problems, '{{}}') ELSE '{{}}' END
                           || jsonb_build_object($4::text, $3::text),
                problem_revision = $2::bigint
            WHERE name = $1::text AND revision = $2::bigint"""


@functools.cache
def job_in_code_sql(table: LedgerTable) -> str:
    """``$1`` name: whether a job of that name has a ledger row but no stored schedule (a
    job defined in code)."""
    return f"""
            SELECT EXISTS (SELECT 1 FROM {table.runs} WHERE job = $1::text)
               AND NOT EXISTS (SELECT 1 FROM {table.schedules} WHERE name = $1::text)"""


def forget_job_sql(table: LedgerTable) -> str:
    """``$1`` job: delete its schedule note (a stored schedule removed: no replica runs it)."""
    return f"DELETE FROM {table.jobs} WHERE job = $1::text"


@functools.cache
def forget_jobs_sql(table: LedgerTable) -> str:
    """``$1`` jobs: delete their schedule notes (:func:`forget_job_sql` for a batch)."""
    return f"DELETE FROM {table.jobs} WHERE job = ANY($1::text[])"


@functools.cache
def lock_notes_sql(table: LedgerTable) -> str:
    """``$1`` jobs: lock their schedule notes (those that exist), in code point order of
    the names (``COLLATE "C"``: Python's order of ``str``, which every multi-row write of
    the notes follows): a transaction that then deletes some and writes others holds them
    in that one order, as a replica's note writes take them, and never deadlocks with
    one."""
    return f"""
            SELECT 1 FROM {table.jobs} WHERE job = ANY($1::text[])
            ORDER BY job COLLATE "C" FOR UPDATE"""


@functools.cache
def put_schedules_sql(table: LedgerTable) -> str:
    """Arrays ``$1`` names, ``$2`` tasks, ``$3`` schedules, ``$4`` kwargs, ``$5`` options
    (JSON texts), ``$6`` the revision, ``$7`` who: store each schedule that is not stored
    as it is (added, or replaced: its problems go), all at revision ``$6``, in one
    statement. Returns the rows it wrote (those already stored as given are left alone:
    none, and the revision is not taken), each with ``added`` (not stored, or removed) and
    ``in_code`` (not stored and a job of that name has runs in the ledger: a job defined in
    code; the caller refuses the batch). Compared as JSON values, as :func:`put_schedule_sql`
    writes them."""
    return f"""
            WITH u AS (
                SELECT u.name, u.task, u.schedule::jsonb AS schedule,
                       u.kwargs::jsonb AS kwargs, u.options::jsonb AS options
                FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
                     AS u(name, task, schedule, kwargs, options)),
            d AS (
                SELECT u.*, s.name IS NULL OR s.removed AS added,
                       s.name IS NULL AND EXISTS (SELECT FROM {table.runs} r
                                                  WHERE r.job = u.name) AS in_code
                FROM u LEFT JOIN {table.schedules} s ON s.name = u.name
                WHERE s.name IS NULL OR s.removed OR s.task IS DISTINCT FROM u.task
                   OR s.schedule IS DISTINCT FROM u.schedule
                   OR s.kwargs IS DISTINCT FROM u.kwargs
                   OR s.options IS DISTINCT FROM u.options),
            w AS (
                INSERT INTO {table.schedules} AS s
                    (name, revision, task, schedule, kwargs, options, updated_by)
                SELECT d.name, $6::bigint, d.task, d.schedule, d.kwargs, d.options, $7::text
                FROM d
                ON CONFLICT (name) DO UPDATE
                SET revision = EXCLUDED.revision, removed = false, task = EXCLUDED.task,
                    schedule = EXCLUDED.schedule, kwargs = EXCLUDED.kwargs,
                    options = EXCLUDED.options, updated_at = clock_timestamp(),
                    updated_by = EXCLUDED.updated_by, problems = NULL,
                    problem_revision = NULL)
            SELECT d.name, d.added, d.in_code FROM d"""


@functools.cache
def remove_missing_sql(table: LedgerTable) -> str:
    """``$1`` prefix, ``$2`` names, ``$3`` revision, ``$4`` who: a tombstone at revision
    ``$3`` for every stored schedule whose name starts with ``$1`` and is not one of ``$2``
    (the set sync's removals; an anti-join, not a scan of ``$2`` per row). Returns their
    names."""
    return f"""
            UPDATE {table.schedules} s SET revision = $3::bigint, removed = true,
                updated_at = clock_timestamp(), updated_by = $4::text, problems = NULL,
                problem_revision = NULL
            WHERE NOT s.removed AND starts_with(s.name, $1::text)
              AND NOT EXISTS (SELECT FROM unnest($2::text[]) AS k(name) WHERE k.name = s.name)
            RETURNING s.name"""


def decode_stored(row: Any, *, table: str) -> StoredSchedule:
    """The stored schedule *row* holds, through the one decode boundary
    (:func:`cronlock._stored.decode.decode_row`): a row that cannot be read, is out of
    range or breaks a limit is read as :attr:`~cronlock.StoredSchedule.unreadable` (why),
    never raised. *table* names the table in a problem column's report."""
    name: str = row["name"]
    decoded = decode_row(name, row["task"], row["schedule"], row["kwargs"], row["options"])
    problems: dict[str, str] = {}
    text = row["problems"]
    if text and text != "{}":  # (most rows: none)
        try:
            noted = json.loads(text) if len(text) <= MAX_JSON_BYTES else {}
            problems = {str(by)[:MAX_NAME]: str(why)[:MAX_REASON] for by, why in noted.items()}
        except Exception as exc:  # any text at all: the row's problems are then unknown
            report_odd(table, name, f"problems: {type(exc).__name__}", kept=True)
    updated: datetime | None = row["updated_at"]
    return StoredSchedule(
        name=name,
        task=row["task"] if decoded.unreadable is None else shortened(row["task"]),
        schedule=decoded.schedule,
        kwargs=decoded.kwargs,
        options=decoded.options,
        revision=row["revision"],
        paused=bool(row["paused"]),
        updated_at=updated,
        problems=problems,
        rejected=bool(row["rejected"]),
        unreadable=decoded.unreadable,
    )


def decode_changes(rows: list[Any], since: int, *, table: str) -> tuple[int, list[Change]]:
    """The revision read up to and the changes in *rows* (:func:`schedule_changes_sql` read
    after *since*); an unreadable row is a change to an unreadable schedule (a replica
    rejects it, and drops the job of its previous revision)."""
    changes: list[Change] = []
    top = since
    for row in rows:
        top = max(top, row["revision"])
        if row["removed"]:
            changes.append((row["name"], row["revision"], None))
            continue
        stored = decode_stored(row, table=table)
        changes.append((stored.name, stored.revision, stored))
    return top, changes
