"""cronlock's metrics under a real multi-worker server (issue 23, item 2).

``uvicorn --workers 3`` runs a service whose workers share one run ledger and a job that
fails every second; Prometheus scrapes the one port, each scrape on a fresh connection, so
the scrapes land on every worker. With ``PROMETHEUS_MULTIPROC_DIR`` set and
``cronlock.prometheus.scrape_registry()`` served, every scrape gives the service's values,
whichever worker answers: ``cronlock_runs_total{outcome="failed"}`` never goes back and
agrees with the ledger's count of failed runs, also across a worker killed and restarted;
the gauges are in every scrape; the gauge files of the killed worker are removed.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import asyncpg
import pytest

from ..multiworker import get, uvicorn_workers

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.usefixtures("examples_extra")]

WORKERS = 3
SCRAPES = 30
FAILED = re.compile(r'^cronlock_runs_total\{cronlock_job="fails",outcome="failed"\} (\S+)$', re.M)
LAST_RUN = re.compile(
    r'^cronlock_job_last_run_timestamp_seconds\{cronlock_job="fails"\} (\S+)$', re.M
)
PAUSED = re.compile(r'^cronlock_job_paused\{cronlock_job="fails"\} (\S+)$', re.M)
# A failed run is counted by its worker's event right after the ledger has it, or right
# before: a scrape between the two may be one run off the ledger's count on either side.
SLACK = 2
BOUND = 120.0  # only stops a hang; reaching it is a failure


async def _failed_in_ledger(conn: asyncpg.Connection, table: str) -> int:
    count: int = await conn.fetchval(
        f"SELECT count(*) FROM \"{table}\" WHERE job = 'fails' AND outcome = 'failed'"
    )
    return count


async def test_every_scrape_gives_the_services_values(pg_dsn: str, tmp_path: Path) -> None:
    table = "metrics_runs"  # in pg_dsn's own schema, dropped at the end
    env = {
        "CRONLOCK_METRICS_DSN": pg_dsn,
        "CRONLOCK_METRICS_TABLE": table,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with uvicorn_workers(
            "tests.services.metrics_app:app", env, workers=WORKERS, probe="/metrics/"
        ) as (base, server):
            async with asyncio.timeout(BOUND):  # a few failures before the first scrape
                while await _failed_in_ledger(conn, table) < 3:
                    await asyncio.sleep(0.2)
            readings: list[tuple[int, float, int, str]] = []
            killed: str | None = None
            for i in range(SCRAPES):
                before = await _failed_in_ledger(conn, table)
                scraped = await get(base, "/metrics/")
                after = await _failed_in_ledger(conn, table)
                text, pid = scraped.text, scraped.headers["x-worker-pid"]
                failed, last_run, paused = (p.search(text) for p in (FAILED, LAST_RUN, PAUSED))
                assert failed and last_run and paused, f"scrape {i} on worker {pid}:\n{text}"
                count = float(failed.group(1))
                assert before - SLACK <= count <= after + SLACK, (i, pid, before, count, after)
                readings.append((before, count, after, pid))
                assert paused.group(1) == "0.0"
                if i == SCRAPES // 2:  # the counts of a worker that died stay counted
                    killed = pid
                    os.kill(int(pid), signal.SIGKILL)
                await asyncio.sleep(0.3)
            assert killed is not None
            async with asyncio.timeout(BOUND):  # a live worker removes the dead one's gauges
                while list(tmp_path.glob(f"gauge_live*_{killed}.db")):
                    await asyncio.sleep(0.2)
            assert server.poll() is None
    finally:
        await conn.close()
    counts = [count for _, count, _, _ in readings]
    print(f"[measured] {len(readings)} scrapes by worker {sorted({r[3] for r in readings})}:")
    print(f"[measured] (ledger before, scraped, ledger after): {readings}")
    assert len({pid for *_, pid in readings}) >= 2, "every scrape reached one worker"
    assert counts == sorted(counts), "the failed-run counter went back"
    assert counts[-1] > counts[0]
