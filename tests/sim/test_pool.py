"""The simulated asyncpg pool: it lends and takes back connections as asyncpg's does, the
library takes it for a user's pool, and a lease-mode fleet on pools runs every slot once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg
import pytest

from cronlock import LockError
from cronlock._sim.conn import SimConnector
from cronlock._sim.faults import POOLED_KINDS, Fault, apply, draw, parse_fault
from cronlock._sim.fleet import Fleet, JobSpec
from cronlock._sim.pool import SimPool
from cronlock._sim.run import Plan, run_plan
from cronlock._sim.server import SimServer
from cronlock._sim.statements.all import statements_for
from cronlock._sim.world import World
from cronlock.postgres._conn.source import ConnectionSource
from cronlock.postgres._sql.tables import LedgerTable

closing: list[World] = []


@pytest.fixture(autouse=True)
def _close_worlds() -> Any:
    yield
    while closing:
        closing.pop().close()


def _world() -> tuple[World, SimPool]:
    world = World(7)
    closing.append(world)
    world.server = SimServer(world, statements_for(LedgerTable("sim_runs")))
    process = world.spawn("app")
    return world, SimPool(SimConnector(world, process), min_size=1, max_size=2)


def _run(world: World, make: Callable[[], Coroutine[Any, Any, Any]], until: float = 30.0) -> Any:
    """Run *make()* on the app's loop to its end (within *until* virtual seconds)."""
    task = world.processes[0].loop.create_task(make())
    world.run_until(until)
    assert task.done(), "still running"
    return task.result()


def test_it_is_an_asyncpg_pool_to_the_library() -> None:
    _, pool = _world()
    assert isinstance(pool, asyncpg.Pool)
    source = ConnectionSource(pool)
    assert source.pooled
    assert source.describe() == "asyncpg pool (max_size=2)"


def test_it_lends_and_takes_back_connections() -> None:
    world, pool = _world()
    server = world.server

    async def main() -> list[Any]:
        await pool.open()
        seen: list[Any] = [pool.get_size(), pool.get_idle_size()]  # min_size connected
        a = await pool.acquire(timeout=1.0)
        b = await pool.acquire(timeout=1.0)
        seen += [pool.get_size(), pool.get_idle_size(), a.get_server_pid() != b.get_server_pid()]
        key = 42
        session = server.sessions[a.get_server_pid()]
        assert server.try_lock(session, key)
        await pool.release(a, timeout=1.0)  # the reset unlocks everything of the session
        seen.append(server.holder_of(key))
        with pytest.raises(asyncpg.InterfaceError):
            a.is_closed()  # a released proxy refuses every call
        await pool.release(a)  # a second release does nothing
        c = await pool.acquire(timeout=1.0)
        seen.append(c.get_server_pid() == session.pid)  # the connection is lent again
        await pool.release(c)
        await pool.release(b)
        seen.append(pool.get_idle_size())
        await pool.close()
        seen += [pool.is_closing(), pool.get_size()]
        return seen

    assert _run(world, main) == [1, 1, 2, 0, True, None, True, 2, True, 0]
    assert server.sessions == {}


def test_a_connection_that_dies_while_lent_frees_its_place() -> None:
    world, pool = _world()

    async def main() -> tuple[int, bool]:
        await pool.open()
        a = await pool.acquire(timeout=1.0)
        await pool.acquire(timeout=1.0)
        world.server.end_session(world.server.sessions[a.get_server_pid()], "terminated")
        await asyncio.sleep(0.1)
        again = await pool.acquire(timeout=1.0)  # its holder is back, connected anew
        return pool.get_size(), again.is_closed()

    assert _run(world, main) == (2, False)


def test_exhaustion_makes_a_checkout_fail_cleanly() -> None:
    world, pool = _world()
    source = ConnectionSource(pool)

    async def main() -> tuple[str, float]:
        await pool.open()
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        started = world.now
        with pytest.raises(LockError) as caught:
            await source.checkout(timeout=2.0)
        waited = world.now - started
        for conn in held:
            await pool.release(conn)
        conn = await source.checkout(timeout=2.0)  # free again: lent at once
        await source.checkin(conn, timeout=2.0)
        return str(caught.value), waited

    text, waited = _run(world, main)
    assert "the pool is exhausted" in text and "2 in use" in text
    assert waited == pytest.approx(2.0)


def test_exhaustion_makes_the_lockers_statements_fail_cleanly() -> None:
    # Five seconds of the user's code holding all of one replica's connections: that
    # replica's statements fail (it says so when its pool lends again); nothing escapes a
    # task, the other replica runs the slots, and the struck one goes on afterwards.
    world = World(5)
    jobs = (JobSpec("tick", "every:1", 0.2),)
    fleet = Fleet(world, mode="lease", replicas=2, jobs=jobs, pool=True)
    apply(Fault("pool_exhaustion", 10.3, seconds=5.0, replica=0), fleet)
    fleet.run(25.0, quiet=5.0)
    assert world.errors[: world.errors_closed] == []
    assert any("r0: the user's code holds all 4 connections" in line for line in world.trace)
    starts = [e for e in fleet.effects if e.kind == "start"]
    assert not [e for e in starts if e.replica == "r0" and 10.4 < e.at < 15.3]
    ran = {e.slot.second for e in starts if 10.4 < e.at < 15.3}
    assert ran == {11, 12, 13, 14, 15}  # r1 ran them
    heard = [
        s.what.getMessage()
        for s in fleet.said
        if s.replica == "r0" and isinstance(s.what, logging.LogRecord)
    ]
    assert any("answers again" in text for text in heard), heard
    assert [e for e in starts if e.replica == "r0" and e.at > 16.0]


def test_a_quiet_pooled_lease_fleet_runs_every_slot_once() -> None:
    plan = Plan("lease", 3, seconds=40.0, quiet=20.0, pool=True)
    result = run_plan(plan)
    assert result.ok, [v.text() for v in result.judged.violations[:10]]
    assert result.judged.slots > 50


def test_pool_exhaustion_is_drawn_for_pooled_plans_only() -> None:
    import random

    kinds = {
        f.kind
        for seed in range(200)
        for f in draw(random.Random(seed), replicas=3, seconds=120.0, pool=True)
    }
    assert "pool_exhaustion" in kinds and set(kinds) <= set(POOLED_KINDS)
    plain = {
        f.kind for seed in range(200) for f in draw(random.Random(seed), replicas=3, seconds=120.0)
    }
    assert "pool_exhaustion" not in plain
    fault = Fault("pool_exhaustion", 12.5, seconds=3.0, replica=1)
    assert parse_fault(fault.text()) == fault
