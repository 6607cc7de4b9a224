"""The statements of fleet-wide control: pause, resume and trigger a job on every replica.

The state lives in the ledger's control table (``<table>_control``, made by
:func:`.schema.migrate`). Replicas obey a pause in their claim statements (:mod:`.claims`,
:mod:`.leases`), and pick triggers up from the fleet watch's poll (:func:`poll_sql`).
"""

from __future__ import annotations

from .runs import LOW, RUN, sane
from .tables import LedgerTable

__all__ = (
    "known_job_sql",
    "pause_sql",
    "paused_sql",
    "poll_sql",
    "resume_sql",
    "retire_sql",
    "trigger_sql",
    "triggered_sql",
)

# A trigger slot is the server's time when it was asked for: one later than this was not
# written by FleetControl, and is reported (odd), never run.
_LATEST_TRIGGER = "clock_timestamp() + interval '5 minutes'"


def pause_sql(table: LedgerTable) -> str:
    """``$1`` job, ``$2`` who: pause the job fleet-wide. Pausing a paused job keeps the first
    pause's time."""
    return f"""
            INSERT INTO {table.control} AS c (job, paused_at, paused_by)
            VALUES ($1::text, clock_timestamp(), $2::text)
            ON CONFLICT (job) DO UPDATE
            SET paused_at = coalesce(c.paused_at, EXCLUDED.paused_at),
                paused_by = coalesce(c.paused_by, EXCLUDED.paused_by),
                updated_at = clock_timestamp()"""


def resume_sql(table: LedgerTable) -> str:
    """``$1`` job: end the job's fleet-wide pause, if any."""
    return f"""
            UPDATE {table.control} SET paused_at = NULL, paused_by = NULL,
                                 updated_at = clock_timestamp()
            WHERE job = $1::text AND paused_at IS NOT NULL"""


def trigger_sql(table: LedgerTable) -> str:
    """``$1`` job, ``$2`` who: ask for one run of the job now; answers the trigger slot.

    A trigger still pending is replaced: two requests, one run. The slot is truncated to
    milliseconds so that it reads back the same everywhere."""
    return f"""
            INSERT INTO {table.control} AS c (job, trigger_slot, triggered_by)
            VALUES ($1::text, date_trunc('milliseconds', clock_timestamp()), $2::text)
            ON CONFLICT (job) DO UPDATE
            SET trigger_slot = EXCLUDED.trigger_slot, triggered_by = EXCLUDED.triggered_by,
                updated_at = clock_timestamp()
            RETURNING trigger_slot"""


def retire_sql(table: LedgerTable) -> str:
    """``$1`` job, ``$2`` who: retire the job (its note marked; a job with runs but no note
    gets one, with no schedule): the readers leave it out until a replica notes it again."""
    return f"""
            INSERT INTO {table.jobs} AS j (job, schedule, next_run, retired_at, retired_by)
            VALUES ($1::text, '', NULL, clock_timestamp(), $2::text)
            ON CONFLICT (job) DO UPDATE
            SET retired_at = clock_timestamp(), retired_by = $2::text"""


def paused_sql(table: LedgerTable) -> str:
    """No parameters: the jobs paused fleet-wide, by name."""
    return f"SELECT job FROM {table.control} WHERE paused_at IS NOT NULL ORDER BY job"


def poll_sql(table: LedgerTable) -> str:
    """``$1`` seconds a trigger lives: what a replica polls, paused jobs and triggers.

    Triggers no replica has claimed yet (a claimed trigger has its row in the ledger) and
    that are not too old. A trigger slot is the server's time when it was asked for: one
    later than now (plus a margin) or before the year 1 was not written by FleetControl,
    and is reported (*odd*), never run."""
    return f"""
            SELECT c.job, c.paused_at IS NOT NULL AS paused,
                   CASE WHEN c.trigger_slot > clock_timestamp() - $1::float8 * interval '1 s'
                         AND c.trigger_slot <= {_LATEST_TRIGGER}
                         AND NOT EXISTS (SELECT 1 FROM {table.runs} r
                                         WHERE r.job = c.job AND r.slot = c.trigger_slot)
                        THEN c.trigger_slot END AS trigger_slot,
                   CASE WHEN c.trigger_slot > {_LATEST_TRIGGER} OR c.trigger_slot < {LOW}
                        THEN c.trigger_slot::text END AS odd
            FROM {table.control} c
            WHERE c.paused_at IS NOT NULL OR c.trigger_slot IS NOT NULL"""


def known_job_sql(table: LedgerTable) -> str:
    """``$1`` job: whether the ledger knows it (a replica noted its schedule or claimed a
    slot of it)."""
    return f"""SELECT EXISTS (SELECT 1 FROM {table.jobs} WHERE job = $1::text)
                    OR EXISTS (SELECT 1 FROM {table.runs} WHERE job = $1::text)"""


def triggered_sql(table: LedgerTable) -> str:
    """``$1`` job, ``$2`` slot: the trigger's run, if claimed, and the trigger pending now
    (a later one replaces an unclaimed earlier one: two requests, one run)."""
    control, runs = table.control, table.runs
    return f"""SELECT {sane("c.trigger_slot", "pending")}, r.*
    FROM (SELECT 1) one
    LEFT JOIN {control} c ON c.job = $1::text
    LEFT JOIN LATERAL (SELECT {RUN} FROM {runs} WHERE job = $1::text AND slot = $2) r ON true"""
