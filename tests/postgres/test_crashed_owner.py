"""A run is crashed only when its owner is gone (issue 35, item 4), on the real server.

After a failover every run's claiming backend pid is unknown to the new server, and a
lease released or renewed just before it may be lost: the old rule ("session pid absent",
"lease expired") took every live replica's run in flight for a crash, and with
``recover=True`` ran finished runs again. Here a live replica's run is made to look that
way (its ``session`` set to a pid no backend has; in lease mode its lease expired) while
another replica's checks run: it is left alone, since its owner still beats in the members
table. A run whose owner's members row expired (a killed replica's) is marked, as before.

The members heartbeat runs every half second here (15 s by default) and a row lives 1.5 s.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from cronlock import RunRecord
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._locker import members
from cronlock.postgres._locker.crashes import CHECK_EVERY
from cronlock.postgres._sql import upkeep
from cronlock.postgres._sql.tables import LedgerTable

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
NO_BACKEND = 2_147_483_647  # a pid no backend has: what a failover leaves every claim with
EVERY = 0.5


@pytest.fixture
def quick_members(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (members, upkeep):
        monkeypatch.setattr(module, "MEMBERS_EVERY", EVERY)
        monkeypatch.setattr(module, "MEMBER_TTL", 3 * EVERY)


@pytest.fixture
async def ledger(admin: Any) -> AsyncIterator[LedgerTable]:
    table = LedgerTable(f"owner_{uuid.uuid4().hex[:10]}")
    try:
        yield table
    finally:
        await admin.execute(
            f"DROP TABLE IF EXISTS {table.runs}, {table.jobs}, {table.control},"
            f" {table.leases}, {table.members}, {table.secrets}, {table.schedules},"
            f" {table.definitions}"
        )


async def _dead_owner(admin: Any, table: LedgerTable, job: str, *, lease_mode: bool) -> None:
    """A run as a killed replica leaves it: its members row expired, its session gone
    (session mode) or its lease expired (lease mode)."""
    await admin.execute(
        f"INSERT INTO {table.members} (holder, fleet, expires_at)"
        " VALUES ('dead:0001', 'x', clock_timestamp() - interval '1 minute')"
    )
    await admin.execute(
        f"INSERT INTO {table.runs} (job, slot, host, pid, session, holder, started_at)"
        " VALUES ($1, $2, 'dead-host', 4242, $3, 'dead:0001',"
        " clock_timestamp() - interval '1 minute')",
        job,
        SLOT,
        None if lease_mode else NO_BACKEND,
    )
    if lease_mode:
        await admin.execute(
            f"INSERT INTO {table.leases} (job, slot, holder, expires_at)"
            " VALUES ($1, $2, 'dead:0001', clock_timestamp() - interval '1 minute')",
            job,
            SLOT,
        )


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_live_replicas_run_is_not_crashed_when_its_session_is_unknown(
    quick_members: None,
    pg_dsn: str,
    app_name: str,
    admin: Any,
    ledger: LedgerTable,
    mode: Literal["session", "lease"],
) -> None:
    marked: list[str] = []

    def crashed(job: str, record: RunRecord) -> bool:
        marked.append(job)
        return False

    def locker() -> PostgresLocker:  # racers=None: the members heartbeat runs anyway
        return PostgresLocker(
            pg_dsn, application_name=app_name, table=ledger.table, mode=mode, lease=60,
            racers=None,
        )  # fmt: skip

    owner, checker = locker(), locker()
    for each in (owner, checker):  # both check: either may mark the dead one
        each.on_crashed(crashed)
    live, dead = f"live-{uuid.uuid4()}", f"dead-{uuid.uuid4()}"
    async with owner, checker:
        hold = await owner.acquire(live, SLOT)
        assert isinstance(hold, PostgresHold)
        # What a failover leaves of it: the claim's backend unknown to the server; in
        # lease mode its lease expired too (renewals lost). The owner goes on.
        if mode == "session":
            await admin.execute(
                f"UPDATE {ledger.runs} SET session = $2 WHERE job = $1", live, NO_BACKEND
            )
        else:
            await admin.execute(
                f"UPDATE {ledger.leases} SET expires_at = clock_timestamp()"
                " - interval '1 minute' WHERE job = $1",
                live,
            )
        ours = await checker.acquire(f"other-{uuid.uuid4()}", SLOT)  # opens its session
        assert isinstance(ours, PostgresHold)
        await ours.release()
        await _dead_owner(admin, ledger, dead, lease_mode=mode == "lease")
        async with asyncio.timeout(60):  # the checker stands, then marks the dead one
            while dead not in marked:
                await asyncio.sleep(0.05)
        await asyncio.sleep(2 * CHECK_EVERY + 0.5)  # two more rounds of checks
        row = await admin.fetchrow(f"SELECT * FROM {ledger.runs} WHERE job = $1", live)
        assert (row["outcome"], row["finished_at"]) == (None, None)
        assert marked == [dead]
        finished = datetime.now(UTC)
        hold.record(RunRecord(SLOT, finished, finished, "succeeded"))
        await hold.release()
    outcome = await admin.fetchval(f"SELECT outcome FROM {ledger.runs} WHERE job = $1", live)
    # Its own outcome, never crashed (in lease mode the owner's renewal may find its lease
    # expired first, and its run then ends lock_lost, by its own hand).
    assert outcome == "succeeded" if mode == "session" else outcome in ("succeeded", "lock_lost")
    error = await admin.fetchval(f"SELECT error FROM {ledger.runs} WHERE job = $1", dead)
    assert "died mid-run" in error and "membership" in error


async def test_a_member_back_after_a_gap_stands_anew(
    pg_dsn: str, app_name: str, admin: Any, ledger: LedgerTable
) -> None:
    """The heartbeat keeps ``since`` while beats come in time, and starts it again after a
    gap longer than half the time to live (the server was away): such a member's checks
    take nobody for gone until every replica had a whole time to live to beat again."""
    async with PostgresLocker(pg_dsn, application_name=app_name, table=ledger.table) as locker:
        hold = await locker.acquire(f"make-{uuid.uuid4()}", SLOT)  # creates the tables
        assert isinstance(hold, PostgresHold)
        await hold.release()
    sql = upkeep.heartbeat_sql(ledger)
    long_ago = "clock_timestamp() - interval '1 hour'"
    for holder, last_beat in (("steady", "clock_timestamp() - interval '10 seconds'"),
                              ("away", "clock_timestamp() - interval '30 seconds'")):  # fmt: skip
        await admin.execute(
            f"INSERT INTO {ledger.members} (holder, fleet, expires_at, since)"
            f" VALUES ($1, 'f', {last_beat} + interval '45 seconds', {long_ago})",
            holder,
        )
        await admin.fetch(sql, holder, "f", 45.0, False)
    since = dict(
        await admin.fetch(
            f"SELECT holder, since > clock_timestamp() - interval '1 minute' FROM {ledger.members}"
        )
    )
    assert since == {"steady": False, "away": True}
