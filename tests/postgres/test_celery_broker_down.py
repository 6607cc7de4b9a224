"""A broker that is down: each send fails, is retried per ``retries``, and the ledger says so.

The beat runs in this process (``cronlock.celery.run_beat``) against a broker address
nothing listens on; its run ledger is the test server's.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from typing import Any

import asyncpg
import pytest
from celery import Celery

from cronlock import Event, JobFailed, JobRetrying, Scheduler
from cronlock.celery import BeatSettings, run_beat

from .celery_fleet import free_port

pytestmark = pytest.mark.postgres


async def test_a_send_to_a_broker_that_is_down_fails_and_is_retried(pg_dsn: str) -> None:
    app = Celery("broker-down", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    table = f"celery_down_{uuid.uuid4().hex[:8]}"
    app.conf.update(
        broker_connection_timeout=1,
        task_publish_retry_policy={"max_retries": 0},
        beat_schedule={
            "report": {
                "task": "proj.report",
                "schedule": 3.0,
                "cronlock": {"retries": 2, "retry_delay": 0.1},
            }
        },
    )
    settings = BeatSettings.from_app(app, dsn=pg_dsn, ledger=table)
    events: list[Event] = []
    stop = asyncio.Event()

    def started(scheduler: Scheduler) -> None:
        scheduler.subscribe(events.append, JobFailed, JobRetrying)

    def gave_up() -> list[Any]:
        """The slots that failed three times (1 + retries)."""
        fails = collections.Counter(e.slot for e in events if isinstance(e, JobFailed))
        return [slot for slot, n in fails.items() if n >= 3]

    async def until_a_slot_gave_up() -> None:
        while not gave_up():
            await asyncio.sleep(0.1)
        stop.set()

    watcher = asyncio.create_task(until_a_slot_gave_up())
    try:
        async with asyncio.timeout(60):
            await run_beat(app, settings, stop=stop, started=started)
    finally:
        watcher.cancel()
    slot = gave_up()[0]
    # 1 + retries attempts at that slot, each failed with the broker's error: two retries.
    failed = [e for e in events if isinstance(e, JobFailed) and e.slot == slot]
    assert len(failed) == 3
    retried = [e.attempt for e in events if isinstance(e, JobRetrying) and e.slot == slot]
    assert retried == [2, 3]
    assert all(isinstance(e, JobFailed | JobRetrying) and e.job == "report" for e in events)
    # The ledger (what status, the dashboard and the metrics read) has the failed slot.
    conn = await asyncpg.connect(pg_dsn)
    try:
        row: Any = await conn.fetchrow(
            f"SELECT outcome, attempt, error FROM {table} WHERE job = 'report' AND slot = $1",
            slot,
        )
        await conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    finally:
        await conn.close()
    assert (row["outcome"], row["attempt"]) == ("failed", 3)
    assert "OperationalError" in row["error"] or "Connection" in row["error"]
