"""A lock session that cannot connect backs off: the schedule, fail-fast, logs, reset.

The restart and outage tests on a throwaway cluster are in test_restart.py; these use an
unreachable port, or a proxy refusing connections in front of the shared server.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import uuid
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest

from cronlock import LockError, LockUnavailable
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._conn import backoff as _backoff
from cronlock.postgres._conn.backoff import (
    BRISK_FAILURES,
    RECONNECT_BRISK,
    RECONNECT_FIRST,
    RECONNECT_JITTER,
    RECONNECT_MAX,
    STILL_DOWN_EVERY,
    Backoff,
    backoff_step,
)

from .proxy import TcpProxy, via

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


def new_job() -> str:
    return f"reconnect-{uuid.uuid4()}"


def test_the_wait_doubles_from_the_first_step_up_to_the_cap() -> None:
    brisk = [backoff_step(n) for n in range(1, BRISK_FAILURES + 1)]
    assert brisk[0] == RECONNECT_FIRST
    assert all(b == min(2 * a, RECONNECT_BRISK) for a, b in itertools.pairwise(brisk))
    assert brisk[-1] == RECONNECT_BRISK  # a short outage is retried about every second
    later = [backoff_step(n) for n in range(BRISK_FAILURES, BRISK_FAILURES + 6)]
    assert all(b == min(2 * a, RECONNECT_MAX) for a, b in itertools.pairwise(later))
    assert later[-1] == RECONNECT_MAX
    assert backoff_step(10_000) == RECONNECT_MAX  # no overflow after a very long outage


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999999])
def test_jitter_keeps_each_wait_within_its_step(draw: float) -> None:
    backoff = Backoff("server", draw=lambda: draw)
    now = 100.0
    for failures in range(1, 10):
        delay = backoff.failed(now, OSError("refused"))
        step = backoff_step(failures)
        assert step * (1 - RECONNECT_JITTER) <= delay <= step
        assert backoff.wait(now) == pytest.approx(delay)
        assert backoff.wait(now + delay) == 0
        now += delay
    backoff.succeeded(now, again=True)
    assert backoff.failures == 0
    assert backoff.wait(now) == 0
    # The next outage starts over from the first step.
    assert backoff.failed(now, OSError("refused")) <= RECONNECT_FIRST


def test_an_outage_is_logged_once_then_rate_limited_then_reconnected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backoff = Backoff("PostgreSQL server", draw=lambda: 0.0)
    now = 0.0
    with caplog.at_level(logging.INFO, logger="cronlock"):
        backoff.lost(now)
        while now < 2.5 * STILL_DOWN_EVERY:
            now += backoff.failed(now, OSError("connection refused"))
        backoff.succeeded(now, again=True)
    levels = [r.levelname for r in caplog.records]
    # One ERROR for the outage, a WARNING a minute while it lasts, one INFO when it ends.
    assert levels == ["ERROR", "WARNING", "WARNING", "INFO"]
    assert "connection refused" in caplog.records[0].getMessage()
    assert re.search(r"reconnected after \d+\.\ds", caplog.records[-1].getMessage())


async def test_acquires_while_backing_off_fail_fast_without_connecting(
    unreachable_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A first wait of about a minute: no second attempt can be due during the test.
    monkeypatch.setattr(_backoff, "RECONNECT_FIRST", 60.0)
    monkeypatch.setattr(_backoff, "RECONNECT_MAX", 60.0)
    async with PostgresLocker(unreachable_dsn, sessions=1, connect_timeout=5) as locker:
        async with asyncio.timeout(30):
            results = await asyncio.gather(
                *(locker.acquire(new_job(), SLOT) for _ in range(200)), return_exceptions=True
            )
            assert all(isinstance(r, LockUnavailable) for r in results), results[:3]
            with pytest.raises(LockUnavailable, match=r"reconnecting in \d+\.\d+s") as caught:
                await locker.acquire(new_job(), SLOT)
        stats = locker.statistics()
    # 201 acquires, one connection attempt: the rest did not even queue behind it.
    assert (stats.connect_attempts, stats.connect_failures) == (1, 1)
    assert isinstance(caught.value, LockError)  # callers catching LockError still do
    assert isinstance(caught.value.__cause__, OSError)  # the cause, as for any LockError


@pytest.mark.postgres
async def test_backoff_grows_while_down_and_starts_over_after_a_reconnect(
    pg_dsn: str, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    target = urlsplit(pg_dsn)
    if target.hostname is None or target.hostname.startswith("/"):
        pytest.skip("the DSN names no TCP host to relay to")
    proxy = TcpProxy(target.hostname, target.port or 5432)
    port = await proxy.start()
    proxy.set_mode("refuse")
    locker = PostgresLocker(via(pg_dsn, port), application_name=app_name, sessions=1)
    calls = 0

    async def acquire_until_granted() -> PostgresHold:
        nonlocal calls
        while True:
            calls += 1
            try:
                lease = await locker.acquire(new_job(), SLOT)
            except LockUnavailable:
                await asyncio.sleep(0.01)  # a busy caller: far more acquires than attempts
                continue
            assert isinstance(lease, PostgresHold)
            return lease

    try:
        with caplog.at_level(logging.INFO, logger="cronlock.postgres"):
            async with locker, asyncio.timeout(60):
                down = asyncio.create_task(acquire_until_granted())
                while locker.statistics().connect_failures < 5:
                    await asyncio.sleep(0.01)
                proxy.set_mode("pass")
                lease = await down
                refused = locker.statistics()
                await lease.release()
                # The session goes down again: the first attempt is at once, and the
                # waits start over from the first step.
                proxy.set_mode("refuse")
                proxy.cut()
                while locker.statistics().sessions_open:
                    await asyncio.sleep(0.01)
                with pytest.raises(LockUnavailable, match=r"reconnecting in") as caught:
                    await locker.acquire(new_job(), SLOT)
                again = locker.statistics()
    finally:
        await proxy.close()
    assert refused.connect_failures >= 5
    assert refused.connect_attempts == refused.connect_failures + 1
    assert calls > 2 * refused.connect_attempts  # most acquires failed fast
    assert again.connect_attempts == refused.connect_attempts + 1
    assert again.connect_failures == refused.connect_failures + 1
    waited = re.search(r"reconnecting in (\d+\.\d+)s", str(caught.value))
    assert waited is not None
    assert float(waited[1]) <= RECONNECT_FIRST
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    connected = [r.getMessage() for r in caplog.records if "connected after" in r.getMessage()]
    # One ERROR per outage (not one per attempt), one INFO when the session is back.
    assert len([r for r in errors if "cannot connect" in r.getMessage()]) == 2
    assert len(connected) == 1
    assert f"({refused.connect_failures} failed attempt(s))" in connected[0]
