"""The beat in this process: a broker that is down (each send fails, is retried per
``retries``, and the ledger says so), and the scheduler's thread inside Celery's beat.

The run ledger is the test server's; the broker an address nothing listens on, or
kombu's in-memory transport.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from typing import Any

import asyncpg
import pytest
from celery import Celery

from cronlock import ConfigError, Event, JobFailed, JobRetrying, Scheduler
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


def test_the_beat_scheduler_runs_its_loop_in_a_thread_and_stops_it(pg_dsn: str) -> None:
    """Inside Celery's beat: started by its construction, checked by tick(), stopped by
    close(); a scheduler that cannot start stops the beat at once."""
    from cronlock.celery import BeatScheduler

    app = Celery("in-process", broker="memory://", set_as_current=False)
    app.conf.update(
        cronlock_dsn=pg_dsn,
        cronlock_ledger=f"celery_thread_{uuid.uuid4().hex[:8]}",
        beat_schedule={"often": {"task": "proj.t", "schedule": 1.0}},
    )
    beat = BeatScheduler(app)
    try:
        thread = beat._thread
        assert thread is not None and thread.is_alive()
        assert beat.tick() == 1.0
        assert "cronlock -> ledger celery_thread_" in beat.info
    finally:
        beat.close()
    assert not thread.is_alive()
    beat.close()  # twice: nothing left to stop

    app.conf.cronlock_locker_options = {"sessions": 0}
    with pytest.raises(ConfigError, match="sessions"):
        BeatScheduler(app)
