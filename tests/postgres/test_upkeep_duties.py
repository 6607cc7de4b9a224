"""Each upkeep duty of a PostgresLocker stands alone: schedule notes the server refuses
(here a NUL in a name, which only a name that skipped the registration check can carry)
do not stop the crash check or the pruning, and are logged at WARNING, once, rather than
at DEBUG on every tick (issue 24, item 1)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock.postgres import PostgresLocker
from cronlock.postgres._locker import upkeep as _upkeep
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


@pytest.fixture
async def ledger(admin: Any) -> AsyncIterator[LedgerTable]:
    table = LedgerTable(table="cronlock_runs", schema=f"upkeep_{uuid.uuid4().hex[:10]}")
    try:
        yield table
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(table.schema or '')} CASCADE")


async def test_failing_notes_leave_the_crash_check_and_the_prune_running(
    pg_dsn: str,
    admin: Any,
    ledger: LedgerTable,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_upkeep, "NOTE_EVERY", 0.05)
    monkeypatch.setattr(_upkeep, "PRUNE_EVERY", 0.2)  # the first prune within 80 ms
    caplog.set_level(logging.DEBUG, logger="cronlock.postgres")
    locker = PostgresLocker(
        pg_dsn,
        table=ledger.table,
        schema=ledger.schema,
        heartbeat=0.05,
        retention=timedelta(days=1),
    )
    async with locker:
        good, old = f"good-{uuid.uuid4().hex[:8]}", f"old-{uuid.uuid4().hex[:8]}"
        assert await locker.last_claimed(good) is None  # a session is open, the ledger made
        now = datetime.now(UTC)
        await admin.executemany(
            f"INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at,"
            " outcome) VALUES ($1, $2, 'h', 1, $2, $2, 'succeeded')",
            [(old, now - timedelta(days=40)), (old, now - timedelta(days=2))],
        )
        # An unfinished run of another replica whose session is gone: a crash to find.
        await admin.execute(
            f"INSERT INTO {ledger.runs} (job, slot, host, pid, session) "
            "VALUES ($1, $2, 'elsewhere', 1, 2147483000)",
            good,
            SLOT,
        )
        # The server refuses the whole batched note for this one name, on every try.
        locker.note_schedule("bad\x00name", "every 1m", SLOT)
        locker.note_schedule(good, "every 1m", SLOT)
        for _ in range(100):
            outcome = await admin.fetchval(
                f"SELECT outcome FROM {ledger.runs} WHERE job = $1", good
            )
            pruned = await admin.fetchval(f"SELECT count(*) FROM {ledger.runs} WHERE job = $1", old)
            if outcome == "crashed" and pruned == 1:
                break
            await asyncio.sleep(0.05)
        assert outcome == "crashed"  # the crash check ran
        assert pruned == 1  # the prune ran: the 40-day-old run is gone, the latest kept
        await asyncio.sleep(0.3)  # more failing ticks
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "upkeep (schedule notes) failed" in r.getMessage()
    ]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "the other duties go on" in warnings[0].getMessage()


async def test_a_failing_duty_is_told_once_then_again_later_and_its_recovery(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cronlock.postgres")
    complaints = _upkeep._Complaints()
    boom = OSError("boom")
    for _ in range(3):
        complaints.failed("prune", boom)
    complaints.failed("prune", TimeoutError())  # another way of failing: told at once
    complaints.failed("crash check", boom)  # another duty: told on its own
    monkeypatch.setattr(_upkeep, "COMPLAIN_EVERY", 0.0)
    complaints.failed("prune", TimeoutError())  # the same, but the quiet time is over
    complaints.succeeded("prune")
    complaints.succeeded("prune")  # already told
    told = [(r.levelname, r.getMessage().split(" failed")[0]) for r in caplog.records]
    assert [t for t in told if t[0] != "DEBUG"] == [
        ("WARNING", "PostgresLocker upkeep (prune)"),
        ("WARNING", "PostgresLocker upkeep (prune)"),
        ("WARNING", "PostgresLocker upkeep (crash check)"),
        ("WARNING", "PostgresLocker upkeep (prune)"),
        ("INFO", "PostgresLocker upkeep (prune) works again"),
    ]


async def test_a_note_write_gives_up_on_a_locked_row_and_leaves_the_session_free(
    pg_dsn: str,
    admin: Any,
    ledger: LedgerTable,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lease-mode locker has one connection for its claims, reads and upkeep. A bulk
    change holding the job notes' rows (until it commits) made a note write wait for it,
    and every claim and read behind it; now the write gives up after a moment (quietly),
    the session answers meanwhile, and the note is written once the rows are free."""
    monkeypatch.setattr(_upkeep, "NOTE_EVERY", 0.05)
    caplog.set_level(logging.DEBUG, logger="cronlock.postgres")
    job = f"noted-{uuid.uuid4().hex[:8]}"
    locker = PostgresLocker(pg_dsn, table=ledger.table, schema=ledger.schema, mode="lease")
    async with locker:
        assert await locker.last_claimed(job) is None  # the ledger made
        locker.note_schedule(job, "every 1m", SLOT)

        async def noted() -> str | None:
            found: str | None = await admin.fetchval(
                f"SELECT schedule FROM {ledger.jobs} WHERE job = $1", job
            )
            return found

        for _ in range(400):
            if await noted() == "every 1m":
                break
            await asyncio.sleep(0.05)
        assert await noted() == "every 1m"
        async with admin.transaction():  # an operator's bulk change, say, not committed yet
            await admin.execute(f"SELECT * FROM {ledger.jobs} WHERE job = $1 FOR UPDATE", job)
            caplog.clear()
            locker.note_schedule(job, "every 2m", SLOT)
            for _ in range(400):
                if any("waits for a lock" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.05)
            # The write tried and gave up; the one connection answers while the row is held.
            assert any("waits for a lock" in r.getMessage() for r in caplog.records)
            assert await asyncio.wait_for(locker.last_claimed(job), 20) is None
            assert await noted() == "every 1m"
        for _ in range(400):  # committed: the next try writes it
            if await noted() == "every 2m":
                break
            await asyncio.sleep(0.05)
        assert await noted() == "every 2m"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
