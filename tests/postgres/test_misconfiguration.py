"""Misconfiguration fails at start; a server that is only down does not (issue 35, item 7).

Against the real server and a real PgBouncer 1.18 in transaction mode (pgbouncer.py), no
mocks: each mistake a user makes in the field (session mode through a pooler, lease mode on
a pool whose statement cache is on behind one, ``create_table=False`` without the ledger,
a wrong password, an unknown database) raises ``LockerMisconfigured`` naming the fix from
``async with scheduler``, before any job could run; a closed port starts.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from cronlock import (
    CheckableLocker,
    LockerMisconfigured,
    LockError,
    LockUnavailable,
    PoolerDetected,
    RunContext,
    Scheduler,
    every,
)
from cronlock.postgres import PostgresLocker

from .conftest import SessionsNamed
from .pgbouncer import PgBouncer, PgBouncerUnavailable

pytestmark = pytest.mark.postgres

PASSWORD = "the-right-one"


async def _job(ctx: RunContext) -> None:
    """Never meant to run: the scheduler must not start."""
    raise AssertionError(f"ran {ctx.job} at {ctx.slot} with a locker that cannot work")


def _scheduler(locker: PostgresLocker) -> Scheduler:
    scheduler = Scheduler(locker=locker)
    scheduler.add_job(_job, every(1), name="never")
    return scheduler


async def _refused_at_start(locker: PostgresLocker, fix: str) -> LockerMisconfigured:
    """``async with`` a scheduler of *locker* raises naming *fix*; nothing stays open."""
    scheduler = _scheduler(locker)
    with pytest.raises(LockerMisconfigured, match=fix) as raised:
        async with scheduler:
            pytest.fail("the scheduler started with a locker that can never work")
    assert not scheduler.running
    assert locker.closed  # closed as a shutdown would: nothing borrowed is left held
    return raised.value


def _with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="module")
def password_pgbouncer(pg_server: str) -> Iterator[PgBouncer]:
    """A PgBouncer that checks passwords (``auth_type = md5``) against an auth file of its
    own: the shared server trusts local connections, so it could never refuse one."""
    folder = tempfile.mkdtemp(prefix="cronlock-auth-")
    os.chmod(folder, 0o755)  # pgbouncer runs as postgres under root
    auth_file = os.path.join(folder, "users.txt")
    with open(auth_file, "w") as f:
        f.write(f'"postgres" "{PASSWORD}"\n')
    os.chmod(auth_file, 0o644)
    try:
        bouncer = PgBouncer.for_dsn(
            pg_server, settings={"auth_type": "md5", "auth_file": auth_file}
        )
        bouncer.start()
    except PgBouncerUnavailable as exc:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get("CI"):
            pytest.fail(f"NO PGBOUNCER: {exc}", pytrace=False)
        pytest.skip(f"NO PGBOUNCER: {exc}")
    try:
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def cached_pool(pgbouncer_dsn: str) -> AsyncIterator[Any]:
    """A pool through PgBouncer with asyncpg's statement cache as it comes (100)."""
    pool = await asyncpg.create_pool(pgbouncer_dsn, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


# -- what can never work fails the start ---------------------------------------------------


async def test_session_mode_through_a_pooler_fails_the_start(
    pgbouncer_dsn: str, server_schema: str
) -> None:
    """The default mode through PgBouncer: PoolerDetected, naming lease mode."""
    refused = await _refused_at_start(
        PostgresLocker(pgbouncer_dsn, schema=server_schema), "mode='lease'"
    )
    assert isinstance(refused, PoolerDetected)


async def test_lease_mode_on_a_cached_pool_behind_a_pooler_fails_the_start(
    cached_pool: Any, server_schema: str
) -> None:
    """Lease mode on a pool whose statement cache is on, through PgBouncer: its claims
    would run as other clients' prepared statements. Refused, naming the setting."""
    locker = PostgresLocker(cached_pool, mode="lease", schema=server_schema)
    await _refused_at_start(locker, "statement_cache_size=0")


async def test_lease_mode_with_a_cache_set_on_its_own_connection_fails_the_start(
    pgbouncer_dsn: str, server_schema: str
) -> None:
    """The same, given a DSN whose connect_kwargs turn the cache back on."""
    locker = PostgresLocker(
        pgbouncer_dsn,
        mode="lease",
        schema=server_schema,
        connect_kwargs={"statement_cache_size": 100},
    )
    await _refused_at_start(locker, "statement_cache_size=0")


async def test_a_missing_ledger_with_create_table_false_fails_the_start(pg_dsn: str) -> None:
    locker = PostgresLocker(pg_dsn, table="no_such_runs", create_table=False)
    refused = await _refused_at_start(locker, "python -m cronlock migrate")
    assert "no_such_runs" in str(refused)


async def test_a_wrong_password_fails_the_start(password_pgbouncer: PgBouncer) -> None:
    dsn = f"postgresql://postgres:not-{PASSWORD}@127.0.0.1:{password_pgbouncer.port}/"
    dsn += password_pgbouncer.dbname
    refused = await _refused_at_start(
        PostgresLocker(dsn, mode="lease"), "refused the user or the password"
    )
    assert f"not-{PASSWORD}" not in str(refused)  # the DSN's password is never repeated


async def test_an_unknown_database_fails_the_start(pg_server: str) -> None:
    locker = PostgresLocker(_with_database(pg_server, "cronlock_no_such_database"))
    refused = await _refused_at_start(locker, "the database does not exist")
    assert "cronlock_no_such_database" in str(refused)


async def test_an_unknown_database_behind_pgbouncer_fails_the_start(
    pgbouncer: PgBouncer,
) -> None:
    """PgBouncer says it in words of its own (SQLSTATE 08P01): the same verdict."""
    locker = PostgresLocker(
        _with_database(pgbouncer.dsn, "cronlock_no_such_database"), mode="lease"
    )
    await _refused_at_start(locker, "the database does not exist")


@pytest.mark.parametrize(
    ("query", "password"),
    [("?sslmode=bogus", ""), ("", ":pa/ss")],
    ids=["an-option-asyncpg-refuses", "an-unescaped-slash-in-the-password"],
)
async def test_an_invalid_dsn_fails_the_start(pg_server: str, query: str, password: str) -> None:
    """A DSN asyncpg refuses before connecting can never connect; the password is not said."""
    parts = urlsplit(pg_server)
    netloc = f"postgres{password}@{parts.hostname}:{parts.port or 5432}"
    dsn = urlunsplit(parts._replace(netloc=netloc, query=query.lstrip("?")))
    refused = await _refused_at_start(PostgresLocker(dsn), "the DSN or a connect option")
    assert "pa/ss" not in str(refused)


async def test_a_locker_held_open_by_its_user_stays_open_when_the_start_fails(
    pg_dsn: str,
) -> None:
    """The scheduler closes only what it was given to close: a locker its user holds open
    with ``async with`` is that block's."""
    locker = PostgresLocker(pg_dsn, table="no_such_runs", create_table=False)
    async with locker:
        with pytest.raises(LockerMisconfigured):
            async with _scheduler(locker):
                pass
        assert not locker.closed
    assert locker.closed


# -- what may work later starts ------------------------------------------------------------


async def test_an_unreachable_server_starts_and_says_so(
    unreachable_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A closed port is an outage, not a mistake: the scheduler starts (and catches up
    once the server is back); check() says LockUnavailable, a readiness probe's "not yet"."""
    locker = PostgresLocker(unreachable_dsn)
    with pytest.raises(LockUnavailable):
        await locker.check()
    with caplog.at_level(logging.WARNING, logger="cronlock"):
        async with _scheduler(locker) as scheduler:
            assert scheduler.running
    assert any(
        r.levelno == logging.WARNING and "cannot reach its server" in r.getMessage()
        for r in caplog.records
    )


async def test_a_name_that_does_not_resolve_starts() -> None:
    """DNS is the network's, not a mistake of the configuration: it may resolve later."""
    locker = PostgresLocker("postgresql://postgres@cronlock-no-such-host.invalid:5432/test")
    with pytest.raises(LockUnavailable):
        await locker.check()
    async with _scheduler(locker) as scheduler:
        assert scheduler.running


# -- a good set-up: check() is the readiness probe -------------------------------------------


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_check_succeeds_and_its_session_is_the_lockers(
    pg_dsn: str, app_name: str, sessions_named: SessionsNamed, mode: Any
) -> None:
    """check() opens the locker's first session, which the locker keeps: a scheduler's
    start (its check, its catch-up read) costs that one connection, not a throwaway one
    and then another."""
    locker = PostgresLocker(pg_dsn, application_name=app_name, mode=mode)
    assert isinstance(locker, CheckableLocker)
    async with locker:
        await locker.check()
        await locker.check()  # again: a round trip on the same session
        assert await sessions_named(app_name) == 1
        scheduler = Scheduler(locker=locker)
        scheduler.add_job(_job, every(3600), name="hourly")  # no slot during the test
        async with scheduler:
            assert await sessions_named(app_name) == 1
    fresh = PostgresLocker(pg_dsn, application_name=app_name, mode=mode)
    scheduler = Scheduler(locker=fresh)
    scheduler.add_job(_job, every(3600), name="hourly")
    async with scheduler:
        assert await sessions_named(app_name) == 1


async def test_check_succeeds_in_lease_mode_through_pgbouncer_without_the_cache(
    pgbouncer_dsn: str, server_schema: str
) -> None:
    """The documented set-up behind a pooler: a pool with statement_cache_size=0."""
    pool = await asyncpg.create_pool(pgbouncer_dsn, min_size=1, max_size=4, statement_cache_size=0)
    try:
        locker = PostgresLocker(pool, mode="lease", schema=server_schema)
        async with locker:
            await locker.check()
            async with _quiet_scheduler(locker):
                await locker.check()
    finally:
        await pool.close()


async def test_lease_mode_on_a_cached_pool_without_a_pooler_is_fine(pool: Any) -> None:
    """The statement cache is harmless on a direct connection: not refused."""
    locker = PostgresLocker(pool, mode="lease")
    async with locker:
        await locker.check()


async def test_check_of_a_closed_locker_raises(pg_dsn: str) -> None:
    locker = PostgresLocker(pg_dsn)
    await locker.close()
    with pytest.raises(LockError, match="closed"):
        await locker.check()


def _quiet_scheduler(locker: PostgresLocker) -> Scheduler:
    """A scheduler of *locker* with no jobs."""
    return Scheduler(locker=locker)
