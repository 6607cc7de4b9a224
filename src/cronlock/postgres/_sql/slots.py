"""The statements of the slots' fates (DESIGN.md §3a): the records of the slots that did
not run, and what ``python -m cronlock history JOB --slots`` reads.

A record names a range of one job's slots (``slot`` to ``last_slot``, both included), its
fate (``coalesced`` into ``into_slot``, ``missed``, ``skipped``) and the reason, written by
the replica that decided it. A long outage is one row, not a row a slot. The first record
of a range's first slot stands; a slot that has a run in the runs table ran, whatever a
record says (a replica that fell behind may record slots the fleet ran meanwhile).
"""

from __future__ import annotations

from .runs import sane
from .tables import LedgerTable

__all__ = (
    "job_spec_sql",
    "prune_slots_sql",
    "recent_slot_records_sql",
    "record_slots_sql",
    "slot_records_sql",
    "slot_runs_sql",
)


def record_slots_sql(table: LedgerTable) -> str:
    """Record fates; arrays ``$1`` jobs, ``$2`` first slots, ``$3`` last slots, ``$4``
    fates, ``$5`` reasons, ``$6`` the slots they coalesced into (or NULL); ``$7`` who
    records them. A range whose first slot has a record already is left as it is."""
    return f"""
        INSERT INTO {table.slots} AS s
            (job, slot, last_slot, fate, reason, into_slot, holder)
        SELECT u.job, u.slot, u.last_slot, u.fate, u.reason, u.into_slot, $7::text
        FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::text[],
                    $5::text[], $6::timestamptz[])
             AS u(job, slot, last_slot, fate, reason, into_slot)
        ON CONFLICT (job, slot) DO NOTHING"""


def prune_slots_sql(table: LedgerTable) -> str:
    """Delete up to ``$2`` records whose last slot is older than ``$1`` seconds ago (the
    runs' retention); the number deleted."""
    return f"""
        WITH doomed AS (
            SELECT s.job, s.slot FROM {table.slots} s
            WHERE s.last_slot < clock_timestamp() - $1::float8 * interval '1 second'
            LIMIT $2
        ), gone AS (
            DELETE FROM {table.slots} s USING doomed d
            WHERE s.job = d.job AND s.slot = d.slot
            RETURNING 1
        )
        SELECT count(*) FROM gone"""


def job_spec_sql(table: LedgerTable) -> str:
    """``$1`` a job: its row of notes (``spec``, ``first_seen``, ``retired_at``,
    ``schedule``) and the server's time (``now``); no row for a job never noted."""
    return f"""
        SELECT j.spec::text AS spec, j.first_seen, j.retired_at, j.schedule,
               clock_timestamp() AS now
        FROM {table.jobs} j WHERE j.job = $1"""


def slot_runs_sql(table: LedgerTable) -> str:
    """``$1`` a job, ``$2`` .. ``$3`` a window: its runs with a slot in it, oldest first."""
    return f"""
        SELECT slot, started_at, finished_at, outcome, error, attempt, manual, host, pid
        FROM {table.runs}
        WHERE job = $1 AND slot >= $2 AND slot <= $3
        ORDER BY slot"""


def slot_records_sql(table: LedgerTable) -> str:
    """``$1`` a job, ``$2`` .. ``$3`` a window: the records of ranges that overlap it,
    the earliest recorded first."""
    return f"""
        SELECT slot, last_slot, fate, reason, into_slot, holder, recorded_at
        FROM {table.slots}
        WHERE job = $1 AND last_slot >= $2 AND slot <= $3
        ORDER BY recorded_at, slot"""


def recent_slot_records_sql(table: LedgerTable) -> str:
    """``$1`` a job, ``$2`` how many: its latest records of slots that did not run, the
    latest slot first (the dashboard's job page), every instant Python cannot hold read as
    NULL and the reason cut to 500 characters."""
    return f"""
        SELECT {sane("s.slot", "slot")}, {sane("s.last_slot", "last_slot")}, s.fate,
               substr(s.reason, 1, 500) AS reason, {sane("s.into_slot", "into_slot")},
               substr(s.holder, 1, 200) AS holder
        FROM {table.slots} s
        WHERE s.job = $1
        ORDER BY s.slot DESC
        LIMIT $2"""
