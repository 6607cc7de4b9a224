"""The dashboard's job list at 500 and at 5,000 jobs, side by side in one run.

    CRONLOCK_TEST_DSN=postgresql://... python benchmarks/dashboard.py [--rounds 30]
        [--source pool|dsn|both]

Seeds two ledgers of its own in a schema of its own (dropped at the end): every minute's
jobs, every tenth failing, every hundredth overdue, each with a tag (its team, one of 20).
Then, after one unmeasured answer of each, it asks each for ``/`` and for ``/api/jobs``
in turn (httpx against the ASGI app), *rounds* times, alternating the sizes so that the
machine's load falls on both alike, and prints the median time (and the fastest and
slowest round) and the size of each answer, and the ratio of 5,000 to 500.

Two ways of reaching the database, each its own rows: ``pool``, an asyncpg pool made as
``python -m cronlock web`` makes its own (:mod:`cronlock.web._serve`: at most 4
connections, no statement cache), which is what the targets are about; and ``dsn``, the
app given a DSN (:func:`cronlock.web.app`), which opens a connection per request (the
connect is most of its time at 500 jobs, so its ratio is the lower). ``--source`` picks one.
The targets (issue 27): a ratio of at most 2 and at most 300 KiB.
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
from cronlock.postgres._sql.schema import migrate
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

SIZES = (500, 5000)
PATHS = ("/", "/api/jobs")


async def make_pool(dsn: str) -> Any:
    """A pool as ``python -m cronlock web`` makes its own (cronlock.web._serve)."""
    return await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=4,
        timeout=10,
        statement_cache_size=0,
        server_settings={"application_name": "cronlock-web"},
    )


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


async def measure(
    sources: dict[int, Any], schema: str, rounds: int
) -> dict[tuple[int, str], tuple[list[float], int]]:
    """Each size's answers to each path, *rounds* times, sizes alternating: the times taken
    and the answer's size in bytes."""
    clients = {}
    for jobs in SIZES:
        app = cronlock.web.app(sources[jobs], table=f"runs_{jobs}", schema=schema)
        clients[jobs] = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dash"
        )
    found: dict[tuple[int, str], tuple[list[float], int]] = {}
    try:
        for jobs in SIZES:  # one answer each first: the pool's connect, the app's first load
            for path in PATHS:
                (await clients[jobs].get(path)).raise_for_status()
        for _ in range(rounds):
            for jobs in SIZES:
                for path in PATHS:
                    began = time.perf_counter()
                    answer = await clients[jobs].get(path)
                    took = time.perf_counter() - began
                    answer.raise_for_status()
                    times, _ = found.get((jobs, path), ([], 0))
                    found[jobs, path] = [*times, took], len(answer.content)
    finally:
        for client in clients.values():
            await client.aclose()
    return found


def summarize(found: dict[tuple[int, str], tuple[list[float], int]]) -> dict[str, Any]:
    """Each path's median times (ms), the 5,000-to-500 ratio of the medians, the fastest
    and slowest rounds, and the answers' sizes (KiB)."""
    report: dict[str, Any] = {}
    for path in PATHS:
        (small, small_size), (large, large_size) = (found[jobs, path] for jobs in SIZES)
        report[path] = {
            "ms_500": round(statistics.median(small) * 1000, 1),
            "ms_5000": round(statistics.median(large) * 1000, 1),
            "ratio": round(statistics.median(large) / statistics.median(small), 2),
            "range_500": [round(min(small) * 1000, 1), round(max(small) * 1000, 1)],
            "range_5000": [round(min(large) * 1000, 1), round(max(large) * 1000, 1)],
            "kib_500": round(small_size / 1024, 1),
            "kib_5000": round(large_size / 1024, 1),
        }
    return report


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--source", choices=("pool", "dsn", "both"), default="both")
    args = parser.parse_args()
    dsn = os.environ.get("CRONLOCK_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"cronlock_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    report: dict[str, Any] = {}
    try:
        await admin.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        for jobs in SIZES:
            await seed(admin, LedgerTable(f"runs_{jobs}", schema), jobs)
        if args.source in ("pool", "both"):
            pools = {jobs: await make_pool(dsn) for jobs in SIZES}
            try:
                report["pool"] = summarize(await measure(pools, schema, args.rounds))
            finally:
                for pool in pools.values():
                    await pool.close()
        if args.source in ("dsn", "both"):
            dsns = dict.fromkeys(SIZES, dsn)
            report["dsn"] = summarize(await measure(dsns, schema, args.rounds))
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        await admin.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
