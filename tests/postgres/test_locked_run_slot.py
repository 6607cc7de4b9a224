"""locked_run(..., slot=...) against a real server: once per slot, through the run ledger.

The use case: a script that system cron starts on every host at the same minute. Each test
keeps its ledger in a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from cronlock import ConfigError
from cronlock.postgres import locked_run, run_locked
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

from .conftest import ADVISORY_HERE

pytestmark = pytest.mark.postgres

MINUTE = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
_LOCKS_SQL = f"""
SELECT count(*) FROM pg_locks
WHERE {ADVISORY_HERE} AND objsubid = 1 AND granted
  AND ((classid::int8 << 32) | objid::int8) = $1::int8"""


@pytest.fixture
async def schema(admin: Any) -> AsyncIterator[str]:
    name = f"slot_{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")


def new_job() -> str:
    return f"script-{uuid.uuid4().hex[:8]}"


async def runs_of(admin: Any, schema: str, name: str) -> list[tuple[datetime, str | None]]:
    rows = await admin.fetch(
        f"SELECT slot, outcome FROM {LedgerTable(schema=schema).runs} WHERE job = $1 ORDER BY slot",
        name,
    )
    return [(row["slot"], row["outcome"]) for row in rows]


async def lock_held(admin: Any, schema: str, name: str) -> bool:
    return bool(await admin.fetchval(_LOCKS_SQL, LedgerTable(schema=schema).lock_key(name)))


async def test_a_second_copy_for_the_same_slot_does_not_run(
    pool: Any, admin: Any, schema: str
) -> None:
    name = new_job()
    ran: list[str] = []

    async def work(who: str) -> str:
        ran.append(who)
        return who

    # Without a slot, the lock only prevents overlap: two copies one after the other both run.
    assert await run_locked(pool, name, work, "bare-1") == (True, "bare-1")
    assert await run_locked(pool, name, work, "bare-2") == (True, "bare-2")
    assert ran == ["bare-1", "bare-2"]

    ran.clear()
    async with locked_run(pool, name, slot=MINUTE, schema=schema) as first:
        assert first and first.reason is None
        assert first.slot == MINUTE
        assert first.key == LedgerTable(schema=schema).lock_key(name)
        ran.append("first")
    # The first finished and gave the lock back; the second copy still must not run.
    async with locked_run(pool, name, slot=MINUTE, schema=schema) as second:
        assert not second
        assert second.reason == "already_ran"
    assert await run_locked(pool, name, work, "third", slot=MINUTE, schema=schema) == (
        False,
        None,
    )
    # The same minute given in another zone is the same slot.
    zoned = MINUTE.astimezone(timezone(timedelta(hours=1)))
    assert (await run_locked(pool, name, work, "zoned", slot=zoned, schema=schema)) == (False, None)
    # The next minute is a new slot.
    later = MINUTE + timedelta(minutes=1)
    assert await run_locked(pool, name, work, "next", slot=later, schema=schema) == (
        True,
        "next",
    )
    assert ran == ["first", "next"]
    assert await runs_of(admin, schema, name) == [(MINUTE, "succeeded"), (later, "succeeded")]
    assert not await lock_held(admin, schema, name)


async def test_concurrent_copies_for_one_slot_one_runs(pool: Any, admin: Any, schema: str) -> None:
    name = new_job()
    ran: list[int] = []
    refused: list[str | None] = []
    everyone_tried = asyncio.Event()
    copies = 12

    async def copy(i: int) -> None:
        async with locked_run(pool, name, slot=MINUTE, schema=schema) as lock:
            if not lock:
                refused.append(lock.reason)
                if len(refused) == copies - 1:
                    everyone_tried.set()
                return
            ran.append(i)
            await everyone_tried.wait()  # hold on until every other copy was turned away

    async with asyncio.timeout(60):
        await asyncio.gather(*(copy(i) for i in range(copies)))
    assert len(ran) == 1
    assert len(refused) == copies - 1
    assert set(refused) <= {"locked", "already_ran"}
    assert await runs_of(admin, schema, name) == [(MINUTE, "succeeded")]
    assert not await lock_held(admin, schema, name)


async def test_a_failed_body_records_failed_and_history_shows_it(
    pool: Any, admin: Any, pg_dsn: str, schema: str
) -> None:
    name = new_job()

    async def fail() -> None:
        raise ValueError("disk full")

    with pytest.raises(ValueError, match="disk full"):
        await run_locked(pool, name, fail, slot=MINUTE, schema=schema)
    assert await runs_of(admin, schema, name) == [(MINUTE, "failed")]
    assert not await lock_held(admin, schema, name)
    # A failed slot is still a slot that ran: no second copy retries it.
    async with locked_run(pool, name, slot=MINUTE, schema=schema) as again:
        assert again.reason == "already_ran"

    history = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cronlock", "history", name, "--dsn", pg_dsn, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert history.returncode == 0, history.stderr
    [row] = history.stdout.splitlines()[2:]
    assert row.split()[2] == "failed"
    assert "ValueError('disk full')" in row


async def test_a_cancelled_claim_leaves_the_slot_free_and_the_lock_released(
    pool: Any, admin: Any, schema: str
) -> None:
    name = new_job()
    rng = random.Random(4321)
    entered: set[datetime] = set()
    cancelled = 0
    # The ledger exists first, so that the cancellations land in the claim, not the DDL.
    assert (await run_locked(pool, name, asyncio.sleep, 0, slot=MINUTE, schema=schema))[0]
    entered.add(MINUTE)
    for n in range(1, 151):
        slot = MINUTE + timedelta(minutes=n)

        async def run(slot: datetime = slot) -> None:
            async with locked_run(pool, name, slot=slot, schema=schema) as lock:
                assert lock
                entered.add(slot)

        task = asyncio.create_task(run(), name="run")
        # 0..4 ms covers the checkout, the backend check, the claim and the end locally.
        await asyncio.sleep(rng.uniform(0, 0.004))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
    assert cancelled > 0
    recorded = await runs_of(admin, schema, name)
    # A slot is in the ledger exactly when its body began: a cancelled claim left no row.
    assert {slot for slot, _ in recorded} == entered
    assert {outcome for _, outcome in recorded} <= {"succeeded", "cancelled"}
    assert not await lock_held(admin, schema, name)
    assert pool.get_idle_size() == pool.get_size()
    # And a slot whose claim was cancelled can still be run by the next copy.
    free = next(
        MINUTE + timedelta(minutes=n)
        for n in range(1, 152)
        if MINUTE + timedelta(minutes=n) not in entered
    )
    assert await run_locked(pool, name, asyncio.sleep, 0, "ran", slot=free, schema=schema) == (
        True,
        "ran",
    )


def test_a_naive_slot_is_refused() -> None:
    with pytest.raises(ConfigError, match="aware datetime"):
        locked_run("postgresql://unused", "x", slot=datetime(2030, 1, 1, 3, 0))


def test_ledger_options_need_a_slot() -> None:
    with pytest.raises(ConfigError, match="need slot="):
        locked_run("postgresql://unused", "x", schema="s")
