"""A server restarted onto an older snapshot of itself: the runs it lost are written back.

A throwaway cluster (cluster.py) is stopped and its data directory copied (a storage
snapshot); it runs on, a replica claims and ends runs; then it is stopped again and the copy
put back: the same system identifier, the same timeline, no failover to see, and the
ledger lacks the last claims and outcomes. Before, a claim made before the snapshot and
ended after it stayed ``unfinished`` for good, and a run claimed after it vanished from the
ledger (finding E13). Now the replica notices that the server started again (its
postmaster's start time) and writes its recent runs back, as after a failover.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from cronlock import LockUnavailable, RunRecord
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._modes.base import Mode

from ..eventually import eventually
from .cluster import Cluster

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

_BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)


def slot(n: int) -> datetime:
    return _BASE + timedelta(minutes=n)


def record(at: datetime) -> RunRecord:
    return RunRecord(at, at, at + timedelta(seconds=1), "succeeded")


def snapshot(cluster: Cluster) -> str:
    """Stop *cluster*, copy its data directory (ownership kept), start it again."""
    copy = os.path.join(os.path.dirname(cluster.data), f"snapshot-{uuid.uuid4().hex[:6]}")
    cluster.stop()
    shutil.copytree(cluster.data, copy, symlinks=True, copy_function=_copy_owned)
    _own_like(cluster.data, copy)
    cluster.start()
    return copy


def restore(cluster: Cluster, copy: str) -> None:
    """Stop *cluster*, put the data directory *copy* back in its place, start it again."""
    cluster.stop()
    shutil.rmtree(cluster.data)
    os.rename(copy, cluster.data)
    cluster.start()


def _copy_owned(source: str, target: str) -> None:
    shutil.copy2(source, target)
    info = os.stat(source)
    os.chown(target, info.st_uid, info.st_gid)


def _own_like(source: str, target: str) -> None:
    for root, dirs, _ in os.walk(target):
        for name in dirs:
            relative = os.path.relpath(os.path.join(root, name), target)
            info = os.stat(os.path.join(source, relative))
            os.chown(os.path.join(root, name), info.st_uid, info.st_gid)
            os.chmod(os.path.join(root, name), info.st_mode)
    info = os.stat(source)
    os.chown(target, info.st_uid, info.st_gid)
    os.chmod(target, info.st_mode)


async def rows(cluster: Cluster, table: str, job: str) -> dict[datetime, asyncpg.Record]:
    conn = await asyncpg.connect(cluster.dsn)
    try:
        found = await conn.fetch(f'SELECT slot, outcome FROM "{table}" WHERE job = $1', job)
    finally:
        await conn.close()
    return {row["slot"]: row for row in found}


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_the_runs_a_restored_snapshot_lost_are_written_back(
    mode: Mode, restartable_pg: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = restartable_pg
    table = f"sr_{uuid.uuid4().hex[:8]}"
    job = "nightly"
    locker = PostgresLocker(cluster.dsn, mode=mode, table=table, racers=None)
    told: list[tuple[str, datetime, str | None]] = []
    locker.on_failover(lambda *said: told.append(said))
    async with locker:
        first = await locker.acquire(job, slot(0))
        assert isinstance(first, PostgresHold), first
        first.record(record(slot(0)))
        await first.release()
        # Claimed before the snapshot, ended after it: the snapshot has it unfinished.
        straddling = await locker.acquire(job, slot(1))
        assert isinstance(straddling, PostgresHold), straddling
        copy = await asyncio.to_thread(snapshot, cluster)

        probes = iter(range(10, 1000))

        async def answered() -> bool:
            """A claim of a slot of another job gets through (a new slot each time)."""
            try:
                hold = await locker.acquire("probe", slot(next(probes)))
            except LockUnavailable:  # the server is not back yet
                return False
            if not isinstance(hold, PostgresHold):
                return False
            await hold.release()
            return True

        await eventually(answered, "a claim gets through after the snapshot", 60, every=0.2)
        lost = await rows(cluster, table, job)  # what the snapshot holds, and the restore brings
        straddling.record(record(slot(1)))
        await straddling.release()
        later = await locker.acquire(job, slot(2))  # claimed and ended after the snapshot
        assert isinstance(later, PostgresHold), later
        later.record(record(slot(2)))
        await later.release()
        before = await rows(cluster, table, job)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="cronlock"):
            await asyncio.to_thread(restore, cluster, copy)

            async def written_back() -> bool:
                now = await rows(cluster, table, job)
                return all(now.get(s) is not None and now[s]["outcome"] for s in before)

            # The replica notices at its next connection: a claim makes one.
            await eventually(answered, "a claim gets through after the restore", 60, every=0.2)
            await eventually(written_back, "every run of the job back in the ledger", 30)
        after = await rows(cluster, table, job)
    # The restore brought back a ledger without them (else this test shows nothing) ...
    assert slot(2) not in lost and lost[slot(1)]["outcome"] is None, lost
    # ... and they are back, each as it ended here. (In session mode the run that straddled
    # the snapshot lost its lock with the stop, and its outcome did not reach the ledger
    # then; the locker remembered it, and wrote it back too.)
    assert [after[s]["outcome"] for s in (slot(0), slot(1), slot(2))] == ["succeeded"] * 3
    assert (job, slot(1), None) in told and (job, slot(2), None) in told, told
    messages = [r.getMessage() for r in caplog.records]
    assert sum("the server restarted" in m for m in messages) == 1, messages
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("The restarted server lacked" in m for m in warnings), warnings
    assert not any("new primary" in m for m in messages), messages
