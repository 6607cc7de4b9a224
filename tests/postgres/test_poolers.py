"""Where services really run: behind a transaction pooler, and in fleets that would take
every connection of the server in session mode.

Against a real PgBouncer 1.18 in transaction mode (tests/postgres/pgbouncer.py) and a
throwaway cluster with a low ``max_connections`` (cluster.py); no mocks.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from cronlock import (
    JobCrashed,
    JobStarted,
    JobSucceeded,
    LockLost,
    PoolerDetected,
    RunContext,
    Scheduler,
    every,
)
from cronlock.postgres import PostgresHold, PostgresLocker, job_lock_key, locked_run
from cronlock.postgres._sql.tables import LedgerTable

from .cluster import Cluster
from .conftest import ADVISORY_HERE, throwaway_cluster
from .events import CutOffFirstRun, Events
from .proxy import TcpProxy, via
from .test_exactly_once import Fleet, analyse

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("cache", [0, 100], ids=["no-statement-cache", "asyncpg-default"])
async def test_the_default_locker_through_pgbouncer_refuses_loudly_and_runs_nothing(
    pgbouncer_dsn: str, server_schema: str, cache: int
) -> None:
    """Session mode (the default) through a transaction pooler would lose most runs
    silently: its locks would land on backends it does not own. It refuses instead, at
    start: ``async with scheduler`` raises PoolerDetected (a LockerMisconfigured) naming the
    fix, and no run starts. With asyncpg's statement cache as it
    comes, the pooler may first show as clashing prepared statements: the same refusal."""
    locker = PostgresLocker(
        pgbouncer_dsn, schema=server_schema, connect_kwargs={"statement_cache_size": cache}
    )
    scheduler = Scheduler(locker=locker)
    events = Events()
    scheduler.subscribe(events)
    ran: list[datetime] = []

    async def job(ctx: RunContext) -> None:
        ran.append(ctx.slot)

    scheduler.add_job(job, every(0.5), name="refused")
    with pytest.raises(PoolerDetected, match="mode='lease'"):
        async with scheduler:
            pytest.fail("started through a pooler in session mode")
    assert ran == []
    assert events.count(JobStarted) == 0
    assert not scheduler.running


async def test_lease_mode_on_a_pool_through_pgbouncer_holds_no_connection_while_it_runs(
    pgbouncer_dsn: str, server_schema: str
) -> None:
    """Given the user's pool, every statement borrows a connection for itself alone: while
    the run goes on (its lease renewed meanwhile), the locker holds none."""
    pool = await asyncpg.create_pool(pgbouncer_dsn, min_size=0, max_size=3, statement_cache_size=0)
    try:
        async with PostgresLocker(pool, mode="lease", schema=server_schema, lease=2) as locker:
            lease = await locker.acquire("pooled", SLOT)
            assert isinstance(lease, PostgresHold)
            await asyncio.sleep(1.5)  # past a renewal (every lease / 4 = 0.5 s)
            assert pool.get_size() - pool.get_idle_size() == 0
            assert not lease.lost
            assert locker.statistics().statements >= 2  # the claim and a renewal at least
            await lease.release()
            assert await locker.acquire("pooled", SLOT) == "already_ran"
            [run] = await locker.history("pooled")
            assert run.slot == SLOT
    finally:
        await pool.close()


async def test_a_lease_holder_cut_off_is_fenced_before_another_replica_takes_the_job(
    pg_server: str, server_schema: str
) -> None:
    """Replica A's network to the server freezes mid-run: it cannot renew, so it ends its
    run (LockLost) before its lease could expire; replica B gets the job only after that."""
    where = urlsplit(pg_server)
    proxy = TcpProxy(where.hostname or "127.0.0.1", where.port or 5432)
    await proxy.start()
    lost_at: list[float] = []
    try:
        a = PostgresLocker(via(pg_server, proxy.port), mode="lease", schema=server_schema, lease=2)
        b = PostgresLocker(pg_server, mode="lease", schema=server_schema, lease=2)
        async with a, b:
            lease = await a.acquire("fenced", SLOT)
            assert isinstance(lease, PostgresHold)
            lease.on_lost(lambda _: lost_at.append(time.monotonic()))
            proxy.set_mode("freeze")
            later = SLOT + timedelta(minutes=1)
            granted = None
            for _ in range(100):
                answer = await b.acquire("fenced", later)
                if isinstance(answer, PostgresHold):
                    granted = time.monotonic()
                    await answer.release()
                    break
                assert answer == "locked"
                await asyncio.sleep(0.1)
            assert granted is not None, "B never got the job once A's lease expired"
            assert lost_at and lost_at[0] < granted
            proxy.set_mode("pass")
            await lease.release()
    finally:
        await proxy.close()


@pytest.fixture(scope="module")
def small_server() -> Iterator[Cluster]:
    """A throwaway cluster with ``max_connections = 30``, stopped at the end."""
    cluster = throwaway_cluster(max_connections=30)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.mark.slow
async def test_a_fleet_of_25_replicas_in_lease_mode_fits_a_server_of_30_connections(
    small_server: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In session mode 25 replicas would want 100 lock sessions. In lease mode each holds
    one connection at most: every slot runs once, with no connection refused."""
    replicas, slots = 25, 8
    dsn = small_server.dsn
    fleet = Fleet(tmp_path)
    peak = 0
    admin = await asyncpg.connect(dsn)
    try:
        start = float(math.ceil(time.time()) + 20)  # 25 processes take a while to start
        for rid in range(1, replicas + 1):
            fleet.spawn(
                "fleet", dsn, "fleet-job", rid, start, slots, "--mode", "lease", "--hold", "0.1"
            )
        while time.time() < start + slots + 2:
            count = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
            peak = max(peak, count)
            await asyncio.sleep(0.2)
        records = await asyncio.to_thread(fleet.records, "fleet")
    finally:
        fleet.kill()
        await admin.close()
    expected = [start + k for k in range(slots)]
    seen = analyse(records, expected)
    with capsys.disabled():
        print("\n" + seen.line(f"{replicas} lease-mode replicas, max_connections = 30"))
        print(f"[measured] peak server connections of {replicas} replicas: {peak}")
    assert (seen.duplicates, seen.missed, seen.lock_failed) == (0, 0, 0)
    assert seen.ran_once == slots
    assert peak <= replicas


async def test_locked_run_through_pgbouncer_refuses_and_takes_no_lock(
    pgbouncer_dsn: str, pg_server: str
) -> None:
    """The standalone recipe needs a session too: through the pooler it takes no lock on a
    stranger's backend (the try-lock runs only on the backend the connection announced)."""
    name = f"standalone-{uuid.uuid4().hex[:8]}"
    pool = await asyncpg.create_pool(pgbouncer_dsn, min_size=0, max_size=2, statement_cache_size=0)
    try:
        with pytest.raises(PoolerDetected, match="direct connection"):
            async with locked_run(pool, name):
                pass
    finally:
        await pool.close()
    direct = await asyncpg.connect(pg_server)
    try:
        held = await direct.fetchval(
            f"SELECT count(*) FROM pg_locks WHERE {ADVISORY_HERE}"
            " AND ((classid::int8 << 32) | objid::int8) = $1",
            job_lock_key(name),
        )
    finally:
        await direct.close()
    assert held == 0


async def test_locked_run_for_a_slot_through_pgbouncer_refuses_and_claims_nothing(
    pgbouncer_dsn: str, pg_server: str, server_schema: str
) -> None:
    """With a slot too, the pooler is refused before the ledger is touched: no table made,
    no slot claimed, no lock taken."""
    name = f"standalone-{uuid.uuid4().hex[:8]}"
    slot = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
    pool = await asyncpg.create_pool(pgbouncer_dsn, min_size=0, max_size=2, statement_cache_size=0)
    try:
        with pytest.raises(PoolerDetected, match="direct connection"):
            async with locked_run(pool, name, slot=slot, schema=server_schema):
                pass
    finally:
        await pool.close()
    ledger = LedgerTable(schema=server_schema)
    direct = await asyncpg.connect(pg_server)
    try:
        made = await direct.fetchval("SELECT to_regclass($1)", ledger.runs)
        held = await direct.fetchval(
            f"SELECT count(*) FROM pg_locks WHERE {ADVISORY_HERE}"
            " AND ((classid::int8 << 32) | objid::int8) = $1",
            ledger.lock_key(name),
        )
    finally:
        await direct.close()
    assert (made, held) == (None, 0)


async def test_a_fenced_run_of_a_recover_job_is_rerun_once(
    pg_server: str, server_schema: str
) -> None:
    """Found by the soak: a lease-mode run cut off by its fence (its network froze, so it
    could not renew) ended ``lock_lost`` and its slot was never run again. With
    ``recover=True`` it is, once, when the replica is back."""
    where = urlsplit(pg_server)
    proxy = TcpProxy(where.hostname or "127.0.0.1", where.port or 5432)
    await proxy.start()
    locker = PostgresLocker(via(pg_server, proxy.port), mode="lease", schema=server_schema, lease=2)
    scheduler = Scheduler(locker=locker)
    seen = Events()
    scheduler.subscribe(seen)
    work = CutOffFirstRun()
    scheduler.add_job(work.task, every(4.0), name="fenced", recover=True, misfire_grace=60)
    try:
        async with scheduler:
            async with asyncio.timeout(30):
                await work.running.wait()
            proxy.set_mode("freeze")
            async with asyncio.timeout(30):
                while not seen.of(LockLost):
                    await asyncio.sleep(0.05)
            proxy.set_mode("pass")
            proxy.cut()  # the frozen connections are gone: the locker opens a new one
            async with asyncio.timeout(30):
                while work.reruns() < 1 or not seen.of(JobSucceeded):
                    await asyncio.sleep(0.05)
            [run] = [r for r in await locker.history("fenced") if r.slot == work.slots[0]]
    finally:
        await proxy.close()
    [crashed] = seen.of(JobCrashed)
    assert (crashed.slot, crashed.recovered) == (work.slots[0], True)
    assert (run.outcome, run.attempt) == ("succeeded", 2)
