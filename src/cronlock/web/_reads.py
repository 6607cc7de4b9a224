"""The dashboard's reads of the ledger: the fleet reads of :mod:`cronlock.postgres._ops.fleet`
(the same the ``status`` and ``history`` verbs use), through a connection that makes
every row decodable and bounded.

Any writer may have put odd values in the ledger, and one row must not take down every
page: an instant Python cannot hold (``infinity``, a year BC, or so close to year 9999 that
the pages' arithmetic would overflow) comes back as ``NULL``, which the pages show as
"invalid" where a value is required, and a run's error text comes back as a prefix of
:data:`ERROR_PREFIX` characters (the pages show its first line only; a 2 MiB traceback is
not fetched whole for that). The reads' own statements are wrapped, not copied: each is
run as a subquery whose columns are filtered, so the rows, their order and their
meaning stay those of the fleet reads.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..postgres._sql.fleet import bounded_sql, jobs_sql, named_jobs_sql
from ..postgres._sql.runs import (
    HISTORY_COLUMNS,
    RUN_COLUMNS,
    history_sql,
    last_runs_many_sql,
    last_runs_sql,
    runs_page_sql,
)
from ..postgres._sql.tables import LedgerTable

__all__ = ("ERROR_PREFIX", "SafeReads")

ERROR_PREFIX = 2000
"""Characters of a run's error text fetched (the pages show at most its first line)."""
_NOTE_PREFIX = 500  # a schedule note is one short line; a longer one is shown cut
# How a job's slots are rebuilt: a few hundred characters as cronlock writes it; a longer
# one (a hostile row) is cut, so not read, and the job judged by its note alone.
_SPEC_PREFIX = 4000
# A slot's earlier attempts, as JSON text: a few hundred characters per attempt as cronlock
# writes them; a longer text (a hostile row) is cut, so not read, and the run shown alone.
_ATTEMPTS_PREFIX = 200_000
# Within these, every instant the pages compute from (a next slot a day on, a zone's
# offset) is still a datetime.
_EARLIEST = "0001-01-03 00:00:00+00"
_LATEST = "9999-12-29 00:00:00+00"
_INSTANTS = frozenset({"slot", "started_at", "finished_at", "next_run", "updated_at", "due"})


def _wrapped(sql: str, columns: tuple[str, ...], order: str = "") -> str:
    return bounded_sql(
        sql,
        columns,
        order,
        instants=_INSTANTS,
        earliest=_EARLIEST,
        latest=_LATEST,
        prefixes={
            "error": ERROR_PREFIX,
            "schedule": _NOTE_PREFIX,
            "attempts": _ATTEMPTS_PREFIX,
            "spec": _SPEC_PREFIX,
        },
    )


@lru_cache(maxsize=32)
def rewrites(table: LedgerTable) -> dict[str, str]:
    """Each fleet read of *table* that returns instants or error texts, and what runs
    instead (made once per table). Another statement is run as it is."""
    jobs = ("job", "schedule", "tags", "next_run", "updated_at", "grace", "due", "odd", "spec")
    every, named = jobs_sql(table), named_jobs_sql(table)
    last, many = last_runs_sql(table), last_runs_many_sql(table)
    history, page = history_sql(table), runs_page_sql(table)
    return {
        every: _wrapped(every, jobs, " ORDER BY 1"),
        named: _wrapped(named, jobs),
        last: _wrapped(last, ("kind", *RUN_COLUMNS)),
        many: _wrapped(many, ("job", "kind", *RUN_COLUMNS)),
        history: _wrapped(history, HISTORY_COLUMNS, " ORDER BY q.slot DESC"),
        page: _wrapped(page, HISTORY_COLUMNS, " ORDER BY q.slot DESC"),
    }


class SafeReads:
    """*conn* for the fleet reads, each row decodable and bounded (see the module)."""

    def __init__(self, conn: Any, table: LedgerTable) -> None:
        self._conn = conn
        self._rewrites = rewrites(table)

    async def fetch(self, sql: str, *args: Any) -> Any:
        """``conn.fetch`` of the statement that stands for *sql*."""
        return await self._conn.fetch(self._rewrites.get(sql, sql), *args)

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        """``conn.fetchrow``, as it is (no fleet read of one row returns an odd value)."""
        return await self._conn.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """``conn.fetchval``, as it is (no fleet read of one value returns an odd one)."""
        return await self._conn.fetchval(sql, *args)
