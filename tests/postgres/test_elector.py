"""PostgresElector against a real server, with real processes and real network faults.

The safety property under test: at no instant do two replicas both see ``is_leader()``
return ``True``. Processes sample it every 10 ms and report each transition with
``time.time()``, widened so that a reported interval always contains the real one; the
tests then assert that no two replicas' intervals overlap, and print the failover times.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from cronlock import (
    ConfigError,
    JobSkipped,
    JobStarted,
    LockError,
    LockLost,
    RunContext,
    Scheduler,
    SystemClock,
    every,
)
from cronlock._keys import job_lock_key
from cronlock.postgres import Keepalives, PostgresElector

from ..eventually import eventually
from .events import Events
from .proxy import TcpProxy, via

pytestmark = pytest.mark.postgres

REPLICA = Path(__file__).with_name("elector_replica.py")
LIVENESS = 30.0  # seconds: a guard against hanging, never a timing assertion
Record = dict[str, Any]
Interval = tuple[float, float]


def election() -> str:
    return f"election-{uuid.uuid4().hex[:12]}"


async def until(predicate: Callable[[], bool], what: str = "") -> None:
    await eventually(predicate, what, every=0.01)


async def wait_leader(elector: PostgresElector) -> float:
    """Wait until *elector* leads; return how long that took (seconds)."""
    began = time.monotonic()
    await eventually(elector.is_leader, f"{elector.application_name} leads", every=0.01)
    return time.monotonic() - began


async def holders(admin: Any, name: str) -> list[str]:
    """application_name of every session that holds the election's lock."""
    rows = await admin.fetch(
        """
        SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND ((l.classid::int8 << 32) | l.objid::int8) = $1
        """,
        job_lock_key(name),
    )
    return [row["application_name"] for row in rows]


async def released(admin: Any, name: str) -> None:
    """Wait until no session holds the lock (a dropped backend exits a moment later)."""

    async def free() -> bool:
        return not await holders(admin, name)

    await eventually(free, f"no session holds {name}", every=0.01)


# -- one process -----------------------------------------------------------------------------


async def test_one_leader_and_a_follower_then_handover(pg_dsn: str, admin: Any) -> None:
    name = election()
    a = PostgresElector(pg_dsn, name=name, application_name="elector-test-a")
    b = PostgresElector(pg_dsn, name=name, application_name="elector-test-b")
    async with a:
        took = await wait_leader(a)
        print(f"\nfirst leader after {took:.2f}s (takeover_delay 0.75s)")
        assert took >= 0.75  # never before the takeover delay has passed
        assert await holders(admin, name) == ["elector-test-a"]
        async with b:
            await until(lambda: b.statistics().polls >= 2)  # b tried, and was refused
            assert not await b.is_leader()
            assert await a.is_leader()
            await a.close()
            assert not a.is_leader_now
            took = await wait_leader(b)
            print(f"handover after a clean close: {took:.2f}s (poll_interval 1s)")
            assert await holders(admin, name) == ["elector-test-b"]
            assert (a.terms, b.terms) == (1, 1)
            assert a.statistics().demotions == 1
    await released(admin, name)  # closing frees the lock


async def test_pool_connection_is_dedicated_and_given_back(pg_dsn: str, admin: Any) -> None:
    name = election()
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    try:
        async with PostgresElector(pool, name=name, application_name="elector-pool") as e:
            await wait_leader(e)
            assert await holders(admin, name) == ["elector-pool"]
        await released(admin, name)
        # The borrowed connection was terminated and handed back: the pool is whole.
        async with asyncio.timeout(LIVENESS):
            conns = [await pool.acquire(), await pool.acquire()]
        for conn in conns:
            assert await conn.fetchval("SELECT current_setting('idle_session_timeout')") == "0"
            await pool.release(conn)
    finally:
        await pool.close()


async def test_session_settings_keep_the_server_release_after_the_lease(
    pg_dsn: str, admin: Any
) -> None:
    name = election()
    leader = PostgresElector(pg_dsn, name=name)
    follower = PostgresElector(pg_dsn, name=name)
    async with leader:
        await wait_leader(leader)
        await follower.start()
        await until(lambda: follower.statistics().polls >= 1)
        mine = await leader.session_settings()
        print(f"\nleader session settings (seconds): {mine}")
        assert mine == {
            "idle_session_timeout": 2.0,
            "tcp_keepalives_idle": 2.0,
            "tcp_keepalives_interval": 1.0,
            "tcp_keepalives_count": 2.0,
            "tcp_user_timeout": 3.0,
        }
        # The earliest the server can drop a silent client, from its last packet, against
        # the client lease (0.75s): the ordering the fencing rests on.
        floor = min(
            mine["idle_session_timeout"], mine["tcp_keepalives_idle"], mine["tcp_user_timeout"]
        )
        assert floor >= 2 * 0.75
        # A follower, idle between polls, is not subject to the idle-session timeout.
        theirs = await follower.session_settings()
        assert theirs["idle_session_timeout"] == 0
        assert theirs["tcp_user_timeout"] == 3.0
        # The heartbeat's reading of pg_locks: bigint key -> classid/objid/objsubid.
        key = job_lock_key(name)
        row = await admin.fetchrow(
            "SELECT classid::int8, objid::int8, objsubid FROM pg_locks l"
            " JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND a.application_name = $1",
            leader.application_name,
        )
        assert (row["classid"], row["objid"], row["objsubid"]) == (
            (key >> 32) & 0xFFFFFFFF,
            key & 0xFFFFFFFF,
            1,
        )
        await follower.close()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"idle_session_timeout": 1.0}, "idle_session_timeout"),
        ({"lease": 1.5, "idle_session_timeout": 10}, "keepalives.idle"),
        ({"keepalives": Keepalives(5, 1, 2, user_timeout=1.0)}, "keepalives.user_timeout"),
        ({"keepalives": Keepalives(5, 1, 2, user_timeout=None)}, "keepalives.user_timeout"),
        ({"heartbeat_interval": 0.75}, "heartbeat_interval"),
        ({"takeover_delay": 0.5}, "takeover_delay"),
        ({"poll_interval": -1}, "poll_interval"),
    ],
)
def test_settings_that_break_the_fencing_are_refused(options: Any, field: str) -> None:
    with pytest.raises(ConfigError, match=field) as caught:
        PostgresElector("postgresql://nowhere/db", **options)
    assert isinstance(caught.value, ValueError)


async def test_a_frozen_event_loop_stops_leading_at_once(pg_dsn: str) -> None:
    name = election()
    demoted: list[BaseException | None] = []
    async with PostgresElector(pg_dsn, name=name) as elector:
        elector.on_demoted(demoted.append)
        await wait_leader(elector)
        time.sleep(0.75 * 3)  # blocks the event loop: no heartbeat, no timer runs
        assert not await elector.is_leader()  # the very first question after waking
        await until(lambda: len(demoted) == 1)
        assert isinstance(demoted[0], LockError)
        print(f"\ndemoted because: {demoted[0]}")
        await wait_leader(elector)  # alone, it is elected again
        assert elector.terms == 2


async def test_terminated_session_demotes_and_the_replica_is_reelected(
    pg_dsn: str, admin: Any
) -> None:
    name = election()
    demoted: list[BaseException | None] = []
    app = f"elector-term-{uuid.uuid4().hex[:8]}"
    async with PostgresElector(pg_dsn, name=name, application_name=app) as elector:
        elector.on_demoted(demoted.append)
        await wait_leader(elector)
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1",
            app,
        )
        assert killed == 1
        await until(lambda: len(demoted) == 1)
        assert not await elector.is_leader()
        await wait_leader(elector)
        assert elector.terms == 2
        assert elector.statistics().sessions_opened == 2
    assert len(demoted) == 2  # closing while leading is a demotion too


async def test_close_survives_repeated_cancellation(pg_dsn: str, admin: Any) -> None:
    name = election()
    elector = PostgresElector(pg_dsn, name=name, application_name="elector-cancel")
    await wait_leader(elector)  # started lazily by is_leader()
    closing = asyncio.create_task(elector.close())
    await asyncio.sleep(0)
    closing.cancel()
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    # The cancels were delivered only after the session was gone: nothing stays held.
    assert not elector.is_leader_now
    await released(admin, name)
    assert not await elector.is_leader()  # closed: stays a follower, does not restart
    with pytest.raises(LockError, match="closed"):
        await elector.start()


async def test_scheduler_ends_the_run_and_skips_until_reelected(pg_dsn: str, admin: Any) -> None:
    app = f"elector-sched-{uuid.uuid4().hex[:8]}"
    elector = PostgresElector(pg_dsn, name=election(), application_name=app, poll_interval=0.5)
    scheduler = Scheduler(clock=SystemClock(), elector=elector, stop_timeout=0)
    events = Events()
    scheduler.subscribe(events)

    async def long_job(ctx: RunContext) -> None:
        if ctx.run_number == 1:
            await asyncio.Event().wait()  # runs until leadership is lost

    scheduler.add_job(long_job, every(0.2), name="coordinated")
    async with elector, scheduler:
        await until(lambda: len(events.of(JobStarted)) == 1)
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1",
            app,
        )
        assert killed == 1
        await until(lambda: len(events.of(LockLost)) == 1)
        lost = events.of(LockLost)[0]
        assert isinstance(lost.exception, LockError)
        await until(lambda: len(events.of(JobStarted)) >= 2)  # re-elected, runs again
    after_loss: list[Any] = [
        e
        for e in events.items[events.items.index(lost) :]
        if isinstance(e, JobSkipped | JobStarted)
    ]
    # Between the loss and the re-election, every slot was skipped as "not_leader".
    first_run = next(i for i, e in enumerate(after_loss) if isinstance(e, JobStarted))
    skipped = after_loss[:first_run]
    assert skipped
    assert {e.reason for e in skipped} == {"not_leader"}
    print(f"\n{len(skipped)} slot(s) skipped as not_leader before re-election")


# -- several processes -----------------------------------------------------------------------


class ElectorProcess:
    """An elector_replica.py process; a thread collects its JSON lines."""

    def __init__(self, dsn: str, name: str, rid: int, extra: Sequence[str] = ()) -> None:
        self.id = rid
        self.proc = subprocess.Popen(
            [sys.executable, str(REPLICA), "--dsn", dsn, "--name", name, "--id", str(rid), *extra],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.records: list[Record] = []
        self.ended_at: float | None = None  # when it was killed: its interval ends by then
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:  # closed at the end of output: the process is gone
            for line in self.proc.stdout:
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    continue

    def find(self, event: str, after: float = 0.0) -> Record | None:
        for record in tuple(self.records):
            if record["event"] == event and record["t"] >= after:
                return record
        return None

    async def wait(self, event: str, after: float = 0.0) -> Record:
        def found() -> Record | None:
            record = self.find(event, after)
            if record is None and self.proc.poll() is not None:
                raise AssertionError(f"replica {self.id} exited: {self.records}")
            return record

        return await eventually(found, f"replica {self.id}: {event}", every=0.01)

    async def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait, 30)
            self.ended_at = time.time()

    async def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, LIVENESS)
            except subprocess.TimeoutExpired:
                await self.kill()
        await asyncio.to_thread(self._reader.join, 10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()  # read to the end: an open pipe is a ResourceWarning
        if self.ended_at is None:
            self.ended_at = time.time()

    def intervals(self) -> list[Interval]:
        """Leadership intervals as this process saw them; an open one ends at its death."""
        out: list[Interval] = []
        start: float | None = None
        for record in self.records:
            if record["event"] == "leader":
                start = record["t"]
            elif record["event"] == "follower" and start is not None:
                out.append((start, record["t"]))
                start = None
        if start is not None:
            assert self.ended_at is not None
            out.append((start, self.ended_at))
        return out


def overlap(replicas: list[ElectorProcess]) -> float:
    """Total time during which two different replicas both counted themselves leader."""
    total = 0.0
    for x, y in itertools.combinations(replicas, 2):
        for (s1, e1), (s2, e2) in itertools.product(x.intervals(), y.intervals()):
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total


def handover_gap(replicas: list[ElectorProcess]) -> float:
    """The shortest time between one replica's leadership ending and another's starting."""
    ends = [(e, r.id) for r in replicas for _, e in r.intervals()]
    starts = [(s, r.id) for r in replicas for s, _ in r.intervals()]
    gaps = [s - e for (e, i), (s, j) in itertools.product(ends, starts) if i != j and s >= e]
    return min(gaps, default=float("nan"))


async def failover_run(
    leader_dsn: str,
    follower_dsn: str,
    fault: Callable[[ElectorProcess], Any],
    label: str,
    extra: Sequence[str] = (),
) -> None:
    """Elect a leader, let a follower settle, inject *fault*, check the takeover."""
    name = election()
    leader = ElectorProcess(leader_dsn, name, 1, extra)
    follower: ElectorProcess | None = None
    try:
        await leader.wait("leader")
        follower = ElectorProcess(follower_dsn, name, 2, extra)
        await follower.wait("ready")
        await asyncio.sleep(1.5)  # a poll or two refused
        assert follower.find("leader") is None
        faulted_at = time.time()
        await fault(leader)
        took_over = await follower.wait("leader", after=0.0)
        if leader.proc.poll() is None:
            demoted = await leader.wait("follower", after=faulted_at)
            lag = demoted["t"] - faulted_at
            gap = took_over["t"] - demoted["t"]
            print(f"\n{label}: old leader stopped {lag:.2f}s after the fault;", end=" ")
            print(f"new leader {gap:.2f}s after that", end="; ")
            reason = leader.find("demoted", after=faulted_at)
            print(f"reason: {reason and reason['reason']}", end="; ")
        failover = took_over["seen"] - faulted_at
        print(f"{label}: failover {failover:.2f}s (fault -> follower's is_leader() True)")
        await asyncio.sleep(1.0)
    finally:
        await leader.stop()
        if follower is not None:
            await follower.stop()
    replicas = [leader] + ([follower] if follower else [])
    measured = overlap(replicas)
    print(f"{label}: leader intervals {[r.intervals() for r in replicas]}")
    handover = handover_gap(replicas)
    print(f"{label}: overlap between replicas {measured:.3f}s; handover gap {handover:.2f}s")
    assert measured == 0.0
    assert follower is not None and follower.intervals(), "the follower never took over"


@pytest.mark.slow
async def test_sigkill_of_the_leader_process_fails_over(pg_dsn: str) -> None:
    async def sigkill(leader: ElectorProcess) -> None:
        await leader.kill()

    await failover_run(pg_dsn, pg_dsn, sigkill, "SIGKILL")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["freeze", "cut"])
async def test_network_fault_between_leader_and_server_never_makes_two_leaders(
    pg_dsn: str, fault: str
) -> None:
    target = urlsplit(pg_dsn)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    port = await proxy.start()

    async def inject(leader: ElectorProcess) -> None:
        if fault == "freeze":
            proxy.set_mode("freeze")  # bytes held both ways, no RST: a silent network
        else:
            proxy.cut()  # both sides aborted: the server sees a reset

    try:
        await failover_run(via(pg_dsn, port), pg_dsn, inject, f"network {fault}")
    finally:
        proxy.set_mode("pass")
        await proxy.close()


# -- lease mode: the leadership as a row in the server's time ----------------------------


async def test_lease_mode_through_pgbouncer_one_leader_then_a_prompt_handover(
    pgbouncer_dsn: str, pg_server: str, server_schema: str
) -> None:
    name = election()
    options: dict[str, Any] = {"name": name, "mode": "lease", "schema": server_schema}
    a = PostgresElector(pgbouncer_dsn, application_name="lease-elector-a", **options)
    b = PostgresElector(pgbouncer_dsn, application_name="lease-elector-b", **options)
    async with a, b:
        await until(lambda: a.is_leader_now or b.is_leader_now)
        for _ in range(100):  # never both, while both poll and the leader renews
            assert not (a.is_leader_now and b.is_leader_now)
            await asyncio.sleep(0.02)
        leader, follower = (a, b) if a.is_leader_now else (b, a)
        conn = await asyncpg.connect(pg_server)
        try:
            row = await conn.fetchrow(
                f'SELECT holder FROM "{server_schema}".cronlock_leaders WHERE name = $1', name
            )
        finally:
            await conn.close()
        assert row is not None and row["holder"].startswith(leader.application_name)
        await leader.close()  # gives the row up: the follower need not wait for its expiry
        took = await wait_leader(follower)
        print(f"\nlease mode handover after a clean close: {took:.2f}s (poll_interval 1s)")
        assert follower.statistics().terms == 1


@pytest.mark.slow
async def test_lease_mode_sigkill_of_the_leader_through_pgbouncer_fails_over(
    pgbouncer_dsn: str, server_schema: str
) -> None:
    async def sigkill(leader: ElectorProcess) -> None:
        await leader.kill()

    lease = ("--mode", "lease", "--schema", server_schema)
    await failover_run(pgbouncer_dsn, pgbouncer_dsn, sigkill, "lease SIGKILL", lease)


@pytest.mark.slow
async def test_lease_mode_frozen_network_never_makes_two_leaders(
    pg_server: str, server_schema: str
) -> None:
    target = urlsplit(pg_server)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    port = await proxy.start()

    async def freeze(leader: ElectorProcess) -> None:
        proxy.set_mode("freeze")

    lease = ("--mode", "lease", "--schema", server_schema)
    try:
        await failover_run(via(pg_server, port), pg_server, freeze, "lease freeze", lease)
    finally:
        proxy.set_mode("pass")
        await proxy.close()
