"""A pending retry is in the ledger, and another replica makes it (issue 37, item 8).

Before, the replica whose attempt failed was the only one that knew a retry was due: killed
or stopped during the backoff, the slot was never tried again. Now it writes down when the
next attempt is due (the runs table's ``retry_at``); the other replicas' crash checks take a
retry over once it is past due and its replica is gone (members row expired, or deleted by a
graceful stop), with the same guarded takeover as the replica's own: each attempt is claimed
once fleet-wide, ``1 + retries`` attempts in all.

Two replica processes (``retry_replica.py``, job ``flaky`` with ``retries=2``) race for one
slot; the one that ran attempt 1 is killed (SIGKILL) during its backoff; the other makes the
remaining attempts. The same in both modes, killed or stopped (SIGTERM), runs in the
simulation (``tests/sim/test_retries.py``), on a virtual clock; this is its real-process,
real-server case.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from cronlock import RunRecord
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._locker import crashes, members
from cronlock.postgres._locker import upkeep as locker_upkeep
from cronlock.postgres._ops.fleet import read_runs
from cronlock.postgres._sql import upkeep
from cronlock.postgres._sql.tables import DEFAULT_TABLE, LedgerTable, quote_ident

from ..eventually import eventually
from .processes import Processes

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("durable-retries")]

Mode = Literal["session", "lease"]
SCRIPT = Path(__file__).with_name("retry_replica.py")
REPLICA_CHECKS = 1.0  # seconds between crash checks in retry_replica.py (its CHECK_EVERY)
LIVENESS = 120.0  # seconds: a bound on waits that should take seconds, never a measure


@pytest.fixture
async def schema(admin: Any) -> AsyncIterator[str]:
    name = f"retries {uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")


def _tries(run: RunRecord) -> list[tuple[int, str, int]]:
    """The slot's attempts in the ledger: (attempt, outcome, pid of the replica)."""
    return [
        (r.attempt, r.outcome, int((r.owner or ":0").rpartition(":")[2]))
        for r in (*run.attempts, run)
    ]


async def _retry_left_behind(
    pg_dsn: str, admin: Any, schema: str, mode: Mode, *, fail_until: int, kill: bool
) -> tuple[list[tuple[str, int]], list[tuple[int, str, int]], dict[str, int]]:
    """Start replicas A and B; the one that ran attempt 1 of the slot goes (killed if
    *kill*, else stopped) during its backoff. Returns the attempts made (replica, attempt),
    the slot's attempts in the ledger (:func:`_tries`), and each replica's pid by name."""
    table = LedgerTable(DEFAULT_TABLE, schema)
    fleet = Processes(SCRIPT)
    try:
        for rid in ("A", "B"):
            await fleet.spawn(
                *("--dsn", pg_dsn, "--schema", schema, "--mode", mode, "--id", rid),
                *("--at", "-", "--fail-until", str(fail_until)),
                stdin=True,
            )
        # Both booted (however slowly a busy machine starts Python): the slot is given now,
        # leaving them a connection and a scheduler's start.
        await eventually(
            lambda: len([x for x in fleet.lines if x["event"] == "booted"]) == 2,
            "both replicas booted",
            LIVENESS,
        )
        at = math.ceil(time.time()) + 3
        await fleet.tell(str(at))

        async def both_running() -> bool:
            running = [line for line in fleet.lines if line["event"] == "running"]
            return len(running) == 2

        await eventually(both_running, "both replicas running", LIVENESS)
        assert time.time() < at, "the replicas started too slowly for this test's slot"

        async def first_failed() -> bool:
            row = await admin.fetchrow(
                f"SELECT attempt, outcome, to_jsonb(r) ->> 'retry_at' AS retry_at"
                f" FROM {table.runs} r WHERE job = 'flaky'"
            )
            return row is not None and row["outcome"] == "failed" and row["retry_at"] is not None

        # Attempt 1 failed, and its replica wrote down when attempt 2 is due (retry_delay=6:
        # 3 to 6 seconds from the failure): it goes now, during its backoff.
        await eventually(first_failed, "attempt 1 failed, its retry written down", LIVENESS)
        [first] = [line for line in fleet.lines if line["event"] == "attempt"]
        assert first["attempt"] == 1
        gone = fleet.procs[("A", "B").index(first["replica"])]
        if kill:
            gone.kill()
        else:
            gone.terminate()
        assert await gone.wait() == (-9 if kill else 0)
        last = 1 + fail_until if fail_until < 3 else 3
        final = "succeeded" if fail_until < 3 else "failed"

        async def settled() -> bool:
            row = await admin.fetchrow(
                f"SELECT attempt, outcome FROM {table.runs} WHERE job = 'flaky'"
            )
            return row is not None and (row["attempt"], row["outcome"]) == (last, final)

        await eventually(settled, f"attempt {last} {final}", LIVENESS)
        # Nothing more is due: the last attempt wrote down no retry for anyone to take over
        # (a crash check takes over only a retry written down) ...
        pending = await admin.fetchval(
            f"SELECT to_jsonb(r) ->> 'retry_at' FROM {table.runs} r WHERE job = 'flaky'"
        )
        assert pending is None, pending
        # ... and nothing more comes while the live replica's crash check runs twice.
        await asyncio.sleep(2 * REPLICA_CHECKS + 1)
        made = [(line["replica"], line["attempt"]) for line in fleet.lines
                if line["event"] == "attempt"]  # fmt: skip
        [run] = await read_runs(admin, table, "flaky", 5)
        owners = {rid: proc.pid for rid, proc in zip(("A", "B"), fleet.procs, strict=True)}
        return made, _tries(run), owners
    finally:
        await fleet.stop()


async def test_a_replica_killed_during_its_backoff_leaves_its_retries_to_another(
    pg_dsn: str, admin: Any, schema: str
) -> None:
    made, tries, owner = await _retry_left_behind(
        pg_dsn, admin, schema, "session", fail_until=3, kill=True
    )
    first, other = made[0][0], ("B" if made[0][0] == "A" else "A")
    # Exactly 1 + retries attempts fleet-wide: the first by the replica killed, the two
    # retries by the other (its own retry after attempt 2 as usual).
    assert made == [(first, 1), (other, 2), (other, 3)]
    assert tries == [
        (1, "failed", owner[first]),
        (2, "failed", owner[other]),
        (3, "failed", owner[other]),
    ]


SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


QUICK_CHECKS = 0.5  # seconds between crash checks in this process (3 s by default)


@pytest.fixture
def quick_members(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats every half second (a members row lives 1.5 s) and a crash check every
    half second, in this process's lockers: what takes 45 s in a deployment takes 2."""
    for module in (members, upkeep):
        monkeypatch.setattr(module, "MEMBERS_EVERY", 0.5)
        monkeypatch.setattr(module, "MEMBER_TTL", 1.5)
    for module in (crashes, locker_upkeep):
        monkeypatch.setattr(module, "CHECK_EVERY", QUICK_CHECKS)


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_live_replicas_pending_retry_is_left_to_it_and_taken_over_once_it_left(
    quick_members: None, pg_dsn: str, admin: Any, schema: str, mode: Mode, app_name: str
) -> None:
    """The check takes no pending retry of a live replica, however late; once that replica
    left (a graceful close deletes its members row) it returns it once, and the next
    claim of the slot takes the failed row over as the next attempt."""
    table = LedgerTable(DEFAULT_TABLE, schema)
    told: list[tuple[str, int, str]] = []

    def left(job: str, record: RunRecord) -> bool:
        told.append((job, record.attempt, record.outcome))
        return True

    def locker() -> PostgresLocker:
        return PostgresLocker(
            pg_dsn, schema=schema, mode=mode, racers=None, application_name=app_name
        )

    owner, checker = locker(), locker()
    checker.on_crashed(left)
    async with checker:
        async with owner:
            for each in (owner, checker):
                each.note_schedule("flaky", "every 3600s", None)
            opens = await checker.acquire("another", SLOT)  # opens its session: it checks
            assert isinstance(opens, PostgresHold)
            await opens.release()
            hold = await owner.acquire("flaky", SLOT)
            assert isinstance(hold, PostgresHold)
            now = datetime.now(UTC)
            hold.record(RunRecord(SLOT, now, now, "failed", "RuntimeError: down"))
            await hold.release()
            # Due a minute ago: past any margin, and left to its live replica all the same.
            await owner.retry_due("flaky", SLOT, 2, now - timedelta(minutes=1))
            # Checks come (four), the claim ages past the members' TTL.
            await asyncio.sleep(4 * QUICK_CHECKS + 2)
            assert told == []
            pending = await admin.fetchval(f"SELECT retry_at FROM {table.runs} WHERE job = 'flaky'")
            assert pending is not None
        # Closed: its members row is gone, and the retry is the checker's to make.
        async with asyncio.timeout(LIVENESS):
            while not told:
                await asyncio.sleep(0.05)
        assert told == [("flaky", 1, "failed")]
        again = await checker.acquire("flaky", SLOT)
        assert isinstance(again, PostgresHold)
        now = datetime.now(UTC)
        again.record(RunRecord(SLOT, now, now, "succeeded"))
        await again.release()
        await asyncio.sleep(4 * QUICK_CHECKS)  # told once: the check cleared it
        assert told == [("flaky", 1, "failed")]
    [run] = await read_runs(admin, table, "flaky", 5)
    assert [(r.attempt, r.outcome) for r in (*run.attempts, run)] == [
        (1, "failed"),
        (2, "succeeded"),
    ]
