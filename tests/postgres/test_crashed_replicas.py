"""Crashed runs with real replica processes: SIGKILL one mid-run, watch the others.

Replica A runs the job's one slot for a minute and is killed with SIGKILL mid-run. The
watchers (B, and C when there are two) were started after A claimed the slot, so they
have nothing of their own to run; their lockers find A's ledger row unfinished with its
lock session gone (session mode) or its lease expired (lease mode, through PgBouncer), one
of them marks it ``crashed`` and emits ``JobCrashed``, and with ``recover=True`` (and the
slot within ``misfire_grace``) that one reruns it, once.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from cronlock.postgres._locker.crashes import CHECK_EVERY
from cronlock.postgres._sql.tables import LedgerTable

from .conftest import Coordination
from .test_replicas import Record, Replica

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
async def ledger(admin: Any, coordination: Coordination) -> AsyncIterator[LedgerTable]:
    """A ledger table of this test's own, where its replicas keep it; dropped afterwards."""
    table = coordination.table(f"crash_{uuid.uuid4().hex[:10]}")
    try:
        yield table
    finally:
        await admin.execute(
            f"DROP TABLE IF EXISTS {table.runs}, {table.jobs}, {table.control}, {table.leases}"
        )


@dataclass
class Outcome:
    killed: Replica
    watchers: list[Replica]
    crashed: list[Record]  # "crashed" lines of every watcher
    runs: list[Record]  # "start" lines of every watcher
    row: Any  # the slot's ledger row at the end
    noticed_after: float  # seconds from SIGKILL to the first JobCrashed


async def _wait(replicas: Sequence[Replica], event: str, timeout: float) -> Record | None:
    """The first line of kind *event* from any of *replicas* (they are polled in turn)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for replica in replicas:
            found = await asyncio.to_thread(
                replica.wait_for, lambda r: r["event"] == event, timeout=0.1
            )
            if found is not None:
                return found
    return None


async def _crash(
    coordination: Coordination,
    admin: Any,
    ledger: LedgerTable,
    *,
    recover: bool,
    grace: float,
    watchers: int,
    kill_after: float = 0.0,
) -> Outcome:
    job = f"crash-{uuid.uuid4()}"
    # The slot leaves a replica process time to start on a busy machine (an import and a
    # connection can take seconds there): one that came up after it would never run it.
    start = float(math.ceil(time.time()) + 10)
    # Lease mode: the replicas hand the locker a pool of their own, through PgBouncer.
    pooled = ("--pool",) if coordination.mode == "lease" else ()
    # Heartbeats every second: a killed replica's members row expires 3 s after its last
    # one (45 s by default), and its run is crashed once that row and its session (or
    # lease) are gone.
    table = ["--table", ledger.table, "--members-every", "1", *coordination.args, *pooled]
    dsn = coordination.dsn
    a = Replica(dsn, job, 1, start, 1, hold=60, extra=table)
    others: list[Replica] = []
    try:
        began = await asyncio.to_thread(a.wait_for, lambda r: r["event"] == "start", timeout=60)
        assert began is not None, "replica A never started its run"
        # The watchers stay until killed (--until is only a backstop).
        flags = [*table, "--misfire-grace", str(grace), "--until", str(time.time() + 300)]
        if recover:
            flags.append("--recover")
        others = [
            Replica(dsn, job, rid, start, 1, hold=0.5, extra=flags)
            for rid in range(2, 2 + watchers)
        ]
        for replica in others:
            running = await asyncio.to_thread(
                replica.wait_for, lambda r: r["event"] == "running", timeout=60
            )
            assert running is not None, f"replica {replica.id} never started"
        row = await admin.fetchrow(f"SELECT * FROM {ledger.runs} WHERE job = $1", job)
        assert (row["pid"], row["outcome"], row["attempt"]) == (a.proc.pid, None, 1)
        await asyncio.sleep(max(0.0, start + kill_after - time.time()))
        killed_at = time.time()
        a.kill()
        first = await _wait(others, "crashed", timeout=60)
        assert first is not None, "no replica marked the killed replica's run crashed"
        if first["recovered"]:
            assert await _wait(others, "end", timeout=60) is not None, "the rerun never ended"
        # Watch a while longer: every watcher checks for crashes twice more meanwhile.
        await asyncio.sleep(2 * CHECK_EVERY + 1)
        for replica in others:
            replica.kill()
        records = [r for replica in others for r in await asyncio.to_thread(replica.finish)]
    finally:
        a.close()
        for replica in others:
            replica.close()
    assert not [r for r in records if r["event"] == "lock_failed"]
    row = await admin.fetchrow(f"SELECT * FROM {ledger.runs} WHERE job = $1", job)
    return Outcome(
        killed=a,
        watchers=others,
        crashed=[r for r in records if r["event"] == "crashed"],
        runs=[r for r in records if r["event"] == "start"],
        row=row,
        noticed_after=first["t"] - killed_at,
    )


def _owner(replica: Replica) -> str:
    return f"{socket.gethostname()}:{replica.proc.pid}"


async def test_a_killed_replicas_run_is_marked_crashed_and_not_rerun_without_recover(
    coordination: Coordination, admin: Any, ledger: LedgerTable, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = await _crash(coordination, admin, ledger, recover=False, grace=60, watchers=1)
    with capsys.disabled():
        print(f"\n[measured] crash noticed {seen.noticed_after:.2f}s after SIGKILL (recover off)")
    [crashed] = seen.crashed
    assert crashed["owner"] == _owner(seen.killed)
    assert crashed["recovered"] is False
    assert seen.runs == []
    row = seen.row
    assert (row["outcome"], row["attempt"], row["pid"]) == ("crashed", 1, seen.killed.proc.pid)
    assert "died mid-run" in row["error"]
    assert row["finished_at"] is not None


async def test_with_recover_one_of_two_replicas_reruns_the_slot_exactly_once(
    coordination: Coordination, admin: Any, ledger: LedgerTable, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = await _crash(coordination, admin, ledger, recover=True, grace=60, watchers=2)
    with capsys.disabled():
        print(
            f"\n[measured] crash noticed {seen.noticed_after:.2f}s after SIGKILL; "
            f"reruns with three replicas (one killed): {len(seen.runs)}"
        )
    [crashed] = seen.crashed  # one replica marked it, and only it reported it
    assert crashed["recovered"] is True
    assert crashed["owner"] == _owner(seen.killed)
    [rerun] = seen.runs  # the other watcher did not run it too
    assert rerun["replica"] == crashed["replica"]
    assert rerun["slot"] == crashed["slot"]
    [rerunner] = [r for r in seen.watchers if r.id == crashed["replica"]]
    row = seen.row
    assert (row["outcome"], row["attempt"]) == ("succeeded", 2)
    assert (row["host"], row["pid"]) == (socket.gethostname(), rerunner.proc.pid)


async def test_with_recover_a_slot_past_its_grace_is_marked_crashed_and_not_rerun(
    coordination: Coordination, admin: Any, ledger: LedgerTable
) -> None:
    # Killed 3 s after the slot with a grace of 1 s: late whenever the crash is noticed.
    seen = await _crash(
        coordination, admin, ledger, recover=True, grace=1, watchers=1, kill_after=3
    )
    [crashed] = seen.crashed
    assert crashed["recovered"] is False
    assert seen.runs == []
    row = seen.row
    assert (row["outcome"], row["attempt"], row["pid"]) == ("crashed", 1, seen.killed.proc.pid)
