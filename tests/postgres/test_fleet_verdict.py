"""The fleet's verdict from the ledger alone, with real replica processes (issue 36).

- A fleet that is gone is never ``ok``: its job turns ``absent`` or ``overdue`` and
  ``status --check`` fails, and the dashboard's summary says the same. Whenever in a slot's
  period the fleet stopped (gracefully) or was killed, in both modes, runs in the
  simulation (``tests/sim/test_fleet_gone.py``, the verb's own code read on a virtual
  clock); here, a real replica killed with SIGKILL, in both modes (the server ends a
  killed session's locks; a lease is left to expire). (Before, a lease-mode fleet read
  ``ok`` forever.)
- A job a deploy removed is ``absent`` while the rest of the fleet runs; ``retire`` takes it
  out of ``status`` (a job still run is refused), and a replica that has it again brings it
  back.
- A schedule added at runtime is not overdue before its first slot, and is once it missed
  one.

Each replica is a process of its own (verdict_replica.py); the tests wait for states with
a liveness bound, never for a time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from cronlock import every
from cronlock.postgres import FleetControl
from cronlock.postgres._locker.upkeep import NOTE_EVERY
from cronlock.postgres._modes.base import Mode
from cronlock.postgres._ops.fleet import Status, job_status, read_jobs, read_paused, server_now
from cronlock.postgres._ops.roster import read_roster
from cronlock.postgres._sql.fleet import ABSENT_AFTER
from cronlock.postgres._sql.tables import LedgerTable

from ..eventually import eventually
from .test_cli_pg import cli_here

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

MODES: list[Mode] = ["session", "lease"]
REPLICA = Path(__file__).with_name("verdict_replica.py")


class Replica:
    """One replica process; stopped (SIGTERM) or killed (SIGKILL) by the test."""

    def __init__(self, dsn: str, table: str, mode: Mode, *args: str) -> None:
        command = [sys.executable, str(REPLICA), "--dsn", dsn, "--table", table, "--mode", mode]
        self.process = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    async def started(self) -> None:
        line = await asyncio.to_thread(self.process.stdout.readline)  # type: ignore[union-attr]
        assert line.strip() == "running", self.process.stderr.read()  # type: ignore[union-attr]

    async def stop(self, how: str = "graceful") -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM if how == "graceful" else signal.SIGKILL)
        await asyncio.to_thread(self.process.wait, 60)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(60)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        yield started
    finally:
        for replica in started:
            replica.close()


async def state(dsn: str, table: str, job: str) -> Status | None:
    """*job*'s state as ``status`` and the dashboard judge it now (``None``: not listed)."""
    conn = await asyncpg.connect(dsn)
    try:
        ledger = LedgerTable(table)
        found = await read_jobs(conn, ledger, [job])
        if not found:
            return None
        paused = await read_paused(conn, ledger)
        return job_status(found[0], await server_now(conn), paused=job in paused)
    finally:
        await conn.close()


async def roster(dsn: str, table: str) -> dict[str, Status]:
    """Every job's state as the dashboard's summary judges it."""
    conn = await asyncpg.connect(dsn)
    try:
        ledger = LedgerTable(table)
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            paused = await read_paused(conn, ledger)
            return (await read_roster(conn, ledger, paused, await server_now(conn))).statuses
    finally:
        await conn.close()


async def becomes(dsn: str, table: str, job: str, wanted: set[Status | None]) -> Status | None:
    """Wait until *job*'s state is one of *wanted*; return it (a liveness bound only)."""
    seen: list[Status | None] = []

    async def reached() -> tuple[Status | None] | None:
        seen.append(await state(dsn, table, job))
        return (seen[-1],) if seen[-1] in wanted else None

    try:
        [found] = await eventually(reached, f"{job} one of {wanted}", 180, every=0.5)
    except pytest.fail.Exception:
        conn = await asyncpg.connect(dsn)
        try:  # what the verdict was made of, for the failure's message
            jobs = await read_jobs(conn, LedgerTable(table), [job])
            now = await server_now(conn)
        finally:
            await conn.close()
        raise AssertionError(
            f"{job}: still {seen[-1]!r}, never one of {wanted}: {jobs} at {now}"
        ) from None
    return found


async def succeeded(dsn: str, table: str, job: str) -> datetime:
    """Wait until *job* has a success in the ledger; return the latest one's slot."""
    conn = await asyncpg.connect(dsn)

    async def latest() -> datetime | None:
        try:
            slot: datetime | None = await conn.fetchval(
                f'SELECT max(slot) FROM "{table}" WHERE job = $1 AND outcome = $2',
                job,
                "succeeded",
            )
        except asyncpg.UndefinedTableError:
            return None
        return slot

    try:
        return await eventually(latest, f"a success of {job}", 120, every=0.1)
    finally:
        await conn.close()


async def aged(dsn: str, table: str, job: str) -> None:
    """Move *job*'s note in the ledger back past ``ABSENT_AFTER``, as it stands once that
    long has passed without a replica noting the job again (what the tests would otherwise
    wait 90 s for); a replica that still runs the job notes it afresh within seconds, which
    :func:`stays` then sees."""
    conn = await asyncpg.connect(dsn)
    try:
        back = f"interval '{ABSENT_AFTER + 10:g} seconds'"
        await conn.execute(
            f"UPDATE {LedgerTable(table).jobs} SET next_run = next_run - {back}, "
            f"updated_at = updated_at - {back}, due = due - {back} WHERE job = $1",
            job,
        )
    finally:
        await conn.close()


async def stays(dsn: str, table: str, job: str, wanted: Status) -> None:
    """*job*'s state is *wanted* now and still is once every live replica has noted its
    jobs again (``NOTE_EVERY`` and a second)."""
    assert await state(dsn, table, job) == wanted
    await asyncio.sleep(NOTE_EVERY + 1)
    assert await state(dsn, table, job) == wanted


async def noted(dsn: str, table: str, job: str) -> None:
    """Wait until a replica noted *job*'s schedule in the ledger."""
    conn = await asyncpg.connect(dsn)

    async def schedule() -> bool:
        found = await read_jobs(conn, LedgerTable(table), [job])
        return bool(found) and found[0].schedule is not None

    try:
        await eventually(schedule, f"{job}'s schedule noted", every=0.1)
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", MODES)
async def test_a_fleet_that_is_gone_is_never_ok(
    mode: Mode, pg_dsn: str, replicas: list[Replica]
) -> None:
    period = 2.0
    table = f"gone_{uuid.uuid4().hex[:8]}"
    replica = Replica(pg_dsn, table, mode, "--job", f"beat={period}")
    replicas.append(replica)
    await replica.started()
    await succeeded(pg_dsn, table, "beat")
    # A job the ledger has no note of cannot be judged (its replica notes it within 30 s).
    await noted(pg_dsn, table, "beat")
    await replica.stop("kill")
    assert await becomes(pg_dsn, table, "beat", {"absent", "overdue"}) in {"absent", "overdue"}
    # The health check fails, naming the job.
    check = await cli_here("status", "--check", "--dsn", pg_dsn, "--table", table)
    assert check.returncode == 1, check.stdout + check.stderr
    assert any(line.endswith(": beat") for line in check.stdout.splitlines()), check.stdout
    allowed = await cli_here(
        "status", "--check", "--allow-absent", "--dsn", pg_dsn, "--table", table
    )
    if "absent: beat" in check.stdout:  # an absent job passes --allow-absent
        assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    # A gone fleet stays judged so: the dashboard's summary says the same.
    assert (await roster(pg_dsn, table))["beat"] in {"absent", "overdue"}


async def test_a_job_a_deploy_removed_is_absent_until_retired(
    pg_dsn: str, replicas: list[Replica]
) -> None:
    # One mode: what a job's note says and how status and retire judge it are the same
    # statements in both; the modes' difference (a lock or a lease held) is the gone test's.
    mode: Mode = "session"
    table = f"deploy_{uuid.uuid4().hex[:8]}"
    old = Replica(pg_dsn, table, mode, "--job", "keep=1", "--job", "dropped=1")
    replicas.append(old)
    await old.started()
    await succeeded(pg_dsn, table, "dropped")
    new = Replica(pg_dsn, table, mode, "--job", "keep=1")  # the deploy: without 'dropped'
    replicas.append(new)
    await new.started()
    await old.stop()
    await aged(pg_dsn, table, "dropped")  # ABSENT_AFTER since its last note
    await stays(pg_dsn, table, "dropped", "absent")  # the new replica does not note it
    assert await state(pg_dsn, table, "keep") in {"ok", "running"}  # the fleet runs on
    assert (await roster(pg_dsn, table))["dropped"] == "absent"
    check = await cli_here("status", "--check", "--dsn", pg_dsn, "--table", table)
    assert check.returncode == 1 and "absent: dropped" in check.stdout, check.stdout
    # A job a live replica runs is not retired; the absent one is, and leaves status.
    refused = await cli_here("retire", "keep", "--dsn", pg_dsn, "--table", table)
    assert refused.returncode == 1 and "not absent" in refused.stderr, refused.stderr
    retired = await cli_here("retire", "dropped", "--dsn", pg_dsn, "--table", table)
    assert retired.returncode == 0, retired.stderr
    assert await state(pg_dsn, table, "dropped") is None
    assert "dropped" not in await roster(pg_dsn, table)
    check = await cli_here("status", "--check", "--dsn", pg_dsn, "--table", table)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "dropped" not in check.stdout
    # A replica that has it again announces it: it is back.
    back = Replica(pg_dsn, table, mode, "--job", "dropped=1")
    replicas.append(back)
    await back.started()
    assert await becomes(pg_dsn, table, "dropped", {"ok"}) == "ok"


async def test_fleet_control_retires_an_absent_job_only(
    pg_dsn: str, replicas: list[Replica]
) -> None:
    table = f"retire_{uuid.uuid4().hex[:8]}"
    replica = Replica(pg_dsn, table, "session", "--job", "gone=1")
    replicas.append(replica)
    await replica.started()
    await succeeded(pg_dsn, table, "gone")
    async with FleetControl(pg_dsn, table=table) as control:
        with pytest.raises(Exception, match="not absent"):
            await control.retire("gone")
        assert (await control.statuses())["gone"] in {"ok", "running"}
        await replica.stop()
        await aged(pg_dsn, table, "gone")  # ABSENT_AFTER since its last note
        assert await state(pg_dsn, table, "gone") == "absent"
        assert (await control.statuses())["gone"] == "absent"  # the one rule here too
        await control.retire("gone")
        assert "gone" not in await control.statuses()
    assert await state(pg_dsn, table, "gone") is None


async def test_a_schedule_added_at_runtime_is_due_from_its_creation(
    pg_dsn: str, replicas: list[Replica]
) -> None:
    mode: Mode = "session"  # one mode, as for the deploy above
    table = f"added_{uuid.uuid4().hex[:8]}"
    replica = Replica(pg_dsn, table, mode, "--job", "beat=1", "--task", "send-report")
    replicas.append(replica)
    await replica.started()
    await succeeded(pg_dsn, table, "beat")
    # A slot of the schedule passes between the replica's start and the schedule's
    # creation: the slot the replica would count from (its start) is before the schedule
    # existed.
    period = 8
    started = datetime.now(UTC)
    boundary = datetime.fromtimestamp((started.timestamp() // period + 1) * period, UTC)
    await asyncio.sleep((boundary - started).total_seconds() + 1)
    async with FleetControl(pg_dsn, table=table) as control:
        await control.add_schedule("late:1", "send-report", every(period), alert_after=1)
    first = boundary + timedelta(seconds=period)
    # Until its first slot (a period after the last one), never overdue: not even once
    # the replica noted it (it does within a second or two of its sync). The health check
    # first (the command line's verb), then the state until a second before the slot.
    check = await cli_here("status", "--check", "late:1", "--dsn", pg_dsn, "--table", table)
    assert datetime.now(UTC) < first, "the check took the whole period: nothing was shown"
    assert check.returncode == 0, check.stdout + check.stderr
    seen = {await state(pg_dsn, table, "late:1")}
    while datetime.now(UTC) < first - timedelta(seconds=1):
        await asyncio.sleep(0.5)
        seen.add(await state(pg_dsn, table, "late:1"))
    assert seen == {"new"}, seen
    # Its task fails: once its first slot is a grace past, it is overdue.
    assert await becomes(pg_dsn, table, "late:1", {"overdue"}) == "overdue"
