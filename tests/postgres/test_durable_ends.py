"""An end another replica acts on survives a crash of the server right after it was
acknowledged (issue 35, item 2).

A lease released with its run's outcome, and the outcome of a session-mode run, are acted
on by other replicas: the lease lets the next claim of the job through, the outcome decides
catch-up, retries and reruns. So their commit must be as durable as the session's. Before,
the end statement turned ``synchronous_commit`` off for its transaction: acknowledged,
then lost at a crash, and the restarted server (or a standby promoted after it) showed the
lease still held by the old holder, blocking the job for up to ``lease`` seconds.

The throwaway server keeps ``fsync`` on and ``synchronous_commit`` at its default, and its
WAL writer is made lazy (it wakes every 10 s, flushes after 64 MB), so that a commit that
does not wait for its flush is still in memory when the server is stopped with
``pg_ctl stop -m immediate`` (a crash) a moment after the acknowledgement: on the old code
the lost release is the rule, not a race.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Literal

import asyncpg
import pytest

from cronlock import RunRecord
from cronlock.postgres import PostgresHold, PostgresLocker

from .cluster import Cluster
from .conftest import throwaway_cluster

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
LAZY_WAL_WRITER = "-c wal_writer_delay=10000 -c wal_writer_flush_after=64MB -c fsync=on"


@pytest.fixture(scope="module")
def lazy_cluster() -> Iterator[Cluster]:
    """A throwaway cluster whose WAL writer flushes asynchronous commits only every 10 s."""
    cluster = throwaway_cluster(options=LAZY_WAL_WRITER)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_an_end_acknowledged_before_a_crash_is_there_after_the_restart(
    lazy_cluster: Cluster, app_name: str, mode: Literal["session", "lease"]
) -> None:
    lazy_cluster.start()  # a test that stopped it, then failed, left it down
    job = f"durable-{uuid.uuid4()}"
    locker = PostgresLocker(
        lazy_cluster.dsn, application_name=app_name, mode=mode, lease=60, sessions=1
    )
    try:
        hold = await locker.acquire(job, SLOT)
        assert isinstance(hold, PostgresHold)
        finished = datetime.now(UTC)
        hold.record(RunRecord(SLOT, finished, finished, "succeeded"))
        await hold.release()  # acknowledged: the end's transaction committed
        # At once, without yielding to the event loop (nothing else of the locker's can
        # commit meanwhile and flush the WAL for it): the server crashes.
        lazy_cluster.stop("immediate")
        lazy_cluster.start()
        conn = await asyncpg.connect(lazy_cluster.dsn)
        try:
            outcome = await conn.fetchval(
                "SELECT outcome FROM cronlock_runs WHERE job = $1 AND slot = $2", job, SLOT
            )
            held_by = await conn.fetchval(
                "SELECT holder FROM cronlock_runs_leases"
                " WHERE job = $1 AND expires_at > clock_timestamp()",
                job,
            )
        finally:
            await conn.close()
    finally:
        await locker.close()
    assert outcome == "succeeded"
    assert held_by is None  # the lease is released: the job is free for the next claim
