"""One set of rules for fleet control (real server, issue 23 item 6): FleetControl refuses
a name the ledger does not know as the command line does, a trigger returns something to
wait on for its run's outcome, and a triggered run is marked manual in the ledger, its
history, the command line and the dashboard's API."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

import cronlock.web
from cronlock import JobLookupError, RunRecord, Schedule, Scheduler, daily
from cronlock.postgres import FleetControl, PostgresHold, PostgresLocker, Triggered
from cronlock.postgres._sql.schema import ledger_state, migrate
from cronlock.postgres._sql.tables import LedgerTable
from cronlock.web._model import run_json, run_view

from ..eventually import eventually
from .test_cli_pg import cli

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
TYPO = "unknown job: nightly-typo (did you mean nightly?)"


@pytest.fixture
def table() -> str:
    return f"trig_{uuid.uuid4().hex[:10]}"


def _nightly() -> Schedule:
    return daily("03:00")


async def _noted(pg_dsn: str, table: str, job: str = "nightly") -> None:
    async with PostgresLocker(pg_dsn, table=table) as locker:
        await locker.last_claimed(job)  # creates the ledger
        locker.note_schedule(job, "cron '0 3 * * *'", SLOT)


async def test_fleet_control_refuses_an_unknown_name_as_the_cli_does(
    pg_dsn: str, table: str
) -> None:
    await _noted(pg_dsn, table)
    async with FleetControl(pg_dsn, table=table) as control:
        for verb in (control.pause, control.resume, control.trigger):
            with pytest.raises(JobLookupError) as caught:
                await verb("nightly-typo")
            assert str(caught.value) == TYPO
        assert await control.paused() == frozenset()  # nothing was done
        await control.pause("nightly")  # a noted job is known
        await control.pause("not-yet-deployed", force=True)  # as --force
        assert await control.paused() == {"nightly", "not-yet-deployed"}
    refused = await cli("trigger", "nightly-typo", "--dsn", pg_dsn, "--table", table)
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == TYPO  # the same message, word for word


async def test_a_job_known_only_by_its_runs_is_known(pg_dsn: str, table: str) -> None:
    locker = PostgresLocker(pg_dsn, table=table)
    async with locker, FleetControl(pg_dsn, table=table) as control:
        lease = await locker.acquire("ran-once", SLOT)
        assert isinstance(lease, PostgresHold)
        now = datetime.now(UTC)
        lease.record(RunRecord(SLOT, now, now, "succeeded"))
        await lease.release()
        await control.pause("ran-once")
        assert await control.paused() == {"ran-once"}


async def test_a_trigger_is_waited_for_and_its_run_is_marked_manual(
    pg_dsn: str, table: str
) -> None:
    outcomes = iter([None, ValueError("bad tenant")])

    def task() -> None:
        failure = next(outcomes)
        if failure is not None:
            raise failure

    scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table))
    scheduler.add_job(task, _nightly(), name="nightly")
    async with scheduler, FleetControl(pg_dsn, table=table) as control:
        first = await control.trigger("nightly", force=True)  # the note may not be written yet
        assert isinstance(first, Triggered)
        assert (first.job, first.slot.tzinfo is not None) == ("nightly", True)
        record = await first.wait(timeout=60)
        assert (record.slot, record.outcome, record.manual) == (first.slot, "succeeded", True)
        second = await control.trigger("nightly")
        failed = await second.wait(timeout=60)
        assert (failed.slot, failed.outcome, failed.manual) == (second.slot, "failed", True)
        assert failed.error == "ValueError: bad tenant"
        # A scheduled slot's run is not manual.
        locker = scheduler.get_job("nightly")._wiring.locker
        assert isinstance(locker, PostgresLocker)

        # The failed run's outcome is in the ledger before its hold is dropped here (the
        # release's answer): until then this process's own claim is refused "locked".
        async def claimed() -> PostgresHold | None:
            got = await locker.acquire("nightly", SLOT)
            assert got == "locked" or isinstance(got, PostgresHold), got
            return got if isinstance(got, PostgresHold) else None

        lease = await eventually(claimed, "the failed run's hold dropped, the slot claimed")
        assert isinstance(lease, PostgresHold)
        now = datetime.now(UTC)
        lease.record(RunRecord(SLOT, now, now, "succeeded"))
        await lease.release()
        history = await locker.history("nightly")
        assert [(r.slot, r.manual) for r in history] == [
            (SLOT, False),
            (second.slot, True),
            (first.slot, True),
        ]
    assert [run_json(run_view(r))["manual"] for r in history] == [False, True, True]
    # The dashboard: a "manual" tag on the job's page, "manual" in its JSON API.
    app = cronlock.web.app(pg_dsn, table=table)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as dash:
        page = (await dash.get("/jobs/nightly")).text
        api = (await dash.get("/api/jobs/nightly/runs")).json()
    table_rows = page.split('<tr class="run ')[1:]  # the runs table, newest first
    assert ['class="manual"' in row.split("</tr>")[0] for row in table_rows] == [False, True, True]
    assert [run["manual"] for run in api["runs"]] == [False, True, True]
    shown = await cli("history", "nightly", "--dsn", pg_dsn, "--table", table)
    assert shown.returncode == 0, shown.stderr
    rows = shown.stdout.splitlines()[2:]
    assert "manual" not in rows[0]
    assert "failed (manual)" in rows[1]
    assert "succeeded (manual)" in rows[2]


async def test_a_trigger_replaced_before_any_claim_waits_for_the_run_of_both(
    pg_dsn: str, table: str
) -> None:
    await _noted(pg_dsn, table)
    async with FleetControl(pg_dsn, table=table) as control:
        early = await control.trigger("nightly")  # no replica runs the job yet
        late = await control.trigger("nightly")
        assert late.slot > early.slot
        with pytest.raises(TimeoutError, match=r"'nightly': the run triggered for .* 0.2 s"):
            await early.wait(timeout=0.2)
        scheduler = Scheduler(locker=PostgresLocker(pg_dsn, table=table))
        scheduler.add_job(lambda: None, _nightly(), name="nightly")
        async with scheduler:
            record = await early.wait(timeout=60)
        assert (record.slot, record.outcome, record.manual) == (late.slot, "succeeded", True)


async def test_an_older_ledger_gets_the_manual_column_and_older_claims_still_work(
    pg_dsn: str, admin: Any, table: str
) -> None:
    await _noted(pg_dsn, table)
    schema = pg_dsn.rsplit("search_path=", 1)[1]
    ledger = LedgerTable(table, schema)
    await admin.execute(f"ALTER TABLE {ledger.runs} DROP COLUMN manual")
    assert await ledger_state(admin, ledger) == "old"
    assert await migrate(admin, ledger) == "upgraded"
    assert await migrate(admin, ledger) is None  # idempotent
    assert await ledger_state(admin, ledger) == "current"
    # An older replica's claim names no manual column: the default says scheduled.
    await admin.execute(
        f"INSERT INTO {ledger.runs} (job, slot, host, pid, session) VALUES ($1, $2, 'old', 1, 1)",
        "nightly",
        SLOT,
    )
    assert await admin.fetchval(f"SELECT manual FROM {ledger.runs} WHERE job = 'nightly'") is False
