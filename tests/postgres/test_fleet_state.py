"""The fleet's state seen by every replica (real server): triggers run once fleet-wide, a
replica that never ran a job reports the fleet's last success, pauses show."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from cronlock import JobSkipped, JobSucceeded, RunContext, RunRecord, Schedule, Scheduler
from cronlock.otel import instrument as instrument_traces
from cronlock.postgres import (
    FleetControl,
    PostgresElector,
    PostgresHold,
    PostgresLocker,
)
from cronlock.postgres._locker import fleetwatch as _control
from cronlock.postgres._locker.fleetwatch import FleetWatch
from cronlock.prometheus import instrument as instrument_metrics

from ..eventually import eventually

pytestmark = pytest.mark.postgres


@pytest.fixture
def table() -> str:
    return f"fleet_{uuid.uuid4().hex[:10]}"


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
        await control.trigger("report", force=True)  # maybe not noted yet
        await eventually(lambda: len(runs) == 1, "the triggered run")
        # Several more polls: nobody runs it again.
        locker = schedulers[0].get_job("report")._wiring.fleet
        assert isinstance(locker, PostgresLocker)
        watch = locker._fleet
        assert isinstance(watch, FleetWatch)
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
            assert isinstance(lease, PostgresHold)
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
        await control.pause("nightly", force=True)
        await eventually(lambda: scheduler.paused_fleet_wide(job), "the pause seen")
        assert not job.paused  # not paused by this replica itself
        event = await job.run_now()  # a run of this replica alone is refused at claim time
        assert isinstance(event, JobSkipped)
        assert event.reason == "paused"
        assert [e.reason for e in skipped] == ["paused"]
        await control.resume("nightly", force=True)
        await eventually(lambda: not scheduler.paused_fleet_wide(job), "the resume seen")


def _daily() -> Schedule:
    from cronlock import daily

    return daily("03:00")


async def test_leader_gauge_and_run_spans_with_the_real_backend(pg_dsn: str, table: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    elector = PostgresElector(pg_dsn, name=f"leader-{table}")
    scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table), elector=elector)
    job = scheduler.add_job(lambda: None, _daily(), name="nightly")
    registry = CollectorRegistry()
    instrument_metrics(scheduler, registry)
    instrument_traces(scheduler, tracer_provider=provider)
    async with scheduler, FleetControl(pg_dsn, table=table) as control:
        assert registry.get_sample_value("cronlock_leader") == 0.0  # elected on first use
        await elector.start()
        await eventually(lambda: registry.get_sample_value("cronlock_leader") == 1.0, "leadership")
        assert isinstance(await job.run_now(), JobSucceeded)
        await control.pause("nightly", force=True)
        skipped = await job.run_now()
        assert isinstance(skipped, JobSkipped)
    [span] = exporter.get_finished_spans()  # the skipped run makes none
    assert span.attributes is not None
    assert span.attributes["cronlock.lock"] == "granted"
    assert span.attributes["cronlock.outcome"] == "succeeded"
    reasons = {"cronlock_job": "nightly", "reason": "paused"}
    assert registry.get_sample_value("cronlock_skips_total", reasons) == 1


async def test_the_lockers_log_records_carry_job_and_slot(pg_dsn: str, table: str) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    logger = logging.getLogger("cronlock")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    slot = datetime(2026, 1, 1, 3, tzinfo=UTC)
    try:
        async with (
            PostgresLocker(pg_dsn, table=table) as one,
            PostgresLocker(pg_dsn, table=table) as two,
        ):
            lease = await one.acquire("nightly", slot)
            assert isinstance(lease, PostgresHold)
            assert await two.acquire("nightly", slot) == "already_ran"
            await lease.release()
            assert await one.acquire("nightly", slot) == "already_ran"  # remembered
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    about = [r for r in records if r.name == "cronlock.postgres" and "slot" in r.getMessage()]
    assert len(about) >= 2
    for record in about:
        assert record.job == "nightly"  # type: ignore[attr-defined]
        assert record.slot == slot.isoformat()  # type: ignore[attr-defined]
        assert record.replica  # type: ignore[attr-defined]


async def test_a_trigger_that_finds_the_job_running_is_tried_again(
    pg_dsn: str, table: str, admin: Any
) -> None:
    scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table))
    release = asyncio.Event()
    slots: list[datetime] = []

    async def task(ctx: RunContext) -> None:
        slots.append(ctx.slot)
        await release.wait()

    job = scheduler.add_job(task, _daily(), name="long")
    skipped: list[JobSkipped] = []
    scheduler.subscribe(skipped.append, JobSkipped)  # type: ignore[arg-type]
    async with scheduler, FleetControl(pg_dsn, table=table) as control:
        running = asyncio.create_task(job.run_now())
        await eventually(lambda: len(slots) == 1, "the first run")
        await control.trigger("long", force=True)
        await eventually(lambda: any(e.reason == "overlap" for e in skipped), "overlap skip")
        release.set()
        await running
        triggered = await admin.fetchval(
            f'SELECT trigger_slot FROM "{table}_control" WHERE job = $1', "long"
        )
        await eventually(lambda: triggered in slots, "the trigger run after the first")
    assert len(slots) == 2
