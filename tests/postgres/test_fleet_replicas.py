"""Fleet control with three real replica processes and an observer that never runs the job.

Pause stops the job on every replica within one slot, resume restarts it, a trigger runs
it once fleet-wide (even while paused); the observer (a replica that never leads, so never
runs it) reports the fleet's last success in its metrics, and once the replicas are gone
the job is overdue: the gauge flips and ``status --check`` exits 1 naming it.
"""

from __future__ import annotations

import subprocess
import uuid
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cronlock import Scheduler, every
from cronlock.postgres import FleetControl, PostgresLocker
from cronlock.postgres._locker import fleetwatch as _control
from cronlock.prometheus import instrument

from ..eventually import eventually
from .conftest import Coordination
from .processes import Processes
from .test_cli_pg import cli_here

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPLICA = Path(__file__).with_name("fleet_replica.py")
INTERVAL = 1.0


class NeverLeader:
    """An elector that never lets this replica run a coordinated job."""

    async def is_leader(self) -> bool:
        return False


class Replicas(Processes):
    """Three replica processes and the JSON lines they printed."""

    def __init__(self) -> None:
        super().__init__(REPLICA)

    async def start(self, dsn: str, table: str, n: int, *extra: str) -> None:
        for rid in range(1, n + 1):
            await self.spawn(
                "--dsn", dsn, "--table", table, *extra, "--id", str(rid),
                "--interval", str(INTERVAL),
            )  # fmt: skip

    def starts(self, after: float = float("-inf")) -> list[dict[str, Any]]:
        return [x for x in self.lines if x["event"] == "start" and x["slot"] > after]

    def paused_skips(self, rid: int) -> int:
        return sum(
            1
            for x in self.lines
            if x["event"] == "skipped" and x["reason"] == "paused" and x["replica"] == rid
        )


async def test_pause_resume_trigger_across_three_replicas(
    coordination: Coordination, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In session mode on a direct connection, and in lease mode through PgBouncer: the
    replicas, the observer, FleetControl and the command line all go through it."""
    monkeypatch.setattr(_control, "RUNS_EVERY", 0.5)  # the observer's fleet reads
    table = f"fleet_{uuid.uuid4().hex[:10]}"
    ledger = coordination.table(table)
    dsn, schema, mode = coordination.dsn, coordination.schema, coordination.mode
    where = ("--dsn", dsn, "--table", table, *coordination.schema_args)  # for the command line
    observer = Scheduler(
        locker=PostgresLocker(dsn, table=table, schema=schema, mode=mode),
        elector=NeverLeader(),
    )
    job = observer.add_job(lambda: None, every(INTERVAL), name="pulse", alert_after=3)
    registry = CollectorRegistry()
    instrument(observer, registry)

    def gauge(name: str) -> float | None:
        return registry.get_sample_value(f"cronlock_job_{name}", {"cronlock_job": "pulse"})

    async def server_now() -> float:
        now: datetime = await admin.fetchval("SELECT clock_timestamp()")
        return now.timestamp()

    replicas = Replicas()
    try:
        async with observer, FleetControl(dsn, table=table, schema=schema) as control:
            await replicas.start(dsn, table, 3, *coordination.args)
            await eventually(lambda: len(replicas.starts()) >= 3, "three runs", limit=90)

            # The observer never ran the job, yet reports the fleet's last success.
            ran: datetime = await admin.fetchval(
                f"SELECT max(finished_at) FROM {ledger.runs} WHERE outcome = $1", "succeeded"
            )
            await eventually(
                lambda: (gauge("last_success_timestamp_seconds") or 0) >= ran.timestamp(),
                "the fleet's last success in the observer's gauge",
                limit=90,
            )
            assert job.run_count == 0
            assert gauge("overdue") == 0

            # Pause: no replica starts a slot later than one slot after the pause.
            await control.pause("pulse")
            paused_at = await server_now()
            for rid in (1, 2, 3):
                await eventually(
                    partial(lambda r: replicas.paused_skips(r) >= 2, rid),
                    f"replica {rid} paused",
                    limit=90,
                )
            assert replicas.starts(after=paused_at + INTERVAL) == []
            await eventually(lambda: gauge("paused") == 1, "the paused gauge", limit=90)
            status = await cli_here("status", *where)
            [line] = [x for x in status.stdout.splitlines() if x.startswith("pulse ")]
            assert line.split()[1] == "paused"

            # A trigger runs once fleet-wide, even while paused.
            await control.trigger("pulse")
            triggered: datetime = await admin.fetchval(
                f"SELECT trigger_slot FROM {ledger.control} WHERE job = $1", "pulse"
            )
            slot = triggered.timestamp()
            await eventually(
                lambda: any(x["slot"] == slot for x in replicas.starts()),
                "the triggered run",
                limit=90,
            )
            seen = {rid: replicas.paused_skips(rid) for rid in (1, 2, 3)}
            for rid in (1, 2, 3):  # every replica polled again several times since
                await eventually(
                    partial(lambda r: replicas.paused_skips(r) >= seen[r] + 3, rid),
                    f"replica {rid} polled",
                    limit=90,
                )
            assert [x["slot"] for x in replicas.starts()].count(slot) == 1
            assert replicas.starts(after=paused_at + INTERVAL) == [
                x for x in replicas.starts() if x["slot"] == slot
            ]

            # Resume: the job runs again, every slot once.
            await control.resume("pulse")
            resumed_at = await server_now()
            await eventually(
                lambda: len(replicas.starts(after=resumed_at)) >= 3, "runs again", limit=90
            )
            later = [x["slot"] for x in replicas.starts(after=resumed_at)]
            assert len(later) == len(set(later))
            await eventually(lambda: gauge("paused") == 0, "the paused gauge back to 0", limit=90)
            healthy = await cli_here(
                "status", "--check", "--dsn", dsn, "--table", table, *coordination.schema_args
            )
            assert healthy.returncode == 0, healthy.stdout + healthy.stderr

            # Every replica gone: the job stops; the observer sees it overdue.
            await replicas.stop()
            await eventually(lambda: gauge("overdue") == 1, "the overdue gauge", limit=90)
            assert [j.name for j in observer.overdue()] == ["pulse"]

            async def failing() -> subprocess.CompletedProcess[str] | None:
                check = await cli_here(
                    "status", "--check", "--dsn", dsn, "--table", table, *coordination.schema_args
                )
                return check if check.returncode == 1 else None

            check = await eventually(failing, "status --check fails", limit=90, every=0.5)
            assert "overdue: pulse" in check.stdout, check.stdout + check.stderr
    finally:
        await replicas.stop()
