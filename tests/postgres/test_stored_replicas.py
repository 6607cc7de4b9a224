"""Stored schedules across three real replica processes, changed while they run by the
command line's verbs (``schedules add|update|remove``, through FleetControl, called here);
in both coordination modes.

Added, changed and removed schedules are picked up within the bound (the default sync,
every 2 s), each slot runs once in the fleet with its kwargs, a changed schedule runs its
new slots only, a removed one falls silent; a replica without the task rejects it and
the others run it; a schedule whose kwargs do not fit runs nowhere and says so in
``schedules list``; one whose task no replica has fails ``status --check`` (rejected
everywhere once every replica is a live member, overdue before).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cronlock import every
from cronlock.postgres import FleetControl
from cronlock.postgres._locker.servertime import DEFAULT_AHEAD

from ..eventually import eventually
from .conftest import Coordination
from .processes import Processes
from .test_cli_pg import cli_here

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPLICA = Path(__file__).with_name("stored_replica.py")
PICK_UP = 5.0  # the bound a replica with the default sync_every picks a change up within


class Replicas(Processes):
    """Replica processes (``stored_replica.py``) and the JSON lines they printed."""

    def __init__(self) -> None:
        super().__init__(REPLICA)

    async def start(self, rid: int, *args: str) -> None:
        await self.spawn("--id", str(rid), "--sync", "2", *args)

    def of(self, event: str, rid: int | None = None) -> list[dict[str, Any]]:
        return [
            x for x in self.lines if x["event"] == event and (rid is None or x["replica"] == rid)
        ]

    def jobs(self, rid: int) -> dict[str, str]:
        """Replica *rid*'s stored jobs and their schedules, as last printed."""
        seen = self.of("jobs", rid)
        return seen[-1]["names"] if seen else {}

    async def seen(self, rid: int, check: Callable[[dict[str, str]], bool], since: float) -> float:
        """How long after *since* replica *rid* first printed jobs that pass *check*."""

        def found() -> float | None:
            seen = self.of("jobs", rid)
            return next((x["at"] for x in seen if x["at"] >= since and check(x["names"])), None)

        await eventually(lambda: found() is not None, f"replica {rid} picks the change up")
        at = found()
        assert at is not None
        return at - since


async def test_add_update_remove_while_three_replicas_run(
    coordination: Coordination, admin: Any
) -> None:
    table = f"stored_{uuid.uuid4().hex[:10]}"
    dsn, schema = coordination.dsn, coordination.schema
    ledger = coordination.table(table)
    where = ("--dsn", dsn, "--table", table, *coordination.schema_args)
    replicas = Replicas()
    latencies: list[float] = []
    try:
        async with FleetControl(dsn, table=table, schema=schema) as control:
            common = ("--dsn", dsn, "--table", table, *coordination.args)
            for rid in (1, 2):
                await replicas.start(rid, *common)
            await replicas.start(3, *common, "--without", "report")
            await eventually(lambda: len(replicas.of("ready")) == 3, "three replicas ready")

            async def change(*args: str) -> float:
                """Run ``schedules ARGS`` (the command line's own verb); when the server made the
                change (its row's ``updated_at``, a removal's tombstone's too): no replica
                can have seen it before."""
                done = await cli_here("schedules", *args, *where)
                assert done.returncode == 0, done.stderr
                made: datetime = await admin.fetchval(
                    f"SELECT updated_at FROM {ledger.schedules} WHERE name = $1", args[1]
                )
                return made.timestamp()

            def ran(job: str) -> list[float]:
                """The slots of *job* started in the fleet so far."""
                return [x["slot"] for x in replicas.of("start") if x["job"] == job]

            added = await change(
                "add", "r:1", "report", "--every", "1", "--kwargs", '{"tenant": 1}'
            )
            await change("add", "r:2", "report", "--every", "1", "--kwargs", '{"tenant": 2}')
            await change(
                "add", "bad", "report", *("--every", "1", "--option", "alert_after=1"),
                *("--kwargs", '{"tenant": 3, "x": 1}'),
            )  # fmt: skip
            await change("add", "orphan", "missing", "--every", "1", "--option", "alert_after=1")
            both = {"r:1", "r:2"}
            for rid in (1, 2):
                latencies.append(await replicas.seen(rid, lambda n: set(n) == both, added))
            await eventually(
                lambda: (
                    {x["schedule"] for x in replicas.of("rejected", 3)}
                    == {"r:1", "r:2", "bad", "orphan"}
                ),
                "replica 3 rejects what it has no task for",
            )
            await eventually(lambda: ran("r:1") and ran("r:2"), "r:1 and r:2 run")

            updated = await change("update", "r:1", "--every", "2")
            for rid in (1, 2):
                latency = await replicas.seen(rid, lambda n: n.get("r:1") == "every 2s", updated)
                latencies.append(latency)
            changed_by = max(latencies[-2:]) + updated
            await eventually(
                lambda: len([t for t in ran("r:1") if t > changed_by + DEFAULT_AHEAD]) >= 2,
                "two slots of r:1 since the change",
            )

            removed = await change("remove", "r:2")
            for rid in (1, 2):
                latencies.append(await replicas.seen(rid, lambda n: "r:2" not in n, removed))
            gone_by = max(latencies[-2:]) + removed
            # r:1 started a slot 3 s past it: r:2's two or three slots since would have
            # started a second before, had it not been removed.
            await eventually(
                lambda: [t for t in ran("r:1") if t >= gone_by + DEFAULT_AHEAD + 3],
                "r:1 runs on past two slots of r:2 since its removal",
            )

            # A replica's blame counts once it is a live member (its first heartbeat comes
            # up to MEMBERS_EVERY after its start).
            async def members() -> bool:
                live: int = await admin.fetchval(
                    f"SELECT count(*) FROM {ledger.members} WHERE expires_at > clock_timestamp()"
                )
                return live == 3

            await eventually(members, "every replica a live member")
            listed = {s.name: s for s in await control.schedules()}
            status = await cli_here("status", "--check", *where)
            shown = await cli_here("schedules", "list", *where)
    finally:
        await replicas.stop()

    print(f"pick-up latencies (s): {sorted(round(x, 3) for x in latencies)}")
    assert all(0 <= x <= PICK_UP for x in latencies), latencies
    starts = replicas.of("start")
    runs = Counter((x["job"], x["slot"]) for x in starts)
    assert runs and max(runs.values()) == 1, [k for k, n in runs.items() if n > 1]  # once each
    assert {x["tenant"] for x in starts if x["job"] == "r:1"} == {1}  # kwargs delivered
    assert {x["tenant"] for x in starts if x["job"] == "r:2"} == {2}
    assert not [x for x in starts if x["replica"] == 3]  # it has no task 'report'
    assert not [x for x in starts if x["job"] in ("bad", "orphan")]
    # A slot claimed before a change reached the replica goes on as a run in flight; its
    # claim went out at most claim_ahead before the slot.
    new = [
        x["slot"] for x in starts if x["job"] == "r:1" and x["slot"] > changed_by + DEFAULT_AHEAD
    ]
    assert len(new) >= 2 and all(slot % 2 == 0 for slot in new)  # the new slots only
    # Silent once removed (but for a run in flight, as above).
    late = [x for x in starts if x["job"] == "r:2" and x["slot"] > gone_by + DEFAULT_AHEAD]
    assert not late, (gone_by, late)
    assert "r:2" not in listed and set(listed) == {"r:1", "bad", "orphan"}
    # Each replica's problem with it: replicas 1 and 2 refuse the kwargs, 3 lacks the task.
    bad = listed["bad"].problems
    assert len(bad) == 3 and sum("'x'" in reason for reason in bad.values()) == 2, bad
    assert listed["orphan"].problem is not None and "no task 'missing'" in listed["orphan"].problem
    # Replica 3 still has no task 'report': the operator sees it (a deploy half done).
    assert listed["r:1"].problem is not None and "no task 'report'" in listed["r:1"].problem
    assert status.returncode == 1 and "orphan" in status.stdout.splitlines()[-1], status.stdout
    assert "bad" in status.stdout.splitlines()[-1]  # no replica runs it either
    assert "stored schedule orphan (revision 4): no task 'missing'" in status.stdout
    assert "no task 'missing'" in shown.stdout


async def test_a_failing_schedule_is_tried_one_plus_retries_times_per_slot_in_the_fleet(
    coordination: Coordination,
) -> None:
    table = f"retry_{uuid.uuid4().hex[:10]}"
    dsn, schema = coordination.dsn, coordination.schema
    where = ("--dsn", dsn, "--table", table, *coordination.schema_args)
    replicas = Replicas()
    try:
        async with FleetControl(dsn, table=table, schema=schema) as control:
            await control.add_schedule("flaky", "flaky", every(4), retries=2, retry_delay=0.4)
            common = ("--dsn", dsn, "--table", table, *coordination.args)
            for rid in (1, 2, 3):
                await replicas.start(rid, *common)
            await eventually(lambda: len(replicas.of("ready")) == 3, "three replicas ready")
            await eventually(
                lambda: len({x["slot"] for x in replicas.of("start")}) >= 4, "four slots tried"
            )
            history = await cli_here("history", "flaky", "-n", "5", *where)
    finally:
        await replicas.stop()
    tries = Counter(x["slot"] for x in replicas.of("start"))
    done = sorted(tries)[:-1]  # the last slot may still be retrying
    assert len(done) >= 3
    assert [tries[slot] for slot in done] == [3] * len(done), tries  # 1 + 2, fleet-wide
    assert "failed (attempt 3)" in history.stdout, history.stdout
