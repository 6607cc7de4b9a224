"""'No success in N days' against the real server: a job that never succeeded is judged
from when the ledger first saw it, across restarts; after a success, from that run's end,
on every replica; the gauge says the same; an older ledger's jobs get a first-seen instant."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from cronlock import JobSucceeded, Schedule, Scheduler, daily
from cronlock.postgres import PostgresLocker
from cronlock.postgres._locker import fleetwatch as _control
from cronlock.postgres._locker import upkeep as _upkeep
from cronlock.postgres._sql.schema import ledger_state, migrate
from cronlock.postgres._sql.tables import LedgerTable, quote_ident
from cronlock.prometheus import instrument

from ..eventually import eventually

pytestmark = pytest.mark.postgres

GAUGE = "cronlock_job_without_success_since_timestamp_seconds"


@pytest.fixture
async def table(admin: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LedgerTable]:
    """A ledger in a schema of this test's own, dropped afterwards; notes written and the
    fleet's runs read within a fraction of a second."""
    monkeypatch.setattr(_upkeep, "NOTE_EVERY", 0.05)
    monkeypatch.setattr(_control, "RUNS_EVERY", 0.2)
    table = LedgerTable("runs", schema=f"no_success_{uuid.uuid4().hex[:10]}")
    try:
        yield table
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(table.schema or '')} CASCADE")


def replica(pg_dsn: str, table: LedgerTable, schedule: Schedule | None = None) -> Scheduler:
    """A scheduler on *table* with the job ``nightly`` (never due during a test)."""
    locker = PostgresLocker(pg_dsn, table=table.table, schema=table.schema)
    scheduler = Scheduler(locker=locker, stop_timeout=5)
    scheduler.add_job(lambda: None, schedule or daily("03:00"), name="nightly")
    return scheduler


async def note(admin: Any, table: LedgerTable) -> Any:
    """The job's row in the jobs table, once a replica wrote it."""
    sql = f"SELECT schedule, updated_at, first_seen FROM {table.jobs} WHERE job = 'nightly'"
    found: list[Any] = []

    async def read() -> None:
        try:
            found[:] = [await admin.fetchrow(sql)]
        except asyncpg.UndefinedTableError:  # the locker opens its sessions (and the
            found[:] = [None]  # ledger) when its first slot is near: not yet

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    await read()
    while found[0] is None:
        if loop.time() > deadline:
            pytest.fail("the job was never noted")
        await asyncio.sleep(0.05)
        await read()
    return found[0]


async def test_a_job_that_never_succeeded_counts_from_its_first_note_across_restarts(
    pg_dsn: str, admin: Any, table: LedgerTable
) -> None:
    first = replica(pg_dsn, table)
    async with first:
        noted = await note(admin, table)
        seen = noted["first_seen"]
        assert seen is not None
        await eventually(
            lambda: first.without_success_since("nightly") == seen, "first seen", limit=90
        )
    # A restart, later, with another schedule (so its note is written again): it still
    # counts from the first note, not from its own start.
    restarted = datetime.now(UTC)
    assert seen < restarted
    second = replica(pg_dsn, table, daily("04:00"))
    registry = CollectorRegistry()
    instrument(second, registry)
    async with second:
        await eventually(
            lambda: second.without_success_since("nightly") == seen,
            "first seen after a restart",
            limit=90,
        )
        assert registry.get_sample_value(GAUGE, {"cronlock_job": "nightly"}) == seen.timestamp()
        while (row := await note(admin, table))["schedule"] == noted["schedule"]:
            await asyncio.sleep(0.05)
        assert row["updated_at"] > noted["updated_at"]
        assert row["first_seen"] == seen  # the note's update leaves it alone


async def test_after_a_success_every_replica_counts_from_its_end(
    pg_dsn: str, admin: Any, table: LedgerTable
) -> None:
    runner, watcher = replica(pg_dsn, table), replica(pg_dsn, table)
    registry = CollectorRegistry()
    instrument(watcher, registry)
    async with runner, watcher:
        seen = (await note(admin, table))["first_seen"]
        await eventually(
            lambda: watcher.without_success_since("nightly") == seen, "first seen", limit=90
        )
        event = await runner.get_job("nightly").run_now()
        assert isinstance(event, JobSucceeded)
        assert runner.without_success_since("nightly") == event.finished_at  # its own record
        # The ledger's end of the run (the server's clock at release), learned by the other.
        ended = await admin.fetchval(
            f"SELECT finished_at FROM {table.runs} WHERE job = 'nightly' AND outcome = 'succeeded'"
        )
        await eventually(
            lambda: watcher.without_success_since("nightly") == ended, "the success", limit=90
        )
        assert watcher.get_job("nightly").run_count == 0  # it never ran the job itself
        assert registry.get_sample_value(GAUGE, {"cronlock_job": "nightly"}) == ended.timestamp()


async def test_an_older_ledgers_jobs_are_first_seen_at_their_oldest_run_or_last_note(
    admin: Any, table: LedgerTable
) -> None:
    await migrate(admin, table)
    await admin.execute(f"ALTER TABLE {table.jobs} DROP COLUMN first_seen")  # an older ledger
    assert await ledger_state(admin, table) == "old"
    ran = datetime(2026, 1, 1, 3, 0, 5, tzinfo=UTC)
    noted = datetime(2026, 2, 1, tzinfo=UTC)
    await admin.execute(
        f"""INSERT INTO {table.jobs} (job, schedule, updated_at)
            VALUES ('ran', 'x', $1), ('idle', 'x', $1)""",
        noted,
    )
    await admin.execute(
        f"""INSERT INTO {table.runs} (job, slot, host, pid, started_at)
            VALUES ('ran', $1, 'h', 1, $1), ('ran', $2, 'h', 1, $2)""",
        ran,
        noted,
    )
    assert await migrate(admin, table) == "upgraded"
    rows = await admin.fetch(f"SELECT job, first_seen FROM {table.jobs} ORDER BY job")
    assert [tuple(row) for row in rows] == [("idle", noted), ("ran", ran)]
    # A row an older replica inserts afterwards (naming no first_seen) gets one too.
    await admin.execute(f"INSERT INTO {table.jobs} (job, schedule) VALUES ('new', 'x')")
    assert await admin.fetchval(f"SELECT first_seen FROM {table.jobs} WHERE job = 'new'")
