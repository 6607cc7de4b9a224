"""A new primary that lacks the last runs: noticed, written back, and no slot run twice.

A throwaway primary and a streaming standby (cluster.py). The standby is stopped while
the primary takes more claims, outcomes and lease releases, then the primary crashes and
the standby, started again, is promoted: the standby lagged, as an asynchronous one can,
and the new primary lacks what the old one acknowledged last. Replicas given both hosts
(``target_session_attrs=read-write``) then

- notice the new primary at their next connection (one WARNING naming both servers);
- write back the claims and outcomes the failover lost (``RunRestored``), so the ledger
  holds every run that happened and another replica's claim of such a slot is answered
  ``already_ran``;
- claim no slot due before the change until the fleet had time to write back
  (``LockUnavailable``, the slot then owed as across any outage);
- in lease mode, release the leases whose release was lost, so a live replica does not
  hold a job off until its lease expires, and keep the lease of a run still in flight;
- report a slot that another replica ran before the write back (``SlotRanTwice``, ERROR).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from cronlock import LockUnavailable, RunRecord
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._modes.base import Mode

from ..eventually import eventually
from .cluster import Cluster
from .test_failover import hosts

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

MODES: list[Mode] = ["session", "lease"]


_BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)


def slot(n: int) -> datetime:
    """The *n*-th of the test's slots, all due before the failover (an hour ago)."""
    return _BASE + timedelta(minutes=n)


def record(at: datetime) -> RunRecord:
    return RunRecord(at, at, at + timedelta(seconds=1), "succeeded")


async def run_once(locker: PostgresLocker, job: str, at: datetime) -> None:
    hold = await locker.acquire(job, at)
    assert isinstance(hold, PostgresHold), hold
    hold.record(record(at))
    await hold.release()


async def replayed(standby: Cluster, table: str, job: str, at: datetime) -> None:
    """Wait until the standby has replayed the row of (*job*, *at*)."""
    conn = await asyncpg.connect(standby.dsn)

    async def there() -> bool:
        try:
            return bool(
                await conn.fetchval(
                    f'SELECT count(*) FROM "{table}" WHERE job = $1 AND slot = $2', job, at
                )
            )
        except asyncpg.UndefinedTableError:
            return False  # the table itself is not replayed yet

    try:
        await eventually(there, f"the standby replayed {job} {at}", every=0.1)
    finally:
        await conn.close()


async def fail_over(primary: Cluster, standby: Cluster) -> None:
    """The primary crashes; the standby, which stopped receiving a while ago, is promoted."""
    await asyncio.to_thread(primary.crash)
    await asyncio.to_thread(standby.start)
    await asyncio.to_thread(standby.promote)


@contextlib.contextmanager
def refusing(cluster: Cluster, user: str) -> Iterator[None]:
    """*cluster*, while stopped and started inside the block, refuses *user*'s
    connections (a first line of pg_hba.conf); the file is as it was after the block,
    read again by :func:`reload_config` on a running server."""
    path = os.path.join(cluster.data, "pg_hba.conf")
    with open(path) as file:
        before = file.read()
    with open(path, "w") as file:
        file.write(f"host all {user} 127.0.0.1/32 reject\n{before}")
    try:
        yield
    finally:
        with open(path, "w") as file:
            file.write(before)


async def reload_config(cluster: Cluster) -> None:
    conn = await asyncpg.connect(cluster.dsn)
    try:
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def answer(locker: PostgresLocker, job: str, at: datetime) -> Any:
    """*locker*'s answer to a claim of *at* once the server can be reached, and the
    refusals it gave meanwhile (LockUnavailable's messages)."""
    refused: list[str] = []

    async def answered() -> tuple[Any] | None:
        try:
            return (await locker.acquire(job, at),)  # a tuple: true whatever the answer
        except LockUnavailable as exc:
            refused.append(str(exc))
            return None

    (got,) = await eventually(answered, "an answer once the server is reached", 90, every=0.2)
    return got, refused


@pytest.mark.parametrize("mode", MODES)
async def test_runs_the_failover_lost_are_written_back_before_a_slot_runs_again(
    mode: Mode, ha_pair: tuple[Cluster, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    primary, standby = ha_pair
    dsn = hosts(primary.dsn, primary.port, standby.port, query="target_session_attrs=read-write")
    table = f"np_{uuid.uuid4().hex[:8]}"
    job, other_job = "nightly", "hourly"
    a = PostgresLocker(dsn, mode=mode, table=table, racers=None)
    b = PostgresLocker(dsn, mode=mode, table=table, racers=None)
    restored: list[tuple[str, datetime, str | None]] = []
    a.on_failover(lambda *told: restored.append(told))
    async with a, b:
        await run_once(a, job, slot(0))
        await run_once(b, other_job, slot(0))  # b has seen the old primary too
        await replayed(standby, table, job, slot(0))
        await asyncio.to_thread(standby.stop)  # from here on the standby lags
        await run_once(a, job, slot(1))  # claim and outcome: on the old primary only
        await run_once(a, other_job, slot(1))  # lease mode: a release the failover loses
        in_flight = await a.acquire(job, slot(2))
        assert isinstance(in_flight, PostgresHold)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="cronlock"):
            await fail_over(primary, standby)
            # b reconnects first: the slot a ran is not claimed before a wrote it back.
            got, refused = await answer(b, job, slot(1))
            assert got == "already_ran"
            assert any("new primary" in message for message in refused), refused
            # The outcome a's claim lost came back with it, and the run in flight is a's.
            check = await asyncpg.connect(standby.dsn)
            try:
                rows = {
                    r["slot"]: r
                    for r in await check.fetch(
                        f'SELECT slot, outcome, holder FROM "{table}" WHERE job = $1', job
                    )
                }
            finally:
                await check.close()
            assert rows[slot(1)]["outcome"] == "succeeded"
            assert rows[slot(2)]["outcome"] is None
            assert rows[slot(1)]["holder"] == rows[slot(0)]["holder"]
            assert [(j, s) for j, s, other in restored if other is None] == [
                (job, slot(1)),
                (other_job, slot(1)),
                (job, slot(2)),
            ] or sorted((j, s) for j, s, _ in restored) == sorted(
                [(job, slot(1)), (other_job, slot(1)), (job, slot(2))]
            )
            if mode == "lease":
                # The lost release of other_job's lease: b takes the job at once.
                assert isinstance(await b.acquire(other_job, slot(3)), PostgresHold)
                # The run in flight kept its lease: b cannot take its job.
                assert await b.acquire(job, slot(3)) == "locked"
            in_flight.record(record(slot(2)))
            await in_flight.release()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("connected to a new primary" in m for m in warnings) == 2, warnings  # a, b
    assert sum("lacked" in m for m in warnings) == 1, warnings
    # Session mode: the run in flight lost its lock with its session (one ERROR says so);
    # a failover slow enough to outlast a connect attempt (a loaded machine) is an outage,
    # said once per locker at most.
    errors = [m for m in warnings if "dropped" not in m]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    outage = [m for m in said if m in errors and "cannot connect" in m]
    assert len(outage) <= 2, outage  # a, b
    assert not [m for m in said if m in errors and "cannot connect" not in m]
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("mode", MODES)
async def test_a_slot_another_replica_ran_before_the_write_back_is_reported(
    mode: Mode, ha_pair: tuple[Cluster, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    """A replica that never knew the old primary claims the lost slot first: the slot ran
    twice, and the replica that wrote it back says so at ERROR, with the other's name."""
    primary, standby = ha_pair
    conn = await asyncpg.connect(primary.dsn)
    try:
        await conn.execute("CREATE ROLE replica_a LOGIN SUPERUSER")
    finally:
        await conn.close()
    dsn = hosts(primary.dsn, primary.port, standby.port, query="target_session_attrs=read-write")
    dsn = dsn.replace("postgres@", "replica_a@", 1)
    table = f"np_{uuid.uuid4().hex[:8]}"
    a = PostgresLocker(dsn, mode=mode, table=table, racers=None)
    told: list[tuple[str, datetime, str | None]] = []
    a.on_failover(lambda *what: told.append(what))
    async with a:
        await run_once(a, "report", slot(0))
        await replayed(standby, table, "report", slot(0))  # and the role, made before
        await asyncio.to_thread(standby.stop)
        await run_once(a, "report", slot(1))
        async with contextlib.AsyncExitStack() as stack:
            with refusing(standby, "replica_a"):  # a reconnects at once: it must come second
                await fail_over(primary, standby)
                late = PostgresLocker(standby.dsn, mode=mode, table=table, racers=None)
                await stack.enter_async_context(late)
                await run_once(late, "report", slot(1))  # a new replica: nothing to wait for
            await reload_config(standby)
            with caplog.at_level(logging.INFO, logger="cronlock"):
                got, _ = await answer(a, "report", slot(2))  # a reconnects, writes back
                assert isinstance(got, PostgresHold)
                await got.release()
                await eventually(lambda: told, "the write back told", every=0.1)
            assert told == [("report", slot(1), late._holder)]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    twice = [message for message in errors if "ran twice" in message]
    assert len(twice) == 1 and "report" in twice[0], errors
