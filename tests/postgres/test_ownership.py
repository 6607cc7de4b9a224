"""Shutdown gives back everything cronlock took: sessions, pooled connections, tasks.

The ownership rule: a Scheduler closes the lockers and electors it was given when it shuts
down, unless the user holds one open with ``async with``. These tests complete the README's
snippets as a user would (the pool closed afterwards, the process exiting) and check what
a user would see: a ``pool.close()`` that returns, no session left on the server, no
warning from ``python -X dev -W error``.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from cronlock import LockError, Scheduler, SchedulerStateError, every
from cronlock.postgres import PostgresElector, PostgresLocker

from .conftest import SessionsNamed
from .proxy import TcpProxy, via

pytestmark = pytest.mark.postgres

# A bound for "returns promptly": asyncpg's own warning about a hanging close comes at 60 s.
PROMPT = 20


def cronlock_tasks() -> list[str]:
    return sorted(
        t.get_name()
        for t in asyncio.all_tasks()
        if t.get_name().startswith("cronlock") and not t.done()
    )


async def run_a_few_times(scheduler: Scheduler, runs: int = 3) -> None:
    done = asyncio.Event()
    count = 0

    async def tick() -> None:
        nonlocal count
        count += 1
        if count >= runs:
            done.set()

    scheduler.add_job(tick, every(0.1), name="ownership-tick")
    async with scheduler:
        async with asyncio.timeout(PROMPT):
            await done.wait()


async def test_leaving_the_scheduler_gives_the_pool_its_connections_back(
    pg_dsn: str, app_name: str
) -> None:
    pool = await asyncpg.create_pool(
        pg_dsn, min_size=1, max_size=10, server_settings={"application_name": app_name}
    )
    locker = PostgresLocker(pool, sessions=2)
    await run_a_few_times(Scheduler(locker=locker))
    # Everything borrowed is back: the pool's connections are all idle.
    assert pool.get_idle_size() == pool.get_size()
    assert locker.closed
    assert cronlock_tasks() == []
    async with asyncio.timeout(PROMPT):
        await pool.close()


async def test_a_dsn_locker_leaves_no_session_and_no_task(
    pg_dsn: str, app_name: str, sessions_named: SessionsNamed
) -> None:
    locker = PostgresLocker(pg_dsn, application_name=app_name)
    await run_a_few_times(Scheduler(locker=locker))
    assert cronlock_tasks() == []
    async with asyncio.timeout(PROMPT):
        while await sessions_named(app_name):
            await asyncio.sleep(0.05)


async def test_a_locker_held_open_outlives_schedulers_and_closes_with_its_block(
    pg_dsn: str, app_name: str, sessions_named: SessionsNamed
) -> None:
    async with PostgresLocker(pg_dsn, application_name=app_name) as locker:
        await run_a_few_times(Scheduler(locker=locker))
        assert not locker.closed
        await run_a_few_times(Scheduler(locker=locker))  # a second scheduler, same locker
        assert not locker.closed
    assert locker.closed
    async with asyncio.timeout(PROMPT):
        while await sessions_named(app_name):
            await asyncio.sleep(0.05)


async def test_restarting_with_a_closed_locker_says_how_to_fix_it(pg_dsn: str) -> None:
    scheduler = Scheduler(locker=PostgresLocker(pg_dsn))
    await run_a_few_times(scheduler)
    with pytest.raises(SchedulerStateError, match="async with"):
        await scheduler.start()


async def test_a_closed_locker_refuses_with_the_fix_in_the_message(pg_dsn: str) -> None:
    locker = PostgresLocker(pg_dsn)
    await locker.close()
    with pytest.raises(LockError, match=r"closed.*async with locker"):
        await locker.acquire("job", datetime(2026, 1, 1, tzinfo=UTC))


async def test_closing_the_pool_first_warns_and_returns_instead_of_hanging(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=10)
    locker = PostgresLocker(pool, sessions=2)
    scheduler = Scheduler(locker=locker)
    ran = asyncio.Event()

    async def tick() -> None:
        ran.set()

    scheduler.add_job(tick, every(0.1), name="ownership-pool-first")
    caplog.set_level(logging.WARNING, logger="cronlock.postgres")
    async with scheduler:
        async with asyncio.timeout(PROMPT):
            await ran.wait()
            await pool.close()  # the wrong order: asyncpg would wait for the locker forever
    assert any(
        "pool is closing" in r.getMessage() and "Shut the Scheduler down" in r.getMessage()
        for r in caplog.records
    )


async def test_the_elector_given_to_a_scheduler_is_closed_with_it(
    pg_dsn: str, app_name: str, sessions_named: SessionsNamed
) -> None:
    elector = PostgresElector(pg_dsn, name=f"own-{app_name}", application_name=app_name)
    await run_a_few_times(Scheduler(elector=elector))
    assert elector.closed
    async with asyncio.timeout(PROMPT):
        while await sessions_named(app_name):
            await asyncio.sleep(0.05)


SNIPPETS = {
    "pool": """
        import asyncio, sys
        import asyncpg
        from cronlock import Scheduler
        from cronlock.postgres import PostgresLocker

        async def main() -> None:
            pool = await asyncpg.create_pool(sys.argv[1])
            scheduler = Scheduler(tz="Europe/Berlin", locker=PostgresLocker(pool))
            ran = asyncio.Event()

            @scheduler.every(0.2)
            async def tick() -> None:
                ran.set()

            async with scheduler:
                await asyncio.wait_for(ran.wait(), 20)
            await pool.close()
            print("ok")

        asyncio.run(main())
    """,
    "dsn": """
        import asyncio, sys
        from cronlock import Scheduler
        from cronlock.postgres import PostgresLocker

        async def main() -> None:
            scheduler = Scheduler(locker=PostgresLocker(sys.argv[1]))
            ran = asyncio.Event()

            @scheduler.cron("* * * * * *", seconds=True)
            async def tick() -> None:
                ran.set()

            async with scheduler:
                await asyncio.wait_for(ran.wait(), 20)
            print("ok")

        asyncio.run(main())
    """,
    "locked_run": """
        import asyncio, sys
        import asyncpg
        from cronlock.postgres import locked_run

        async def main() -> None:
            async with asyncpg.create_pool(sys.argv[1]) as pool:
                async with locked_run(pool, "nightly-reindex") as acquired:
                    assert acquired
            print("ok")

        asyncio.run(main())
    """,
    "elector": """
        import asyncio, sys
        from cronlock import Scheduler
        from cronlock.postgres import PostgresElector, PostgresLocker

        async def main() -> None:
            scheduler = Scheduler(
                locker=PostgresLocker(sys.argv[1]), elector=PostgresElector(sys.argv[1])
            )
            ran = asyncio.Event()

            @scheduler.every(0.2)
            async def tick() -> None:
                ran.set()

            async with scheduler:
                await asyncio.wait_for(ran.wait(), 20)
            print("ok")

        asyncio.run(main())
    """,
    "fastapi_lifespan": """
        import asyncio, sys
        from contextlib import asynccontextmanager
        from fastapi import FastAPI
        from cronlock import Scheduler
        from cronlock.postgres import PostgresLocker

        locker = PostgresLocker(sys.argv[1])
        scheduler = Scheduler(tz="Europe/Berlin", locker=locker)
        ran = asyncio.Event()

        @scheduler.cron("* * * * * *", seconds=True, timeout=600)
        async def nightly_reindex() -> None:
            ran.set()

        @asynccontextmanager
        async def lifespan(app: FastAPI):
            async with locker, scheduler:
                yield

        app = FastAPI(lifespan=lifespan)

        async def main() -> None:  # what uvicorn does with the lifespan
            async with app.router.lifespan_context(app):
                await asyncio.wait_for(ran.wait(), 20)
            print("ok")

        asyncio.run(main())
    """,
    "elector_held_open": """
        import asyncio, sys
        from cronlock import Scheduler
        from cronlock.postgres import PostgresElector, PostgresLocker

        async def main() -> None:
            elector = PostgresElector(sys.argv[1])
            scheduler = Scheduler(elector=elector, locker=PostgresLocker(sys.argv[1]))
            ran = asyncio.Event()

            @scheduler.every(0.2)
            async def tick() -> None:
                ran.set()

            async with elector, scheduler:
                await asyncio.wait_for(ran.wait(), 20)
            print("ok")

        asyncio.run(main())
    """,
    "run_locked": """
        import asyncio, sys
        import asyncpg
        from cronlock.postgres import run_locked

        async def reindex() -> int:
            return 42

        async def main() -> None:
            pool = await asyncpg.create_pool(sys.argv[1])
            ran, result = await run_locked(pool, "nightly-reindex", reindex)
            assert ran and result == 42
            await pool.close()
            print("ok")

        asyncio.run(main())
    """,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_the_readme_snippets_completed_exit_promptly_without_warnings(
    name: str, pg_dsn: str, tmp_path: Path
) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(SNIPPETS[name]))
    result: Any = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", str(script), pg_dsn],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    # -X dev shows ResourceWarnings and "Task was destroyed" reports; none may appear.
    for marker in ("Warning", "Traceback", "Exception ignored", "Task was destroyed"):
        assert marker not in result.stderr, result.stderr


async def test_a_session_setup_interrupted_by_shutdown_leaves_the_pool_connection_alive(
    pg_dsn: str,
) -> None:
    # A scheduler shut down right after it started (SIGTERM while a service boots) cancels
    # the catch-up read while the locker is setting up its session on a pooled connection.
    # The setup finishes and the connection goes back to the pool alive: terminated, the
    # pool would reconnect in the background, and a pool.close() during that reconnect
    # logs "Future exception was never retrieved" (asyncpg).
    target = urlsplit(pg_dsn)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    port = await proxy.start()
    try:
        pool = await asyncpg.create_pool(via(pg_dsn, port), min_size=1, max_size=2)
        try:
            backend = await pool.fetchval("SELECT pg_backend_pid()")
            locker = PostgresLocker(pool, sessions=1)
            proxy.set_mode("freeze")  # the setup's first statement waits in the proxy
            reading = asyncio.create_task(locker.last_runs("interrupted-setup"))
            async with asyncio.timeout(PROMPT):
                while pool.get_idle_size():  # the locker has checked the connection out
                    await asyncio.sleep(0.01)
            reading.cancel()
            await asyncio.sleep(0.1)
            proxy.set_mode("pass")
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(PROMPT):
                    await reading
            await locker.close()
            assert pool.get_size() == pool.get_idle_size() == 1
            # The same server session: handed back, not terminated and replaced.
            assert await pool.fetchval("SELECT pg_backend_pid()") == backend
        finally:
            async with asyncio.timeout(PROMPT):
                await pool.close()
    finally:
        await proxy.close()
