"""Crashed runs with real replica processes: SIGKILL one mid-run, watch the others.

Replica A runs the job's one slot for a minute and is killed with SIGKILL mid-run. The
watchers B and C were started after A claimed the slot, so they have nothing of their own
to run; their lockers find A's ledger row unfinished with its lock session gone (session
mode) or its lease expired (lease mode, through PgBouncer), one of them marks it
``crashed`` and emits ``JobCrashed``, and with ``recover=True`` (and the slot within
``misfire_grace``) that one reruns it, once.

The logic around it runs in the simulation, on a virtual clock, in both modes
(``tests/sim/test_crashes.py``): a crashed run is not rerun without ``recover``, nor past
its grace, and one of two watchers reruns it once. This is its real-process, real-server
case: a real SIGKILL, the server's own end of the killed session (or the lease left to
expire behind PgBouncer), and a real rerun.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from cronlock import RunRecord
from cronlock.postgres._locker.crashes import CHECK_EVERY
from cronlock.postgres._ops.fleet import read_runs
from cronlock.postgres._sql.tables import LedgerTable

from ..eventually import eventually
from .conftest import Coordination
from .test_replicas import Record, Replica, booted_then_go

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
    history: RunRecord  # the slot's run as the ledger's history reads it, with attempt 1


async def _crash(
    coordination: Coordination, admin: Any, ledger: LedgerTable, *, members_every: float = 1
) -> Outcome:
    job = f"crash-{uuid.uuid4()}"
    # Lease mode: the replicas hand the locker a pool of their own, through PgBouncer.
    pooled = ("--pool",) if coordination.mode == "lease" else ()
    # Heartbeats every second: a killed replica's members row expires 3 s after its last
    # one (45 s by default), and its run is crashed once that row and its session (or
    # lease) are gone. *members_every* 15 (the default): the row stays, and session mode
    # tells the kill by the session that row names (_sql/crashes.sessions_gone).
    every = ("--members-every", str(members_every)) if members_every != 15 else ()
    table = ["--table", ledger.table, *every, *coordination.args, *pooled]
    dsn = coordination.dsn
    # A boots first and is given the slot then: however slowly a busy machine starts it,
    # it is up for its slot; and a slot it could not claim in time (its first connection,
    # through PgBouncer on a busy machine, can take seconds) it runs late, within a grace.
    a = Replica(dsn, job, 1, None, 1, hold=60, extra=[*table, "--misfire-grace", "60"])
    others: list[Replica] = []
    try:
        start = await asyncio.to_thread(booted_then_go, [a])
        await eventually(lambda: a.of("start"), "replica A starts its run")
        # The watchers stay until killed (--until is only a backstop); their one slot is
        # A's, past before they run: they have nothing of their own to run.
        flags = [*table, "--misfire-grace", "60", "--until", str(time.time() + 300), "--recover"]
        others = [Replica(dsn, job, rid, start, 1, hold=0.5, extra=flags) for rid in (2, 3)]
        await eventually(
            lambda: all(replica.of("running") for replica in others), "the watchers running"
        )
        row = await admin.fetchrow(f"SELECT * FROM {ledger.runs} WHERE job = $1", job)
        assert (row["pid"], row["outcome"], row["attempt"]) == (a.proc.pid, None, 1)
        await eventually(
            lambda: admin.fetchval(
                f"SELECT session IS NOT NULL OR $2 FROM {ledger.members} WHERE holder = $1",
                row["holder"],
                coordination.mode == "lease",
            ),
            "replica A's first heartbeat",
            60,
        )
        killed_at = time.time()
        a.kill()

        def said(event: str) -> list[Record]:
            return [r for replica in others for r in replica.of(event)]

        [first, *_] = await eventually(
            lambda: said("crashed"), "a watcher marks the killed replica's run crashed"
        )
        if first["recovered"]:
            await eventually(lambda: said("end"), "the rerun ends")
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
    [history] = await read_runs(admin, ledger, job, 5)
    return Outcome(
        killed=a,
        watchers=others,
        crashed=[r for r in records if r["event"] == "crashed"],
        runs=[r for r in records if r["event"] == "start"],
        row=row,
        noticed_after=first["t"] - killed_at,
        history=history,
    )


def _owner(replica: Replica) -> str:
    return f"{socket.gethostname()}:{replica.proc.pid}"


async def test_with_recover_one_of_two_replicas_reruns_the_slot_exactly_once(
    coordination: Coordination, admin: Any, ledger: LedgerTable, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = await _crash(coordination, admin, ledger)
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
    # The killed run is the slot's attempt 1 in the ledger's history: crashed, A's.
    [killed] = seen.history.attempts
    assert (killed.attempt, killed.outcome, killed.owner) == (1, "crashed", _owner(seen.killed))
    assert killed.error is not None and "died mid-run" in killed.error
    assert killed.finished_at is not None
    assert (seen.history.attempt, seen.history.outcome) == (2, "succeeded")


@pytest.mark.parametrize("coordination", ["session"], indirect=True)
async def test_session_mode_tells_a_killed_replica_by_its_sessions_not_its_rows_expiry(
    coordination: Coordination, admin: Any, ledger: LedgerTable, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the default heartbeat (a members row lives 45 s), a killed session-mode
    replica's run is crashed and rerun once both its lock session and the session its row
    names are gone from the server: its row has not expired, so the reason tells which
    rule did it. (Lease mode keeps the expiry rule: its pool's connections say nothing.)"""
    seen = await _crash(coordination, admin, ledger, members_every=15)
    with capsys.disabled():
        print(f"\n[measured] kill told by its sessions {seen.noticed_after:.2f}s after SIGKILL")
    [crashed] = seen.crashed
    assert crashed["recovered"] is True and crashed["owner"] == _owner(seen.killed)
    [rerun] = seen.runs
    assert rerun["replica"] == crashed["replica"]
    [killed] = seen.history.attempts
    assert killed.outcome == "crashed"
    assert killed.error is not None
    assert killed.error.endswith("lock session and membership session gone")
    assert (seen.row["outcome"], seen.row["attempt"]) == ("succeeded", 2)
