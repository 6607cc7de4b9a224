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

from ..postgres._ops.fleet import _page_sql as page_sql  # the fleet read of a page of runs
from ..postgres._ops.fleet import last_runs_many_sql, named_jobs_sql
from ..postgres._sql.runs import RUN_COLUMNS
from ..postgres._sql.tables import LedgerTable

__all__ = ("ERROR_PREFIX", "SafeReads")

ERROR_PREFIX = 2000
"""Characters of a run's error text fetched (the pages show at most its first line)."""
_NOTE_PREFIX = 500  # a schedule note is one short line; a longer one is shown cut
# Within these, every instant the pages compute from (a next slot a day on, a zone's
# offset) is still a datetime.
_EARLIEST = "0001-01-03 00:00:00+00"
_LATEST = "9999-12-29 00:00:00+00"
_INSTANTS = frozenset({"slot", "started_at", "finished_at", "next_run", "updated_at", "due"})


def _column(name: str) -> str:
    source = f"q.{name}"
    if name in _INSTANTS:
        return (
            f"CASE WHEN isfinite({source}) AND {source} BETWEEN '{_EARLIEST}'::timestamptz "
            f"AND '{_LATEST}'::timestamptz THEN {source} END AS {name}"
        )
    if name == "error":
        return f"substr({source}, 1, {ERROR_PREFIX}) AS {name}"
    if name == "schedule":
        return f"substr({source}, 1, {_NOTE_PREFIX}) AS {name}"
    return source


def _wrapped(sql: str, columns: tuple[str, ...], order: str = "") -> str:
    select = ", ".join(_column(name) for name in columns)
    return f"SELECT {select} FROM ({sql}) AS q{order}"


@lru_cache(maxsize=32)
def rewrites(table: LedgerTable) -> dict[str, str]:
    """Each fleet read of *table* that returns instants or error texts, and what runs
    instead (made once per table). Another statement is run as it is."""
    jobs = ("job", "schedule", "tags", "next_run", "updated_at", "grace", "due", "odd")
    many, named = last_runs_many_sql(table), named_jobs_sql(table)
    return {
        table.jobs_sql: _wrapped(table.jobs_sql, jobs, " ORDER BY 1"),
        named: _wrapped(named, jobs),
        table.last_runs_sql: _wrapped(table.last_runs_sql, ("kind", *RUN_COLUMNS)),
        many: _wrapped(many, ("job", "kind", *RUN_COLUMNS)),
        table.history_sql: _wrapped(table.history_sql, RUN_COLUMNS, " ORDER BY q.slot DESC"),
        page_sql(table): _wrapped(page_sql(table), RUN_COLUMNS, " ORDER BY q.slot DESC"),
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
