"""locked_run / run_locked against a real server: exclusion, and release however a run ends.

The ``pool`` fixture's reset does not unlock, so every lock a run leaves behind shows up in
pg_locks: these tests check cronlock's own unlock, not asyncpg's backstop.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncpg
import pytest

from cronlock import ConfigError, LockError
from cronlock.postgres import RunLock, job_lock_key, locked_run, run_locked

from .conftest import ADVISORY_HERE

LocksHeld = Callable[[Iterable[str]], Awaitable[int]]

pytestmark = pytest.mark.postgres


def new_job() -> str:
    return f"run-{uuid.uuid4()}"


async def all_idle(pool: Any) -> bool:
    """Every connection the pool opened is back in it (none leaked by a cancelled run)."""
    return bool(pool.get_idle_size() == pool.get_size())


async def test_acquired_runs_and_releases(pool: Any, locks_held: LocksHeld) -> None:
    name = new_job()
    async with locked_run(pool, name) as lock:
        assert lock
        assert isinstance(lock, RunLock)
        assert lock.key == job_lock_key(name)
        assert await locks_held([name]) == 1
    assert await locks_held([name]) == 0
    assert await all_idle(pool)


async def test_falsy_while_another_session_holds_it(
    pool: Any, admin: Any, locks_held: LocksHeld
) -> None:
    name = new_job()
    assert await admin.fetchval("SELECT pg_try_advisory_lock($1)", job_lock_key(name))
    async with locked_run(pool, name) as lock:
        assert not lock
        assert not lock.acquired
    assert await run_locked(pool, name, asyncio.sleep, 0, "never") == (False, None)
    assert await admin.fetchval("SELECT pg_advisory_unlock($1)", job_lock_key(name))
    assert await run_locked(pool, name, asyncio.sleep, 0, "ran") == (True, "ran")
    assert await locks_held([name]) == 0


async def test_twenty_concurrent_runs_exactly_one_runs(pool: Any, locks_held: LocksHeld) -> None:
    name = new_job()
    ran: list[int] = []
    refused = 0
    everyone_tried = asyncio.Event()

    async def body(i: int) -> int:
        ran.append(i)
        # Hold the lock until all the others were turned away, so that none can slip in
        # after us however slowly the machine schedules them.
        await everyone_tried.wait()
        return i

    async def attempt(i: int) -> tuple[bool, int | None]:
        nonlocal refused
        result = await run_locked(pool, name, body, i)
        if not result[0]:
            refused += 1
            if refused == 19:
                everyone_tried.set()
        return result

    async with asyncio.timeout(60):
        results = await asyncio.gather(*(attempt(i) for i in range(20)))
    assert len(ran) == 1
    assert [r for r in results if r[0]] == [(True, ran[0])]
    assert refused == 19
    assert await locks_held([name]) == 0


async def test_released_when_the_body_raises(pool: Any, locks_held: LocksHeld) -> None:
    name = new_job()

    async def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await run_locked(pool, name, fail)
    assert await locks_held([name]) == 0
    assert await all_idle(pool)


async def _start_holding(pool: Any, name: str) -> tuple[asyncio.Task[None], asyncio.Event]:
    entered = asyncio.Event()

    async def hold() -> None:
        async with locked_run(pool, name) as lock:
            assert lock
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(hold(), name=f"hold[{name}]")
    await entered.wait()
    return task, entered


async def test_released_when_cancelled_in_the_body(pool: Any, locks_held: LocksHeld) -> None:
    name = new_job()
    task, _ = await _start_holding(pool, name)
    assert await locks_held([name]) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await locks_held([name]) == 0
    assert await all_idle(pool)


async def test_released_when_cancelled_twice(pool: Any, locks_held: LocksHeld) -> None:
    name = new_job()
    task, _ = await _start_holding(pool, name)
    task.cancel()
    await asyncio.sleep(0)  # the first cancel has reached the cleanup's first await
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await locks_held([name]) == 0
    assert await all_idle(pool)


async def test_released_when_cancelled_over_and_over_during_the_unlock(
    pool: Any, locks_held: LocksHeld
) -> None:
    name = new_job()
    leaving = asyncio.Event()

    async def run() -> None:
        async with locked_run(pool, name) as lock:
            assert lock
            leaving.set()
        # Not reached: the cancellations are delivered once the unlock is done.
        raise AssertionError("the cancellation was swallowed")

    task = asyncio.create_task(run(), name="run")
    await leaving.wait()
    # The body is over and the task is in the unlock: cancel it at every loop iteration.
    cancels = 0
    while not task.done():
        task.cancel()
        cancels += 1
        await asyncio.sleep(0)
    assert cancels >= 2
    assert task.cancelled()
    assert await locks_held([name]) == 0
    assert await all_idle(pool)


async def test_released_when_a_timeout_expires_during_the_cleanup(
    pool: Any, locks_held: LocksHeld
) -> None:
    name = new_job()
    loop = asyncio.get_running_loop()

    async def run() -> None:
        async with asyncio.timeout(None) as deadline, locked_run(pool, name) as lock:
            assert lock
            # Expire as soon as the body is left: the deadline hits the unlock.
            deadline.reschedule(loop.time())

    with pytest.raises(TimeoutError):
        await run()
    assert await locks_held([name]) == 0
    assert await all_idle(pool)


async def test_acquire_cancelled_at_random_points_leaves_nothing(
    pool: Any, locks_held: LocksHeld
) -> None:
    names = [new_job() for _ in range(3)]
    rng = random.Random(1234)
    outcomes = {"cancelled": 0, "finished": 0}
    for _ in range(150):
        name = rng.choice(names)

        async def run(name: str = name) -> None:
            async with locked_run(pool, name):
                pass

        task = asyncio.create_task(run(), name="run")
        # 0..3 ms covers the pool checkout, the try-lock and the unlock on a local server.
        await asyncio.sleep(rng.uniform(0, 0.003))
        task.cancel()
        try:
            await task
            outcomes["finished"] += 1
        except asyncio.CancelledError:
            outcomes["cancelled"] += 1
    assert outcomes["cancelled"] > 0
    assert await locks_held(names) == 0
    assert await all_idle(pool)


async def test_exhausted_pool_raises_lock_error_instead_of_hanging(
    pg_dsn: str, locks_held: LocksHeld
) -> None:
    name = new_job()
    async with asyncpg.create_pool(pg_dsn, min_size=1, max_size=1) as small:
        async with small.acquire():  # the only connection is taken
            async with asyncio.timeout(60):  # a hang fails the test instead of blocking it
                with pytest.raises(LockError, match="exhausted"):
                    async with locked_run(small, name, acquire_timeout=0.2):
                        raise AssertionError("entered without a connection")
        async with locked_run(small, name) as lock:  # and works again once one is free
            assert lock
    assert await locks_held([name]) == 0


async def test_unreachable_server_raises_lock_error(unreachable_dsn: str) -> None:
    async with asyncio.timeout(60):
        with pytest.raises(LockError):
            await run_locked(unreachable_dsn, new_job(), asyncio.sleep, 0, acquire_timeout=5)


async def test_dsn_source_opens_and_closes_its_own_connection(
    pg_dsn: str, locks_held: LocksHeld
) -> None:
    name = new_job()
    assert await run_locked(pg_dsn, name, asyncio.sleep, 0, 42) == (True, 42)
    assert await locks_held([name]) == 0


async def test_lost_connection_is_reported_and_the_lock_is_gone(
    pool: Any, admin: Any, locks_held: LocksHeld
) -> None:
    name = new_job()
    async with locked_run(pool, name) as lock:
        assert lock
        pid = await admin.fetchval(
            f"SELECT pid FROM pg_locks WHERE {ADVISORY_HERE} AND objsubid = 1"
            " AND ((classid::int8 << 32) | objid::int8) = $1",
            job_lock_key(name),
        )
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        async with asyncio.timeout(30):
            while not lock.lost:
                await asyncio.sleep(0.01)
        assert await locks_held([name]) == 0
    # Leaving the block after the loss neither raises nor hangs, and the pool recovers.
    assert await run_locked(pool, name, asyncio.sleep, 0, "again") == (True, "again")


async def test_reusing_the_context_manager_is_an_error(pool: Any) -> None:
    run = locked_run(pool, new_job())
    async with run:
        pass
    with pytest.raises(RuntimeError):
        async with run:
            pass


def test_rejects_what_is_neither_pool_nor_dsn() -> None:
    with pytest.raises(TypeError, match=r"asyncpg\.Pool or a DSN"):
        locked_run(object(), "x")


@pytest.mark.parametrize("option", ["acquire_timeout", "unlock_timeout"])
def test_bad_timeouts_raise_config_error(option: str) -> None:
    options: dict[str, Any] = {option: -1}
    with pytest.raises(ConfigError, match=option):
        locked_run("postgresql://unused", "x", **options)
