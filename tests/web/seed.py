"""Write a ledger the way replicas do (its own DDL, note and claim statements), for the
dashboard's request-level tests; the browser tests use real replica processes instead."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from cronlock.postgres._sql.schema import migrate
from cronlock.postgres._sql.tables import LedgerTable


@dataclass(frozen=True)
class Run:
    job: str
    slot: datetime
    outcome: str | None
    took: float = 0.5
    late: float = 0.01
    error: str | None = None
    host: str = "replica-a"
    pid: int = 4242


def table_name() -> str:
    """A ledger table of its own for one test."""
    return f"runs_{uuid.uuid4().hex[:10]}"


async def drop_ledger(dsn: str, table: str) -> None:
    """Drop every table of the ledger *table* (what ``migrate`` made)."""
    ledger = LedgerTable(table)
    conn: Any = await asyncpg.connect(dsn)
    try:
        for name in (ledger.runs, ledger.jobs, ledger.control, ledger.leases, ledger.members):
            await conn.execute(f"DROP TABLE IF EXISTS {name}")
        await conn.execute(
            f"DROP TABLE IF EXISTS {ledger.secrets}, {ledger.schedules}, {ledger.definitions}, "
            f"{ledger.slots}"
        )
    finally:
        await conn.close()


async def seed(
    dsn: str,
    table: str,
    notes: list[tuple[str, str, datetime | None]],
    runs: list[Run],
    graces: dict[str, tuple[float, datetime]] | None = None,
    *,
    alive: bool = True,
) -> LedgerTable:
    """Create the ledger *table* and write schedule notes and finished runs into it; with
    *alive*, a live replica's member row too (for an hour), as a running fleet has."""
    ledger = LedgerTable(table)
    conn: Any = await asyncpg.connect(dsn)
    try:
        await migrate(conn, ledger)
        if alive:
            await live_member(conn, ledger)
        if notes:
            await conn.execute(
                f"INSERT INTO {ledger.jobs} (job, schedule, next_run) "
                "SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[])",
                [n[0] for n in notes],
                [n[1] for n in notes],
                [n[2] for n in notes],
            )
        if graces:
            await set_graces(conn, ledger, graces)
        for run in runs:
            started = run.slot + timedelta(seconds=run.late)
            finished = None if run.outcome is None else started + timedelta(seconds=run.took)
            await conn.execute(
                f"INSERT INTO {ledger.runs} "
                "(job, slot, host, pid, started_at, finished_at, outcome, error) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                run.job,
                run.slot,
                run.host,
                run.pid,
                started,
                finished,
                run.outcome,
                run.error,
            )
    finally:
        await conn.close()
    return ledger


LIVE = "seed:live"
"""The holder of the replica :func:`live_member` writes."""


async def live_member(conn: Any, ledger: LedgerTable, hours: float = 1.0) -> None:
    """A replica of *ledger* alive for *hours*, as its heartbeat writes it."""
    await conn.execute(
        f"INSERT INTO {ledger.members} (holder, fleet, expires_at) "
        "VALUES ($2, 'seed', now() + $1::float8 * interval '1 hour')",
        hours,
        LIVE,
    )


async def set_graces(
    conn: Any, ledger: LedgerTable, graces: dict[str, tuple[float, datetime]]
) -> None:
    """Note each job's overdue grace and the slot it is due by, as replicas do."""
    for job, (grace, due) in graces.items():
        await conn.execute(
            f"UPDATE {ledger.jobs} SET grace = $2, due = $3 WHERE job = $1", job, grace, due
        )
