"""The statements of the replicas' job definitions: two definitions under one job name.

Each replica writes its definition of each of its jobs (its schedule and its function,
``module.qualname``; a stored schedule's task and schedule) in the ledger's definitions
table (``<table>_definitions``, made by :func:`.schema.migrate`), one row per replica (its
members' *holder*) and job, when it starts and when a definition changes: never per slot or
per heartbeat. Two live replicas (an unexpired row of the members table) that give one job
different definitions are in conflict: two services on one ledger, or a rolling deploy
that changed the job while old and new replicas overlap. Rows of replicas that are gone
count no more (a replica that stops deletes its rows with its members row; a killed one's
expire with it and are deleted an hour later, by the next replica that prunes).
"""

from __future__ import annotations

from .tables import LedgerTable

__all__ = (
    "CONFLICTS_LIMIT",
    "STALE_AFTER",
    "conflicted_sql",
    "conflicts_sql",
    "define_sql",
    "stale_definitions_sql",
)

STALE_AFTER = 3600
"""Seconds after which the rows of a replica that is no member any more are deleted."""
CONFLICTS_LIMIT = 1000
"""Rows one read of a replica's conflicts (:func:`conflicts_sql`) returns at most."""


def define_sql(table: LedgerTable) -> str:
    """``$1`` holder, arrays ``$2`` jobs and ``$3`` their definitions: write this replica's
    definitions (rows already up to date are left alone). Sent when a replica starts and
    when a definition changes, a few hundred jobs a statement; the rows of replicas gone
    are deleted by the prune (:func:`stale_definitions_sql`), not here: a cleanup in every
    statement scanned the whole table each time (its ``clock_timestamp()`` can use no
    index), 100,000 rows taking 0.2-0.4 s a statement, on the session claims wait for."""
    return f"""
        INSERT INTO {table.definitions} AS d (job, holder, definition, noted_at)
        SELECT u.job, $1::text, u.definition, clock_timestamp()
        FROM unnest($2::text[], $3::text[]) AS u(job, definition)
        ON CONFLICT (job, holder) DO UPDATE
        SET definition = EXCLUDED.definition, noted_at = EXCLUDED.noted_at
        WHERE d.definition IS DISTINCT FROM EXCLUDED.definition"""


def stale_definitions_sql(table: LedgerTable) -> str:
    """``$1`` holder, ``$2`` a row limit: delete up to ``$2`` rows of replicas gone for
    :data:`STALE_AFTER` seconds (their members row expired that long ago, or was deleted,
    and the row was written before that); returns how many. Part of the prune (every few
    minutes). The replicas are found by a walk of the holder index, one probe per replica
    (a table of 50 replicas' 100,000 jobs each is 5,000,000 rows, none of them read), and
    only a gone replica's rows are visited."""
    defs, members = table.definitions, table.members
    return f"""
        WITH RECURSIVE holders(holder) AS (
            (SELECT s.holder FROM {defs} s ORDER BY s.holder LIMIT 1)
            UNION ALL
            SELECT (SELECT s.holder FROM {defs} s WHERE s.holder > h.holder
                    ORDER BY s.holder LIMIT 1)
            FROM holders h WHERE h.holder IS NOT NULL
        ), gone AS MATERIALIZED (
            SELECT h.holder FROM holders h
            WHERE h.holder IS NOT NULL AND h.holder <> $1::text
              AND NOT EXISTS (
                  SELECT FROM {members} m WHERE m.holder = h.holder
                    AND m.expires_at > now() - {STALE_AFTER} * interval '1 second')
        ), doomed AS (
            SELECT s.job, s.holder FROM gone g CROSS JOIN LATERAL (
                SELECT s.job, s.holder FROM {defs} s
                WHERE s.holder = g.holder
                  AND s.noted_at < now() - {STALE_AFTER} * interval '1 second'
                LIMIT $2::int) s
            LIMIT $2::int
        ), deleted AS (
            DELETE FROM {defs} s USING doomed d
            WHERE s.job = d.job AND s.holder = d.holder
            RETURNING 1
        )
        SELECT count(*) FROM deleted"""


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
    after = "now() - $2::float8 * interval '1 second'"  # stable: the noted_at index serves
    return f"""
        WITH live AS MATERIALIZED (
            SELECT m.holder, m.since FROM {members} m
            WHERE m.expires_at > clock_timestamp() AND m.holder <> $1::text
        ), pairs AS (
            SELECT o.job, o.holder, o.definition FROM live l JOIN {defs} o ON o.holder = l.holder
            WHERE o.noted_at > {after}
            UNION
            SELECT o.job, o.holder, o.definition
            FROM live l JOIN {defs} o ON o.holder = l.holder
            WHERE l.since > {after}
            UNION
            SELECT o.job, o.holder, o.definition
            FROM {defs} d JOIN live l ON true
            JOIN {defs} o ON o.job = d.job AND o.holder = l.holder
            WHERE d.holder = $1::text AND d.noted_at > {after}
            UNION
            SELECT o.job, o.holder, o.definition
            FROM live l JOIN {defs} o ON o.holder = l.holder
            WHERE o.job = ANY($3::text[])
        )
        SELECT p.job, p.holder, p.definition, d.definition AS mine
        FROM pairs p
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
