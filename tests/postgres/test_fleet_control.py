"""Fleet control against the real server: FleetControl, its table, and the CLI verbs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from cronlock import ConfigError, RunRecord
from cronlock.postgres import FleetControl, PostgresHold, PostgresLocker
from cronlock.postgres._sql.schema import ledger_state
from cronlock.postgres._sql.tables import LedgerTable

from .test_cli_pg import cli

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


@pytest.fixture
def table() -> str:
    """A ledger of its own (the tests share one schema)."""
    return f"fleet_{uuid.uuid4().hex[:10]}"


async def test_pause_resume_and_paused(pg_dsn: str, table: str) -> None:
    # force: jobs no replica noted yet (a name the ledger does not know is refused).
    async with FleetControl(pg_dsn, table=table) as control:
        assert await control.paused() == frozenset()
        await control.pause("a", force=True)
        await control.pause("b", force=True)
        await control.pause("a", force=True)  # twice is harmless
        assert await control.paused() == {"a", "b"}
        await control.resume("a", force=True)
        await control.resume("never-paused", force=True)
        assert await control.paused() == {"b"}


async def test_from_a_pool(pool: Any, table: str) -> None:
    async with FleetControl(pool, table=table) as control:
        await control.pause("x", force=True)
        assert await control.paused() == {"x"}
        await control.trigger("x", force=True)


async def test_bad_job_names_are_refused(pg_dsn: str, table: str) -> None:
    async with FleetControl(pg_dsn, table=table) as control:
        with pytest.raises(ConfigError, match=r"FleetControl.pause: job must be .* got ''"):
            await control.pause("")
        with pytest.raises(ConfigError, match=r"FleetControl\.trigger"):
            await control.trigger(3)  # type: ignore[arg-type]


async def test_a_paused_job_is_refused_at_claim_time_by_every_locker(
    pg_dsn: str, table: str
) -> None:
    locker = PostgresLocker(pg_dsn, table=table)
    async with locker, FleetControl(pg_dsn, table=table) as control:
        await control.pause("nightly", force=True)
        assert await locker.acquire("nightly", SLOT) == "paused"
        other = await locker.acquire("other", SLOT)  # other jobs are not affected
        assert isinstance(other, PostgresHold)
        await other.release()
        await control.resume("nightly", force=True)
        lease = await locker.acquire("nightly", SLOT)
        assert isinstance(lease, PostgresHold)
        now = datetime.now(UTC)
        lease.record(RunRecord(SLOT, now, now, "succeeded"))
        await lease.release()
        assert locker.statistics().granted == 2


async def test_an_old_ledger_gets_the_control_table_from_migrate(
    pg_dsn: str, admin: Any, table: str
) -> None:
    async with PostgresLocker(pg_dsn, table=table) as locker:
        await locker.last_claimed("j")  # opens a session, which creates the ledger
    schema = pg_dsn.rsplit("search_path=", 1)[1]
    qualified = LedgerTable(table, schema)
    assert qualified.control.endswith(f'"{table}_control"')
    await admin.execute(f"DROP TABLE {qualified.control}")
    await admin.execute(f"ALTER TABLE {qualified.jobs} DROP COLUMN grace, DROP COLUMN due")
    done = await cli("migrate", "--dsn", pg_dsn, "--table", table)
    assert done.returncode == 0, done.stderr
    assert "upgraded" in done.stdout
    assert await ledger_state(admin, qualified) == "current"


async def test_cli_pause_resume_trigger(pg_dsn: str, table: str) -> None:
    async with PostgresLocker(pg_dsn, table=table) as locker:
        await locker.last_claimed("nightly")  # creates the ledger
        locker.note_schedule("nightly", "cron '0 3 * * *'", SLOT)
    unknown = await cli("pause", "nightly-typo", "--dsn", pg_dsn, "--table", table)
    assert unknown.returncode == 1
    assert "unknown job: nightly-typo (did you mean nightly?)" in unknown.stderr
    forced = await cli("pause", "not-yet-deployed", "--force", "--dsn", pg_dsn, "--table", table)
    assert forced.returncode == 0, forced.stderr

    paused = await cli("pause", "nightly", "--dsn", pg_dsn, "--table", table)
    assert paused.returncode == 0, paused.stderr
    assert "nightly: paused on every replica" in paused.stdout
    status = await cli("status", "--dsn", pg_dsn, "--table", table)
    [line] = [line for line in status.stdout.splitlines() if line.startswith("nightly ")]
    assert line.split()[1] == "paused"
    async with FleetControl(pg_dsn, table=table) as control:
        assert await control.paused() == {"nightly", "not-yet-deployed"}
    resumed = await cli("resume", "nightly", "--dsn", pg_dsn, "--table", table)
    assert resumed.returncode == 0, resumed.stderr
    triggered = await cli("trigger", "nightly", "--dsn", pg_dsn, "--table", table)
    assert triggered.returncode == 0, triggered.stderr
    async with FleetControl(pg_dsn, table=table) as control:
        assert await control.paused() == {"not-yet-deployed"}
