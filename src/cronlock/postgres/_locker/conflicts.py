"""Two definitions under one job name in one ledger: found, told once, shown.

Each replica writes its definition of each of its jobs (function and schedule) when it
starts and when one changes (:class:`._upkeep.LedgerUpkeep`); with its fleet reads, every
``RUNS_EVERY`` seconds (:class:`._fleetwatch.FleetWatch`), it reads the other live
replicas' definitions of its jobs that differ from its own (:func:`.._sql.definitions.
conflicts_sql`: only the rows written since its last read and those of the jobs already
in conflict, so a large fleet's reads stay small). Each other replica and definition of
a job is told once, at WARNING, naming both replicas; the end of a job's conflict at INFO.

Two services on one ledger (one table or schema) whose jobs share a name split that job's
slots between them, each believing all is well: the reason a service needs a ledger of its
own. A rolling deploy that changes a job shows the same for as long as old and new replicas
overlap, which is why the warning says so and ``status --check`` does not fail on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..._logs import at, get_logger
from .._conn.background import fetch_without_jit
from .._sql.definitions import CONFLICTS_LIMIT, conflicts_sql
from .._sql.tables import LedgerTable

__all__ = ("MARGIN", "ConflictWatch")

_logger = get_logger("cronlock.postgres")

MARGIN = 60.0
"""Seconds of rows read again on each read, on top of the time since the last one: a row
written (its ``noted_at``) just before a read, and committed after it, is read the next
time; a replica that writes before its first heartbeat is a member by then."""
_EVERYTHING = 1e9  # seconds: a replica's first read compares every job of its own


class ConflictWatch:
    """The conflicts of one locker's jobs (see the module): ``holder`` is the locker's
    name in the members table, which its definitions are written under."""

    def __init__(self, table: LedgerTable, holder: str) -> None:
        self._sql = conflicts_sql(table)
        self._holder = holder
        self._read_at: float | None = None  # loop time of the last read that succeeded
        # Per job in conflict: each other live replica and its definition, as told.
        self._known: dict[str, dict[str, str]] = {}
        self.reads = 0

    @property
    def conflicts(self) -> Mapping[str, frozenset[str]]:
        """Per job in conflict, the other live replicas that define it otherwise."""
        return {job: frozenset(others) for job, others in self._known.items()}

    async def read(
        self, fetch: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]], now: float
    ) -> Mapping[str, frozenset[str]]:
        """Read what may have changed at *now* (loop time) with *fetch* (runs a call on a
        session), tell what is new, and return :attr:`conflicts`."""
        window = _EVERYTHING if self._read_at is None else now - self._read_at + MARGIN
        known = list(self._known)
        sql, holder = self._sql, self._holder
        rows = await fetch(
            lambda c: fetch_without_jit(c, sql, holder, window, known, CONFLICTS_LIMIT)
        )
        self._read_at = now
        self.reads += 1
        found: dict[str, dict[str, str]] = {}
        mine: dict[str, str] = {}
        for row in rows:
            found.setdefault(row["job"], {})[row["holder"]] = row["definition"]
            mine[row["job"]] = row["mine"]
        if len(rows) >= CONFLICTS_LIMIT:
            # Cut short: a job not read again this time is not known to be resolved.
            for job, others in self._known.items():
                found.setdefault(job, others)
        self._tell(found, mine)
        self._known = found
        return self.conflicts

    def _tell(self, found: dict[str, dict[str, str]], mine: dict[str, str]) -> None:
        for job, others in found.items():
            told = self._known.get(job, {})
            for other, definition in others.items():
                if told.get(other) == definition:
                    continue
                _logger.warning(
                    "job %r has two definitions in the ledger: this replica (%s) runs %s, "
                    "replica %s runs %s. Its slots are split between them (or run by both). "
                    "Two services sharing one ledger: give each its own table or schema; "
                    "a rolling deploy that changed the job shows this until its old "
                    "replicas stop",
                    job,
                    self._holder,
                    mine.get(job, "?"),
                    other,
                    definition,
                    extra=at(job),
                )
        for job in self._known.keys() - found.keys():
            _logger.info(
                "job %r: one definition in the ledger again (the other replicas stopped, "
                "or now define it alike)",
                job,
                extra=at(job),
            )
