"""Who may read and who may act, on a real dashboard server (issue 24, item 5):
``authorize_read`` gates every page and JSON answer, the static files stay open, and each
action is logged with who asked."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import pytest_asyncio

from .realserver import Served, served
from .seed import Run, seed, table_name
from .test_limits import drop

# One worker runs them all (pytest -n), on one server: each test is its own client, reads
# what it reads whatever the others did (a paused job reads the same), and looks in the
# shared log for the lines only it can have written.
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.xdist_group("web-gates")]

SECRET_JOB = "payroll-export"
READS = ["/", "/?partial=1", "/api/jobs", f"/jobs/{SECRET_JOB}", f"/api/jobs/{SECRET_JOB}/runs"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(pg_dsn: str) -> AsyncIterator[Served]:
    """A dashboard with actions (x-operator names who acts) and a read gate (x-reader)."""
    table = table_name()
    slot = datetime.now(UTC) - timedelta(hours=1)
    await seed(
        pg_dsn,
        table,
        notes=[(SECRET_JOB, "every 1h", None)],
        runs=[Run(SECRET_JOB, slot, "failed")],
    )
    env = {"CRONLOCK_WEB_DSN": pg_dsn, "CRONLOCK_WEB_TABLE": table}
    try:
        async with served({**env, "CRONLOCK_WEB_MODE": "gated"}, crashes=True) as running:
            yield running
    finally:
        await drop(pg_dsn, table)


async def test_authorize_read_gates_every_read_but_the_static_files(server: Served) -> None:
    async with httpx.AsyncClient(base_url=server.base) as anyone:
        answers = {path: await anyone.get(path) for path in READS}
        static = await anyone.get("/static/live.js")
        post = await anyone.post("/actions/pause", data={"job": SECRET_JOB})
    async with httpx.AsyncClient(base_url=server.base, headers={"x-reader": "1"}) as reader:
        allowed = {path: (await reader.get(path)).status_code for path in READS}
    assert static.status_code == 200
    assert allowed == dict.fromkeys(READS, 200)
    codes = {path: answer.status_code for path, answer in answers.items()}
    assert codes == dict.fromkeys(READS, 403)
    for answer in answers.values():
        assert SECRET_JOB not in answer.text
        assert "cronlock_csrf" not in answer.headers.get("set-cookie", "")
        assert "content-security-policy" in answer.headers
    assert post.status_code == 403 and "may not read" in post.text


async def test_an_error_in_a_gate_is_a_500_with_the_headers(server: Served) -> None:
    async with httpx.AsyncClient(base_url=server.base, headers={"x-boom": "1"}) as client:
        answer = await client.get("/api/jobs")
    assert answer.status_code == 500
    assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    assert "read gate failed" not in answer.text


async def test_each_action_is_logged_with_who_asked(server: Served) -> None:
    headers = {"x-reader": "1"}
    async with httpx.AsyncClient(base_url=server.base, headers=headers) as browser:
        page = await browser.get("/")
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert found, page.text[:500]
        form = {"job": SECRET_JOB, "csrf": found.group(1)}
        origin = {"origin": server.base, "x-operator": "alice@example.org"}
        done = await browser.post("/actions/pause", data=form, headers=origin)
        assert done.status_code == 303, done.text[:500]
        refused = await browser.post("/actions/resume", data=form, headers={"origin": server.base})
        assert refused.status_code == 403
    log = server.log.read_text()
    assert re.search(
        rf"cronlock\.web INFO dashboard: pause '{SECRET_JOB}' by alice@example\.org "
        r"from 127\.0\.0\.1:\d+",
        log,
    ), log
    assert re.search(rf"INFO dashboard: refused resume '{SECRET_JOB}' from 127\.0\.0\.1:\d+", log)
