"""The fleet's state seen by every replica (real server): triggers run once fleet-wide, a
replica that never ran a job reports the fleet's last success, pauses show."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest

from cronlock import JobSkipped, RunRecord, Schedule, Scheduler
from cronlock.postgres import FleetControl, PostgresLease, PostgresLocker, _control

pytestmark = pytest.mark.postgres


@pytest.fixture
def table() -> str:
    return f"fleet_{uuid.uuid4().hex[:10]}"


async def eventually(check: object, what: str, limit: float = 60.0) -> None:
    """Wait (polling) until *check()* is true; fail naming *what* after *limit* seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not check():  # type: ignore[operator]
        if loop.time() > deadline:
            pytest.fail(f"never happened: {what}")
        await asyncio.sleep(0.05)


async def test_a_trigger_runs_once_on_one_of_two_replicas(pg_dsn: str, table: str) -> None:
    runs: list[str] = []
    schedulers = []
    for name in ("a", "b"):
        scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table))

        async def task(name: str = name) -> None:
            runs.append(name)

        scheduler.add_job(task, _daily(), name="report")
        schedulers.append(scheduler)
    async with schedulers[0], schedulers[1], FleetControl(pg_dsn, table=table) as control:
        await control.trigger("report")
        await eventually(lambda: len(runs) == 1, "the triggered run")
        # Several more polls: nobody runs it again.
        locker = schedulers[0].get_job("report")._wiring.fleet
        assert isinstance(locker, PostgresLocker)
        watch = locker._fleet
        assert watch is not None
        reads = watch.reads
        await eventually(lambda: watch.reads >= reads + 3, "three more polls")
        assert len(runs) == 1
        history = await locker.history("report")
        assert [r.outcome for r in history] == ["succeeded"]


async def test_a_replica_that_never_ran_the_job_reports_the_fleets_last_success(
    pg_dsn: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_control, "RUNS_EVERY", 0.2)
    scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table))
    job = scheduler.add_job(lambda: None, _daily(), name="nightly")
    async with scheduler:
        assert job.last_success is None
        # Another replica runs it (here: another locker claims and records a slot).
        slot = datetime(2026, 1, 1, 3, tzinfo=UTC)
        async with PostgresLocker(pg_dsn, table=table) as other:
            lease = await other.acquire("nightly", slot)
            assert isinstance(lease, PostgresLease)
            now = datetime.now(UTC)
            lease.record(RunRecord(slot, now, now, "succeeded"))
            await lease.release()
        await eventually(
            lambda: job.last_success is not None and job.last_success.slot == slot,
            "the fleet's last success learned",
        )
        assert job.run_count == 0


async def test_a_paused_job_is_skipped_paused_and_shows_paused(pg_dsn: str, table: str) -> None:
    scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table))
    skipped: list[JobSkipped] = []
    scheduler.subscribe(skipped.append, JobSkipped)  # type: ignore[arg-type]
    job = scheduler.add_job(lambda: None, _daily(), name="nightly")
    async with scheduler, FleetControl(pg_dsn, table=table) as control:
        await control.pause("nightly")
        await eventually(lambda: scheduler.paused_fleet_wide(job), "the pause seen")
        assert not job.paused  # not paused by this replica itself
        event = await job.run_now()  # a run of this replica alone is refused at claim time
        assert isinstance(event, JobSkipped)
        assert event.reason == "paused"
        assert [e.reason for e in skipped] == ["paused"]
        await control.resume("nightly")
        await eventually(lambda: not scheduler.paused_fleet_wide(job), "the resume seen")


def _daily() -> Schedule:
    from cronlock import daily

    return daily("03:00")
