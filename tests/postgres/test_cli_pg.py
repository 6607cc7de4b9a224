"""``python -m cronlock migrate|status|history`` against the real server.

:func:`cli` runs the command line as users do, in a process of its own: for what only a
real process shows (its exit status as the shell sees it, what it writes to a terminal,
its environment). :func:`cli_here` calls the same ``main()`` in this process, in a thread
of its own (no interpreter start, no imports), for the many tests
whose point is what a verb does with the ledger.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock import RunRecord
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._sql.tables import DEFAULT_TABLE, LedgerTable, quote_ident

from ..test_cli import main_here
from ..web.seed import live_member

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


async def cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m cronlock ARGS`` in a process of its own (with *env*: only that
    environment), off the event loop."""

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cronlock", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=None if env is None else dict(env),
        )

    return await asyncio.to_thread(run)


async def cli_here(
    *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """What :func:`cli` answers, from the command line's ``main()`` called in this process
    (in a thread: the verbs run an event loop of their own), its stdout, stderr and log
    captured, with *env* (if given) as the whole environment meanwhile. Not for ``web``,
    ``demo`` or ``celery-beat`` (signal handlers, child processes)."""
    return await asyncio.to_thread(main_here, args, env)


@pytest.fixture
async def schema(admin: Any) -> AsyncIterator[str]:
    name = f"cli {uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")


async def test_migrate_creates_then_finds_the_ledger(pg_dsn: str, schema: str) -> None:
    first = await cli_here("migrate", "--dsn", pg_dsn, "--schema", schema, "--table", 'my "runs"')
    assert first.returncode == 0, first.stderr
    assert "created" in first.stdout
    again = await cli_here("migrate", "--dsn", pg_dsn, "--schema", schema, "--table", 'my "runs"')
    assert again.returncode == 0, again.stderr
    assert "already there" in again.stdout
    # A locker that may not create tables uses the migrated ledger.
    locker = PostgresLocker(
        pg_dsn, schema=schema, table='my "runs"', create_table=False, application_name="cli-t"
    )
    async with locker:
        lease = await locker.acquire("j", SLOT)
        assert isinstance(lease, PostgresHold)
        await lease.release()


async def test_status_and_history(pg_dsn: str, schema: str) -> None:
    ok_job, bad_job = "nightly-reindex", "hourly-export"
    runner = PostgresLocker(pg_dsn, schema=schema, application_name="cli-test-runner")
    holder = PostgresLocker(pg_dsn, schema=schema, application_name="cli-test-holder")
    async with runner, holder:
        for i, (job, outcome, error) in enumerate(
            [
                (ok_job, "succeeded", None),
                (ok_job, "succeeded", None),
                (bad_job, "succeeded", None),
                (bad_job, "failed", "ValueError: no export today"),
            ]
        ):
            slot = SLOT + timedelta(hours=i)
            lease = await runner.acquire(job, slot)
            assert isinstance(lease, PostgresHold)
            now = datetime.now(UTC)
            lease.record(RunRecord(slot, now, now, outcome, error))  # type: ignore[arg-type]
            await lease.release()
        runner.note_schedule(ok_job, "cron '0 3 * * *' in Europe/Berlin", SLOT + timedelta(days=1))
        held = await holder.acquire(bad_job, SLOT + timedelta(days=1))  # holds it during status
        assert isinstance(held, PostgresHold)
        await runner.close()  # writes the schedule note

        status = await cli_here("status", "--dsn", pg_dsn, "--schema", schema)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert "2 job(s)" in lines[0]
        [ok_line] = [line for line in lines if line.startswith(ok_job)]
        assert "cron '0 3 * * *' in Europe/Berlin" in ok_line
        assert "2030-01-01 04:00:00" in ok_line  # last success
        assert "2030-01-02 03:00:00" in ok_line  # next slot
        [bad_line] = [line for line in lines if line.startswith(bad_job)]
        assert "2030-01-01 05:00:00" in bad_line  # last success
        assert "2030-01-01 06:00:00 failed" in bad_line  # last failure
        assert "cli-test-holder" in bad_line  # who holds the lock now
        assert "cli-test-holder" not in ok_line
        await held.release()

    history = await cli_here("history", bad_job, "--dsn", pg_dsn, "--schema", schema, "-n", "5")
    assert history.returncode == 0, history.stderr
    rows = history.stdout.splitlines()[2:]
    assert [row.split()[2] for row in rows] == ["unfinished", "failed", "succeeded"]
    assert "ValueError: no export today" in rows[1]
    one = await cli_here("history", bad_job, "--dsn", pg_dsn, "--schema", schema, "-n", "1")
    assert len(one.stdout.splitlines()) == 3


@pytest.mark.parametrize(
    ("verb", "run"),
    [(["status"], cli), (["history", "j"], cli_here), (["migrate"], cli_here)],
    ids=["status-process", "history", "migrate"],
)
async def test_bad_dsn_is_one_line_and_status_2_or_3(
    verb: list[str],
    run: Callable[..., Awaitable[subprocess.CompletedProcess[str]]],
    unreachable_dsn: str,
) -> None:
    # A DSN that does not parse is a usage error (2); a server that is down, a ledger that
    # cannot be read (3). Once in a process of its own: the exit status the shell sees.
    for dsn, status in ((unreachable_dsn, 3), ("not a dsn", 2)):
        result = await run(*verb, "--dsn", dsn)
        assert result.returncode == status
        assert result.stdout == ""
        [line] = result.stderr.splitlines()
        assert line.startswith("cronlock: error: cannot connect to PostgreSQL with --dsn")


async def test_missing_ledger_is_a_clear_error(pg_dsn: str, schema: str) -> None:
    result = await cli_here("status", "--dsn", pg_dsn, "--schema", schema)
    assert result.returncode == 3
    assert "migrate" in result.stderr
    assert len(result.stderr.splitlines()) == 1


async def test_unknown_jobs_are_named_and_exit_status_1(pg_dsn: str, schema: str) -> None:
    job = "nightly-reindex"
    locker = PostgresLocker(pg_dsn, schema=schema, application_name="cli-test-unknown")
    async with locker:
        lease = await locker.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        now = datetime.now(UTC)
        lease.record(RunRecord(SLOT, now, now, "succeeded", None))
        await lease.release()
        # Noted but never run: known, with no history yet.
        locker.note_schedule("weekly-report", "cron '0 8 * * MON'", SLOT + timedelta(days=6))

    # In a process of its own, as a shell sees it: exit status 1, the message on stderr.
    status = await cli("status", job, "nosuchjob", "--dsn", pg_dsn, "--schema", schema)
    assert status.returncode == 1
    assert status.stderr == "unknown job: nosuchjob\n"
    lines = status.stdout.splitlines()
    assert "1 job(s)" in lines[0]
    [row] = lines[2:]
    assert row.startswith(job)
    assert "2030-01-01 03:00:00" in row
    assert not any(set(line) <= set("- ") for line in lines)  # no row of dashes

    typo = await cli_here("status", "nightly-reindx", "--dsn", pg_dsn, "--schema", schema)
    assert typo.returncode == 1
    assert typo.stderr == "unknown job: nightly-reindx (did you mean nightly-reindex?)\n"

    known = await cli_here("status", job, "weekly-report", "--dsn", pg_dsn, "--schema", schema)
    assert known.returncode == 0, known.stderr
    assert "2 job(s)" in known.stdout.splitlines()[0]

    history = await cli_here("history", "nosuchjob", "--dsn", pg_dsn, "--schema", schema)
    assert history.returncode == 1
    assert history.stdout == ""
    assert history.stderr == "unknown job: nosuchjob\n"

    noted = await cli_here("history", "weekly-report", "--dsn", pg_dsn, "--schema", schema)
    assert noted.returncode == 0, noted.stderr
    assert noted.stdout.startswith("no runs of 'weekly-report'")


async def seed_states(pg_dsn: str, schema: str, admin: Any) -> None:
    """One job in each of ok, failing, overdue and new (the dashboard's states)."""
    locker = PostgresLocker(pg_dsn, schema=schema, application_name="cli-test-states")
    async with locker:
        for i, (job, outcome) in enumerate(
            [
                ("fine", "succeeded"),
                ("broken", "succeeded"),
                ("broken", "failed"),
            ]
        ):
            slot = SLOT + timedelta(hours=i)
            lease = await locker.acquire(job, slot)
            assert isinstance(lease, PostgresHold)
            now = datetime.now(UTC)
            error = None if outcome == "succeeded" else "RuntimeError: upstream said 503"
            lease.record(RunRecord(slot, now, now, outcome, error))  # type: ignore[arg-type]
            await lease.release()
        for job in ("fine", "broken", "late", "unrun"):
            locker.note_schedule(job, "every 1h", SLOT + timedelta(days=1))
    # As a Scheduler's replicas note them: a grace and a due slot (here a day ahead), but
    # 'late', never run, is due by a slot an hour past its one-second grace.
    ledger = LedgerTable(DEFAULT_TABLE, schema)
    jobs = ledger.jobs
    await live_member(admin, ledger)  # the replicas run on (the locker above left)
    await admin.execute(f"UPDATE {jobs} SET grace = 60, due = $1", SLOT + timedelta(days=1))
    await admin.execute(
        f"UPDATE {jobs} SET grace = 1, due = now() - interval '1 hour' WHERE job = 'late'"
    )


def states(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[2:]}


async def test_status_shows_the_dashboards_states(pg_dsn: str, schema: str, admin: Any) -> None:
    await seed_states(pg_dsn, schema, admin)
    status = await cli_here("status", "--dsn", pg_dsn, "--schema", schema)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[1].split()[:2] == ["JOB", "STATE"]
    # A job whose latest run failed is failing, not ok; one never run is new.
    assert states(status) == {"broken": "failing", "fine": "ok", "late": "overdue", "unrun": "new"}

    # --check keeps its meaning: overdue jobs only (a failing one counts once overdue).
    check = await cli_here("status", "--check", "--dsn", pg_dsn, "--schema", schema)
    assert check.returncode == 1
    assert check.stdout.splitlines()[-1] == "overdue: late"
    healthy = await cli_here(
        "status", "--check", "fine", "broken", "--dsn", pg_dsn, "--schema", schema
    )
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr


async def test_status_filters_by_state(pg_dsn: str, schema: str, admin: Any) -> None:
    await seed_states(pg_dsn, schema, admin)
    args = ("--dsn", pg_dsn, "--schema", schema)
    bad = await cli_here("status", "--state", "failing,overdue", *args)
    assert bad.returncode == 0, bad.stderr
    assert bad.stdout.splitlines()[0].endswith("4 job(s), 2 overdue, failing; times in UTC")
    assert states(bad) == {"broken": "failing", "late": "overdue"}
    # Repeated, with spaces; and combined with job names.
    again = await cli_here("status", "--state", "new", "--state", " ok ", *args)
    assert states(again) == {"fine": "ok", "unrun": "new"}
    named = await cli_here("status", "fine", "broken", "--state", "failing", *args)
    assert states(named) == {"broken": "failing"}
    # Nothing in that state: the count line, no table.
    none = await cli_here("status", "--state", "paused", *args)
    assert none.returncode == 0, none.stderr
    assert none.stdout.splitlines() == [
        f'run ledger "{schema}"."cronlock_runs": 4 job(s), 0 paused; times in UTC'
    ]
    # --check still judges every job asked for, whatever --state shows.
    check = await cli_here("status", "--check", "--state", "failing", *args)
    assert check.returncode == 1
    assert states(check) == {"broken": "failing"} | {"overdue:": "late"}


@pytest.mark.parametrize(
    ("value", "hint"),
    [("failed", " (did you mean failing?)"), ("ok,bogus", ""), ("", "")],
)
async def test_an_unknown_state_is_refused(value: str, hint: str, unreachable_dsn: str) -> None:
    # Refused before connecting, like the other bad input: one line, exit status 2.
    result = await cli_here("status", "--state", value, "--dsn", unreachable_dsn)
    assert result.returncode == 2
    assert result.stdout == ""
    name = value.split(",")[-1]
    assert result.stderr == (
        f"cronlock: error: unknown state for --state: {name!r}{hint}; "
        "valid: paused, conflict, rejected, absent, overdue, failing, running, ok, new\n"
    )
