"""A real PostgreSQL server for the coordination tests, and helpers to inspect its locks.

Where the server comes from, in this order:

1. ``CRONLOCK_TEST_DSN`` from the environment;
2. a testcontainers PostgreSQL, when a Docker engine answers;
3. a throwaway cluster made with the local ``initdb``/``pg_ctl`` in a temporary directory,
   on a free port;
4. otherwise the tests are skipped, loudly, except when ``CI`` is set: then they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os
import socket
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
import pytest

from cronlock._keys import job_lock_key
from cronlock.postgres._sql.tables import LedgerTable

from ..throwaway import drop, make, prefix
from .cluster import Cluster, ClusterUnavailable
from .pgbouncer import PgBouncer, PgBouncerUnavailable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _docker_postgres(reasons: list[str]) -> contextlib.AbstractContextManager[str] | None:
    # The Docker SDK leaks its socket when no daemon answers; collect it here, quietly,
    # rather than have the leak reported (as an error) against whichever test runs next.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            docker = importlib.import_module("docker")  # testcontainers' dependency; untyped
            client = docker.from_env(timeout=3)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:  # no SDK, no socket, no daemon: all mean "no Docker"
            reasons.append(f"no Docker engine ({type(exc).__name__})")
            return None
        finally:
            gc.collect()
    from testcontainers.community.postgres import PostgresContainer

    @contextlib.contextmanager
    def run() -> Iterator[str]:
        with PostgresContainer("postgres:15-alpine", driver=None) as container:
            yield container.get_connection_url()

    return run()


def _local_cluster(reasons: list[str]) -> contextlib.AbstractContextManager[str] | None:
    """A throwaway cluster (cluster.py): a watchdog stops it even if pytest is killed."""
    try:
        cluster = Cluster()
    except ClusterUnavailable as exc:
        reasons.append(str(exc))
        return None

    @contextlib.contextmanager
    def run() -> Iterator[str]:
        with cluster:
            yield cluster.dsn

    return run()


@pytest.fixture(scope="session")
def pg_dsn(pg_server: str) -> Iterator[str]:
    """The DSN the tests use: the server's, with a throwaway schema first in search_path.

    Every ledger table a test creates without naming a schema lands in that schema, which
    is dropped at the end of the session (and one left by an interrupted run is dropped at
    the start of the next): a user who points the suite at a database finds it as it was.
    Subprocesses given this DSN (replicas, the command line) use the same schema, since
    asyncpg passes unknown DSN parameters on as server settings.
    """
    schema = f"{prefix()}{os.getpid()}_{uuid.uuid4().hex[:6]}"
    asyncio.run(make(pg_server, "schema", schema))
    separator = "&" if "?" in pg_server else "?"
    try:
        yield f"{pg_server}{separator}search_path={schema}"
    finally:
        asyncio.run(drop(pg_server, "schema", schema))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The DSN of a PostgreSQL server the tests may use (in their own schema: ``pg_dsn``)."""
    dsn = os.environ.get("CRONLOCK_TEST_DSN")
    if dsn:
        yield dsn
        return
    reasons: list[str] = ["CRONLOCK_TEST_DSN is not set"]
    server = _docker_postgres(reasons) or _local_cluster(reasons)
    if server is None:
        message = "NO POSTGRESQL SERVER: the coordination tests did not run: " + "; ".join(reasons)
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        started = server.__enter__()
    except Exception as exc:
        message = f"NO POSTGRESQL SERVER: starting one failed: {exc!r}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield started
    finally:
        server.__exit__(None, None, None)


@pytest.fixture
def app_name() -> str:
    """An application_name unique to this test, to find its sessions in pg_stat_activity."""
    return f"cronlock-test-{uuid.uuid4().hex[:12]}"


async def _no_reset(conn: Any) -> None:
    """A pool reset that does *not* run pg_advisory_unlock_all().

    The tests use it so that a lock left held by a missing unlock stays visible in
    pg_locks, instead of being mopped up by asyncpg's default reset (a backstop that
    cronlock must not depend on).
    """


@pytest.fixture
async def pool(pg_dsn: str, app_name: str) -> AsyncIterator[Any]:
    """An asyncpg pool of up to 30 connections whose reset does not release advisory locks."""
    pool = await asyncpg.create_pool(
        pg_dsn,
        min_size=1,
        max_size=30,
        reset=_no_reset,
        server_settings={"application_name": app_name},
    )
    try:
        yield pool
    finally:
        # A test that leaked a connection would make close() wait for it forever.
        try:
            async with asyncio.timeout(10):
                await pool.close()
        except TimeoutError:
            pool.terminate()


@pytest.fixture
async def admin(pg_dsn: str) -> AsyncIterator[Any]:
    """A separate connection that inspects pg_locks and pg_stat_activity."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        yield conn
    finally:
        await conn.close()


# Advisory locks of this database only: pg_locks lists every database's, and under xdist
# each worker has a database of its own (tests/conftest.py) where job names may repeat.
ADVISORY_HERE = (
    "locktype = 'advisory'"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)

# A bigint advisory key k appears in pg_locks as classid = k >> 32, objid = k & 0xffffffff,
# objsubid = 1. Reassembled as int8, that is the signed key itself.
_LOCKS_SQL = f"""
SELECT count(*) FROM pg_locks
WHERE {ADVISORY_HERE} AND objsubid = 1 AND granted
  AND ((classid::int8 << 32) | objid::int8) = ANY($1::int8[])
"""

LocksHeld = Callable[[Iterable[str]], Awaitable[int]]
_LEDGER = LedgerTable()
SessionsNamed = Callable[[str], Awaitable[int]]


@pytest.fixture
def locks_held(admin: Any) -> LocksHeld:
    """``await locks_held(names)``: advisory locks held on those jobs' keys, by anyone."""

    async def count(names: Iterable[str]) -> int:
        # The seed's bare keys (locked_run) and the default ledger's namespaced ones.
        keys = sorted({k for name in names for k in (job_lock_key(name), _LEDGER.lock_key(name))})
        held: int = await admin.fetchval(_LOCKS_SQL, keys)
        return held

    return count


@pytest.fixture
def sessions_named(admin: Any) -> SessionsNamed:
    """``await sessions_named(app)``: server connections whose application_name is *app*."""

    async def count(application_name: str) -> int:
        found: int = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            application_name,
        )
        return found

    return count


@pytest.fixture
def unreachable_dsn() -> str:
    """A DSN pointing at a local port where nothing listens."""
    return f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"


# -- a throwaway cluster a test may stop, restart or crash (never the shared server) ------


def throwaway_cluster(**options: Any) -> Cluster:
    """A new throwaway cluster (cluster.py); none can be made here: a failure in CI (the
    tests that need one must run there), a skip elsewhere."""
    try:
        return Cluster(**options)
    except ClusterUnavailable as exc:
        message = f"NO THROWAWAY POSTGRESQL CLUSTER: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def primary_and_standby() -> Iterator[tuple[Cluster, Cluster]]:
    """A throwaway primary and a streaming standby of it, both stopped at the end (the
    body of a fixture: ``yield from primary_and_standby()``)."""
    primary = throwaway_cluster()
    try:
        primary.start()
        standby = primary.standby()
        yield primary, standby
    finally:
        primary.destroy()  # and its standby


@pytest.fixture
def ha_pair() -> Iterator[tuple[Cluster, Cluster]]:
    """A throwaway primary and a streaming standby of it, both stopped at the end."""
    yield from primary_and_standby()


@pytest.fixture(scope="module")
def restartable_cluster() -> Iterator[Cluster]:
    """One throwaway cluster per test module (initdb takes seconds); see cluster.py."""
    cluster = throwaway_cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def restartable_pg(restartable_cluster: Cluster) -> Cluster:
    """The module's throwaway cluster, running: the test may stop, restart or crash it."""
    restartable_cluster.start()  # a test that stopped it, then failed, left it down
    return restartable_cluster


# -- PgBouncer in transaction mode in front of the suite's server (pgbouncer.py) ----------


@pytest.fixture(scope="session")
def pgbouncer(pg_server: str) -> Iterator[PgBouncer]:
    """One PgBouncer (transaction mode, 10 server connections) in front of ``pg_server``.

    In front of the server's DSN, not ``pg_dsn``'s: PgBouncer refuses the ``search_path``
    startup parameter that gives ``pg_dsn`` its throwaway schema, so a test through the
    pooler that makes tables must name a schema (or use temporary ones). Missing pgbouncer
    skips, except with ``CI`` set: then it fails, as the servers' fixtures do.
    """
    try:
        bouncer = PgBouncer.for_dsn(pg_server, pool_mode="transaction")
        bouncer.start()
    except PgBouncerUnavailable as exc:
        message = f"NO PGBOUNCER: the pooler tests did not run: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="session")
def pgbouncer_dsn(pgbouncer: PgBouncer) -> str:
    """The DSN of the session's PgBouncer: the suite's database, in transaction mode."""
    return pgbouncer.dsn


# -- the two coordination modes, for the replica-process tests ----------------------------


@dataclass(frozen=True)
class Coordination:
    """How the replicas of a test coordinate: what they connect to and the flags they get.

    ``session``: the default locker on a direct connection, in ``pg_dsn``'s schema.
    ``lease``: ``mode="lease"`` through the suite's PgBouncer in transaction mode, with a
    3 s lease (so a crash is noticed quickly), in a schema of the test's own (PgBouncer
    refuses ``pg_dsn``'s ``search_path`` parameter).
    """

    mode: Literal["session", "lease"]
    dsn: str
    args: tuple[str, ...]
    schema: str | None

    def table(self, name: str) -> LedgerTable:
        """Ledger *name* where this test's replicas keep it."""
        return LedgerTable(name, self.schema)

    @property
    def schema_args(self) -> tuple[str, ...]:
        """``--schema S`` for the command line and the fleet replicas, when one is set."""
        return () if self.schema is None else ("--schema", self.schema)


@pytest.fixture(params=["session", "lease"])
def coordination(
    request: pytest.FixtureRequest, pg_dsn: str, pg_server: str
) -> Iterator[Coordination]:
    """Each replica-process test that takes it runs in both modes (see :class:`Coordination`)."""
    if request.param == "session":
        yield Coordination("session", pg_dsn, (), None)
        return
    bouncer: str = request.getfixturevalue("pgbouncer_dsn")
    schema = f"{prefix()}{os.getpid()}_lease_{uuid.uuid4().hex[:6]}"
    asyncio.run(make(pg_server, "schema", schema))
    try:
        yield Coordination(
            "lease", bouncer, ("--mode", "lease", "--lease", "3", "--schema", schema), schema
        )
    finally:
        asyncio.run(drop(pg_server, "schema", schema))


@pytest.fixture
async def server_schema(pg_server: str) -> AsyncIterator[str]:
    """A schema name of the test's own on ``pg_server``, dropped (with what the test made in
    it) afterwards: for what goes through PgBouncer, which refuses ``pg_dsn``'s
    ``search_path``."""
    name = f"{prefix()}{os.getpid()}_own_{uuid.uuid4().hex[:6]}"
    yield name
    await drop(pg_server, "schema", name)
