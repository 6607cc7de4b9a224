"""The write-back after a new primary (``cronlock.postgres._sql.failover.reassert_sql``), in
the simulated server. (Which server this is, ``SERVER_SQL``, is in :mod:`.session`; lease
mode's ``lease_reassert_sql`` is in :mod:`.leases`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from ...postgres._sql import failover
from ..rows import Row, rows
from .upkeep import unnest

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec
    from .registry import Statements

__all__ = ("register",)


def register(statements: Statements, table: LedgerTable) -> None:
    """Add this module's handlers."""
    statements.add(failover.reassert_sql(table), _reassert)


def _reassert(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``reassert_sql``: write back this replica's recent runs where the ledger lacks them.

    Every CTE reads the rows as they were before the statement: a slot with no row gets
    this replica's (``restored``; a second entry of one slot does nothing, ``ON CONFLICT DO
    NOTHING``); this holder's own unfinished row, that existed before, of the slot's latest
    attempt remembered here or an earlier one, gets that attempt's outcome (``finished``).
    Answered: the entries whose slot had no row, those another holder has at the same
    attempt (``other``), and those finished here.
    """
    jobs, slots, attempts, started, finished, outcomes, errors, host, pid, holder = args
    m = [
        (i, *values)
        for i, values in enumerate(
            unnest(jobs, slots, attempts, started, finished, outcomes, errors), start=1
        )
    ]
    runs = x.db.table("runs")
    old = {i: dict(runs[job, slot]) for i, job, slot, *_ in m if (job, slot) in runs}

    # ins: the entries whose slot had no row, in (job, slot) order.
    inserted: set[tuple[str, Any]] = set()
    absent = [e for e in m if e[0] not in old]
    for _, job, slot, attempt, began, ended, outcome, error in sorted(
        absent, key=lambda e: (e[1], e[2])
    ):
        if (job, slot) in inserted:
            continue  # ON CONFLICT DO NOTHING: the first entry's row stands
        if job is None or slot is None or began is None or attempt is None:
            raise asyncpg.NotNullViolationError("null value violates not-null constraint")
        x.db.put(
            "runs",
            (job, slot),
            {
                "job": job,
                "slot": slot,
                "host": host,
                "pid": pid,
                "started_at": began,
                "finished_at": ended,
                "outcome": outcome,
                "error": error,
                "session": None,
                "attempt": attempt,
                "manual": False,
                "holder": holder,
                "attempts": None,
                "retry_at": None,
            },
        )
        inserted.add((job, slot))

    # upd: this holder's unfinished rows (as they were) of the slot's latest attempt
    # remembered, or of an earlier one, get that attempt's outcome (and the attempt).
    latest: dict[tuple[Any, Any], Any] = {}
    for _, job, slot, attempt, *_ in m:
        if attempt is not None and (latest.get((job, slot)) is None or attempt > latest[job, slot]):
            latest[job, slot] = attempt
    updated: set[tuple[str, Any]] = set()
    for i, job, slot, attempt, began, ended, outcome, error in m:
        before = old.get(i)
        if before is None or (job, slot) in updated or holder is None:
            continue
        if (
            before["holder"] == holder
            and attempt is not None
            and before["attempt"] <= attempt
            and attempt == latest.get((job, slot))
            and before["finished_at"] is None
            and ended is not None
        ):
            x.db.update(
                "runs",
                (job, slot),
                finished_at=ended,
                outcome=outcome,
                error=error,
                started_at=began if before["attempt"] < attempt else before["started_at"],
                attempt=attempt,
            )
            updated.add((job, slot))

    answer = []
    for i, job, slot, attempt, *_ in m:
        before = old.get(i)
        other = None
        twice = False
        if before is not None and before["holder"] != holder and before["attempt"] == attempt:
            twice = True
            other = before["holder"]
            if other is None:
                other = f"{before['host']}:{before['pid']}"
        done = (job, slot) in updated
        if before is None or twice or done:
            answer.append((i, (job, slot) in inserted, done, other))
    return rows(["i", "restored", "finished", "other"], *answer)
