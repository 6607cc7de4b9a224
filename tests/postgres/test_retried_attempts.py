"""Every attempt of a retried slot stays in the ledger (issue 36, finding 8).

A retry claims its slot by taking the failed row over (``_sql/crashes.TAKEN_OVER``): the
row is the latest attempt's. Before, that overwrote the earlier attempts' outcome, error
and times, so ``history`` after a slot failed twice then succeeded showed one success. The
takeover now appends the attempt it replaces to the row's ``attempts``; the history reads
(the locker's, the command line's, the dashboard's) give them back, in both modes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from cronlock import RunContext, RunRecord, Scheduler, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._ops.fleet import read_runs
from cronlock.postgres._sql.schema import ledger_state, migrate
from cronlock.postgres._sql.tables import DEFAULT_TABLE, LedgerTable, quote_ident

pytestmark = pytest.mark.postgres

Mode = Literal["session", "lease"]


@pytest.fixture
async def schema(admin: Any) -> AsyncIterator[str]:
    name = f"attempts {uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")


async def _fail_twice_then_succeed(
    pg_dsn: str, schema: str, mode: Mode, app_name: str
) -> list[int]:
    """Run job ``flaky`` (retries=2) once: its task fails on attempts 1 and 2. Returns the
    attempts the task was told."""
    told: list[int] = []
    done = asyncio.Event()

    async def flaky(ctx: RunContext) -> None:
        told.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError(f"down on attempt {ctx.attempt}")
        done.set()

    locker = PostgresLocker(pg_dsn, schema=schema, mode=mode, application_name=app_name)
    scheduler = Scheduler(locker=locker)
    scheduler.add_job(flaky, every(3600), name="flaky", retries=2, retry_delay=0.1)
    async with scheduler:
        await scheduler.get_job("flaky").run_now()
        await asyncio.wait_for(done.wait(), timeout=60)
        while True:  # the third attempt's outcome is written with its release
            [run] = await locker.history("flaky", 5)
            if run.outcome != "unfinished":
                break
            await asyncio.sleep(0.05)
    return told


def _tries(run: RunRecord) -> list[tuple[int, str, str | None]]:
    return [(r.attempt, r.outcome, r.error) for r in (*run.attempts, run)]


EXPECTED = [
    (1, "failed", "RuntimeError: down on attempt 1"),
    (2, "failed", "RuntimeError: down on attempt 2"),
    (3, "succeeded", None),
]


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_history_shows_every_attempt_of_a_retried_slot(
    pg_dsn: str, admin: Any, schema: str, mode: Mode, app_name: str
) -> None:
    told = await _fail_twice_then_succeed(pg_dsn, schema, mode, app_name)
    assert told == [1, 2, 3]
    table = LedgerTable(DEFAULT_TABLE, schema)
    async with PostgresLocker(
        pg_dsn, schema=schema, mode=mode, application_name=app_name
    ) as locker:
        [run] = await locker.history("flaky", 5)
    assert _tries(run) == EXPECTED
    first, second = run.attempts
    assert {r.slot for r in (first, second, run)} == {run.slot}
    assert first.finished_at is not None and second.finished_at is not None
    assert first.started_at <= first.finished_at <= second.started_at <= second.finished_at
    assert second.finished_at <= run.started_at
    assert first.owner == second.owner == run.owner and not first.attempts
    # The fleet read (the command line's and the dashboard's) gives the same.
    [read] = await read_runs(admin, table, "flaky", 5)
    assert _tries(read) == EXPECTED
    # The command line: one line per attempt, the latest first.
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cronlock", "history", "flaky", "--dsn", pg_dsn, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()[2:]
    assert len(lines) == 3
    assert "succeeded (attempt 3)" in lines[0]
    assert "failed (attempt 2)" in lines[1] and "RuntimeError: down on attempt 2" in lines[1]
    assert "failed (attempt 1)" in lines[2] and "RuntimeError: down on attempt 1" in lines[2]


async def test_an_older_ledger_gets_the_attempts_column_and_older_takeovers_still_work(
    admin: Any, schema: str
) -> None:
    table = LedgerTable(DEFAULT_TABLE, schema)
    assert await migrate(admin, table) == "created"
    await admin.execute(f"ALTER TABLE {table.runs} DROP COLUMN attempts")
    assert await ledger_state(admin, table) == "old"
    assert await migrate(admin, table) == "upgraded"
    assert await ledger_state(admin, table) == "current"
    slot = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
    await admin.execute(
        f"INSERT INTO {table.runs} (job, slot, host, pid, started_at, finished_at, outcome,"
        " error) VALUES ('j', $1, 'old', 1, $1, $1, 'failed', 'E: one')",
        slot,
    )
    # An older cronlock's retry takes the row over without knowing the column: the row
    # is its attempt 2, read with no earlier attempts (not an error).
    await admin.execute(
        f"UPDATE {table.runs} SET host = 'old', pid = 2, started_at = clock_timestamp(),"
        " finished_at = clock_timestamp(), outcome = 'succeeded', error = NULL, attempt = 2"
        " WHERE job = 'j'"
    )
    [run] = await read_runs(admin, table, "j", 5)
    assert (run.attempt, run.outcome, run.attempts) == (2, "succeeded", ())


async def test_attempts_no_replica_can_read_are_left_out_not_fatal(admin: Any, schema: str) -> None:
    table = LedgerTable(DEFAULT_TABLE, schema)
    assert await migrate(admin, table) == "created"
    slot = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
    good = '{"attempt": 1, "started_at": "2030-01-01T04:00:00+01:00", "outcome": "failed"}'
    for job, attempts in [
        ("odd-list", '"not a list"'),
        ("odd-entry", f'[{{"attempt": 1, "started_at": "infinity"}}, {good}, 7]'),
    ]:
        await admin.execute(
            f"INSERT INTO {table.runs} (job, slot, host, pid, started_at, finished_at,"
            " outcome, attempt, attempts) VALUES ($1, $2, 'h', 1, $2, $2, 'succeeded', 2, $3)",
            job,
            slot,
            attempts,
        )
    [odd_list] = await read_runs(admin, table, "odd-list", 5)
    assert (odd_list.outcome, odd_list.attempts) == ("succeeded", ())
    [odd_entry] = await read_runs(admin, table, "odd-entry", 5)
    [kept] = odd_entry.attempts
    assert (kept.attempt, kept.outcome, kept.started_at) == (1, "failed", slot)
