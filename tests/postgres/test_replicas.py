"""Real replica processes coordinating through a real PostgreSQL server: no mocks."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import pytest

from cronlock import (
    JobStarted,
    JobSucceeded,
    LockFailed,
    RunContext,
    Scheduler,
    SystemClock,
    every,
)
from cronlock.postgres import PostgresLocker

from ..eventually import eventually_blocking
from .events import Events
from .proxy import TcpProxy, via
from .replica import command as replica_command
from .test_exactly_once import analyse

pytestmark = pytest.mark.postgres

Record = dict[str, Any]


class Replica:
    """A replica process whose JSON lines a thread reads into :attr:`seen`.

    *start* ``None``: it boots, prints "booted" and waits for :meth:`go` to give it its
    start (replica.py ``--start -``), so the first slot can be chosen once it has booted,
    however slowly a busy machine starts Python."""

    def __init__(
        self,
        dsn: str,
        job: str,
        rid: int,
        start: float | None,
        slots: int,
        *,
        interval: float = 1.0,
        hold: float = 0.2,
        extra: Sequence[str] = (),
    ) -> None:
        self.id = rid
        self.proc = subprocess.Popen(
            replica_command(
                dsn,
                job,
                rid,
                start,
                slots,
                "--interval",
                str(interval),
                "--hold",
                str(hold),
                *extra,
            ),
            stdin=subprocess.PIPE if start is None else None,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.seen: list[Record] = []  # appended by the reader thread only
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:  # closed at the end of output: the process is gone
            for line in self.proc.stdout:
                try:
                    self.seen.append(json.loads(line))
                except ValueError:
                    continue

    def of(self, event: str, reason: str | None = None) -> list[Record]:
        """The lines of *event* (and *reason*, if given) printed so far."""
        return [
            r for r in list(self.seen) if r["event"] == event and reason in (None, r.get("reason"))
        ]

    def go(self, start: float) -> None:
        """Give a replica started with ``start=None`` its start."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{start!r}\n")
        self.proc.stdin.close()

    def finish(self, timeout: float = 120) -> list[Record]:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return list(self.seen)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def close(self) -> None:
        """Kill the process if it still runs, and close its pipes once it is read."""
        self.kill()
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def booted_then_go(replicas: Sequence[Replica]) -> float:
    """Once every replica (started with ``start=None``) has booted, give each the first
    whole second 2 s away or more as its start, and return it."""
    eventually_blocking(
        lambda: all(r.of("booted") for r in replicas), "every replica to boot", 120, every=0.1
    )
    start = float(math.ceil(time.time()) + 2)  # what is left: connect, start a scheduler
    for replica in replicas:
        replica.go(start)
    return start


@pytest.mark.slow
def test_three_replicas_never_run_a_job_at_the_same_time(pg_dsn: str) -> None:
    job = f"replicas-{uuid.uuid4()}"
    slots = 12
    replicas = [
        Replica(pg_dsn, job, rid, None, slots, hold=0.3, extra=("--trace",)) for rid in (1, 2, 3)
    ]
    try:
        start = booted_then_go(replicas)
        records = [r for replica in replicas for r in replica.finish()]
    finally:
        for replica in replicas:
            replica.close()
    for replica in replicas:
        assert replica.proc.returncode == 0
    starts = {(r["replica"], r["slot"]): r["t"] for r in records if r["event"] == "start"}
    ends = {(r["replica"], r["slot"]): r["t"] for r in records if r["event"] == "end"}
    assert starts.keys() == ends.keys()
    runs = sorted((starts[k], ends[k], k) for k in starts)
    for (_, end, first), (begin, _, second) in itertools.pairwise(runs):
        # Each run happens inside the lock: no run begins before the previous one ended.
        assert begin >= end, f"{first} and {second} overlapped"
    expected = [start + k for k in range(slots)]
    assert {slot for _, slot in starts} <= set(expected)
    seen = analyse(records, expected)
    assert seen.duplicates == 0
    # A slot that did not run was refused while a run held the job's lock (its release may
    # come late on a busy machine: checked against the holders' windows); none was missed.
    assert seen.missed == 0, seen
    assert seen.ran_once + seen.busy == slots
    failures = [r for r in records if r["event"] == "lock_failed"]
    assert failures == []


@pytest.mark.slow
def test_a_killed_holder_frees_the_lock_for_another_replica(pg_dsn: str) -> None:
    job = f"kill-{uuid.uuid4()}"
    # hold < 0: a run keeps the lock until its process dies.
    a = Replica(pg_dsn, job, 1, None, 60, hold=-1)
    b = Replica(pg_dsn, job, 2, None, 60, hold=-1)
    try:
        booted_then_go([a, b])
        started = eventually_blocking(
            lambda: [r for r in (a, b) if r.of("start")], "a replica to start a run"
        )
        assert len(started) == 1, f"exactly one replica should hold the lock: {started}"
        holder, other = (a, b) if started[0] is a else (b, a)
        # The other replica contends and loses while the holder lives.
        eventually_blocking(lambda: other.of("skipped", "locked"), "the other told 'locked'")
        assert other.of("start") == []
        killed_at = time.time()
        holder.kill()
        took_over = eventually_blocking(
            lambda: other.of("start"), "the killed replica's lock to be freed"
        )[0]
        assert took_over["slot"] > holder.of("start")[0]["slot"]
        failover = took_over["t"] - killed_at
        print(f"\nfailover after SIGKILL: {failover:.2f}s (slot interval 1s)")
    finally:
        a.close()
        b.close()


async def test_database_down_is_reported_and_the_scheduler_recovers(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    target = urlsplit(pg_dsn)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    port = await proxy.start()
    proxy.set_mode("refuse")
    locker = PostgresLocker(via(pg_dsn, port), connect_timeout=2)
    scheduler = Scheduler(clock=SystemClock(), locker=locker)
    events = Events()
    scheduler.subscribe(events)

    async def work() -> None:
        pass

    scheduler.add_job(work, every(0.2), name=f"down-{uuid.uuid4()}")
    try:
        with caplog.at_level(logging.ERROR, logger="cronlock"):
            async with locker, scheduler:
                await events.until(LockFailed, 2)
                assert events.count(JobStarted) == 0
                proxy.set_mode("pass")
                await events.until(JobSucceeded, 2)
    finally:
        await proxy.close()
    assert any(r.levelno == logging.ERROR for r in caplog.records)


async def test_terminated_lock_session_is_reported_and_recovered(
    pg_dsn: str, admin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    app = f"cronlock-test-{uuid.uuid4().hex[:12]}"
    locker = PostgresLocker(pg_dsn, application_name=app)
    scheduler = Scheduler(clock=SystemClock(), locker=locker)
    events = Events()
    scheduler.subscribe(events)
    release = asyncio.Event()

    async def work(ctx: RunContext) -> None:
        if ctx.run_number == 2:
            await release.wait()  # the session is killed during this run

    scheduler.add_job(work, every(0.2), name=f"terminate-{uuid.uuid4()}")
    with caplog.at_level(logging.INFO, logger="cronlock"):
        async with locker, scheduler:
            await events.until(JobStarted, 2)
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = $1",
                app,
            )
            assert killed >= 1  # the run's session (and the one fleet time reads, if another)
            release.set()
            await events.until(JobSucceeded, 4)
    # The lost session was noticed and logged, and a new one replaced it.
    assert any(
        "lost" in r.getMessage() or "no longer held" in r.getMessage() for r in caplog.records
    )
    assert locker.statistics().sessions_opened >= 2
