"""Fleet time: the offset estimator's maths, and what the run loop does when the offset moves.

The server's clock comes from a scripted source here (a fake ServerClockLocker on a
manual clock); the real server's is measured in tests/postgres/test_fleet_clock.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from cronlock import (
    ConfigError,
    InMemoryLocker,
    JobStarted,
    RunContext,
    Scheduler,
    SystemClock,
    every,
)
from cronlock._core.fleetclock import ClockSample, FleetClock, OffsetEstimator, scheduler_clock
from cronlock._locking.protocols import ServerClockLocker
from cronlock.testing import FakeClock, OffsetClock

from .conftest import T0, Recorder


class ManualClock:
    """A clock that moves only when the fake server says a request took time."""

    def __init__(self, start: datetime = T0) -> None:
        self.t = start

    def now(self) -> datetime:
        return self.t

    async def sleep_until(self, deadline: datetime) -> None:
        self.t = max(self.t, deadline)


class FakeServer:
    """A ServerClockLocker whose clock is *ahead* seconds ahead of *clock*; each reading
    takes the (out, back) seconds scripted in *trips*, then the last pair again."""

    def __init__(self, clock: ManualClock, ahead: float, trips: list[tuple[float, float]]) -> None:
        self.clock, self.ahead, self.trips = clock, ahead, trips
        self.down = False

    async def acquire(self, job: str, slot: datetime) -> None:
        return None

    async def read_server_clock(
        self, read: Callable[[], datetime]
    ) -> tuple[datetime, datetime, datetime]:
        if self.down:
            raise ConnectionError("the server is down")
        out, back = self.trips.pop(0) if len(self.trips) > 1 else self.trips[0]
        sent = read()
        self.clock.t += timedelta(seconds=out)
        server = self.clock.t + timedelta(seconds=self.ahead)
        self.clock.t += timedelta(seconds=back)
        return sent, server, read()


class SilentServer:
    """A ServerClockLocker that never answers: the offset is whatever the test adopts."""

    async def acquire(self, job: str, slot: datetime) -> None:
        return None

    async def read_server_clock(
        self, read: Callable[[], datetime]
    ) -> tuple[datetime, datetime, datetime]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def sample(sent: float, server: float, received: float) -> ClockSample:
    return ClockSample(sent, server, received)


def test_the_offset_is_the_server_minus_the_midpoint() -> None:
    # The server is 300 ms ahead: a request sent at 100.000 and answered at 100.002
    # read the server at 100.301 (the midpoint, 100.001, plus 300 ms).
    ahead = sample(100.000, 100.301, 100.002)
    assert ahead.round_trip == pytest.approx(0.002)
    assert ahead.offset == pytest.approx(0.300)
    behind = sample(100.000, 99.851, 100.002)  # the server 150 ms behind
    assert behind.offset == pytest.approx(-0.150)


def test_the_fastest_sample_of_a_round_wins() -> None:
    estimator = OffsetEstimator()
    # The true offset is +0.3. A slow sample whose answer was held up on the way back
    # (80 ms back, 1 ms out) errs by 40 ms; the quick ones err by under a millisecond.
    slow = sample(10.000, 10.301, 10.081)
    quick = [sample(11.000, 11.3005, 11.001), sample(12.000, 12.3008, 12.0015)]
    assert estimator.add([slow, *quick], at=0.0) == pytest.approx(0.300)
    assert estimator.round_trip == pytest.approx(0.001)


def test_a_slow_round_is_not_used_until_the_estimate_is_stale() -> None:
    estimator = OffsetEstimator(stale=300.0)
    estimator.add([sample(0.0, 0.3005, 0.001)], at=0.0)
    # Every sample of this round waited 200 ms on the way back: its best says +0.2.
    slow_round = [sample(1.0, 1.301, 1.201), sample(2.0, 2.301, 2.202)]
    assert estimator.add(slow_round, at=30.0) == pytest.approx(0.300)
    assert estimator.rejected == 1
    # A round as quick as the first moves the estimate (the clocks drifted 1 ms).
    assert estimator.add([sample(3.0, 3.3015, 3.001)], at=60.0) == pytest.approx(0.301)
    # When nothing quick came for *stale* seconds, the path changed: slow rounds count.
    assert estimator.add(slow_round, at=400.0) == pytest.approx(0.200, abs=0.001)


def test_the_first_round_is_used_however_slow() -> None:
    estimator = OffsetEstimator()
    assert estimator.offset is None
    assert estimator.add([], at=0.0) is None
    assert estimator.add([sample(0.0, 0.35, 0.1)], at=0.0) == pytest.approx(0.300)


async def test_a_fleet_clock_reads_its_base_plus_the_measured_offset() -> None:
    base = ManualClock()
    server = FakeServer(base, ahead=-0.150, trips=[(0.050, 0.001), (0.0002, 0.0002)])
    clock = FleetClock(base, server)
    assert clock.offset is None
    assert clock.now() == T0  # before the first estimate: the base clock's time
    offset = await clock.estimate(4)
    assert offset == pytest.approx(-0.150)  # the 51 ms first reading was not used
    assert offset is not None
    held = clock.now()
    clock.adopt(offset)
    assert clock.offset == timedelta(seconds=offset)
    assert clock.now() == held  # fleet time does not go back: it waits 150 ms
    base.t += timedelta(seconds=1)
    assert clock.now() == base.now() + timedelta(seconds=offset)


async def test_fleet_time_holds_still_when_the_offset_shrinks() -> None:
    base = ManualClock()
    clock = FleetClock(base, FakeServer(base, 0.0, [(0.0, 0.0)]))
    clock.adopt(0.3)
    assert clock.now() == T0 + timedelta(seconds=0.3)
    clock.adopt(0.0)  # the first estimate was off: fleet time may not go back
    assert clock.now() == T0 + timedelta(seconds=0.3)
    base.t += timedelta(seconds=0.2)
    assert clock.now() == T0 + timedelta(seconds=0.3)
    base.t += timedelta(seconds=0.2)
    assert clock.now() == T0 + timedelta(seconds=0.4)  # caught up: moving again


async def test_the_offset_is_kept_while_the_server_cannot_be_read() -> None:
    base = ManualClock()
    server = FakeServer(base, ahead=0.2, trips=[(0.0005, 0.0005)])
    clock = FleetClock(base, server)
    clock.adopt(await clock.estimate(3) or 0.0)
    server.down = True
    with pytest.raises(ConnectionError):
        await clock.estimate(3)
    assert clock.offset == timedelta(seconds=0.2)


def test_which_clock_a_scheduler_reads() -> None:
    base = ManualClock()
    server = FakeServer(base, 0.0, [(0.0, 0.0)])
    assert isinstance(server, ServerClockLocker)
    system = SystemClock()
    fleet = scheduler_clock(system, server, None)
    assert isinstance(fleet, FleetClock) and fleet.base is system
    skewed = OffsetClock(0.15)
    assert isinstance(scheduler_clock(skewed, server, None), FleetClock)
    assert isinstance(scheduler_clock(None, server, True), FleetClock)
    # Opted out, a locker without a server clock, a virtual or a user's own clock: as is.
    assert scheduler_clock(system, server, False) is system
    assert scheduler_clock(system, InMemoryLocker(), None) is system
    fake = FakeClock(T0)
    assert scheduler_clock(fake, server, None) is fake
    over_fake = OffsetClock(0.15, fake)
    assert scheduler_clock(over_fake, server, None) is over_fake
    assert scheduler_clock(base, server, None) is base
    with pytest.raises(ConfigError, match=r"fleet_clock=True, but its clock .* virtual clock"):
        Scheduler(clock=fake, locker=server, fleet_clock=True)
    with pytest.raises(ConfigError, match=r"fleet_clock=True, but its locker .* server's clock"):
        Scheduler(locker=InMemoryLocker(), fleet_clock=True)
    with pytest.raises(ConfigError, match="fleet_clock must be True, False or None, got 'yes'"):
        Scheduler(fleet_clock="yes")  # type: ignore[arg-type]


async def _fleet_scheduler(clock: FakeClock, runs: list[datetime]) -> tuple[Scheduler, FleetClock]:
    """A scheduler on fleet time over a FakeClock (given as its clock: used as it is)."""
    fleet = FleetClock(clock, SilentServer())
    scheduler = Scheduler(clock=fleet)
    assert scheduler.clock is fleet

    async def tick(ctx: RunContext) -> None:
        runs.append(ctx.slot)

    scheduler.add_job(tick, every(1), name="tick", misfire_grace=5)
    return scheduler, fleet


async def test_a_shrinking_offset_never_runs_a_slot_twice(clock: FakeClock) -> None:
    runs: list[datetime] = []
    scheduler, fleet = await _fleet_scheduler(clock, runs)
    fleet.adopt(0.5)  # fleet time is T0 + 0.5 s
    async with scheduler:
        await clock.advance(0.6)  # fleet T0 + 1.1: slot T0 + 1 ran
        fleet.adopt(-0.3)  # a better estimate: fleet time would read T0 + 0.3
        await clock.advance(2.0)  # fleet time held at T0 + 1.1 until base T0 + 1.4
    assert runs == [T0 + timedelta(seconds=s) for s in (1, 2)]
    assert clock.now() == T0 + timedelta(seconds=2.6)
    assert fleet.now() == T0 + timedelta(seconds=2.3)


async def test_a_growing_offset_fires_what_became_due_at_once(clock: FakeClock) -> None:
    runs: list[datetime] = []
    started: list[datetime] = []
    scheduler, fleet = await _fleet_scheduler(clock, runs)
    recorder = Recorder()
    scheduler.subscribe(recorder)
    async with scheduler:
        await clock.advance(1.2)  # slot T0 + 1 ran
        fleet.adopt(0.9)  # fleet time steps from T0 + 1.2 to T0 + 2.1: slot T0 + 2 is due
        await clock.advance(0)
        started = [e.slot for e in recorder.of(JobStarted)]  # type: ignore[attr-defined]
        assert started == [T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)]
        await clock.advance(1.0)  # fleet T0 + 3.1
    assert runs == [T0 + timedelta(seconds=s) for s in (1, 2, 3)]


async def test_a_step_of_the_host_clock_does_not_move_fleet_time() -> None:
    """Found by the soak: fleet time followed a host clock step until the next estimate
    (up to 30 s), so a replica stepped 9 s ahead claimed slots 9 s early. Over a base clock
    that follows real time, a step is taken out of the offset at the next reading."""
    base = OffsetClock(0.0)
    fleet = FleetClock(base, FakeServer(ManualClock(), 0.0, [(0.0, 0.0)]))
    fleet.adopt(1.5)
    before = fleet.now()
    base.offset = timedelta(seconds=9.25)  # the host clock jumps ahead
    ahead = fleet.now()
    base.offset = timedelta(seconds=-5.0)  # and back, behind true time
    behind = fleet.now()
    assert timedelta(0) <= ahead - before < timedelta(seconds=0.05)
    assert timedelta(0) <= behind - ahead < timedelta(seconds=0.05)
    assert fleet.steps == 2
    assert fleet.offset is not None
    assert abs((fleet.offset - timedelta(seconds=6.5)).total_seconds()) < 0.05


async def test_a_step_the_next_estimate_measured_is_not_taken_out_twice() -> None:
    """Found by the simulation (seed 100239): a replica whose host clock stepped back 24 s
    while its loop slept read nothing before the next estimate, which measured the step
    into the offset; the reading after it took the step out again, and fleet time ran
    24 s ahead (slots claimed and run 24 s early)."""
    base = OffsetClock(0.0)
    fleet = FleetClock(base, FakeServer(ManualClock(), 0.0, [(0.0, 0.0)]))
    fleet.adopt(0.0)
    before = fleet.now()
    base.offset = timedelta(seconds=-24.0)  # the host clock steps back; nothing reads it
    fleet.adopt(24.0)  # the estimate over the stepped clock measured it
    after = fleet.now()
    assert timedelta(0) <= after - before < timedelta(seconds=0.05)
    assert fleet.offset is not None
    assert abs((fleet.offset - timedelta(seconds=24.0)).total_seconds()) < 0.05
