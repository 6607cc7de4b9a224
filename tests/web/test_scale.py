"""The job list of a fleet of 5,000 jobs: a summary of every status, a filter by name and
status, failing and overdue first, pages; a bounded number of statements and a bounded
page whatever the number of jobs. (Its speed is a benchmark's: benchmarks/dashboard.py.)"""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import pytest

import cronlock.web
from cronlock.postgres._sql.schema import migrate
from cronlock.postgres._sql.tables import LedgerTable
from cronlock.web import _reads

from .seed import live_member, table_name
from .test_app import client

pytestmark = pytest.mark.postgres


async def seed_fleet(dsn: str, table: str, jobs: int) -> None:
    """*jobs* jobs every minute: every tenth failing, every hundredth overdue, the rest ok."""
    ledger = LedgerTable(table)
    conn: Any = await asyncpg.connect(dsn)
    try:
        await migrate(conn, ledger)
        await live_member(conn, ledger)
        await conn.execute(
            f"""INSERT INTO {ledger.jobs} (job, schedule, next_run, grace, due)
                SELECT 'job-' || lpad(i::text, 5, '0'), 'every 1m',
                       date_trunc('minute', now()) + interval '1 minute', 60,
                       CASE WHEN i % 100 = 0 THEN now() - interval '1 hour' END
                FROM generate_series(1, $1::int) AS i""",
            jobs,
        )
        await conn.execute(
            f"""INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at,
                                          outcome, error)
                SELECT 'job-' || lpad(i::text, 5, '0'), date_trunc('minute', now()),
                       'replica-a', 42, now(), now(),
                       CASE WHEN i % 10 = 0 AND i % 100 <> 0 THEN 'failed'
                            WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END,
                       CASE WHEN i % 10 = 0 THEN 'RuntimeError: down' END
                FROM generate_series(1, $1::int) AS i""",
            jobs,
        )
        # The overdue ones: their last success is older than the slot they are due by.
        await conn.execute(
            f"UPDATE {ledger.runs} SET slot = now() - interval '2 hours' WHERE right(job, 2) = '00'"
        )
    finally:
        await conn.close()


class Counting:
    """Counts the statements the dashboard's fleet reads send."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        for name in ("fetch", "fetchrow", "fetchval"):
            real = getattr(_reads.SafeReads, name)

            async def counted(reads: Any, sql: str, *args: Any, _real: Any = real) -> Any:
                self.n += 1
                return await _real(reads, sql, *args)

            monkeypatch.setattr(_reads.SafeReads, name, counted)


@pytest.fixture(scope="module")
def fleets() -> dict[int, str]:
    """The fleets seeded so far, by size (in pg_dsn's schema, dropped with it)."""
    return {}


async def _fleet(pg_dsn: str, jobs: int, fleets: dict[int, str]) -> str:
    if jobs not in fleets:
        fleets[jobs] = table_name()
        await seed_fleet(pg_dsn, fleets[jobs], jobs)
    return fleets[jobs]


async def test_five_thousand_jobs_summary_filter_pages(
    pg_dsn: str, fleets: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    table = await _fleet(pg_dsn, 5000, fleets)
    counting = Counting(monkeypatch)
    async with client(cronlock.web.app(pg_dsn, table=table)) as c:
        page = await c.get("/")
        body = await c.get("/api/jobs")
        named = await c.get("/", params={"q": "JOB-04242"})  # any case
        failing = (await c.get("/api/jobs", params={"status": "failing", "page": "2"})).json()
        second = (await c.get("/api/jobs", params={"page": "2"})).json()
        bad = await c.get("/api/jobs", params={"status": "broken"})
    assert page.status_code == 200 and len(page.content) <= 300 * 1024, len(page.content)
    assert len(body.content) <= 300 * 1024, len(body.content)
    summary = body.json()["summary"]
    assert summary == {
        "total": 5000, "paused": 0, "conflict": 0, "rejected": 0, "absent": 0,
        "overdue": 50, "failing": 450, "running": 0, "ok": 4500, "new": 0,
    }  # fmt: skip
    shown = re.findall(r'data-count="(\w+)"[^>]*>(\d+) ', page.text)
    assert dict(shown)["failing"] == "450" and dict(shown)["overdue"] == "50"
    first = body.json()["jobs"]
    assert len(first) == 100 and {job["status"] for job in first} <= {"overdue", "failing"}
    assert second["jobs"][0]["name"] != first[0]["name"]  # paging moves
    assert (second["page"], second["pages"]) == (2, 50)
    assert re.findall(r'data-job="([^"]+)"', named.text) == ["job-04242"]
    assert failing["matched"] == 450 and failing["pages"] == 5
    assert {job["status"] for job in failing["jobs"]} == {"failing"}
    assert bad.status_code == 400 and "unknown status 'broken'" in bad.json()["error"]
    assert 'rel="next" href="/?page=2"' in page.text
    # Five list reads (the 400 read nothing): the roster of every job (two), the lock holders
    # (which of the secrets and leases tables there are, the secret, pg_locks, the leases),
    # the jobs in conflict (two: are there members and definitions tables, the jobs), the
    # stored schedules rejected everywhere (two: is there a table for them, the read), the
    # page's jobs and their latest runs; 500 jobs take as many (below).
    assert counting.n == 5 * 12, counting.n


async def test_the_statements_of_a_refresh_do_not_grow_with_the_jobs(
    pg_dsn: str, fleets: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = []
    for jobs in (500, 5000):
        table = await _fleet(pg_dsn, jobs, fleets)
        counting = Counting(monkeypatch)
        async with client(cronlock.web.app(pg_dsn, table=table)) as c:
            assert (await c.get("/")).status_code == 200
        counts.append(counting.n)
    assert counts[0] == counts[1], counts
