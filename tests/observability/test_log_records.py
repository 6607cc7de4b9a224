"""Every log record cronlock writes carries ``job``, ``slot`` and ``replica`` attributes."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from cronlock import InMemoryLocker, LockError, Scheduler, SystemClock
from cronlock._core import fleetclock as _fleetclock
from cronlock.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Inspector(logging.Handler):
    """Keeps every record it sees, as a JSON formatter would get them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def inspector() -> Iterator[Inspector]:
    handler = Inspector()
    root = logging.getLogger("cronlock")
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def check(records: list[logging.LogRecord]) -> None:
    """Every record has the three attributes; one that names a job has it as ``job``."""
    replica = f"{socket.gethostname()}:{os.getpid()}"
    for record in records:
        attributes = record.__dict__
        assert {"job", "slot", "replica"} <= attributes.keys(), record.getMessage()
        assert record.replica == replica  # type: ignore[attr-defined]
        message = record.getMessage()
        if message.startswith("job "):
            assert record.job is not None, message  # type: ignore[attr-defined]
            assert f"job {record.job!r}" in message  # type: ignore[attr-defined]
        if message.startswith("job ") and " slot " in message.split(":")[0]:
            slot = record.slot  # type: ignore[attr-defined]
            assert isinstance(slot, str), message
            assert datetime.fromisoformat(slot).tzinfo is not None


async def test_run_records_carry_job_slot_and_replica(inspector: Inspector) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)

    @scheduler.every(10, name="broken")
    async def broken() -> None:
        raise RuntimeError("boom")

    @scheduler.every(10, name="slow", timeout=5)
    async def slow() -> None:
        await asyncio.sleep(3600)

    @scheduler.every(10, name="long", overlap="skip")
    async def long() -> None:
        await clock.sleep(15)

    async with scheduler:
        await clock.advance(30)
    records = inspector.records
    check(records)
    failed = [r for r in records if r.getMessage().startswith("job 'broken' slot")]
    assert failed
    assert all(r.job == "broken" for r in failed)  # type: ignore[attr-defined]
    assert {r.slot for r in failed} == {  # type: ignore[attr-defined]
        "2026-01-01T00:00:10+00:00",
        "2026-01-01T00:00:20+00:00",
        "2026-01-01T00:00:30+00:00",
    }
    assert any(r.job == "slow" and "timed out" in r.getMessage() for r in records)  # type: ignore[attr-defined]
    assert any(r.job == "long" and "still running" in r.getMessage() for r in records)  # type: ignore[attr-defined]
    started = [r for r in records if r.getMessage().startswith("scheduler started")]
    assert started[0].job is None  # type: ignore[attr-defined]
    assert started[0].slot is None  # type: ignore[attr-defined]


async def test_a_successful_run_is_logged_at_debug(
    inspector: Inspector, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)

    @scheduler.every(10, name="plain")  # the run loop's fast path
    async def plain() -> None:
        await clock.sleep(2)

    @scheduler.every(10, name="locked", locker=InMemoryLocker())  # the general path, a hold
    async def locked() -> None:
        await clock.sleep(0.25)

    @scheduler.cron("* * * * *", name="cron", timeout=30)  # the general path, no hold
    async def minutely() -> None:
        pass

    with caplog.at_level(logging.DEBUG, logger="cronlock"):
        async with scheduler:
            await clock.advance(65)
    check(inspector.records)
    done = [r for r in caplog.records if " succeeded in " in r.getMessage()]
    assert {r.levelno for r in done} == {logging.DEBUG}  # every second on 50 pods: not INFO
    seen = {(r.job, r.slot, r.duration) for r in done}  # type: ignore[attr-defined]
    assert {(job, slot) for job, slot, _ in seen} == {
        ("plain", "2026-01-01T00:00:10+00:00"),
        ("plain", "2026-01-01T00:00:20+00:00"),
        ("plain", "2026-01-01T00:00:30+00:00"),
        ("plain", "2026-01-01T00:00:40+00:00"),
        ("plain", "2026-01-01T00:00:50+00:00"),
        ("plain", "2026-01-01T00:01:00+00:00"),
        ("locked", "2026-01-01T00:00:10+00:00"),
        ("locked", "2026-01-01T00:00:20+00:00"),
        ("locked", "2026-01-01T00:00:30+00:00"),
        ("locked", "2026-01-01T00:00:40+00:00"),
        ("locked", "2026-01-01T00:00:50+00:00"),
        ("locked", "2026-01-01T00:01:00+00:00"),
        ("cron", "2026-01-01T00:01:00+00:00"),
    }
    durations = {job: duration for job, _, duration in seen}
    assert durations["plain"] == 2.0 and durations["locked"] == 0.25
    message = next(r.getMessage() for r in done if r.job == "plain")  # type: ignore[attr-defined]
    assert message == "job 'plain' slot 2026-01-01 00:00:10+00:00 succeeded in 2.000 s"


class _Unreachable:
    """A ServerClockLocker whose server cannot be read, then can (fleet time's records)."""

    def __init__(self) -> None:
        self.down = True

    async def acquire(self, job: str, slot: datetime) -> None:
        return None

    async def read_server_clock(self, read: Callable[[], datetime]) -> tuple[datetime, ...]:
        if self.down:
            raise LockError("the server is down")
        now = read()
        return now, now, read()


async def test_fleet_clock_records_carry_the_attributes(
    inspector: Inspector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_fleetclock, "RETRY_EVERY", 0.0)
    source = _Unreachable()
    clock = _fleetclock.FleetClock(SystemClock(), source)  # type: ignore[arg-type]
    task = asyncio.create_task(clock.keep(lambda: None))
    try:
        while not clock.failures:
            await asyncio.sleep(0)
        source.down = False
        while clock.offset is None:
            await asyncio.sleep(0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    fleet = [r for r in inspector.records if r.getMessage().startswith("fleet clock")]
    assert {r.levelno for r in fleet} >= {logging.WARNING, logging.INFO, logging.DEBUG}
    check(fleet)
    assert all(r.job is None and r.slot is None for r in fleet)  # type: ignore[attr-defined]
