"""Changes of the stored schedules never hang (issue 37, item 6), against the real server.

A session of any role could take the advisory key the changes used to wait on (anyone can
compute it from the ledger's name), with no bound: ``schedules add`` then hung for as long
as the squatter pleased. Now that key means nothing to a change, the changes' lock is a row
lock (only a role that may write the schedules table can take it), and a change waits for
any lock at most ``LOCK_WAIT`` seconds, then fails saying which lock, having changed
nothing. The calls are given a generous liveness bound: what is asserted is that they
return, and what they answer.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from cronlock import LockError, StoredSchedule, every
from cronlock._keys import job_lock_key
from cronlock.postgres import FleetControl
from cronlock.postgres._ops import stored
from cronlock.postgres._sql.stored import schedules_lock_sql
from cronlock.postgres._sql.tables import LedgerTable

from .test_cli_pg import cli

pytestmark = pytest.mark.postgres

LIVE = 45.0  # seconds a call may take before the test calls it hung (the bound: 1 s, 5 s)


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes in this process wait 1 s for a lock, not 5 (the command line's keep 5)."""
    monkeypatch.setattr(stored, "LOCK_WAIT", 1.0)


@pytest.fixture
def table() -> str:
    return f"lock_{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def squatter(pg_dsn: str) -> AsyncIterator[Any]:
    """Another session of the server, as a squatter would hold one."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def test_the_computable_advisory_key_holds_no_change_off(
    pg_dsn: str, table: str, squatter: Any
) -> None:
    # The key the changes took, computable by any session of any role from the name.
    old_key = job_lock_key(f"cronlock:schedules:{LedgerTable(table).runs}")
    async with FleetControl(pg_dsn, table=table) as control:
        await squatter.execute("SELECT pg_advisory_lock($1)", old_key)
        added = await asyncio.wait_for(
            control.add_schedule("t:1", "report", every(60)), timeout=LIVE
        )
        assert added.revision == 1
        put = await asyncio.wait_for(
            control.put_schedules([StoredSchedule("t:2", "report", every(60))]), timeout=LIVE
        )
        assert put.revision == 2
    where = ("--dsn", pg_dsn, "--table", table)
    done = await asyncio.wait_for(
        cli("schedules", "add", "t:3", "report", "--every", "60", *where), timeout=LIVE
    )
    assert done.returncode == 0, done.stderr
    assert "stored as revision 3" in done.stdout


async def test_a_session_holding_the_changes_lock_gets_a_clear_error_in_time(
    pg_dsn: str, table: str, squatter: Any
) -> None:
    ledger = LedgerTable(table)
    async with FleetControl(pg_dsn, table=table) as control:
        await control.add_schedule("t:1", "report", every(60))
        squatting = squatter.transaction()
        await squatting.start()
        await squatter.execute(schedules_lock_sql(ledger))  # held until it rolls back
        try:
            for change in (
                lambda: control.add_schedule("t:2", "report", every(60)),
                lambda: control.update_schedule("t:1", schedule=every(90)),
                lambda: control.remove_schedule("t:1"),
                lambda: control.put_schedules([StoredSchedule("t:2", "report", every(60))]),
                lambda: control.sync_schedules("t:", []),
            ):
                with pytest.raises(LockError) as caught:
                    await asyncio.wait_for(change(), timeout=LIVE)
                said = str(caught.value)
                assert ledger.runs in said, said
                assert "another session holds the stored schedules' lock" in said, said
                assert "nothing was changed" in said, said
            where = ("--dsn", pg_dsn, "--table", table)
            refused = await asyncio.wait_for(
                cli("schedules", "add", "t:2", "report", "--every", "60", *where), timeout=LIVE
            )
            assert refused.returncode == 1
            assert "another session holds the stored schedules' lock" in refused.stderr
            assert "Traceback" not in refused.stderr
            [stored] = await control.schedules()  # nothing changed
            assert (stored.name, stored.revision) == ("t:1", 1)
        finally:
            await squatting.rollback()
        # Once it lets go, changes go through.
        again = await control.add_schedule("t:2", "report", every(60))
        assert again.revision == 2


async def test_a_session_holding_a_schedules_row_gets_a_clear_error_in_time(
    pg_dsn: str, table: str, squatter: Any
) -> None:
    ledger = LedgerTable(table)
    async with FleetControl(pg_dsn, table=table) as control:
        await control.add_schedule("t:1", "report", every(60))
        squatting = squatter.transaction()
        await squatting.start()
        await squatter.execute(f"SELECT 1 FROM {ledger.schedules} WHERE name = 't:1' FOR UPDATE")
        try:
            with pytest.raises(LockError, match="a lock on a stored schedule's row"):
                await asyncio.wait_for(
                    control.update_schedule("t:1", schedule=every(90)), timeout=LIVE
                )
            # Another schedule's change is not held off by that row.
            added = await asyncio.wait_for(
                control.add_schedule("t:2", "report", every(60)), timeout=LIVE
            )
            assert added.revision == 2
        finally:
            await squatting.rollback()


async def _waiting_on_a_lock(probe: Any, table: str) -> None:
    """Until a session waits for a lock in a statement naming *table*'s notes."""
    jobs = LedgerTable(table).jobs
    for _ in range(int(LIVE / 0.02)):
        waiting = await probe.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND pid <> pg_backend_pid() AND strpos(query, $1) > 0",
            jobs,
        )
        if waiting:
            return
        await asyncio.sleep(0.02)
    pytest.fail("the change never waited for the note's lock")


async def _free(probe: Any, table: str, job: str) -> bool:
    """Whether *job*'s note is locked by no other session."""
    jobs = LedgerTable(table).jobs
    try:
        async with probe.transaction():
            await probe.execute(f"SELECT 1 FROM {jobs} WHERE job = $1 FOR UPDATE NOWAIT", job)
    except asyncpg.LockNotAvailableError:
        return False
    return True


@pytest.mark.parametrize("by", ["put", "sync"])
async def test_a_batch_takes_the_notes_locks_in_name_order(
    pg_dsn: str, table: str, squatter: Any, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    # A replica writes its jobs' notes in name order, a thousand a statement: a batch
    # that took them in another order (as given, or the removed ones' first) could hold
    # one the replica waits for while it waits for one the replica holds: a deadlock.
    # The squatter holds the first name's note as such a replica would; the batch, given
    # in reverse, must then hold none of the later ones while it waits.
    monkeypatch.setattr(stored, "LOCK_WAIT", LIVE)
    jobs = LedgerTable(table).jobs
    probe = await asyncpg.connect(pg_dsn)
    try:
        async with FleetControl(pg_dsn, table=table) as control:
            first = [StoredSchedule(f"t:{c}", "report", every(60)) for c in "amz"]
            await control.put_schedules(first)
            changed = [StoredSchedule(f"t:{c}", "report", every(90)) for c in "za"]
            squatting = squatter.transaction()
            await squatting.start()
            await squatter.execute(f"SELECT 1 FROM {jobs} WHERE job = 't:a' FOR UPDATE")
            if by == "put":
                change = asyncio.create_task(control.put_schedules(changed))
            else:  # t:m removed, t:z and t:a changed
                change = asyncio.create_task(control.sync_schedules("t:", changed))
            try:
                await _waiting_on_a_lock(probe, table)
                assert await _free(probe, table, "t:z")
                assert await _free(probe, table, "t:m")
            finally:
                await squatting.rollback()
                done = await asyncio.wait_for(change, timeout=LIVE)
            assert done.updated == 2
            assert done.removed == (1 if by == "sync" else 0)
    finally:
        await probe.close()
