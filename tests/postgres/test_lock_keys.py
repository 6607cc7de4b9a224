"""``PostgresLocker(lock_keys="keyed")``: lock keys no job name can be aimed at.

FNV-1a is not a keyed hash: whoever names a job can search for a name whose key is another
job's (two such names were found in about four minutes on two cores), and a job of that
name then holds the other off, slot after slot. Finding such a pair for the default keys is
beyond a test's time, so these tests show what the keyed keys are instead: not the FNV
ones, different per ledger, stable across restarts, and they still exclude.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest

from cronlock import (
    ConfigError,
    JobConflictError,
    JobStarted,
    LockError,
    Scheduler,
    SystemClock,
    every,
)
from cronlock._keys import job_lock_key, keyed_lock_key
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._ops.fleet import read_holders
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

from .conftest import ADVISORY_HERE

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
UNUSED = "postgresql://unused@127.0.0.1:9/none"


def test_the_keyed_key_is_the_first_8_bytes_of_hmac_sha256_as_int64() -> None:
    secret = bytes(range(32))
    digest = hmac.new(secret, b"nightly-reindex", hashlib.sha256).digest()
    key = keyed_lock_key(secret, "nightly-reindex")
    assert key == int.from_bytes(digest[:8], "big", signed=True)
    assert -(2**63) <= key < 2**63
    assert key != keyed_lock_key(bytes(32), "nightly-reindex")  # another secret
    assert key != keyed_lock_key(secret, "nightly-reindex ")


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"lock_keys": "hmac"}, "lock_keys must be 'fnv1a' or 'keyed', got 'hmac'"),
        ({"lock_keys": "keyed", "ledger": False}, "neither ledger=False nor bare_keys=True"),
        ({"lock_keys": "keyed", "bare_keys": True}, "neither ledger=False nor bare_keys=True"),
    ],
)
def test_bad_lock_keys_are_refused(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        PostgresLocker(UNUSED, **options)
    assert fragment in str(info.value)


def test_fnv1a_stays_the_default_and_go_compatible() -> None:
    locker = PostgresLocker(UNUSED, schema="billing")
    assert locker.lock_key("cleanup") == job_lock_key('"billing"."cronlock_runs"\0cleanup')
    bare = PostgresLocker(UNUSED, bare_keys=True, lock_keys="fnv1a")
    assert bare.lock_key("cleanup") == job_lock_key("cleanup")


@pytest.fixture
async def schemas(admin: Any) -> AsyncIterator[list[str]]:
    made = [f"keys {uuid.uuid4().hex[:8]}" for _ in range(2)]
    try:
        yield made
    finally:
        for schema in made:
            await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")


def keyed(dsn: str, schema: str, **options: Any) -> PostgresLocker:
    return PostgresLocker(
        dsn, schema=schema, lock_keys="keyed", application_name="keys-test", **options
    )


async def _claim(locker: PostgresLocker, job: str, slot: datetime) -> None:
    lease = await locker.acquire(job, slot)
    assert isinstance(lease, PostgresHold)
    await lease.release()


async def test_keys_differ_per_ledger_are_not_fnv_and_survive_a_restart(
    pg_dsn: str, schemas: list[str]
) -> None:
    one, two = schemas
    async with keyed(pg_dsn, one) as first, keyed(pg_dsn, two) as other:
        with pytest.raises(LockError, match="known once the locker has read"):
            first.lock_key("cleanup")
        await _claim(first, "cleanup", SLOT)
        await _claim(other, "cleanup", SLOT)
        key = first.lock_key("cleanup")
        assert key != other.lock_key("cleanup")  # each ledger has its secret
        fnv = {job_lock_key("cleanup"), LedgerTable("cronlock_runs", one).lock_key("cleanup")}
        assert key not in fnv
    async with keyed(pg_dsn, one) as again:  # a restart, or another replica
        await _claim(again, "other-job", SLOT)
        assert again.lock_key("cleanup") == key


async def test_keyed_keys_exclude_and_the_status_finds_the_holder(
    pg_dsn: str, schemas: list[str], admin: Any
) -> None:
    schema = schemas[0]
    a, b = keyed(pg_dsn, schema), keyed(pg_dsn, schema)
    async with a, b:
        answers = await asyncio.gather(a.acquire("sync", SLOT), b.acquire("sync", SLOT))
        [lease] = [x for x in answers if isinstance(x, PostgresHold)]
        assert [x for x in answers if not isinstance(x, PostgresHold)] in (
            ["locked"],
            ["already_ran"],
        )
        loser = b if lease is answers[0] else a
        # The run holds the job's keyed lock: the next slot waits for it on every replica.
        assert await loser.acquire("sync", SLOT + timedelta(minutes=1)) == "locked"
        held = await admin.fetchval(
            f"SELECT count(*) FROM pg_locks WHERE {ADVISORY_HERE} AND objsubid = 1"
            " AND ((classid::int8 << 32) | objid::int8) = $1",
            a.lock_key("sync"),
        )
        assert held == 1
        holders = await read_holders(admin, ["sync"], LedgerTable("cronlock_runs", schema))
        assert len(holders["sync"]) == 1
        await lease.release()


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_two_keyed_replicas_run_each_slot_once(
    pg_dsn: str, schemas: list[str], mode: str
) -> None:
    schema = schemas[0]
    starts: list[datetime] = []
    schedulers = []
    for _ in range(2):
        locker = keyed(pg_dsn, schema, mode=mode)
        scheduler = Scheduler(clock=SystemClock(), locker=locker)

        async def work() -> None:
            await asyncio.sleep(0.05)

        scheduler.add_job(work, every(0.2), name="tick")
        scheduler.subscribe(lambda e: starts.append(e.slot), JobStarted)
        schedulers.append(scheduler)
    async with schedulers[0], schedulers[1]:
        await asyncio.sleep(2.5)
    assert len(starts) >= 8
    assert len(starts) == len(set(starts))  # no slot ran twice


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_mixed_fleet_runs_a_slot_once_but_only_lease_mode_excludes_overlap(
    pg_dsn: str, schemas: list[str], mode: Literal["session", "lease"]
) -> None:
    """Replicas of one ledger that disagree on lock_keys: the runs table's primary key still
    lets one of them claim each slot; in session mode their locks differ, so a run of the
    next slot can start while the first runs; in lease mode exclusion is the job's row."""
    schema = schemas[0]
    fnv = PostgresLocker(pg_dsn, schema=schema, mode=mode, application_name="keys-test")
    async with fnv, keyed(pg_dsn, schema, mode=mode) as key:
        lease = await fnv.acquire("mixed", SLOT)
        assert isinstance(lease, PostgresHold)
        assert await key.acquire("mixed", SLOT) == "already_ran"
        later = await key.acquire("mixed", SLOT + timedelta(minutes=1))
        if mode == "session":
            assert isinstance(later, PostgresHold)  # not excluded: two different locks
            await later.release()
        else:
            assert later == "locked"
        await lease.release()


def test_registration_refuses_colliding_fnv_keys_only_where_the_locker_takes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler refuses two jobs whose FNV-1a keys collide (they would block each
    other). A keyed locker's keys are not those: refusing there would let a name built to
    collide with another job's FNV key keep that job from being registered at all."""
    monkeypatch.setattr("cronlock._scheduler.job_lock_key", lambda name: 42)  # all collide
    fnv = Scheduler(locker=PostgresLocker(UNUSED))
    fnv.add_job(print, every(60), name="victim")
    with pytest.raises(JobConflictError, match="'victim' and 'crafted'"):
        fnv.add_job(print, every(60), name="crafted")
    keyed_scheduler = Scheduler(locker=PostgresLocker(UNUSED, lock_keys="keyed"))
    keyed_scheduler.add_job(print, every(60), name="victim")
    keyed_scheduler.add_job(print, every(60), name="crafted")
    keyed_scheduler.remove("victim")  # no FNV key was noted for it
    assert [job.name for job in keyed_scheduler.jobs] == ["crafted"]
