"""Jobs' tags, as a user sets them (``add_job(tags=...)``, a stored schedule's options), reach
the ledger with each job's schedule note, and the job list filters by them (``?tag=``, in
the page's URL and in ``/api/jobs``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

import cronlock.web
from cronlock import Scheduler, every
from cronlock.postgres import FleetControl, PostgresLocker

from ..eventually import eventually
from .seed import drop_ledger, table_name
from .test_app import client

pytestmark = pytest.mark.postgres


async def work() -> None:
    """A task the schedules name (it never runs: every slot is an hour away)."""


@pytest.fixture
async def table(pg_dsn: str) -> AsyncIterator[str]:
    name = table_name()
    yield name
    await drop_ledger(pg_dsn, name)


async def noted_tags(dsn: str, table: str) -> dict[str, list[str] | None]:
    conn: Any = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT job, tags FROM "{table}_jobs"')
    finally:
        await conn.close()
    return {row["job"]: row["tags"] for row in rows}


async def test_a_replica_notes_its_jobs_tags_and_the_list_filters_by_them(
    pg_dsn: str, table: str
) -> None:
    locker = PostgresLocker(pg_dsn, table=table)
    scheduler = Scheduler(locker=locker, stop_timeout=1)
    scheduler.add_job(work, every(1), name="invoices", tags=["billing", "nightly"])
    scheduler.add_job(work, every(1), name="refunds", tags="billing")
    scheduler.add_job(work, every(1), name="reindex", tags={"search", "nightly"})
    scheduler.add_job(work, every(1), name="untagged")
    async with locker, scheduler:
        # A run in the ledger: it is there, and the notes go on close.
        await eventually(lambda: locker.history("untagged"), "a run of untagged", every=0.1)
    assert await noted_tags(pg_dsn, table) == {
        "invoices": ["billing", "nightly"],
        "refunds": ["billing"],
        "reindex": ["nightly", "search"],
        "untagged": [],
    }
    async with client(cronlock.web.app(pg_dsn, table=table)) as c:
        billing = (await c.get("/api/jobs", params={"tag": "billing"})).json()
        both = (await c.get("/api/jobs", params={"tag": "billing,nightly"})).json()
        repeated = (await c.get("/api/jobs", params=[("tag", "nightly"), ("tag", "search")])).json()
        none = (await c.get("/api/jobs", params={"tag": "nobody"})).json()
        page = await c.get("/", params={"tag": "nightly", "q": "re"})
        everyone = (await c.get("/api/jobs")).json()
        long = await c.get("/api/jobs", params={"tag": "x" * 201})
    assert [job["name"] for job in billing["jobs"]] == ["invoices", "refunds"]
    assert billing["matched"] == 2 and billing["summary"]["total"] == 4
    assert [job["name"] for job in both["jobs"]] == ["invoices"]  # every tag given
    assert [job["name"] for job in repeated["jobs"]] == ["reindex"]
    assert none["jobs"] == [] and none["matched"] == 0
    assert {job["name"]: job["tags"] for job in everyone["jobs"]}["invoices"] == [
        "billing",
        "nightly",
    ]
    assert page.status_code == 200
    assert 'data-job="reindex"' in page.text and 'data-job="invoices"' not in page.text
    assert 'name="tag" value="nightly"' in page.text  # the filter shows what it filters by
    assert long.status_code == 400 and "tag" in long.json()["error"]


async def test_a_stored_schedules_tags_are_noted_when_it_is_added(pg_dsn: str, table: str) -> None:
    async with FleetControl(pg_dsn, table=table) as control:
        await control.add_schedule(
            "nightly-export", "tests.web.test_tags:work", every(3600), tags=["export"]
        )
    assert await noted_tags(pg_dsn, table) == {"nightly-export": ["export"]}
    async with client(cronlock.web.app(pg_dsn, table=table)) as c:
        found = (await c.get("/api/jobs", params={"tag": "export"})).json()
    assert [job["name"] for job in found["jobs"]] == ["nightly-export"]
