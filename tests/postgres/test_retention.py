"""Retention has bounds: a pruned row can no longer refuse a late claim of its slot.

``retention=1e-9`` was accepted: the prune deleted the row of a slot that had just run, and
a replica still within the job's misfire_grace of that slot (its clock lagging, or its
claim slow) claimed it again and ran it a second time. A huge retention made every prune
fail (``clock_timestamp() - retention`` out of range).
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock import ConfigError, RunRecord, Scheduler, every
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

UNUSED = "postgresql://unused@127.0.0.1:9/none"


@pytest.mark.parametrize("retention", [1e-9, 1, 60, 3599.9, timedelta(minutes=59)])
def test_a_retention_under_an_hour_is_refused_naming_field_and_value(retention: Any) -> None:
    with pytest.raises(ConfigError, match=r"^PostgresLocker: retention=\S+s is shorter than"):
        PostgresLocker(UNUSED, retention=retention)


@pytest.mark.parametrize(
    "retention", [timedelta(days=36_600), 1e300, 10**400], ids=["36600-days", "1e300", "10**400"]
)
def test_a_retention_past_a_century_is_refused(retention: Any) -> None:
    with pytest.raises(ConfigError, match="retention"):
        PostgresLocker(UNUSED, retention=retention)


def test_the_bounds_themselves_are_accepted() -> None:
    PostgresLocker(UNUSED, retention=3600)
    PostgresLocker(UNUSED, retention=timedelta(days=36_525))


def test_a_job_whose_grace_outlasts_the_retention_is_refused_when_registered() -> None:
    scheduler = Scheduler(locker=PostgresLocker(UNUSED, retention=timedelta(hours=2)))
    scheduler.add_job(print, every(60), name="fits", misfire_grace=3600)
    with pytest.raises(ConfigError) as info:
        scheduler.add_job(print, every(600), name="weekly", misfire_grace=3590, jitter=20)
    assert str(info.value) == (
        "job 'weekly': misfire_grace=3590s and jitter=20s lets a replica claim a slot that "
        "late, and its locker prunes rows after retention=7200s: with the margin of 3600s "
        "for lagging replicas, a slot whose row was pruned could run a second time; give "
        "the locker retention=7210 or more, or the job misfire_grace=3580 or less"
    )
    assert [job.name for job in scheduler.jobs] == ["fits"]  # not registered
    # A job's own locker is checked too; a job that takes no lock, and None, are not.
    own = PostgresLocker(UNUSED, retention=3600)
    with pytest.raises(ConfigError, match=re.escape("job 'own': misfire_grace=60s")):
        scheduler.add_job(print, every(60), name="own", locker=own, misfire_grace=60)
    scheduler.add_job(print, every(60), name="local", distributed=False, misfire_grace=1e9)
    scheduler.add_job(print, every(60), name="coalesced", locker=own, misfire_grace=None)
    unpruned = PostgresLocker(UNUSED, ledger=False, retention=3600)
    scheduler.add_job(print, every(60), name="no-ledger", locker=unpruned, misfire_grace=1e9)


def _done(slot: datetime) -> RunRecord:
    now = datetime.now(UTC)
    return RunRecord(slot, now, now, "succeeded", None)


async def _ran_twice(dsn: str, table: LedgerTable, retention: float) -> bool:
    """Replica A runs slots S1 (50 s ago: still within the default misfire_grace of 60 s)
    and S2, and prunes; replica B, lagging, claims S1 only now. Did B get it?"""
    job = f"retention-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC).replace(microsecond=0)
    s1, s2 = now - timedelta(seconds=50), now
    a, b = (
        PostgresLocker(
            dsn, retention=retention, table=table.table, schema=table.schema, application_name=n
        )
        for n in ("retention-a", "retention-b")
    )
    async with a, b:
        for slot in (s1, s2):
            lease = await a.acquire(job, slot)
            assert isinstance(lease, PostgresHold)
            lease.record(_done(slot))
            await lease.release()
        await a.prune()
        late = await b.acquire(job, s1)
        if isinstance(late, PostgresHold):
            await late.release()
            return True
        assert late == "already_ran"
        return False


async def test_a_lagging_replica_never_runs_a_pruned_slot_again(pg_dsn: str, admin: Any) -> None:
    table = LedgerTable("runs", schema=f"retention {uuid.uuid4().hex[:8]}")
    try:
        tried = []
        for retention in (1e-9, 1.0, 59.0, 3600.0):
            try:
                twice = await _ran_twice(pg_dsn, table, retention)
            except ConfigError:
                continue  # refused: it cannot prune a slot a replica may still claim
            tried.append(retention)
            assert not twice, f"retention={retention:g}: slot S1 ran twice"
        assert tried == [3600.0]  # the smallest retention accepted keeps the row
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(table.schema or '')} CASCADE")


async def test_the_longest_retention_accepted_still_prunes(pg_dsn: str, admin: Any) -> None:
    """Past about 6,700 years ``clock_timestamp() - retention`` leaves PostgreSQL's range
    and the prune failed every time; a century is well inside it."""
    table = LedgerTable("runs", schema=f"retention {uuid.uuid4().hex[:8]}")
    century = timedelta(days=36_525)
    try:
        async with PostgresLocker(
            pg_dsn, retention=century, table=table.table, schema=table.schema
        ) as locker:
            await locker.last_claimed("j")  # opens the session, creates the ledger
            assert await locker.prune() == 0
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(table.schema or '')} CASCADE")
