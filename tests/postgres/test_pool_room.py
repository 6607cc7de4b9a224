"""A PostgresLocker given the application's pool leaves it room: a pool it could use up in
session mode is refused, a pool of one connection in lease mode is warned about."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from cronlock import ConfigError
from cronlock._locking.protocols import Hold
from cronlock.postgres import PostgresLocker

SLOT = datetime(2030, 1, 1, tzinfo=UTC)


@asynccontextmanager
async def app_pool(dsn: str, max_size: int) -> AsyncIterator[Any]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=max_size)
    try:
        yield pool
    finally:
        await pool.close()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("cronlock") and r.levelno >= logging.WARNING
    ]


@pytest.mark.parametrize(
    ("max_size", "options", "fragments", "absent"),
    [
        (1, {}, ["max_size=1", "sessions=4", "max_size=5 or more", "pass a DSN"], "or fewer"),
        (4, {"sessions": 4}, ["max_size=4", "sessions=4", "pass sessions=3 or fewer"], None),
    ],
    ids=["pool-of-one", "sessions-equal-to-the-pool"],
)
async def test_session_mode_refuses_a_pool_it_could_use_up(
    pg_dsn: str, max_size: int, options: dict[str, Any], fragments: list[str], absent: str | None
) -> None:
    async with app_pool(pg_dsn, max_size) as pool:
        with pytest.raises(ConfigError) as info:
            PostgresLocker(pool, **options)
        message = str(info.value)
        for fragment in fragments:
            assert fragment in message
        assert absent is None or absent not in message
        assert isinstance(info.value, ValueError)
        # Nothing was borrowed: the application still has its whole pool.
        async with pool.acquire(timeout=2) as conn:
            assert await conn.fetchval("SELECT 1") == 1


async def test_session_mode_leaving_one_connection_is_accepted_and_leaves_it(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = [f"room-{uuid.uuid4().hex[:8]}" for _ in range(20)]  # enough for both sessions
    async with app_pool(pg_dsn, 3) as pool:
        with caplog.at_level(logging.WARNING, logger="cronlock"):
            locker = PostgresLocker(pool, sessions=2)
        assert warnings_of(caplog) == []
        async with locker:
            leases = [await locker.acquire(job, SLOT) for job in jobs]
            assert all(isinstance(lease, Hold) for lease in leases)
            async with pool.acquire(timeout=2) as conn:  # the application's connection
                assert await conn.fetchval("SELECT 1") == 1
            for lease in leases:
                assert isinstance(lease, Hold)
                await lease.release()


async def test_lease_mode_warns_about_a_pool_of_one_and_still_works(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with app_pool(pg_dsn, 1) as pool:
        with caplog.at_level(logging.WARNING, logger="cronlock"):
            locker = PostgresLocker(pool, mode="lease")
        [warning] = warnings_of(caplog)
        for fragment in ["max_size=1", "mode='lease'", "connect_timeout", "pass a DSN"]:
            assert fragment in warning
        [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert record.name == "cronlock.postgres"
        async with locker:  # a warning, not a refusal: it takes turns with the application
            lease = await locker.acquire(f"turns-{uuid.uuid4().hex[:8]}", SLOT)
            assert isinstance(lease, Hold)
            await lease.release()


async def test_lease_mode_with_room_and_a_dsn_are_quiet(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with app_pool(pg_dsn, 2) as pool:
        with caplog.at_level(logging.WARNING, logger="cronlock"):
            PostgresLocker(pool, mode="lease")
            PostgresLocker(pg_dsn, sessions=64)  # its own connections: no pool to share
    assert warnings_of(caplog) == []
