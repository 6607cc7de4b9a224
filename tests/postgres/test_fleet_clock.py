"""Fleet time against the real server: the offset a replica measures, and three replica
processes with skewed clocks sharing one job (exactly once, and spread over the replicas)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest

from cronlock import FleetClock, Scheduler, SystemClock, every
from cronlock.postgres import PostgresLocker
from cronlock.testing import OffsetClock

from .test_exactly_once import Fleet, fleet  # noqa: F401 (the fixture)

pytestmark = pytest.mark.postgres


async def _measured(clock: FleetClock) -> timedelta:
    async with asyncio.timeout(60):
        while clock.offset is None:
            await asyncio.sleep(0.01)
    return clock.offset


@pytest.mark.parametrize("skew", [0.0, 0.15, 0.3, -0.2])
async def test_a_replica_measures_its_skew_against_the_server(pg_dsn: str, skew: float) -> None:
    # The server runs on this host: its clock is this host's real clock, so a replica whose
    # clock is skewed by S measures an offset of -S, wrong by at most half the round trip.
    scheduler = Scheduler(locker=PostgresLocker(pg_dsn, ledger=False), clock=OffsetClock(skew))
    clock = scheduler.clock
    assert isinstance(clock, FleetClock)
    async with scheduler:
        offset = (await _measured(clock)).total_seconds()
        trip = clock.estimator.round_trip
        assert trip is not None
        assert abs(offset + skew) <= trip / 2 + 0.001  # + 1 ms: the server's µs, floats
        # Fleet time is then the real time (give or take the same bound), once it has
        # caught up with where it stood when the offset shrank (it never goes back).
        await asyncio.sleep(max(skew, 0) + 0.05)
        error = (clock.now() - SystemClock().now()).total_seconds()
        assert abs(error) <= trip / 2 + 0.002


async def test_reading_the_server_clock(pg_dsn: str) -> None:
    async with PostgresLocker(pg_dsn, ledger=False) as locker:
        sent, server, received = await locker.read_server_clock(SystemClock().now)
        assert sent <= received
        assert server.tzinfo is not None
        assert locker.statistics().sessions_opened == 1


async def test_without_fleet_time_the_skew_stays(pg_dsn: str) -> None:
    skewed = OffsetClock(0.3)
    scheduler = Scheduler(
        locker=PostgresLocker(pg_dsn, ledger=False), clock=skewed, fleet_clock=False
    )
    assert scheduler.clock is skewed
    async with scheduler:
        pass


@pytest.mark.slow
def test_skewed_replicas_run_each_slot_once_and_share_the_runs(
    pg_dsn: str,
    fleet: Fleet,  # noqa: F811 (the fixture)
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three replicas 0, +150 and +300 ms ahead, a 1 ms job every 0.2 s, 100 slots.

    Without fleet time the fastest clock wins every slot; with it, the winner is drawn per
    slot (the fair race), so each replica gets about a third. "No more than half" fails by
    chance with odds under 1 in 1,000 (a binomial tail at 100 slots).
    """
    slots, interval = 100, 0.2
    start = float(math.ceil(time.time() + 5))
    job = f"fleet-{uuid.uuid4().hex[:8]}"
    for rid, offset in enumerate(("0", "0.15", "0.3"), 1):
        fleet.spawn(
            "fleet",
            pg_dsn,
            job,
            rid,
            start,
            slots,
            *("--interval", str(interval), "--hold", "0.001", "--offset", offset),
        )
    records = fleet.records("fleet")
    starts = [r for r in records if r["event"] == "start"]
    per_slot = Counter(r["slot"] for r in starts)
    expected = [start + k * interval for k in range(slots)]
    per_replica = Counter(r["replica"] for r in starts)
    with capsys.disabled():
        print(
            f"\n[measured] fleet time, clocks 0/+150/+300 ms, {slots} slots every {interval}s: "
            f"runs per replica {dict(sorted(per_replica.items()))}"
        )
    assert sorted(per_slot) == pytest.approx(expected)
    assert set(per_slot.values()) == {1}  # exactly once
    assert len(per_replica) == 3
    assert max(per_replica.values()) <= slots / 2


async def test_while_the_server_cannot_be_read_the_scheduler_keeps_its_own_time(
    unreachable_dsn: str,
) -> None:
    scheduler = Scheduler(locker=PostgresLocker(unreachable_dsn, connect_timeout=1))
    clock = scheduler.clock
    assert isinstance(clock, FleetClock)
    ran = asyncio.Event()

    async def local() -> None:
        ran.set()

    scheduler.add_job(local, every(0.05), name="local", distributed=False)
    async with scheduler:
        async with asyncio.timeout(30):
            await ran.wait()
            while not clock.failures:
                await asyncio.sleep(0.01)
        assert clock.offset is None  # no estimate: the base clock's time, as before
