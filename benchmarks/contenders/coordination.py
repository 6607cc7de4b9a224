"""Scenario 4: what coordination through PostgreSQL costs, on a real server.

    python coordination.py DSN [--runs 1000]

- Latency of one locked run (``PostgresLocker.acquire`` + ``lease.release``, nothing in
  between) against a bare ``SELECT 1`` on another connection to the same server, measured
  in interleaved blocks so that both see the same noise.
- Round trips per locked run, counted on the wire: both go through a small TCP proxy that
  counts each time the server answers after the client spoke (one request/response
  exchange), so nothing inside asyncpg or cronlock has to be trusted or patched.
- Server connections of one replica (a Scheduler with a PostgresLocker) while 50, then 500,
  locked jobs run at once, from ``pg_stat_activity`` by the locker's ``application_name``.
Each is measured for the lock alone (``ledger=False``) and with the run ledger (the
default), whose tables go into a throwaway schema that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped,unused-ignore]
from harness import percentile

from cronlock import Scheduler, every
from cronlock.postgres import PostgresLocker

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CountingProxy:
    """Forwards TCP to the server; counts exchanges (server speaks after the client did)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.exchanges = 0
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        client_spoke = [False]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, upstream: bool) -> None:
            try:
                while data := await r.read(65536):
                    if upstream:
                        client_spoke[0] = True
                    elif client_spoke[0]:
                        client_spoke[0] = False
                        self.exchanges += 1
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(client_r, server_w, True), pipe(server_r, client_w, False))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


def via(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) > 1 else host))


JOB = f"bench-coordination-{os.getpid()}"


async def locked_run(locker: PostgresLocker, k: int) -> None:
    lease = await locker.acquire(JOB, _EPOCH + timedelta(seconds=k))
    assert not isinstance(lease, str), lease
    await lease.release()


async def latency(dsn: str, runs: int, **opts: Any) -> dict[str, float]:
    # The cost of the round trips: without the fair race's deliberate wait before a claim
    # (0 to 10 ms by default, there to share slots fairly between replicas).
    locker = PostgresLocker(dsn, spread=0, **opts)
    conn = await asyncpg.connect(dsn)
    try:
        for k in range(50):  # warm-up: session opened, statements prepared
            await locked_run(locker, -k - 1)
            await conn.fetchval("SELECT 1")
        locked: list[float] = []
        bare: list[float] = []
        for block in range(0, runs, 100):
            for k in range(block, min(block + 100, runs)):
                t = time.perf_counter()
                await locked_run(locker, k)
                locked.append(time.perf_counter() - t)
            for _ in range(block, min(block + 100, runs)):
                t = time.perf_counter()
                await conn.fetchval("SELECT 1")
                bare.append(time.perf_counter() - t)
    finally:
        await conn.close()
        await locker.close()
    return {
        "locked_p50_us": percentile(locked, 50) * 1e6,
        "locked_p99_us": percentile(locked, 99) * 1e6,
        "select1_p50_us": percentile(bare, 50) * 1e6,
        "select1_p99_us": percentile(bare, 99) * 1e6,
    }


async def round_trips(dsn: str, runs: int, **opts: Any) -> dict[str, float]:
    parts = urlsplit(dsn)
    proxy = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    port = await proxy.start()
    locker = PostgresLocker(via(dsn, port), spread=0, **opts)
    conn = await asyncpg.connect(via(dsn, port))
    try:
        for k in range(10):
            await locked_run(locker, -k - 100)
            await conn.fetchval("SELECT 1")
        start = proxy.exchanges
        for k in range(runs):
            await locked_run(locker, 10_000 + k)
        locked = (proxy.exchanges - start) / runs
        start = proxy.exchanges
        for _ in range(runs):
            await conn.fetchval("SELECT 1")
        bare = (proxy.exchanges - start) / runs
    finally:
        await conn.close()
        await locker.close()
        proxy.close()
    return {"locked_round_trips": locked, "select1_round_trips": bare}


async def connections(dsn: str, jobs: int, **opts: Any) -> dict[str, float]:
    """Max server connections of one replica while *jobs* locked jobs run at once."""
    name = f"cronlock-bench-{os.getpid()}-{jobs}"
    locker = PostgresLocker(dsn, application_name=name, **opts)
    scheduler = Scheduler(locker=locker)
    running = 0
    peak = 0

    async def hold() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.8)
        running -= 1

    for i in range(jobs):
        scheduler.add_job(hold, every(1), name=f"conn-{os.getpid()}-{i}")
    monitor = await asyncpg.connect(dsn)
    most = 0
    try:
        async with locker, scheduler:
            deadline = time.time() + 3.2
            while time.time() < deadline:
                count = await monitor.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
                )
                most = max(most, int(count))
                await asyncio.sleep(0.05)
    finally:
        await monitor.close()
    return {"jobs": jobs, "peak_running": peak, "server_connections": most}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    schema = f"cronlock_bench_{os.getpid()}"
    admin = await asyncpg.connect(args.dsn)
    await admin.execute(f"CREATE SCHEMA {schema}")
    result: dict[str, Any] = {}
    try:
        for label, opts in (("lock", {"ledger": False}), ("ledger", {"schema": schema})):
            out: dict[str, Any] = {}
            out.update(await latency(args.dsn, args.runs, **opts))
            out.update(await round_trips(args.dsn, min(args.runs, 500), **opts))
            out["connections"] = [await connections(args.dsn, n, **opts) for n in (50, 500)]
            result[label] = out
    finally:
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
