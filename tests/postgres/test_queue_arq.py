"""Handing slots off to arq, end to end: real replicas on PostgreSQL, a real arq worker on
Redis (docs/guides/queues.md).

Three replica processes (handoff_replica.py) hand ``every(1)`` off with
:func:`cronlock.queues.arq_sender`; an arq worker process (arq_worker.py) executes the jobs.
Each slot is sent by one replica, once, and executed once, under the slot's idempotency key;
a resend of a slot is de-duplicated by arq. A broker that is down fails the run, which the
ledger shows as a failed attempt, and the retry sends the slot with the same key.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cronlock import (
    Event,
    JobFailed,
    JobSucceeded,
    RunContext,
    Scheduler,
    idempotency_key,
    once,
)
from cronlock.postgres import PostgresLocker
from cronlock.queues import arq_sender

from ..brokers import library, redis_url, unique
from ..eventually import eventually
from .processes import Processes
from .proxy import TcpProxy

pytestmark = pytest.mark.postgres

HERE = Path(__file__).parent
REPLICAS = 3
HANDING_OFF = 6.0  # seconds the replicas hand slots off (every(1)) before they stop


@pytest.fixture
async def redis() -> AsyncIterator[Any]:
    library("arq")
    from arq import create_pool
    from arq.connections import RedisSettings

    pool = await create_pool(RedisSettings.from_dsn(redis_url()))
    try:
        yield pool
    finally:
        await pool.aclose()


async def _clean(redis: Any, queue: str, keys: set[str]) -> None:
    """Delete what the test wrote: its queue's keys and its jobs' (arq keeps a job's
    result under arq:result:<id>); nothing else on the shared server is touched."""
    names = [queue, f"{queue}:executed", f"{queue}:health-check"]
    for key in keys:
        names += [f"arq:job:{key}", f"arq:result:{key}", f"arq:in-progress:{key}"]
        names.append(f"arq:retry:{key}")
    await redis.delete(*names)


async def _executed(redis: Any, queue: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in await redis.lrange(f"{queue}:executed", 0, -1)]


@pytest.mark.slow
async def test_replicas_hand_each_slot_off_once_and_the_worker_runs_it_once(
    pg_dsn: str, redis: Any
) -> None:
    url, queue, namespace = redis_url(), unique("arq"), unique("ns")
    worker = Processes(HERE / "arq_worker.py")
    replicas = Processes(HERE / "handoff_replica.py")
    keys: set[str] = set()
    try:
        await worker.spawn("--redis", url, "--queue", queue)
        for n in range(REPLICAS):
            await replicas.spawn(
                "--dsn", pg_dsn, "--kind", "arq", "--broker", url, "--queue", queue,
                "--namespace", namespace, "--id", f"r{n}",
            )  # fmt: skip
        await eventually(lambda: len(worker.lines) == 1, "the worker started", every=0.1)
        await eventually(
            lambda: sum(line["event"] == "running" for line in replicas.lines) == REPLICAS,
            "the replicas started",
            every=0.1,
        )
        await asyncio.sleep(HANDING_OFF)
        for proc in replicas.procs:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            codes = [await proc.wait() for proc in replicas.procs]
        assert codes == [0] * REPLICAS

        sent = [line for line in replicas.lines if line["event"] == "sent"]
        failed = [line for line in replicas.lines if line["event"] == "failed"]
        slots = [datetime.fromisoformat(line["slot"]) for line in sent]
        keys = {idempotency_key(namespace, "handoff", slot) for slot in slots}
        # Each slot handed off by one replica, once; and by more than one replica overall.
        assert len(slots) >= 3
        assert len(set(slots)) == len(slots), sorted(slots)
        assert failed == []
        handed = [line for line in replicas.lines if line["event"] == "log"]
        assert sum("handed off to arq" in line["message"] for line in handed) == len(slots)
        assert not [line for line in handed if "already queued" in line["message"]]

        # The worker executes each of them once, under the slot's key.
        async with asyncio.timeout(60):
            while len(executed := await _executed(redis, queue)) < len(slots):
                await asyncio.sleep(0.1)
        ran = [entry["key"] for entry in executed]
        assert sorted(ran) == sorted(keys)
        for entry in executed:
            slot = datetime.fromisoformat(entry["slot"])
            assert entry["key"] == idempotency_key(namespace, "handoff", slot)

        # A resend of a slot (say a retry after a send whose answer was lost): arq still
        # holds the job's result under its id, so it refuses the copy.
        slot = slots[0]
        send = arq_sender(redis, "handoff", _queue_name=queue, slot_kwarg="slot")
        resent = await send(RunContext("handoff", slot, slot, 1, attempt=2, namespace=namespace))
        assert (resent.queued, resent.key) == (False, idempotency_key(namespace, "handoff", slot))
        assert await redis.zcard(queue) == 0  # nothing waits to run again
        by_replica = Counter(line["replica"] for line in sent)
        print(
            f"\narq hand-off: {REPLICAS} replicas, {len(slots)} slots sent, "
            f"{len(executed)} executed, {len(ran) - len(set(ran))} duplicates; sent by "
            f"{sorted(by_replica.items())}"
        )
    finally:
        await replicas.stop()
        for proc in worker.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await asyncio.gather(*(proc.wait() for proc in worker.procs))
        await worker.stop()
        await _clean(redis, queue, keys)


async def test_a_broker_that_is_down_fails_the_run_and_its_retry_sends_the_slot(
    pg_dsn: str, redis: Any
) -> None:
    """Redis unreachable for the first attempt (a proxy that refuses connections): the run
    fails and the ledger records the failed attempt; the retry sends with the same key. The
    metrics count the failure and the retry, and ``status`` reads the job as any other."""
    from arq import create_pool
    from arq.connections import RedisSettings
    from prometheus_client import CollectorRegistry

    from cronlock.prometheus import instrument

    url = redis_url()
    settings = RedisSettings.from_dsn(url)
    proxy = TcpProxy(
        settings.host if isinstance(settings.host, str) else "127.0.0.1", settings.port
    )
    port = await proxy.start()
    through = await create_pool(
        RedisSettings(host="127.0.0.1", port=port, database=settings.database, conn_retries=0)
    )
    queue, namespace, job = unique("arq"), unique("ns"), unique("job")
    slot = (datetime.now(UTC) + timedelta(seconds=1.5)).replace(microsecond=0)
    key = idempotency_key(namespace, job, slot)
    locker = PostgresLocker(pg_dsn, racers=None)
    scheduler = Scheduler(locker=locker, idempotency_namespace=namespace)
    ended: list[Event] = []

    def tell(event: Event) -> None:
        if isinstance(event, JobFailed):
            proxy.set_mode("pass")  # the broker is back for the retry
        if isinstance(event, JobFailed | JobSucceeded):
            ended.append(event)

    scheduler.subscribe(tell)
    registry = CollectorRegistry()
    metrics = instrument(scheduler, registry)
    scheduler.add_job(
        arq_sender(through, "handoff", _queue_name=queue, slot_kwarg="slot"),
        once(slot),
        name=job,
        retries=2,
        retry_delay=0.2,
    )
    try:
        proxy.set_mode("refuse")
        proxy.cut()  # the pool's connection too: the broker is gone
        async with locker, scheduler:
            await eventually(
                lambda: any(isinstance(e, JobSucceeded) for e in ended), "a success", every=0.1
            )
            [run] = await locker.history(job, 5)
        assert [type(e) for e in ended] == [JobFailed, JobSucceeded]
        assert (run.slot, run.outcome, run.attempt) == (slot, "succeeded", 2)
        [first] = run.attempts
        assert (first.attempt, first.outcome) == (1, "failed")
        assert first.error is not None and "Connection" in first.error
        # Sent once, under the slot's key (the retry's key is the first attempt's).
        assert await redis.zcard(queue) == 1
        assert await redis.exists(f"arq:job:{key}") == 1

        def runs(outcome: str) -> float | None:
            labels = {"cronlock_job": job, "outcome": outcome}
            return registry.get_sample_value("cronlock_runs_total", labels)

        assert (runs("failed"), runs("succeeded")) == (1.0, 1.0)
        assert registry.get_sample_value("cronlock_retries_total", {"cronlock_job": job}) == 1.0
        status = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "cronlock", "status", job, "--dsn", pg_dsn],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        [row] = [line.split() for line in status.stdout.splitlines() if line.startswith(job)]
        assert row[1] == "ok", status.stdout
    finally:
        metrics.close()
        await through.aclose()
        await proxy.close()
        await _clean(redis, queue, {key})
