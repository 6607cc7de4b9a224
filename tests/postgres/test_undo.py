"""The undo of a cancelled claim against a real server: no replica sees it half done.

A claim whose caller is cancelled before its run began is given back in one statement: the
ledger row deleted (so that another replica may still run the slot) and the job's lock
released. The unlock takes effect at once, the delete at commit; a trigger that sleeps in
the undo's transaction holds that moment open, so that another replica's claim lands in it
every time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._sql.tables import quote_ident

from .conftest import ADVISORY_HERE

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
SLEEP = 1.0
"""Seconds each delete from the test's runs table sleeps in its trigger."""

Mode = Literal["session", "lease"]


@dataclass
class Pair:
    """Two replicas' lockers over one ledger of the test's own, whose deletes sleep."""

    a: PostgresLocker
    b: PostgresLocker
    mode: Mode
    job: str


@pytest.fixture
async def pair(
    pg_dsn: str, app_name: str, admin: Any, request: pytest.FixtureRequest
) -> AsyncIterator[Pair]:
    """A's claim statements take 0.3 s (so a cancellation lands while one is in flight) and
    every delete sleeps :data:`SLEEP` s, ``AFTER`` the row is gone (its transaction still
    open) or ``BEFORE`` (the row being deleted): ``request.param`` is (mode, when)."""
    mode, when = request.param
    table = f"undo_{uuid.uuid4().hex[:10]}"
    options: dict[str, Any] = {"table": table, "heartbeat": None, "spread": 0, "sessions": 1}
    a = PostgresLocker(pg_dsn, application_name=f"{app_name}-a", mode=mode, **options)
    b = PostgresLocker(pg_dsn, application_name=f"{app_name}-b", mode=mode, **options)
    job = f"undo-{uuid.uuid4().hex[:8]}"
    async with a, b:
        await a.last_claimed(job)  # opens a session, which creates the ledger
        await b.last_claimed(job)
        assert a.ledger is not None
        runs = a.ledger.runs
        sleeps = quote_ident(f"{table}_sleeps")  # in pg_dsn's schema, as the ledger is
        await admin.execute(
            f"""CREATE FUNCTION {sleeps}() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF TG_OP = 'INSERT' THEN
                        IF current_setting('application_name') = '{app_name}-a' THEN
                            PERFORM pg_sleep(0.3);
                        END IF;
                        RETURN NULL;
                    END IF;
                    PERFORM pg_sleep({SLEEP});
                    RETURN OLD;
                END $$"""
        )
        await admin.execute(
            f"CREATE TRIGGER sleeps {when} DELETE ON {runs} "
            f"FOR EACH ROW EXECUTE FUNCTION {sleeps}()"
        )
        await admin.execute(
            f"CREATE TRIGGER slow_claims AFTER INSERT ON {runs} "
            f"FOR EACH ROW EXECUTE FUNCTION {sleeps}()"
        )
        yield Pair(a, b, mode, job)


async def cancel_mid_claim(pair: Pair) -> asyncio.Task[Any]:
    """A claims the slot and is cancelled while its claim statement is in flight: the claim
    is granted, then undone (A's task, returned, ends once the undo is done)."""
    a = pair.a
    before = a.statistics().statements
    task = asyncio.create_task(a.acquire(pair.job, SLOT))
    while a.statistics().statements == before:
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)  # the statement is at the server, in its 0.3 s insert
    assert not task.done()
    task.cancel()
    return task


async def undo_sleeping(admin: Any, app: str) -> None:
    """Wait until A's undo statement sleeps in the delete trigger."""
    for _ in range(400):
        sleeping = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
            "AND wait_event = 'PgSleep' AND query LIKE '%DELETE FROM%'",
            app,
        )
        if sleeping:
            return
        await asyncio.sleep(0.005)
    pytest.fail("the undo never reached its delete")


async def locks_on(admin: Any, key: int) -> int:
    """Advisory locks granted on *key*, by any session."""
    held: int = await admin.fetchval(
        f"""SELECT count(*) FROM pg_locks WHERE {ADVISORY_HERE} AND objsubid = 1
           AND granted AND ((classid::int8 << 32) | objid::int8) = $1::int8""",
        key,
    )
    return held


@pytest.mark.parametrize(
    "pair",
    [("session", "AFTER"), ("lease", "AFTER"), ("lease", "BEFORE")],
    indirect=True,
    ids=["session", "lease", "lease-row-being-deleted"],
)
async def test_a_claim_during_an_undo_waits_for_it_and_runs_the_slot(
    pair: Pair, admin: Any, app_name: str
) -> None:
    """The undo's unlock is done (lease mode: its lease released, uncommitted) and its
    delete not yet committed when B claims: B's snapshot still shows A's row. B is not
    answered "already_ran" for a slot nobody ran: its claim waits for the undo's commit
    and wins the slot. In lease mode the lease undone is released for no slot (a lease
    released for its own slot would refuse B "locked" then and ever after)."""
    task = await cancel_mid_claim(pair)
    await undo_sleeping(admin, f"{app_name}-a")
    assert pair.a.ledger is not None
    if pair.mode == "session":
        assert await locks_on(admin, pair.a.lock_key(pair.job)) == 0  # the unlock is done
    rows = f"SELECT count(*) FROM {pair.a.ledger.runs} WHERE job = $1"
    assert await admin.fetchval(rows, pair.job) == 1  # the delete is not committed
    answer = await pair.b.acquire(pair.job, SLOT)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert isinstance(answer, PostgresHold), answer
    await answer.release()
    assert [run.slot for run in await pair.b.history(pair.job)] == [SLOT]  # B's claim


@pytest.mark.parametrize("pair", [("session", "BEFORE")], indirect=True, ids=["session"])
async def test_an_undo_keeps_the_lock_until_its_row_is_being_deleted(
    pair: Pair, admin: Any, app_name: str
) -> None:
    """The undo's delete runs before its unlock in the statement: while the row is being
    deleted A still holds the job's lock, so no claim finds the lock free and the row not
    yet marked as being deleted (which it would trust as a run). B, claiming meanwhile,
    does not trust the row being deleted and finds the lock held: "locked"."""
    task = await cancel_mid_claim(pair)
    await undo_sleeping(admin, f"{app_name}-a")
    key = pair.a.lock_key(pair.job)
    assert await locks_on(admin, key) == 1
    assert await pair.b.acquire(pair.job, SLOT) == "locked"  # not "already_ran"
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await locks_on(admin, key) == 0
    assert await pair.a.history(pair.job) == []
    lease = await pair.b.acquire(pair.job, SLOT)  # given back: B may still run the slot
    assert isinstance(lease, PostgresHold)
    await lease.release()
