"""A burst of stored schedules (issue 37, item 5): hundreds of tenants' schedules due at one
instant, run by three real replica processes, in both coordination modes.

Each slot runs exactly once in the fleet, with its kwargs, and no run starts before its
instant, although a crowd of slots claimed ahead is claimed earlier than one slot is
(``cronlock._core.planner``: the crowd opens early so that its claims are answered by the
instant). How late the last one starts is a benchmark's figure (benchmarks/burst.py), not
asserted here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import UTC, datetime

import pytest

from cronlock import StoredSchedule, cron
from cronlock._core.planner import CROWD
from cronlock.postgres import FleetControl

from ..eventually import eventually
from .conftest import Coordination
from .test_stored_replicas import Replicas

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TENANTS = 2 * CROWD + 88  # a crowd on every replica
LEAD = 8.0  # seconds from the put to the instant: the running replicas load them meanwhile


async def test_a_burst_of_stored_schedules_runs_each_slot_once_from_its_instant(
    coordination: Coordination,
) -> None:
    table = f"burst_{uuid.uuid4().hex[:10]}"
    dsn, schema = coordination.dsn, coordination.schema
    replicas = Replicas()
    try:
        async with FleetControl(dsn, table=table, schema=schema) as control:
            # The replicas run first (however slowly a busy machine starts them); the
            # schedules come while they run, and reach them at their next sync.
            common = ("--dsn", dsn, "--table", table, *coordination.args)
            for rid in (1, 2, 3):
                await replicas.start(rid, *common)
            await eventually(lambda: len(replicas.of("ready")) == 3, "three replicas ready")
            instant = datetime.fromtimestamp(int(time.time() + LEAD), UTC)
            # A daily report at the hour (and second) every tenant picked: all the same one.
            when = cron(f"{instant.second} {instant.minute} {instant.hour} * * *", seconds=True)
            tenants = [
                StoredSchedule(f"report:{i}", "report", when, kwargs={"tenant": i})
                for i in range(TENANTS)
            ]
            done = await control.put_schedules(tenants)
            assert done.added == TENANTS
            await eventually(
                lambda: all(len(replicas.jobs(rid)) == TENANTS for rid in (1, 2, 3)),
                "every replica has every tenant's schedule",
            )
            if time.time() > instant.timestamp() - 1:
                pytest.skip("the replicas took too long to load the schedules on this machine")
            await eventually(
                lambda: len(replicas.of("start")) >= TENANTS, "every tenant's slot run"
            )
            await asyncio.sleep(1.5)  # a second run of any slot would show by now
    finally:
        await replicas.stop()
    starts = [x for x in replicas.of("start") if x["slot"] == instant.timestamp()]
    assert len(starts) == len(replicas.of("start"))  # the instant's slots alone
    runs = Counter(x["tenant"] for x in starts)
    assert set(runs) == set(range(TENANTS))  # none missed, with its own kwargs
    assert max(runs.values()) == 1, [t for t, n in runs.items() if n > 1]  # none twice
    assert {x["job"] for x in starts} == {f"report:{i}" for i in range(TENANTS)}
    early = [x for x in starts if x["t"] < instant.timestamp()]
    assert not early, early[:5]  # claimed ahead, started on the instant
