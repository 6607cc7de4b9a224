"""A randomized cancellation storm: whatever interrupts a run, no advisory lock is left held.

Runs, cancelled at random instants (while waiting for a connection, during the try-lock,
in the body, during the unlock), cancelled twice, or cut short by ``asyncio.timeout``
deadlines, several at a time and contending for a few job names. Afterwards pg_locks
must show none of those keys held, and every pooled connection must be back.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock.postgres import PostgresHold, PostgresLocker, locked_run, run_locked

pytestmark = pytest.mark.postgres

LocksHeld = Callable[[Iterable[str]], Awaitable[int]]

ITERATIONS = 4000
WORKERS = 8
SLOT0 = datetime(2030, 1, 1, tzinfo=UTC)


async def _body(rng: random.Random) -> None:
    await asyncio.sleep(rng.uniform(0, 0.002))


def _one(
    rng: random.Random, pool: Any, locker: PostgresLocker, name: str, i: int
) -> Coroutine[Any, Any, object]:
    """Return the awaitable of one randomly chosen kind of run."""
    kind = rng.randrange(4)
    if kind == 0:
        return run_locked(pool, name, _body, rng)
    if kind == 1:

        async def standalone() -> None:
            async with locked_run(pool, name) as lock:
                if lock:
                    await _body(rng)

        return standalone()
    if kind == 2:

        async def deadline_in_cleanup() -> None:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(None) as deadline, locked_run(pool, name) as lock:
                if lock:
                    await _body(rng)
                deadline.reschedule(loop.time())  # expire while the unlock runs

        return deadline_in_cleanup()

    async def scheduled() -> None:
        lease = await locker.acquire(name, SLOT0 + timedelta(seconds=i))
        if isinstance(lease, PostgresHold):
            try:
                await _body(rng)
            finally:
                await lease.release()

    return scheduled()


async def test_cancellation_storm_leaves_no_lock(
    pool: Any, pg_dsn: str, app_name: str, locks_held: LocksHeld, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [f"storm-{uuid.uuid4()}" for _ in range(6)]
    outcomes: collections.Counter[str] = collections.Counter()
    started = time.monotonic()

    async with PostgresLocker(pg_dsn, application_name=app_name + "-locker") as locker:

        async def worker(seed: int) -> None:
            rng = random.Random(seed)
            for i in range(seed, ITERATIONS, WORKERS):
                name = rng.choice(names)
                how = rng.randrange(4)
                timeout = rng.uniform(0, 0.004) if how == 3 else None

                async def guarded(
                    i: int = i, name: str = name, timeout: float | None = timeout
                ) -> None:
                    # The run is created inside the task, so a task cancelled before it
                    # starts leaves no never-awaited coroutine behind.
                    async with asyncio.timeout(timeout):
                        await _one(rng, pool, locker, name, i)

                task = asyncio.create_task(guarded(), name=f"storm-{i}")
                if how in (1, 2):  # cancel once, or twice
                    await asyncio.sleep(rng.uniform(0, 0.004))
                    task.cancel()
                    if how == 2:
                        await asyncio.sleep(rng.choice((0, 0, 0.0005)))
                        task.cancel()
                try:
                    await task
                    outcomes["completed"] += 1
                except asyncio.CancelledError:
                    outcomes["cancelled"] += 1
                except TimeoutError:
                    outcomes["timed out"] += 1

        async with asyncio.timeout(240):
            await asyncio.gather(*(worker(seed) for seed in range(WORKERS)))
        assert locker.statistics().held == 0

    leaked = await locks_held(names)
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\n[measured] storm: {sum(outcomes.values())} iterations in {elapsed:.1f}s,"
            f" {dict(outcomes)}, advisory locks left held: {leaked}"
        )
    assert sum(outcomes.values()) == ITERATIONS
    assert outcomes["cancelled"] > 100 and outcomes["timed out"] > 100
    assert leaked == 0
    assert pool.get_idle_size() == pool.get_size()
