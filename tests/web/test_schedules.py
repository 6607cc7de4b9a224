"""The dashboard's stored schedules: listed with each replica's problem, edited and removed
by an operator ``authorize`` admits (POST, CSRF, same origin, as the other actions), never
by anyone else."""

from __future__ import annotations

import re

import asyncpg
import httpx
import pytest
from starlette.requests import Request

import cronlock.web
from cronlock import cron, every
from cronlock.postgres import FleetControl
from cronlock.postgres._sql.stored import schedule_problem_sql
from cronlock.postgres._sql.tables import LedgerTable

from .seed import LIVE, live_member, table_name
from .test_app import XSS, _csrf, client

pytestmark = pytest.mark.postgres


@pytest.fixture
async def ledger(pg_dsn: str) -> str:
    table = table_name()
    async with FleetControl(pg_dsn, table=table) as control:
        await control.add_schedule(
            "report:42", "send-report", cron("0 8 * * *", tz="America/New_York"),
            kwargs={"tenant": 42}, timeout=600,
        )  # fmt: skip
        await control.add_schedule(XSS, "send-report", every(60), kwargs={"x": XSS})
    conn = await asyncpg.connect(pg_dsn)
    try:  # the one live replica's problem with it, and that of a process gone since
        ledger = LedgerTable(table)
        await live_member(conn, ledger)
        problem = schedule_problem_sql(ledger)
        await conn.execute(problem, "report:42", 1, "no task 'send-report' on this replica", LIVE)
        await conn.execute(problem, "report:42", 1, "no task 'send-report' (gone)", "gone:1")
    finally:
        await conn.close()
    return table


async def _stored(dsn: str, table: str) -> dict[str, str]:
    async with FleetControl(dsn, table=table) as control:
        return {s.name: str(s.schedule) for s in await control.schedules()}


def _operator(request: Request) -> str:
    return "ops" if request.headers.get("x-operator") == "yes" else ""


async def test_the_list_shows_schedules_and_problems_read_only(pg_dsn: str, ledger: str) -> None:
    async with client(cronlock.web.app(pg_dsn, table=ledger)) as c:
        page = await c.get("/schedules")
        front = (await c.get("/")).text
    assert 'href="/schedules"' in front  # the header links to it
    assert page.status_code == 200
    text = page.text
    assert 'data-schedule="report:42"' in text
    assert "cron &#39;0 8 * * *&#39; in America/New_York" in text
    assert "no task &#39;send-report&#39; on this replica" in text  # the replica's problem
    assert "(gone)" not in text and "gone:1" not in text  # a reporter that exited is not shown
    # Its one live replica rejected it: no replica runs it (rejected everywhere).
    rows = {
        name: kind
        for kind, name in re.findall(r'<tr class="([^"]*)" data-schedule="([^"]*)"', text)
    }
    assert "status-rejected" in rows["report:42"], rows
    assert [kind for name, kind in rows.items() if name != "report:42"] == ["schedule"]
    assert ">rejected</span>" in text
    assert "timeout=600.0" in text
    assert XSS not in text and "&lt;script&gt;" in text  # text, never markup
    assert "update-schedule" not in text and 'name="csrf"' not in text  # read-only: no forms
    assert (
        'href="/schedules"' in (await client(cronlock.web.app(pg_dsn, table=ledger)).get("/")).text
    )


async def test_an_operator_edits_and_removes_a_schedule(pg_dsn: str, ledger: str) -> None:
    app = cronlock.web.app(pg_dsn, table=ledger, authorize=_operator)
    async with client(app) as c:
        c.headers["x-operator"] = "yes"
        token = _csrf((await c.get("/schedules")).text)
        form = {"csrf": token, "schedule": "report:42", "cron": "30 7 * * *"}
        done = await c.post("/actions/update-schedule", data={**form, "tz": "America/New_York"})
        assert (done.status_code, done.headers["location"]) == (303, "/schedules")
        stored = await _stored(pg_dsn, ledger)
        assert stored["report:42"] == "cron '30 7 * * *' in America/New_York"
        # The zone field left empty keeps the stored zone (docs/dashboard.md; issue 36).
        kept = await c.post("/actions/update-schedule", data={**form, "cron": "45 7 * * *"})
        assert kept.status_code == 303
        stored = await _stored(pg_dsn, ledger)
        assert stored["report:42"] == "cron '45 7 * * *' in America/New_York"
        # What FleetControl refuses is a 400 with its message, and changes nothing.
        bad = await c.post("/actions/update-schedule", data={**form, "cron": "61 * * * *"})
        assert bad.status_code == 400 and "61" in bad.text
        kw = await c.post("/actions/update-schedule", data={**form, "kwargs": "[1]"})
        assert kw.status_code == 400 and "JSON object" in kw.text
        assert await _stored(pg_dsn, ledger) == stored
        gone = await c.post("/actions/remove-schedule", data=form)
        assert gone.status_code == 303
        assert "report:42" not in await _stored(pg_dsn, ledger)
        again = await c.post("/actions/remove-schedule", data=form)
        assert again.status_code == 404 and "unknown schedule: report:42" in again.text


@pytest.mark.parametrize("case", ["no-token", "other-origin", "denied", "read-only"])
async def test_a_refused_change_is_a_403_and_changes_nothing(
    pg_dsn: str, ledger: str, case: str
) -> None:
    app = cronlock.web.app(
        pg_dsn, table=ledger, authorize=None if case == "read-only" else _operator
    )
    async with client(app) as c:
        c.headers["x-operator"] = "no" if case == "denied" else "yes"
        page = (await c.get("/")).text
        form = {"schedule": "report:42", "csrf": "" if case == "read-only" else _csrf(page)}
        headers = {"origin": "https://evil.example"} if case == "other-origin" else {}
        if case == "no-token":
            del form["csrf"]
        for verb in ("remove-schedule", "update-schedule"):
            refused: httpx.Response = await c.post(f"/actions/{verb}", data=form, headers=headers)
            assert refused.status_code == 403, (verb, refused.text)
    assert set(await _stored(pg_dsn, ledger)) == {"report:42", XSS}


@pytest.mark.parametrize("noted", [True, False])
async def test_a_schedule_every_live_replica_rejected_is_rejected_on_every_page(
    pg_dsn: str, ledger: str, noted: bool
) -> None:
    if not noted:  # no note of it in the ledger: listed all the same
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(f"DELETE FROM {LedgerTable(ledger).jobs} WHERE job = 'report:42'")
        finally:
            await conn.close()
    async with client(cronlock.web.app(pg_dsn, table=ledger)) as c:
        listed = (await c.get("/api/jobs")).json()
        chosen = (await c.get("/api/jobs", params={"status": "rejected"})).json()
        page = await c.get("/jobs/report:42")
        front = (await c.get("/")).text
    assert listed["summary"]["rejected"] == 1, listed["summary"]
    assert listed["jobs"][0]["name"] == "report:42"  # shown first
    assert listed["jobs"][0]["status"] == "rejected"
    assert [job["name"] for job in chosen["jobs"]] == ["report:42"]
    assert page.status_code == 200 and "rejected" in page.text
    assert 'data-job="report:42"' in front
