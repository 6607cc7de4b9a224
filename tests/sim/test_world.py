"""The simulated world: exact virtual instants, processes that freeze and die, replays."""

from __future__ import annotations

import asyncio

import pytest

from cronlock._sim.faults import Fault, parse_fault
from cronlock._sim.world import World, WorldStuck

closing: list[World] = []


@pytest.fixture(autouse=True)
def _close_worlds() -> object:
    yield
    while closing:
        closing.pop().close()


def ticker(world: World, name: str, seen: list[tuple[str, float]], every: float) -> None:
    process = world.spawn(name)

    async def tick() -> None:
        while True:
            seen.append((name, world.now))
            await asyncio.sleep(every)

    process.loop.create_task(tick())


def test_timers_fire_at_their_exact_virtual_instants() -> None:
    world = World(1)
    closing.append(world)
    seen: list[tuple[str, float]] = []
    ticker(world, "a", seen, 0.25)
    world.run_until(1.0)
    assert [t for _, t in seen] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_a_frozen_process_runs_nothing_then_wakes_late() -> None:
    world = World(1)
    closing.append(world)
    seen: list[tuple[str, float]] = []
    ticker(world, "a", seen, 1.0)
    ticker(world, "b", seen, 1.0)
    world.run_until(0.5)
    world.freeze(world.processes[0], 2.7)
    world.run_until(5.0)
    a = [t for name, t in seen if name == "a"]
    b = [t for name, t in seen if name == "b"]
    assert a == [0.0, 3.2, 4.2]  # its 1 s timer was due at 1.0: it runs when it thaws
    assert b == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_killed_process_never_runs_again() -> None:
    world = World(1)
    closing.append(world)
    seen: list[tuple[str, float]] = []
    ticker(world, "a", seen, 1.0)
    world.run_until(1.5)
    world.kill(world.processes[0])
    world.run_until(10.0)
    assert [t for _, t in seen] == [0.0, 1.0]


def test_a_livelock_at_one_instant_is_reported() -> None:
    world = World(1)
    closing.append(world)
    process = world.spawn("spin")

    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    process.loop.create_task(spin())
    with pytest.raises(WorldStuck):
        world.run_until(1.0)


def test_to_thread_runs_inline_in_the_world_s_order() -> None:
    world = World(1)
    closing.append(world)
    process = world.spawn("a")
    got: list[int] = []

    async def main() -> None:
        got.append(await asyncio.to_thread(lambda: 41 + 1))

    process.loop.create_task(main())
    world.run_until(0.0)
    assert got == [42]


@pytest.mark.parametrize(
    "fault",
    [
        Fault("stall", 12.5, seconds=10.0),
        Fault("failover", 3.0, seconds=1.5, commits=4),
        Fault("kill", 22.0, job="slow-a"),
        Fault("clock_step", 9.0, replica=2, step=-30.0),
    ],
)
def test_a_fault_reads_back_from_its_line(fault: Fault) -> None:
    assert parse_fault(fault.text()) == fault
