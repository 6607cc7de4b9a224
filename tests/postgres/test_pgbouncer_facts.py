"""What holds, and what breaks, behind a real PgBouncer in transaction mode.

The documentation (coordination.md, "PgBouncer and hot standbys") tells users to keep the
lock sessions off a transaction-mode pooler and says what does work through one. These
tests check those facts against the real pooler (pgbouncer.py), so that a PgBouncer or
asyncpg release that changes them fails here rather than in a user's deployment:

- asyncpg works through it with ``statement_cache_size=0``, connections and pools alike;
- one client connection's statements run on different server sessions, and two clients
  share one: session advisory locks are neither held by the client nor exclusive to it;
- a transaction-scoped advisory lock taken and used within one statement works;
- startup parameters other than the few PgBouncer tracks are refused at connect;
- asyncpg's default reset on pool release runs through it without errors.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from .conftest import ADVISORY_HERE
from .pgbouncer import PgBouncer

pytestmark = pytest.mark.postgres

# The advisory locks held on one key, by any session: read on a direct connection.
_HOLDERS_SQL = f"""
SELECT coalesce(array_agg(pid ORDER BY pid), '{{}}') FROM pg_locks
WHERE {ADVISORY_HERE} AND objsubid = 1 AND granted
  AND ((classid::int8 << 32) | objid::int8) = $1
"""


def new_key() -> int:
    """An advisory lock key no other test uses."""
    return random.randrange(-(2**63), 2**63)


async def connect(dsn: str, **options: Any) -> Any:
    """A connection through the pooler: no statement cache, as PgBouncer's FAQ asks."""
    return await asyncpg.connect(dsn, statement_cache_size=0, **options)


@pytest.fixture
async def direct(pg_server: str) -> AsyncIterator[Any]:
    """A connection straight to the server, past the pooler, to look at pg_locks."""
    conn = await asyncpg.connect(pg_server)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def single_backend(pgbouncer: PgBouncer, pg_server: str) -> Iterator[PgBouncer]:
    """A PgBouncer of its own with one server connection: every client shares it.

    Depends on ``pgbouncer`` for its skip-or-fail policy when pgbouncer is missing.
    """
    with PgBouncer.for_dsn(pg_server, default_pool_size=1) as bouncer:
        yield bouncer


# -- (a) asyncpg without a statement cache ---------------------------------------------


async def test_parameterized_queries_repeat_on_one_connection(pgbouncer_dsn: str) -> None:
    """Parse/Describe then Bind/Execute (asyncpg's two steps) stay on one server session.

    asyncpg ends the first step with Flush, not Sync, so the transaction stays open and
    PgBouncer keeps the server for the second one; were that to change, the unnamed
    statement would be looked for on another server session, and this fails.
    """
    conn = await connect(pgbouncer_dsn)
    try:
        for i in range(200):
            assert await conn.fetchval("SELECT $1::int8 + $2::int8", i, 1) == i + 1
            row = await conn.fetchrow("SELECT $1::text AS name, $2::int4 AS n", f"job-{i}", i)
            assert (row["name"], row["n"]) == (f"job-{i}", i)
    finally:
        await conn.close()


async def test_parameterized_queries_from_a_pool_of_concurrent_tasks(pgbouncer_dsn: str) -> None:
    """Five tasks at once on a pool without a statement cache: no error, right answers."""
    pool = await asyncpg.create_pool(pgbouncer_dsn, statement_cache_size=0, min_size=5, max_size=5)
    try:

        async def work(task: int) -> None:
            for i in range(100):
                async with pool.acquire() as conn:
                    got = await conn.fetchval("SELECT $1::int8 * 1000 + $2::int8", task, i)
                    assert got == task * 1000 + i
                await asyncio.sleep(0)

        async with asyncio.timeout(60):
            await asyncio.gather(*(work(task) for task in range(5)))
    finally:
        await pool.close()


# -- (b) one client, many server sessions; many clients, one server session ----------------


async def test_consecutive_statements_of_a_client_move_between_server_sessions(
    pgbouncer_dsn: str,
) -> None:
    """With clients interleaved, one client's statements do not keep one backend.

    So a session advisory lock taken by one statement is held by a backend that the
    client's next statement (the unlock, the check) may not reach.
    """
    conns = [await connect(pgbouncer_dsn) for _ in range(3)]
    try:

        async def pids(conn: Any) -> list[int]:
            seen: list[int] = []
            for _ in range(50):
                seen.append(await conn.fetchval("SELECT pg_backend_pid()"))
                await asyncio.sleep(0)  # let the other clients in between
            return seen

        async with asyncio.timeout(60):
            per_client = await asyncio.gather(*(pids(conn) for conn in conns))
    finally:
        for conn in conns:
            await conn.close()
    moved = [len(set(seen)) > 1 for seen in per_client]
    assert any(moved), f"every client kept one backend: {[sorted(set(s)) for s in per_client]}"


async def test_session_advisory_lock_is_not_exclusive_to_a_client(
    single_backend: PgBouncer, direct: Any
) -> None:
    """Two clients both "get" one exclusive session lock: they share the server session.

    Deterministic with one server connection in the pool. The lock stays behind on that
    server session after the client's statement, held by a backend no client owns.
    """
    key = new_key()
    first = await connect(single_backend.dsn)
    second = await connect(single_backend.dsn)
    try:
        assert await first.fetchval("SELECT pg_try_advisory_lock($1)", key) is True
        assert await second.fetchval("SELECT pg_try_advisory_lock($1)", key) is True
        backend = await second.fetchval("SELECT pg_backend_pid()")
        assert await direct.fetchval(_HOLDERS_SQL, key) == [backend]
    finally:
        await first.close()
        await second.close()
    # The clients are gone; the lock (held twice, re-entrant) is not: the server session is.
    assert await direct.fetchval(_HOLDERS_SQL, key) == [backend]
    single_backend.stop()  # closes the server session, so the lock goes with it
    async with asyncio.timeout(10):
        while await direct.fetchval(_HOLDERS_SQL, key):
            await asyncio.sleep(0.05)


async def test_many_clients_share_a_few_server_connections(pgbouncer: PgBouncer) -> None:
    """Twenty clients, ten server connections at most (the pool size): counted by SHOW POOLS."""
    conns = [await connect(pgbouncer.dsn) for _ in range(20)]
    try:
        async with asyncio.timeout(60):
            await asyncio.gather(*(conn.fetchval("SELECT pg_sleep(0.05)") for conn in conns))
        assert 1 <= pgbouncer.server_connections() <= pgbouncer.default_pool_size
        clients = [row for row in pgbouncer.show("CLIENTS") if row["database"] == pgbouncer.dbname]
        assert len(clients) >= len(conns)
    finally:
        for conn in conns:
            await conn.close()


# -- (c) a transaction-scoped lock within one statement --------------------------------


async def test_xact_advisory_lock_within_one_statement_works(
    pgbouncer_dsn: str, direct: Any
) -> None:
    """``pg_try_advisory_xact_lock`` in one statement: exclusive while held, gone after.

    A holder in an open transaction keeps its server session (PgBouncer does not hand it
    to anyone else until the transaction ends), so another client's try fails; once it
    commits, the try succeeds, and the statement's end releases the lock.
    """
    key = new_key()
    holder = await connect(pgbouncer_dsn)
    other = await connect(pgbouncer_dsn)
    try:
        sql = "SELECT pg_try_advisory_xact_lock($1), pg_backend_pid()"
        got, _ = await other.fetchrow(sql, key)
        assert got is True
        assert await direct.fetchval(_HOLDERS_SQL, key) == []  # released with its statement

        async with holder.transaction():
            got, holder_pid = await holder.fetchrow(sql, key)
            assert got is True
            for _ in range(10):
                got, other_pid = await other.fetchrow(sql, key)
                assert got is False
                assert other_pid != holder_pid
            assert await direct.fetchval(_HOLDERS_SQL, key) == [holder_pid]
        got, _ = await other.fetchrow(sql, key)
        assert got is True
        assert await direct.fetchval(_HOLDERS_SQL, key) == []
    finally:
        await holder.close()
        await other.close()


# -- (d) startup parameters ------------------------------------------------------------


@pytest.mark.parametrize("setting", ["statement_timeout", "search_path"])
async def test_untracked_startup_parameter_is_refused(pgbouncer_dsn: str, setting: str) -> None:
    """PgBouncer (stock ``ignore_startup_parameters``) refuses other server settings.

    asyncpg passes ``server_settings`` (and unknown DSN parameters, such as the suite's
    ``search_path``) as startup parameters; PgBouncer answers with an error, which asyncpg
    raises from ``connect()`` as ProtocolViolationError, SQLSTATE 08P01.
    """
    with pytest.raises(asyncpg.ProtocolViolationError) as raised:
        await connect(pgbouncer_dsn, server_settings={setting: "1000"})
    assert str(raised.value) == f"unsupported startup parameter: {setting}"
    assert raised.value.sqlstate == "08P01"
    # The same setting in the DSN's query string is refused alike.
    with pytest.raises(asyncpg.ProtocolViolationError, match="unsupported startup parameter"):
        await connect(f"{pgbouncer_dsn}?{setting}=1000")


async def test_application_name_is_accepted_and_reaches_the_server(pgbouncer_dsn: str) -> None:
    """``application_name`` is one of the parameters PgBouncer tracks and sets per client."""
    name = f"cronlock-test-{uuid.uuid4().hex[:12]}"
    conn = await connect(pgbouncer_dsn, server_settings={"application_name": name})
    try:
        for _ in range(5):
            assert await conn.fetchval("SELECT current_setting('application_name')") == name
    finally:
        await conn.close()


# -- asyncpg's default pool reset ------------------------------------------------------


async def test_default_pool_reset_runs_without_errors(pgbouncer_dsn: str) -> None:
    """asyncpg's reset on release (unlock all, CLOSE ALL, UNLISTEN *, RESET ALL) succeeds.

    It is one simple query, so it runs on whichever server session PgBouncer picks, not
    the one the connection's earlier statements used: it cannot be relied on to release
    that connection's session locks, and it may release another client's.
    """
    pool = await asyncpg.create_pool(pgbouncer_dsn, statement_cache_size=0, min_size=1, max_size=5)
    try:
        async with pool.acquire() as conn:
            assert "pg_advisory_unlock_all()" in conn.get_reset_query()
            assert "RESET ALL" in conn.get_reset_query()

        async def work(task: int) -> None:
            for i in range(40):
                async with pool.acquire() as conn:
                    assert await conn.fetchval("SELECT $1::int8", task + i) == task + i
                    if i % 4 == 0:
                        async with conn.transaction():
                            await conn.execute("SELECT pg_advisory_xact_lock($1)", new_key())

        async with asyncio.timeout(60):
            await asyncio.gather(*(work(task) for task in range(5)))
        # A connection released in the middle of a transaction is rolled back, then reset.
        conn = await pool.acquire()
        await conn.execute("BEGIN")
        await conn.execute("SELECT 1")
        await pool.release(conn)
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await pool.close()


async def test_pool_reset_releases_session_locks_of_another_client(
    single_backend: PgBouncer, direct: Any
) -> None:
    """The reset's ``pg_advisory_unlock_all()`` lands on a shared server session.

    With one server connection, a pool connection's release drops the session lock a
    different client took: what one replica's pool does can free another's lock.
    """
    key = new_key()
    owner = await connect(single_backend.dsn)
    pool = await asyncpg.create_pool(
        single_backend.dsn, statement_cache_size=0, min_size=1, max_size=1
    )
    try:
        assert await owner.fetchval("SELECT pg_try_advisory_lock($1)", key) is True
        assert len(await direct.fetchval(_HOLDERS_SQL, key)) == 1
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1
        assert await direct.fetchval(_HOLDERS_SQL, key) == []  # the owner never unlocked it
    finally:
        await pool.close()
        await owner.close()
