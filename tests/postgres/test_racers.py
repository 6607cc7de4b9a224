"""In a fleet larger than ``racers``, only ``racers`` replicas claim.

Six replicas of one ledger, twelve jobs every second: every slot runs once, yet three of
the replicas claim and the other three stand by without a statement. When a racer leaves,
the two left race on (no slot is missed) and a standby replica takes its place.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from datetime import datetime

import asyncpg
import pytest

from cronlock import JobSkipped, JobSucceeded, RunContext, Scheduler, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._locker import members as _members
from cronlock.postgres._sql.schema import migrate
from cronlock.postgres._sql.tables import LedgerTable

from .events import Events

pytestmark = pytest.mark.postgres

JOBS = [f"job-{i}" for i in range(12)]


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_six_replicas_three_racers_every_slot_once(
    pg_server: str, server_schema: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_members, "MEMBERS_EVERY", 0.5)
    runs: Counter[tuple[str, datetime]] = Counter()
    lockers = [
        PostgresLocker(pg_server, schema=server_schema, mode=mode, sessions=1)  # type: ignore[arg-type]
        for _ in range(6)
    ]
    schedulers = [Scheduler(locker=locker) for locker in lockers]
    events = [Events() for _ in schedulers]
    for scheduler, seen in zip(schedulers, events, strict=True):
        scheduler.subscribe(seen)
        for name in JOBS:

            async def work(ctx: RunContext, name: str = name) -> None:
                runs[name, ctx.slot] += 1

            scheduler.add_job(work, every(1.0), name=name)
    for scheduler in schedulers:
        await scheduler.start()
    try:
        async with asyncio.timeout(30):  # a liveness guard
            while not all(locker.statistics().members == 6 for locker in lockers):
                await asyncio.sleep(0.1)
        known = max(slot for _, slot in runs) if runs else None
        await asyncio.sleep(3.2)
        racing = [i for i, locker in enumerate(lockers) if locker.statistics().standby == 0]
        waiting = [i for i in range(6) if i not in racing]
        assert len(racing) == 3
        # A run someone asks for is claimed even on a replica that stands by: never skipped
        # as "standby". It may meet the job's lock held by a racer's run of this very
        # second ("locked": it did claim), or this replica's own attempt at that second
        # still in flight ("overlap": the job is busy here until that attempt's "standby"
        # answer is handled, later on a busy machine); asked again a moment later, it
        # runs. Asked back to back, every try may land inside the same held lock on a busy
        # machine.
        for _ in range(40):
            asked = await schedulers[waiting[0]].get_job(JOBS[0]).run_now()
            if not (isinstance(asked, JobSkipped) and asked.reason in ("locked", "overlap")):
                break
            await asyncio.sleep(0.13)  # off the one-second beat of the racers' runs
        assert isinstance(asked, JobSucceeded), asked
        before = {i: lockers[i].statistics().standby for i in waiting}
        await schedulers[racing[0]].shutdown()  # a racer leaves: its row goes with it
        async with asyncio.timeout(30):
            while all(lockers[i].statistics().members == 6 for i in waiting):
                await asyncio.sleep(0.1)
        await asyncio.sleep(2.2)
        after = {i: lockers[i].statistics().standby for i in waiting}
        took_over = [i for i in waiting if lockers[i].statistics().standby == after[i]]
        await asyncio.sleep(1.2)
        took_over = [i for i in took_over if lockers[i].statistics().standby == after[i]]
    finally:
        for scheduler in schedulers:
            await scheduler.shutdown()
    asked_slot = asked.slot
    measured = {
        key: n
        for key, n in runs.items()
        if (known is None or key[1] > known) and key[1] != asked_slot
    }
    slots = sorted({slot for _, slot in measured})[:-1]  # the last may be cut by shutdown
    assert len(slots) >= 3
    # The asked run holds JOBS[0]'s lock: a slot of it due meanwhile (a busy machine draws
    # the run out past the next second) is refused as "locked" or "overlap", and said so.
    said = {
        (skip.job, skip.slot)
        for seen in events
        for skip in seen.of(JobSkipped)
        if skip.reason in ("locked", "overlap")
    }
    for slot in slots:
        for name in JOBS:
            if measured.get((name, slot)) is None and name == JOBS[0]:
                assert (name, slot) in said, (name, slot)
                continue
            assert measured.get((name, slot)) == 1, (name, slot)
    stood = [
        skip
        for seen in events
        for skip in seen.of(JobSkipped)
        if skip.reason == "standby" and skip.slot in slots
    ]
    # Until the racer left, three replicas stood by for each slot of each job; afterwards
    # two did (one of the three took its place), and no slot was missed meanwhile.
    assert len(stood) >= 2 * len(JOBS) * len(slots)
    assert all(before[i] > 0 for i in waiting)
    assert len(took_over) == 1


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_replacement_races_while_its_dead_predecessors_rows_live(
    pg_server: str, server_schema: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash loop: the racers died and came back under new names, and their old rows hash
    lowest until they expire. The new replica must race meanwhile, not stand by (a slot
    every 0.2 s, each run once, no "standby" skip)."""
    monkeypatch.setattr(_members, "MEMBERS_EVERY", 1.0)
    runs: Counter[datetime] = Counter()

    async def work(ctx: RunContext) -> None:
        runs[ctx.slot] += 1

    digest = f"{_members._point('pulse'):016x}"
    low = 2**64 // 100_000  # a holder name hashes lower with a chance of 1 in 100,000
    names = (f"dead-{i}" for i in itertools.count())
    dead: list[str] = []
    for name in names:
        if len(dead) == 3:
            break
        if _members._point(name) < low:
            dead.append(name)
    conn = await asyncpg.connect(pg_server)
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{server_schema}"')
        await migrate(conn, LedgerTable(schema=server_schema))
        # The dead rows expire before this replica's youth (three periods, 3 s) ends.
        await conn.executemany(
            f'INSERT INTO "{server_schema}".cronlock_runs_members (holder, fleet, expires_at)'
            " VALUES ($1, $2, clock_timestamp() + interval '2.5 seconds')",
            [(name, digest) for name in dead],
        )
        locker = PostgresLocker(pg_server, schema=server_schema, mode=mode, sessions=1)  # type: ignore[arg-type]
        assert _members._point(locker._holder) > low
        scheduler = Scheduler(locker=locker)
        scheduler.add_job(work, every(0.2), name="pulse")
        seen = Events()
        scheduler.subscribe(seen)
        await scheduler.start()  # its first heartbeat is 0.5 s away or more
        try:
            async with asyncio.timeout(30):  # a liveness guard
                while locker.statistics().members < 4:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(2.5)  # past the dead rows' expiry
        finally:
            await scheduler.shutdown()
    finally:
        await conn.close()
    assert [s for s in seen.of(JobSkipped) if s.reason == "standby"] == []
    assert len(runs) >= 5 and set(runs.values()) == {1}
