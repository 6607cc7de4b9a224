"""What durable ends cost: a batch of N ends committed at the session's durability against
the same statement with ``synchronous_commit`` off (what cronlock did before 0.x), side by
side in one run, on one server.

Each round claims N slots (session mode's batched claim, or lease mode's) on one
connection and then ends them with the mode's batched end statement, the same text either
way; the only difference is the session's ``synchronous_commit`` (``on``, the server's
default, against ``off``). Only the end is timed. The two settings alternate round by round,
so that the server's noise falls on both.

    python benchmarks/durable_ends.py [--dsn DSN] [--rounds 60] [--sizes 1,10,100]
        [--modes session,lease]

Prints a table (median milliseconds per batch of ends, ends per second) and drops its
schema at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from cronlock.postgres._sql.claims import claim_many_sql, finish_many_sql
from cronlock.postgres._sql.leases import lease_claim_many_sql, lease_finish_many_sql
from cronlock.postgres._sql.schema import migrate
from cronlock.postgres._sql.tables import LedgerTable

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


async def _round(
    conn: asyncpg.Connection, table: LedgerTable, mode: str, n: int, base: datetime
) -> float:
    jobs = [f"bench-{i}" for i in range(n)]
    keys = [hash((mode, i)) & 0x7FFFFFFFFFFF for i in range(n)]
    slots = [base] * n
    if mode == "session":
        rows = await conn.fetch(claim_many_sql(table), keys, jobs, slots, "bench", 1)
    else:
        rows = await conn.fetch(
            lease_claim_many_sql(table), keys, jobs, slots, "bench", 1, "bench:1", 60.0
        )
    assert all(row["started_at"] is not None for row in rows), "a claim was refused"
    args: list[object] = [
        jobs, slots, ["succeeded"] * n, [None] * n, keys, [False] * n, "bench", 1, [None] * n
    ]  # fmt: skip
    sql = finish_many_sql(table)
    if mode == "lease":
        sql = lease_finish_many_sql(table)
        args.append("bench:1")
    began = time.perf_counter()
    await conn.fetch(sql, *args)
    return time.perf_counter() - began


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("CRONLOCK_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--sizes", default="1,10,100")
    parser.add_argument("--modes", default="session,lease")
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",")]
    schema = f"bench_durable_{uuid.uuid4().hex[:8]}"
    table = LedgerTable("cronlock_runs", schema)
    conns = {setting: await asyncpg.connect(opts.dsn) for setting in ("on", "off")}
    try:
        await migrate(conns["on"], table)
        await conns["off"].execute("SET synchronous_commit = off")
        fsync = await conns["on"].fetchval("SHOW fsync")
        durability = await conns["on"].fetchval("SHOW synchronous_commit")
        print(
            f"server {conns['on'].get_server_version()}, fsync {fsync}, "
            f"synchronous_commit: the server's {durability!r} against 'off'"
        )
        base = datetime(2030, 1, 1, tzinfo=UTC)
        print(f"{'mode':8} {'ends':>5} {'durable ms':>11} {'relaxed ms':>11} {'ratio':>6}"
              f" {'durable ends/s':>15} {'relaxed ends/s':>15}")  # fmt: skip
        step = 0
        for mode in opts.modes.split(","):
            for n in sizes:
                took: dict[str, list[float]] = {"on": [], "off": []}
                for r in range(opts.rounds):
                    order = ("on", "off") if r % 2 else ("off", "on")
                    for setting in order:
                        step += 1
                        slot = base + timedelta(seconds=step)
                        took[setting].append(await _round(conns[setting], table, mode, n, slot))
                on, off = (statistics.median(took[s]) for s in ("on", "off"))
                print(
                    f"{mode:8} {n:5d} {on * 1000:11.2f} {off * 1000:11.2f} {on / off:6.1f}"
                    f" {n / on:15.0f} {n / off:15.0f}"
                )
    finally:
        await conns["on"].execute(f"DROP SCHEMA IF EXISTS {table.quoted_schema} CASCADE")
        for conn in conns.values():
            await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
