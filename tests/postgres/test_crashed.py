"""Crashed runs in one process against the real server: the check, the late outcome of a
live replica, the rerun claim, the scheduler's recovery rule, the ledger upgrade, the CLI.

A crashed run is made here the way a dead replica leaves one: a ledger row, unfinished,
whose ``session`` is the backend pid of a connection that was closed ("ghost" rows, owned
by a made-up host). The real-process version, with SIGKILL, is test_crashed_replicas.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from cronlock import (
    CrashWatchingLocker,
    JobCrashed,
    JobStarted,
    JobSucceeded,
    LockError,
    LockLost,
    RunRecord,
    Scheduler,
    SystemClock,
    every,
)
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._locker import upkeep
from cronlock.postgres._locker.crashes import CrashWatch
from cronlock.postgres._sql.crashes import crashed_sql, recover_sql
from cronlock.postgres._sql.tables import LedgerTable

from ..eventually import eventually
from .events import CutOffFirstRun, Events
from .test_cli_pg import cli_here

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
GHOST = "ghost-host"
CHECK_EVERY = 0.3  # seconds between a locker's crash checks here (3 in production)


@pytest.fixture(autouse=True)
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each locker looks for crashed runs every CHECK_EVERY seconds (3 in production):
    here often, the tests waiting for what the checks find, or for a number of them
    (``[n]``: the checks made in this process so far)."""
    monkeypatch.setattr(upkeep, "CHECK_EVERY", CHECK_EVERY)
    made = [0]
    check = CrashWatch.check

    async def counted(self: CrashWatch, session: Any, conn: Any, generation: int) -> int:
        try:
            return await check(self, session, conn, generation)
        finally:
            made[0] += 1

    monkeypatch.setattr(CrashWatch, "check", counted)
    return made


async def more_checks(checks: list[int], n: int) -> None:
    """Wait until *n* more crash checks were made (by any locker here)."""
    target = checks[0] + n
    await eventually(lambda: checks[0] >= target, f"{n} more crash checks")


def new_job() -> str:
    return f"crash-{uuid.uuid4()}"


@pytest.fixture
async def ledger(admin: Any) -> AsyncIterator[LedgerTable]:
    """A ledger table of this test's own, dropped afterwards."""
    table = LedgerTable(f"crash_{uuid.uuid4().hex[:10]}")
    try:
        yield table
    finally:
        await admin.execute(f"DROP TABLE IF EXISTS {table.runs}, {table.jobs}")


async def dead_session(pg_dsn: str, admin: Any) -> int:
    """The backend pid of a session that existed and is gone."""
    conn = await asyncpg.connect(pg_dsn)
    pid: int = await conn.fetchval("SELECT pg_backend_pid()")
    await conn.close()
    async with asyncio.timeout(30):  # the backend exits a moment after the goodbye
        while await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
            await asyncio.sleep(0.02)
    return pid


async def ghost(
    admin: Any,
    table: LedgerTable,
    job: str,
    slot: datetime,
    session: int | None,
    *,
    attempt: int = 1,
    outcome: str | None = None,
) -> None:
    """A claim as another replica (``ghost-host:4242``) would have made it."""
    await admin.execute(
        f"INSERT INTO {table.runs} (job, slot, host, pid, session, attempt, outcome,"
        " finished_at) VALUES ($1, $2, $3, 4242, $4, $5, $6,"
        " CASE WHEN $6::text IS NULL THEN NULL ELSE clock_timestamp() END)",
        job,
        slot,
        GHOST,
        session,
        attempt,
        outcome,
    )


async def row_of(admin: Any, table: LedgerTable, job: str, slot: datetime = SLOT) -> Any:
    return await admin.fetchrow(
        f"SELECT * FROM {table.runs} WHERE job = $1 AND slot = $2", job, slot
    )


async def open_session(locker: PostgresLocker) -> None:
    """Open a lock session (the crash check rides on one) with a run of a throwaway job."""
    lease = await locker.acquire(new_job(), SLOT)
    assert isinstance(lease, PostgresHold)
    await lease.release()


def now() -> datetime:
    return datetime.now(UTC)


async def test_a_run_whose_lock_session_is_gone_is_marked_crashed_once(
    pg_dsn: str,
    app_name: str,
    admin: Any,
    ledger: LedgerTable,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    checks: list[int],
) -> None:
    caplog.set_level(logging.WARNING, logger="cronlock.postgres")
    told: list[tuple[str, RunRecord]] = []

    def callback(job: str, record: RunRecord) -> bool:
        told.append((job, record))
        return False

    lockers = [PostgresLocker(pg_dsn, application_name=app_name, table=ledger.table) for _ in "ab"]
    try:
        for locker in lockers:
            assert isinstance(locker, CrashWatchingLocker)
            locker.on_crashed(callback)
            locker.on_crashed(callback)  # the same callback once
            await open_session(locker)
        crashed, live, old = new_job(), new_job(), new_job()
        await ghost(admin, ledger, live, SLOT, await admin.fetchval("SELECT pg_backend_pid()"))
        await ghost(admin, ledger, old, SLOT, None)  # claimed by an older cronlock
        await ghost(admin, ledger, crashed, SLOT, await dead_session(pg_dsn, admin))
        began = time.monotonic()
        async with asyncio.timeout(30):
            while not told:
                await asyncio.sleep(0.02)
        noticed = time.monotonic() - began
        # Both lockers check again and again: watch two more rounds of checks.
        await more_checks(checks, 2 * len(lockers))
        [(job, record)] = told
        assert job == crashed
        assert (record.slot, record.outcome, record.attempt) == (SLOT, "crashed", 1)
        assert record.owner == f"{GHOST}:4242"
        assert record.finished_at is not None
        assert sum(locker.statistics().crashed for locker in lockers) == 1
        row = await row_of(admin, ledger, crashed)
        assert row["outcome"] == "crashed"
        assert f"{GHOST}:4242" in row["error"] and "died mid-run" in row["error"]
        [seen] = await lockers[0].history(crashed)
        assert (seen.outcome, seen.owner) == ("crashed", f"{GHOST}:4242")
        for untouched in (live, old):  # a live session; no session recorded
            row = await row_of(admin, ledger, untouched)
            assert (row["outcome"], row["finished_at"]) == (None, None)
    finally:
        for locker in lockers:
            await locker.close()
    [warning] = [r for r in caplog.records if crashed in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert f"{GHOST}:4242" in warning.getMessage() and SLOT.isoformat() in warning.getMessage()
    with capsys.disabled():
        print(
            f"\n[measured] crashed row noticed {noticed:.2f}s after its session closed"
            f" (checks every {CHECK_EVERY:g}s here)"
        )


async def test_own_lost_runs_are_left_alone_and_their_late_outcome_replaces_crashed(
    pg_dsn: str, app_name: str, admin: Any, ledger: LedgerTable
) -> None:
    """A replica whose session died (server restart) is alive: it writes its runs' real
    outcomes later. Its own check leaves them alone; another replica's may mark them
    crashed meanwhile, and the late outcome then replaces that, unless a rerun took the
    slot over."""
    told: list[str] = []

    def callback(job: str, record: RunRecord) -> bool:
        told.append(job)
        return False

    locker = PostgresLocker(
        pg_dsn, application_name=app_name, table=ledger.table, sessions=1, heartbeat=0.2
    )
    locker.on_crashed(callback)
    async with locker:
        marked, taken = new_job(), new_job()
        leases = [await locker.acquire(job, SLOT) for job in (marked, taken)]
        assert all(isinstance(lease, PostgresHold) for lease in leases)
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1",
            app_name,
        )
        assert killed == 1
        async with asyncio.timeout(30):
            while not all(isinstance(x, PostgresHold) and x.lost for x in leases):
                await asyncio.sleep(0.02)
        await open_session(locker)  # a new session: the checks go on
        # A witness: once it is marked, the check that marked it saw our rows too.
        witness = new_job()
        await ghost(admin, ledger, witness, SLOT, await dead_session(pg_dsn, admin))
        async with asyncio.timeout(30):
            while witness not in told:
                await asyncio.sleep(0.02)
        assert told == [witness]
        for job in (marked, taken):
            assert (await row_of(admin, ledger, job))["outcome"] is None
        # Another replica's check marks them (its host is not ours): an older cronlock's,
        # which knows no owner (this one's waits until our members row expired: below, and
        # test_crashed_owner.py); then a rerun takes one of them over.
        await admin.execute(
            f"UPDATE {ledger.runs} SET holder = NULL WHERE job = ANY($1::text[])", [marked, taken]
        )
        marked_by_other = await admin.fetch(crashed_sql(ledger), "other-host", 1, "other", 45.0)
        assert {r["job"] for r in marked_by_other} == {marked, taken}
        # (The rerun's own session, alive: the admin's. The checks leave its row alone.)
        await admin.execute(
            f"UPDATE {ledger.runs} SET host = 'rerun-host', pid = 7, attempt = 2,"
            " session = pg_backend_pid(), finished_at = NULL, outcome = NULL, error = NULL"
            " WHERE job = $1",
            taken,
        )
        # The session is gone: the outcomes are written later. The taken-over one first,
        # so that its write is done (or was part of the same statement) once the other's is.
        for lease in reversed(leases):
            assert isinstance(lease, PostgresHold)
            lease.record(RunRecord(SLOT, now(), now(), "lock_lost"))
            await lease.release()
        async with asyncio.timeout(30):
            while (await row_of(admin, ledger, marked))["outcome"] != "lock_lost":
                await asyncio.sleep(0.05)
    row = await row_of(admin, ledger, marked)
    assert (row["host"], row["pid"], row["attempt"]) == (socket.gethostname(), os.getpid(), 1)
    assert row["error"] is None
    row = await row_of(admin, ledger, taken)  # a rerun's row now: not touched
    assert (row["host"], row["attempt"], row["outcome"]) == ("rerun-host", 2, None)


async def test_the_rerun_claim_takes_a_crashed_slot_over_once(
    pg_dsn: str, admin: Any, ledger: LedgerTable, locks_held: Any
) -> None:
    async with PostgresLocker(pg_dsn, table=ledger.table) as locker:
        await open_session(locker)  # creates the ledger
    job, twice = new_job(), new_job()
    await ghost(admin, ledger, job, SLOT, None, outcome="crashed")
    await ghost(admin, ledger, twice, SLOT, None, attempt=2, outcome="crashed")
    sql = recover_sql(ledger)
    conns = [await asyncpg.connect(pg_dsn) for _ in range(3)]
    try:
        # Three replicas at once: one takes it over, the others are refused.
        key = hash(job) & 0x7FFFFFFF
        answers = await asyncio.gather(
            *(
                c.fetchrow(sql, key + i, job, SLOT, f"r{i}", i, 2, f"r{i}:holder")
                for i, c in enumerate(conns)
            )
        )
        winners = [i for i, a in enumerate(answers) if a["started_at"] is not None]
        assert len(winners) == 1
        row = await row_of(admin, ledger, job)
        assert (row["host"], row["attempt"], row["outcome"]) == (f"r{winners[0]}", 2, None)
        assert row["holder"] == f"r{winners[0]}:holder"  # the rerun's owner, for its check
        assert row["session"] == await conns[winners[0]].fetchval("SELECT pg_backend_pid()")
        # A rerun that crashed too is not taken over again (as attempt 3 either: only a
        # failed attempt is retried); the lock is given back.
        again = await conns[0].fetchrow(sql, key, twice, SLOT, "r0", 0, 3, "r0:holder")
        assert (again["got"], again["started_at"]) == (True, None)
        assert await conns[0].fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ) == (1 if winners[0] == 0 else 0)
    finally:
        for conn in conns:
            await conn.close()


async def _scheduler_sees_a_crash(
    pg_dsn: str,
    admin: Any,
    ledger: LedgerTable,
    checks: list[int],
    *,
    recover: bool,
    late: float = 5.0,
    grace: float = 60.0,
    attempt: int = 1,
) -> tuple[str, datetime, JobCrashed, Events, PostgresLocker]:
    locker = PostgresLocker(pg_dsn, table=ledger.table)
    scheduler = Scheduler(clock=SystemClock(), locker=locker, stop_timeout=0)
    events = Events()
    scheduler.subscribe(events)
    job = new_job()
    scheduler.add_job(lambda: None, every(3600), name=job, recover=recover, misfire_grace=grace)
    slot = now().replace(microsecond=0) - timedelta(seconds=late)
    async with locker, scheduler:
        await open_session(locker)
        await ghost(admin, ledger, job, slot, await dead_session(pg_dsn, admin), attempt=attempt)
        crashed: JobCrashed = await events.until(JobCrashed, timeout=30)
        if crashed.recovered:
            await events.until(JobSucceeded, timeout=30)
        else:
            await more_checks(checks, 2)  # more checks: still not rerun
    assert (crashed.job, crashed.slot, crashed.owner) == (job, slot, f"{GHOST}:4242")
    return job, slot, crashed, events, locker


async def test_a_scheduler_with_recover_reruns_a_crashed_slot_within_its_grace(
    pg_dsn: str, admin: Any, ledger: LedgerTable, checks: list[int]
) -> None:
    job, slot, crashed, events, locker = await _scheduler_sees_a_crash(
        pg_dsn, admin, ledger, checks, recover=True
    )
    assert crashed.recovered is True
    [started] = events.of(JobStarted)
    assert started.slot == slot
    row = await row_of(admin, ledger, job, slot)
    assert (row["outcome"], row["attempt"]) == ("succeeded", 2)
    assert (row["host"], row["pid"]) == (socket.gethostname(), os.getpid())
    stats = locker.statistics()
    assert (stats.crashed, stats.reran) == (1, 1)


@pytest.mark.parametrize(
    ("recover", "late", "grace", "attempt"),
    [
        pytest.param(False, 5.0, 60.0, 1, id="recover-off"),
        pytest.param(True, 30.0, 10.0, 1, id="past-the-grace"),
        pytest.param(True, 5.0, 60.0, 2, id="a-rerun-crashed-too"),
    ],
)
async def test_a_crashed_slot_is_reported_and_not_rerun(
    pg_dsn: str,
    admin: Any,
    ledger: LedgerTable,
    recover: bool,
    late: float,
    grace: float,
    attempt: int,
    checks: list[int],
) -> None:
    job, slot, crashed, events, locker = await _scheduler_sees_a_crash(
        pg_dsn, admin, ledger, checks, recover=recover, late=late, grace=grace, attempt=attempt
    )
    assert crashed.recovered is False
    assert events.of(JobStarted) == []
    row = await row_of(admin, ledger, job, slot)
    assert (row["outcome"], row["attempt"], row["host"]) == ("crashed", attempt, GHOST)
    assert locker.statistics().reran == 0


_OLD_DDL = [
    """CREATE TABLE {runs} (
        job text NOT NULL, slot timestamptz NOT NULL, host text NOT NULL,
        pid integer NOT NULL, started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        finished_at timestamptz, outcome text, error text, PRIMARY KEY (job, slot))""",
    "CREATE INDEX {slot_idx} ON {runs} (slot)",
    """CREATE TABLE {jobs} (
        job text PRIMARY KEY, schedule text NOT NULL, next_run timestamptz,
        updated_at timestamptz NOT NULL DEFAULT clock_timestamp(), updated_by text)""",
]


async def test_a_ledger_made_by_an_older_cronlock_is_upgraded_on_start(
    pg_dsn: str, app_name: str, admin: Any, ledger: LedgerTable
) -> None:
    """The ledger as cronlock made it before crash detection: upgraded when a locker
    opens a session (or by ``migrate``), its rows kept."""
    names = {"runs": ledger.runs, "jobs": ledger.jobs, "slot_idx": f'"{ledger.table}_slot_idx"'}
    for statement in _OLD_DDL:
        await admin.execute(statement.format(**names))
    old = new_job()
    await admin.execute(
        f"INSERT INTO {ledger.runs} (job, slot, host, pid, finished_at, outcome)"
        " VALUES ($1, $2, 'old-host', 1, clock_timestamp(), 'succeeded')",
        old,
        SLOT,
    )
    # Without create_table the locker says what to do; the command line too.
    strict = PostgresLocker(
        pg_dsn, application_name=app_name, table=ledger.table, create_table=False
    )
    async with strict:
        with pytest.raises(LockError, match=r"predates.*migrate"):
            await strict.acquire(new_job(), SLOT)
    refused = await cli_here("history", old, "--dsn", pg_dsn, "--table", ledger.table)
    assert refused.returncode == 3 and "migrate" in refused.stderr
    async with PostgresLocker(pg_dsn, application_name=app_name, table=ledger.table) as locker:
        job = new_job()
        lease = await locker.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        lease.record(RunRecord(SLOT, now(), now(), "succeeded"))
        await lease.release()
        assert locker.ledger is not None
        [kept] = await locker.history(old)
        assert (kept.outcome, kept.attempt, kept.owner) == ("succeeded", 1, "old-host:1")
    row = await row_of(admin, ledger, job)
    assert row["session"] is not None and row["attempt"] == 1
    assert row["holder"].startswith(f"{app_name}:")  # its owner, for the crash check
    partial = await admin.fetch(
        "SELECT pg_get_indexdef(indexrelid) AS index FROM pg_index"
        " WHERE indrelid = to_regclass($1) AND indpred IS NOT NULL",
        ledger.runs,
    )
    indexes = " ".join(row["index"] for row in partial)
    assert "finished_at IS NULL" in indexes and "retry_at IS NOT NULL" in indexes
    again = await cli_here("migrate", "--dsn", pg_dsn, "--table", ledger.table)
    assert again.returncode == 0 and "already there" in again.stdout


async def test_migrate_upgrades_an_old_ledger(pg_dsn: str, admin: Any, ledger: LedgerTable) -> None:
    names = {"runs": ledger.runs, "jobs": ledger.jobs, "slot_idx": f'"{ledger.table}_slot_idx"'}
    for statement in _OLD_DDL:
        await admin.execute(statement.format(**names))
    done = await cli_here("migrate", "--dsn", pg_dsn, "--table", ledger.table)
    assert done.returncode == 0, done.stderr
    assert "upgraded" in done.stdout
    columns = await admin.fetch(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1)"
        " AND attname IN ('session', 'attempt', 'holder')",
        ledger.runs,
    )
    assert len(columns) == 3


async def test_history_and_status_show_crashed_runs_and_reruns(
    pg_dsn: str, admin: Any, ledger: LedgerTable
) -> None:
    async with PostgresLocker(pg_dsn, table=ledger.table) as locker:
        await open_session(locker)
    job = new_job()
    await ghost(admin, ledger, job, SLOT, None, outcome="crashed")
    later = SLOT + timedelta(hours=1)
    await ghost(admin, ledger, job, later, None, outcome="succeeded", attempt=2)
    history = await cli_here("history", job, "--dsn", pg_dsn, "--table", ledger.table)
    assert history.returncode == 0, history.stderr
    rows = history.stdout.splitlines()[2:]
    assert "succeeded (attempt 2)" in rows[0]
    assert rows[1].split()[2] == "crashed"
    status = await cli_here("status", job, "--dsn", pg_dsn, "--table", ledger.table)
    assert status.returncode == 0, status.stderr
    assert "2030-01-01 03:00:00 crashed" in status.stdout


async def test_a_run_cut_off_by_a_lost_lock_is_rerun_with_recover(
    pg_dsn: str, app_name: str, admin: Any, ledger: LedgerTable
) -> None:
    """Found by the soak (benchmarks/soak, a server crash-restart): a run of a
    ``recover=True`` job cut off because its lock session died (outcome ``lock_lost``) was
    never run again, unless another replica happened to mark it crashed before its late
    outcome was written. It is a crash like any other: its slot is rerun, once."""
    locker = PostgresLocker(
        pg_dsn, application_name=app_name, table=ledger.table, sessions=1, heartbeat=0.2
    )
    scheduler = Scheduler(locker=locker)
    events = Events()
    scheduler.subscribe(events)
    work = CutOffFirstRun()
    job = new_job()
    scheduler.add_job(work.task, every(4.0), name=job, recover=True, misfire_grace=60)
    async with scheduler:
        async with asyncio.timeout(30):
            await work.running.wait()
        first = work.slots[0]
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1",
            app_name,
        )
        assert killed >= 1
        async with asyncio.timeout(30):
            while work.reruns() < 1 or not events.of(JobSucceeded):
                await asyncio.sleep(0.05)
            while (await row_of(admin, ledger, job, first))["outcome"] != "succeeded":
                await asyncio.sleep(0.05)
    assert [lost.slot for lost in events.of(LockLost)] == [first]
    [crashed] = events.of(JobCrashed)
    assert (crashed.slot, crashed.recovered) == (first, True)
    assert work.reruns() == 1
    row = await row_of(admin, ledger, job, first)
    assert (row["outcome"], row["attempt"]) == ("succeeded", 2)
