"""The dashboard's job list at 500 and at 5,000 jobs, side by side in one run.

    CRONLOCK_TEST_DSN=postgresql://... python benchmarks/dashboard.py [--rounds 15]

Seeds two ledgers of its own in a schema of its own (dropped at the end): every minute's
jobs, every tenth failing, every hundredth overdue, each with a tag (its team, one of 20).
Then it asks each for ``/`` and for
``/api/jobs`` in turn (httpx against the ASGI app, a DSN per request as ``web`` serves),
*rounds* times, alternating the sizes so that the machine's load falls on both alike, and
prints the median time and the size of each answer, and the ratio of 5,000 to 500. The
targets (issue 27): a ratio of at most 2 and at most 300 KiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from typing import Any

import asyncpg
import httpx

import cronlock.web
from cronlock.postgres._ledger import LedgerTable, migrate, quote_ident

SIZES = (500, 5000)


async def seed(conn: Any, ledger: LedgerTable, jobs: int) -> None:
    """*jobs* jobs every minute: every tenth failing, every hundredth overdue, each tagged."""
    await migrate(conn, ledger)
    await conn.execute(
        f"""INSERT INTO {ledger.jobs} (job, schedule, next_run, grace, due, tags)
            SELECT 'job-' || lpad(i::text, 5, '0'), 'every 1m',
                   date_trunc('minute', now()) + interval '1 minute', 60,
                   CASE WHEN i % 100 = 0 THEN now() - interval '1 hour' END,
                   ARRAY['team-' || i % 20]
            FROM generate_series(1, $1::int) AS i""",
        jobs,
    )
    await conn.execute(
        f"""INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at, outcome,
                                      error)
            SELECT 'job-' || lpad(i::text, 5, '0'),
                   CASE WHEN i % 100 = 0 THEN now() - interval '2 hours'
                        ELSE date_trunc('minute', now()) END,
                   'replica-a', 42, now(), now(),
                   CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'succeeded' END,
                   CASE WHEN i % 10 = 0 THEN 'RuntimeError: down' END
            FROM generate_series(1, $1::int) AS i""",
        jobs,
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    dsn = os.environ.get("CRONLOCK_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"cronlock_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    times: dict[tuple[int, str], list[float]] = {}
    sizes: dict[tuple[int, str], int] = {}
    try:
        await admin.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        clients = {}
        for jobs in SIZES:
            ledger = LedgerTable(f"runs_{jobs}", schema)
            await seed(admin, ledger, jobs)
            app = cronlock.web.app(dsn, table=ledger.table, schema=schema)
            transport = httpx.ASGITransport(app=app)
            clients[jobs] = httpx.AsyncClient(transport=transport, base_url="http://dash")
        for _ in range(args.rounds):
            for jobs in SIZES:
                for path in ("/", "/api/jobs"):
                    began = time.perf_counter()
                    answer = await clients[jobs].get(path)
                    took = time.perf_counter() - began
                    answer.raise_for_status()
                    times.setdefault((jobs, path), []).append(took)
                    sizes[jobs, path] = len(answer.content)
        for client in clients.values():
            await client.aclose()
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        await admin.close()
    report: dict[str, Any] = {}
    for path in ("/", "/api/jobs"):
        small, large = (statistics.median(times[jobs, path]) for jobs in SIZES)
        report[path] = {
            "ms_500": round(small * 1000, 1),
            "ms_5000": round(large * 1000, 1),
            "ratio": round(large / small, 2),
            "kib_500": round(sizes[500, path] / 1024, 1),
            "kib_5000": round(sizes[5000, path] / 1024, 1),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
