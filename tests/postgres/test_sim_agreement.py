"""The simulated server kept honest at the level of a whole run: a scenario of the
simulation, run by replicas against the real PostgreSQL server in real time, gives the same
fates as it does in the simulation (the oracle's verdict: the rules broken, or none).

The replicas are the same as the simulation's (the real ``Scheduler`` and ``PostgresLocker``,
the same jobs writing the same effects), in one process on the real clock; a fault is made
for real (the ledger table locked by another session). The statements one by one are kept
honest by ``tests/sim/test_statements_*.py``; this runs them together, with their timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from cronlock import RunContext, Scheduler, every
from cronlock._sim.fleet import Effect, JobSpec, Said
from cronlock._sim.oracle import judge
from cronlock._sim.run import WARMUP, Mode, Plan, run_plan, views_of
from cronlock._sim.scenarios import scenario
from cronlock.postgres import PostgresLocker
from cronlock.postgres._sql.tables import LedgerTable

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


class _Heard(logging.Handler):
    def __init__(self, said: list[Said], t0: float, who: dict[int, str]) -> None:
        super().__init__(logging.WARNING)
        self._said, self._t0, self._who = said, t0, who

    def emit(self, record: logging.LogRecord) -> None:
        task = asyncio.current_task() if _loop_running() else None
        where = self._who.get(id(task), "?") if task is not None else "?"
        self._said.append(Said(where, time.monotonic() - self._t0, record))


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def run_for_real(plan: Plan, dsn: str) -> tuple[list[str], int]:
    """Run *plan* against the server at *dsn* in real time; the rules its verdict breaks
    and the number of slots judged."""
    table = f"agree_{uuid.uuid4().hex[:8]}"
    effects: list[Effect] = []
    said: list[Said] = []
    # Start on a whole second, so that a fault "at 8.5 s" falls mid-slot, as simulated.
    await asyncio.sleep(1.0 - time.time() % 1.0)
    epoch = datetime.fromtimestamp(round(time.time()), UTC)
    t0 = time.monotonic() - (time.time() - epoch.timestamp())
    stops = [asyncio.Event() for _ in range(plan.replicas)]
    who: dict[int, str] = {}
    heard = _Heard(said, t0, who)
    logging.getLogger("cronlock").addHandler(heard)

    def body(spec: JobSpec, name: str) -> Any:
        async def run(ctx: RunContext) -> None:
            effects.append(
                Effect("start", spec.name, ctx.slot, ctx.attempt, name, time.monotonic() - t0)
            )
            try:
                await asyncio.sleep(spec.body)
            finally:
                effects.append(
                    Effect("end", spec.name, ctx.slot, ctx.attempt, name, time.monotonic() - t0)
                )

        return run

    async def replica(i: int) -> None:
        name = f"r{i}"
        task = asyncio.current_task()
        assert task is not None
        who[id(task)] = name
        locker = PostgresLocker(dsn, mode=plan.mode, table=table, application_name=f"agree:{name}")
        scheduler = Scheduler(locker=locker)
        for spec in plan.jobs:
            kind, _, value = spec.schedule.partition(":")
            assert kind == "every"
            scheduler.add_job(body(spec, name), every(float(value)), name=spec.name, **spec.options)
        scheduler.subscribe(lambda e: said.append(Said(name, time.monotonic() - t0, e)))
        async with scheduler:
            await stops[i].wait()

    async def table_lock(at: float, seconds: float) -> None:
        await asyncio.sleep(at - (time.monotonic() - t0))
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await conn.execute(f"LOCK TABLE {LedgerTable(table).runs} IN ACCESS EXCLUSIVE MODE")
                await asyncio.sleep(seconds)
        finally:
            await conn.close()

    tasks = [asyncio.create_task(replica(i)) for i in range(plan.replicas)]
    faults = []
    for fault in plan.faults:
        assert fault.kind == "table_lock", f"not made for real here: {fault.kind}"
        faults.append(asyncio.create_task(table_lock(fault.at, fault.seconds)))
    try:
        await asyncio.sleep(plan.seconds + plan.quiet - (time.monotonic() - t0))
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks, *faults, return_exceptions=True)
        logging.getLogger("cronlock").removeHandler(heard)
    conn = await asyncpg.connect(dsn)
    try:
        ledger = [dict(r) for r in await conn.fetch(f"SELECT * FROM {LedgerTable(table).runs}")]
        for suffix in ("", "_jobs", "_control", "_leases", "_members", "_secrets"):
            await conn.execute(f'DROP TABLE IF EXISTS "{table}{suffix}" CASCADE')
        for suffix in ("_definitions", "_schedules"):
            await conn.execute(f'DROP TABLE IF EXISTS "{table}{suffix}" CASCADE')
    finally:
        await conn.close()
    judged = judge(
        jobs=views_of(plan.jobs),
        epoch=epoch,
        window=(WARMUP, plan.seconds + min(plan.quiet, 10.0)),
        settled=time.monotonic() - t0,
        effects=effects,
        said=said,
        ledger=ledger,
        disruptions=[f.window() for f in plan.faults],
        gone={},
    )
    return sorted({v.rule for v in judged.violations}), judged.slots


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_quiet_run_agrees(pg_dsn: str, mode: Mode) -> None:
    """Claims, finishes, leases, notes: every slot once, in the simulation and for real."""
    plan = replace(scenario("table-lock", mode), faults=(), seconds=10.0, quiet=3.0)
    simulated = sorted({v.rule for v in run_plan(plan).judged.violations})
    real, slots = await run_for_real(plan, pg_dsn)
    assert slots > 30
    assert real == simulated == []


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_table_lock_agrees(pg_dsn: str, mode: Mode) -> None:
    """The ledger locked by another session for 10 s: every slot due meanwhile runs late or
    is told coalesced into one that ran (finding E2, fixed), both in the simulation and on
    the real server; and the fates agree."""
    plan = replace(scenario("table-lock", mode), quiet=6.0, seconds=24.0)
    simulated = sorted({v.rule for v in run_plan(plan).judged.violations})
    real, slots = await run_for_real(plan, pg_dsn)
    assert slots > 80
    assert simulated == [], f"simulation: {simulated}"
    # On the real server a claim stuck behind the lock may be answered late, after the
    # slots due meanwhile were told coalesced into a later one; that claim's run then holds
    # the job while the later slot is due, and the later slot is skipped (E6's kin, listed
    # for table locks in KNOWN_BY_KIND; seen under CI's load, 2026-12-07): 'late' is the
    # one rule it may break. Nothing silent, unfinished, twice or overlapping.
    assert set(real) <= {"late"}, f"real server: {real}, simulation: {simulated}"


_ = contextlib
