"""Connecting to a highly available PostgreSQL: several hosts, a standby, a promotion.

Each test that needs a standby makes a throwaway primary and a streaming standby of it
(``ha_pair``, cluster.py: ``pg_basebackup -R``), never touching the shared server, and
stops both at the end. They check that

- a DSN that lists a host that does not answer (a dead primary dropping packets) before
  the live one connects to the live one within connect_timeout, and tries the live one
  first from then on (asyncpg alone spends the whole timeout on the silent host);
- a locker pointed at a read-only server (a standby, or a primary made read-only) says so
  once, naming ``target_session_attrs=read-write``, without a traceback, over many slots;
- replica processes given ``primary,standby?target_session_attrs=read-write`` run their
  slots on the standby once it is promoted after the primary crashed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from cronlock import (
    JobStarted,
    LockError,
    LockFailed,
    Refusal,
    Scheduler,
    SystemClock,
    every,
)
from cronlock.postgres import PostgresElector, PostgresHold, PostgresLocker
from cronlock.postgres._conn.backoff import RECONNECT_MAX
from cronlock.postgres._conn.hosts import HostOrder
from cronlock.postgres._modes.base import Mode

from ..eventually import eventually
from .cluster import Cluster
from .conftest import free_port, primary_and_standby
from .events import Events
from .proxy import TcpProxy
from .replica import command as replica_command

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

FIX = "target_session_attrs=read-write"


def hosts(dsn: str, *ports: int, query: str | None = None) -> str:
    """*dsn* with its host replaced by 127.0.0.1 at each of *ports*, in order (and its
    query by *query*, when given)."""
    parts = urlsplit(dsn)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    netloc = user + ",".join(f"127.0.0.1:{port}" for port in ports)
    return urlunsplit(parts._replace(netloc=netloc, query=parts.query if query is None else query))


def logged_tracebacks(text: str) -> int:
    """How many log records of *text* (a process's stderr) carry a traceback: a chained
    exception's tracebacks count once."""
    chained = text.count("The above exception was the direct cause") + text.count(
        "During handling of the above exception"
    )
    return text.count("Traceback (most recent call last)") - chained


def cronlock_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("cronlock") and r.levelno >= level]


def test_the_order_hosts_are_tried_in() -> None:
    """The host that worked first; then no news, a no, silence, and not the primary."""
    primary, standby, third = ("db1", 5432), ("db2", 5432), ("db3", 5432)
    order = HostOrder()
    assert order.order([primary, standby, third]) == [primary, standby, third]  # the DSN's
    order.worked(standby)
    assert order.order([primary, standby, third]) == [standby, primary, third]
    order.failed(standby, silent=True)
    assert order.order([primary, standby, third]) == [primary, third, standby]
    assert order.budget(standby, 8.0, 5.0) == 5.0  # silent: no more than its even share
    assert order.budget(primary, 8.0, 5.0) == 8.0
    order.failed(primary, silent=False)
    assert order.order([primary, standby, third]) == [third, primary, standby]
    # A connection the set-up found on a standby: after even the silent host, or the
    # loop would stop on it every time.
    order.worked(third)
    order.not_primary(third)
    assert order.order([primary, standby, third]) == [primary, standby, third]


@pytest.fixture(scope="module")
def standing_pair() -> Iterator[tuple[Cluster, Cluster]]:
    """A throwaway primary and a streaming standby of it for the tests that leave both as
    they found them (none stops, crashes or promotes either): made once per module."""
    yield from primary_and_standby()


# -- a silent host first ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_silent_host_first_in_the_dsn_does_not_keep_the_live_one_out(
    mode: Mode, pg_dsn: str, app_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first host accepts TCP and then says nothing (a frozen proxy: what a dead host
    that drops packets looks like to a client); the second is the live server."""
    live = urlsplit(pg_dsn).port or 5432
    proxy = TcpProxy("127.0.0.1", live)
    await proxy.start()
    proxy.set_mode("freeze")
    dsn = hosts(pg_dsn, proxy.port, live)
    timeout = 4.0
    try:
        began = time.monotonic()
        with pytest.raises(TimeoutError):  # asyncpg alone: the silent host eats it all
            await asyncpg.connect(dsn, timeout=timeout)
        asyncpg_alone = time.monotonic() - began
        before = proxy.accepted
        locker = PostgresLocker(
            dsn, mode=mode, connect_timeout=timeout, application_name=app_name, sessions=1
        )
        async with locker:
            slot = datetime.now(UTC).replace(microsecond=0)
            began = time.monotonic()
            hold = await locker.acquire(f"silent-{uuid.uuid4().hex[:8]}", slot)
            first = time.monotonic() - began
            assert hold is not None and not isinstance(hold, str)  # granted
            await hold.release()
            tried = proxy.accepted - before
            # The session dies; the next one goes to the host that worked, first.
            admin = await asyncpg.connect(pg_dsn)
            try:
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = $1",
                    app_name,
                )
            finally:
                await admin.close()

            async def claimed() -> PostgresHold | Refusal | None:
                try:  # the batcher retries a claim once on a new session
                    return await locker.acquire(f"silent-{uuid.uuid4().hex[:8]}", slot)
                except Exception:  # the death of the session noticed by this acquire
                    return None

            began = time.monotonic()
            hold = await eventually(claimed, "a claim on a new session")
            again = time.monotonic() - began
            assert hold is not None and not isinstance(hold, str)
            await hold.release()
            assert proxy.accepted - before == tried  # the silent host was not tried again
    finally:
        await proxy.close()
    with capsys.disabled():
        print(
            f"\n[measured] {mode}: silent host first, connect_timeout={timeout:g}s: asyncpg "
            f"alone gave up after {asyncpg_alone:.2f}s; the locker's first claim took "
            f"{first:.2f}s (the silent host tried {tried}x), after a reconnect {again:.2f}s"
        )
    assert tried == 1


async def test_no_host_answering_says_what_each_did_without_the_password() -> None:
    """Every host refused: the error names each host and what it said, never the password."""
    refused = [free_port(), free_port()]
    dsn = f"postgresql://app:s3cr%2Ft@127.0.0.1:{refused[0]},127.0.0.1:{refused[1]}/db"
    locker = PostgresLocker(dsn, connect_timeout=2, sessions=1)
    async with locker:
        with pytest.raises(LockError) as caught:
            await locker.acquire("nobody", datetime(2030, 1, 1, tzinfo=UTC))
    message = str(caught.value)
    assert all(f"127.0.0.1:{port}: ConnectionRefusedError" in message for port in refused)
    assert "s3cr" not in message


async def test_a_standby_found_without_target_session_attrs_is_not_tried_first_again(
    standing_pair: tuple[Cluster, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    """``primary,standby`` without target_session_attrs, the primary silent at first: the
    standby is connected to and refused as not the primary; once the primary answers
    again it is reached, though it was silent last time it was tried."""
    primary, standby = standing_pair
    caplog.set_level(logging.DEBUG, logger="cronlock")
    proxy = TcpProxy("127.0.0.1", primary.port)
    await proxy.start()
    proxy.set_mode("freeze")
    locker = PostgresLocker(
        hosts(primary.dsn, proxy.port, standby.port), connect_timeout=2, sessions=1
    )
    job, slot = f"unstuck-{uuid.uuid4().hex[:8]}", datetime(2030, 1, 1, tzinfo=UTC)
    try:
        async with locker:
            with pytest.raises(LockError, match="target_session_attrs=read-write"):
                await locker.acquire(job, slot)
            proxy.set_mode("pass")

            async def claimed() -> PostgresHold | Refusal | None:
                try:
                    return await locker.acquire(job, slot)
                except LockError:
                    return None

            hold: PostgresHold | Refusal = await eventually(
                claimed, "a claim once the primary answers", every=0.2
            )
            assert hold is not None and not isinstance(hold, str)
            await hold.release()
    finally:
        await proxy.close()
    errors = cronlock_records(caplog, logging.ERROR)
    assert len(errors) == 1, [r.getMessage() for r in errors]


# -- a read-only server ----------------------------------------------------------------------


async def run_slots(locker: PostgresLocker, slots: int, name: str) -> Events:
    """A scheduler with *locker* and one job every second, for *slots* slots."""
    events = Events()
    scheduler = Scheduler(clock=SystemClock(), locker=locker, stop_timeout=0)
    scheduler.subscribe(events)
    start = datetime.fromtimestamp(math.ceil(time.time() + 1), UTC)

    async def work() -> None:
        pass

    scheduler.add_job(
        work,
        every(1, anchor=start),
        name=name,
        start_at=start,
        stop_at=start + timedelta(seconds=slots - 1),
    )
    async with locker, scheduler:
        await SystemClock().sleep_until(start + timedelta(seconds=slots - 0.5))
    return events


@pytest.mark.parametrize("mode", ["session", "lease", "lease-pool"])
async def test_a_standby_is_not_the_primary_said_once(
    mode: str, standing_pair: tuple[Cluster, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    """A DSN without target_session_attrs that names a standby: no run, one ERROR that
    names the fix, no traceback, however many slots fall due."""
    _, standby = standing_pair
    caplog.set_level(logging.DEBUG, logger="cronlock")
    pool = None
    if mode == "lease-pool":
        pool = await asyncpg.create_pool(standby.dsn, min_size=0, max_size=3)
    try:
        locker = PostgresLocker(
            pool or standby.dsn, mode="session" if mode == "session" else "lease"
        )
        events = await run_slots(locker, 5, f"standby-{mode}")
    finally:
        if pool is not None:
            await pool.close()
    # The scheduler's catch-up read at start logs its own failure, once (the core's).
    errors = [
        r
        for r in cronlock_records(caplog, logging.ERROR)
        if not r.getMessage().startswith("reading the run ledger for catch-up")
    ]
    assert events.count(JobStarted) == 0
    assert events.count(LockFailed) >= 4
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert FIX in errors[0].getMessage()
    assert "standby" in errors[0].getMessage()
    assert [r for r in caplog.records if r.exc_info] == []


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_an_elector_on_a_standby_never_leads_and_says_why(
    mode: Mode, standing_pair: tuple[Cluster, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    """An elector pointed at a standby: never the leader; one WARNING naming the fix."""
    _, standby = standing_pair
    caplog.set_level(logging.DEBUG, logger="cronlock")
    elector = PostgresElector(standby.dsn, name=f"standby-{mode}", mode=mode, poll_interval=0.2)
    async with elector:
        for _ in range(10):
            assert not await elector.is_leader()
            await asyncio.sleep(0.2)
    said = cronlock_records(caplog, logging.WARNING)
    assert len(said) == 1, [r.getMessage() for r in said]
    assert FIX in said[0].getMessage()
    assert [r for r in caplog.records if r.exc_info] == []


async def test_a_primary_made_read_only_is_left_and_said_once(
    standing_pair: tuple[Cluster, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    """Claims run, then the server is made read-only under the open sessions (as a provider
    does on a full disk): the next claim is refused (SQLSTATE 25006); the session is left,
    said once with the fix, and claims run again once the server takes writes."""
    primary, _ = standing_pair
    caplog.set_level(logging.DEBUG, logger="cronlock")
    admin = await asyncpg.connect(primary.dsn)
    locker = PostgresLocker(primary.dsn, sessions=1)

    async def set_read_only(on: bool) -> None:
        await admin.execute(
            "ALTER SYSTEM SET default_transaction_read_only = " + ("on" if on else "off")
        )
        await admin.execute("SELECT pg_reload_conf()")

    async def reloaded(on: bool) -> bool:
        # A new session forks from the postmaster after it read the file; it signals the
        # open sessions as it reads it, so each reads it too before its next statement.
        fresh = await asyncpg.connect(primary.dsn)
        try:
            shown = await fresh.fetchval("SHOW default_transaction_read_only")
        finally:
            await fresh.close()
        return bool(shown == ("on" if on else "off"))

    async def claimed_again() -> PostgresHold | Refusal | None:
        try:
            return await locker.acquire(job, base + timedelta(seconds=10))
        except Exception:
            return None  # refused still, or a session dropped: the locker reconnects

    job = f"read-only-{uuid.uuid4().hex[:8]}"
    base = datetime(2030, 1, 1, tzinfo=UTC)
    try:
        async with locker:
            hold = await locker.acquire(job, base)
            assert hold is not None and not isinstance(hold, str)
            await hold.release()
            await admin.execute("SET default_transaction_read_only = off")
            await set_read_only(True)
            await eventually(lambda: reloaded(True), "the server read-only for new sessions")
            refused: list[BaseException] = []
            for k in range(1, 6):
                try:
                    await locker.acquire(job, base + timedelta(seconds=k))
                except Exception as exc:
                    refused.append(exc)
            await set_read_only(False)
            again: PostgresHold | Refusal = await eventually(
                claimed_again, "a claim once the server takes writes"
            )
            assert not isinstance(again, str), again
            await again.release()
    finally:
        # The module's pair is left as it was found, whatever happened above.
        await admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
        await admin.execute("SELECT pg_reload_conf()")
        await admin.close()
    assert len(refused) == 5
    assert all(type(exc).__name__ == "LockUnavailable" for exc in refused), refused
    errors = cronlock_records(caplog, logging.ERROR)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert FIX in errors[0].getMessage()
    assert [r for r in caplog.records if r.exc_info] == []


# -- the primary crashes, the standby is promoted -----------------------------------------


@pytest.mark.parametrize(
    ("mode", "fault"),
    [("session", "crash"), ("lease", "crash"), ("session", "silent"), ("lease", "silent")],
)
async def test_claims_resume_on_the_promoted_standby(
    mode: str,
    fault: str,
    ha_pair: tuple[Cluster, Cluster],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two replica processes given ``primary,standby?target_session_attrs=read-write``;
    the primary crashes (*crash*: its port refuses) or drops off the network (*silent*: a
    frozen proxy in front of it, its sessions and new connects unanswered), and the standby
    is promoted 2 s later: the slots due once the replicas had time to notice and
    reconnect run once each, on the new primary."""
    primary, standby = ha_pair
    proxy = TcpProxy("127.0.0.1", primary.port)
    await proxy.start()
    first_host = proxy.port if fault == "silent" else primary.port
    dsn = hosts(primary.dsn, first_host, standby.port, query="target_session_attrs=read-write")
    # Silent: a statement in flight waits out statement_timeout (5 s), then a connect gives
    # the silent host its share of connect_timeout (5 s of 10) once, before the backoff.
    settle = RECONNECT_MAX + 1 + (3 if mode == "lease" else 0) + (10 if fault == "silent" else 0)
    # Three slots run on the old primary, the fault, 2 s, the promotion: at about the 5th
    # slot. Then *settle*, then at least six slots, and a few to spare on a busy machine.
    interval = 1.0
    slots = math.ceil(5 + settle) + 6 + 3
    job = f"failover-{mode}-{uuid.uuid4().hex[:8]}"
    procs: list[tuple[subprocess.Popen[str], Path, Path]] = []
    extra = ["--mode", mode, "--lease", "3"] if mode == "lease" else []
    for rid in (1, 2):
        out, err = tmp_path / f"replica-{rid}.jsonl", tmp_path / f"replica-{rid}.err"
        with out.open("w") as sink, err.open("w") as errors:
            proc = subprocess.Popen(
                replica_command(dsn, job, rid, None, slots, *extra),
                stdin=subprocess.PIPE,
                stdout=sink,
                stderr=errors,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        procs.append((proc, out, err))

    def lines() -> list[dict[str, Any]]:
        found = []
        for _, out, _ in procs:
            for line in out.read_text().splitlines():
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found

    def count(event: str) -> int:
        return sum(r["event"] == event for r in lines())

    try:
        # The first slot once both have imported what they run (a start read from stdin).
        await eventually(lambda: count("booted") == 2, "both replicas booted", 120)
        start = float(math.ceil(time.time() + 2))
        for proc, _, _ in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start}\n")
            proc.stdin.close()
        await eventually(lambda: count("end") >= 3, "three runs on the old primary", 120)
        crashed = time.time()
        if fault == "silent":
            proxy.set_mode("freeze")  # the primary lives on, out of reach
        else:
            await asyncio.to_thread(primary.crash)
        await asyncio.sleep(2)
        await asyncio.to_thread(standby.promote)
        promoted = time.time()
        for proc, out, _ in procs:
            await asyncio.to_thread(proc.wait, 300)
            assert proc.returncode == 0, out.read_text()[-2000:]
    finally:
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        await proxy.close()
    records = lines()
    runs: dict[float, int] = {}
    for r in records:
        if r["event"] == "start":
            runs[r["slot"]] = runs.get(r["slot"], 0) + 1
    # Once the backoff wait in progress at the promotion is over (at most RECONNECT_MAX,
    # and a lease of the crash's runs expired), every slot runs.
    after = [
        start + k * interval for k in range(slots) if start + k * interval >= promoted + settle
    ]
    conn = await asyncpg.connect(standby.dsn)
    try:
        rows = await conn.fetch("SELECT slot FROM cronlock_runs WHERE job = $1", job)
    finally:
        await conn.close()
    ledger = {row["slot"].timestamp() for row in rows}
    first = min((r["t"] for r in records if r["event"] == "start" and r["t"] >= promoted),
                default=math.nan)  # fmt: skip
    tracebacks = sum(logged_tracebacks(err.read_text()) for _, _, err in procs)
    once = sum(runs.get(s) == 1 for s in after)
    with capsys.disabled():
        print(
            f"\n[measured] {mode}, {fault}: primary lost, standby promoted "
            f"{promoted - crashed:.1f}s later; first run {first - promoted:.2f}s after the "
            f"promotion; slots after it: {len(after)}, ran once {once}; tracebacks in the "
            f"replicas' logs: {tracebacks}"
        )
    assert all(n == 1 for n in runs.values()), runs  # never a slot twice
    assert len(after) >= 6
    assert [s for s in after if runs.get(s) != 1] == []
    assert set(after) <= ledger  # claimed on the new primary
    # Cut off silently, a claim in flight times out, and the scheduler logs that failure
    # with its traceback (the core's; issue 35, item 6): one per replica at most, never
    # one per slot. A refused connection costs none.
    most = len(procs) if fault == "silent" else 0
    assert tracebacks <= most, [err.read_text()[-4000:] for _, _, err in procs]
