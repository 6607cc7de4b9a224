"""A new primary: which server this is, and what a replica writes back after a failover.

A standby promoted after a crash holds what it had received: with asynchronous replication
the last claims, outcomes and lease releases the old primary acknowledged may be missing.
Each new connection reads :data:`SERVER_SQL`; a replica that finds another server than
before (another system, or the same one on a later timeline) writes back what it
remembers of its recent runs (:func:`reassert_sql`) and, in lease mode, puts its lease rows
right (:func:`lease_reassert_sql`): ``_locker/failover.py``.
"""

from __future__ import annotations

from .tables import LedgerTable

__all__ = ("SERVER_SQL", "lease_reassert_sql", "reassert_sql")

SERVER_SQL = """
    SELECT CASE WHEN has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')
                THEN (SELECT system_identifier FROM pg_catalog.pg_control_system()) END
               AS system,
           CASE WHEN NOT pg_is_in_recovery()
                THEN substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END AS timeline,
           pg_postmaster_start_time() AS started"""
"""Which server this is: ``system`` (the cluster's system identifier, shared by a primary
and the standbys copied from it; ``NULL`` where the role may not read it), ``timeline``
(the current WAL timeline, in hex: a promotion starts a new one) and ``started`` (when its
postmaster started: a restart, such as one onto a restored snapshot, changes it)."""


def reassert_sql(table: LedgerTable) -> str:
    """Write back this replica's recent runs where the ledger lacks them.

    Arrays ``$1`` jobs, ``$2`` slots, ``$3`` attempts, ``$4`` started, ``$5`` finished (NULL:
    in flight), ``$6`` outcomes, ``$7`` errors; ``$8`` host, ``$9`` pid, ``$10`` holder. A
    slot with no row gets this replica's (``restored``); this replica's own row still
    unfinished gets the outcome (``finished``) of the slot's latest attempt remembered here,
    with that attempt, when the row is of that attempt or an earlier one (a retry's or a
    rerun's takeover the server lost: the row would otherwise stay unfinished for good).
    Answers the rows that changed, and those another holder has for the same attempt
    (``other``, ``other_host``, ``other_pid``): a slot that ran twice, here and there.
    """
    runs = table.runs
    return f"""
        WITH m AS MATERIALIZED (
            SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::smallint[],
                                 $4::timestamptz[], $5::timestamptz[], $6::text[], $7::text[])
                WITH ORDINALITY AS m(job, slot, attempt, started_at, finished_at, outcome,
                                     error, i)
        ), old AS MATERIALIZED (
            SELECT m.i, r.holder, r.host, r.pid, r.attempt
            FROM m JOIN {runs} r ON r.job = m.job AND r.slot = m.slot
        ), ins AS (
            INSERT INTO {runs} (job, slot, host, pid, started_at, finished_at, outcome,
                                error, attempt, holder)
            SELECT m.job, m.slot, $8::text, $9::integer, m.started_at, m.finished_at,
                   m.outcome, m.error, m.attempt, $10::text
            FROM m WHERE NOT EXISTS (SELECT 1 FROM old WHERE old.i = m.i)
            ORDER BY m.job, m.slot
            ON CONFLICT (job, slot) DO NOTHING
            RETURNING job, slot
        ), upd AS (
            UPDATE {runs} r
            SET finished_at = m.finished_at, outcome = m.outcome, error = m.error,
                started_at = CASE WHEN r.attempt < m.attempt THEN m.started_at
                                  ELSE r.started_at END,
                attempt = m.attempt
            FROM m
            WHERE r.job = m.job AND r.slot = m.slot AND r.holder = $10::text
              AND r.attempt <= m.attempt AND r.finished_at IS NULL
              AND m.finished_at IS NOT NULL
              AND m.attempt = (SELECT max(l.attempt) FROM m l
                               WHERE l.job = m.job AND l.slot = m.slot)
            RETURNING r.job, r.slot
        )
        SELECT m.i,
               EXISTS (SELECT 1 FROM ins WHERE ins.job = m.job AND ins.slot = m.slot)
                   AS restored,
               EXISTS (SELECT 1 FROM upd WHERE upd.job = m.job AND upd.slot = m.slot)
                   AS finished,
               CASE WHEN old.holder IS DISTINCT FROM $10::text AND old.attempt = m.attempt
                    THEN coalesce(old.holder, old.host || ':' || old.pid) END AS other
        FROM m LEFT JOIN old ON old.i = m.i
        WHERE old.i IS NULL
           OR (old.holder IS DISTINCT FROM $10::text AND old.attempt = m.attempt)
           OR EXISTS (SELECT 1 FROM upd WHERE upd.job = m.job AND upd.slot = m.slot)"""


def lease_reassert_sql(table: LedgerTable) -> str:
    """Lease mode: put this replica's lease rows right on a new primary.

    ``$1`` holder; arrays ``$2`` jobs, ``$3`` slots, ``$4`` attempts of the runs in flight
    here; ``$5`` lease seconds; arrays ``$6`` jobs, ``$7`` slots, ``$8`` attempts of the
    runs that ended here. A live lease of this holder for the very run that ended here
    (job, slot and attempt) is released (its release was lost: it would hold the job off
    until it expired); no other lease is: one granted after the lists were made (a claim
    answered while this statement waited, its run started since) stands on a live run.
    The runs in flight get their lease back, unless another holder has a live one.
    Answers ``released`` (how many) and ``kept`` (the jobs whose lease is this holder's
    now).
    """
    leases = table.leases
    return f"""
        WITH held AS MATERIALIZED (
            SELECT * FROM unnest($2::text[], $3::timestamptz[], $4::smallint[])
                AS h(job, slot, attempt)
        ), freed AS (
            UPDATE {leases} x SET expires_at = '-infinity'
            FROM unnest($6::text[], $7::timestamptz[], $8::smallint[]) AS e(job, slot, attempt)
            WHERE x.holder = $1::text AND x.expires_at > clock_timestamp()
              AND x.job = e.job AND x.slot = e.slot AND x.attempt = e.attempt
              AND NOT EXISTS (SELECT 1 FROM held WHERE held.job = x.job)
            RETURNING x.job
        ), kept AS (
            INSERT INTO {leases} AS x (job, slot, holder, expires_at, attempt)
            SELECT held.job, held.slot, $1::text,
                   clock_timestamp() + $5::float8 * interval '1 second', held.attempt
            FROM held ORDER BY held.job
            ON CONFLICT (job) DO UPDATE
            SET slot = EXCLUDED.slot, holder = EXCLUDED.holder,
                expires_at = EXCLUDED.expires_at, attempt = EXCLUDED.attempt
            WHERE x.holder = EXCLUDED.holder OR x.expires_at <= clock_timestamp()
            RETURNING x.job
        )
        SELECT (SELECT count(*) FROM freed) AS released,
               coalesce((SELECT array_agg(job) FROM kept), '{{}}') AS kept"""
