"""The dashboard's public surface, its import isolation, its command, and schedule words."""

from __future__ import annotations

import subprocess
import sys
import typing
from datetime import UTC, datetime, timedelta

import httpx
import pytest

import cronlock.web
from cronlock.web._words import describe

from ..eventually import eventually
from ..postgres.conftest import free_port
from .seed import Run, seed, table_name


def test_all_matches_the_public_names() -> None:
    public = {name for name in dir(cronlock.web) if not name.startswith("_")}
    assert set(cronlock.web.__all__) == public
    for name in cronlock.web.__all__:
        obj = getattr(cronlock.web, name)
        if typing.get_origin(obj) is not None:
            continue  # a type alias carries no __doc__; docs/dashboard.md documents it
        assert obj.__doc__, name


def test_cronlock_imports_no_web_framework() -> None:
    code = (
        "import sys, cronlock, cronlock.postgres; "
        "print(sorted(m for m in ('starlette', 'jinja2', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("note", "words", "zone"),
    [
        ("cron '0 3 * * *' in Europe/Berlin", "at 03:00 every day", "Europe/Berlin"),
        ("cron '*/15 * * * *' in UTC", "every 15 minutes", "UTC"),
        ("cron '30 8 * * 1-5' in America/New_York", "at 08:30 on weekdays", "America/New_York"),
        ("cron '0 9 * * mon'", "at 09:00 on Monday", "UTC"),
        ("cron '@hourly' in UTC", "every hour at minute 0", "UTC"),
        ("cron '0 0 1 * *' in UTC", "at 00:00 on day 1 of each month", "UTC"),
        ("cron '1-5 * * * *' in UTC", "cron 1-5 * * * *", "UTC"),
        ("6-field cron '*/5 * * * * *' in UTC", "cron */5 * * * * *", "UTC"),
        ("daily at 03:00 in Asia/Tokyo", "daily at 03:00 in Asia/Tokyo", "Asia/Tokyo"),
        ("every 5m", "every 5m", "UTC"),
        (None, "unknown (no replica noted a schedule)", "-"),
    ],
)
def test_schedules_in_words(note: str | None, words: str, zone: str) -> None:
    described = describe(note, None)
    assert (described.words, described.zone) == (words, zone)


def test_next_slots_follow_the_noted_one() -> None:
    noted = datetime(2026, 3, 28, 2, 0, tzinfo=UTC)  # 03:00 in Berlin, the day before DST
    berlin = describe("cron '0 3 * * *' in Europe/Berlin", noted).upcoming
    assert berlin == (
        noted,
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 30, 1, 0, tzinfo=UTC),
    )
    every = describe("every 1h30m", noted).upcoming
    assert every == tuple(noted + timedelta(minutes=90 * k) for k in range(3))


@pytest.mark.postgres
async def test_the_web_command_serves_the_ledger(pg_dsn: str) -> None:
    table = table_name()
    await seed(
        pg_dsn,
        table,
        [("nightly", "every 1h", None)],
        [Run("nightly", datetime(2026, 1, 1, tzinfo=UTC), "succeeded")],
    )
    port = free_port()
    args = [sys.executable, "-m", "cronlock", "web", "--dsn", pg_dsn, "--table", table]
    server = subprocess.Popen([*args, "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        assert "read-only" in server.stdout.readline()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def answered() -> httpx.Response | None:
                try:
                    return await client.get("/api/jobs")
                except httpx.ConnectError:
                    return None  # not listening yet

            answer = await eventually(answered, "the web command to answer", every=0.1)
            body = answer.json()
            assert body["read_only"] is True
            assert [job["name"] for job in body["jobs"]] == ["nightly"]
            refused = await client.post("/actions/pause", data={"job": "nightly"})
            assert refused.status_code == 403
    finally:
        server.terminate()
        server.wait(timeout=30)
        server.stdout.close() if server.stdout else None


def test_the_web_command_names_a_bad_dsn_without_its_password() -> None:
    dsn = "postgresql://cron:hunter2@127.0.0.1:1/db"
    done = subprocess.run(
        [sys.executable, "-m", "cronlock", "web", "--dsn", dsn, "--port", "8080"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3  # no server answers: the ledger cannot be read
    assert "cannot connect to PostgreSQL with --dsn" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout
