"""Bulk changes of stored schedules (issue 37, item 4): schedules per second of
``FleetControl.put_schedules`` at 10,000 and 100,000 schedules, against ``add_schedule``
one at a time.

    CRONLOCK_TEST_DSN=postgresql://... python benchmarks/stored_bulk.py [--rounds 3]
        [--sizes 10000,100000] [--one-by-one 500]

Each round works in a ledger of its own in a schema of its own (dropped at the end) and
puts N tenants' schedules: a report a day at the tenant's hour (one of 24) in its zone
(one of 3), its kwargs the tenant and a report kind, a timeout. Timed from the call to its
return (every schedule checked, then one transaction), for each of:

- **put, new**: N schedules not stored (all added, one revision);
- **put, all changed**: the same N with other kwargs (all updated, one revision);
- **put, unchanged**: the same N again (nothing written, no revision);
- **sync, one changed**: ``sync_schedules`` of the N under their prefix with one changed.

And ``add_schedule`` one call at a time (``--one-by-one`` of them, 0: not measured), the
way to fill a ledger before. Prints the median over the rounds of each, in schedules per
second, as JSON. The target: a put of at least 10,000 schedules a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from cronlock import StoredSchedule, cron
from cronlock.postgres import FleetControl
from cronlock.postgres._sql.tables import quote_ident

ZONES = ("UTC", "Europe/Paris", "America/New_York")


def tenants(count: int, *, kind: str = "daily") -> list[StoredSchedule]:
    """*count* tenants' daily reports, at their hour in their zone."""
    return [
        StoredSchedule(
            f"tenant:{i}",
            "report",
            cron(f"0 {i % 24} * * *", tz=ZONES[i % len(ZONES)]),
            kwargs={"tenant": i, "report": kind},
            options={"timeout": 600},
        )
        for i in range(count)
    ]


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    began = time.perf_counter()
    done = await call()
    return time.perf_counter() - began, done


async def one_round(dsn: str, schema: str, size: int, one_by_one: int) -> dict[str, float]:
    """One round of each measure at *size*: schedules per second."""
    table = f"bulk_{uuid.uuid4().hex[:8]}"
    rates: dict[str, float] = {}
    # Room for the one-by-one adds beside 100,000 (the default limit is 100,000 a ledger).
    limit = size + one_by_one
    async with FleetControl(dsn, table=table, schema=schema, max_schedules=limit) as control:
        batch = tenants(size)
        took, done = await timed(lambda: control.put_schedules(batch))
        assert done.added == size, done
        rates["put, new"] = size / took
        changed = tenants(size, kind="weekly")
        took, done = await timed(lambda: control.put_schedules(changed))
        assert done.updated == size, done
        rates["put, all changed"] = size / took
        took, done = await timed(lambda: control.put_schedules(changed))
        assert done.unchanged == size and done.revision is None, done
        rates["put, unchanged"] = size / took
        one_changed = [*changed[:-1], batch[-1]]
        took, done = await timed(lambda: control.sync_schedules("tenant:", one_changed))
        assert done.updated == 1 and done.unchanged == size - 1, done
        rates["sync, one changed"] = size / took
        if one_by_one:
            began = time.perf_counter()
            for stored in tenants(one_by_one):
                await control.add_schedule(
                    f"one:{stored.name}",
                    stored.task,
                    stored.schedule,
                    kwargs=stored.kwargs,
                    **stored.options,
                )
            rates["add_schedule one by one"] = one_by_one / (time.perf_counter() - began)
    return rates


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--one-by-one", type=int, default=500)
    args = parser.parse_args()
    dsn = os.environ.get("CRONLOCK_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"cronlock_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    report: dict[str, dict[str, Any]] = {}
    try:
        await admin.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        for size in (int(text) for text in args.sizes.split(",")):
            rounds = [
                await one_round(dsn, schema, size, args.one_by_one) for _ in range(args.rounds)
            ]
            report[f"{size:,}"] = {
                what: {
                    "per_s": round(statistics.median(r[what] for r in rounds)),
                    "range": [
                        round(min(r[what] for r in rounds)),
                        round(max(r[what] for r in rounds)),
                    ],
                }
                for what in rounds[0]
            }
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        await admin.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
