"""The stored schedules' table (``<table>_schedules``; see :mod:`._storedsql`)."""

from __future__ import annotations

__all__ = ("schedules_ddl",)


def schedules_ddl(schedules: str, index: str) -> list[str]:
    """The statements that create the stored schedules' table *schedules* (quoted and
    qualified) and its revision index *index* (quoted), each idempotent."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {schedules} (
            name             text        PRIMARY KEY,
            revision         bigint      NOT NULL,
            removed          boolean     NOT NULL DEFAULT false,
            task             text        NOT NULL,
            schedule         jsonb       NOT NULL,
            kwargs           jsonb       NOT NULL DEFAULT '{{}}',
            options          jsonb       NOT NULL DEFAULT '{{}}',
            updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
            updated_by       text,
            problems         jsonb,
            problem_revision bigint
        )""",
        f"CREATE INDEX IF NOT EXISTS {index} ON {schedules} (revision)",
    ]
