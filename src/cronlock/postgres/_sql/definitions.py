"""The statements of the replicas' job definitions: two definitions under one job name.

Each replica writes its definition of each of its jobs (its schedule and its function,
``module.qualname``; a stored schedule's task and schedule) in the ledger's definitions
table (``<table>_definitions``, made by :func:`.schema.migrate`), one row per replica (its
members' *holder*) and job, when it starts and when a definition changes: never per slot or
per heartbeat. Two live replicas (an unexpired row of the members table) that give one job
different definitions are in conflict: two services on one ledger, or a rolling deploy
that changed the job while old and new replicas overlap. Rows of replicas that are gone
count no more (a replica that stops deletes its rows with its members row; a killed one's
expire with it and are deleted an hour later, by the next replica that writes).
"""

from __future__ import annotations

from .tables import LedgerTable

__all__ = ("CONFLICTS_LIMIT", "STALE_AFTER", "conflicted_sql", "conflicts_sql", "define_sql")

STALE_AFTER = 3600
"""Seconds after which the rows of a replica that is no member any more are deleted."""
CONFLICTS_LIMIT = 1000
"""Rows one read of a replica's conflicts (:func:`conflicts_sql`) returns at most."""


def define_sql(table: LedgerTable) -> str:
    """``$1`` holder, arrays ``$2`` jobs and ``$3`` their definitions: write this replica's
    definitions (rows already up to date are left alone), and delete the rows of replicas
    gone for :data:`STALE_AFTER` seconds (their members row expired that long ago, or was
    deleted). Sent when a replica starts and when a definition changes."""
    defs, members = table.definitions, table.members
    return f"""
        WITH stale AS (
            DELETE FROM {defs} s
            WHERE s.noted_at < clock_timestamp() - {STALE_AFTER} * interval '1 second'
              AND s.holder <> $1::text
              AND NOT EXISTS (
                  SELECT 1 FROM {members} m WHERE m.holder = s.holder
                    AND m.expires_at > clock_timestamp() - {STALE_AFTER} * interval '1 second')
        )
        INSERT INTO {defs} AS d (job, holder, definition, noted_at)
        SELECT u.job, $1::text, u.definition, clock_timestamp()
        FROM unnest($2::text[], $3::text[]) AS u(job, definition)
        ON CONFLICT (job, holder) DO UPDATE
        SET definition = EXCLUDED.definition, noted_at = EXCLUDED.noted_at
        WHERE d.definition IS DISTINCT FROM EXCLUDED.definition"""


def conflicts_sql(table: LedgerTable) -> str:
    """``$1`` holder, ``$2`` seconds, ``$3`` the jobs known in conflict, ``$4`` a row limit:
    each other live replica's definition of one of this replica's jobs that differs from
    this replica's (``job``, ``holder``, ``definition``, and ``mine``), by job and holder.

    Read every few seconds by each replica, so it reads only what may have changed: the rows
    written in the last ``$2`` seconds (a replica that started, or changed a job), those of
    replicas whose heartbeats began again in that time (back from an outage), and those of
    the jobs ``$3`` (whether their conflict goes on). A replica's first read, with ``$2``
    as long as the table's history, compares every job of its own.
    """
    defs, members = table.definitions, table.members
    return f"""
        WITH live AS MATERIALIZED (
            SELECT m.holder, m.since FROM {members} m
            WHERE m.expires_at > clock_timestamp() AND m.holder <> $1::text
        ), recent AS MATERIALIZED (
            SELECT clock_timestamp() - $2::float8 * interval '1 second' AS after
        ), pairs AS (
            SELECT o.job, o.holder, o.definition FROM {defs} o, recent r
            WHERE o.noted_at > r.after AND o.holder <> $1::text
            UNION
            SELECT o.job, o.holder, o.definition
            FROM live l JOIN {defs} o ON o.holder = l.holder, recent r
            WHERE l.since > r.after
            UNION
            SELECT o.job, o.holder, o.definition
            FROM {defs} d JOIN {defs} o ON o.job = d.job AND o.holder <> $1::text, recent r
            WHERE d.holder = $1::text AND d.noted_at > r.after
            UNION
            SELECT o.job, o.holder, o.definition FROM {defs} o
            WHERE o.job = ANY($3::text[]) AND o.holder <> $1::text
        )
        SELECT p.job, p.holder, p.definition, d.definition AS mine
        FROM pairs p
        JOIN live l ON l.holder = p.holder
        JOIN {defs} d ON d.job = p.job AND d.holder = $1::text
        WHERE d.definition <> p.definition
        ORDER BY p.job, p.holder
        LIMIT $4::int"""


def conflicted_sql(table: LedgerTable, *, named: bool = False) -> str:
    """The jobs to which live replicas give different definitions (``job``, and ``writers``:
    how many live replicas define it), read only where the definitions table exists; with
    *named*, of the jobs ``$1`` only. One pass over the live replicas' rows."""
    defs, members = table.definitions, table.members
    only = "AND d.job = ANY($1::text[])" if named else ""
    return f"""
        SELECT d.job, count(*) AS writers
        FROM {members} m JOIN {defs} d ON d.holder = m.holder
        WHERE m.expires_at > clock_timestamp() {only}
        GROUP BY d.job
        HAVING min(d.definition) <> max(d.definition)"""
