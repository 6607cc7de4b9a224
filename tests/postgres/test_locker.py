"""PostgresLocker against a real server: replicas, slots, connection use, lost sessions."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from cronlock import ConfigError, LockError
from cronlock._locking.protocols import Hold, Locker, LosableHold
from cronlock.postgres import PostgresHold, PostgresLocker, job_lock_key, locked_run
from cronlock.postgres._sql.tables import LedgerTable

pytestmark = pytest.mark.postgres

LocksHeld = Callable[[Iterable[str]], Awaitable[int]]
SessionsNamed = Callable[[str], Awaitable[int]]

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


def new_job() -> str:
    return f"locker-{uuid.uuid4()}"


def job_in_shard(shard: int, sessions: int = 4) -> str:
    """A new job whose lock goes to session *shard* of a locker with *sessions* sessions."""
    while True:
        job = new_job()
        if key_of(job) % sessions == shard:
            return job


def key_of(job: str) -> int:
    """The key a locker on the default ledger takes for *job* (namespaced by that ledger)."""
    return LedgerTable().lock_key(job)


def replica(dsn: str, app_name: str, **options: Any) -> PostgresLocker:
    """A locker as one replica would have it: its own lock session."""
    return PostgresLocker(dsn, application_name=app_name, **options)


async def test_implements_the_locker_protocol(pg_dsn: str, app_name: str) -> None:
    async with replica(pg_dsn, app_name) as locker:
        checked: Locker = locker
        lease = await checked.acquire(new_job(), SLOT)
        assert isinstance(locker, Locker)
        assert isinstance(lease, Hold)
        assert isinstance(lease, LosableHold)
        await lease.release()


async def test_mutual_exclusion_across_two_replicas(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    job = new_job()
    async with replica(pg_dsn, app_name + "-a") as a, replica(pg_dsn, app_name + "-b") as b:
        lease = await a.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        # The ledger knows the slot is taken; the lock keeps B off the next slot meanwhile.
        assert await b.acquire(job, SLOT) == "already_ran"
        assert await b.acquire(job, SLOT + timedelta(minutes=1)) == "locked"
        # The locker's key is its ledger's: locked_run (the seed's bare key) is not blocked.
        async with locked_run(pg_dsn, job) as standalone:
            assert standalone
        await lease.release()
        # The lock is free again, but the slot ran: B, which never saw it, skips it.
        assert await b.acquire(job, SLOT) == "already_ran"
        lease_b = await b.acquire(job, SLOT + timedelta(minutes=1))
        assert isinstance(lease_b, PostgresHold)
        assert await a.acquire(job, SLOT + timedelta(minutes=2)) == "locked"
        await lease_b.release()
        assert a.statistics().contended >= 1
        assert b.statistics().already_ran == 2
    assert await locks_held([job]) == 0


async def test_lock_only_mode_lets_another_replica_rerun_a_released_slot(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    job = new_job()
    a = replica(pg_dsn, app_name + "-a", ledger=False)
    b = replica(pg_dsn, app_name + "-b", ledger=False)
    async with a, b:
        lease = await a.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        assert await b.acquire(job, SLOT) == "locked"
        assert await b.acquire(job, SLOT + timedelta(minutes=1)) == "locked"
        await lease.release()
        # The lock is not a ledger: B, which never saw the slot, may now take it.
        lease_b = await b.acquire(job, SLOT)
        assert isinstance(lease_b, PostgresHold)
        assert await a.acquire(job, SLOT + timedelta(minutes=1)) == "locked"
        await lease_b.release()
        assert a.statistics().contended >= 1
        assert await a.last_claimed(job) is None  # no ledger, nothing to tell
        assert await a.history(job) == []
    assert await locks_held([job]) == 0


async def test_per_slot_in_one_replica(pg_dsn: str, app_name: str, locks_held: LocksHeld) -> None:
    job = new_job()
    later = SLOT + timedelta(days=1)
    async with replica(pg_dsn, app_name) as locker:
        first = await locker.acquire(job, SLOT)
        assert isinstance(first, PostgresHold)
        told: list[BaseException | None] = []
        first.on_lost(told.append)
        # Re-entrant server-side, but refused here: the job is running in this process.
        assert await locker.acquire(job, later) == "locked"
        assert await locks_held([job]) == 1
        await first.release()
        await first.release()  # a second release does nothing
        assert await locks_held([job]) == 0
        assert await locker.acquire(job, SLOT) == "already_ran"
        second = await locker.acquire(job, later)
        assert isinstance(second, PostgresHold)
        await second.release()
        stats = locker.statistics()
        assert (stats.granted, stats.released, stats.held) == (2, 2, 0)
    await asyncio.sleep(0.01)
    assert told == []  # released, then the locker closed: not a loss


@pytest.mark.parametrize("sessions", [1, 4])
async def test_fifty_concurrent_leases_use_at_most_sessions_connections(
    pg_dsn: str,
    app_name: str,
    locks_held: LocksHeld,
    sessions_named: SessionsNamed,
    capsys: pytest.CaptureFixture[str],
    sessions: int,
) -> None:
    jobs = [new_job() for _ in range(50)]
    async with replica(pg_dsn, app_name, sessions=sessions) as locker:
        leases = await asyncio.gather(*(locker.acquire(job, SLOT) for job in jobs))
        assert all(isinstance(lease, PostgresHold) for lease in leases)
        assert await locks_held(jobs) == 50
        connections = await sessions_named(app_name)
        with capsys.disabled():
            print(
                f"\n[measured] 50 concurrent leases, sessions={sessions} -> "
                f"{connections} server connection(s)"
            )
        if sessions == 1:
            assert connections == 1
        else:  # 50 random keys all in one of 4 shards: odds 4 ** -49
            assert 1 < connections <= sessions
        await asyncio.gather(*(lease.release() for lease in leases if isinstance(lease, Hold)))
        assert await locks_held(jobs) == 0
        stats = locker.statistics()
        assert stats.sessions_opened == stats.sessions_open == connections
        assert stats.sessions == sessions


async def test_terminating_one_shard_loses_only_its_leases(
    pg_dsn: str, app_name: str, admin: Any, locks_held: LocksHeld, sessions_named: SessionsNamed
) -> None:
    jobs = [new_job() for _ in range(50)]
    async with replica(pg_dsn, app_name, sessions=4, heartbeat=None) as locker:
        leases = await asyncio.gather(*(locker.acquire(job, SLOT) for job in jobs))
        assert all(isinstance(lease, PostgresHold) for lease in leases)
        held = [lease for lease in leases if isinstance(lease, PostgresHold)]
        assert 1 < await sessions_named(app_name) <= 4
        victim = held[0]
        shard = key_of(victim.job) % 4
        doomed = [lease for lease in held if key_of(lease.job) % 4 == shard]
        spared = [lease for lease in held if key_of(lease.job) % 4 != shard]
        assert spared
        # The backend holding the victim's lock holds exactly its shard's locks.
        pid = await admin.fetchval(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND a.application_name = $1"
            " AND ((l.classid::int8 << 32) | l.objid::int8) = $2",
            app_name,
            victim.key,
        )
        keys = await admin.fetch(
            "SELECT (classid::int8 << 32) | objid::int8 AS key FROM pg_locks"
            " WHERE locktype = 'advisory' AND pid = $1",
            pid,
        )
        assert sorted(r["key"] for r in keys) == sorted(lease.key for lease in doomed)
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        async with asyncio.timeout(30):
            while not all(lease.lost for lease in doomed):
                await asyncio.sleep(0.01)
        assert not any(lease.lost for lease in spared)
        assert await locks_held([lease.job for lease in doomed]) == 0
        assert await locks_held([lease.job for lease in spared]) == len(spared)
        assert locker.statistics().lost == len(doomed)
        # The shard reconnects on its next acquire; the others keep their sessions.
        again = await locker.acquire(job_in_shard(shard), SLOT)
        assert isinstance(again, PostgresHold)
        await asyncio.gather(*(lease.release() for lease in [*held, again]))
        assert await locks_held([*jobs, again.job]) == 0
        assert locker.statistics().held == 0


@pytest.mark.parametrize("sessions", [0, 65, -1, 2.0, True, "4"])
def test_sessions_must_be_from_1_to_64(sessions: Any) -> None:
    with pytest.raises(ConfigError, match="sessions") as caught:
        PostgresLocker("postgresql://unused", sessions=sessions)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"retention": -1}, "retention"),
        ({"heartbeat": 0}, "heartbeat"),
        ({"connect_timeout": "soon"}, "connect_timeout"),
        ({"statement_timeout": float("nan")}, "statement_timeout"),
        ({"remember": 0}, "remember"),
    ],
)
def test_bad_settings_raise_config_error_naming_the_setting(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        PostgresLocker("postgresql://unused", **options)


async def test_borrowing_from_a_pool_takes_at_most_sessions_connections(
    pool: Any, app_name: str, locks_held: LocksHeld, sessions_named: SessionsNamed
) -> None:
    jobs = [new_job() for _ in range(50)]
    lock_app = app_name + "-locker"
    async with PostgresLocker(pool, application_name=lock_app) as locker:
        leases = await asyncio.gather(*(locker.acquire(job, SLOT) for job in jobs))
        assert await locks_held(jobs) == 50
        assert 1 <= await sessions_named(lock_app) <= 4
        await asyncio.gather(*(lease.release() for lease in leases if isinstance(lease, Hold)))
    assert await locks_held(jobs) == 0
    assert pool.get_idle_size() == pool.get_size()  # the borrowed connection went back


async def test_terminated_session_reconnects_and_lost_lease_releases_quietly(
    pg_dsn: str, app_name: str, admin: Any, locks_held: LocksHeld
) -> None:
    first, second = job_in_shard(2), job_in_shard(2)  # on one session, so one reconnect
    async with replica(pg_dsn, app_name) as locker:
        lease = await locker.acquire(first, SLOT)
        assert isinstance(lease, PostgresHold)
        told: list[BaseException | None] = []
        lease.on_lost(told.append)
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1",
            app_name,
        )
        assert killed == 1
        # No waiting for the client to notice: the next acquire copes either way.
        async with asyncio.timeout(60):
            other = await locker.acquire(second, SLOT)
            assert isinstance(other, PostgresHold)
            assert lease.lost
            assert await locks_held([first]) == 0  # the server dropped it with the session
            while not told:
                await asyncio.sleep(0.01)
            assert isinstance(told[0], LockError)
            late: list[BaseException | None] = []
            lease.on_lost(late.append)  # registered after the loss: still told
            while not late:
                await asyncio.sleep(0.01)
            await lease.release()  # neither raises nor hangs
            assert await locker.acquire(first, SLOT + timedelta(hours=1)) is not None
        stats = locker.statistics()
        assert stats.sessions_opened == 2
        assert stats.lost == 1
        await other.release()
    assert await locks_held([first, second]) == 0


async def test_unreachable_server_raises_lock_error(unreachable_dsn: str, app_name: str) -> None:
    async with replica(unreachable_dsn, app_name, connect_timeout=5) as locker:
        async with asyncio.timeout(60):
            with pytest.raises(LockError):
                await locker.acquire(new_job(), SLOT)
            with pytest.raises(LockError):  # and again: no half-open state left behind
                await locker.acquire(new_job(), SLOT)


async def test_closed_locker_refuses_and_released_everything(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    job = new_job()
    locker = replica(pg_dsn, app_name)
    lease = await locker.acquire(job, SLOT)
    assert isinstance(lease, PostgresHold)
    await locker.close()
    assert lease.lost
    assert await locks_held([job]) == 0
    await lease.release()
    with pytest.raises(LockError, match="closed"):
        await locker.acquire(new_job(), SLOT)
    await locker.close()  # idempotent


async def test_session_is_labelled_and_has_keepalives(
    pg_dsn: str, app_name: str, admin: Any
) -> None:
    async with replica(pg_dsn, app_name) as locker:
        lease = await locker.acquire(new_job(), SLOT)
        assert isinstance(lease, PostgresHold)
        # Read the settings the way an operator would: from the session itself.
        conn = next(s.conn for s in locker._shards if s.conn is not None)
        assert await conn.fetchval("SHOW application_name") == app_name
        if await conn.fetchval("SELECT inet_client_addr() IS NOT NULL"):  # TCP, not a socket
            assert await conn.fetchval("SHOW tcp_keepalives_idle") == "30"
            assert await conn.fetchval("SHOW tcp_keepalives_count") == "3"
        await lease.release()


def test_default_application_name_names_host_and_pid() -> None:
    import os

    name = PostgresLocker("postgresql://unused").application_name
    assert name.startswith("cronlock:")
    assert name.endswith(f":{os.getpid()}")
    assert len(name.encode()) <= 63


async def test_acquire_and_release_cancelled_at_random_points_leave_nothing(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    jobs = [new_job() for _ in range(4)]
    rng = random.Random(99)
    async with replica(pg_dsn, app_name) as locker:
        cancelled = 0
        for i in range(200):

            async def run(i: int = i) -> None:
                lease = await locker.acquire(rng.choice(jobs), SLOT + timedelta(minutes=i))
                if isinstance(lease, PostgresHold):
                    try:
                        await asyncio.sleep(rng.uniform(0, 0.002))
                    finally:
                        await lease.release()

            task = asyncio.create_task(run(), name=f"run-{i}")
            await asyncio.sleep(rng.uniform(0, 0.003))
            task.cancel()
            if rng.random() < 0.3:
                await asyncio.sleep(0)
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                cancelled += 1
        assert cancelled > 0
        assert locker.statistics().held == 0
        assert await locks_held(jobs) == 0


class CuttableProxy:
    """A TCP relay to the server whose link can be cut (bytes swallowed, sockets kept open).

    That is what a network partition looks like to both ends: no error, no FIN, silence.
    """

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._cut = False
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> CuttableProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close_all()
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def cut(self) -> None:
        self._cut = True

    def close_all(self) -> None:
        """Close every relayed socket: the server then notices the session is gone."""
        for writer in self._writers:
            writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers += [writer, up_writer]
        for src, dst, name in ((reader, up_writer, "up"), (up_reader, writer, "down")):
            task = asyncio.create_task(self._pump(src, dst), name=f"proxy-{name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                if not self._cut:
                    dst.write(data)
        except (ConnectionError, OSError):
            pass
        finally:
            if not self._cut:  # after a cut, not even a close gets through
                dst.transport.abort()


async def test_network_cut_release_is_bounded_and_quiet(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    parts = urlsplit(pg_dsn)
    if parts.hostname is None or parts.hostname.startswith("/"):
        pytest.skip("the DSN names no TCP host to relay to")
    job = new_job()
    async with CuttableProxy(parts.hostname, parts.port or 5432) as proxy:
        netloc = f"{parts.username or 'postgres'}"
        if parts.password:
            netloc += f":{parts.password}"
        via_proxy = urlunsplit(parts._replace(netloc=f"{netloc}@127.0.0.1:{proxy.port}"))
        async with replica(via_proxy, app_name, statement_timeout=0.5, connect_timeout=1) as locker:
            lease = await locker.acquire(job, SLOT)
            assert isinstance(lease, PostgresHold)
            proxy.cut()
            async with asyncio.timeout(60):
                await lease.release()  # the unlock cannot get through: bounded, no raise
                assert lease.lost
                with pytest.raises(LockError):  # no server: a clear error, not a hang
                    await locker.acquire(new_job(), SLOT)
            # The server still holds the lock: it has not noticed anything yet. That is
            # what the keepalives are for; here the relay's sockets closing stands in.
            assert await locks_held([job]) == 1
            proxy.close_all()
            async with asyncio.timeout(60):
                while await locks_held([job]):
                    await asyncio.sleep(0.01)


@pytest.mark.parametrize("bare", [False, True])
async def test_key_in_pg_locks_is_the_ledgers_or_with_bare_keys_job_lock_key(
    pg_dsn: str, app_name: str, admin: Any, bare: bool
) -> None:
    job = new_job()
    async with replica(pg_dsn, app_name, bare_keys=bare) as locker:
        lease = await locker.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        keys = await admin.fetch(
            "SELECT (l.classid::int8 << 32) | l.objid::int8 AS key FROM pg_locks l"
            " JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND a.application_name = $1",
            app_name,
        )
        assert [r["key"] for r in keys] == [job_lock_key(job) if bare else key_of(job)]
        assert locker.lock_key(job) == keys[0]["key"]
        await lease.release()
        # With bare keys, the seed's locked_run (same key) and the locker exclude each other.
        lease = await locker.acquire(job, SLOT + timedelta(minutes=1))
        assert isinstance(lease, PostgresHold)
        async with locked_run(pg_dsn, job) as standalone:
            assert bool(standalone) is not bare
        await lease.release()


async def test_rejects_connect_kwargs_with_a_pool(pool: asyncpg.Pool) -> None:
    with pytest.raises(TypeError):
        PostgresLocker(pool, connect_kwargs={"ssl": False})
