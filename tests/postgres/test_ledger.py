"""The run ledger of PostgresLocker against a real server: claims, outcomes, history,
retention, schema names, migration, heartbeat and lock loss."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from cronlock import (
    JobStarted,
    LedgerLocker,
    LockError,
    LockLost,
    RecordingHold,
    RunRecord,
    Scheduler,
    SystemClock,
    every,
)
from cronlock.postgres import LedgerNameError, PostgresHold, PostgresLocker
from cronlock.postgres._locker.crashes import CHECK_EVERY
from cronlock.postgres._sql.tables import LedgerTable, quote_ident
from cronlock.postgres._sql.upkeep import MEMBERS_EVERY

from .events import Events
from .proxy import TcpProxy, via

pytestmark = pytest.mark.postgres

LocksHeld = Callable[[Iterable[str]], Awaitable[int]]
SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


def new_job() -> str:
    return f"ledger-{uuid.uuid4()}"


def record(slot: datetime, outcome: Any = "succeeded", error: str | None = None) -> RunRecord:
    now = datetime.now(UTC)
    return RunRecord(slot, now, now, outcome, error)


@pytest.fixture
async def fresh_table(admin: Any) -> AsyncIterator[LedgerTable]:
    """A ledger in its own schema with awkward names, dropped afterwards."""
    table = LedgerTable(table='Runs "of" jobs; --', schema=f"cl test {uuid.uuid4().hex[:8]}")
    try:
        yield table
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(table.schema or '')} CASCADE")


async def test_is_a_ledger_locker_and_records_outcomes(pg_dsn: str, app_name: str) -> None:
    job = new_job()
    async with PostgresLocker(pg_dsn, application_name=app_name) as locker:
        assert isinstance(locker, LedgerLocker)
        assert await locker.last_claimed(job) is None
        first = await locker.acquire(job, SLOT)
        assert isinstance(first, RecordingHold)
        [unfinished] = await locker.history(job)
        assert (unfinished.outcome, unfinished.finished_at) == ("unfinished", None)
        first.record(record(SLOT))
        await first.release()
        later = SLOT + timedelta(hours=1)
        second = await locker.acquire(job, later)
        assert isinstance(second, PostgresHold)
        second.record(record(later, "failed", "ValueError: boom"))
        await second.release()
        assert await locker.last_claimed(job) == later
        last, ok = await locker.last_runs(job)
        assert last is not None and ok is not None
        assert (last.slot, last.outcome, last.error) == (later, "failed", "ValueError: boom")
        assert (ok.slot, ok.outcome) == (SLOT, "succeeded")
        history = await locker.history(job)
        assert [(r.slot, r.outcome) for r in history] == [(later, "failed"), (SLOT, "succeeded")]
        assert all(r.owner and r.owner.endswith(f":{__import__('os').getpid()}") for r in history)
        assert all(r.finished_at and r.finished_at >= r.started_at for r in history)
        assert [r.slot for r in await locker.history(job, limit=1)] == [later]


async def test_one_round_trip_to_claim_and_one_to_finish(
    pg_dsn: str, app_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = 200
    for ledger in (True, False):
        job = new_job()
        async with PostgresLocker(
            pg_dsn, application_name=app_name, ledger=ledger, heartbeat=None
        ) as locker:
            warm = await locker.acquire(job, SLOT)  # opens (and prepares) the session
            assert isinstance(warm, PostgresHold)
            await warm.release()
            before = locker.statistics().statements
            began = time.perf_counter()
            for i in range(1, runs + 1):
                slot = SLOT + timedelta(minutes=i)
                lease = await locker.acquire(job, slot)
                assert isinstance(lease, PostgresHold)
                lease.record(record(slot))
                await lease.release()
            took = time.perf_counter() - began
            sent = locker.statistics().statements - before
            # The background duties share the sessions' count: a crash check every 3 s and
            # a members heartbeat every 15 s may fall in the window (a loaded machine).
            background = math.ceil(took / CHECK_EVERY) + math.ceil(took / MEMBERS_EVERY)
            assert 2 * runs <= sent <= 2 * runs + background
            per_run = sent / runs
        with capsys.disabled():
            mode = "ledger" if ledger else "lock-only"
            print(
                f"\n[measured] {mode}: {per_run:g} round trips and "
                f"{took / runs * 1000:.2f} ms per locked run (acquire + release, {runs} runs)"
            )


async def test_lagging_replica_finds_the_slot_taken_after_release(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    job = new_job()
    a = PostgresLocker(pg_dsn, application_name=app_name + "-a")
    b = PostgresLocker(pg_dsn, application_name=app_name + "-b")
    async with a, b:
        lease = await a.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        lease.record(record(SLOT))
        await lease.release()
        assert await locks_held([job]) == 0
        # The lock is free, as it would be for a replica whose clock lags: the slot is not.
        assert await b.acquire(job, SLOT) == "already_ran"
        # The pre-check did not even take the lock: nothing to hand back, nothing held.
        assert await locks_held([job]) == 0
        last, _ = await b.last_runs(job)
        assert last is not None and last.outcome == "succeeded"


async def test_cancelled_claims_give_the_slot_back(
    pg_dsn: str, app_name: str, locks_held: LocksHeld, admin: Any
) -> None:
    job = new_job()
    given_back = 0
    async with PostgresLocker(pg_dsn, application_name=app_name) as locker:
        for i in range(60):
            slot = SLOT + timedelta(minutes=i)
            task = asyncio.create_task(locker.acquire(job, slot))
            await asyncio.sleep(0.0005 * (i % 7))
            task.cancel()
            try:
                lease = await task
            except asyncio.CancelledError:
                given_back += 1
                continue
            assert isinstance(lease, PostgresHold)
            await lease.release()
        assert locker.statistics().held == 0
    assert await locks_held([job]) == 0
    # No slot is left claimed by a run that never started: cancelled claims were deleted.
    unfinished = await admin.fetchval(
        "SELECT count(*) FROM cronlock_runs WHERE job = $1 AND finished_at IS NULL", job
    )
    assert unfinished == 0
    assert given_back > 0


async def test_awkward_names_are_quoted_and_created_on_start(
    pg_dsn: str, app_name: str, fresh_table: LedgerTable, admin: Any
) -> None:
    job = new_job()
    locker = PostgresLocker(
        pg_dsn, application_name=app_name, table=fresh_table.table, schema=fresh_table.schema
    )
    async with locker:
        lease = await locker.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        await lease.release()
        assert [r.slot for r in await locker.history(job)] == [SLOT]
    found = await admin.fetchval(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1"
        " AND table_name IN ($2, $3)",
        fresh_table.schema,
        fresh_table.table,
        fresh_table.table + "_jobs",
    )
    assert found == 2


def test_names_are_refused_only_when_postgres_could_not_keep_them() -> None:
    assert quote_ident('a"b') == '"a""b"'
    assert LedgerTable("é" * 31, "s").runs == '"s"."' + "é" * 31 + '"'  # 62 bytes: fine
    for bad in ("", "x" * 64, "a\x00b"):
        with pytest.raises(LedgerNameError):
            LedgerTable(bad)
    long = LedgerTable("x" * 63)  # the derived jobs table name is shortened, not truncated
    assert len(long.jobs.strip('"').encode()) <= 63
    assert long.jobs != long.runs


async def test_without_create_table_a_missing_ledger_is_a_clear_error(
    pg_dsn: str, app_name: str, fresh_table: LedgerTable
) -> None:
    locker = PostgresLocker(
        pg_dsn,
        application_name=app_name,
        table=fresh_table.table,
        schema=fresh_table.schema,
        create_table=False,
    )
    async with locker:
        with pytest.raises(LockError, match="migrate"):
            await locker.acquire(new_job(), SLOT)


async def test_replicas_starting_together_create_the_ledger_once(
    pg_dsn: str, app_name: str, fresh_table: LedgerTable
) -> None:
    lockers = [
        PostgresLocker(
            pg_dsn, application_name=app_name, table=fresh_table.table, schema=fresh_table.schema
        )
        for _ in range(6)
    ]
    job = new_job()
    try:
        answers = await asyncio.gather(*(locker.acquire(job, SLOT) for locker in lockers))
        assert sum(isinstance(a, PostgresHold) for a in answers) == 1
        assert {a for a in answers if isinstance(a, str)} <= {"locked", "already_ran"}
    finally:
        for locker in lockers:
            await locker.close()


async def test_prune_keeps_each_jobs_latest_run_and_latest_success(
    pg_dsn: str, app_name: str, fresh_table: LedgerTable, admin: Any
) -> None:
    job, quiet = new_job(), new_job()
    now = datetime.now(UTC)
    locker = PostgresLocker(
        pg_dsn,
        application_name=app_name,
        table=fresh_table.table,
        schema=fresh_table.schema,
        retention=timedelta(days=30),
    )
    async with locker:
        assert await locker.last_claimed(job) is None  # opens the session, creates the ledger
        rows = [
            (job, now - timedelta(days=40), "succeeded"),
            (job, now - timedelta(days=39), "failed"),
            (job, now - timedelta(days=38), "succeeded"),  # latest success: kept
            (job, now - timedelta(days=37), "failed"),
            (job, now - timedelta(hours=1), "failed"),  # recent: kept
            (quiet, now - timedelta(days=90), "succeeded"),  # its only run: kept
        ]
        await admin.executemany(
            f"INSERT INTO {fresh_table.runs} (job, slot, host, pid, started_at, finished_at,"
            " outcome) VALUES ($1, $2, 'h', 1, $2, $2, $3)",
            rows,
        )
        assert await locker.prune() == 3
        kept = await locker.history(job)
        assert [r.slot for r in kept] == [rows[4][1], rows[2][1]]
        assert [r.slot for r in await locker.history(quiet)] == [rows[5][1]]
        assert await locker.prune() == 0


async def test_schedules_are_written_for_status(
    pg_dsn: str, app_name: str, fresh_table: LedgerTable, admin: Any
) -> None:
    job = new_job()
    locker = PostgresLocker(
        pg_dsn, application_name=app_name, table=fresh_table.table, schema=fresh_table.schema
    )
    async with locker:
        await locker.last_claimed(job)
        locker.note_schedule(job, "every 10s", SLOT)
        locker.note_schedule(job, "every 10s", SLOT + timedelta(seconds=10))
    row = await admin.fetchrow(
        f"SELECT schedule, next_run, updated_by FROM {fresh_table.jobs} WHERE job = $1", job
    )
    assert tuple(row) == ("every 10s", SLOT + timedelta(seconds=10), app_name)


async def _run_until_lost(
    locker: PostgresLocker, cut: Callable[[], Awaitable[None]]
) -> tuple[LockLost, float]:
    # No fleet time: its reads of the server's clock go over the lock session too, and
    # would notice a cut first as often as not; these tests are about the session itself.
    scheduler = Scheduler(clock=SystemClock(), locker=locker, stop_timeout=0, fleet_clock=False)
    events = Events()
    scheduler.subscribe(events)

    async def long_run() -> None:
        await asyncio.sleep(3600)

    scheduler.add_job(long_run, every(0.5), name=new_job())
    async with scheduler:
        await events.until(JobStarted)
        began = time.monotonic()
        await cut()
        lost = await events.until(LockLost)
        noticed = time.monotonic() - began
    assert isinstance(lost, LockLost)
    return lost, noticed


async def test_terminated_session_mid_run_ends_the_run_with_lock_lost(
    pg_dsn: str, app_name: str, admin: Any
) -> None:
    locker = PostgresLocker(pg_dsn, application_name=app_name, heartbeat=0.2)

    async def terminate() -> None:
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1",
            app_name,
        )
        assert killed >= 1  # the run's session (and the one fleet time reads, if another)

    async with locker:
        lost, _ = await _run_until_lost(locker, terminate)
        assert isinstance(lost.exception, LockError)
        # The outcome reaches the ledger once a session is back (the next acquire made one).
        async with asyncio.timeout(30):
            while True:
                [run] = [r for r in await locker.history(lost.job, 50) if r.slot == lost.slot]
                if run.outcome == "lock_lost":
                    break
                await asyncio.sleep(0.1)


async def test_heartbeat_notices_a_silent_network_cut(
    pg_dsn: str, app_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = urlsplit(pg_dsn)
    if target.hostname is None or target.hostname.startswith("/"):
        pytest.skip("the DSN names no TCP host to relay to")
    proxy = TcpProxy(target.hostname, target.port or 5432)
    port = await proxy.start()
    # Lock-only: no ledger upkeep statements, so only the heartbeat can notice the cut.
    locker = PostgresLocker(
        via(pg_dsn, port),
        application_name=app_name,
        ledger=False,
        heartbeat=0.3,
        statement_timeout=0.5,
        keepalives=None,
    )

    async def freeze() -> None:
        proxy.set_mode("freeze")  # no error, no FIN: silence, as in a partition

    try:
        async with locker:
            lost, noticed = await _run_until_lost(locker, freeze)
    finally:
        await proxy.close()
    with capsys.disabled():
        print(
            f"\n[measured] silent cut noticed by the heartbeat after {noticed:.2f}s "
            "(heartbeat 0.3s + statement_timeout 0.5s)"
        )
    assert locker.statistics().heartbeats >= 1
    assert "heartbeat" in str(lost.exception)


async def test_pool_backed_locker_reads_and_claims(pool: asyncpg.Pool, app_name: str) -> None:
    job = new_job()
    async with PostgresLocker(pool, application_name=app_name + "-p") as locker:
        lease = await locker.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        lease.record(record(SLOT))
        await lease.release()
        assert (await locker.last_runs(job))[1] is not None


async def test_schedules_are_written_once_no_run_holds_a_lease(
    pg_dsn: str, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst's claims and ends go first: changed schedules wait while leases are held
    (at most NOTE_LATEST), then are written."""
    from cronlock.postgres._locker import upkeep as _upkeep

    monkeypatch.setattr(_upkeep, "NOTE_EVERY", 0.05)
    job = new_job()
    locker = PostgresLocker(pg_dsn, heartbeat=0.05)  # upkeep ticks every 50 ms
    async with locker:
        assert locker.ledger is not None
        jobs_table = locker.ledger.jobs

        async def written() -> bool:
            sql = f"SELECT count(*) FROM {jobs_table} WHERE job = $1"
            return bool(await admin.fetchval(sql, job))

        lease = await locker.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        locker.note_schedule(job, "every 1h", SLOT + timedelta(hours=1))
        await asyncio.sleep(1.0)  # some 20 upkeep ticks
        assert not await written()
        await lease.release()
        for _ in range(200):
            if await written():
                break
            await asyncio.sleep(0.05)
        assert await written()
