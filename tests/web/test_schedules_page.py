"""The dashboard's stored schedules at a tenant service's scale and with its secrets (issue
37, item 7): a page of many schedules reads that page only, filtered by name; a schedule's
kwargs are hidden from readers (shown to operators, or redacted by a hook); ``authorize``
sees each action's verb, target and changed fields; the change records the operator."""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Mapping
from typing import Any

import asyncpg
import pytest
from starlette.requests import Request

import cronlock.web
from cronlock import ConfigError, every
from cronlock.postgres import FleetControl
from cronlock.postgres._sql.tables import LedgerTable
from cronlock.web import Action

from .seed import live_member, seed, table_name
from .test_app import _csrf, client

pytestmark = pytest.mark.postgres

SECRETS = {"api_key": "sk_live_51Hx9", "password": "hunter2"}


async def _many(dsn: str, count: int) -> str:
    """A ledger of *count* tenant schedules (``tenant-000001`` ...), written by SQL as
    ``add_schedule`` writes one, each with a secret in its kwargs."""
    table = table_name()
    ledger = LedgerTable(table)
    async with FleetControl(dsn, table=table) as control:
        await control.add_schedule("template", "report", every(3600), kwargs={"tenant": 0})
    conn = await asyncpg.connect(dsn)
    try:
        await live_member(conn, ledger)
        await conn.execute(
            f"""INSERT INTO {ledger.schedules}
                    (name, revision, task, schedule, kwargs, options, updated_by)
                SELECT 'tenant-' || lpad(i::text, 6, '0'), 1 + i, t.task, t.schedule,
                       jsonb_build_object('tenant', i, 'api_key', 'sk_live_' || i),
                       t.options, 'seed'
                FROM {ledger.schedules} t, generate_series(1, $1::int) AS i
                WHERE t.name = 'template'""",
            count,
        )
        await conn.execute(f"DELETE FROM {ledger.schedules} WHERE name = 'template'")
    finally:
        await conn.close()
    return table


class Reads:
    """The statements the dashboard's connections send and the rows they bring back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements = 0
        self.rows = 0
        cls = asyncpg.connection.Connection
        for name in ("fetch", "fetchrow", "fetchval"):
            real = getattr(cls, name)

            async def counted(conn: Any, sql: str, *args: Any, _real: Any = real) -> Any:
                answer = await _real(conn, sql, *args)
                self.statements += 1
                self.rows += len(answer) if isinstance(answer, list) else 1
                return answer

            monkeypatch.setattr(cls, name, counted)


def _names(html: str) -> list[str]:
    return re.findall(r'data-schedule="([^"]*)"', html)


async def test_a_thousand_schedules_are_paged_and_filtered_reading_one_page(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = await _many(pg_dsn, 1000)
    async with client(cronlock.web.app(pg_dsn, table=table)) as c:
        reads = Reads(monkeypatch)
        second = await c.get("/api/schedules", params={"page": "2", "per_page": "50"})
        # Is there a table for them, the counts (one row), the page's 50 rows.
        assert (reads.statements, reads.rows) == (3, 52), (reads.statements, reads.rows)
        page = await c.get("/schedules", params={"per_page": "20"})
        assert (reads.statements, reads.rows) == (6, 52 + 22), (reads.statements, reads.rows)
        found = await c.get("/schedules", params={"q": "ANT-00012"})  # any case
        api_found = (await c.get("/api/schedules", params={"q": "ant-00012"})).json()
        first = (await c.get("/api/schedules")).json()
        past = (await c.get("/api/schedules", params={"page": "99"})).json()
        bad = [
            await c.get("/api/schedules", params={"per_page": "0"}),
            await c.get("/api/schedules", params={"page": "x"}),
            await c.get("/schedules", params={"status": "ok"}),
        ]
    assert second.status_code == 200
    body = second.json()
    names = [s["name"] for s in body["schedules"]]
    assert names == [f"tenant-{i:06d}" for i in range(51, 101)]
    assert (body["total"], body["matched"], body["page"], body["pages"]) == (1000, 1000, 2, 20)
    assert body["per_page"] == 50 and body["read_only"] is True
    assert _names(page.text) == [f"tenant-{i:06d}" for i in range(1, 21)]
    assert 'rel="next" href="/schedules?page=2&amp;per_page=20"' in page.text
    assert 'data-total="1000"' in page.text
    assert _names(found.text) == [f"tenant-{i:06d}" for i in range(120, 130)]
    assert 'rel="next"' not in found.text
    assert api_found["matched"] == 10 and len(api_found["schedules"]) == 10
    assert len(first["schedules"]) == 100 and first["pages"] == 10  # per_page: 100
    assert past["schedules"] == [] and past["matched"] == 1000
    assert [answer.status_code for answer in bad] == [400, 400, 400]
    assert "per_page must be a whole number from 1 to 500" in bad[0].json()["error"]


@pytest.fixture
async def tenants(pg_dsn: str) -> str:
    """Two tenants' schedules, each with secrets in its kwargs; the ledger knows their jobs."""
    table = table_name()
    await seed(
        pg_dsn, table, [("acme:report", "every 1h", None), ("globex:report", "every 1h", None)], []
    )
    async with FleetControl(pg_dsn, table=table) as control:
        for tenant in ("acme", "globex"):
            kwargs = {"tenant": tenant, **SECRETS}
            await control.add_schedule(f"{tenant}:report", "report", every(3600), kwargs=kwargs)
    return table


def _operator(request: Request) -> str:
    return "ops" if request.headers.get("x-operator") == "yes" else ""


def _masked(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {key: "***" if key in SECRETS else value for key, value in kwargs.items()}


async def _views(app: Any, **headers: str) -> tuple[str, dict[str, Any]]:
    async with client(app) as c:
        c.headers.update(headers)
        page = await c.get("/schedules")
        api = await c.get("/api/schedules")
    assert page.status_code == api.status_code == 200, (page.text, api.text)
    return page.text, {s["name"]: s for s in api.json()["schedules"]}


async def test_kwargs_are_hidden_from_readers_shown_to_operators(pg_dsn: str, tenants: str) -> None:
    for app in (
        cronlock.web.app(pg_dsn, table=tenants),  # python -m cronlock web: read-only
        cronlock.web.app(pg_dsn, table=tenants, authorize=_operator),  # not an operator
    ):
        text, rows = await _views(app)
        for secret in SECRETS.values():
            assert secret not in text and secret not in str(rows)
        assert 'data-kwargs="hidden"' in text
        assert {s["kwargs_shown"] for s in rows.values()} == {"hidden"}
        assert {str(s["kwargs"]) for s in rows.values()} == {"None"}
    operator = cronlock.web.app(pg_dsn, table=tenants, authorize=_operator)
    text, rows = await _views(operator, **{"x-operator": "yes"})
    assert rows["acme:report"]["kwargs"] == {"tenant": "acme", **SECRETS}
    assert rows["acme:report"]["kwargs_shown"] == "all"
    assert "sk_live_51Hx9" in text and 'data-kwargs="all"' in text


async def test_a_redaction_hook_decides_what_readers_see(
    pg_dsn: str, tenants: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def only_acme(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        return _masked(name, kwargs) if name.startswith("acme:") else None  # async works too

    def broken(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        raise ValueError(f"cannot redact {kwargs}")  # quotes the secrets: not logged

    text, rows = await _views(cronlock.web.app(pg_dsn, table=tenants, redact=_masked))
    assert rows["acme:report"]["kwargs"] == {"tenant": "acme", "api_key": "***", "password": "***"}
    assert rows["acme:report"]["kwargs_shown"] == "redacted"
    assert "hunter2" not in text and "sk_live" not in text and "***" in text
    text, rows = await _views(cronlock.web.app(pg_dsn, table=tenants, redact=only_acme))
    assert rows["acme:report"]["kwargs_shown"] == "redacted"
    assert rows["globex:report"]["kwargs"] is None
    assert rows["globex:report"]["kwargs_shown"] == "hidden"
    # An operator sees them whole; the hook is for the others.
    app = cronlock.web.app(pg_dsn, table=tenants, authorize=_operator, redact=_masked)
    _, rows = await _views(app, **{"x-operator": "yes"})
    assert rows["globex:report"]["kwargs"]["password"] == "hunter2"
    with caplog.at_level(logging.WARNING, logger="cronlock.web"):
        text, rows = await _views(cronlock.web.app(pg_dsn, table=tenants, redact=broken))
    assert {s["kwargs_shown"] for s in rows.values()} == {"hidden"}  # it fails closed
    assert "redact('acme:report', ...) failed (ValueError)" in caplog.text
    assert "hunter2" not in caplog.text and "hunter2" not in text


async def _updated_by(dsn: str, table: str, name: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        found: str = await conn.fetchval(
            f"SELECT updated_by FROM {LedgerTable(table).schedules} WHERE name = $1", name
        )
        return found
    finally:
        await conn.close()


async def _control(dsn: str, table: str, job: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            f"SELECT paused_by, triggered_by FROM {LedgerTable(table).control} WHERE job = $1",
            job,
        )
        return {} if row is None else dict(row)
    finally:
        await conn.close()


async def test_authorize_sees_the_verb_target_and_fields_and_names_the_operator(
    pg_dsn: str, tenants: str
) -> None:
    asked: list[Action] = []

    def acme_only(request: Request, action: Action) -> str | bool:
        asked.append(action)
        if not action.target.startswith("acme:"):
            return False
        # Acme's operator may change its schedule but not move it to another tenant.
        kwargs = action.fields.get("kwargs")
        if kwargs is not None and kwargs.get("tenant") != "acme":
            return False
        return "alice"

    app = cronlock.web.app(pg_dsn, table=tenants, authorize=acme_only)
    async with client(app) as c:
        page = await c.get("/schedules")
        token = _csrf(page.text)
        assert {a.target for a in asked if a.verb == "read-kwargs"} == {
            "acme:report",
            "globex:report",
        }
        rows = {s["name"]: s for s in (await c.get("/api/schedules")).json()["schedules"]}
        assert rows["acme:report"]["kwargs_shown"] == "all"  # per schedule
        assert rows["globex:report"]["kwargs_shown"] == "hidden"

        asked.clear()
        form = {"csrf": token, "schedule": "acme:report", "cron": "30 7 * * *"}
        done = await c.post(
            "/actions/update-schedule", data={**form, "kwargs": '{"tenant": "acme"}'}
        )
        assert done.status_code == 303, done.text
        [action] = asked
        assert (action.verb, action.target) == ("update-schedule", "acme:report")
        assert set(action.fields) == {"schedule", "kwargs"}
        assert str(action.fields["schedule"]) == "cron '30 7 * * *'"
        assert action.fields["kwargs"] == {"tenant": "acme"}
        assert await _updated_by(pg_dsn, tenants, "acme:report") == "alice"

        moved = await c.post("/actions/update-schedule", data={**form, "kwargs": '{"tenant": "x"}'})
        assert moved.status_code == 403
        other = {**form, "schedule": "globex:report"}
        for verb in ("update-schedule", "remove-schedule"):
            refused = await c.post(f"/actions/{verb}", data=other)
            assert refused.status_code == 403
            assert f"refused: you may not {verb} 'globex:report'" in html.unescape(refused.text)
        assert (asked[-1].verb, asked[-1].target, dict(asked[-1].fields)) == (
            "remove-schedule",
            "globex:report",
            {},
        )
        for job, code in (("globex:report", 403), ("acme:report", 303)):
            paused = await c.post("/actions/pause", data={"csrf": token, "job": job})
            assert paused.status_code == code, paused.text
            assert asked[-1] == Action("pause", job)
    assert await _updated_by(pg_dsn, tenants, "globex:report") != "alice"
    async with FleetControl(pg_dsn, table=tenants) as control:
        stored = {s.name: s for s in await control.schedules()}
        assert await control.paused() == frozenset({"acme:report"})
    assert stored["globex:report"].kwargs == {"tenant": "globex", **SECRETS}
    assert stored["acme:report"].kwargs == {"tenant": "acme"}
    assert (await _control(pg_dsn, tenants, "acme:report"))["paused_by"] == "alice"


async def test_a_one_parameter_authorize_names_who_changed_what(pg_dsn: str, tenants: str) -> None:
    app = cronlock.web.app(pg_dsn, table=tenants, authorize=_operator)
    async with client(app) as c:
        c.headers["x-operator"] = "yes"
        token = _csrf((await c.get("/schedules")).text)
        form = {"csrf": token, "schedule": "acme:report", "every": "120"}
        assert (await c.post("/actions/update-schedule", data=form)).status_code == 303
        data = {"csrf": token, "job": "globex:report"}
        assert (await c.post("/actions/trigger", data=data)).status_code == 303
    assert await _updated_by(pg_dsn, tenants, "acme:report") == "ops"
    assert (await _control(pg_dsn, tenants, "globex:report"))["triggered_by"] == "ops"
    # Allowed with True: no name to record, the dashboard's process is.
    app = cronlock.web.app(pg_dsn, table=tenants, authorize=lambda request: True)
    async with client(app) as c:
        token = _csrf((await c.get("/schedules")).text)
        form = {"csrf": token, "schedule": "acme:report", "every": "180"}
        assert (await c.post("/actions/update-schedule", data=form)).status_code == 303
        deep = await c.post("/actions/update-schedule", data={**form, "kwargs": "[" * 1200})
        assert deep.status_code == 400, deep.text  # not a 500
    assert re.fullmatch(r".+:\d+", await _updated_by(pg_dsn, tenants, "acme:report"))


async def test_fleet_control_records_who_it_is_told(pg_dsn: str, tenants: str) -> None:
    async with FleetControl(pg_dsn, table=tenants, who="billing-sync") as control:
        await control.update_schedule("acme:report", kwargs={"tenant": "acme"})
        await control.pause("globex:report")
    assert await _updated_by(pg_dsn, tenants, "acme:report") == "billing-sync"
    assert (await _control(pg_dsn, tenants, "globex:report"))["paused_by"] == "billing-sync"
    for who in ("", "  ", 42):
        with pytest.raises(ConfigError, match="who must be a non-empty string"):
            FleetControl(pg_dsn, table=tenants, who=who)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["kwargs", "every", "cron", "tz", "anchor", "schedule", "job"])
async def test_a_form_field_of_3kb_nested_brackets_is_never_a_500(
    pg_dsn: str, tenants: str, field: str
) -> None:
    # Sent raw, as a script would (unencoded '['), 3,000 of them: under the form's 4 KiB
    # limit, and deeper than Python's JSON parser goes. The kwargs of an update are a 400;
    # no field of either action is ever a 500 (a field the action does not read is ignored).
    app = cronlock.web.app(pg_dsn, table=tenants, authorize=lambda request: True)
    async with client(app) as c:
        token = _csrf((await c.get("/schedules")).text)
        for verb in ("update-schedule", "pause"):
            fields = {"csrf": token, "schedule": "acme%3Areport", "job": "acme%3Areport"}
            fields[field] = "[" * 3000
            body = "&".join(f"{name}={value}" for name, value in fields.items())
            headers = {"content-type": "application/x-www-form-urlencoded"}
            answer = await c.post(f"/actions/{verb}", content=body, headers=headers)
            assert answer.status_code < 500, (verb, answer.status_code, answer.text[:300])
            if verb == "update-schedule" and field == "kwargs":
                assert answer.status_code == 400, answer.text[:300]
