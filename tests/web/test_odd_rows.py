"""Odd ledger rows on a real dashboard server (issue 24): one row that Python cannot hold
or whose schedule the pages cannot follow must not take down every page."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from .realserver import Served, served
from .seed import seed, table_name
from .test_limits import drop

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LATER = "now() + interval '1 hour'"
BC = "'0044-03-15 12:00:00+00 BC'"
# job: (schedule note, its next slot, (a run's slot, started, finished) or None)
ODD = {
    "dotted": ("every 1.2.3s", LATER, None),
    "million-days": ("every 1000000d", LATER, None),  # every(days=1_000_000) notes this
    "next-infinity": ("every 1h", "'infinity'", None),
    "next-9999": ("every 1h", "'9999-12-31 23:00:00+00'", None),
    "next-bc": ("every 1h", BC, None),
    "run-bc": ("every 1h", LATER, (BC, BC, BC)),
    "run-infinity": ("every 1h", LATER, ("now()", "now()", "'infinity'")),
    "run-9999": ("every 1h", LATER, ("'9999-12-31 22:00:00+00'",) * 3),
    "slot-minus-infinity": ("every 1h", LATER, ("'-infinity'", "now()", "now()")),
}


@pytest.fixture
async def server(pg_dsn: str) -> AsyncIterator[Served]:
    table = table_name()
    await seed(pg_dsn, table, notes=[("healthy", "every 1h", None)], runs=[])
    conn = await asyncpg.connect(pg_dsn)
    try:
        for job, (note, upcoming, run) in ODD.items():
            await conn.execute(
                f'INSERT INTO "{table}_jobs" (job, schedule, next_run) VALUES ($1, $2, {upcoming})',
                job,
                note,
            )
            if run is not None:
                slot, started, finished = run
                await conn.execute(
                    f'INSERT INTO "{table}" (job, slot, host, pid, started_at, finished_at, '
                    f"outcome, error) VALUES ($1, {slot}, 'h', 1, {started}, {finished}, "
                    "'failed', 'odd')",
                    job,
                )
    finally:
        await conn.close()
    env = {"CRONLOCK_WEB_DSN": pg_dsn, "CRONLOCK_WEB_TABLE": table}
    try:
        async with served(env) as running:
            yield running
    finally:
        await drop(pg_dsn, table)


async def test_every_page_renders_odd_rows(server: Served) -> None:
    async with httpx.AsyncClient(base_url=server.base) as client:
        listing = await client.get("/")
        assert listing.status_code == 200, listing.text[:500]
        assert "every 1.2.3s" in listing.text and "every 1000000d" in listing.text
        api = await client.get("/api/jobs")
        assert api.status_code == 200, api.text[:500]
        jobs = {job["name"]: job for job in api.json()["jobs"]}
        assert set(jobs) == {"healthy", *ODD}
        # A run whose slot no one can read is left out (and reported in the log), as the
        # replicas and the command line leave it out (cronlock.postgres._sql.runs).
        assert jobs["run-bc"]["last_run"] is None
        assert jobs["next-bc"]["next_slots"] == []
        for job in ["healthy", *ODD]:
            page = await client.get(f"/jobs/{quote(job)}")
            assert page.status_code == 200, (job, page.text[:500])
            runs = await client.get(f"/api/jobs/{quote(job)}/runs")
            assert runs.status_code == 200, (job, runs.text[:500])
        for job in ("run-bc", "run-9999", "run-infinity", "slot-minus-infinity"):
            assert (await client.get(f"/api/jobs/{job}/runs")).json()["runs"] == [], job
