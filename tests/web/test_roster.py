"""The job list's roster (every job at a glance, a few probes a job) judges every job as the
job's own row does (its latest runs read in full): the same jobs, the same statuses, for
every shape a ledger takes (jobs with runs and no note anywhere among the noted ones, runs
in progress, failures, overdue jobs with and without a success since, odd rows)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from cronlock.postgres._ops.fleet import Status, job_status, read_jobs, read_paused, server_now
from cronlock.postgres._ops.roster import read_roster
from cronlock.postgres._sql.tables import LedgerTable

from .seed import Run, drop_ledger, seed, set_graces, table_name

pytestmark = pytest.mark.postgres

NOW = datetime.now(UTC).replace(microsecond=0)
HOUR = timedelta(hours=1)
SECOND = timedelta(seconds=1)


async def judged(dsn: str, ledger: LedgerTable) -> tuple[dict[str, Status], dict[str, Status]]:
    """Each job's status by the roster, and by its row read in full (job_status)."""
    conn: Any = await asyncpg.connect(dsn)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            await conn.execute("SET LOCAL jit = off")
            paused = await read_paused(conn, ledger)
            now = await server_now(conn)
            roster = await read_roster(conn, ledger, paused, now)
            full = await read_jobs(conn, ledger)
    finally:
        await conn.close()
    by_roster = roster.statuses
    by_row = {job.name: job_status(job, now, paused=job.name in paused) for job in full}
    return by_roster, by_row


@pytest.fixture
async def ledgers(pg_dsn: str) -> AsyncIterator[list[str]]:
    made: list[str] = []
    yield made
    for table in made:
        await drop_ledger(pg_dsn, table)


def runs_of(job: str, *outcomes: str | None, last: datetime = NOW) -> list[Run]:
    """Runs of *job* an hour apart, the last one's slot at *last*, oldest first."""
    start = last - HOUR * (len(outcomes) - 1)
    return [Run(job, start + HOUR * i, outcome) for i, outcome in enumerate(outcomes)]


async def test_the_roster_judges_every_job_as_its_row_does(pg_dsn: str, ledgers: list[str]) -> None:
    table = table_name()
    ledgers.append(table)
    noted = ["b-ok", "c-failing", "d-running", "e-overdue", "e-overdue-failed", "f-caught-up"]
    noted += ["g-new", "h-paused", "h-paused-ok", "i-odd", "j-no-outcome", "k-slot-infinity"]
    noted += ["d-running-ok"]  # its latest run succeeded, a replica holds its lock now
    # A fleet killed between a success and its next note: the note names the slot that ran.
    noted += ["l-killed", "l-killed-no-spec"]
    ran = datetime.now(UTC).replace(microsecond=0) - 65 * SECOND  # (NOW is the module's)
    runs = [
        *runs_of("a-before-every-note", "succeeded"),
        *runs_of("b-ok", "failed", "succeeded"),
        *runs_of("b-ok-between", "failed"),  # no note, between two noted jobs
        *runs_of("b-ok-between-2", "succeeded"),
        *runs_of("c-failing", "succeeded", "failed"),
        *runs_of("d-running", "succeeded", None),
        *runs_of("e-overdue", "succeeded", last=NOW - 3 * HOUR),
        *runs_of("e-overdue-failed", "succeeded", "failed", last=NOW - HOUR),
        *runs_of("f-caught-up", "succeeded", "failed", last=NOW),
        *runs_of("d-running-ok", "failed", "succeeded"),
        *runs_of("h-paused", "failed"),
        *runs_of("h-paused-ok", "succeeded"),
        *runs_of("k-slot-infinity", "succeeded"),
        *runs_of("l-killed", "succeeded", last=ran),
        *runs_of("l-killed-no-spec", "succeeded", last=ran),
        *runs_of("zz-after-every-note", "failed", "succeeded"),
    ]
    ledger = await seed(pg_dsn, table, [(job, "every 1h", NOW + HOUR) for job in noted], runs)
    conn: Any = await asyncpg.connect(pg_dsn)
    try:
        await set_graces(
            conn,
            ledger,
            {
                "e-overdue": (60.0, NOW - 2 * HOUR),
                # Its success is older than the slot it is due by, its latest run failed.
                "e-overdue-failed": (60.0, NOW - 90 * timedelta(minutes=1)),
                # Its success is the slot it is due by: failing, not overdue.
                "f-caught-up": (60.0, NOW - HOUR),
                "b-ok": (60.0, NOW + HOUR),
            },
        )
        # Every minute, its last success 65 s ago, noted as its next slot (not absent
        # yet: that takes 90 s); a grace of 2 s: the slot after it is 3 s overdue.
        every_minute = (
            '{"schedule": {"kind": "every", "micros": 60000000, "anchor": '
            f'"{ran.isoformat()}"}}, "jitter": null, "misfire_grace": 60.0, '
            '"start_at": null, "stop_at": null}'
        )
        for job in ("l-killed", "l-killed-no-spec"):
            await conn.execute(
                f"UPDATE {ledger.jobs} SET grace = 2, due = $2, next_run = $2, "
                "spec = CASE WHEN job = 'l-killed' THEN $3::jsonb END WHERE job = $1",
                job,
                ran,
                every_minute,
            )
        await conn.execute(
            f"INSERT INTO {ledger.control} (job, paused_at) VALUES ('h-paused', now()), "
            "('h-paused-ok', now())"
        )
        # A run whose end Python cannot hold is skipped (the job never ran, as far as
        # anyone can read), and one released without an outcome is not a success.
        await conn.execute(
            f"""INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at,
                                           outcome) VALUES
                ('i-odd', now(), 'h', 1, now(), 'infinity', 'succeeded'),
                ('k-slot-infinity', 'infinity', 'h', 1, now(), now(), 'failed'),
                ('j-no-outcome', now(), 'h', 1, now(), now(), NULL)"""
        )
        # Someone holds d-running's and d-running-ok's locks (namespaced keys) right now.
        holder: Any = await asyncpg.connect(pg_dsn)
        try:
            for job in ("d-running", "d-running-ok"):
                assert await holder.fetchval(
                    "SELECT pg_try_advisory_lock($1)", ledger.lock_key(job)
                )
            by_roster, by_row = await judged(pg_dsn, ledger)
        finally:
            await holder.close()
    finally:
        await conn.close()
    assert by_roster == by_row
    assert by_roster == {
        "a-before-every-note": "ok",
        "b-ok": "ok",
        "b-ok-between": "failing",
        "b-ok-between-2": "ok",
        "c-failing": "failing",
        "d-running": "running",
        "d-running-ok": "running",
        "e-overdue": "overdue",
        "e-overdue-failed": "overdue",
        "f-caught-up": "failing",
        "g-new": "new",
        "h-paused": "paused",
        "h-paused-ok": "paused",
        "i-odd": "new",
        "j-no-outcome": "failing",
        "k-slot-infinity": "ok",  # a slot Python cannot hold is no latest run
        "l-killed": "overdue",  # its slot after the success (rebuilt from its spec) passed
        "l-killed-no-spec": "ok",  # nothing to rebuild it from: absent says it, 25 s later
        "zz-after-every-note": "ok",
    }


@pytest.mark.parametrize("notes", [[], ["m-noted"]])
async def test_jobs_with_runs_and_no_note_are_all_found(
    pg_dsn: str, ledgers: list[str], notes: list[str]
) -> None:
    table = table_name()
    ledgers.append(table)
    names = [f"job-{i:03d}" for i in range(0, 60, 3)] + ["zzz"]
    runs = [run for name in names for run in runs_of(name, "succeeded")]
    ledger = await seed(pg_dsn, table, [(job, "every 1h", None) for job in notes], runs)
    by_roster, by_row = await judged(pg_dsn, ledger)
    assert by_roster == by_row
    assert sorted(by_roster) == sorted(names + notes)
