"""Each job's first-seen instant in the ledger's jobs table: when a replica first noted it.

A job that never succeeded has gone without success since then (``without_success_since``),
however often its replicas restarted. The column's default sets it when a row is inserted
(by any cronlock, older ones included) and nothing updates it afterwards.
"""

from __future__ import annotations

from .decode import slot_in_range

__all__ = ("first_seen_ddl", "first_seen_sql")


def first_seen_ddl(jobs: str, runs: str) -> list[str]:
    """The idempotent statements that add ``first_seen`` to the quoted *jobs* table.

    Rows that predate the column are filled once, with the earlier of their job's oldest
    run still in the *runs* table (its start) and the row's last note: the job existed then.
    """
    oldest = f"SELECT r.started_at FROM {runs} r WHERE r.job = j.job ORDER BY r.slot LIMIT 1"
    return [
        f"ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS first_seen timestamptz",
        f"""UPDATE {jobs} AS j SET first_seen = least(({oldest}), j.updated_at)
            WHERE j.first_seen IS NULL""",
        f"ALTER TABLE {jobs} ALTER COLUMN first_seen SET DEFAULT clock_timestamp()",
    ]


def first_seen_sql(jobs: str) -> str:
    """``$1`` job names: the first-seen instant of those of them the quoted *jobs* table has
    (one Python cannot hold, a hostile row's, is left out: the replica counts from its start)."""
    return f"""SELECT job, first_seen FROM {jobs}
               WHERE job = ANY($1::text[]) AND {slot_in_range("first_seen")}"""
