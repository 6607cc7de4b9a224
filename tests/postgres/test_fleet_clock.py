"""Fleet time against the real server: the offset a replica measures, and three replica
processes with skewed clocks sharing one job (exactly once, and spread over the replicas)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import timedelta

import pytest

from cronlock import FleetClock, Scheduler, SystemClock, every
from cronlock.postgres import PostgresLocker
from cronlock.testing import OffsetClock

from ..eventually import eventually
from .test_exactly_once import Fleet, analyse, fleet  # noqa: F401 (the fixture)

pytestmark = pytest.mark.postgres


async def _measured(clock: FleetClock) -> timedelta:
    await eventually(lambda: clock.offset is not None, "the offset measured", every=0.01)
    assert clock.offset is not None
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
        # Read between two readings of the real clock: a busy machine may pause this
        # process between any two of them, which widens the window, never the error.
        before, fleet_now, after = SystemClock().now(), clock.now(), SystemClock().now()
        bound = timedelta(seconds=trip / 2 + 0.002)
        assert before - bound <= fleet_now <= after + bound


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
    job = f"fleet-{uuid.uuid4().hex[:8]}"
    for rid, offset in enumerate(("0", "0.15", "0.3"), 1):
        fleet.boot(
            "fleet",
            pg_dsn,
            job,
            rid,
            slots,
            *("--interval", str(interval), "--hold", "0.001", "--offset", offset, "--trace"),
            # A slot fired late on a starved machine still runs (a grace of one 0.2 s
            # interval turned one such slot into a told miss, once, beside two CPU hogs).
            *("--misfire-grace", "10"),
        )
    start = fleet.go()  # once all three have booted, however long that took
    records = fleet.records("fleet")
    expected = [start + k * interval for k in range(slots)]
    on_grid = {round(slot, 3): slot for slot in expected}  # the same instants, as floats
    for record in records:
        if "slot" in record:
            record["slot"] = on_grid.get(round(record["slot"], 3), record["slot"])
    assert {r["slot"] for r in records if r["event"] == "start"} <= set(expected)
    seen = analyse(records, expected)
    per_replica = Counter(r["replica"] for r in records if r["event"] == "start")
    with capsys.disabled():
        print("\n" + seen.line(f"fleet time, clocks 0/+150/+300 ms, a 1 ms job every {interval}s"))
        print(f"[measured] runs per replica {dict(sorted(per_replica.items()))}")
    assert seen.duplicates == 0
    # A slot that did not run was refused while a run of the job held its lock (a run's
    # release may come late on a busy machine: checked against the holders' windows on
    # the real clock); none was missed.
    assert seen.missed == 0
    assert seen.ran_once + seen.busy == slots
    assert seen.lock_failed == 0
    assert len(per_replica) == 3
    assert max(per_replica.values()) <= seen.ran_once / 2


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
        await eventually(ran.is_set, "the local job to run")
        await eventually(lambda: clock.failures, "a failed reading of the server clock")
        assert clock.offset is None  # no estimate: the base clock's time, as before
