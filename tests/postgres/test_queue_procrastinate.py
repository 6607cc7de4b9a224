"""Handing slots off to procrastinate, end to end on PostgreSQL (docs/guides/queues.md).

procrastinate keeps its jobs in tables of its own: the test makes a throwaway database,
applies procrastinate's schema there, and drops the database at its end. Three replica
processes (handoff_replica.py, their ledger in that database too) hand ``every(1)`` off
with :func:`cronlock.queues.procrastinate_sender`; a procrastinate worker process
(procrastinate_worker.py) runs the jobs. Each slot is deferred by one replica, once, and run
once, its ``queueing_lock`` the slot's idempotency key; a second defer of a slot whose job
still waits is refused by procrastinate and taken as a success.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from cronlock import RunContext, idempotency_key
from cronlock.queues import procrastinate_sender

from ..brokers import library, missing, unique
from ..eventually import eventually
from ..throwaway import drop, make, prefix
from .processes import Processes

pytestmark = pytest.mark.postgres

HERE = Path(__file__).parent
REPLICAS = 3
HANDING_OFF = 6.0  # seconds the replicas hand slots off (every(1)) before they stop


@pytest.fixture
async def database(pg_server: str) -> AsyncIterator[str]:
    """The DSN of a throwaway database with procrastinate's schema, dropped afterwards."""
    procrastinate = library("procrastinate")
    parts = urlsplit(pg_server)
    if parts.scheme not in ("postgres", "postgresql"):
        missing("a URL CRONLOCK_TEST_DSN (the test makes a database beside it)")
    name = f"{prefix()}{os.getpid()}_procr_{uuid.uuid4().hex[:6]}"
    await make(pg_server, "database", name)
    dsn = urlunsplit(parts._replace(path=f"/{name}"))
    try:
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
        yield dsn
    finally:
        await drop(pg_server, "database", name)


@pytest.mark.slow
async def test_replicas_defer_each_slot_once_and_the_worker_runs_it_once(database: str) -> None:
    queue, namespace = unique("procrastinate"), unique("ns")
    worker = Processes(HERE / "procrastinate_worker.py")
    replicas = Processes(HERE / "handoff_replica.py")
    try:
        await worker.spawn("--conninfo", database, "--queue", queue)
        for n in range(REPLICAS):
            await replicas.spawn(
                "--dsn", database, "--kind", "procrastinate", "--broker", database,
                "--queue", queue, "--namespace", namespace, "--id", f"r{n}",
            )  # fmt: skip
        await eventually(
            lambda: worker.lines[:1] == [{"event": "running"}], "the worker started", every=0.1
        )
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
        slots = [datetime.fromisoformat(line["slot"]) for line in sent]
        keys = {idempotency_key(namespace, "handoff", slot) for slot in slots}
        assert len(slots) >= 3
        assert len(set(slots)) == len(slots), sorted(slots)
        assert not [line for line in replicas.lines if line["event"] == "failed"]
        logs = [line["message"] for line in replicas.lines if line["event"] == "log"]
        assert sum("handed off to procrastinate" in m for m in logs) == len(slots)

        def ran() -> list[dict[str, Any]]:
            return [line for line in worker.lines if line["event"] == "ran"]

        await eventually(lambda: len(ran()) >= len(slots), "the worker ran every slot", every=0.1)
        executed = [line["key"] for line in ran()]
        assert sorted(executed) == sorted(keys)
        for line in ran():
            slot = datetime.fromisoformat(line["slot"])
            assert line["key"] == idempotency_key(namespace, "handoff", slot)
        by_replica = Counter(line["replica"] for line in sent)
        print(
            f"\nprocrastinate hand-off: {REPLICAS} replicas, {len(slots)} slots sent, "
            f"{len(executed)} executed, {len(executed) - len(set(executed))} duplicates; "
            f"sent by {sorted(by_replica.items())}"
        )
    finally:
        await replicas.stop()
        for proc in worker.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await asyncio.gather(*(proc.wait() for proc in worker.procs))
        await worker.stop()


async def test_a_second_defer_of_a_waiting_slot_is_refused_and_taken_as_sent(
    database: str,
) -> None:
    """No worker: the slot's job waits, so procrastinate refuses a job with the same
    queueing_lock (AlreadyEnqueued), which the sender reports as queued=False, not an
    error; another slot is deferred as usual."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=database))

    @app.task(name="handoff", queue="cronlock-test")
    def handoff(slot: str) -> None:
        raise AssertionError("never run here")

    send = procrastinate_sender(handoff, slot_kwarg="slot")
    locked = procrastinate_sender(handoff, lock=True)
    slot = datetime(2030, 1, 1, tzinfo=UTC)
    later = datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
    async with app.open_async():
        first = await send(RunContext("handoff", slot, slot, 1, namespace="svc"))
        again = await send(RunContext("handoff", slot, slot, 1, attempt=2, namespace="svc"))
        other = await locked(RunContext("handoff", later, later, 2, namespace="svc"))
        jobs = await app.job_manager.list_jobs_async(queue="cronlock-test")
    assert (first.queued, again.queued, other.queued) == (True, False, True)
    assert first.key == again.key == idempotency_key("svc", "handoff", slot)
    assert other.key == idempotency_key("svc", "handoff", later)
    assert sorted((job.queueing_lock, job.lock, job.task_kwargs) for job in jobs) == sorted(
        [(first.key, None, {"slot": slot.isoformat()}), (other.key, other.key, {})]
    )
