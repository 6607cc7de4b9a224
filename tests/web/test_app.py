"""The dashboard over HTTP (httpx against the ASGI app) with a real PostgreSQL ledger:
pages, the JSON API, escaping, what is never shown, and the actions' refusals."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest
import pytest_asyncio
from starlette.requests import Request

import cronlock.web
from cronlock.postgres import FleetControl
from cronlock.postgres._sql.tables import LedgerTable

from .seed import Run, seed, table_name

pytestmark = pytest.mark.postgres

XSS = "<script>alert('pwned')</script>"
NOW = datetime.now(UTC).replace(microsecond=0)  # test data only: the app reads server time


async def _ledger(pg_dsn: str) -> str:
    table = table_name()
    hour = timedelta(hours=1)
    await seed(
        pg_dsn,
        table,
        notes=[
            ("nightly", "cron '0 3 * * *' in Europe/Berlin", NOW + 5 * hour),
            ("flaky", "every 5m", NOW + 2 * hour),  # far enough ahead: never absent here
            ("stalled", "every 1m", NOW + 2 * hour),  # noted on; its due slot is late
            (XSS, "every 1h", NOW + hour),
        ],
        runs=[
            *(Run("nightly", NOW - timedelta(days=d), "succeeded", took=d) for d in range(1, 8)),
            Run("flaky", NOW - 2 * hour, "succeeded"),
            Run(
                "flaky",
                NOW - hour,
                "failed",
                error="ValueError: <img src=x onerror=alert(1)>\nTraceback (most recent call last)",
            ),
            Run("stalled", NOW - 2 * hour, "succeeded"),
            Run(XSS, NOW - hour, "succeeded"),
        ],
        graces={
            "nightly": (600.0, NOW + 5 * hour),
            "flaky": (7200.0, NOW - hour),
            "stalled": (120.0, NOW - hour),
        },
    )
    return table


@pytest.fixture
async def ledger(pg_dsn: str) -> str:
    """A ledger of this test's own with a healthy job, a failing one, an overdue one and
    an XSS-shaped one: for a test that writes to it."""
    return await _ledger(pg_dsn)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(pg_dsn: str) -> str:
    """The same ledger, made once for the tests of this module that only read it."""
    return await _ledger(pg_dsn)


def client(app: Any) -> httpx.AsyncClient:
    """A browser of the dashboard at http://dash: its POSTs say they come from there."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://dash",
        headers={"origin": "http://dash"},
    )


@pytest.fixture
async def read_only(pg_dsn: str, shared: str) -> AsyncIterator[httpx.AsyncClient]:
    """A read-only dashboard of the :func:`shared` ledger."""
    async with client(cronlock.web.app(pg_dsn, table=shared)) as c:
        yield c


async def test_the_list_shows_every_job_with_its_status(read_only: httpx.AsyncClient) -> None:
    page = await read_only.get("/")
    assert page.status_code == 200
    statuses = dict(re.findall(r'data-job="([^"]*)" data-status="(\w+)"', page.text))
    assert statuses == {
        "nightly": "ok",
        "flaky": "failing",
        "stalled": "overdue",
        "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;": "ok",
    }
    assert "at 03:00 every day" in page.text and "zone Europe/Berlin" in page.text
    assert 'method="post"' not in page.text  # read-only: no action anywhere (a GET filter)


async def test_job_names_and_errors_are_text_never_markup(read_only: httpx.AsyncClient) -> None:
    for url in ("/", "/jobs/flaky", "/jobs/" + quote(XSS, safe="")):
        page = await read_only.get(url)
        assert page.status_code == 200, url
        assert "<script>alert" not in page.text
        assert "<img src=x" not in page.text
    assert "&lt;img src=x onerror=alert(1)&gt;" in (await read_only.get("/jobs/flaky")).text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")


async def test_no_traceback_dsn_or_password_is_shown(pg_dsn: str, shared: str) -> None:
    async with client(cronlock.web.app(pg_dsn, table=shared)) as c:
        text = (await c.get("/jobs/flaky")).text + (await c.get("/api/jobs")).text
    assert "Traceback" not in text
    assert pg_dsn not in text and "search_path" not in text
    secret = "postgresql://cron:hunter2@127.0.0.1:1/db"
    async with client(cronlock.web.app(secret)) as c:
        for url in ("/", "/api/jobs", "/jobs/x"):
            answer = await c.get(url)
            assert answer.status_code == 503
            assert "hunter2" not in answer.text and "127.0.0.1" not in answer.text


async def test_api_jobs(read_only: httpx.AsyncClient) -> None:
    body = (await read_only.get("/api/jobs")).json()
    assert body["read_only"] is True
    jobs = {job["name"]: job for job in body["jobs"]}
    assert set(jobs) == {"nightly", "flaky", "stalled", XSS}
    nightly = jobs["nightly"]
    assert nightly["status"] == "ok"
    assert nightly["zone"] == "Europe/Berlin"
    assert nightly["last_success"]["slot"] == (NOW - timedelta(days=1)).isoformat()
    assert nightly["last_success"]["duration_seconds"] == 1.0
    assert nightly["last_success"]["replica"] == "replica-a:4242"
    slots = [datetime.fromisoformat(s) for s in nightly["next_slots"]]
    assert slots == [NOW + timedelta(hours=5)]  # the list shows one; the job page three
    assert body["summary"] == {
        "total": 4, "paused": 0, "conflict": 0, "rejected": 0, "absent": 0,
        "overdue": 1, "failing": 1, "running": 0, "ok": 2, "new": 0,
    }  # fmt: skip
    assert (body["matched"], body["page"], body["pages"]) == (4, 1, 1)
    assert [job["name"] for job in body["jobs"]][:2] == ["flaky", "stalled"]  # trouble first
    assert jobs["flaky"]["last_failure"]["error"] == "ValueError: <img src=x onerror=alert(1)>"
    assert jobs["stalled"]["overdue_since"] == (NOW - timedelta(hours=1)).isoformat()


async def test_api_runs_pages_back_through_the_history(read_only: httpx.AsyncClient) -> None:
    seen: list[str] = []
    url = "/api/jobs/nightly/runs?limit=3"
    while True:
        body = (await read_only.get(url)).json()
        seen += [run["slot"] for run in body["runs"]]
        if body["next_before"] is None:
            break
        url = f"/api/jobs/nightly/runs?limit=3&before={quote(body['next_before'])}"
    assert seen == [(NOW - timedelta(days=d)).isoformat() for d in range(1, 8)]


async def test_api_answers_bad_requests_clearly(read_only: httpx.AsyncClient) -> None:
    missing = await read_only.get("/api/jobs/nope/runs")
    assert (missing.status_code, missing.json()) == (
        404,
        {"error": "no such job in the run ledger"},
    )
    assert (await read_only.get("/api/jobs/nightly/runs?limit=0")).status_code == 400
    assert (await read_only.get("/api/jobs/nightly/runs?before=yesterday")).status_code == 400
    assert (await read_only.get("/jobs/nope")).status_code == 404


async def test_job_page_has_history_chart_and_pager(read_only: httpx.AsyncClient) -> None:
    page = (await read_only.get("/jobs/nightly?limit=5")).text
    assert page.count('<tr class="run ') == 5
    assert page.count("<rect ") == 5
    assert 'class="older"' in page


async def test_job_page_shows_the_slots_that_did_not_run_and_why(pg_dsn: str, ledger: str) -> None:
    table = LedgerTable(ledger)
    conn: Any = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            f"""INSERT INTO {table.slots} (job, slot, last_slot, fate, reason, into_slot, holder)
                VALUES ('flaky', $1, $2, 'coalesced', 'no replica ran them <b>', $3, 'web-1'),
                       ('flaky', $4, $4, 'missed', 'past misfire_grace', NULL, NULL),
                       ('nightly', $4, $4, 'skipped', 'paused fleet-wide', NULL, NULL),
                       ('flaky', 'infinity', 'infinity', 'missed', 'odd', NULL, NULL)""",
            NOW - timedelta(minutes=50),
            NOW - timedelta(minutes=40, microseconds=1),
            NOW - timedelta(minutes=40),
            NOW - timedelta(minutes=10),
        )
    finally:
        await conn.close()
    async with client(cronlock.web.app(pg_dsn, table=ledger)) as c:
        page = (await c.get("/jobs/flaky")).text
        quiet = (await c.get("/jobs/stalled")).text
    assert page.count('<tr class="gap ') == 2  # the row Python cannot hold is left out
    assert page.index("fate-missed") < page.index("fate-coalesced")  # latest first
    assert "no replica ran them &lt;b&gt;" in page  # text, never markup
    assert "web-1" in page and "paused fleet-wide" not in page  # this job's only
    assert "None recorded" in quiet


async def test_processes_without_a_key_share_the_ledgers_and_a_given_key_wins(
    pg_dsn: str, ledger: str
) -> None:
    """Two apps without csrf_secret (two worker processes) accept each other's tokens,
    also when both make the fleet's key at once; an app given a key uses only that."""

    def authorize(request: Request) -> bool:
        return True

    first, second = (cronlock.web.app(pg_dsn, table=ledger, authorize=authorize) for _ in "ab")
    async with client(first) as a, client(second) as b:
        pages = await asyncio.gather(a.get("/"), b.get("/"))  # both make the key at once
        assert all(page.status_code == 200 for page in pages)
        b.cookies.update(a.cookies)
        done = await b.post("/actions/pause", data={"job": "nightly", "csrf": _csrf(pages[0].text)})
        assert done.status_code == 303, done.text
    assert await _paused(pg_dsn, ledger) == {"nightly"}
    conn = await asyncpg.connect(pg_dsn)
    try:
        keys = await conn.fetchval(f"SELECT count(*) FROM {ledger}_secrets")
    finally:
        await conn.close()
    assert keys == 1
    given = cronlock.web.app(pg_dsn, table=ledger, authorize=authorize, csrf_secret=b"k" * 32)
    async with client(given) as g:
        g.cookies.update(a.cookies)
        assert _csrf((await g.get("/")).text) != _csrf(pages[0].text)


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no CSRF token on the page"
    return found.group(1)


async def _paused(dsn: str, table: str) -> frozenset[str]:
    async with FleetControl(dsn, table=table) as control:
        return await control.paused()


async def test_an_authorized_pause_and_resume(pg_dsn: str, ledger: str) -> None:
    def authorize(request: Request) -> bool:
        return request.headers.get("x-operator") == "yes"

    app = cronlock.web.app(pg_dsn, table=ledger, authorize=authorize)
    async with client(app) as c:
        c.headers["x-operator"] = "yes"
        token = _csrf((await c.get("/")).text)
        done = await c.post("/actions/pause", data={"job": "nightly", "csrf": token})
        assert (done.status_code, done.headers["location"]) == (303, "/")
        assert await _paused(pg_dsn, ledger) == {"nightly"}
        page = (await c.get("/")).text
        assert 'data-job="nightly" data-status="paused"' in page
        jobs = {job["name"]: job for job in (await c.get("/api/jobs")).json()["jobs"]}
        assert jobs["nightly"]["paused"] is True
        back = await c.post(
            "/actions/resume", data={"job": "nightly", "csrf": token, "back": "job"}
        )
        assert back.headers["location"] == "/jobs/nightly"
        assert await _paused(pg_dsn, ledger) == frozenset()
        pulled = await c.post("/actions/trigger", data={"job": "nightly", "csrf": token})
        assert pulled.status_code == 303
    conn = await asyncpg.connect(pg_dsn)
    try:
        pending = await conn.fetchval(
            f"SELECT count(*) FROM {ledger}_control WHERE job = 'nightly' "
            "AND trigger_slot IS NOT NULL"
        )
    finally:
        await conn.close()
    assert pending == 1  # one replica will claim it, like a slot


# Each refusal's cause, and the words of its 403 that say what to do.
REFUSALS = {
    "read-only": "this dashboard is read-only",
    "no-cookie": "the browser sent no dashboard cookie (cronlock_csrf): cookies are blocked",
    "no-token": "the form carried no CSRF token; reload the page",
    "malformed-token": "the CSRF token is not one this dashboard makes",
    "other-key": "made with another key than this process's: another process serves this "
    "dashboard with a key of its own (give every process the same csrf_secret=, or none",
    "other-cookie": "the CSRF token belongs to another cookie than this browser's",
    "forged-cookie": "cookie (cronlock_csrf) was not made by this dashboard (set by another "
    "site or by hand",
    "other-origin": "this form was sent from another site than this dashboard",
    "other-scheme": "this form was sent from another site than this dashboard",
    "other-referer": "this form was sent from another site than this dashboard",
    "no-origin": "the request says neither where it comes from (no Origin, no Referer",
    "denied": "refused: you may not change jobs here",
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
async def test_every_refusal_is_a_403_that_names_its_cause_and_changes_nothing(
    pg_dsn: str, ledger: str, case: str
) -> None:
    async def authorize(request: Request) -> bool:  # async callables are awaited
        return case != "denied"

    app = cronlock.web.app(
        pg_dsn, table=ledger, authorize=None if case == "read-only" else authorize
    )
    async with client(app) as c:
        token = _csrf((await c.get("/")).text) if case != "read-only" else "0" * 72
        form = {"job": "nightly", "csrf": token}
        headers = {}
        if case == "no-token":
            del form["csrf"]
        elif case == "malformed-token":
            form["csrf"] = "f" * 64  # e.g. a page from a cronlock before key ids
        elif case == "other-key":  # a process with a key of its own made this page
            other = cronlock.web.app(pg_dsn, table=ledger, authorize=authorize, csrf_secret="k")
            async with client(other) as o:
                o.cookies.update(c.cookies)
                form["csrf"] = _csrf((await o.get("/")).text)
        elif case == "other-cookie":  # a cookie this dashboard made, for another browser
            async with client(app) as stranger:
                await stranger.get("/")
                c.cookies.set("cronlock_csrf", stranger.cookies["cronlock_csrf"])
        elif case == "forged-cookie":  # chosen by the client, the token made for it
            c.cookies.set("cronlock_csrf", "x" * 43)
            form["csrf"] = _csrf((await c.get("/")).text)
            c.cookies.set("cronlock_csrf", "x" * 43)  # the page replaced it: set it again
        elif case == "other-origin":
            headers["origin"] = "https://evil.example"
        elif case == "other-scheme":  # the dashboard is http://dash
            headers["origin"] = "https://dash"
        elif case == "other-referer":
            del c.headers["origin"]
            headers["referer"] = "https://evil.example/page"
        elif case == "no-origin":
            del c.headers["origin"]
        for verb in ("pause", "trigger"):
            if case == "no-cookie":  # the 403 page gave the browser one, for the reload
                c.cookies.clear()
            refused = await c.post(f"/actions/{verb}", data=form, headers=headers)
            assert refused.status_code == 403, (verb, refused.text)
            assert REFUSALS[case] in refused.text.replace("&#39;", "'"), refused.text
        assert (await c.get("/actions/pause")).status_code == 405
    assert await _paused(pg_dsn, ledger) == frozenset()
    conn = await asyncpg.connect(pg_dsn)
    try:
        control = await conn.fetchval(f"SELECT count(*) FROM {ledger}_control")
    finally:
        await conn.close()
    assert control == 0  # no trigger, no pause: nothing written


async def test_mounted_under_a_prefix(pg_dsn: str, shared: str) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount("/cron", cronlock.web.app(pg_dsn, table=shared))])
    async with client(outer) as c:
        page = (await c.get("/cron/")).text
        assert 'href="/cron/jobs/nightly"' in page and 'src="/cron/static/live.js"' in page
        assert (await c.get("/cron/static/live.js")).status_code == 200
        assert len((await c.get("/cron/api/jobs")).json()["jobs"]) == 4


def test_bad_options_are_refused() -> None:
    with pytest.raises(cronlock.ConfigError, match="refresh"):
        cronlock.web.app("postgresql://x", refresh=0)
    with pytest.raises(cronlock.ConfigError, match="page_size"):
        cronlock.web.app("postgresql://x", page_size=0)
    with pytest.raises(cronlock.ConfigError, match=r"DSN or an asyncpg\.Pool"):
        cronlock.web.app(42)


async def test_served_from_aiohttp(pg_dsn: str, ledger: str) -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    def authorize(request: Request) -> bool:
        return True

    service = web.Application()
    handler = cronlock.web.aiohttp_handler(
        cronlock.web.app(pg_dsn, table=ledger, authorize=authorize), prefix="/cron"
    )
    service.router.add_route("*", "/cron", handler)
    service.router.add_route("*", "/cron/{tail:.*}", handler)
    async with TestClient(TestServer(service)) as c:
        page = await c.get("/cron/")
        text = await page.text()
        assert page.status == 200 and 'href="/cron/jobs/nightly"' in text
        assert page.cookies["cronlock_csrf"]["path"] == "/cron"
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        api = await (await c.get("/cron/api/jobs/nightly/runs?limit=2")).json()
        assert len(api["runs"]) == 2
        form = {"job": "nightly", "csrf": _csrf(text)}
        origin = {"origin": str(c.make_url("/")).rstrip("/")}
        done = await c.post("/cron/actions/pause", data=form, headers=origin, allow_redirects=False)
        assert (done.status, done.headers["location"]) == (303, "/cron/")
        refused = await c.post(
            "/cron/actions/pause", data={"job": "nightly", "csrf": "0"}, headers=origin
        )
        assert refused.status == 403
    assert await _paused(pg_dsn, ledger) == {"nightly"}


async def test_a_missing_ledger_is_named_with_the_fix(pg_dsn: str) -> None:
    async with client(cronlock.web.app(pg_dsn, table="no_such_ledger")) as c:
        page = await c.get("/")
        api = await c.get("/api/jobs")
    assert page.status_code == api.status_code == 503
    assert "python -m cronlock migrate" in page.text
    assert "no current run ledger" in api.json()["error"]


async def test_a_500_carries_the_security_headers() -> None:
    class Broken(asyncpg.Pool):  # type: ignore[misc]
        def __init__(self) -> None:
            pass

        def acquire(self, *, timeout: float | None = None) -> Any:
            raise RuntimeError("an unexpected failure")

    app = cronlock.web.app(Broken())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
        for url in ("/", "/api/jobs"):
            answer = await c.get(url)
            assert answer.status_code == 500
            assert answer.headers["content-security-policy"].startswith("default-src 'none'")
            assert answer.headers["x-frame-options"] == "DENY"
            assert "unexpected failure" not in answer.text


async def test_a_retried_slot_shows_every_attempt(pg_dsn: str, ledger: str) -> None:
    # Issue 36, finding 8: the job page and the API showed only a retried slot's last try.
    earlier = [
        {"attempt": 1, "started_at": (NOW - timedelta(minutes=70)).isoformat(),
         "finished_at": (NOW - timedelta(minutes=69)).isoformat(), "outcome": "failed",
         "error": "OSError: first try", "host": "h1", "pid": 1},
        {"attempt": 2, "started_at": (NOW - timedelta(minutes=68)).isoformat(),
         "finished_at": (NOW - timedelta(minutes=67)).isoformat(), "outcome": "timed_out",
         "error": "timed out after 60 s", "host": "h2", "pid": 2},
    ]  # fmt: skip
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            f"""UPDATE "{ledger}" SET attempt = 3, attempts = $2::jsonb
                WHERE job = 'flaky' AND slot = $1""",
            NOW - timedelta(hours=1),
            json.dumps(earlier),
        )
    finally:
        await conn.close()
    async with client(cronlock.web.app(pg_dsn, table=ledger)) as read_only:
        page = (await read_only.get("/jobs/flaky")).text
        api = (await read_only.get("/api/jobs/flaky/runs")).json()
    for text in ("failed (attempt 3)", "timed_out (attempt 2)", "failed (attempt 1)"):
        assert text in page
    assert "OSError: first try" in page and "timed out after 60 s" in page
    [latest, *_] = api["runs"]
    assert latest["attempt"] == 3
    assert [(a["attempt"], a["outcome"], a["error"], a["replica"]) for a in latest["attempts"]] == [
        (1, "failed", "OSError: first try", "h1:1"),
        (2, "timed_out", "timed out after 60 s", "h2:2"),
    ]
